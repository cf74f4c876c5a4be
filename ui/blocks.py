"""The memtune page: `build_ui()` returns the Blocks (app.py launches it).

Layout: a header with the language picker, then four top-level tabs. "Train" holds the settings tabs on the
left (model and data, the memory checklist, training, settings and code) and the run panel on the right (GPU
gauge with the predicted peak, "Fit to my GPU", summary, Start/Stop, progress, loss curve, log, result).
"Try it", "Export" and "History" (ui/after.py) work on the runs under the form's output folder.

Every TrainConfig field has exactly one widget (`FIELDS[name]`), and every handler reads the config from the
widgets, so what is on screen is what trains. Live parts are driven by one gr.Timer per page polling the
process-wide job manager; nothing about the run lives in the page, so reloading it reattaches.

Every text comes from core.i18n in the page's language (the `lang` dropdown, first input of every handler that
writes text); switching it relabels every component (`Translations`) and re-renders the derived parts.
"""

from __future__ import annotations

import os
import re
import shutil
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Callable

import gradio as gr
import pandas as pd

from core import checklist, presets
from core.codegen import cli_command, python_script
from core.config import SAFE_NAME, ConfigError, Hardware, Problem, TrainConfig, demo_config, validate
from core.i18n import DEFAULT_LANGUAGE, EN, language_choices, request_language, t
from core.export import ExportError, zip_adapter
from core.jobs import MANAGER, JobBusy, job_view, latest_run_dir
from ui import render
from ui.fields import FIELD_NAMES, collect, dataset_choices, help_text, label, make_widget, model_choices, \
    model_problem, out_of_range, to_values
from ui.live import read_gpus
from ui.theme import TABS_KW
from ui.speed import speed_lines

DATA_TYPES = [".jsonl", ".json", ".csv", ".parquet", ".txt"]
# Where fields are shown (everything else goes to Training > Advanced):
GOVERNS = {  # checklist item -> the non-checkbox fields it governs, shown beside it
    "qlora": ["bnb_4bit_quant_type", "bnb_4bit_use_double_quant"],
    "gradient_accumulation": ["gradient_accumulation_steps"],
    "efficient_optimizer": ["optim"], "bf16": ["precision"],
    "short_max_length": ["max_length"], "small_batches": ["per_device_train_batch_size"],
}
BEYOND = ["packing", "upcast_to_fp32", "offload_embeddings", "attention", "expandable_segments", "use_liger_kernel"]
PLACED = ["model", "dataset", "dataset_split", "dataset_format", "long_prompts", "lora_r", "lora_alpha",
          "lora_dropout", "lora_target_modules", "learning_rate", "num_train_epochs", "max_steps", "save_strategy",
          "save_steps", "output_dir", "run_name"]
FIT_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "max_length", "gradient_checkpointing",
              "optim")  # what core.estimate.fit_to_gpu may change
CUSTOM = "custom"
DEFAULT_BUDGET_GIB = 8.0  # the hypothetical card "Fit to my GPU" aims at where there is no GPU
LOG_LINES = 400
PLOT_POINTS = 400
N_ITEMS = len(checklist.ITEMS)
# derived() outputs, in order: summary, prediction state, 7 checkboxes, 7 facts, preset radio, script, command
N_DERIVED = 2 + 2 * N_ITEMS + 3


@lru_cache(maxsize=1)
def hardware() -> Hardware:
    return Hardware.detect()


def initial_config() -> TrainConfig:
    """With a CUDA GPU: the chapter's recipe. Without: the offline demo, so a visitor can train in a minute."""
    return TrainConfig() if hardware().cuda else demo_config()


def config_dir() -> Path:
    return Path(os.environ.get("MEMTUNE_CONFIG_DIR", "configs"))


def upload_dir() -> Path:
    from core.demo import cache_root

    return cache_root() / "uploads"


def saved_configs() -> list[str]:
    d = config_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


class Translations:
    """Components whose texts follow the language: (component, {property: i18n key or fn(lang) -> text})."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, dict[str, str | Callable[[str], Any]]]] = []

    def add(self, component: Any, **props: str | Callable[[str], Any]) -> Any:
        self.items.append((component, props))
        return component

    @property
    def components(self) -> list[Any]:
        return [c for c, _ in self.items]

    def updates(self, lang: str) -> list[Any]:
        return [gr.update(**{p: (v(lang) if callable(v) else t(v, lang)) for p, v in props.items()})
                for _, props in self.items]


# --- pure handlers (tested without a browser) ----------------------------------------------------------------------
def values_dict(values) -> dict[str, Any]:
    return dict(zip(FIELD_NAMES, values))


def read_config(values) -> tuple[TrainConfig | None, list[Problem]]:
    """Widget values -> (config, problems): problems are unreadable values or failed validation."""
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        return None, problems
    return cfg, validate(cfg, hardware())


def row_tokens(cfg: TrainConfig) -> int | None:
    """The dataset's longest row in tokens when the preview has measured it (estimates then use it), else None."""
    from core.data import known_longest_row

    return None if cfg.packing else known_longest_row(cfg)


def prediction(cfg: TrainConfig) -> tuple[float | None, dict[str, float]]:
    """Predicted peak GPU memory (GiB, NVML) and the GiB each checklist item saves here; advice only."""
    try:
        from core.estimate import estimate, savings

        rows = row_tokens(cfg)
        return (estimate(cfg, max_row_tokens=rows).nvml_peak / 2**30,
                {s.key: s.saved_gib for s in savings(cfg, max_row_tokens=rows)})
    except Exception:  # unknown model shape, estimator missing: the page works without a prediction
        return None, {}


@lru_cache(maxsize=1)
def chapter_savings() -> dict[str, float]:
    """What each checklist item saves at the chapter's own settings (TrainConfig(): Llama-3.1-8B), shown beside
    the figure for another model: on the tiny demo six of seven items save nothing, which hides the point."""
    return prediction(TrainConfig())[1]


def chapter_gib(cfg: TrainConfig, key: str) -> float | None:
    return None if cfg.model == TrainConfig().model else chapter_savings().get(key)


def predicted_peaks(cfg: TrainConfig | None) -> dict[str, float] | None:
    """core.estimate's peaks for a config, as the result panel compares them: allocated, reserved, nvml (GiB)."""
    if cfg is None:
        return None
    try:
        from core.estimate import estimate

        est = estimate(cfg, max_row_tokens=row_tokens(cfg))
    except Exception:  # noqa: BLE001 - a model the estimator does not know: no prediction shown
        return None
    return {"allocated": est.peak_allocated_gib, "reserved": est.peak_reserved_gib, "nvml": est.total_gib}


def preset_text(name: str, what: str, lang: str) -> str:
    """A preset's label or description: core/presets.py in English, core.i18n otherwise (English if missing)."""
    english = presets.PRESETS[name]["label" if what == "label" else "description"]
    key = f"preset.{name}.{what}"
    return english if lang == DEFAULT_LANGUAGE or key not in EN else t(key, lang)


def preset_choices(lang: str = DEFAULT_LANGUAGE) -> list[tuple[str, str]]:
    return [(preset_text(n, "label", lang), n) for n in presets.names()] + [(t("preset.custom", lang), CUSTOM)]


def preset_descriptions(lang: str = DEFAULT_LANGUAGE) -> str:
    return "\n".join(f"- **{preset_text(n, 'label', lang)}**: {preset_text(n, 'description', lang)}"
                     for n in presets.names())


def preset_of(cfg: TrainConfig) -> str:
    """The preset the form has, as this machine applies it (without CUDA, "fastest" minus its CUDA-only levers
    is still "fastest", not a custom mix)."""
    hw = hardware()
    return presets.matching(cfg) or next((n for n in presets.PRESETS if presets.apply_preset(cfg, n, hw) == cfg),
                                         CUSTOM)


def check_update(item: checklist.ChecklistItem, lang: str, **kw: Any) -> dict:
    return gr.update(label=t(f"checklist.{item.key}.label", lang), info=t(f"checklist.{item.key}.tradeoff", lang), **kw)


def derived(cfg: TrainConfig | None, problems: list[Problem], lang: str = DEFAULT_LANGUAGE) -> list[Any]:
    """What follows from the config: summary, prediction, checklist ticks and facts, preset, script, command."""
    if cfg is None:
        return ([render.summary_html(None, problems, lang=lang), gr.skip()]
                + [check_update(item, lang) for item in checklist.ITEMS] + [gr.skip()] * N_ITEMS
                + [gr.update(choices=preset_choices(lang), label=t("preset.label", lang), info=t("preset.info", lang)),
                   gr.skip(), gr.skip()])
    on = checklist.active(cfg)
    peak, saves = prediction(cfg)
    facts = [render.facts_html(item.key, saves.get(item.key), speed_lines(item.key, cfg, lang), lang,
                               chapter_gib(cfg, item.key)) for item in checklist.ITEMS]
    return ([render.summary_html(cfg, problems, on, predicted_gib=peak, lang=lang), {"gib": peak}]
            + [check_update(item, lang, value=on[item.key]) for item in checklist.ITEMS] + facts
            + [gr.update(value=preset_of(cfg), choices=preset_choices(lang), label=t("preset.label", lang),
                         info=t("preset.info", lang)),
               python_script(cfg), cli_command(cfg)])


def field_values(cfg: TrainConfig) -> list[Any]:
    v = to_values(cfg)
    return [v[name] for name in FIELD_NAMES]


def apply_config(cfg: TrainConfig, lang: str = DEFAULT_LANGUAGE) -> list[Any]:
    return field_values(cfg) + derived(cfg, validate(cfg, hardware()), lang)


def skip_form() -> list[Any]:
    """Leave every field and derived output as it is."""
    return [gr.skip()] * (len(FIELD_NAMES) + N_DERIVED)


def on_fields_changed(lang: str, *values):
    cfg, problems = read_config(values)
    return derived(cfg, problems, lang)


def toggled(cfg: TrainConfig, key: str, on: bool, memory: dict[str, Any]) -> TrainConfig:
    """checklist.toggle, except that undoing this item's last tick or untick (its fields untouched since) gives
    back the user's values from before it: untick and re-tick "Reduce max_seq_length" and 384 stays 384."""
    last = (memory or {}).get(key)
    if last and all(getattr(cfg, f) == v for f, v in last["after"].items()):
        back = cfg.replace(**last["before"])
        if bool(checklist.BY_KEY[key].is_on(back)) == on:
            return back
    return checklist.toggle(cfg, key, on)


def on_checklist(key: str, lang: str, on: bool, memory: dict[str, Any], *values):
    """Tick or untick one checklist item: the governed fields change, then everything derived."""
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        gr.Warning(t("checklist.needs_readable", lang))
        return [gr.skip()] * len(FIELD_NAMES) + derived(None, problems, lang) + [memory]
    new = toggled(cfg, key, bool(on), memory)
    fields = checklist.BY_KEY[key].fields
    memory = {**(memory or {}), key: {"before": {f: getattr(cfg, f) for f in fields},
                                      "after": {f: getattr(new, f) for f in fields}}}
    return apply_config(new, lang) + [memory]


def on_model_check(lang: str, model: str) -> dict:
    """Beside the model field, before Start: a model neither on this machine nor reachable is flagged."""
    problem = model_problem(model)
    return gr.update(info=help_text("model", lang) if problem is None else t(problem[0], lang, **problem[1]))


def on_preset_lever(lang: str, name: str, *values):
    """Apply a memory/speed preset to the current settings (CUDA-only levers left off without CUDA)."""
    if name == CUSTOM:
        return skip_form()
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        gr.Warning(t("checklist.needs_readable", lang))
        return [gr.skip()] * len(FIELD_NAMES) + derived(None, problems, lang)
    applied = presets.apply_preset(cfg, name, hardware())
    dropped = [k for k, v in presets.overrides(name).items() if getattr(applied, k) != v]
    if dropped:  # say so, rather than leave the user wondering why the form differs from the preset
        gr.Info(t("preset.dropped", lang, preset=t(f"preset.{name}.label", lang), levers=", ".join(dropped)))
    return apply_config(applied, lang)


def on_start_from(kind: str, lang: str = DEFAULT_LANGUAGE):
    cfg = demo_config() if kind == "demo" else TrainConfig()
    return apply_config(cfg, lang)


STALE_NOTICES = 3  # the Fit notice, the data preview and the run notice: they describe the settings they saw


def on_load_preset_clearing(kind: str, lang: str = DEFAULT_LANGUAGE):
    """Demo / Chapter recipe buttons: the new settings, and the notices about the old ones cleared."""
    return on_start_from(kind, lang) + [""] * STALE_NOTICES


def fit_budget_gib(budget: float | None) -> tuple[float | None, bool]:
    """(GiB to fit, whether it is a real GPU's free memory). Without a GPU: the hypothetical card's budget."""
    if hardware().cuda:
        gpus, _ = read_gpus()
        if gpus:
            return max(0.0, gpus[0]["total_gib"] - gpus[0]["used_gib"]), True
    return (float(budget) if budget and budget > 0 else None), False


def describe_changes(old: TrainConfig, new: TrainConfig, lang: str) -> list[str]:
    def show(value: Any) -> str:
        return t("fit.on", lang) if value is True else t("fit.off", lang) if value is False else str(value)

    return [f"{label(n, lang)}: {show(getattr(old, n))} → {show(getattr(new, n))}" for n in FIT_FIELDS
            if getattr(old, n) != getattr(new, n)]


def on_fit(lang: str, budget: float | None, *values):
    """"Fit to my GPU": core.estimate.fit_to_gpu on the GPU's free memory (or the hypothetical card's budget)."""
    from core.estimate import FitError, fit_to_gpu
    from core.shapes import ShapeError

    cfg, problems = collect(values_dict(values))
    if cfg is None:
        return skip_form() + [render.problems_html(problems, t("summary.unreadable", lang))]
    gib, real = fit_budget_gib(budget)
    if gib is None:
        msg = t("fit.no_budget", lang)
        gr.Warning(msg)
        return skip_form() + [render.message_html(msg, "warn", "mt-fit-note")]
    shown = render.num(gib, 0 if float(gib).is_integer() else 1, lang)
    where = t("fit.gpu_free" if real else "fit.hypothetical", lang, gib=shown)
    rows = row_tokens(cfg)
    sized = "\n" + (t("fit.lengths_known", lang, n=f"{rows:,}") if rows else t("fit.lengths_unknown", lang))
    try:
        new, est = fit_to_gpu(cfg, int(gib * 2**30), max_row_tokens=rows)
    except FitError as exc:
        msg = t("fit.failed", lang, where=where) + "\n" + str(exc) + sized
        gr.Warning(t("fit.failed", lang, where=where))
        return skip_form() + [render.message_html(msg, "error", "mt-fit-note")]
    except (ShapeError, ValueError, OSError) as exc:
        msg = t("fit.unknown_model", lang, model=cfg.model) + "\n" + str(exc)
        gr.Warning(t("fit.unknown_model", lang, model=cfg.model))
        return skip_form() + [render.message_html(msg, "error", "mt-fit-note")]
    changes = describe_changes(cfg, new, lang)
    peak = render.num(est.total_gib, 1, lang)
    if not changes:
        note = render.message_html(t("fit.unchanged", lang, gib=peak, where=where) + sized, "ok", "mt-fit-note")
    else:
        note = render.message_html(t("fit.changed", lang, gib=peak, where=where) + "\n" + "\n".join(
            f"• {c}" for c in changes) + sized, "ok", "mt-fit-note")
    return apply_config(new, lang) + [note]


def on_start(lang: str, *values):
    """Validate (every problem at once), then start the run in the background, or say why not."""
    cfg, problems = read_config(values)
    if cfg is None or problems:
        gr.Warning(t("msg.not_started", lang, n=len(problems)))
        return render.problems_html(problems, t("msg.not_started_title", lang)), gr.skip(), gr.skip()
    free_try_model()
    try:
        job = MANAGER.start(cfg)
    except JobBusy:
        running = MANAGER.current()
        msg = t("msg.one_job", lang, model=running.config.model if running else "?")
        gr.Warning(msg)
        return render.message_html(msg, "warn"), gr.skip(), gr.skip()
    return (render.message_html(t("msg.started", lang, id=job.id, model=cfg.model, dataset=cfg.dataset), "ok"),
            gr.update(interactive=False), gr.update(interactive=True))


def free_try_model() -> None:
    """Before a GPU run: drop the model "Try it" holds, so the run has the memory the gauge predicted for."""
    if not hardware().cuda:
        return  # the demo model in RAM costs nothing worth a wait
    from core.infer import COMPARER

    if COMPARER.adapter_dir is not None:
        COMPARER.stop()
        try:
            COMPARER.unload()
        except Exception:  # noqa: BLE001 - busy or failed: training still starts, the gauge shows the truth
            pass


def on_stop(lang: str = DEFAULT_LANGUAGE):
    """First Stop: end after the current step and save. Pressed again while stopping: end the process now."""
    was_stopping = (job := MANAGER.current()) is not None and job.stopping
    job = MANAGER.stop()
    if job is None:
        return render.message_html(t("msg.no_run", lang), "info")
    return render.message_html(t("msg.stop_now" if was_stopping else "msg.stopping", lang), "warn")


def on_save_config(lang: str, name: str, *values):
    name = (name or "").strip()
    if name.endswith((".yaml", ".yml")):
        name = name.rsplit(".", 1)[0]
    if not SAFE_NAME.match(name):
        msg = t("config.bad_name", lang, name=repr(name)) if name else t("config.give_name", lang)
        return render.message_html(msg, "error"), gr.skip()
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        return render.problems_html(problems, t("config.not_saved", lang)), gr.skip()
    path = config_dir() / f"{name}.yaml"
    existed = path.exists()
    try:
        cfg.save(path)
    except OSError as exc:
        return render.message_html(f"{path}: {exc}", "error"), gr.skip()
    msg = t("config.replaced" if existed else "config.saved", lang, path=path,
            command=f"python -m core.train --config {path}")
    return render.message_html(msg, "ok"), gr.update(choices=saved_configs(), value=name)


def on_load_config(lang: str, name: str):
    if not name or not SAFE_NAME.match(name):
        return skip_form() + [render.message_html(t("config.pick", lang), "warn")]
    path = config_dir() / f"{name}.yaml"
    try:
        cfg = TrainConfig.load(path)
    except OSError as exc:
        return skip_form() + [render.message_html(f"{path}: {exc}", "error")]
    except ConfigError as exc:
        return skip_form() + [render.problems_html(exc.problems, t("config.not_loaded", lang, path=path))]
    problems = out_of_range(cfg)
    if problems:  # values a widget cannot even show: refuse, keep what is on screen
        return skip_form() + [render.problems_html(problems, t("config.out_of_range", lang, path=path))]
    from core.public import without_remote_code

    cfg, asked = without_remote_code(cfg)  # h2: a file never turns trust_remote_code on by itself
    if asked:
        msg = f'{t("config.loaded", lang, path=path)} {t("config.trust_off", lang, model=cfg.model)}'
        return apply_config(cfg, lang) + [render.message_html(msg, "warn")]
    return apply_config(cfg, lang) + [render.message_html(t("config.loaded", lang, path=path), "ok")]


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
        return render.error_box(t("preview.data_error", lang), str(exc))
    except Exception as exc:  # noqa: BLE001 - keep the page alive whatever the data holds
        return render.error_box(t("preview.read_error", lang), f"{type(exc).__name__}: {exc}")
    try:
        tokenizer = _tokenizer(cfg.model, cfg.trust_remote_code)
    except (ModelError, OSError, ValueError) as exc:
        return render.error_box(t("preview.tokenizer_error", lang), str(exc))
    try:
        return render.preview_html(plan_rows(cfg, tokenizer, raw, fmt, n_examples=3), lang)
    except DataError as exc:
        return render.error_box(t("preview.data_error", lang), str(exc))
    except Exception as exc:  # noqa: BLE001
        return render.error_box(t("preview.read_error", lang), f"{type(exc).__name__}: {exc}")


def on_preview(lang: str, *values):
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


def on_upload(lang: str, file_path, *values):
    """Use an uploaded data file, or, when it is unusable, say why and keep the dataset that was selected."""
    if not file_path:
        return skip_form() + [gr.skip()]
    from core.data import DataError, check_data

    previous = values_dict(values).get("dataset") or ""

    def rejected(msg: str) -> list[Any]:
        kept = t("data.upload_kept", lang, dataset=previous)
        return skip_form() + [render.error_box(t("data.upload_not_used", lang), f"{msg}\n\n{kept}")]

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
        return skip_form() + [render.problems_html(problems, t("preview.cannot", lang))]
    return apply_config(cfg, lang) + [preview(cfg, lang)]


# --- the live run panel ----------------------------------------------------------------------------------------
_zips: dict[int, str] = {}
_job_predictions: dict[int, dict[str, float] | None] = {}


def adapter_zip(job_id: int, adapter_dir: str) -> str | None:
    if job_id not in _zips or not Path(_zips[job_id]).is_file():  # h2: zips older than an hour are pruned
        try:
            _zips[job_id] = str(zip_adapter(adapter_dir))
        except (OSError, ExportError):
            return None
    return _zips[job_id]


def job_prediction(job) -> dict[str, float] | None:
    """What core.estimate predicted for a job's settings (computed once per job)."""
    if job.id not in _job_predictions:
        _job_predictions[job.id] = predicted_peaks(job.config)
    return _job_predictions[job.id]


def thin(points: list[tuple[int, float]], limit: int = PLOT_POINTS) -> list[tuple[int, float]]:
    """At most ~limit points for the plot (every k-th, always the last): a long run must not slow the page."""
    if len(points) <= limit:
        return points
    k = -(-len(points) // limit)
    return points[::k] + ([points[-1]] if (len(points) - 1) % k else [])


def live_update(state: dict | None, lang: str = DEFAULT_LANGUAGE, pred: dict | None = None,
                budget: float | None = None, output_dir: str | None = None):
    """One poll: (gauge, progress, loss plot, log, result, download, start, stop, state).

    Each output is sent only when it changed since this page's last poll (the state keeps a fingerprint of each,
    including the language), so a long run costs the browser one small progress update a second, not a redraw.
    `pred` is the page's prediction state ({"gib": predicted NVML peak of the settings on screen}).
    """
    state = dict(state or {})
    sent = dict(state.get("sent") or {})
    job = MANAGER.current()
    if job is None and output_dir and not state.get("looked_for_old"):
        state["looked_for_old"] = True
        last = latest_run_dir(output_dir)
        job = MANAGER.load_run(last) if last else None
    gpus, message = read_gpus()
    if job is not None and gpus:
        job.note_gpu_used(gpus[0]["used_gib"])
    peak = job.gpu_peak_gib if job is not None and job.gpu_peak_gib else None
    running = job is not None and job.running
    predicted = (pred or {}).get("gib")
    if running:  # during a run, mark what was predicted for the run, not for whatever the form shows now
        predicted = (job_prediction(job) or {}).get("nvml")
    outputs: dict[str, tuple[Any, Any]] = {
        "gauge": (render.gauge_html(gpus, message, run_peak_gib=peak, predicted_gib=predicted, lang=lang,
                                    running=running, budget_gib=budget), None)}

    v = job_view(job)
    points = thin(v.losses)
    frame = pd.DataFrame({"step": [p[0] for p in points], "loss": [p[1] for p in points]})
    outputs["plot"] = (gr.update(value=frame, visible=True) if points else gr.update(visible=False),
                       (job.id if job else None, len(v.losses), v.losses[-1] if v.losses else None))
    tail = v.log[-LOG_LINES:]
    outputs["progress"] = (render.progress_html(v, lang), None)
    outputs["log"] = (render.log_html(tail, lang), (lang, job.id if job else None, len(v.log), tail[-1] if tail else None))
    done = v.state in ("completed", "stopped", "failed", "interrupted")
    outputs["result"] = (render.result_html(v, lang, job_prediction(job) if done and job else None), None)
    download = gr.update(value=None, visible=False)
    if job is not None and v.adapter_dir and v.state in ("completed", "stopped") and Path(v.adapter_dir).is_dir():
        path = adapter_zip(job.id, v.adapter_dir)
        if path:
            download = gr.update(value=path, visible=True)
    outputs["download"] = (download, (job.id if job else None, v.state, v.adapter_dir))
    outputs["start"] = (gr.update(interactive=not running), ("start", running))
    outputs["stop"] = (gr.update(interactive=running), ("stop", running))

    result = []
    for name in ("gauge", "progress", "plot", "log", "result", "download", "start", "stop"):
        value, fingerprint = outputs[name]
        fingerprint = repr(fingerprint if fingerprint is not None else value)
        result.append(gr.skip() if sent.get(name) == fingerprint else value)
        sent[name] = fingerprint
    state["sent"] = sent
    return result + [state]


# --- the page -------------------------------------------------------------------------------------------------------
def browser_language(request: gr.Request):
    """On page load: the language picker follows the browser's Accept-Language (en, pt or fr)."""
    return gr.update(value=request_language(request))


def header_html(lang: str = DEFAULT_LANGUAGE) -> str:
    hw = hardware()
    if hw.cuda:
        gpus, _ = read_gpus()
        where = ", ".join(f"{g['name']} ({g['total_gib']:.0f} GiB)" for g in gpus) or "CUDA GPU"
        line = render.E(t("app.gpu_line", lang, gpus=where))
    else:
        line = render.E(t("app.no_gpu_line", lang))
    from core.public import is_public, public_root

    banner = (f'<p id="mt-public" class="mt-warn"><b>{render.E(t("public.banner", lang, root=public_root()))}</b></p>'
              if is_public() else "")  # h2: public mode says so on every page
    return (f'<div id="mt-header"><h1>memtune</h1><p>{render.E(t("app.tagline", lang))}</p>'
            f'<p id="mt-hw">{line}</p>{banner}</div>')


def build_ui(initial: TrainConfig | None = None) -> gr.Blocks:
    """Build the page without launching it."""
    from ui import after

    cfg0 = initial or initial_config()
    v0 = to_values(cfg0)
    lang0 = DEFAULT_LANGUAGE
    L = partial(t, lang=lang0)
    FIELDS: dict[str, gr.components.Component] = {}
    tr = Translations()

    def w(name: str, **kw: Any) -> gr.components.Component:
        assert name not in FIELDS, name
        FIELDS[name] = tr.add(make_widget(name, v0[name], **kw),
                              label=partial(label, name), info=partial(help_text, name))
        return FIELDS[name]

    with gr.Blocks(title=L("app.title"), analytics_enabled=False) as demo:
        with gr.Row(equal_height=False, elem_id="mt-top"):
            tr.add(gr.HTML(header_html(lang0), elem_id="mt-header-box"), value=header_html)
            lang = gr.Dropdown(choices=language_choices(), value=lang0, label=L("app.language"), scale=0,
                               min_width=170, elem_id="lang-select", interactive=True)
            tr.add(lang, label="app.language")
        tab_state = gr.State({})
        pred_state = gr.State({"gib": prediction(cfg0)[0]})
        with gr.Tabs(elem_id="main-tabs", **TABS_KW) as main_tabs:
            with gr.Tab(L("tab.train"), id="tab-train", elem_id="tab-train") as train_tab:
                tr.add(train_tab, label="tab.train")
                with gr.Row(equal_height=False):
                    # ---------------- settings ----------------
                    with gr.Column(scale=3, min_width=480):
                        with gr.Tabs(elem_id="settings-tabs", **TABS_KW):
                            with gr.Tab(L("tab.data"), id="tab-data", elem_id="tab-data") as tab_data:
                                tr.add(tab_data, label="tab.data")
                                with gr.Row():
                                    demo_btn = tr.add(gr.Button(L("preset.demo"), size="sm", elem_id="preset-demo"),
                                                      value="preset.demo")
                                    chapter_btn = tr.add(gr.Button(L("preset.chapter"), size="sm",
                                                                   elem_id="preset-chapter"), value="preset.chapter")
                                with gr.Row():
                                    w("model", choices=model_choices(cfg0.model), scale=4)
                                    refresh_btn = tr.add(gr.Button(L("data.rescan"), size="sm", scale=1,
                                                                   elem_id="rescan-btn"), value="data.rescan")
                                w("dataset", choices=dataset_choices(cfg0.dataset))
                                with gr.Row():  # a row of their own: four columns left long_prompts' box too narrow
                                    w("dataset_split", scale=1)
                                    w("dataset_format", scale=1)
                                    w("long_prompts", scale=1)
                                types = ", ".join(DATA_TYPES)
                                upload = tr.add(gr.File(label=t("data.upload", lang0, types=types),
                                                        file_types=DATA_TYPES, type="filepath", elem_id="data-upload",
                                                        height=120),
                                                label=lambda lg: t("data.upload", lg, types=types))
                                preview_btn = tr.add(gr.Button(L("data.preview"), elem_id="preview-btn"),
                                                     value="data.preview")
                                preview_out = gr.HTML(elem_id="data-preview")

                            with gr.Tab(L("tab.checklist"), id="tab-checklist", elem_id="tab-checklist") as tab_check:
                                tr.add(tab_check, label="tab.checklist")
                                tr.add(gr.Markdown(L("checklist.intro"), elem_id="checklist-intro"),
                                       value="checklist.intro")
                                with gr.Row():
                                    preset = gr.Radio(choices=preset_choices(lang0), value=preset_of(cfg0),
                                                      label=L("preset.label"), info=L("preset.info"),
                                                      elem_id="preset-radio")
                                tr.add(gr.Markdown(preset_descriptions(lang0), elem_classes=["mt-small"],
                                                   elem_id="preset-descriptions"), value=preset_descriptions)
                                on0 = checklist.active(cfg0)
                                peak0, saves0 = prediction(cfg0)
                                checks: list[gr.Checkbox] = []
                                facts: list[gr.HTML] = []
                                for item in checklist.ITEMS:
                                    with gr.Row(elem_classes=["mt-check-row"], equal_height=False):
                                        with gr.Column(scale=3, min_width=260):
                                            checks.append(gr.Checkbox(
                                                value=on0[item.key], label=L(f"checklist.{item.key}.label"),
                                                info=L(f"checklist.{item.key}.tradeoff"),
                                                elem_id=f"check-{item.key}", elem_classes=["mt-check"]))
                                            facts.append(gr.HTML(render.facts_html(
                                                item.key, saves0.get(item.key), speed_lines(item.key, cfg0, lang0),
                                                lang0, chapter_gib(cfg0, item.key)), elem_id=f"check-facts-{item.key}", padding=False))
                                        with gr.Column(scale=2, min_width=220):
                                            for name in GOVERNS.get(item.key, []):
                                                w(name)
                                with gr.Accordion(L("checklist.beyond"), open=False, elem_id="beyond-acc") as beyond:
                                    tr.add(beyond, label="checklist.beyond")
                                    for name in BEYOND:
                                        if name in v0:
                                            w(name)

                            with gr.Tab(L("tab.training"), id="tab-training", elem_id="tab-training") as tab_train:
                                tr.add(tab_train, label="tab.training")
                                with gr.Row():
                                    w("lora_r")
                                    w("lora_alpha")
                                    w("lora_dropout")
                                w("lora_target_modules")
                                with gr.Row():
                                    w("learning_rate")
                                    w("num_train_epochs")
                                    w("max_steps")
                                with gr.Row():
                                    w("save_strategy")
                                    w("save_steps")
                                with gr.Row():
                                    w("output_dir")
                                    w("run_name")
                                with gr.Accordion(L("training.advanced"), open=False, elem_id="advanced-acc") as adv:
                                    tr.add(adv, label="training.advanced")
                                    # Every field not shown elsewhere, so a new TrainConfig field always gets a widget.
                                    elsewhere = set(PLACED) | set(BEYOND) | {n for ns in GOVERNS.values() for n in ns}
                                    rest = [n for n in FIELD_NAMES if n not in elsewhere]
                                    for i in range(0, len(rest), 3):
                                        with gr.Row():
                                            for name in rest[i:i + 3]:
                                                w(name, **({"placeholder": L("training.resume_placeholder")}
                                                           if name == "resume_from" else {}))

                            with gr.Tab(L("tab.code"), id="tab-code", elem_id="tab-code") as tab_code:
                                tr.add(tab_code, label="tab.code")
                                with gr.Row():
                                    cfg_name = gr.Textbox(label=L("config.name"), placeholder=L("config.name_placeholder"),
                                                          max_lines=1, scale=2, elem_id="config-name",
                                                          info=t("config.name_info", lang0, dir=config_dir()))
                                    tr.add(cfg_name, label="config.name", placeholder="config.name_placeholder",
                                           info=lambda lg: t("config.name_info", lg, dir=config_dir()))
                                    save_btn = tr.add(gr.Button(L("config.save"), scale=1, elem_id="save-config-btn"),
                                                      value="config.save")
                                with gr.Row():
                                    cfg_list = tr.add(gr.Dropdown(choices=saved_configs(), value=None,
                                                                  label=L("config.saved_list"), scale=2,
                                                                  elem_id="config-list"), label="config.saved_list")
                                    load_btn = tr.add(gr.Button(L("config.load"), scale=1, elem_id="load-config-btn"),
                                                      value="config.load")
                                cfg_notice = gr.HTML(elem_id="config-notice")
                                tr.add(gr.Markdown(L("code.intro"), elem_id="code-intro"), value="code.intro")
                                code_cli = tr.add(gr.Code(cli_command(cfg0), language="shell", label=L("code.cli"),
                                                          interactive=False, elem_id="code-cli", lines=2),
                                                  label="code.cli")
                                code_py = tr.add(gr.Code(python_script(cfg0), language="python", label=L("code.python"),
                                                         interactive=False, elem_id="code-python", max_lines=40),
                                                 label="code.python")

                    # ---------------- run panel ----------------
                    with gr.Column(scale=2, min_width=380, elem_id="mt-run-panel"):
                        gauge = gr.HTML(render.gauge_html(*read_gpus(), predicted_gib=peak0, lang=lang0,
                                                          budget_gib=DEFAULT_BUDGET_GIB), elem_id="vram-gauge")
                        with gr.Row(equal_height=False, elem_id="fit-row"):
                            budget = gr.Number(value=DEFAULT_BUDGET_GIB, minimum=1, maximum=2048, step=1,
                                               label=L("fit.budget"), info=L("fit.budget_info"), scale=3,
                                               min_width=200, visible=not hardware().cuda, elem_id="fit-budget")
                            tr.add(budget, label="fit.budget", info="fit.budget_info")
                            fit_btn = tr.add(gr.Button(L("fit.button"), scale=2, min_width=150, elem_id="fit-btn"),
                                             value="fit.button")
                        fit_note = gr.HTML(elem_id="fit-notice")
                        summary = gr.HTML(render.summary_html(cfg0, validate(cfg0, hardware()), on0,
                                                              predicted_gib=peak0, lang=lang0), elem_id="config-summary")
                        with gr.Row():
                            start_btn = tr.add(gr.Button(L("run.start"), variant="primary", elem_id="start-btn"),
                                               value="run.start")
                            stop_btn = tr.add(gr.Button(L("run.stop"), variant="stop", elem_id="stop-btn",
                                                        interactive=False), value="run.stop")
                        notice = gr.HTML(elem_id="run-notice")
                        progress = gr.HTML(render.progress_html(job_view(None), lang0), elem_id="run-progress")
                        loss_plot = gr.LinePlot(pd.DataFrame({"step": [], "loss": []}), x="step", y="loss",
                                                title=None, y_title=L("run.loss_axis"), x_title=L("run.step_axis"),
                                                height=230, elem_id="loss-plot", label=L("run.loss_curve"),
                                                show_label=False, visible=False)
                        tr.add(loss_plot, y_title="run.loss_axis", x_title="run.step_axis", label="run.loss_curve")
                        log = gr.HTML(render.log_html([], lang0), elem_id="run-log", padding=False)
                        result = gr.HTML(elem_id="run-result")
                        download = tr.add(gr.File(label=L("run.download"), visible=False, interactive=False,
                                                  elem_id="adapter-download"), label="run.download")

            assert set(FIELDS) == set(FIELD_NAMES), set(FIELD_NAMES) ^ set(FIELDS)
            inputs = [FIELDS[n] for n in FIELD_NAMES]
            derived_out = [summary, pred_state, *checks, *facts, preset, code_py, code_cli]
            assert len(derived_out) == N_DERIVED
            form_out = inputs + derived_out
            tabs = after.build_tabs(lang0, tr, main_tabs, lang, FIELDS["output_dir"], inputs, form_out, cfg0)

        quiet = dict(show_progress="hidden", queue=True)
        for comp in inputs:
            comp.input(on_fields_changed, inputs=[lang, *inputs], outputs=derived_out, **quiet)
            if isinstance(comp, (gr.Textbox, gr.Dropdown)):  # a paste may not fire `input`; leaving the box does
                comp.blur(on_fields_changed, inputs=[lang, *inputs], outputs=derived_out, **quiet)
                if isinstance(comp, gr.Textbox):
                    comp.submit(on_fields_changed, inputs=[lang, *inputs], outputs=derived_out, **quiet)
        FIELDS["model"].change(on_model_check, inputs=[lang, FIELDS["model"]], outputs=[FIELDS["model"]],
                               show_progress="hidden")
        check_memory = gr.State({})  # per page: what each checklist box changed last, so unticking can undo it
        for item, box in zip(checklist.ITEMS, checks):
            box.input(partial(on_checklist, item.key), inputs=[lang, box, check_memory, *inputs],
                      outputs=form_out + [check_memory], **quiet)
        preset.input(on_preset_lever, inputs=[lang, preset, *inputs], outputs=form_out, **quiet)
        stale = [fit_note, preview_out, notice]
        assert len(stale) == STALE_NOTICES
        demo_btn.click(partial(on_load_preset_clearing, "demo"), inputs=[lang], outputs=form_out + stale, **quiet)
        chapter_btn.click(partial(on_load_preset_clearing, "chapter"), inputs=[lang], outputs=form_out + stale,
                          **quiet)
        for name in ("model", "dataset", "dataset_split", "dataset_format", "max_length"):
            # A user's edit (not a handler's own update, e.g. Fit or an upload): what described the old value goes.
            FIELDS[name].input(lambda: [""] * STALE_NOTICES, outputs=stale, show_progress="hidden")
        refresh_btn.click(lambda m, d: (gr.update(choices=model_choices(m)), gr.update(choices=dataset_choices(d))),
                          inputs=[FIELDS["model"], FIELDS["dataset"]], outputs=[FIELDS["model"], FIELDS["dataset"]])
        preview_btn.click(on_preview, inputs=[lang, *inputs], outputs=[preview_out])
        upload.upload(on_upload, inputs=[lang, upload, *inputs], outputs=form_out + [preview_out])
        save_btn.click(on_save_config, inputs=[lang, cfg_name, *inputs], outputs=[cfg_notice, cfg_list])
        load_btn.click(on_load_config, inputs=[lang, cfg_list], outputs=form_out + [cfg_notice])
        fit_btn.click(on_fit, inputs=[lang, budget, *inputs], outputs=form_out + [fit_note])

        start_btn.click(on_start, inputs=[lang, *inputs], outputs=[notice, start_btn, stop_btn])
        stop_btn.click(on_stop, inputs=[lang], outputs=[notice])

        live_out = [gauge, progress, loss_plot, log, result, download, start_btn, stop_btn, tab_state]
        poll = partial(live_update, output_dir=cfg0.output_dir)
        timer = gr.Timer(1.0)
        timer.tick(poll, inputs=[tab_state, lang, pred_state, budget], outputs=live_out, show_progress="hidden",
                   concurrency_limit=None)
        demo.load(lambda s, lg, p, b: poll({}, lg, p, b), inputs=[tab_state, lang, pred_state, budget],
                  outputs=live_out, show_progress="hidden")

        # Language: the browser's on load, the picker afterwards; everything written re-renders.
        relabel = tr.components
        one_off = [notice, fit_note, cfg_notice]  # one-off notices written in the old language: cleared
        lang_out = relabel + derived_out + tabs.language_outputs + one_off

        def on_language(lg: str, *values):
            lg = lg if lg in EN_LANGS else DEFAULT_LANGUAGE
            cfg, problems = read_config(values[:len(FIELD_NAMES)])
            return (tr.updates(lg) + derived(cfg, problems, lg) + tabs.language_updates(lg, *values[len(FIELD_NAMES):])
                    + [""] * len(one_off))

        lang.change(on_language, inputs=[lang, *inputs, *tabs.language_inputs], outputs=lang_out,
                    show_progress="hidden")
        demo.load(browser_language, inputs=None, outputs=[lang], show_progress="hidden")
    demo.memtune_fields = FIELDS  # for tests: field name -> component
    demo.memtune_translations = tr
    return demo


EN_LANGS = {code for _, code in language_choices()}
