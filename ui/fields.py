"""TrainConfig fields <-> Gradio widgets, one widget per field, by name.

`make_widget(name)` builds the widget for a field with its label and help text; its kind (slider, radio, number
box, ...), step and bounds come from the field's metadata (`config.field_meta`): sliders and number boxes, never free
text parsed later. `collect(values)` turns widget values (a dict field -> value) into a TrainConfig or the list of
every problem; ui.form.to_values(cfg) goes back.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import gradio as gr

from core.config.settings import (DEMO_DATASET, DEMO_MODEL, DEMO_VISION_MODEL, ConfigError, Problem, TrainConfig,
                                  coerce, field_meta, field_types)
from core.runs.public import from_shown, path_fields

FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(TrainConfig))


def label(name: str, lang: str = "en") -> str:
    """A field's widget label in `lang` (core.i18n `field.<name>`; the field's name for a field added since)."""
    from core.i18n import EN, t

    return t(f"field.{name}", lang) if f"field.{name}" in EN else name


def help_text(name: str, lang: str = "en") -> str:
    """A field's help in `lang` (core.i18n `help.<name>`; the config's own English help for a new field)."""
    from core.i18n import EN, t

    return t(f"help.{name}", lang) if f"help.{name}" in EN else field_meta(name).get("help", "")


def elem_id(name: str) -> str:
    return f"field-{name}"


def _name_errors(component: gr.components.Component, name: str) -> None:
    """Make a bounds error name the field: 'LoRA rank r: value 0 is below the minimum 1'."""
    original = component.preprocess

    def preprocess(payload):
        try:
            return original(payload)
        except gr.Error as exc:
            raise gr.Error(f"{label(name)} ({name}): {exc.message}") from None

    component.preprocess = preprocess  # type: ignore[method-assign]


def make_widget(name: str, value: Any, choices: list[str] | None = None, lang: str = "en",
                **kw: Any) -> gr.components.Component:
    """The widget for one TrainConfig field, with its value, labelled in `lang`."""
    meta, tp = field_meta(name), field_types()[name]
    common = dict(label=label(name, lang), info=help_text(name, lang), elem_id=elem_id(name), **kw)
    lo, hi = meta.get("min"), meta.get("max")
    if tp is bool:
        widget = gr.Checkbox(value=value, **common)
    elif tp == list[str]:
        widget = gr.CheckboxGroup(choices=list(meta["choices"]), value=list(value), **common)
    elif meta.get("choices") and meta.get("widget") == "radio":
        widget = gr.Radio(choices=list(meta["choices"]), value=value, **common)
    elif meta.get("choices"):
        widget = gr.Dropdown(choices=list(meta["choices"]), value=value, **common)
    elif choices is not None:  # a text field with suggestions (model, dataset): any value may be typed
        widget = gr.Dropdown(choices=choices, value=value, allow_custom_value=True, filterable=True, **common)
    elif meta.get("widget") == "slider" and lo is not None and hi is not None:
        widget = gr.Slider(minimum=lo, maximum=hi, step=meta.get("step", 1), value=value, **common)
        _name_errors(widget, name)
    elif tp in (int, float):
        widget = gr.Number(value=value, minimum=lo, maximum=hi, precision=0 if tp is int else None,
                           step=meta.get("step", 1), **common)
        _name_errors(widget, name)
    else:
        widget = gr.Textbox(value=value, max_lines=1, **common)
    return widget


def collect(values: dict[str, Any]) -> tuple[TrainConfig | None, list[Problem]]:
    """Widget values -> (config, []) or (None, every problem)."""
    data, problems = {}, []
    for name in FIELD_NAMES:
        value = values.get(name)
        tp = field_types()[name]
        if value is None and tp in (int, float):
            problems.append(Problem.of(name, "problem.widget_empty"))
            continue
        if value is None and tp is str and field_meta(name).get("choices"):
            problems.append(Problem.of(name, "problem.widget_unselected"))
            continue
        if value is None:
            value = [] if tp == list[str] else ("" if tp is str else value)
        if isinstance(value, str) and tp is str:
            value = value.strip()
        if name in path_fields() and isinstance(value, str):
            value = from_shown(value)  # public mode: the page's `uploads/x`, `runs/x`, for every path field
        try:
            data[name] = coerce(name, value)
        except ValueError as exc:
            problems.append(Problem.of(name, "problem.widget_value", why=exc))
    if problems:
        return None, problems
    try:
        return TrainConfig.from_dict(data), []
    except ConfigError as exc:
        return None, exc.problems


# --- suggestions ----------------------------------------------------------------------------------------------
def cached_repos(repo_type: str) -> list[str]:
    """Repos in the local Hugging Face cache (no network); empty when there is no cache."""
    try:
        from huggingface_hub import scan_cache_dir

        info = scan_cache_dir()
    except Exception:  # no cache folder, unreadable cache: just no suggestions
        return []
    return sorted(r.repo_id for r in info.repos if r.repo_type == repo_type)


def _suggestions(first: str, repo_type: str, default: str, current: str) -> list[str]:
    out = [first, *cached_repos(repo_type)]
    for extra in (default, current):
        if extra and extra not in out:
            out.append(extra)
    return out


def model_choices(current: str = "") -> list[str]:
    return _suggestions(DEMO_MODEL, "model", TrainConfig().model, current)


def dataset_choices(current: str = "") -> list[str]:
    return _suggestions(DEMO_DATASET, "dataset", TrainConfig().dataset, current)


# --- is the model there? (flagged beside the model field before Start) ---------------------------------------------
def model_problem(model: str, timeout_s: float = 3.0) -> tuple[str, dict[str, str]] | None:
    """None when `model` can be loaded: the demos' (built here), a local folder, a Hub id in the local cache, or one
    the Hub knows (gated and private models included: Start then says what token is needed). Otherwise an i18n key
    and its arguments: not on this machine and the Hub unreachable, or no such model on the Hub. Asks the Hub for at
    most `timeout_s` seconds; never downloads."""
    from pathlib import Path

    model = (model or "").strip()
    if not model or model in (DEMO_MODEL, DEMO_VISION_MODEL) or Path(model).expanduser().exists():
        return None  # empty: validate() says so; a local path: the engine checks its contents
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        return "model.no_folder", {"model": model}
    from huggingface_hub import model_info, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    try:
        if isinstance(try_to_load_from_cache(model, "config.json"), str):
            return None
        model_info(model, timeout=timeout_s)
        return None
    except GatedRepoError:
        return None
    except RepositoryNotFoundError:
        return "model.not_on_hub", {"model": model}
    except HFValidationError:
        return "model.not_on_hub", {"model": model}
    except Exception:  # offline, timeout, DNS: the Hub cannot be reached from here
        return "model.unreachable", {"model": model}
