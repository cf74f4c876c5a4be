"""Preference data (stages dpo, orpo, kto): which rows train, and what each becomes, accounted like SFT rows.

The formats TRL's preference trainers read:
- `pairs`: prompt / chosen / rejected, plain strings or conversational message lists (DPO, ORPO; KTO unpairs them);
- `implicit_pairs`: chosen / rejected only, each a conversation holding the prompt (UltraFeedback-style): TRL's own
  `extract_prompt` takes the shared start as the prompt;
- `unpaired`: prompt / completion / label (true: desirable), KTO's own format.

`check_pairs(cfg)` reads the data and refuses a file without the columns its stage needs before any model is looked
up, naming the file, the columns found and the fix. `plan_pairs(cfg, tokenizer, raw, fmt)` tokenizes every row with
TRL's own tokenizing function (trl.data_utils._tokenize, what DPOTrainer/KTOTrainer call) and decides its fate:
kept, truncated (the chosen or rejected side, or the completion, is cut at max_length: TRL's collator keeps the
start), dropped_long (the prompt alone fills max_length: TRL drops it too) or dropped_empty. The trainer gets exactly
the rows that are not dropped, in the shape TRL reads, so kept + truncated + dropped = rows read.

Validation is SFT's (core/data/validation.py): `split_pairs` holds out validation_share of the pairs (seeded, the
same rule for small splits) or reads validation_data / validation_split as pairs, before the plan; `plan_pairs` with
that split plans the rows that train and, alike, the validation pairs (PairPlan.validation), which TRL's trainer
evaluates as its eval_dataset (eval_loss, eval_rewards/accuracies ...). KTO's pairs are split before they are
unpaired: both answers of a held-out pair are held out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from core.config.settings import DEMO_DATASET, DEMO_PAIRS
from core.config.slices import DataSlice, ModelSlice, StageSlice, TrainerSlice
from core.data.formats import column_values
from core.data.plan import Naming, WithValidation
from core.data.read import DataError, Limit, load_raw
from core.data.validation import Split, split, val_config
from core.messages import Said

PAIR_FORMATS = ("pairs", "implicit_pairs", "unpaired")
REASONS = ("kept", "truncated", "dropped_long", "dropped_empty")
# what each stage reads: DPO and ORPO need a chosen and a rejected answer; KTO reads unpaired rows (and paired ones,
# which TRL's unpair_preference_dataset splits into one desirable and one undesirable row)
NEEDS = {"dpo": ("pairs", "implicit_pairs"), "orpo": ("pairs", "implicit_pairs"),
         "kto": ("unpaired", "pairs", "implicit_pairs")}
# the columns that hold text or a list of messages, per format (a number or an object there would end the run)
TEXT_COLUMNS = {"pairs": ("prompt", "chosen", "rejected"), "implicit_pairs": ("chosen", "rejected"),
                "unpaired": ("prompt", "completion")}
# KTO's label, written as JSON, a number or text (a CSV's fields are all text; datasets reads a JSON column of mixed
# types as text too): these words only, in any case, so that "no", "-1" or "n/a" are refused instead of read as true
LABEL_WORDS = {"true": True, "1": True, "false": False, "0": False}
MESSAGE_SHAPE = '[{"role": "user", "content": "..."}, ...]'  # a message parameter: braces would be placeholders


def pair_format(columns: list[str]) -> str | None:
    """The preference format of a dataset with these columns, or None."""
    names = set(columns)
    if {"chosen", "rejected"} <= names:
        return "pairs" if "prompt" in names else "implicit_pairs"
    if {"prompt", "completion", "label"} <= names:
        return "unpaired"
    return None


class _Pairs(DataSlice, StageSlice, Protocol):
    """The data and the stage whose columns it must have."""


class _HeldPairs(DataSlice, StageSlice, TrainerSlice, Protocol):
    """The pairs and the seed their validation share is drawn with."""


class _PlannedPairs(DataSlice, StageSlice, ModelSlice, Protocol):
    """The pairs, their stage and the model whose tokenizer plans them."""


def _where(cfg: DataSlice) -> str:
    return f"{cfg.dataset} [{cfg.dataset_split}]"


def check_pairs(cfg: _Pairs, limit: Limit | None = None) -> tuple[Any, str]:
    """Read the data and check it has what `cfg.stage` needs: (raw dataset, format). Refused with the file, the
    columns found and the fix (data.err.pair_columns) before any model is resolved, and every row's cells by type
    (check_rows: KTO's labels come back as booleans). `limit` (core.data.read.PREVIEW_LIMIT for a preview): the
    rows and bytes it may read, refused by name past them; None for training."""
    if cfg.dataset == DEMO_DATASET:  # the demo's word pairs with a wrong translation as the rejected answer
        raw = load_raw(str(DEMO_PAIRS), cfg.dataset_split, limit)  # core.demo.write_demo_pairs made it
    else:
        raw = load_raw(cfg.dataset, cfg.dataset_split, limit)
    fmt = pair_format(raw.column_names)
    if fmt not in NEEDS[cfg.stage]:
        raise DataError("data.err.pair_columns_kto" if cfg.stage == "kto" else "data.err.pair_columns",
                        stage=cfg.stage, where=_where(cfg), columns=", ".join(raw.column_names) or "-")
    if len(raw) == 0:
        raise DataError("data.err.pair_empty", where=_where(cfg))
    return check_rows(raw, fmt, cfg.dataset, cfg.dataset_split), fmt


def check_rows(raw: Any, fmt: str, source: str, split_name: str = "train") -> Any:
    """Every row of preference data `raw` (format `fmt`, read from `source`) checked by type before any model is
    loaded, each refusal naming the row, its line in the file and the column: prompt/chosen/rejected/completion text
    or a list of messages (an empty cell is counted as empty by the plan); a row's cells all text or all messages
    (a text prompt beside conversations is TRL's UltraFeedback form: the conversations hold the prompt); KTO's label
    true/false or 1/0 (LABEL_WORDS). Refused as a whole: pairs whose chosen and rejected answers are the same in
    every row, and chosen/rejected without a prompt column that share no start to take as the prompt. Returns `raw`
    with KTO's labels as booleans (None where empty), as TRL reads them."""
    naming = Naming(source, split_name)
    columns = [c for c in (*TEXT_COLUMNS[fmt], "label") if c in raw.column_names]
    values = {c: column_values(raw, c) for c in columns}
    with naming:
        for column in TEXT_COLUMNS[fmt]:
            for row, value in enumerate(values[column]):
                kind = _kind(value)
                if kind not in (None, "data.kind.text", "data.kind.messages"):
                    raise DataError("data.err.pair_cell", row=row, n=row + 1, column=repr(column), kind=_named(kind),
                                    value=f"{value!r:.60}", shape=MESSAGE_SHAPE)
        for row, cells in enumerate(zip(*(values[c] for c in TEXT_COLUMNS[fmt]))):
            _check_kinds(row, dict(zip(TEXT_COLUMNS[fmt], cells)), fmt)
        if fmt == "unpaired":
            labels = [_label(row, value) for row, value in enumerate(values["label"])]
            return raw.remove_columns("label").add_column("label", labels)
        pairs = [(c, r) for c, r in zip(values["chosen"], values["rejected"]) if _present(c) and _present(r)]
        if pairs and all(c == r for c, r in pairs):
            raise DataError("data.err.pairs_identical", where=naming.where, n=len(pairs))
        if fmt == "implicit_pairs" and pairs and not any(_shared_prompt(c, r) for c, r in pairs):
            raise DataError("data.err.pair_no_prompt", where=naming.where, columns=", ".join(raw.column_names),
                            shape=MESSAGE_SHAPE)
    return raw


def _kind(value: Any) -> str | None:
    """What a cell holds, as the key that names it (data.kind.text and data.kind.messages are what a text column may
    hold); None for an empty cell (None, "", [], NaN), which the plan counts as empty."""
    if value is None or value == "" or value == [] or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, str):
        return "data.kind.text"
    if isinstance(value, list):
        if all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
            return "data.kind.messages"
        return "data.kind.list"
    if isinstance(value, bool):
        return "data.kind.boolean"
    if isinstance(value, (int, float)):
        return "data.kind.number"
    return "data.kind.object" if isinstance(value, dict) else "data.kind.other"


def _check_kinds(row: int, cells: dict[str, Any], fmt: str) -> None:
    """A row's text cells are all text or all messages; in pairs a text prompt may stand beside conversations (TRL
    then takes the prompt from the conversations: maybe_extract_prompt). Otherwise the trainer would add a text to
    a list."""
    kinds = {c: k for c, k in ((c, _kind(v)) for c, v in cells.items()) if k is not None}
    answers = [c for c in kinds if c != "prompt"]
    differ = next(((a, b) for a in answers for b in answers if kinds[a] != kinds[b]), None)
    if differ is None and "prompt" in kinds and answers and kinds[answers[0]] != kinds["prompt"]:
        if not (fmt == "pairs" and kinds["prompt"] == "data.kind.text"):
            differ = ("prompt", answers[0])
    if differ is not None:
        first, second = differ
        raise DataError("data.err.pair_mixed", row=row, n=row + 1, first=repr(first), a=_named(kinds[first]),
                        second=repr(second), b=_named(kinds[second]))


def _named(key: str) -> dict[str, Any]:
    """A kind's key (_kind) as a nested message parameter."""
    return {"key": key, "params": {}}


def _label(row: int, value: Any) -> bool | None:
    """KTO's label as a boolean (None: empty), or DataError naming the row and the value."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and (value.strip().lower() in LABEL_WORDS or not value.strip()):
        return LABEL_WORDS.get(value.strip().lower())
    raise DataError("data.err.kto_label", row=row, n=row + 1, value=f"{value!r:.60}")


def _shared_prompt(chosen: Any, rejected: Any) -> bool:
    """Chosen and rejected start alike, so TRL's extract_prompt finds a prompt in them."""
    from trl.data_utils import extract_prompt

    return _present(extract_prompt({"chosen": chosen, "rejected": rejected})["prompt"])


def split_pairs(cfg: _HeldPairs, raw: Any, fmt: str, limit: Limit | None = None) -> Split:
    """The pairs that train and the validation pairs: SFT's split (core.data.validation.split: a seeded share, or a
    separate file / split, the same rules), the separate data read and checked as this stage's pairs (within
    `limit`, when given)."""
    return split(cfg, raw, fmt, read=check_pairs, limit=limit)


def identical_pairs(raw: Any) -> int:
    """Pairs whose chosen and rejected answers are the same: they teach nothing (DPO's loss stays at log 2)."""
    return sum(_present(c) and c == r for c, r in zip(column_values(raw, "chosen"), column_values(raw, "rejected")))


def _present(value: Any) -> bool:
    return value is not None and value != "" and value != []


@dataclass
class PairPlan(WithValidation):
    """What a preference stage trains on, row by row; the recipe uses it where an SFT run uses a DataPlan
    (to_dict, describe, log_lines, train_dataset, refusal, evaluates)."""

    source: str
    format: str
    stage: str
    max_length: int
    n_source: int  # rows read (pairs; for KTO on paired data, the unpaired rows TRL makes of them)
    counts: dict[str, int]
    lengths: list[int]  # per row: its longest sequence (prompt + the longer answer) in tokens
    rows: list[dict[str, Any]] = field(repr=False, default_factory=list)  # the rows that train, as TRL reads them
    conversational: bool = False
    notes: list[Any] = field(default_factory=list)
    # The validation part, as DataPlan's: which pairs were held out and why (core.data.validation.Split), and the
    # validation pairs' own plan (a PairPlan; None: no validation), which the trainer gets as its eval_dataset
    held: Split | None = None
    validation: PairPlan | None = None
    packing: bool = False
    n_packs: int | None = None

    @property
    def n_train(self) -> int:
        return self.counts["kept"] + self.counts["truncated"]

    @property
    def longest_row(self) -> int:
        return max(self.lengths, default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "stage": self.stage, "rows_in_split": self.n_source,
                "train_rows": self.n_train, **self.counts, "max_length": self.max_length,
                "conversational": self.conversational, "longest_row_tokens": self.longest_row}

    def describe(self, validation: bool = False) -> Said:
        """The run log's line: every row read, accounted for (log.pairs; the validation pairs': log.val_pairs)."""
        parts = [Said(f"pairs.reason.{r}", n=self.counts[r]) for r in REASONS if self.counts[r] or r == "kept"]
        return Said("log.val_pairs" if validation else "log.pairs", rows=self.n_source,
                    dataset=f"{self.source} ({self.format})", stage=self.stage, train=self.n_train,
                    max_length=str(self.max_length), outcomes=Said("msg.list", items=parts))

    def log_lines(self) -> list[tuple[str, Any]]:
        """As DataPlan's: the plan, its notes, what was held out (or why nothing was), the validation pairs' plan."""
        return self.with_validation([self.describe(), *self.notes])

    def train_dataset(self) -> Any:
        import datasets

        return datasets.Dataset.from_list(self.rows)

    def refusal(self) -> Said | None:
        if self.n_train:
            return None
        if not self.counts["dropped_long"]:  # max_length is not the cause: say what is empty
            return Said("log.pairs_refusal_empty", rows=self.counts["dropped_empty"], source=self.source,
                        needs=", ".join(("prompt", "completion", "label") if self.format == "unpaired" else
                                        ("prompt", "chosen", "rejected")))
        return Said("log.pairs_refusal", rows=self.counts["dropped_long"], empty=self.counts["dropped_empty"],
                    source=self.source, max_length=str(self.max_length))

    def prompt_samples(self, tokenizer: Any, n: int) -> list[dict[str, Any]]:
        """core.data.validation.samples for validation pairs: the first `n` rows with a preferred answer (a pair's
        chosen, a KTO row labelled desirable), as {row, prompt_ids, prompt, reference}: the prompt tokenized as the
        trainers tokenize it (with the generation prompt for a conversation), the preferred answer the reference."""
        from trl.data_utils import _tokenize, is_conversational

        out = []
        for i, row in enumerate(self.rows):
            if len(out) >= n:
                break
            answer = row.get("chosen", row.get("completion") if row.get("label") else None)
            if not _present(answer):
                continue
            conversational = is_conversational(row)
            ids = _tokenize(tokenizer, row["prompt"], **({"add_generation_prompt": True} if conversational else {}))
            ids = [int(x) for x in ids["input_ids"]]
            reference = (" ".join(str(m.get("content", "")) for m in answer) if isinstance(answer, list) else answer)
            out.append({"row": i, "prompt_ids": ids, "prompt": tokenizer.decode(ids, skip_special_tokens=True),
                        "reference": reference})
        return out


def plan_pairs(cfg: _PlannedPairs, tokenizer: Any, raw: Any = None, fmt: str | None = None,
               held: Split | None = None) -> PairPlan:
    """Every row of `cfg`'s preference data accounted for (module docstring), tokenized as TRL tokenizes it. With
    `held` (split_pairs' split of `raw`), the plan of the pairs that train, its validation part planned alike."""
    if raw is None:
        raw, fmt = check_pairs(cfg)
    if held is None:
        return _plan(cfg, tokenizer, raw, fmt)
    plan = _plan(cfg, tokenizer, held.train, fmt)
    plan.held = held
    if held.val is not None:
        plan.validation = _plan(val_config(cfg), tokenizer, held.val, held.val_format)
    return plan


def _plan(cfg: _PlannedPairs, tokenizer: Any, raw: Any, fmt: str) -> PairPlan:
    """One part's plan: every row of `raw` (of format `fmt`) kept, truncated or dropped, as TRL reads it."""
    from trl.data_utils import _tokenize, is_conversational, maybe_extract_prompt, unpair_preference_dataset

    identical, n_pairs = (identical_pairs(raw) if fmt != "unpaired" else 0), len(raw)  # before KTO unpairs them
    if cfg.stage == "kto" and fmt != "unpaired":
        raw = unpair_preference_dataset(raw.map(maybe_extract_prompt))  # TRL's own split: one row per answer
        fmt = "unpaired"
    answers = ("completion",) if fmt == "unpaired" else ("chosen", "rejected")
    counts = dict.fromkeys(REASONS, 0)
    plan = PairPlan(source=_where(cfg), format=fmt, stage=cfg.stage, max_length=cfg.max_length,
                    n_source=len(raw), counts=counts, lengths=[])
    if identical:
        plan.notes.append(Said("log.pairs_identical", n=identical, total=n_pairs))
    eos = tokenizer.eos_token or ""
    chat = bool(getattr(tokenizer, "chat_template", None))
    kept = [c for c in ("prompt", *answers, "label") if c in raw.column_names]
    for row in (dict(zip(kept, cells)) for cells in zip(*(column_values(raw, c) for c in kept))):  # column slices: fast
        if fmt != "unpaired" and all(_present(row.get(a)) for a in answers):
            # TRL's: the conversations' shared start is the prompt (implicit pairs, or a text prompt beside them)
            row = maybe_extract_prompt(row)
        if not all(_present(row.get(k)) for k in ("prompt", *answers)) or (fmt == "unpaired" and row["label"] is None):
            counts["dropped_empty"] += 1
            continue
        conversational = is_conversational(row)
        if conversational and not chat:
            raise DataError("data.err.pair_no_template", where=plan.source, model=cfg.model)
        plan.conversational |= conversational
        if conversational:  # what DPOTrainer/KTOTrainer tokenize: the prompt with the generation prompt, then whole
            prompt = len(_tokenize(tokenizer, row["prompt"], add_generation_prompt=True)["input_ids"])
            full = [len(_tokenize(tokenizer, row["prompt"] + row[a])["input_ids"]) for a in answers]
        else:  # plain text: the answers get EOS, as the trainers add it
            prompt = len(_tokenize(tokenizer, row["prompt"])["input_ids"])
            full = [len(_tokenize(tokenizer, row["prompt"] + row[a] + (eos if not row[a].endswith(eos) else ""))
                        ["input_ids"]) for a in answers]
        plan.lengths.append(max(full))
        if prompt >= cfg.max_length:  # TRL drops it too (keep_start would leave no answer token)
            counts["dropped_long"] += 1
            continue
        counts["truncated" if max(full) > cfg.max_length else "kept"] += 1
        if fmt == "unpaired":
            row["label"] = bool(row["label"])
        plan.rows.append(row)
    return plan
