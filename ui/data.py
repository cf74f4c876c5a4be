"""The data tab's handlers: the preview (core.data's plan of which rows train and how) and a file upload.

Like ui/handlers.py: the `Form` first, the language, the handler's own inputs, the field values last; updates keyed
by component. The preview's HTML is ui/render_preview.py's.
"""

from __future__ import annotations

import re
import shutil
from functools import lru_cache
from pathlib import Path

import gradio as gr

from core.config import TrainConfig
from core.i18n import DEFAULT_LANGUAGE, t
from ui import render
from ui.fields import collect
from ui.form import Form, Updates, apply_config, values_dict
from ui.render_preview import error_box, preview_html

DATA_TYPES = [".jsonl", ".json", ".csv", ".parquet", ".txt"]


def upload_dir() -> Path:
    from core.demo import cache_root

    return cache_root() / "uploads"


@lru_cache(maxsize=4)
def _tokenizer(model: str, trust_remote_code: bool):
    from core.model import load_tokenizer

    return load_tokenizer(TrainConfig(model=model, trust_remote_code=trust_remote_code))


def preview(cfg: TrainConfig, lang: str = DEFAULT_LANGUAGE) -> str:
    """The data plan (counts per outcome, histogram, rows as they train), or the engine's message in place.

    The file is read and checked first, without a tokenizer: an empty, non-UTF-8 or malformed file is reported
    as such even when the model's tokenizer cannot be loaded."""
    from core.data import DataError, check_data, plan_rows
    from core.model import ModelError

    try:
        raw, fmt = check_data(cfg)
    except DataError as exc:
        return error_box(t("preview.data_error", lang), str(exc))
    except Exception as exc:  # noqa: BLE001 - keep the page alive whatever the data holds
        return error_box(t("preview.read_error", lang), f"{type(exc).__name__}: {exc}")
    try:
        tokenizer = _tokenizer(cfg.model, cfg.trust_remote_code)
    except (ModelError, OSError, ValueError) as exc:
        return error_box(t("preview.tokenizer_error", lang), str(exc))
    try:
        from core.validation import split
        from ui.validation import split_note

        held = split(cfg, raw, fmt)  # as the engine does: held-out rows are not in the plan
        return split_note(held, lang) + preview_html(plan_rows(cfg, tokenizer, held.train, fmt, n_examples=3), lang)
    except DataError as exc:
        return error_box(t("preview.data_error", lang), str(exc))
    except Exception as exc:  # noqa: BLE001
        return error_box(t("preview.read_error", lang), f"{type(exc).__name__}: {exc}")


def on_preview(lang: str, *values) -> str:
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        return render.problems_html(problems, t("preview.cannot", lang))
    return preview(cfg, lang)


def store_upload(file_path: str) -> Path:
    src = Path(file_path)
    if src.suffix.lower() not in DATA_TYPES:
        raise ValueError(t("data.bad_type", "en", name=src.name, types=", ".join(DATA_TYPES)))
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", src.name).lstrip(".") or f"data{src.suffix}"
    dest = upload_dir() / safe
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return dest


def on_upload(form: Form, lang: str, file_path, *values) -> Updates:
    """Use an uploaded data file, or, when it is unusable, say why and keep the dataset that was selected."""
    if not file_path:
        return gr.skip()
    from core.data import DataError, check_data

    previous = values_dict(values).get("dataset") or ""

    def rejected(msg: str) -> Updates:
        kept = t("data.upload_kept", lang, dataset=previous)
        return {form.preview: error_box(t("data.upload_not_used", lang), f"{msg}\n\n{kept}")}

    if Path(file_path).suffix.lower() not in DATA_TYPES:
        return rejected(t("data.bad_type", lang, name=Path(file_path).name, types=", ".join(DATA_TYPES)))
    try:  # checked where Gradio put it, before it is copied over an earlier upload of the same name
        check_data(TrainConfig(dataset=str(file_path), dataset_split="train", dataset_format="auto"))
    except DataError as exc:
        return rejected(str(exc).replace(str(file_path), Path(file_path).name))
    try:
        dest = store_upload(file_path)
    except (OSError, ValueError) as exc:
        return rejected(str(exc))
    vals = values_dict(values)
    vals.update(dataset=str(dest), dataset_split="train", dataset_format="auto")
    cfg, problems = collect(vals)
    if cfg is None:
        return {form.preview: render.problems_html(problems, t("preview.cannot", lang))}
    return {**apply_config(form, cfg, lang), form.preview: preview(cfg, lang)}
