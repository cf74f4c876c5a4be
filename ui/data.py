"""The data tab's handlers: the preview (core.data.plan's plan of which rows train and how) and a file upload.

Like ui/handlers.py: the `Form` first, the language, the handler's own inputs, the field values last; updates keyed
by component. The preview's HTML is ui/render_preview.py's.
"""

from __future__ import annotations

import re
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

import gradio as gr

from core.config.settings import Problem, TrainConfig
from core.files import target
from core.i18n import DEFAULT_LANGUAGE, t
from core.messages import Said
from core.runs.public import (client_address, disk_used, is_public, limits, set_address_source, set_visitor_source,
                               shown, upload_root, visitor)
from ui import render
from ui.fields import collect
from ui.form import Form, Updates, apply_config, marked, values_dict
from ui.render_preview import error_box, preview_html
from ui.visitors import request_visitor

DATA_TYPES = [".jsonl", ".json", ".csv", ".parquet", ".txt"]


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


@lru_cache(maxsize=4)
def _tokenizer(model: str, trust_remote_code: bool):
    from core.model.load import load_tokenizer

    return load_tokenizer(TrainConfig(model=model, trust_remote_code=trust_remote_code))


def preview(cfg: TrainConfig, lang: str = DEFAULT_LANGUAGE, progress: Any = None) -> str:
    """The data plan (counts per outcome, histogram, rows as they train), or the engine's message in place.

    The file is read and checked first, without a tokenizer: an empty, non-UTF-8 or malformed file is reported
    as such even when the model's tokenizer cannot be loaded. What it reads and plans is bounded (PREVIEW_LIMIT:
    rows and bytes, refused by name past them, with the slice that fits): a preview never holds its queue for long.
    `progress`: a gr.Progress (the preview's bar: what it reads, then how much of the tokenizing is done), or None."""
    from core.data.plan import DataError, check_data, plan_rows
    from core.data.read import PREVIEW_LIMIT
    from core.model.load import ModelError

    if cfg.stage != "sft":  # a preference stage's pairs, as the run plans them (its held-out pairs apart)
        return pairs_preview(cfg, lang)
    said = progress if progress is not None else (lambda *a, **k: None)
    try:
        said(0, desc=t("preview.reading", lang))  # (None would hide the words: Gradio shows a bare spinner)
        raw, fmt = check_data(cfg, PREVIEW_LIMIT)
    except DataError as exc:
        return error_box(t("preview.data_error", lang), render.error_text(exc, lang))
    except Exception as exc:  # noqa: BLE001 - keep the page alive whatever the data holds
        return error_box(t("preview.read_error", lang), f"{type(exc).__name__}: {exc}")
    try:
        tokenizer = _tokenizer(cfg.model, cfg.trust_remote_code)
    except (ModelError, OSError, ValueError) as exc:
        return error_box(t("preview.tokenizer_error", lang), render.error_text(exc, lang))
    try:
        from core.data.validation import split
        from ui.validation import split_note

        held = split(cfg, raw, fmt, limit=PREVIEW_LIMIT)  # as the engine does: held-out rows are not in the plan
        # the run's own changes for this model (unpacked rows...) first, from its meta-device tree, built once here
        cfg, model_lines, tree = _model_lines(cfg, lang)
        words = t("preview.tokenizing", lang)
        plan = plan_rows(cfg, tokenizer, held.train, fmt, n_examples=3,
                         progress=lambda fraction: said(fraction, desc=words))
        plan.notes = [render.log_text(n, lang) for n in plan.notes]  # the plan's notes are the run log's lines
        if plan.multi_turn:  # every assistant turn accounted for (core/data/plan.py)
            plan.notes.append(t("preview.turns", lang, n=sum(plan.turns.values()), **plan.turns))
        plan.notes.append(_lora_line(cfg, lang, tree))
        plan.notes += model_lines
        return split_note(held, lang) + preview_html(plan, lang)
    except DataError as exc:
        return error_box(t("preview.data_error", lang), render.error_text(exc, lang))
    except Exception as exc:  # noqa: BLE001
        return error_box(t("preview.read_error", lang), f"{type(exc).__name__}: {exc}")


def pairs_preview(cfg: TrainConfig, lang: str = DEFAULT_LANGUAGE) -> str:
    """A preference stage's preview: what is held out for validation (as for SFT rows) and the run log's lines on
    the pairs that train and the validation pairs (core.data.pairs.PairPlan), in the page's language."""
    from core.data.pairs import check_pairs, plan_pairs, split_pairs
    from core.data.read import PREVIEW_LIMIT, DataError
    from core.model.load import ModelError
    from ui.validation import split_note

    try:
        raw, fmt = check_pairs(cfg, PREVIEW_LIMIT)  # bounded as an SFT preview is
        held = split_pairs(cfg, raw, fmt, PREVIEW_LIMIT)
    except DataError as exc:
        return error_box(t("preview.data_error", lang), render.error_text(exc, lang))
    try:
        tokenizer = _tokenizer(cfg.model, cfg.trust_remote_code)
    except (ModelError, OSError, ValueError) as exc:
        return error_box(t("preview.tokenizer_error", lang), render.error_text(exc, lang))
    try:
        plan = plan_pairs(cfg, tokenizer, raw, fmt, held)
    except DataError as exc:
        return error_box(t("preview.data_error", lang), render.error_text(exc, lang))
    lines = "".join(f"<div>{render.E(render.log_text(line, lang))}</div>" for _, line in plan.log_lines()
                    if line is not held.why)  # split_note says it
    return split_note(held, lang) + f'<div class="mt-note mt-small" id="preview-pairs">{lines}</div>'


def _model_lines(cfg: TrainConfig, lang: str) -> tuple[TrainConfig, list[str], Any]:
    """What the run will change for this model before loading, from its config.json and meta-device tree, in the
    run log's words: the pre-flight's adaptations (core.model.families.adapt: rows unpacked for a stateful mixer,
    another attention path), and the experts' weights that get LoRA with lora_experts. `cfg` comes back as the run
    will train it, so the plan below shows the rows as they will train (unpacked, when so); and the tree (None when
    it cannot be built), which _lora_line reads too."""
    from core.config.settings import ConfigError
    from core.levers.experts import expert_parameters
    from core.model import families
    from core.model.load import resolve_model_path, skeleton

    tree = None
    try:
        tree = skeleton(cfg, resolve_model_path(cfg))  # the run's own: a model that is no causal LM refused by name
        changes, said = families.adapt(cfg, families.traits(tree.config, tree))
        lines = [render.log_text(s, lang) for s in said]
        if cfg.lora_experts:
            names = expert_parameters(tree)
            if not names:
                raise ConfigError([Problem.of("lora_experts", "problem.lora_experts_dense", model=cfg.model)])
            lines.append(render.log_text(Said("log.moe.lora_experts", params=", ".join(names)), lang))
        return (cfg.replace(**changes) if changes else cfg), lines, tree
    except ConfigError as exc:
        return cfg, ["; ".join(render.problem_text(p, lang) for p in exc.problems)], tree
    except Exception:  # noqa: BLE001 - the tree cannot be built: _lora_line below says why, once
        return cfg, [], tree


def _lora_line(cfg: TrainConfig, lang: str, tree: Any = None) -> str:
    """Which layers get LoRA and how many parameters train, from the model's module tree (no weights loaded):
    `tree` when the caller built it, else built here."""
    from core.config.settings import ConfigError
    from core.model.load import lora_targets

    try:
        # the run log's own line (Targets.describe: renamed, fused and shared-name layers), in the page's language
        return render.log_text((lora_targets(cfg, model=tree) if tree is not None else lora_targets(cfg)).describe(),
                               lang)
    except ConfigError as exc:
        return "; ".join(render.problem_text(p, lang) for p in exc.problems)
    except Exception as exc:  # noqa: BLE001 - the preview stays useful when the tree cannot be built
        return t("preview.lora_unknown", lang, error=f"{type(exc).__name__}: {exc}")


def on_preview(lang: str, *values, progress: Any = None) -> str:
    cfg, problems = collect(values_dict(values))
    if cfg is None:  # tagged too: the form's step after a Preview shows only what describes the form on screen
        return marked(render.problems_html(problems, t("preview.cannot", lang), lang), values, lang)
    # public mode: the engine's messages name the visitor's `uploads/x`
    return marked(shown(preview(cfg, lang, progress)), cfg, lang)


def make_preview(lang: str, progress=gr.Progress(), *values) -> str:  # noqa: B008 - Gradio's way to ask for a bar
    """The Preview button's first step: on_preview, with its progress on the preview's bar (Gradio puts its
    gr.Progress where the default stands, before the field values)."""
    return on_preview(lang, *values, progress=progress)


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


def store_upload(file_path: str) -> Path:
    """Copy an upload into the upload folder (its name made safe) and return where it is."""
    incoming = incoming_copy(file_path)
    return Path(shutil.move(incoming, incoming.with_name(upload_name(file_path))))


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


def preview_upload(lang: str, arrived: dict[str, str] | None, progress=gr.Progress(), *values) -> str:  # noqa: B008
    """The preview of the form as the upload left it (make_preview); none after a refusal, whose notice stays."""
    return on_preview(lang, *values, progress=progress) if arrived and "dataset" in arrived else ""
