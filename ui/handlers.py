"""The settings form's handlers (Train tab): a field edited, a checklist box ticked, a preset, the Demo / Chapter
buttons, "Fit to my GPU", Start and Stop, save and load settings. The data tab's are in ui/data.py.

Each takes the `Form` (bound by ui.layout), the page's language, then its own inputs, and the field values last
(FIELD_NAMES order); it returns {component: update} for what it changes (ui.form). Tested without a browser.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import gradio as gr

from core.config import checklist, levers
from core.config import presets
from core.estimate.predict import FIT_MARGIN, GENERATION_FIELDS, fit_preset
from core.config.settings import (SAFE_NAME, ConfigError, Problem, TrainConfig, demo_config, demo_vision_config,
                                  field_problems)
from core.config.slices import DataSlice, ModelSlice, PlaceSlice, StageSlice, TrainerSlice
from core.i18n import DEFAULT_LANGUAGE, t
from core.jobs.manager import JobBusy
from core.runs.public import is_public
from ui import render
from ui.derive import CUSTOM, budget_problem, hardware, row_tokens, run_gpus, toggled, valid_budget, world_size
from ui.fields import collect, help_text, label, model_problem
from ui.form import Form, Updates, apply_config, derived, read_config, values_dict
from ui.live import RUN_NOTE, busy_message, owner, read_gpus, start_run
from ui.tryexport import free_try_model

# what core.estimate.predict.fit_to_gpu may change: the registry's levers, then GRPO's sampling
FIT_FIELDS = levers.fit_fields() + GENERATION_FIELDS
MARGIN_PCT = round(FIT_MARGIN * 100)  # the share of the card Fit keeps spare: said with every figure it gives


class _Processes(ModelSlice, PlaceSlice, Protocol):
    """The device and the GPU count: which of this machine's GPUs a run uses."""


class _Fitted(DataSlice, StageSlice, TrainerSlice, Protocol):
    """The batch, length, checkpointing and optimizer, GRPO's sampling: what Fit to my GPU changes (FIT_FIELDS)."""


class _Planned(ModelSlice, DataSlice, StageSlice, TrainerSlice, PlaceSlice, Protocol):
    """The rows that train (data, stage), the batch and schedule, and the processes that share them."""


def config_dir() -> Path:
    """Where settings are saved: public mode, the visitor's own folder in it (nobody lists, loads or replaces
    another visitor's)."""
    from core.runs.public import visitor

    base = Path(os.environ.get("MEMTUNE_CONFIG_DIR", "configs"))
    who = visitor()
    return base / who if who else base


def config_dir_shown() -> Path:
    """The folder the page names for saved settings: public mode, just `configs` (the server's path is not shown)."""
    from core.runs.public import is_public

    return Path("configs") if is_public() else config_dir()


def config_shown(path: Path) -> Path:
    """A saved file as the page names it: public mode, its name alone (the folder is the server's)."""
    from core.runs.public import visitor

    return Path(path.name) if visitor() else path


def saved_configs() -> list[str]:
    from core.runs.public import is_public, visitor

    if is_public() and not visitor():
        return []  # the page as built at start-up, for every visitor: nobody's saved settings
    d = config_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def on_fields_changed(form: Form, lang: str, *values, memory: dict[str, Any] | None = None) -> Updates:
    cfg, problems = read_config(values)
    return derived(form, cfg, problems, lang, memory)


def on_checklist(form: Form, key: str, lang: str, on: bool, memory: dict[str, Any], *values) -> Updates:
    """Tick or untick one checklist item: the governed fields change, then everything derived."""
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        gr.Warning(t("checklist.needs_readable", lang))
        return derived(form, None, problems, lang)
    new = toggled(cfg, key, bool(on), memory)
    fields = checklist.BY_KEY[key].fields
    memory = {**(memory or {}), key: {"before": {f: getattr(cfg, f) for f in fields},
                                      "after": {f: getattr(new, f) for f in fields}}}
    return {**apply_config(form, new, lang, memory), form.check_memory: memory}


def check_model(lang: str, model: str) -> dict:
    """Beside the model field, before Start, step one (in its own queue: it may ask the Hub for up to 3 s): whether
    `model` is on this machine or reachable, as the words the field's note will say, with what they describe."""
    problem = model_problem(model)
    return {"model": (model or "").strip(), "lang": lang,
            "info": help_text("model", lang) if problem is None else t(problem[0], lang, **problem[1])}


def model_note_if_current(lang: str, checked: dict | None, model: str) -> Any:
    """Step two, in the form's queue: the note goes beside the field when it describes the model and language on
    screen now; an older check that finished after a newer one changes nothing."""
    if not checked or checked.get("model") != (model or "").strip() or checked.get("lang") != lang:
        return gr.skip()
    return gr.update(info=checked["info"])


def on_preset_lever(form: Form, lang: str, name: str, *values) -> Updates:
    """Apply a memory/speed preset to the current settings (CUDA-only levers left off without CUDA)."""
    if name == CUSTOM:
        return gr.skip()
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        gr.Warning(t("checklist.needs_readable", lang))
        return derived(form, None, problems, lang)
    fit = fit_preset(cfg, name, hardware())  # the preset's promise kept for this model (core.estimate.predict.fit_preset)
    applied = fit.cfg
    dropped = [k for k in presets.CUDA_ONLY if k in presets.overrides(name)
               and getattr(applied, k) != presets.overrides(name)[k]]
    if dropped:  # say so, rather than leave the user wondering why the form differs from the preset
        levers = ", ".join(label(k, lang) for k in dropped)  # the widgets' labels, not internal field names
        gr.Info(t("preset.dropped", lang, preset=t(f"preset.{name}.label", lang), levers=levers))
    if fit.key:  # what the preset gives for this model: the prediction, and what changed to keep its promise
        # (the changed settings named by their widgets' labels, as the dropped levers are, not by field names)
        note = fit.note(lang, word=lambda name, value: f"{label(name, lang)} {shown(value, lang)}")
        (gr.Info if fit.key == "preset.fit.holds" else gr.Warning)(note)
    return {**apply_config(form, applied, lang), **dict.fromkeys(form.stale, "")}  # notices about the old case go


def on_start_from(form: Form, kind: str, lang: str = DEFAULT_LANGUAGE) -> Updates:
    """Demo / vision demo / Chapter recipe buttons: the new settings, and the notices about the old ones cleared."""
    cfg = {"demo": demo_config, "demo_vision": demo_vision_config}.get(kind, TrainConfig)()
    return {**apply_config(form, cfg, lang), **dict.fromkeys(form.stale, "")}


# --- fit to my GPU -----------------------------------------------------------------------------------------------
def fit_budget_gib(budget: float | None, cfg: _Processes | None = None) -> tuple[float | None, bool]:
    """(GiB to fit, whether it is a real GPU's free memory): the least free memory among the GPUs the run uses (the
    figures are per GPU). Without a GPU: the hypothetical card's budget."""
    if hardware().cuda:
        gpus, _ = read_gpus()
        if gpus:
            used = gpus[:max(1, run_gpus(cfg))]
            return max(0.0, min(g["total_gib"] - g["used_gib"] for g in used)), True
    return valid_budget(budget), False


def on_budget(form: Form, lang: str, budget: float | None) -> Updates:
    """Beside the hypothetical card's box: what is wrong with its GiB, or its help (the form's way for a field)."""
    if form.budget is None:
        return {}
    return {form.budget: gr.update(info=budget_problem(budget, lang) or t("fit.budget_info", lang))}


def shown(value: Any, lang: str) -> str:
    """A setting's value as the page words it: on / off for a tick box."""
    return t("fit.on", lang) if value is True else t("fit.off", lang) if value is False else str(value)


def describe_changes(old: _Fitted, new: _Fitted, lang: str) -> list[str]:
    return [f"{label(n, lang)}: {shown(getattr(old, n), lang)} → {shown(getattr(new, n), lang)}" for n in FIT_FIELDS
            if getattr(old, n) != getattr(new, n)]


def sampling_note(old: StageSlice, new: StageSlice, lang: str) -> str:
    """Why Fit lowered GRPO's sampling, when it did ("" otherwise): the answers of a generation batch are sampled
    together, so their cache is what did not fit."""
    if all(getattr(old, n) == getattr(new, n) for n in GENERATION_FIELDS):
        return ""
    return "\n" + t("fit.grpo_sampling", lang, answers=new.num_generations, tokens=new.max_completion_length)


# Where each field a failed fit advises on sits on the page (its label is ui.fields.label's).
ADVICE_FIELD = {"upcast": ("upcast_to_fp32", ("tab.checklist", "checklist.beyond")),
                "no_4bit": ("load_in_4bit", ("tab.checklist",)), "ddp": ("distributed_strategy", ("tab.training",))}


def fit_failure(exc: Any, where: str, lang: str) -> str:
    """core.estimate.predict.FitError in the page's words: what the smallest setting needs, then what else may help, naming
    fields by their labels and tabs (never an internal field name)."""
    small = exc.smallest
    if small is None:
        unknown = t("fit.failed", lang, where=where, length="?", ckpt="?", optim="?", gib="?", need="?",
                    margin=MARGIN_PCT)
        return f"{unknown}\n{exc}"
    text = t("fit.failed", lang, where=where, length=small.max_length, margin=MARGIN_PCT,
             ckpt=t("fit.on" if small.gradient_checkpointing else "fit.off", lang), optim=small.optim,
             gib=render.num(exc.smallest_gib, 1, lang), need=render.num(exc.need_gib, 1, lang))
    field, tabs = ADVICE_FIELD.get(exc.advice, (None, ()))
    advice = t(f"fit.advice.{exc.advice}", lang, field=label(field, lang) if field else "",
               where=" → ".join(t(k, lang) for k in tabs))
    if small.stage == "grpo":  # the fewest and shortest answers were tried too
        text += "\n" + t("fit.failed_grpo", lang, answers=small.num_generations, tokens=small.max_completion_length)
    return text + "\n" + advice


class _Streamed(ModelSlice, TrainerSlice, Protocol):
    """The streamed model and the step that goes through it."""


def stream_cost(cfg: _Streamed, tokens: int, lang: str) -> str:
    """After Fit chose stream_layers: the expected slowdown from this machine's measured link, or "" where the link
    was never measured here (core/gpus/link.py) or the model's shape cannot be read."""
    from core.estimate.known import shape_of
    from core.estimate.streaming import stream_speed
    from core.model.shapes import ShapeError

    try:
        speed = stream_speed(cfg, shape_of(cfg.model), tokens)
    except (ShapeError, OSError, ValueError):
        return ""
    if speed is None or speed.slowdown is None:
        return ""
    return " " + t("fit.streamed_speed", lang, gib=render.num(speed.copied_bytes / 2**30, 1, lang),
                   rate=render.num(speed.link.h2d_bytes_per_s / 1e9, 1, lang),
                   copy=render.num(speed.copy_s, 2, lang), compute=render.num(speed.compute_s, 2, lang),
                   slowdown=render.num(speed.slowdown, 1, lang))


def on_fit(form: Form, lang: str, budget: float | None, *values) -> Updates:
    """"Fit to my GPU": core.estimate.predict.fit_to_gpu on the GPU's free memory (or the hypothetical card's budget).
    With several GPUs the budget and the peak are per GPU (core.estimate.predict's figures are)."""
    from core.estimate.predict import FitError, fit_to_gpu
    from core.model.shapes import ShapeError

    def fit_note(text: str, kind: str) -> Updates:
        return {form.fit_note: render.message_html(text, kind, "mt-fit-note")}

    cfg, problems = collect(values_dict(values))
    if cfg is None:
        return {form.fit_note: render.problems_html(problems, t("summary.unreadable", lang), lang)}
    gib, real = fit_budget_gib(budget, cfg)
    if gib is None:  # no GPU and no usable card: said beside the box and under it, the form untouched
        return {**fit_note(budget_problem(budget, lang) or t("fit.no_budget", lang), "warn"),
                **on_budget(form, lang, budget)}
    shown = render.num(gib, 0 if float(gib).is_integer() else 1, lang)
    where = t("fit.gpu_free" if real else "fit.hypothetical", lang, gib=shown)
    rows = row_tokens(cfg)
    sized = "\n" + (t("fit.lengths_known", lang, n=render.integer(rows, lang)) if rows else t("fit.lengths_unknown", lang))
    try:
        new, est = fit_to_gpu(cfg, int(gib * 2**30), max_row_tokens=rows)
    except FitError as exc:
        text = fit_failure(exc, where, lang)
        gr.Warning(text)  # the whole sentence: a toast cut after "Does not fit ...:" said nothing
        return fit_note(text + sized, "error")
    except (ShapeError, ValueError, OSError) as exc:
        gr.Warning(t("fit.unknown_model", lang, model=cfg.model))
        return fit_note(t("fit.unknown_model", lang, model=cfg.model) + "\n" + str(exc), "error")
    changes = describe_changes(cfg, new, lang)
    if new.stream_layers and not cfg.stream_layers:  # Fit's last resort: what it costs
        sized = "\n" + t("fit.streamed", lang) + stream_cost(new, est.tokens, lang) + sized
    n = world_size(est)
    per_gpu = "\n" + t("fit.per_gpu", lang, n=n) if n > 1 else ""
    peak = render.num(est.total_gib, 1, lang)
    if not changes:
        text = t("fit.unchanged", lang, gib=peak, where=where, margin=MARGIN_PCT) + per_gpu + sized
    else:
        text = (t("fit.changed", lang, gib=peak, where=where, margin=MARGIN_PCT) + per_gpu + "\n"
                + "\n".join(f"• {c}" for c in changes) + sampling_note(cfg, new, lang) + sized)
    return {**apply_config(form, new, lang), **fit_note(text, "ok"), **on_budget(form, lang, budget)}


# --- start / stop ------------------------------------------------------------------------------------------------
def planned_step_problems(cfg: _Planned) -> list[Problem]:
    """Public mode, a run counted in epochs: the step and token limits against what it plans on its data's rows, where
    they can be counted before Start (core.checks.rows_to_train; elsewhere the training child refuses it once it has
    planned them). max_steps itself is validate()'s."""
    from core.checks import rows_to_train
    from core.runs.public import plan_problems

    if not is_public() or cfg.max_steps > 0:
        return []
    try:
        rows = rows_to_train(cfg)
    except Exception:  # noqa: BLE001 - data that cannot be read: the run says why, as it always has
        return []
    return plan_problems(cfg, rows, max(1, run_gpus(cfg)))


def on_start(form: Form, lang: str, *values) -> Updates:
    """Validate (every problem at once), then start the run in the background (public mode: queue it), or say why
    not."""
    from core.runs.public import shown

    cfg, problems = read_config(values)
    if cfg is not None and not problems:
        problems = planned_step_problems(cfg)
    if cfg is None or problems:
        gr.Warning(t("msg.not_started", lang, n=len(problems)))
        return {form.run_notice: render.problems_html(problems, t("msg.not_started_title", lang), lang)}
    manager = form.app.manager
    free_try_model(manager)
    try:
        job = start_run(cfg, manager)  # public mode: into the queue, within the Space owner's limits
    except JobBusy as exc:
        msg = busy_message(exc, lang, manager)
        gr.Warning(msg)
        return {form.run_notice: render.message_html(msg, "warn")}
    place = manager.position(job) if job.waiting else None
    said = (t("msg.queued", lang, id=job.id, position=place[0]) if place else
            t("msg.started", lang, id=job.id, model=cfg.model, dataset=shown(cfg.dataset)))
    return {form.run_notice: render.message_html(said, "ok", RUN_NOTE),
            form.start: gr.update(interactive=False), form.stop: gr.update(interactive=True)}


def on_stop(app: Any, lang: str = DEFAULT_LANGUAGE) -> str:
    """Stop: end after the current step and save. Pressed again (a double click, ten presses) it is the same Stop:
    the page says so, and points at End now, the separate, confirmed way to end at once."""
    who = owner()  # public mode: only the visitor's own run; another visitor's is not theirs to stop
    was_stopping = (job := app.manager.current(who)) is not None and job.stopping
    was_waiting = job is not None and job.waiting
    job = app.manager.stop(who)
    if job is None:
        return render.message_html(t("msg.no_run", lang), "info")
    if was_waiting:
        return render.message_html(t("msg.left_queue", lang), "info", RUN_NOTE)
    return render.message_html(t("msg.stop_again" if was_stopping else "msg.stopping", lang), "warn", RUN_NOTE)


def on_end_now_ask(lang: str = DEFAULT_LANGUAGE) -> tuple[Any, str]:
    """End now, first step: show what it costs (no adapter) with Yes / Cancel; nothing is ended yet."""
    return gr.update(visible=True), render.message_html(t("run.end_now_confirm", lang), "warn")


def on_end_now(app: Any, lang: str = DEFAULT_LANGUAGE) -> tuple[str, Any, str]:
    """End now, confirmed: the asker's running job ends at once, without an adapter."""
    job = app.manager.end_now(owner())  # public mode: the visitor's own run only
    said = (render.message_html(t("msg.ended_now", lang), "warn", RUN_NOTE) if job is not None else
            render.message_html(t("msg.no_run", lang), "info"))
    return said, gr.update(visible=False), ""


def space_owner() -> bool:
    """Public mode, and the one asking is the Space owner (logged in with MEMTUNE_AUTH), not a visitor."""
    return is_public() and owner() is None


def owner_jobs(app: Any, lang: str = DEFAULT_LANGUAGE) -> tuple[Any, Any]:
    """The owner's row: visible to the Space owner only, listing every job running or queued ("#7 visitor-... ·
    model"); hidden, and empty, for anyone else."""
    if not space_owner():
        return gr.update(visible=False), gr.update(choices=[], value=None)
    running, waiting = app.manager.queue()
    choices = [(f"#{j.id} · {t('queue.owner_running' if j.running else 'queue.owner_waiting', lang)} · "
                f"{j.owner or '-'} · {j.config.model}", j.id) for j in running + waiting]
    return gr.update(visible=True), gr.update(choices=choices, value=choices[0][1] if choices else None)


def on_owner_stop(app: Any, job_id: Any, lang: str = DEFAULT_LANGUAGE) -> tuple[str, Any, Any]:
    """The Space owner's Stop of the job picked, running (ends after its step and saves) or queued (leaves the
    queue); refused to anyone else, whatever they send."""
    if not space_owner():
        return render.message_html(t("queue.owner_only", lang), "error"), *owner_jobs(app, lang)
    job = app.manager.stop(job_id=int(job_id)) if isinstance(job_id, (int, float)) else None
    said = (t("queue.owner_stopped", lang, id=job.id) if job is not None else t("msg.no_run", lang))
    return render.message_html(said, "warn" if job is not None else "info"), *owner_jobs(app, lang)


# --- save / load settings ----------------------------------------------------------------------------------------
def on_save_config(form: Form, lang: str, name: str, *values) -> Updates:
    def notice(html: str) -> Updates:
        return {form.config_notice: html}

    name = (name or "").strip()
    if name.endswith((".yaml", ".yml")):
        name = name.rsplit(".", 1)[0]
    if not SAFE_NAME.match(name):
        return notice(render.message_html(t("config.bad_name", lang, name=repr(name)) if name
                                          else t("config.give_name", lang), "error"))
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        return notice(render.problems_html(problems, t("config.not_saved", lang), lang))
    path = config_dir() / f"{name}.yaml"
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        cfg.save(path)
    except OSError as exc:
        return notice(render.message_html(f"{config_shown(path)}: {type(exc).__name__}", "error"))
    msg = t("config.replaced" if existed else "config.saved", lang, path=config_shown(path),
            command=f"python -m core.train --config {config_shown(path)}")
    return {**notice(render.message_html(msg, "ok")), form.config_list: gr.update(choices=saved_configs(), value=name)}


def on_load_config(form: Form, lang: str, name: str) -> Updates:
    """Saved settings into the form. A file with values no widget can show (core.config.settings.field_problems: outside a
    field's bounds or choices) is refused, and what is on screen stays."""
    def notice(html: str) -> Updates:
        return {form.config_notice: html}

    if not name or not SAFE_NAME.match(name):
        return notice(render.message_html(t("config.pick", lang), "warn"))
    path = config_dir() / f"{name}.yaml"
    where = config_shown(path)
    try:
        cfg = TrainConfig.load(path)
    except OSError as exc:
        return notice(render.message_html(f"{where}: {type(exc).__name__}", "error"))
    except ConfigError as exc:
        return notice(render.problems_html(exc.problems, t("config.not_loaded", lang, path=where), lang))
    problems = field_problems(cfg)
    if problems:
        return notice(render.problems_html(problems, t("config.out_of_range", lang, path=where), lang))
    from core.runs.public import without_remote_code

    cfg, asked = without_remote_code(cfg)  # h2: a file never turns trust_remote_code on by itself
    if asked:
        msg = f'{t("config.loaded", lang, path=where)} {t("config.trust_off", lang, model=cfg.model)}'
        return {**apply_config(form, cfg, lang), **notice(render.message_html(msg, "warn"))}
    return {**apply_config(form, cfg, lang), **notice(render.message_html(t("config.loaded", lang, path=where), "ok"))}
