"""Training data: load it, recognise its format, and turn it into what TRL's SFTTrainer trains on.

Every format becomes string columns `prompt` + `completion` (TRL then computes the loss on the completion only)
or, for plain text, one `text` column. Formatting happens here, not inside TRL, so the preview shows exactly
the strings that are trained on and every problem surfaces up front as a `DataError` that says what to do.

How rows are rendered:
- With a chat template (tokenizer.chat_template), a row becomes a conversation: instruction (+ context/input,
  after a blank line) is the user turn, the response the assistant turn. prompt = the template applied to every
  message before the last assistant turn with add_generation_prompt=True; completion = the full rendering minus
  that prompt. Multi-turn conversations: earlier turns are context (inside the prompt, not trained on), the
  last assistant turn is the completion; messages after it are ignored.
- Without one, DEFAULT_TEMPLATE (Alpaca style). Conversations map onto it too: the last user turn is the
  instruction, the system message and earlier turns (as "User: ..."/"Assistant: ..." lines) the input.
- prompt_completion string rows are already TRL's own format and pass through verbatim (no template), like
  plain text; prompt/completion given as message lists are rendered like `messages`.
- The completion and text end with the tokenizer's EOS token (TRL would append it anyway; here it shows in the
  preview and in the token counts), and a leading BOS text is removed where the tokenizer adds BOS itself.
Rows with an empty prompt or completion (or empty text) are dropped and counted, never trained on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import DEMO_DATASET, TrainConfig

# Local file suffix -> the datasets builder that reads it.
LOADERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
# Suffixes that mark a data file even when it does not exist (so "data.tsv" is not mistaken for a Hub id).
FILE_LIKE = set(LOADERS) | {".tsv", ".xlsx", ".xls", ".gz", ".zip", ".arrow", ".xml", ".yaml", ".yml", ".md"}

# Format -> (required columns, optional columns), in detection order: structured formats win over a `text`
# column, since e.g. tatsu-lab/alpaca carries both and only the structure allows completion-only loss.
FORMATS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "messages": (("messages",), ()),
    "sharegpt": (("conversations",), ()),
    "prompt_completion": (("prompt", "completion"), ()),
    "alpaca": (("instruction", "output"), ("input",)),
    "dolly": (("instruction", "response"), ("context",)),
    "text": (("text",), ()),
}
FORMAT_NOTES = {"messages": "a list of {role, content}", "sharegpt": "a list of {from, value}"}

# ShareGPT speaker names (and the OpenAI ones, which some ShareGPT dumps use) -> chat-template roles.
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "model": "assistant", "bard": "assistant", "bing": "assistant", "system": "system", "tool": "tool"}

DEFAULT_TEMPLATE = "### Instruction:\n{instruction}\n\n{input_section}### Response:\n"
INPUT_SECTION = "### Input:\n{input}\n\n"


class DataError(ValueError):
    """A problem with the training data; the message says what was wrong and what to do."""


@dataclass
class DataPreview:
    format: str
    n_rows: int  # rows that will be trained on
    n_dropped: int  # rows dropped for an empty prompt/completion/text
    examples: list[dict[str, str]]  # the first rows as trained on
    token_lengths: list[int]  # of every row, tokenized as TRL does
    max_length: int
    n_over_max: int  # rows TRL will truncate
    stats: dict[str, float] = field(default_factory=dict)  # min, median, p95, max, mean of token_lengths


# --- loading ---------------------------------------------------------------------------------------------
def format_help() -> str:
    parts = []
    for name, (need, optional) in FORMATS.items():
        cols = ", ".join(need) + (f"; optional {', '.join(optional)}" if optional else "")
        note = f": {FORMAT_NOTES[name]}" if name in FORMAT_NOTES else ""
        parts.append(f"{name} ({cols}{note})")
    return "; ".join(parts)


def is_local(source: str) -> bool:
    """A path rather than a Hub id (org/name): it exists, ends like a data file, or is written like a path."""
    path = Path(source).expanduser()
    return (path.exists() or path.suffix.lower() in FILE_LIKE or source.startswith(("/", ".", "~"))
            or "\\" in source or source.count("/") > 1)


def load_raw(source: str, split: str = "train") -> Any:
    """Load `source` (DEMO_DATASET, a local data file or folder, or a Hub dataset id) and select `split`.

    `split` accepts datasets' slicing syntax (train[:1000], train[10%:20%]) for Hub and local data alike.
    """
    import datasets

    source, split = source.strip(), (split or "train").strip()
    if not source:
        raise DataError(f"No dataset given. Give a Hub dataset id, a local {'/'.join(LOADERS)} file, "
                        f"or {DEMO_DATASET}.")
    if source == DEMO_DATASET:
        from core.demo import DEMO_DATA

        return _load_file(DEMO_DATA, split)
    from core.public import dataset_problem

    if (why := dataset_problem(source)):  # public mode: a visitor's typed path is never read
        raise DataError(why)
    if is_local(source):
        path = Path(source).expanduser()
        if path.is_dir():  # a folder of data files, e.g. a git clone of a Hub dataset
            return _checked(lambda s: datasets.load_dataset(str(path), split=s), str(path), split)
        return _load_file(path, split)
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", source):
        raise DataError(f"{source!r} is neither an existing local file nor a Hub dataset id (org/name). "
                        "Check the spelling or the path.")
    return _checked(lambda s: _load_hub(source, s), source, split)


def _load_file(path: Path, split: str) -> Any:
    import datasets

    if not path.is_file():
        raise DataError(f"The data file {path} does not exist. Check the path (relative paths start from "
                        f"{Path.cwd()}).")
    builder = LOADERS.get(path.suffix.lower())
    if builder is None:
        raise DataError(f"{path.name}: files ending in {path.suffix or '(no extension)'} are not supported. "
                        f"Accepted: {', '.join(LOADERS)}; convert the file or rename it if it is one of these.")
    if builder != "parquet":
        scan_text_file(path)
    kwargs: dict[str, Any] = {"features": _csv_features(path)} if builder == "csv" else {}
    return _checked(lambda s: datasets.load_dataset(builder, data_files=str(path), split=s, **kwargs),
                    str(path), split)


def _csv_features(path: Path) -> Any:
    """Every CSV column as text, so "007" stays "007" and "3" does not become 3.0 (pandas guesses numbers)."""
    import csv

    import datasets

    with path.open(encoding="utf-8-sig", newline="") as fh:
        header = next(csv.reader(fh), [])
    if not header or len(set(header)) != len(header):  # no header or duplicate names: let pandas decide
        return None
    return datasets.Features({name: datasets.Value("string") for name in header})


def _load_hub(source: str, split: str) -> Any:
    import datasets

    try:
        return datasets.load_dataset(source, split=split)
    except ValueError:
        raise  # split problems: translated by _checked
    except Exception as exc:
        if _is_offline_error(exc):
            raise DataError(
                f"The dataset {source} is not in the local cache and the Hugging Face Hub cannot be reached "
                f"({type(exc).__name__}). Download it first while online (python -c \"import datasets; "
                f"datasets.load_dataset('{source}')\") or use a local .jsonl/.csv/.parquet file.") from None
        if type(exc).__name__ in ("DatasetNotFoundError", "RepositoryNotFoundError", "GatedRepoError"):
            raise DataError(f"The Hub has no dataset {source} you can access ({exc}). Check the id, or for a "
                            "private/gated dataset accept its terms and set HF_TOKEN.") from None
        raise DataError(f"Could not load the Hub dataset {source}: {type(exc).__name__}: {exc}") from None


def _is_offline_error(exc: BaseException) -> bool:
    """True when the Hub could not be reached (offline mode, no network, cache miss)."""
    names = {"OfflineModeIsEnabled", "LocalEntryNotFoundError", "ConnectError", "ConnectTimeout", "ReadTimeout",
             "Timeout", "NameResolutionError", "MaxRetryError"}
    seen: BaseException | None = exc
    for _ in range(10):  # datasets wraps the huggingface_hub error; look a few links down the chain
        if seen is None:
            return False
        if isinstance(seen, (ConnectionError, TimeoutError)) or type(seen).__name__ in names:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _checked(load, where: str, split: str) -> Any:
    """Run `load(split)`, translating datasets' split errors, and refuse an empty result."""
    try:
        ds = load(split)
    except DataError:
        raise
    except ValueError as exc:
        msg = str(exc)
        if msg.startswith("Unknown split"):
            found = re.search(r"one of (\[.*\])", msg)
            raise DataError(f"{where} has no split {_split_name(split)!r}; available splits: "
                            f"{found.group(1) if found else '(unknown)'}. Set dataset_split to one of them, "
                            "e.g. train or train[:1000].") from None
        if msg.startswith("Unrecognized instruction format") or "Unrecognized split format" in msg:
            raise DataError(f"dataset_split {split!r} is not valid split syntax. Write e.g. train, train[:1000], "
                            "train[100:200] or train[:10%].") from None
        if "corresponds to no data" in msg:
            ds = None
        else:
            raise DataError(f"Could not read {where}: {msg}") from None
    except Exception as exc:
        raise DataError(f"Could not read {where}: {type(exc).__name__}: {exc}") from None
    if ds is None or len(ds) == 0:
        raise DataError(_empty_message(load, where, split))
    return ds


def _split_name(split: str) -> str:
    return re.split(r"[\[+]", split, maxsplit=1)[0].strip()


def _empty_message(load, where: str, split: str) -> str:
    name = _split_name(split)
    if name != split:  # a slice: say how many rows the whole split has
        try:
            total = len(load(name))
        except Exception:
            total = 0
        if total:
            return (f"dataset_split {split!r} selects no rows: {name} of {where} has {total} rows. "
                    f"Use a range inside it, e.g. {name}[:{min(total, 1000)}].")
    return f"{where} has no rows (split {name!r} is empty). Add data to it or pick another dataset."


def scan_text_file(path: Path) -> None:
    """Check a text data file is UTF-8 (and, for .jsonl/.json, valid JSON) before datasets reads it.

    datasets' own errors here name neither the line nor the fix, so we find the first bad line ourselves.
    """
    jsonl = path.suffix.lower() == ".jsonl"
    offset, n_data = 0, 0
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:  # a line ends at b"\n", which never occurs inside a UTF-8 character
                raise DataError(
                    f"{path} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at byte offset {offset + exc.start} "
                    f"(line {number}) cannot be decoded. Save the file as UTF-8, e.g. "
                    f"iconv -f latin1 -t utf-8 {path.name} > fixed{path.suffix}") from None
            offset += len(raw)
            if number == 1:
                line = line.removeprefix("\ufeff")  # a UTF-8 byte-order mark is harmless
            if not line.strip():
                continue
            n_data += 1
            if jsonl:
                _check_json_line(path, number, line)
    if n_data == 0:
        raise DataError(f"{path} is empty (no data lines). Add rows to it or pick another file.")
    if path.suffix.lower() == ".json":
        _check_json_document(path)


def _check_json_line(path: Path, number: int, line: str) -> None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: line {number} is not valid JSON ({exc.msg}, column {exc.colno}): "
                        f"{line.strip()[:80]!r}. Each line of a .jsonl file must be one JSON object; fix or "
                        "delete that line.") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: line {number} is a JSON {type(value).__name__}, not an object "
                        '({"column": value, ...}). Each line of a .jsonl file must be one JSON object.')


def _check_json_document(path: Path) -> None:
    """A .json file is either one document (a list of objects) or JSON Lines under another name."""
    text = path.read_text(encoding="utf-8-sig")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) > 1 and all(ln.lstrip().startswith("{") for ln in lines):  # JSON Lines
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    _check_json_line(path, number, line)
            return
        raise DataError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg}). Fix the "
                        "file: it must hold a list of objects, or one JSON object per line.") from None
    if isinstance(value, list) and not all(isinstance(v, dict) for v in value):
        raise DataError(f"{path} holds a JSON list whose items are not all objects. Each item must be one row "
                        '({"column": value, ...}).')
    if isinstance(value, list) and not value:
        raise DataError(f"{path} is an empty JSON list. Add rows to it or pick another file.")


# --- formats ---------------------------------------------------------------------------------------------
def detect_format(dataset: Any) -> str:
    """The first format in FORMATS whose required columns the dataset has, or DataError listing them all."""
    columns = set(dataset.column_names)
    for name, (need, _) in FORMATS.items():
        if set(need) <= columns:
            return name
    raise DataError(f"The data has columns {sorted(columns)}, which match no known format. Accepted formats "
                    f"and the columns each needs: {format_help()}. Rename the columns to fit one of them.")


def check_format(dataset: Any, fmt: str) -> None:
    if fmt not in FORMATS:
        raise DataError(f"Unknown dataset_format {fmt!r}. Use auto or one of: {', '.join(FORMATS)}.")
    need, optional = FORMATS[fmt]
    missing = [c for c in need if c not in dataset.column_names]
    if missing:
        try:
            hint = f"set dataset_format to auto (it detects {detect_format(dataset)})"
        except DataError:
            hint = f"rename the columns (accepted formats: {format_help()})"
        extra = f" (optional {', '.join(optional)})" if optional else ""
        raise DataError(f"dataset_format {fmt} needs the columns {', '.join(need)}{extra}, but the data has "
                        f"{sorted(dataset.column_names)} (missing {', '.join(missing)}). Either {hint}.")


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN: an empty cell
        return ""
    if isinstance(value, list):  # multimodal-style content parts: keep the text ones
        return "".join(p.get("text") or "" for p in value if isinstance(p, dict))
    return value if isinstance(value, str) else str(value)


def _messages(turns: Any, row: int, column: str) -> list[dict[str, str]]:
    """Normalise a role/content or from/value list into chat-template messages."""
    if not isinstance(turns, list):
        raise DataError(f"Row {row}: column {column!r} must be a list of messages, not {type(turns).__name__}.")
    out = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise DataError(f"Row {row}: each item of {column!r} must be an object like "
                            '{"role": "user", "content": "..."}, not ' + f"{turn!r:.60}.")
        speaker = turn.get("role") if turn.get("role") is not None else turn.get("from")
        role = ROLES.get(str(speaker).strip().lower())
        if role is None:
            raise DataError(f"Row {row}: unknown speaker {speaker!r} in {column!r}. Use the roles "
                            "system/user/assistant (or ShareGPT's system/human/gpt).")
        content = turn.get("content") if "content" in turn and turn.get("content") is not None else turn.get("value")
        out.append({"role": role, "content": _text(content)})
    return out


def _fields(row: dict[str, Any], fmt: str) -> tuple[str, str, str]:
    """(instruction, context, response) of a dolly or alpaca row."""
    extra = row.get("context" if fmt == "dolly" else "input")
    return (_text(row["instruction"]).strip(), _text(extra).strip(),
            _text(row["response" if fmt == "dolly" else "output"]))


def _conversation(row: dict[str, Any], fmt: str, index: int) -> list[dict[str, str]] | None:
    """The row as messages ending on the assistant turn to train on, or None when it has nothing to train on."""
    if fmt in ("dolly", "alpaca"):
        user, extra, answer = _fields(row, fmt)
        messages = [{"role": "user", "content": f"{user}\n\n{extra}" if extra else user},
                    {"role": "assistant", "content": answer}]
    elif fmt == "prompt_completion":
        messages = _messages(row["prompt"], index, "prompt") + _messages(row["completion"], index, "completion")
    else:
        column = FORMATS[fmt][0][0]
        messages = _messages(row[column], index, column)
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None or not messages[last]["content"].strip():
        return None
    if not any(m["content"].strip() for m in messages[:last]):
        return None
    return messages[: last + 1]


def default_prompt(instruction: str, context: str = "") -> str:
    section = INPUT_SECTION.format(input=context.strip()) if context.strip() else ""
    return DEFAULT_TEMPLATE.format(instruction=instruction.strip(), input_section=section)


def _render_default(messages: list[dict[str, str]]) -> tuple[str, str]:
    """Alpaca-style prompt/completion: the last user turn is the instruction, everything before it the input."""
    *history, answer = messages
    user_at = max((i for i, m in enumerate(history) if m["role"] == "user"), default=None)
    if user_at is None or len(history) == 1:
        instruction, before = history[-1]["content"], history[:-1]
    else:
        instruction, before = history[user_at]["content"], history[:user_at] + history[user_at + 1:]
    names = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
    if len(before) == 1 and before[0]["role"] == "system":
        context = before[0]["content"]
    else:
        context = "\n".join(f"{names[m['role']]}: {m['content']}" for m in before if m["content"].strip())
    return default_prompt(instruction, context), answer["content"]


def _render_chat(messages: list[dict[str, str]], tokenizer: Any, index: int) -> tuple[str, str]:
    try:
        prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as exc:  # e.g. templates that refuse a system turn or non-alternating roles
        raise DataError(f"Row {index}: the tokenizer's chat template rejected the conversation "
                        f"({type(exc).__name__}: {exc}). Fix the row's roles or use a model without this "
                        "restriction.") from None
    if not full.startswith(prompt):  # the template renders the prompt differently alone: split where they differ
        common = 0
        while common < min(len(prompt), len(full)) and prompt[common] == full[common]:
            common += 1
        prompt = full[:common]
    return prompt, full[len(prompt):]


def _adds_bos(tokenizer: Any) -> bool:
    """Does encoding a string (as TRL does, with the default add_special_tokens) put BOS in front?"""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None:
        return False
    with_special = tokenizer("a")["input_ids"]
    without = tokenizer("a", add_special_tokens=False)["input_ids"]
    return len(with_special) > len(without) and with_special[0] == bos_id


def to_sft(dataset: Any, fmt: str, tokenizer: Any = None) -> Any:
    """Turn `dataset` (of format `fmt`) into string columns prompt + completion, or text for plain text.

    Rows with nothing to train on are dropped (len(result) < len(dataset) tells how many).
    """
    import datasets

    check_format(dataset, fmt)
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    eos = getattr(tokenizer, "eos_token", None) or ""
    # TRL tokenizes prompt strings with add_special_tokens on: a BOS rendered by the template would double it.
    bos = tokenizer.bos_token if tokenizer is not None and _adds_bos(tokenizer) else ""

    def finish(text: str) -> str:
        # Ending exactly on EOS makes TRL skip its own EOS, so the template's end-of-turn is not followed by a
        # second one (ChatML renders "<|im_end|>\n").
        if eos and text.rstrip().endswith(eos):
            return text.rstrip()
        return text + eos

    def strip_bos(text: str) -> str:
        return text[len(bos):] if bos and text.startswith(bos) else text

    columns = [c for c in dataset.column_names if c in FORMATS[fmt][0] + FORMATS[fmt][1]]
    data = {c: list(dataset[c]) for c in columns}  # column-wise reads are much faster than row dicts
    rows = (dict(zip(columns, values)) for values in zip(*data.values()))

    if fmt == "text":
        texts = [strip_bos(t) for t in (_text(r["text"]) for r in rows) if t.strip()]
        return datasets.Dataset.from_dict({"text": [finish(t) for t in texts]})

    verbatim = fmt == "prompt_completion" and not any(isinstance(p, list) for p in data["prompt"][:1])
    prompts, completions = [], []
    for index, row in enumerate(rows):
        if verbatim:  # already TRL's format: trained exactly as written
            prompt, completion = _text(row["prompt"]), _text(row["completion"])
            if not prompt.strip() or not completion.strip():
                continue
        elif fmt in ("dolly", "alpaca") and not template:  # keeps the Input section the conversation would merge
            instruction, context, completion = _fields(row, fmt)
            if not instruction or not completion.strip():
                continue
            prompt = default_prompt(instruction, context)
        else:
            messages = _conversation(row, fmt, index)
            if messages is None:
                continue
            prompt, completion = (_render_chat(messages, tokenizer, index) if template
                                  else _render_default(messages))
        prompts.append(strip_bos(prompt))
        completions.append(finish(completion))
    return datasets.Dataset.from_dict({"prompt": prompts, "completion": completions})


# --- entry points ----------------------------------------------------------------------------------------
def _prepare(cfg: TrainConfig, tokenizer: Any) -> tuple[Any, str, int]:
    raw = load_raw(cfg.dataset, cfg.dataset_split)
    fmt = detect_format(raw) if cfg.dataset_format == "auto" else cfg.dataset_format
    sft = to_sft(raw, fmt, tokenizer)
    if len(sft) == 0:
        need = " and ".join(("text",) if fmt == "text" else ("prompt", "completion"))
        raise DataError(f"Every one of the {len(raw)} rows of {cfg.dataset} ({fmt} format) has an empty {need}, "
                        "so there is nothing to train on. Check the file's contents and dataset_format.")
    return sft, fmt, len(raw) - len(sft)


def prepare_dataset(cfg: TrainConfig, tokenizer: Any) -> tuple[Any, str]:
    """The SFT-ready dataset for `cfg` and its format (detected when cfg.dataset_format is auto)."""
    sft, fmt, _ = _prepare(cfg, tokenizer)
    return sft, fmt


def token_lengths(sft: Any, tokenizer: Any) -> list[int]:
    """Token count of every row as TRL tokenizes it: tokenizer(prompt + completion) or tokenizer(text)."""
    texts = (sft["text"] if "text" in sft.column_names
             else [p + c for p, c in zip(sft["prompt"], sft["completion"])])
    texts = list(texts)
    lengths: list[int] = []
    for start in range(0, len(texts), 1000):  # batched: fast tokenizers encode a batch in parallel
        lengths += [len(ids) for ids in tokenizer(texts[start:start + 1000])["input_ids"]]
    return lengths


def length_stats(lengths: list[int]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(lengths)
    return {"min": int(a.min()), "median": float(np.median(a)), "p95": float(np.percentile(a, 95)),
            "max": int(a.max()), "mean": float(a.mean())}


def preview_dataset(cfg: TrainConfig, tokenizer: Any, n: int = 3) -> DataPreview:
    """What training will see: the format, the first `n` rows as trained on, and token-length statistics."""
    sft, fmt, dropped = _prepare(cfg, tokenizer)
    lengths = token_lengths(sft, tokenizer)
    return DataPreview(
        format=fmt, n_rows=len(sft), n_dropped=dropped, examples=list(sft.select(range(min(n, len(sft))))),
        token_lengths=lengths, max_length=cfg.max_length, n_over_max=sum(x > cfg.max_length for x in lengths),
        stats=length_stats(lengths),
    )
