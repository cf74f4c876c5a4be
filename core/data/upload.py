"""What an uploaded data file must be before it is kept: readable within a preview's limit, and rows some stage
trains on. The page's stage may change after the upload, so the file's own columns decide how it is checked:
preference pairs or KTO's rows as core.data.pairs checks them, anything else as SFT's formats (core.data.plan)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.data.formats import check_format, detect_format
from core.data.pairs import check_rows, pair_format
from core.data.plan import Naming
from core.data.read import PREVIEW_LIMIT, DataError, Limit, load_raw


def check_upload(path: str | Path, limit: Limit | None = PREVIEW_LIMIT) -> tuple[Any, str]:
    """(rows, format) of the data file at `path`, read within `limit` (rows and bytes: PREVIEW_LIMIT by default),
    or DataError naming the file, the row and the fix: "pairs", "implicit_pairs" or "unpaired" for preference data
    (every cell checked by type, KTO's labels too), else the SFT format its columns fit."""
    raw = load_raw(str(path), "train", limit)
    fmt = pair_format(raw.column_names)
    if fmt is not None:
        if len(raw) == 0:
            raise DataError("data.err.pair_empty", where=f"{path} [train]")
        return check_rows(raw, fmt, str(path)), fmt
    with Naming(str(path)):
        fmt = detect_format(raw)
        check_format(raw, fmt)
    return raw, fmt
