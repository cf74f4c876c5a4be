"""The data tab's handlers: the preview (core.data.plan's plan of which rows train and how) and a file upload.

Like ui/handlers.py: the `Form` first, the language, the handler's own inputs, the field values last; updates keyed
by component. The preview's HTML is ui/render_preview.py's.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import gradio as gr

from core.config.settings import TrainConfig
from core.config.slices import DataSlice, ModelSlice
from core.files import target
from core.i18n import DEFAULT_LANGUAGE, t
from core.messages import said_again, words_of
from core.runs.public import (client_address, disk_used, is_public, limits, set_address_source, set_visitor_source,
                               shown, upload_root, visitor)
from ui import render
from ui.fields import collect
from ui.form import Form, Updates, apply_config, marked, values_dict
from ui.render_preview import error_box, images_html, preview_html
from ui.visitors import request_visitor

DATA_TYPES = [".jsonl", ".json", ".csv", ".parquet", ".txt"]
POLL_S = 0.1  # how often a waiting preview looks for its child's progress


class _Rows(ModelSlice, DataSlice, Protocol):
    """The data and the model that tokenizes it: what the measured longest row is kept under."""


def _session() -> str | None:
    """The visitor of the page request being answered (the id in its signed cookie, ui/visitors.py; "" for a request
    without one), or None outside a request. Gradio sets LocalContext.request around every event handler it runs."""
    from gradio.context import LocalContext

    return request_visitor(LocalContext.request.get(None))


def request_address(request: Any) -> str | None:
    """The network address a Gradio request came from (core.runs.public.client_address: behind a proxy, the client it
    names). A queued event's request is Gradio's copy of the join request: its client and headers, as dicts."""
    if request is None:
        return None
    client, headers = getattr(request, "client", None), getattr(request, "headers", None) or {}
    return client_address(getattr(client, "host", None), headers.get("x-forwarded-for"))


def _address() -> str | None:
    from gradio.context import LocalContext

    return request_address(LocalContext.request.get(None))


set_visitor_source(_session)  # public mode: each visitor's uploads and runs in a folder of their own
set_address_source(_address)  # public mode: the queue's limit per address


def upload_dir() -> Path:
    """memtune's upload folder (public mode: the visitor's own, core.runs.public.upload_root), resolved once."""
    return target(upload_root(), "keep uploads in")


def preview(settings: dict[str, Any], lang: str = DEFAULT_LANGUAGE, progress: Any = None, actions: Any = None) -> str:
    """The data plan (counts per outcome, histogram, rows as they train), or the engine's message in place: what
    core.jobs.preview answers for `settings` (a config's to_dict), rendered here. `actions` (core.jobs.actions.Actions:
    the app's) works it out in a child, as the page's visitor, so the web server never loads a tokenizer; None: in
    this process (a caller without an app). What it reads and plans is bounded (PREVIEW_LIMIT): a preview never holds
    its queue for long.
    `progress`: a gr.Progress (the preview's bar: what it reads, then how much of the tokenizing is done), or None."""
    said = progress if progress is not None else (lambda *a, **k: None)
    if actions is None:
        from core.jobs.preview import answer
        from core.data.read import PREVIEW_LIMIT

        found = answer(settings, PREVIEW_LIMIT, lambda words, f: said(f, desc=text_of(words_of(words), lang)))
    else:
        found = child_preview(actions, settings, lang, said)
    return preview_from(found, TrainConfig.from_dict(settings), lang)


def child_preview(actions: Any, settings: dict[str, Any], lang: str, said: Any) -> dict[str, Any]:
    """core.jobs.preview's answer from a preview child (its phase events on the bar as they come), or
    {"error": "read", "words": why it ended without one (keyed: action.died...)}."""
    action = actions.preview(settings, owner=visitor())
    seen = 0
    while True:
        over = action.wait(POLL_S)
        events = action.events_since(seen)
        seen += len(events)
        for e in events:
            if e.get("kind") == "phase" and e.get("phase") == "previewing":
                said(e.get("progress") or 0, desc=text_of(e, lang))
        if over:
            break
    done = action.result() or {}
    if done.get("status") == "completed" and isinstance(done.get("preview"), dict):
        return done["preview"]
    error = next((e for e in reversed(action.events_since(0)) if e.get("kind") == "error"), done)
    return {"error": "read", "words": {k: error[k] for k in ("key", "params", "problems", "message") if k in error}}


def text_of(words: dict[str, Any], lang: str) -> str:
    """A text of the preview's answer (its words: core.messages.words_of, or an error's fields) in the page's language:
    a ConfigError's problems as the form says them, a keyed text by its key, else as the engine wrote it."""
    if words.get("problems"):
        return "; ".join(problem_line(p, lang) for p in words["problems"])
    if words.get("key"):
        return render.log_text(said_again(words["key"], words.get("params") or {}), lang)
    return str(words.get("message", ""))


def problem_line(p: dict[str, Any], lang: str) -> str:
    """A problem recorded as fields_of writes it ({"field", "key", "params"}) on one line, as the form says one
    (render.problem_text): "field: message -> fix" by its key in the page's language."""
    return render.problem_text(p.get("field", ""), p["key"], p.get("params") or {}, lang)


TITLES = {"data": "preview.data_error", "read": "preview.read_error", "tokenizer": "preview.tokenizer_error"}


def preview_from(found: dict[str, Any], cfg: _Rows, lang: str) -> str:
    """The preview's HTML from core.jobs.preview's answer; the longest row it measured is kept for the estimates."""
    from core.data.plan import DataPlan, remember_longest
    from ui.validation import sample_tag, split_note

    if "error" in found:
        return error_box(t(TITLES.get(found["error"], "preview.read_error"), lang), text_of(found["words"], lang))
    if found["stage"] == "images":
        remember_longest(cfg, found["longest"])
        refusal = found["plan"].get("refusal")
        held = found.get("heldout") or {}
        note = split_note(SimpleNamespace(mode="separate", source=held["source"], train_ids=(),
                                          val_ids=range(held["n"])), lang) if held.get("n") else ""
        return note + images_html(found, [text_of(w, lang) for w in found["notes"]],
                                  text_of(refusal, lang) if refusal else "", lang)
    part = found["split"]
    held = SimpleNamespace(mode=part["mode"], source=part["source"], train_ids=range(part["train"]),
                           val_ids=range(part["val"]))
    if found["stage"] != "sft":
        lines = "".join(f"<div>{render.E(text_of(w, lang))}</div>" for w in found["lines"])
        return split_note(held, lang) + f'<div class="mt-note mt-small" id="preview-pairs">{lines}</div>'
    remember_longest(cfg, found["longest"])
    p = found["plan"]
    examples = [{**ex, **({"note": text_of(ex["note"], lang)} if ex.get("note") else {})} for ex in p["examples"]]
    plan = DataPlan(**{**p, "examples": examples}, rows=[], notes=[text_of(w, lang) for w in found["notes"]])
    return split_note(held, lang) + preview_html(plan, lang) + sample_tag(found.get("heldout"))


def on_preview(lang: str, *values, progress: Any = None, actions: Any = None) -> str:
    cfg, problems = collect(values_dict(values))
    if cfg is None:  # tagged too: the form's step after a Preview shows only what describes the form on screen
        return marked(render.problems_html(problems, t("preview.cannot", lang), lang), values, lang)
    # public mode: the engine's messages name the visitor's `uploads/x`
    return marked(shown(preview(cfg.to_dict(), lang, progress, actions)), cfg, lang)


def make_preview(lang: str, progress=gr.Progress(), *values, actions: Any = None) -> str:  # noqa: B008 - the bar
    """The Preview button's first step: on_preview (in a child of `actions`, the app's: app_actions), with its
    progress on the preview's bar (Gradio puts its gr.Progress where the default stands, before the field values)."""
    return on_preview(lang, *values, progress=progress, actions=actions)


def app_actions(form: Form) -> Any:
    """The app's model-running children (core.jobs.actions.Actions), where the page has an app."""
    return getattr(getattr(form.app, "manager", None), "actions", None)


def upload_name(file_path: str | Path) -> str:
    src = Path(file_path)
    return re.sub(r"[^A-Za-z0-9._-]", "_", src.name).lstrip(".") or f"data{src.suffix}"


def incoming_copy(file_path: str | Path) -> Path:
    """A copy of Gradio's temporary file in the upload folder under a hidden name: checked there (in public mode
    only that folder may be read), renamed over an earlier upload of the same name only once it is good."""
    src = Path(file_path)
    if src.suffix.lower() not in DATA_TYPES:
        raise ValueError(t("data.bad_type", "en", name=src.name, types=", ".join(DATA_TYPES)))
    folder = upload_dir()
    folder.mkdir(parents=True, exist_ok=True)
    incoming = folder / f".incoming-{upload_name(src)}"
    shutil.copyfile(src, incoming)
    return incoming


def over_budget(size: int, replaced: int = 0) -> tuple[float, float] | None:
    """Public mode, a visitor: (GiB their runs and uploads would then take, the limit) when `size` bytes more, less
    `replaced` bytes of an earlier upload of the same name, take them past MEMTUNE_SPACE_DISK_GIB; None otherwise."""
    limit = limits().disk_gib
    if not (is_public() and visitor() and limit):
        return None
    total = disk_used() - replaced + size
    return (total / 2**30, limit) if total > limit * 2**30 else None


def drop_gradio_copy(file_path: str | Path) -> None:
    """Remove Gradio's temporary copy of an upload (and its folder, when empty) once memtune has stored its own or
    refused it: the visitor's file is then kept once, in their own folder, within their disk budget. Only a file in
    Gradio's upload folder is touched."""
    from gradio.utils import get_upload_folder

    base = Path(get_upload_folder()).resolve()
    try:
        path = Path(file_path).resolve()
        if base not in path.parents or not path.is_file():
            return
        path.unlink()
        if path.parent != base:
            path.parent.rmdir()  # OSError when something else is in it: left alone
    except OSError:
        return


# An upload is four steps (ui/layout.py: wire_form): the file copied and read in the preview's queue (a large file takes
# a while: no page's edits wait behind it), the form told in the form's queue, then its preview made and shown as a
# Preview click's is.
def on_upload(lang: str, file_path, *values) -> dict[str, str] | None:
    """Check an uploaded data file into the upload folder. What arrived, for the form's step (on_uploaded):
    {"dataset": the file as the page names it} or {"refused": why, saying that the selected dataset stays}."""
    if not file_path:
        return None
    try:
        return _checked_upload(lang, file_path, values)
    finally:
        drop_gradio_copy(file_path)


def _checked_upload(lang: str, file_path: str, values: tuple) -> dict[str, str]:
    from core.data.read import PREVIEW_LIMIT, DataError
    from core.data.upload import check_upload

    previous = values_dict(values).get("dataset") or ""

    def rejected(msg: str) -> dict[str, str]:
        kept = t("data.upload_kept", lang, dataset=previous)
        return {"refused": error_box(t("data.upload_not_used", lang), f"{msg}\n\n{kept}")}

    if Path(file_path).suffix.lower() not in DATA_TYPES:
        return rejected(t("data.bad_type", lang, name=Path(file_path).name, types=", ".join(DATA_TYPES)))
    try:
        size = Path(file_path).stat().st_size
        earlier = upload_dir() / upload_name(file_path)
        replaced = earlier.stat().st_size if earlier.is_file() else 0
    except OSError as exc:
        return rejected(str(exc))

    def too_big(over: tuple[float, float]) -> dict[str, str]:
        return rejected(t("data.upload_disk", lang, name=Path(file_path).name, size=f"{size / 2**20:.1f}",
                          total=f"{over[0]:.2f}", limit=f"{over[1]:g}"))

    if over := over_budget(size, replaced):  # refused before a byte is copied
        return too_big(over)
    try:
        incoming = incoming_copy(file_path)
    except (OSError, ValueError) as exc:
        return rejected(str(exc))
    if over := over_budget(0, replaced):  # counted again with the copy in place: two uploads at once
        incoming.unlink(missing_ok=True)
        return too_big(over)
    try:  # checked under a hidden name, before it replaces an earlier upload of the same name (public mode: within
        # the preview's bound, so a stranger's file of a million rows is refused here, not planned by the preview)
        check_upload(incoming, PREVIEW_LIMIT if is_public() else None)  # by its columns: SFT rows, pairs or KTO's
    except DataError as exc:
        incoming.unlink(missing_ok=True)
        return rejected(render.error_text(exc, lang).replace(str(incoming), Path(file_path).name))
    try:
        dest = Path(shutil.move(incoming, incoming.with_name(upload_name(file_path))))
    except OSError as exc:
        incoming.unlink(missing_ok=True)
        return rejected(str(exc))
    return {"dataset": shown(str(dest))}


def on_uploaded(form: Form, lang: str, arrived: dict[str, str] | None, *values) -> Updates:
    """The form's step: the uploaded file becomes the dataset (whole, its format detected) and the old preview goes;
    a refused upload leaves every field as it was and says why in the preview's place."""
    if not arrived:
        return gr.skip()
    if "refused" in arrived:
        return {form.preview: arrived["refused"]}
    vals = values_dict(values)
    vals.update(dataset=arrived["dataset"], dataset_split="train", dataset_format="auto")
    cfg, problems = collect(vals)
    if cfg is None:
        return {form.preview: render.problems_html(problems, t("preview.cannot", lang), lang)}
    return {**apply_config(form, cfg, lang), form.preview: ""}


def preview_upload(lang: str, arrived: dict[str, str] | None, progress=gr.Progress(), *values,  # noqa: B008
                   actions: Any = None) -> str:
    """The preview of the form as the upload left it (make_preview); none after a refusal, whose notice stays."""
    if not (arrived and "dataset" in arrived):
        return ""
    return on_preview(lang, *values, progress=progress, actions=actions)
