"""Reading training data files: local files (checked line by line first), folders, Hub datasets, split slicing.

datasets' own errors name neither the line nor the fix, so text files are scanned here first (UTF-8, JSON per
line) and every problem becomes a `DataError` that names the file, says what was wrong and what to do. None of
this needs a tokenizer: these checks run before the model is even resolved.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config.settings import DATA_SUFFIXES, DEMO_DATA, DEMO_DATASET
from core.messages import Keyed

# Local file suffix -> the datasets builder that reads it.
LOADERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
assert tuple(LOADERS) == DATA_SUFFIXES  # config validation refuses other suffixes before a run folder is made
# Suffixes that mark a data file even when it does not exist (so "data.tsv" is not mistaken for a Hub id).
ROW_SHAPE = '{"column": value, ...}'  # a message parameter: braces in a locale text would be placeholders
FILE_LIKE = set(LOADERS) | {".tsv", ".xlsx", ".xls", ".gz", ".zip", ".arrow", ".xml", ".yaml", ".yml", ".md"}
MIB = 2**20
# A CSV field of more characters is refused by name, with its size (the csv module's own default, 131,072, refused
# ordinary long documents; a JSON line has no such limit, and an upload is at most 64 MiB anyway).
CSV_FIELD_LIMIT = 64 * MIB


@dataclass(frozen=True)
class Limit:
    """How much a check may read and plan: `rows` the split selects, and `bytes` of data (a local file's size on
    disk, and a parquet file's size once decompressed, measured from its metadata and as it is decoded, never
    after). Past either, a DataError with both numbers and the fix (data.err.limit_rows, limit_file,
    limit_decoded)."""

    rows: int
    bytes: int


# What a preview or an upload check reads and plans at most (ui/data.py passes it; training is not bounded by it):
# planning is tokenizing: 20 MB of text planned in 2 s (1 KB rows) to 23 s (20 KB rows) on a shared 2-core machine.
PREVIEW_LIMIT = Limit(rows=50_000, bytes=32 * MIB)


class DataError(Keyed, ValueError):
    """A problem with the training data; the message says what was wrong and what to do.

    Raised with a locale key (`data.err.*`) and its parameters (core.messages.Keyed): str() is en.json's text.
    `row`: the 0-based index of the row at fault, when one is (messages call it row `row + 1`, as the preview
    does, and `row_line` turns it into the line of the file)."""

    def __init__(self, key: str, row: int | None = None, **params: Any) -> None:
        super().__init__(self._keyed(key, params))
        self.row = row


# The file line each data row starts on, for the local text files read so far (keyed by the resolved path):
# a row-level error names the line an editor shows. JSON documents (a list) have no line per row.
_ROW_LINES: dict[str, list[int]] = {}


def row_line(source: str | Path, row: int) -> int | None:
    """The file line (1-based) where row `row` (0-based) of the local file `source` starts, or None if unknown."""
    lines = _ROW_LINES.get(str(Path(source).expanduser().resolve()))
    return lines[row] if lines is not None and 0 <= row < len(lines) else None


def is_local(source: str) -> bool:
    """A path rather than a Hub id (org/name): it exists, ends like a data file, or is written like a path."""
    path = Path(source).expanduser()
    return (path.exists() or path.suffix.lower() in FILE_LIKE or source.startswith(("/", ".", "~"))
            or "\\" in source or source.count("/") > 1)


def load_raw(source: str, split: str = "train", limit: Limit | None = None) -> Any:
    """Load `source` (DEMO_DATASET, a local data file or folder, or a Hub dataset id) and select `split`.

    `split` accepts datasets' slicing syntax (train[:1000], train[10%:20%]) for Hub and local data alike.
    `limit` (a preview's, an upload check's: PREVIEW_LIMIT) bounds what is read and selected; None: no bound.
    """
    import datasets

    source, split = source.strip(), (split or "train").strip()
    if not source:
        raise DataError("data.err.no_dataset", types="/".join(LOADERS), demo=DEMO_DATASET)
    if source == DEMO_DATASET:
        return _load_file(DEMO_DATA, split, limit)
    from core.runs.public import dataset_problem

    if (why := dataset_problem(source)):  # public mode: a visitor's typed path is never read
        raise DataError("data.err.public", why=why)
    if is_local(source):
        path = Path(source).expanduser()
        if path.is_dir():  # a folder of data files, e.g. a git clone of a Hub dataset
            _scan_folder(path, limit)  # a bad file is named by its own path, not as "the folder failed"
            return _checked(lambda s: datasets.load_dataset(str(path), split=s), str(path), split, limit)
        return _load_file(path, split, limit)
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", source):
        raise DataError("data.err.not_a_source", source=repr(source))
    return _checked(lambda s: _load_hub(source, s), source, split, limit)


def _load_file(path: Path, split: str, limit: Limit | None = None) -> Any:
    import datasets

    if not path.is_file():
        raise DataError("data.err.no_file", path=path, cwd=Path.cwd())
    builder = LOADERS.get(path.suffix.lower())
    if builder is None:
        raise DataError("data.err.suffix" if path.suffix else "data.err.no_suffix", name=path.name, suffix=path.suffix,
                        accepted=", ".join(LOADERS))
    if limit is not None:
        _check_size(path, path.stat().st_size, limit, decoded=False)
    if builder != "parquet":
        scan_text_file(path)
    if builder == "csv":
        columns = read_csv(path)
        return _checked(lambda s: _sliced(datasets.Dataset.from_dict(columns), s), str(path), split, limit)
    if builder == "parquet" and limit is not None:  # decoded here, within the limit, never whole first
        table = read_parquet(path, split, limit)
        return _checked(lambda s: _sliced(datasets.Dataset(table), s), str(path), split, limit)
    return _checked(lambda s: datasets.load_dataset(builder, data_files=str(path), split=s), str(path), split, limit)


def _scan_folder(folder: Path, limit: Limit | None = None) -> None:
    """Check every data file of a folder dataset the way a single file is checked, naming the bad one; with a
    `limit`, the folder's files together (parquet files by their metadata: rows and decompressed size)."""
    size, rows = 0, 0
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(folder).parts):
            suffix = path.suffix.lower()
            if suffix in (".jsonl", ".json", ".txt"):
                scan_text_file(path)
            elif suffix == ".csv":
                scan_text_file(path)
                read_csv(path)
            if limit is not None and suffix in LOADERS:
                meta = _parquet_meta(path) if suffix == ".parquet" else None
                size += _decompressed(meta) if meta is not None else path.stat().st_size
                rows += meta.num_rows if meta is not None else 0
                _check_size(folder, size, limit, decoded=True)
                if rows > limit.rows:
                    raise DataError("data.err.limit_rows", where=folder, rows=rows, split="train", max=limit.rows,
                                    example=f"train[:{limit.rows}]")


def _check_size(where: Path, size: int, limit: Limit, decoded: bool) -> None:
    """Refuse `size` bytes past the limit: a file's size on disk, or its data's once decompressed (`decoded`)."""
    if size > limit.bytes:
        raise DataError("data.err.limit_decoded" if decoded else "data.err.limit_file", where=where, size=_mib(size),
                        max=_mib(limit.bytes))


def _mib(size: int) -> str:
    return f"{size / MIB:,.1f} MiB"


def _parquet_meta(path: Path) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata
    except Exception as exc:  # noqa: BLE001 - not a parquet file, or a damaged one: said as unreadable
        raise DataError("data.err.unreadable", where=path, error=f"{type(exc).__name__}: {exc}") from None


def _decompressed(meta: Any) -> int:
    """A parquet file's column chunks' size once decompressed, as its metadata declares it (before decoding: a
    dictionary-encoded value counts once there however many rows repeat it)."""
    return sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))


def split_rows(split: str, total: int) -> tuple[int, int]:
    """(rows `split` selects, the row after the last one it reaches) of a local file of `total` rows; the whole
    file where the split is not one datasets' parser reads (the load then says why)."""
    import datasets

    try:
        parts = datasets.ReadInstruction.from_spec(split).to_absolute({"train": total})
    except (ValueError, AssertionError, KeyError):
        return total, total
    return sum(p.to - p.from_ for p in parts), max((p.to for p in parts), default=0)


def read_parquet(path: Path, split: str, limit: Limit) -> Any:
    """A parquet file read as an Arrow table within `limit`: its rows counted from the metadata before any is read,
    its declared decompressed size checked, then the rows `split` reaches decoded in batches whose decoded size is
    counted as they come. A batch is never larger than the budget left: a row group's declared size bounds any one
    value in it, so a batch holds at most budget / that size rows (one value repeated by a dictionary costs its full
    size in every row once decoded: 24 KB of zstd can decode to GiBs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = _parquet_meta(path)
    selected, end = split_rows(split, meta.num_rows)
    if selected > limit.rows:
        raise DataError("data.err.limit_rows", where=path, rows=selected, split=split, max=limit.rows,
                        example=f"{_split_name(split)}[:{limit.rows}]")
    _check_size(path, _decompressed(meta), limit, decoded=True)
    reader = pq.ParquetFile(path)
    batches, size, rows = [], 0, 0
    for group in range(meta.num_row_groups):
        if rows >= end:
            break
        widest = max(1, meta.row_group(group).total_byte_size)
        step = int(max(1, min(4096, (limit.bytes - size) // widest)))
        for batch in reader.iter_batches(batch_size=step, row_groups=[group]):
            batch = batch.slice(0, end - rows)
            size, rows = size + batch.nbytes, rows + batch.num_rows
            _check_size(path, size, limit, decoded=True)
            batches.append(batch)
            if rows >= end:
                break
    return pa.Table.from_batches(batches, schema=reader.schema_arrow)


def read_csv(path: Path) -> dict[str, list[str]]:
    """A CSV file read exactly, with Python's csv module: every field is text as written ("None", "NaN", "N/A",
    "null" are words, "007" stays "007"); only an empty field is empty. Refused (DataError naming the file line):
    a row with more or fewer fields than the header (an unquoted comma), a missing or duplicate column name.
    pandas (datasets' CSV reader) would read a first row with one field too many as an index column, shifting
    every column, and turn those words into missing values."""
    import csv

    columns: dict[str, list[str]] = {}
    starts: list[int] = []
    csv.field_size_limit(CSV_FIELD_LIMIT)  # process-wide (the csv module has no per-reader limit)
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh, strict=True)
        end = 0  # the line the previous record ended on: a record starts on the next one
        try:
            header = next(reader, None)
            while header is not None and not header:  # blank lines before the header
                end, header = reader.line_num, next(reader, None)
            if header is None:
                raise DataError("data.err.csv_no_header", path=path)
            header_line, end = end + 1, reader.line_num
            names = [h.strip() for h in header]
            for i, name in enumerate(names):
                if not name:
                    raise DataError("data.err.csv_empty_name", path=path, line=header_line, column=i + 1)
                if names.index(name) != i:
                    raise DataError("data.err.csv_twice", path=path, name=repr(name), line=header_line)
            columns = {name: [] for name in names}
            for record in reader:
                start, end = end + 1, reader.line_num
                if not record:
                    continue  # a blank line
                if len(record) != len(names):
                    more = len(record) > len(names)
                    raise DataError("data.err.csv_more" if more else "data.err.csv_fewer", row=len(starts), path=path,
                                    line=start, n=len(record), header_line=header_line, expected=len(names),
                                    names=", ".join(names))
                starts.append(start)
                for name, value in zip(names, record):
                    columns[name].append(value)
        except csv.Error as exc:
            if "field larger than field limit" in str(exc):
                raise DataError("data.err.csv_field_large", path=path, line=end + 1, max=CSV_FIELD_LIMIT,
                                size=_longest_field(path, end + 1)) from None
            raise DataError("data.err.csv_unreadable", path=path, line=reader.line_num, error=exc) from None
    if not starts:
        raise DataError("data.err.csv_no_rows", path=path)
    _ROW_LINES[str(path.resolve())] = starts
    return columns


_CSV_FIELD = re.compile(r'"((?:[^"]|"")*)"|([^,\r\n"]*)')


def _longest_field(path: Path, line: int) -> int:
    """The longest field (in characters, a doubled quote counted once, as the csv module counts) of the CSV record
    that starts on `line`: the size of the field the csv module refused."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        for _ in range(line - 1):
            fh.readline()
        text = fh.read()
    longest, at = 0, 0
    while at < len(text):
        m = _CSV_FIELD.match(text, at)
        longest = max(longest, len(m.group(1).replace('""', '"')) if m.group(1) is not None else len(m.group(2)))
        at = m.end()
        if at >= len(text) or text[at] != ",":
            break
        at += 1
    return longest


def _sliced(ds: Any, split: str) -> Any:
    """`split` (train, train[:100], train[10%:20%]+train[:5]) applied to a dataset read as one train split,
    with datasets' own parser, so its errors read as they do for any other file."""
    import datasets

    parts = datasets.ReadInstruction.from_spec(split).to_absolute({"train": len(ds)})
    picked = [i for part in parts for i in range(part.from_, part.to)]
    return ds.select(picked) if picked != list(range(len(ds))) else ds


def _load_hub(source: str, split: str) -> Any:
    import datasets

    try:
        return datasets.load_dataset(source, split=split)
    except ValueError:
        raise  # split problems: translated by _checked
    except Exception as exc:
        if _is_offline_error(exc):
            raise DataError("data.err.hub_offline", source=source, error=type(exc).__name__) from None
        if type(exc).__name__ in ("DatasetNotFoundError", "RepositoryNotFoundError", "GatedRepoError"):
            raise DataError("data.err.hub_missing", source=source, error=exc) from None
        raise DataError("data.err.hub_failed", source=source, error=f"{type(exc).__name__}: {exc}") from None


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


def _checked(load, where: str, split: str, limit: Limit | None = None) -> Any:
    """Run `load(split)`, translating datasets' split errors, and refuse an empty result (and, with a `limit`, one
    of more rows than it allows)."""
    try:
        ds = load(split)
    except DataError:
        raise
    except ValueError as exc:
        msg = str(exc)
        if msg.startswith("Unknown split"):
            found = re.search(r"one of (\[.*\])", msg)
            raise DataError("data.err.no_split", where=where, split=repr(_split_name(split)),
                            splits=found.group(1) if found else "(unknown)") from None
        if msg.startswith("Unrecognized instruction format") or "Unrecognized split format" in msg:
            raise DataError("data.err.split_syntax", split=repr(split), where=where) from None
        if "corresponds to no data" in msg:
            ds = None
        else:
            raise DataError("data.err.unreadable", where=where, error=msg) from None
    except Exception as exc:
        raise DataError("data.err.unreadable", where=where, error=f"{type(exc).__name__}: {exc}") from None
    if ds is None or len(ds) == 0:
        raise _empty_error(load, where, split)
    if limit is not None and len(ds) > limit.rows:
        raise DataError("data.err.limit_rows", where=where, rows=len(ds), split=split, max=limit.rows,
                        example=f"{_split_name(split)}[:{limit.rows}]")
    return ds


def _split_name(split: str) -> str:
    return re.split(r"[\[+]", split, maxsplit=1)[0].strip()


def _empty_error(load, where: str, split: str) -> DataError:
    name = _split_name(split)
    if name != split:  # a slice: say how many rows the whole split has
        try:
            total = len(load(name))
        except Exception:
            total = 0
        if total:
            return DataError("data.err.slice_empty", split=repr(split), name=name, where=where, total=total,
                             example=f"{name}[:{min(total, 1000)}]")
    return DataError("data.err.split_empty", where=where, name=repr(name))


def scan_text_file(path: Path) -> None:
    """Check a text data file is UTF-8 (and, for .jsonl/.json, valid JSON) before datasets reads it.

    datasets' own errors here name neither the line nor the fix, so we find the first bad line ourselves.
    """
    jsonl = path.suffix.lower() == ".jsonl"
    offset, n_data, lines = 0, 0, []
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if number == 1 and looks_utf16(raw):
                raise DataError("data.err.utf16", path=path,
                                command=f"iconv -f utf-16 -t utf-8 {path.name} > fixed{path.suffix}")
            if b"\x00" in raw:  # valid UTF-8, but never in text: a binary or damaged file
                at = raw.index(b"\x00")
                raise DataError("data.err.nul_byte", path=path, line=number, column=at + 1, offset=offset + at)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:  # a line ends at b"\n", which never occurs inside a UTF-8 character
                raise DataError("data.err.not_utf8", path=path, byte=f"0x{raw[exc.start]:02x}",
                                offset=offset + exc.start, line=number,
                                command=f"iconv -f latin1 -t utf-8 {path.name} > fixed{path.suffix}") from None
            offset += len(raw)
            if number == 1:
                line = line.removeprefix("\ufeff")  # a UTF-8 byte-order mark is harmless
            if not line.strip():
                continue
            n_data += 1
            lines.append(number)
            if jsonl:
                _check_json_line(path, number, line)
    if jsonl or path.suffix.lower() == ".txt":  # one row per non-blank line (datasets skips blank ones too)
        _ROW_LINES[str(path.resolve())] = lines
    if n_data == 0:
        raise DataError("data.err.empty_file", path=path)
    if path.suffix.lower() == ".json":
        _check_json_document(path)


def looks_utf16(raw: bytes) -> bool:
    """UTF-16 (Windows' "Unicode"): a byte-order mark, or a NUL beside nearly every byte of the first line's start
    (ASCII text in UTF-16 is a letter and a NUL, in turn). A NUL elsewhere is a damaged or binary file instead."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True
    head = raw[:256].rstrip(b"\r\n")
    if len(head) < 4:
        return False
    return any(half.count(0) >= 0.8 * len(half) for half in (head[0::2], head[1::2]))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: a key given twice in one object is an error (json keeps the last silently;
    datasets' reader fails with "DatasetGenerationError")."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _KeyTwice(key)
        seen[key] = value
    return seen


class _KeyTwice(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _parse(path: Path, text: str, line: int | None) -> Any:
    """json.loads, with a key given twice and a nesting too deep for Python each said as a DataError naming the file
    (and line); a syntax error is left to the caller (JSONDecodeError)."""
    where = {"path": path, "line": line if line is not None else "?"}
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _KeyTwice as exc:
        raise DataError("data.err.json_key_twice", name=repr(exc.key), **where) from None
    except RecursionError:
        raise DataError("data.err.json_too_deep", shape=ROW_SHAPE, **where) from None


def _check_json_line(path: Path, number: int, line: str) -> None:
    try:
        value = _parse(path, line, number)
    except json.JSONDecodeError as exc:
        what = exc.msg.removesuffix(" at").removesuffix(" starting")  # "Invalid control character at" reads oddly
        raise DataError("data.err.json_line", path=path, line=number, what=what, column=exc.colno,
                        hint=_json_hint(line, exc.colno - 1)) from None
    if not isinstance(value, dict):
        raise DataError("data.err.json_line_not_object", path=path, line=number, type=type(value).__name__,
                        shape=ROW_SHAPE)


def _json_hint(line: str, at: int, width: int = 40) -> dict[str, Any]:
    """The text around offset `at` of the line (marked), and whether the line ends inside a string: a message
    (a parameter of the JSON error's message)."""
    line = line.rstrip("\r\n")
    at = min(at, len(line))
    before, after = line[max(0, at - width):at], line[at:at + width]
    excerpt = ("..." if at > width else "") + before + ">>>" + after + ("..." if at + width < len(line) else "")
    return {"key": "data.err.json_hint_open" if _ends_inside_string(line) else "data.err.json_hint",
            "params": {"excerpt": repr(excerpt)}}


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
        value = _parse(path, text, None)
    except json.JSONDecodeError as exc:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) > 1 and all(ln.lstrip().startswith("{") for ln in lines):  # JSON Lines
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    _check_json_line(path, number, line)
            return
        all_lines = text.splitlines()
        if exc.lineno > len(all_lines):  # the text ended early: no line to quote
            raise DataError("data.err.json_document_end", path=path, line=exc.lineno, column=exc.colno,
                            what=exc.msg) from None
        raise DataError("data.err.json_document", path=path, line=exc.lineno, column=exc.colno, what=exc.msg,
                        hint=_json_hint(all_lines[exc.lineno - 1], exc.colno - 1)) from None
    if isinstance(value, dict) and value and all(
            isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v) for v in value.values()):
        # {"prompt": [...], "completion": [...]}: datasets reads it as ONE row whose cells are lists
        raise DataError("data.err.json_columns", path=path, columns=", ".join(map(repr, list(value)[:4])),
                        rows='[{"prompt": ..., "completion": ...}, ...]')
    if not isinstance(value, (list, dict)):
        raise DataError("data.err.json_scalar", path=path, type=type(value).__name__, shape=ROW_SHAPE)
    if isinstance(value, list) and not all(isinstance(v, dict) for v in value):
        raise DataError("data.err.json_list_items", path=path, shape=ROW_SHAPE)
    if isinstance(value, list) and not value:
        raise DataError("data.err.json_empty_list", path=path)

