"""The settings form as handlers see it: `Form` holds the Train tab's components by role (one widget per TrainConfig
field, the outputs derived from the config, the notices), and `derived` / `apply_config` return updates keyed by
those components ({component: update}); Gradio leaves every output a handler's dict does not name as it is.

ui.layout builds the components and the Form; handlers (ui.handlers, ui.data, ui.history) take it as their first
argument, bound with functools.partial when the events are wired.
"""

from __future__ import annotations

import hashlib
import json
from html import escape
from dataclasses import dataclass
from typing import Any

import gradio as gr

from core.config import checklist
from core.codegen import cli_command, python_script
from core.checks import validate
from core.config.settings import Problem, TrainConfig
from core.i18n import DEFAULT_LANGUAGE, EN, t
from core.messages import say
from ui import render
from ui.derive import chapter_gib, hardware, prediction, preset_choices, preset_of, run_gpus
from ui.fields import FIELD_NAMES, collect
from ui.speed import speed_lines

Updates = dict[Any, Any]  # component -> new value or gr.update(...)

# Every listener that writes the form waits in this one queue, in the order the pages sent them. In separate queues
# (Gradio's default: one per function) a slower older event, the page's load or a language switch, could finish
# after a newer edit and put the settings it read back on screen.
FORM_QUEUE = {"concurrency_id": "form", "concurrency_limit": 1}
# A Preview reads the data and the model's tokenizer and config, from the Hub too: seconds to minutes. In the form's
# queue it held every page's edits, loads and language switches behind it (on a Space, every visitor's). It is made in
# a queue of its own and put on screen by a second step in the form's queue (ui/layout.py: wire_form).
PREVIEW_QUEUE = {"concurrency_id": "preview", "concurrency_limit": 2}
# The model field's check asks the Hub (up to 3 s each, ui.fields.model_problem): it waits on the network, not the CPU,
# and runs beside the form's queue likewise, its note put on screen by a step in the form's queue.
MODEL_CHECK_QUEUE = {"concurrency_id": "model_check", "concurrency_limit": 4}


@dataclass(eq=False)
class Form:
    fields: dict[str, Any]  # TrainConfig field name -> its widget
    summary: Any  # gr.HTML: the settings at a glance, with every problem
    prediction: Any  # gr.State: prediction_state()
    checks: dict[str, Any]  # checklist item key -> its checkbox
    facts: dict[str, Any]  # checklist item key -> what it saves and costs (gr.HTML)
    preset: Any  # gr.Radio
    code_py: Any  # gr.Code: the equivalent Python script
    code_cli: Any  # gr.Code: the equivalent command
    fit_note: Any  # "Fit to my GPU"'s notice
    preview: Any  # the data preview
    run_notice: Any  # Start / Stop's notice
    config_notice: Any  # save / load settings' notice
    config_list: Any  # the saved settings' dropdown
    start: Any  # the Start button
    stop: Any  # the Stop button
    check_memory: Any  # gr.State: what each checklist box changed last (so unticking undoes it)
    budget: Any = None  # "Fit to my GPU"'s hypothetical card (GiB), without a GPU: not a TrainConfig field
    app: Any = None  # ui.state.AppState: the manager Start and Stop act on
    measuring: Any = None  # gr.Timer: active while an inspect child measures for the settings on screen

    @property
    def inputs(self) -> list[Any]:
        """The field widgets in FIELD_NAMES order: every handler that reads the config takes these last."""
        return [self.fields[n] for n in FIELD_NAMES]

    @property
    def derived_outputs(self) -> list[Any]:
        return [self.summary, self.prediction, *self.checks.values(), *self.facts.values(), self.preset,
                self.code_py, self.code_cli] + ([self.measuring] if self.measuring is not None else [])

    @property
    def outputs(self) -> list[Any]:
        """Everything a handler that changes the settings may write."""
        return self.inputs + self.derived_outputs + [self.check_memory]

    @property
    def stale(self) -> list[Any]:
        """The notices that describe the settings they saw: cleared when the settings are replaced."""
        return [self.fit_note, self.preview, self.run_notice]


def merged(*parts: Updates) -> Updates:
    """Several {component: update} in one; two for the same component are combined (e.g. a label and a value)."""
    out: Updates = {}
    for part in parts:
        for comp, update in part.items():
            if comp in out:
                old, new = (u if isinstance(u, dict) and u.get("__type__") == "update" else gr.update(value=u)
                            for u in (out[comp], update))
                update = {**old, **new}
            out[comp] = update
    return out


def values_dict(values) -> dict[str, Any]:
    return dict(zip(FIELD_NAMES, values))


def to_values(cfg: TrainConfig) -> dict[str, Any]:
    """A config as its widgets' values (ui.fields.collect reads them back)."""
    return {name: (list(v) if isinstance(v := getattr(cfg, name), list) else v) for name in FIELD_NAMES}


def settings_mark(values: Any, lang: str) -> str:
    """A short fingerprint of the settings a notice was made for, and of its language: a config, or the widgets'
    values (collected; as they are when they do not make a config)."""
    cfg = values if isinstance(values, TrainConfig) else collect(values_dict(values))[0]
    said = json.dumps(cfg.to_dict(), sort_keys=True, default=str) if cfg is not None else repr(list(values))
    return hashlib.sha256(f"{lang}\n{said}".encode()).hexdigest()[:16]


def marked(html: str, settings: Any, lang: str) -> str:
    """`html` tagged with the settings it describes: an edit's handler then clears it only when they differ, whichever
    of the edit and the click that made it reaches the form's queue first."""
    return f'<div data-settings="{settings_mark(settings, lang)}">{html}</div>'


def still_describes(html: Any, values: Any, lang: str) -> bool:
    return isinstance(html, str) and html.startswith(f'<div data-settings="{settings_mark(values, lang)}">')


def shown_if_current(lang: str, made: Any, *values) -> Any:
    """A Preview's second step, in the form's queue: the preview just made goes on screen when it describes the
    settings and language on screen now. Otherwise nothing changes: an edit made meanwhile has cleared what it
    replaced, and a newer preview already shown stays (an older one that finished later must not wipe it)."""
    return made if still_describes(made, values, lang) else gr.skip()


def read_config(values) -> tuple[TrainConfig | None, list[Problem]]:
    """Widget values -> (config, problems): problems are unreadable values or failed validation."""
    from core.runs.public import visitor_config

    cfg, problems = collect(values_dict(values))
    if cfg is None:
        return None, problems
    cfg = visitor_config(cfg)  # public mode: the run goes into the visitor's own folder
    return cfg, validate(cfg, hardware())


def check_update(item: checklist.ChecklistItem, lang: str, **kw: Any) -> dict:
    return gr.update(label=t(f"checklist.{item.key}.label", lang), info=t(f"checklist.{item.key}.tradeoff", lang), **kw)


def preset_update(lang: str, **kw: Any) -> dict:
    return gr.update(choices=preset_choices(lang), label=t("preset.label", lang), info=t("preset.info", lang), **kw)


def facts_for(cfg: TrainConfig, key: str, saves: dict[str, float], lang: str) -> str:
    return render.facts_html(key, saves.get(key), speed_lines(key, cfg, lang), lang, chapter_gib(cfg, key))


def prediction_state(cfg: TrainConfig, pred: Any) -> dict[str, Any]:
    """The page's prediction state, read by the live gauge: the peak per GPU, and the GPUs here the run uses;
    `measuring`: the inspect child the page waits for (ui/layout.py's measuring timer)."""
    return {"gib": pred.gib, "gpus": run_gpus(cfg), "floor": pred.floor, "measuring": pred.measuring}


def inspections(form: Form) -> Any:
    """The app's inspect children (core.jobs.actions.Inspections), where the page has an app."""
    return getattr(getattr(getattr(form.app, "manager", None), "actions", None), "inspections", None)


def _said(value: Any, lang: str) -> str:
    if isinstance(value, bool):
        return t("inspect.on" if value else "inspect.off", lang)
    return str(value)


def change_line(change: dict[str, Any], lang: str) -> str:
    """One resolved change in the page's language: the field, its value as typed and as it trains, and why (its key)."""
    line = t("inspect.change", lang, field=change.get("field", ""), before=_said(change.get("before"), lang),
             after=_said(change.get("after"), lang))
    key = change.get("key") or ""
    return f"{line}: {say(key, change.get('params') or {}, lang)}" if key in EN else line  # nested reasons too


def inspect_note(pred: Any, lang: str) -> str:
    """Under the summary: the resolved run's changes, a measurement still running (the formula stands in) or failed."""
    parts = []
    if getattr(pred, "changes", ()):
        items = "".join(f"<li>{escape(change_line(c, lang))}</li>" for c in pred.changes)
        parts.append(f'<div class="mt-resolved" id="mt-resolved">{escape(t("inspect.changes", lang))}<ul>{items}</ul></div>')
    if getattr(pred, "measuring", None):
        parts.append(f'<div class="mt-measuring" id="mt-measuring">{escape(t("inspect.measuring", lang))}</div>')
    elif getattr(pred, "busy", False):
        parts.append(f'<div class="mt-measuring" id="mt-measuring">{escape(t("inspect.busy", lang))}</div>')
    for error in getattr(pred, "failed", ()):
        parts.append(f'<div class="mt-measure-failed">{escape(t("inspect.failed", lang, error=error))}</div>')
    return "".join(parts)


def derived(form: Form, cfg: TrainConfig | None, problems: list[Problem], lang: str = DEFAULT_LANGUAGE,
            memory: dict[str, Any] | None = None) -> Updates:
    """What follows from the config: summary, prediction, checklist ticks and facts, preset, script, command.
    `memory`: the page's record of the checklist boxes' last changes (what a click would undo)."""
    checks = checklist.ITEMS
    if cfg is None:  # unreadable values: say which; ticks and facts keep what they showed
        return {form.summary: render.summary_html(None, problems, lang=lang), form.preset: preset_update(lang),
                **{form.checks[i.key]: check_update(i, lang) for i in checks}}
    on = checklist.active(cfg)
    pred = prediction(cfg, memory, inspections(form), settings=cfg.to_dict())
    summary = render.summary_html(cfg, problems, on, predicted_gib=pred.gib, lang=lang, gpus=pred.gpus,
                                  cpu_gib=pred.cpu_gib)
    return {form.summary: summary + inspect_note(pred, lang),
            form.prediction: prediction_state(cfg, pred),
            **{form.checks[i.key]: check_update(i, lang, value=on[i.key]) for i in checks},
            **{form.facts[i.key]: facts_for(cfg, i.key, pred.saves, lang) for i in checks},
            form.preset: preset_update(lang, value=preset_of(cfg)),
            form.code_py: python_script(cfg), form.code_cli: cli_command(cfg),
            **({form.measuring: gr.Timer(active=bool(pred.measuring))} if form.measuring is not None else {})}


def field_updates(form: Form, cfg: TrainConfig) -> Updates:
    """Every field's widget value; public mode: each path field (core.runs.public.path_fields) as `uploads/x`,
    `runs/...`, never the server's paths."""
    from core.runs.public import path_fields, shown

    paths = path_fields()
    return {form.fields[name]: shown(value) if name in paths else value for name, value in to_values(cfg).items()}


def apply_config(form: Form, cfg: TrainConfig, lang: str = DEFAULT_LANGUAGE,
                 memory: dict[str, Any] | None = None) -> Updates:
    """Put a config into the form: every field, and everything derived from it. Settings replaced by anything but a
    checklist box (a preset, Fit, a loaded file) leave no box click to undo: the memory is emptied."""
    return {**field_updates(form, cfg), **derived(form, cfg, validate(cfg, hardware()), lang, memory),
            form.check_memory: memory or {}}


def confirm_box(tr: Any, lang0: str, elem: str, yes_key: str, yes_elem: str, cancel_elem: str):
    """A hidden "are you sure?" box (its text, a Yes and a Cancel button) for an action that cannot be undone.
    A Column, not a Group: a Group shown by an update is drawn as two nested elements of the same id (Gradio 6)."""
    with gr.Column(visible=False, elem_id=elem) as box:
        text = gr.HTML(elem_id=f"{elem}-box")
        with gr.Row():
            yes = tr.add(gr.Button(t(yes_key, lang0), variant="stop", elem_id=yes_elem), value=yes_key)
            cancel = tr.add(gr.Button(t("history.cancel", lang0), elem_id=cancel_elem), value="history.cancel")
    return box, text, yes, cancel

