"""Training data: which rows train, and what each becomes (`plan_rows`), for the trainer, the preview and the log.

Reading files lives in core/data/read.py, row formats and templates in core/data/formats.py; this module ties them to a
config and a tokenizer. `plan_rows` tokenizes every row exactly as TRL's SFTTrainer does and decides its fate
(kept, answer cut at max_length, prompt shortened per `long_prompts`, dropped) before any model is loaded; the
trainer then gets exactly the plan's tokenized rows, so nothing disappears between the preview and training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from core.config.slices import DataSlice, ModelSlice
from core.messages import Said
from core.data.read import DataError, Limit, is_local, load_raw, row_line
from core.data.formats import _adds_bos, check_format, detect_format, nothing_to_train, render_rows


# --- the plan: which rows train, and what each becomes ---------------------------------------------------
REASONS = ("kept", "truncated", "prompt_cut", "dropped_long", "dropped_empty")
PREVIEW_CHARS = 2000  # the page gets at most the first and last this many characters of each shown text
ANSWER_SHARE = 4  # with long_prompts=truncate_*, every row keeps at least max_length // 4 answer tokens (or all)


class WithValidation:
    """What a DataPlan and a PairPlan share of their validation part: `held`, which rows were held out and why (a
    core.data.validation.Split), and `validation`, the held-out rows' own plan (None: no validation rows)."""

    @property
    def evaluates(self) -> bool:
        """Some validation row trains: the run has an eval."""
        return self.validation is not None and self.validation.n_train > 0

    def validation_dict(self) -> dict[str, Any] | None:
        """The validation part's accounting (events.jsonl's data event, summary.json["validation"])."""
        if self.held is None:
            return None
        return {**self.held.to_dict(), **({"plan": self.validation.to_dict()} if self.validation is not None else {})}

    def with_validation(self, lines: list[Any]) -> list[tuple[str, Any]]:
        """The run log's lines as (level, line): the plan's own `lines`, what was held out for validation (or why
        nothing was) and the validation rows' own plan."""
        why = self.held.why if self.held is not None else None
        out = [("info", line) for line in filter(None, [*lines, why])]
        if self.validation is not None:
            out.append(("info", self.validation.describe(validation=True)))
            if not self.validation.n_train:
                out.append(("warning", Said("log.val_none_fit")))
        return out


@dataclass
class DataPlan(WithValidation):
    """What training will see, row by row: the trainer trains on exactly `train_dataset()`.

    `lengths`, `reasons` and `rows` describe every row with something to train on (in file order): its token
    count as TRL tokenizes it (prompt + completion, before any cut), what happens to it (REASONS) and its index
    in the loaded split. Empty/null rows only count in `counts["dropped_empty"]`.
    """

    source: str
    format: str
    max_length: int
    long_prompts: str
    packing: bool
    n_source: int  # rows in the loaded split
    counts: dict[str, int]  # REASONS -> rows
    lengths: list[int]
    reasons: list[str]
    rows: list[int]
    input_ids: list[Any] = field(repr=False, default_factory=list)  # int32 arrays: each training row, <= max_length
    labels: list[Any] = field(repr=False, default_factory=list)  # the same with -100 on prompt tokens
    n_packs: int | None = None  # packed sequences the trainer will see (packing only)
    turns: dict[str, int] | None = None  # assistant turns (answers): trained whole, cut at max_length, dropped
    examples: list[dict[str, Any]] = field(default_factory=list)  # what the preview shows
    notes: list[str] = field(default_factory=list)
    # The validation part (core/data/validation.py plan_parts): which rows were held out and why (a Split; `Any`
    # because validation.py imports this module), and the held-out rows' own plan (None: no validation rows).
    held: Any = None
    validation: DataPlan | None = None

    @property
    def n_train(self) -> int:
        return self.counts["kept"] + self.counts["truncated"] + self.counts["prompt_cut"]

    @property
    def n_dropped(self) -> int:
        return self.counts["dropped_long"] + self.counts["dropped_empty"]

    @property
    def stats(self) -> dict[str, float]:
        return length_stats(self.lengths) if self.lengths else {}

    @property
    def multi_turn(self) -> bool:
        """Some row is a conversation with more than one assistant turn that trains."""
        return bool(self.turns) and sum(self.turns.values()) > self.n_train + self.counts["dropped_long"]

    @property
    def longest_row(self) -> int:
        return max(self.lengths, default=0)

    def to_dict(self) -> dict[str, Any]:
        """The counts, as events.jsonl and summary.json carry them."""
        return {"format": self.format, "rows_in_split": self.n_source, "train_rows": self.n_train,
                **self.counts, "packs": self.n_packs, "max_length": self.max_length, "turns": self.turns,
                "long_prompts": self.long_prompts, "longest_row_tokens": self.longest_row}

    def describe(self, validation: bool = False) -> Said:
        """One line for the run log: every row of the split, accounted for (log.data; the validation part's plan:
        log.val_rows), keyed so the page says it in its language. A setting's value (max_length) is passed as text:
        written as the user sets it, not grouped like a count."""
        parts = [Said(f"preview.reason.{r}", n=self.counts[r]) for r in REASONS if self.counts[r] or r == "kept"]
        packs = Said("log.data_packs", n=self.n_packs, max_length=self.max_length) if self.packing else ""
        return Said("log.val_rows" if validation else "log.data", rows=self.n_source,
                    dataset=f"{self.source} ({self.format})", train=self.n_train, max_length=str(self.max_length),
                    outcomes=Said("msg.list", items=parts), packs=packs)

    def describe_turns(self) -> Said | None:
        """The run log's line for conversations, every assistant turn accounted for (None without several turns):
        trained whole, cut at max_length (a first answer that alone does not fit), dropped (left out: the turns
        after the last one that fits max_length whole, and those of dropped rows). A line of its own, so the page
        can say it in its language (key preview.turns)."""
        if not self.multi_turn:
            return None
        return Said("preview.turns", n=sum(self.turns.values()), trained=self.turns["trained"], cut=self.turns["cut"],
                    dropped=self.turns["dropped"])

    def log_lines(self) -> list[tuple[str, Said]]:
        """The run log's lines about the data, in order, as (level, line): the plan, its conversations, its notes,
        what was held out for validation (or why nothing was) and the validation rows' own plan."""
        return self.with_validation([self.describe(), self.describe_turns(), *self.notes])

    def train_dataset(self) -> Any:
        """Tokenized rows (input_ids, labels) for SFTTrainer: it skips its own tokenizing, and since every row is
        within max_length and has answer tokens, its truncation and its drop of fully masked rows change nothing.
        Built as Arrow columns from the rows' arrays in one piece: Dataset.from_dict converted them row by row
        (57,000 rows: 3.6 s against 0.2 s)."""
        import datasets
        import numpy as np
        import pyarrow as pa
        from datasets.fingerprint import generate_random_fingerprint

        def column(rows: list[Any]) -> Any:  # one flat array of every row's ids, and where each row starts
            offsets = np.zeros(len(rows) + 1, np.int64)
            np.cumsum(np.fromiter(map(len, rows), np.int64, len(rows)), out=offsets[1:])
            flat = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
            return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat)).cast(pa.list_(pa.int64()))

        ids = datasets.Sequence(datasets.Value("int64"))
        table = pa.table({"input_ids": column(self.input_ids), "labels": column(self.labels)})
        # a fresh fingerprint: datasets would otherwise hash every id to make one (~1 s for 57,000 rows), and an
        # in-memory dataset caches nothing under it
        return datasets.Dataset(table, info=datasets.DatasetInfo(features=datasets.Features(
            {"input_ids": ids, "labels": ids})), fingerprint=generate_random_fingerprint())

    def refusal(self) -> Said | None:
        """Why nothing would train, with the numbers and the fix (log.refusal); None when some row trains."""
        if self.n_train:
            return None
        fit = suggest_max_length(self.lengths)
        share = sum(n <= fit for n in self.lengths) / len(self.lengths)
        empty = Said("log.refusal_empty", n=self.counts["dropped_empty"]) if self.counts["dropped_empty"] else ""
        return Said("log.refusal", rows=self.counts["dropped_long"], source=self.source,
                    max_length=str(self.max_length), empty=empty, fit=str(fit), share=round(100 * share),
                    longest=self.longest_row)


def suggest_max_length(lengths: list[int], step: int = 16, limit: int = 131072) -> int:
    """A max_length (a multiple of `step`) that fits at least 90% of rows whole."""
    if not lengths:
        return step
    ordered = sorted(lengths)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return min(limit, -(-p90 // step) * step)


class _Measured(DataSlice, ModelSlice, Protocol):
    """The rows and the model whose tokenizer measures them."""


_LONGEST: dict[tuple, int] = {}  # data + model -> the longest row in tokens, from the last plan made of it


def _lengths_key(cfg: _Measured, local: bool) -> tuple:
    try:  # a file edited since is measured again
        stamp = Path(cfg.dataset).expanduser().stat().st_mtime_ns if local else None
    except OSError:
        stamp = None
    return cfg.dataset, cfg.dataset_split, cfg.dataset_format, cfg.model, stamp


def known_longest_row(cfg: _Measured) -> int | None:
    """The longest row of cfg's data, in tokens of cfg's model, when this process has planned it (the preview
    did); None otherwise. For memory estimates: unpadded micro-batches are never longer than this."""
    return _LONGEST.get(_lengths_key(cfg, is_local(cfg.dataset)))


def remember_longest(cfg: _Measured, tokens: int) -> None:
    """Keep the longest row a plan made elsewhere measured (the preview's child): known_longest_row answers it."""
    _LONGEST[_lengths_key(cfg, is_local(cfg.dataset))] = int(tokens)


def check_data(cfg: DataSlice, limit: Limit | None = None) -> tuple[Any, str]:
    """Read the data and check its format, with no tokenizer: (raw dataset, format). Runs before the model is
    resolved, so a broken file is reported as such whatever the model. `limit` (core.data.read.PREVIEW_LIMIT for a
    preview): the rows and bytes it may read, refused by name past them; None for training."""
    naming = Naming(cfg.dataset, cfg.dataset_split)
    raw = load_raw(cfg.dataset, cfg.dataset_split, limit)
    with naming:
        fmt = detect_format(raw) if cfg.dataset_format == "auto" else cfg.dataset_format
        check_format(raw, fmt)
        check_sft_columns(raw, fmt, naming.where)
    return raw, fmt


def check_sft_columns(raw: Any, fmt: str, where: str) -> None:
    """Refuse KTO's rows given to SFT: prompt/completion with a `label` column would train every completion, the
    undesirable ones included (a label beside another format, e.g. a classifier's beside `text`, is not KTO's)."""
    if fmt == "prompt_completion" and "label" in raw.column_names:
        raise DataError("data.err.sft_label", where=where, columns=", ".join(raw.column_names))


class Naming:
    """Prefix a DataError that does not name the data (`source`) with its file or dataset id (`where`)."""

    def __init__(self, source: str, split: str = "train") -> None:
        self.local = is_local(source)
        self.where = str(Path(source).expanduser()) if self.local else source
        self.whole = not any(c in (split or "train") for c in "[+")  # a slice's row 1 is not the file's row 1

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if isinstance(exc, DataError) and self.where not in str(exc):
            line = row_line(self.where, exc.row) if exc.row is not None and self.whole else None  # the editor's line
            if line is None:
                raise DataError("data.err.in_source", row=exc.row, where=self.where, error=exc) from None
            raise DataError("data.err.in_source_line", row=exc.row, where=self.where, error=exc, n=exc.row + 1,
                            line=line) from None
        return False


Progress = Callable[[float], None]  # how much of the tokenizing is done, 0 to 1


def _tokenize(columns: dict[str, list[str]], tokenizer: Any,
              progress: Progress | None = None) -> tuple[list[Any], list[int]]:
    """(token ids of each row, how many of them are prompt) exactly as TRL's SFTTrainer tokenizes: text alone, or
    prompt and prompt + completion separately, the completion starting where the two first differ. The ids are
    int32 arrays: a Python list of ints costs ~9x the memory, and the web app keeps the plan of its preview.
    `progress` hears after each batch: tokenizing is most of a large dataset's plan (300,000 rows: ~30 s)."""
    import numpy as np

    total = len(columns["text"]) if "text" in columns else 2 * len(columns["prompt"])
    done = 0

    def encode(texts: list[str]) -> list[Any]:
        nonlocal done
        out: list[Any] = []
        for start in range(0, len(texts), 1000):  # batched: fast tokenizers encode a batch in parallel
            # verbose=False: transformers' "longer than the model's maximum" warning names the wrong limit here
            batch = tokenizer(texts[start:start + 1000], verbose=False)["input_ids"]
            out += [np.asarray(ids, dtype=np.int32) for ids in batch]
            done += len(batch)
            if progress is not None:
                progress(done / total)
        return out

    if "text" in columns:
        ids = encode(columns["text"])
        return ids, [0] * len(ids)
    full = encode([p + c for p, c in zip(columns["prompt"], columns["completion"])])
    prompts = encode(columns["prompt"])
    return full, [_common_prefix(p, f) for p, f in zip(prompts, full)]


def _common_prefix(a: Any, b: Any) -> int:
    import numpy as np

    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


Spans = list[tuple[int, int]]


def cut_row(n_tokens: int, prompt_len: int, max_length: int, long_prompts: str,
            keep_first: bool = False) -> tuple[str, Spans, int]:
    """What one row of `n_tokens` tokens (the first `prompt_len` of them prompt) becomes: (reason, the [start, end)
    token ranges that train, in order, and how many of the kept tokens are prompt).

    Rows that fit are kept. Otherwise, as TRL would, the end is cut (the answer is partly lost) while the prompt
    leaves room for the answer. With long_prompts=drop a prompt that alone fills max_length drops the row (TRL's
    own behaviour); with truncate_left/truncate_middle a prompt that would leave the answer fewer than
    max_length // 4 tokens (or fewer than all of them, when shorter) loses tokens from its start (keeping the
    first, BOS, token when `keep_first`) or from its middle, so the answer still trains.
    """
    answer = n_tokens - prompt_len
    if n_tokens <= max_length:
        return "kept", [(0, n_tokens)], prompt_len
    if prompt_len == 0:  # plain text: trained from the start
        return "truncated", [(0, max_length)], 0
    floor = min(answer, max(1, max_length // ANSWER_SHARE))
    if long_prompts == "drop" or prompt_len <= max_length - floor:
        if prompt_len >= max_length:
            return "dropped_long", [], 0
        return "truncated", [(0, max_length)], prompt_len
    budget = max_length - floor  # prompt tokens kept
    if long_prompts == "truncate_middle":
        head = budget // 2
    else:  # truncate_left
        head = 1 if keep_first and budget > 1 else 0
    tail = prompt_len - (budget - head)
    spans = [(0, head)] if head else []
    return "prompt_cut", spans + [(tail, prompt_len + floor)], budget


def cut_turns(n_tokens: int, prompt_len: int, answers: Spans, max_length: int, long_prompts: str,
              keep_first: bool = False) -> tuple[str, Spans, int]:
    """cut_row for a conversation whose earlier assistant turns train too (`answers`: their token ranges in the
    prompt, in order; the last answer is the completion from `prompt_len`). A conversation past max_length is cut at
    a turn boundary, never inside a trained turn: it ends with the last assistant turn that fits whole (the later
    turns are left out, and counted so); when not even the first one fits, the row is its first exchange, cut as a
    single-turn row is (cut_row). Without earlier trained turns (one answer, train_turns=last): cut_row itself."""
    if n_tokens <= max_length or not answers:
        return cut_row(n_tokens, prompt_len, max_length, long_prompts, keep_first)
    fits = [b for _, b in answers if b <= max_length]
    if fits:
        return "truncated", [(0, fits[-1])], fits[-1]
    first_start, first_end = answers[0]
    return cut_row(first_end, first_start, max_length, long_prompts, keep_first)


def token_turns(text: str, spans: Spans, tokenizer: Any, prompt_len: int) -> Spans:
    """The token ranges of `text` (a row's prompt + completion, tokenized as _tokenize does) that the character
    `spans` (earlier assistant turns, core/data/formats.py) cover, within its first `prompt_len` tokens. A token belongs to
    the span its first character is in. None where the tokenizer gives no character offsets (a slow one)."""
    if not spans:
        return []
    try:
        offsets = tokenizer(text, return_offsets_mapping=True, verbose=False)["offset_mapping"]
    except (NotImplementedError, ValueError, TypeError, KeyError):
        return None
    out = []
    for a, b in spans:
        inside = [t for t, (start, end) in enumerate(offsets[:prompt_len]) if a <= start < b and end > start]
        if inside:
            out.append((inside[0], inside[-1] + 1))
    return out


def take(ids: Any, spans: Spans) -> Any:
    """The tokens of `ids` in `spans`, as one int32 array."""
    import numpy as np

    return np.concatenate([np.asarray(ids[a:b], dtype=np.int32) for a, b in spans] or [np.zeros(0, np.int32)])


def plan_rows(cfg: _Measured, tokenizer: Any, dataset: Any = None, fmt: str | None = None,
              n_examples: int = 3, progress: Progress | None = None, limit: Limit | None = None) -> DataPlan:
    """Decide, for `cfg`'s data (or `dataset` of format `fmt`, already read by check_data), which rows train and
    what each becomes, tokenized and templated as the trainer does. Raises DataError when the data cannot be used
    at all (unreadable, wrong columns, every row empty); a plan in which nothing trains has `refusal()`.
    `progress(fraction)`: how far the tokenizing is (the preview's bar, the run's formatting phase). `limit`: the
    bound check_data reads `cfg`'s data within (when `dataset` is not given)."""
    import numpy as np

    if dataset is None:
        dataset, fmt = check_data(cfg, limit)
    naming = Naming(cfg.dataset, cfg.dataset_split)
    with naming:
        columns, kept_rows = render_rows(dataset, fmt, tokenizer, cfg.train_turns)
        if not kept_rows:
            raise DataError("data.err.nothing_to_train", rows=len(dataset), dataset=cfg.dataset, format=fmt,
                            why=nothing_to_train(dataset, fmt))
    keep_first = _adds_bos(tokenizer)
    all_ids, prompt_lens = _tokenize(columns, tokenizer, progress)
    counts = dict.fromkeys(REASONS, 0)
    counts["dropped_empty"] = len(dataset) - len(kept_rows)
    plan = DataPlan(source=naming.where, format=fmt, max_length=cfg.max_length, long_prompts=cfg.long_prompts,
                    packing=cfg.packing, n_source=len(dataset), counts=counts,
                    lengths=[len(ids) for ids in all_ids], reasons=[], rows=kept_rows)
    char_turns = columns.get("turns") or [[] for _ in all_ids]
    turns = dict.fromkeys(("trained", "cut", "dropped"), 0) if "text" not in columns else None
    cuts = []  # per row: what cut_turns made of it (the preview's examples show the same)
    for i, (ids, prompt_len) in enumerate(zip(all_ids, prompt_lens)):
        # Which tokens carry loss: the completion (the last answer), and with train_turns=all every earlier answer
        answers = token_turns(columns["prompt"][i] + columns["completion"][i], char_turns[i], tokenizer,
                              prompt_len) if char_turns[i] else []
        if answers is None:
            answers = []
            if "Only the last assistant turn" not in " ".join(plan.notes):
                plan.notes.append(Said("log.last_turn_only"))
        reason, spans, n_prompt = cut_turns(len(ids), prompt_len, answers, cfg.max_length, cfg.long_prompts,
                                            keep_first)
        cuts.append((reason, spans, n_prompt))
        plan.reasons.append(reason)
        counts[reason] += 1
        trains = np.zeros(len(ids), dtype=bool)
        trains[prompt_len:] = prompt_len > 0 or "text" in columns
        for a, b in answers:
            trains[a:b] = True
        if spans:
            train_ids = take(ids, spans)
            labels = train_ids.copy()
            labels[~take(trains, spans).astype(bool)] = -100  # context only: TRL's completion-only loss
            plan.input_ids.append(train_ids)
            plan.labels.append(labels)
        if turns is not None:  # every answer accounted for: whole, cut at max_length (said, never silent), left out
            kept = np.zeros(len(ids), dtype=bool)
            for a, b in spans:
                kept[a:b] = True
            for a, b in [*answers, (prompt_len, len(ids))]:
                n_kept = int(kept[a:b].sum())
                turns["trained" if n_kept == b - a else "cut" if n_kept else "dropped"] += 1
    plan.turns = turns
    if cfg.packing and plan.input_ids:
        plan.n_packs = count_packs(plan.train_dataset(), cfg.max_length)
    longest = int(np.argmax(plan.lengths))
    if plan.lengths[longest] > cfg.max_length:
        plan.notes.append(Said("log.longest", row=kept_rows[longest] + 1, tokens=plan.lengths[longest],
                               what=Said(f"log.outcome.{plan.reasons[longest]}"), max_length=str(cfg.max_length)))
    plan.examples = _examples(plan, columns, all_ids, prompt_lens, cuts, tokenizer, n_examples, keep_first)
    _LONGEST[_lengths_key(cfg, naming.local)] = plan.longest_row
    return plan


def count_packs(rows: Any, max_length: int) -> int | None:
    """How many sequences TRL's best-fit-decreasing packing makes of these tokenized rows (its own function)."""
    try:
        from trl import pack_dataset
    except ImportError:  # an older TRL: the count is then unknown, never guessed
        return None
    return len(pack_dataset(rows, max_length, "bfd"))


def clip_text(text: str, limit: int = PREVIEW_CHARS) -> tuple[str, bool]:
    """The first and last `limit` characters of a long text (and True), or the whole text (and False)."""
    if len(text) <= 2 * limit:
        return text, False
    return f"{text[:limit]}\n[... {len(text) - 2 * limit:,} characters not shown ...]\n{text[-limit:]}", True


def _examples(plan: DataPlan, columns, all_ids, prompt_lens, cuts, tokenizer, n: int,
              keep_first: bool) -> list[dict[str, Any]]:
    """The first `n` rows, then the first row of each other outcome, as they train (cut parts marked)."""
    picked = list(range(min(n, len(plan.reasons)))) if n else []
    for reason in REASONS[1:]:
        if n and reason in plan.reasons and reason not in {plan.reasons[i] for i in picked}:
            picked.append(plan.reasons.index(reason))
    bos = getattr(tokenizer, "bos_token_id", None) if keep_first else None

    def show(ids: Any) -> str:
        ids = [int(x) for x in ids]
        return tokenizer.decode(ids[1:] if ids and ids[0] == bos else ids)

    def cut(n_tokens: int, what: str) -> str:
        return f"[... {n_tokens:,} {what} tokens cut ...]"

    out = []
    for i in picked:
        ids, prompt_len = all_ids[i], prompt_lens[i]
        reason, spans, n_prompt = cuts[i]
        trained = take(ids, spans)
        ex: dict[str, Any] = {"row": plan.rows[i] + 1, "reason": reason, "tokens": len(ids),
                              "trained_tokens": len(trained)}
        gone = len(ids) - len(trained)
        if "text" in columns:
            ex["text"] = columns["text"][i] if reason == "kept" else show(trained) + "\n" + cut(gone, "")
        else:
            ex["prompt"], ex["completion"] = columns["prompt"][i], columns["completion"][i]
            if spans and spans[-1][1] <= prompt_len < len(ids):  # a conversation cut at a turn (cut_turns)
                parts, at = [], 0
                for a, b in spans:
                    parts += ([cut(a - at, "prompt")] if a > at else []) + [show(ids[a:b])]
                    at = b
                ex["prompt"] = "\n".join(parts)
                ex["completion"] = (f"[... {len(ids) - at:,} tokens cut: the assistant turns after this point do "
                                    f"not fit max_length {plan.max_length} whole and do not train ...]")
            elif reason == "truncated":
                ex["completion"] = show(trained[prompt_len:]) + "\n" + cut(gone, "answer")
            elif reason == "prompt_cut":
                head = spans[0][1] if len(spans) > 1 else 0
                marker = cut(prompt_len - n_prompt, "prompt")
                lead = show(trained[:head])  # truncate_middle: the prompt's start; truncate_left: BOS or nothing
                ex["prompt"] = (f"{lead}\n" if lead else "") + f"{marker}\n" + show(trained[head:n_prompt])
                answer_cut = len(ids) - prompt_len - (len(trained) - n_prompt)
                ex["completion"] = show(trained[n_prompt:]) + (f"\n{cut(answer_cut, 'answer')}" if answer_cut else "")
        clipped = False
        for key in ("text", "prompt", "completion"):
            if key in ex:
                ex[key], was = clip_text(ex[key])
                clipped |= was
        if clipped:
            ex["note"] = Said("preview.clipped", row=ex["row"], tokens=len(ids), chars=PREVIEW_CHARS)
        out.append(ex)
    return out


def length_stats(lengths: list[int]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(lengths)
    return {"min": int(a.min()), "median": float(np.median(a)), "p95": float(np.percentile(a, 95)),
            "max": int(a.max()), "mean": float(a.mean())}
