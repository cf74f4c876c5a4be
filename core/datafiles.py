"""Reading training data files: local files (checked line by line first), folders, Hub datasets, split slicing.

datasets' own errors name neither the line nor the fix, so text files are scanned here first (UTF-8, JSON per
line) and every problem becomes a `DataError` that names the file, says what was wrong and what to do. None of
this needs a tokenizer: these checks run before the model is even resolved.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from core.config import DEMO_DATA, DEMO_DATASET

# Local file suffix -> the datasets builder that reads it.
LOADERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
# Suffixes that mark a data file even when it does not exist (so "data.tsv" is not mistaken for a Hub id).
FILE_LIKE = set(LOADERS) | {".tsv", ".xlsx", ".xls", ".gz", ".zip", ".arrow", ".xml", ".yaml", ".yml", ".md"}


class DataError(ValueError):
    """A problem with the training data; the message says what was wrong and what to do."""




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
            raise DataError(f"dataset_split {split!r} (for {where}) is not valid split syntax. Write e.g. train, "
                            "train[:1000], train[100:200] or train[:10%].") from None
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
        what = exc.msg.removesuffix(" at").removesuffix(" starting")  # "Invalid control character at" reads oddly
        hint = _json_hint(line, exc.colno - 1)
        raise DataError(f"{path}: line {number} is not valid JSON ({what} at column {exc.colno}){hint}"
                        ". Each line of a .jsonl file must be one JSON object; fix or delete that line.") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: line {number} is a JSON {type(value).__name__}, not an object "
                        '({"column": value, ...}). Each line of a .jsonl file must be one JSON object.')


def _json_hint(line: str, at: int, width: int = 40) -> str:
    """The text around offset `at` of the line (marked), and whether the line ends inside a string."""
    line = line.rstrip("\r\n")
    at = min(at, len(line))
    before, after = line[max(0, at - width):at], line[at:at + width]
    excerpt = ("..." if at > width else "") + before + ">>>" + after + ("..." if at + width < len(line) else "")
    hint = f" (>>> marks it): {excerpt!r}"
    if _ends_inside_string(line):
        hint += (f" -- the line ends inside a string (a quote opened on it is never closed): the row was cut off, "
                 f"or its text holds a raw line break, which JSON writes as \\n")
    return hint


def _ends_inside_string(line: str) -> bool:
    inside = escaped = False
    for ch in line:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = inside
        elif ch == '"':
            inside = not inside
    return inside


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
        all_lines = text.splitlines()
        hint = _json_hint(all_lines[exc.lineno - 1], exc.colno - 1) if exc.lineno <= len(all_lines) else ""
        raise DataError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg}){hint}. Fix the "
                        "file: it must hold a list of objects, or one JSON object per line.") from None
    if isinstance(value, list) and not all(isinstance(v, dict) for v in value):
        raise DataError(f"{path} holds a JSON list whose items are not all objects. Each item must be one row "
                        '({"column": value, ...}).')
    if isinstance(value, list) and not value:
        raise DataError(f"{path} is an empty JSON list. Add rows to it or pick another file.")

