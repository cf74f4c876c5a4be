"""The memtune page: `build_ui()` returns the Blocks (app.py launches it).

Layout: settings tabs on the left (model and data, the memory checklist, training, settings and code), the run
panel on the right (GPU gauge, summary, Start/Stop, progress, loss curve, log, result). Every TrainConfig field
has exactly one widget (`FIELDS[name]`), and every handler reads the config from the widgets, so what is on
screen is what trains. Live parts are driven by one gr.Timer per page polling the process-wide job manager;
nothing about the run lives in the page, so reloading it reattaches.
"""

from __future__ import annotations

import os
import re
import shutil
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from core import checklist, presets
from core.codegen import cli_command, python_script
from core.config import (DEMO_DATASET, SAFE_NAME, ConfigError, Hardware, Problem, TrainConfig, demo_config,
                         validate)
from core.jobs import MANAGER, JobBusy, job_view, latest_run_dir, zip_adapter
from ui import render
from ui.fields import FIELD_NAMES, collect, out_of_range, dataset_choices, make_widget, model_choices, to_values
from ui.live import read_gpus

DATA_TYPES = [".jsonl", ".json", ".csv", ".parquet", ".txt"]
# Where fields are shown (everything else goes to Training > Advanced):
GOVERNS = {  # checklist item -> the non-checkbox fields it governs, shown beside it
    "qlora": ["bnb_4bit_quant_type", "bnb_4bit_use_double_quant"],
    "gradient_accumulation": ["gradient_accumulation_steps"],
    "efficient_optimizer": ["optim"], "bf16": ["precision"],
    "short_max_length": ["max_length"], "small_batches": ["per_device_train_batch_size"],
}
BEYOND = ["packing", "upcast_to_fp32", "offload_embeddings", "attention", "expandable_segments", "use_liger_kernel"]
PLACED = ["model", "dataset", "dataset_split", "dataset_format", "lora_r", "lora_alpha", "lora_dropout",
          "lora_target_modules", "learning_rate", "num_train_epochs", "max_steps", "save_strategy", "save_steps",
          "output_dir", "run_name"]
CUSTOM = "custom"
PRESET_INFO = "Sets only the memory and speed levers; model, data, learning rate and max length stay yours."
LOG_LINES = 400
PLOT_POINTS = 400


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


# --- pure handlers (tested without a browser) ----------------------------------------------------------------------
def values_dict(values) -> dict[str, Any]:
    return dict(zip(FIELD_NAMES, values))


def read_config(values) -> tuple[TrainConfig | None, list[Problem]]:
    """Widget values -> (config, problems): problems are unreadable values or failed validation."""
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        return None, problems
    return cfg, validate(cfg, hardware())


def prediction(cfg: TrainConfig) -> tuple[float | None, dict[str, str]]:
    """Predicted peak GPU memory (GiB) and what each checklist item saves here, from core.estimate; advice only."""
    try:
        from core.estimate import estimate, savings

        return estimate(cfg).nvml_peak / 2**30, {s.key: s.text for s in savings(cfg)}
    except Exception:  # unknown model shape, estimator missing: the page works without a prediction
        return None, {}


def preset_choices() -> list[tuple[str, str]]:
    return [(presets.PRESETS[n]["label"], n) for n in presets.names()] + [("Custom mix", CUSTOM)]


def preset_of(cfg: TrainConfig) -> str:
    return presets.matching(cfg) or CUSTOM


def on_preset_lever(name: str, *values):
    """Apply a memory/speed preset to the current settings (CUDA-only levers left off without CUDA)."""
    if name == CUSTOM:
        return [gr.skip()] * (len(FIELD_NAMES) + len(checklist.ITEMS) + 4)
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        gr.Warning("Fix the settings listed in the summary first.")
        return [gr.skip()] * len(FIELD_NAMES) + derived(None, problems)
    return apply_config(presets.apply_preset(cfg, name, hardware()))


def item_info(item: checklist.ChecklistItem, saving: str | None) -> str:
    return f"{item.tradeoff} At these settings: {saving}." if saving else item.tradeoff


def derived(cfg: TrainConfig | None, problems: list[Problem]) -> list[Any]:
    """What follows from the config: summary, checklist ticks (and savings), Python script, CLI command."""
    if cfg is None:
        return [render.summary_html(None, problems)] + [gr.skip()] * (len(checklist.ITEMS) + 3)
    on = checklist.active(cfg)
    peak, saves = prediction(cfg)
    return ([render.summary_html(cfg, problems, on, predicted_gib=peak)]
            + [gr.update(value=on[item.key], info=item_info(item, saves.get(item.key))) for item in checklist.ITEMS]
            + [preset_of(cfg), python_script(cfg), cli_command(cfg)])


def field_values(cfg: TrainConfig) -> list[Any]:
    v = to_values(cfg)
    return [v[name] for name in FIELD_NAMES]


def on_fields_changed(*values):
    cfg, problems = read_config(values)
    return derived(cfg, problems)


def on_checklist(key: str, on: bool, *values):
    """Tick or untick one checklist item: the governed fields change, then everything derived."""
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        gr.Warning("Fix the settings listed in the summary first; the checklist needs readable settings.")
        return [gr.skip()] * len(FIELD_NAMES) + derived(None, problems)
    new = checklist.toggle(cfg, key, bool(on))
    return field_values(new) + derived(new, validate(new, hardware()))


def apply_config(cfg: TrainConfig) -> list[Any]:
    return field_values(cfg) + derived(cfg, validate(cfg, hardware()))


def on_start_from(kind: str):
    cfg = demo_config() if kind == "demo" else TrainConfig()
    return apply_config(cfg)


def on_start(*values):
    """Validate (every problem at once), then start the run in the background, or say why not."""
    cfg, problems = read_config(values)
    if cfg is None or problems:
        gr.Warning(f"Not started: {len(problems)} problem(s) in the settings, listed under Start.")
        return render.problems_html(problems, "Not started: fix these settings"), gr.skip(), gr.skip()
    try:
        job = MANAGER.start(cfg)
    except JobBusy as exc:
        gr.Warning(str(exc))
        return render.message_html(str(exc), "warn"), gr.skip(), gr.skip()
    return (render.message_html(f"Run {job.id} started: {cfg.model} on {cfg.dataset}.", "ok"),
            gr.update(interactive=False), gr.update(interactive=True))


def on_stop():
    job = MANAGER.stop()
    if job is None:
        return render.message_html("No run is in progress.", "info")
    return render.message_html("Stopping: the run ends after the current step and saves the adapter.", "warn")


def on_save_config(name: str, *values):
    name = (name or "").strip()
    if name.endswith((".yaml", ".yml")):
        name = name.rsplit(".", 1)[0]
    if not SAFE_NAME.match(name):
        msg = (f"{name!r} is not a usable name: use 1-64 letters, digits, dots, dashes or underscores, starting "
               "with a letter or digit (no slashes or spaces).") if name else "Give the settings a name first."
        return render.message_html(msg, "error"), gr.skip()
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        return render.problems_html(problems, "Not saved: these settings cannot be read"), gr.skip()
    path = config_dir() / f"{name}.yaml"
    existed = path.exists()
    try:
        cfg.save(path)
    except OSError as exc:
        return render.message_html(f"Could not write {path}: {exc}", "error"), gr.skip()
    msg = (f"{'Replaced' if existed else 'Saved'} {path}. Train it headless with:\n"
           f"python -m core.train --config {path}")
    return render.message_html(msg, "ok"), gr.update(choices=saved_configs(), value=name)


def on_load_config(name: str):
    n_out = len(FIELD_NAMES) + len(checklist.ITEMS) + 4
    if not name or not SAFE_NAME.match(name):
        return [gr.skip()] * n_out + [render.message_html("Pick a saved configuration first.", "warn")]
    path = config_dir() / f"{name}.yaml"
    try:
        cfg = TrainConfig.load(path)
    except OSError as exc:
        return [gr.skip()] * n_out + [render.message_html(f"Could not read {path}: {exc}", "error")]
    except ConfigError as exc:
        return [gr.skip()] * n_out + [render.problems_html(exc.problems, f"Not loaded: {path} has problems")]
    problems = out_of_range(cfg)
    if problems:  # values a widget cannot even show: refuse, keep what is on screen
        return [gr.skip()] * n_out + [render.problems_html(problems, f"Not loaded: {path} has values out of range")]
    return apply_config(cfg) + [render.message_html(f"Loaded {path}.", "ok")]


@lru_cache(maxsize=4)
def _tokenizer(model: str, trust_remote_code: bool):
    from core.model import load_tokenizer

    return load_tokenizer(TrainConfig(model=model, trust_remote_code=trust_remote_code))


def preview(cfg: TrainConfig) -> str:
    """Formatted examples + token-length histogram, or the engine's message in place."""
    from core.data import DataError, preview_dataset
    from core.model import ModelError

    try:
        tokenizer = _tokenizer(cfg.model, cfg.trust_remote_code)
    except (ModelError, OSError, ValueError) as exc:
        return render.error_box("The model's tokenizer could not be loaded", str(exc))
    try:
        return render.preview_html(preview_dataset(cfg, tokenizer, n=3))
    except DataError as exc:
        return render.error_box("The data cannot be used as it is", str(exc))
    except Exception as exc:  # noqa: BLE001 - keep the page alive whatever the data holds
        return render.error_box("The data could not be read", f"{type(exc).__name__}: {exc}")


def on_preview(*values):
    cfg, problems = collect(values_dict(values))
    if cfg is None:
        return render.problems_html(problems, "Cannot preview: fix these settings")
    return preview(cfg)


def store_upload(file_path: str) -> Path:
    src = Path(file_path)
    if src.suffix.lower() not in DATA_TYPES:
        raise ValueError(f"{src.name}: memtune reads {', '.join(DATA_TYPES)} files")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", src.name).lstrip(".") or f"data{src.suffix}"
    dest = upload_dir() / safe
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return dest


def on_upload(file_path, *values):
    n_rest = len(FIELD_NAMES) + len(checklist.ITEMS) + 4
    if not file_path:
        return [gr.skip()] * (n_rest + 1)
    try:
        dest = store_upload(file_path)
    except (OSError, ValueError) as exc:
        return [gr.skip()] * n_rest + [render.error_box("Upload not used", str(exc))]
    vals = values_dict(values)
    vals.update(dataset=str(dest), dataset_split="train", dataset_format="auto")
    cfg, problems = collect(vals)
    if cfg is None:
        return [gr.skip()] * n_rest + [render.problems_html(problems, "Cannot preview: fix these settings")]
    return apply_config(cfg) + [preview(cfg)]


# --- the live run panel ----------------------------------------------------------------------------------------
_zips: dict[int, str] = {}


def adapter_zip(job_id: int, adapter_dir: str) -> str | None:
    if job_id not in _zips:
        try:
            _zips[job_id] = str(zip_adapter(adapter_dir))
        except OSError:
            return None
    return _zips[job_id]


def thin(points: list[tuple[int, float]], limit: int = PLOT_POINTS) -> list[tuple[int, float]]:
    """At most ~limit points for the plot (every k-th, always the last): a long run must not slow the page."""
    if len(points) <= limit:
        return points
    k = -(-len(points) // limit)
    return points[::k] + ([points[-1]] if (len(points) - 1) % k else [])


def live_update(state: dict | None, output_dir: str | None = None):
    """One poll: (gauge, progress, loss plot, log, result, download, start, stop, state).

    Each output is sent only when it changed since this page's last poll (the state keeps a fingerprint of each),
    so a long run costs the browser one small progress update a second, not a redraw of everything.
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
    outputs: dict[str, tuple[Any, Any]] = {"gauge": (render.gauge_html(gpus, message, run_peak_gib=peak), None)}

    v = job_view(job)
    points = thin(v.losses)
    frame = pd.DataFrame({"step": [p[0] for p in points], "loss": [p[1] for p in points]})
    outputs["plot"] = (gr.update(value=frame, visible=True) if points else gr.update(visible=False),
                       (job.id if job else None, len(v.losses), v.losses[-1] if v.losses else None))
    tail = v.log[-LOG_LINES:]
    outputs["progress"] = (render.progress_html(v), None)
    outputs["log"] = (render.log_html(tail), (job.id if job else None, len(v.log), tail[-1] if tail else None))
    outputs["result"] = (render.result_html(v), None)
    download = gr.update(value=None, visible=False)
    if job is not None and v.adapter_dir and v.state in ("completed", "stopped") and Path(v.adapter_dir).is_dir():
        path = adapter_zip(job.id, v.adapter_dir)
        if path:
            download = gr.update(value=path, visible=True)
    outputs["download"] = (download, (job.id if job else None, v.state, v.adapter_dir))
    running = job is not None and job.running
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
def header_html(cfg: TrainConfig) -> str:
    hw = hardware()
    if hw.cuda:
        gpus, _ = read_gpus()
        where = ", ".join(f"{g['name']} ({g['total_gib']:.0f} GiB)" for g in gpus) or "CUDA GPU"
        line = f"GPU: {where}. Opened on the chapter's recipe (QLoRA on Llama-3.1-8B)."
    else:
        line = ("No CUDA GPU here: opened on the <b>offline demo</b> (a tiny model that learns English &rarr; French "
                "words in about a minute on the CPU). Press <b>Start</b> to try it.")
    return (f'<div id="mt-header"><h1>memtune</h1><p>QLoRA fine-tuning on your own GPU, with the memory checklist '
            f'in front of you.</p><p id="mt-hw">{line}</p></div>')


def build_ui(initial: TrainConfig | None = None) -> gr.Blocks:
    """Build the page without launching it."""
    cfg0 = initial or initial_config()
    v0 = to_values(cfg0)
    FIELDS: dict[str, gr.components.Component] = {}

    def w(name: str, **kw: Any) -> gr.components.Component:
        assert name not in FIELDS, name
        FIELDS[name] = make_widget(name, v0[name], **kw)
        return FIELDS[name]

    with gr.Blocks(title="memtune: QLoRA fine-tuning", analytics_enabled=False) as demo:
        gr.HTML(header_html(cfg0))
        tab_state = gr.State({})
        with gr.Row(equal_height=False):
            # ---------------- settings ----------------
            with gr.Column(scale=3, min_width=480):
                with gr.Tabs(elem_id="settings-tabs"):
                    with gr.Tab("1 · Model & data", id="tab-data", elem_id="tab-data"):
                        with gr.Row():
                            demo_btn = gr.Button("Start from the offline demo", size="sm", elem_id="preset-demo")
                            chapter_btn = gr.Button("Start from the chapter's recipe (GPU)", size="sm", elem_id="preset-chapter")
                        with gr.Row():
                            w("model", choices=model_choices(cfg0.model), scale=4)
                            refresh_btn = gr.Button("↻ Rescan cache", size="sm", scale=1, elem_id="rescan-btn")
                        with gr.Row():
                            w("dataset", choices=dataset_choices(cfg0.dataset), scale=3)
                            w("dataset_split", scale=1)
                            w("dataset_format", scale=1)
                        upload = gr.File(label=f"…or upload a data file ({', '.join(DATA_TYPES)})",
                                         file_types=DATA_TYPES, type="filepath", elem_id="data-upload", height=120)
                        preview_btn = gr.Button("Preview the data as it will be trained", elem_id="preview-btn")
                        preview_out = gr.HTML(elem_id="data-preview")

                    with gr.Tab("2 · Memory checklist", id="tab-checklist", elem_id="tab-checklist"):
                        gr.Markdown("The chapter's seven memory savers, in its order. Ticking one changes the "
                                    "settings it governs (shown on the right); the summary and the code follow.")
                        with gr.Row():
                            preset = gr.Radio(choices=preset_choices(), value=preset_of(cfg0), label="Preset",
                                              info=PRESET_INFO, elem_id="preset-radio")
                        gr.Markdown("\n".join(f"- **{presets.PRESETS[n]['label']}**: {presets.describe(n)}"
                                               for n in presets.names()), elem_classes=["mt-small"])
                        on0 = checklist.active(cfg0)
                        peak0, saves0 = prediction(cfg0)
                        checks: list[gr.Checkbox] = []
                        for item in checklist.ITEMS:
                            with gr.Row(elem_classes=["mt-check-row"], equal_height=False):
                                with gr.Column(scale=3, min_width=260):
                                    checks.append(gr.Checkbox(value=on0[item.key], label=item.label,
                                                              info=item_info(item, saves0.get(item.key)),
                                                              elem_id=f"check-{item.key}", elem_classes=["mt-check"]))
                                with gr.Column(scale=2, min_width=220):
                                    for name in GOVERNS.get(item.key, []):
                                        w(name)
                        with gr.Accordion("Beyond the chapter: memtune's measured extras", open=False,
                                          elem_id="beyond-acc"):
                            for name in BEYOND:
                                if name in v0:
                                    w(name)

                    with gr.Tab("3 · Training", id="tab-training", elem_id="tab-training"):
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
                        with gr.Accordion("Advanced", open=False, elem_id="advanced-acc"):
                            # Every field not shown elsewhere, so a new TrainConfig field always gets a widget.
                            elsewhere = set(PLACED) | set(BEYOND) | {n for ns in GOVERNS.values() for n in ns}
                            rest = [n for n in FIELD_NAMES if n not in elsewhere]
                            for i in range(0, len(rest), 3):
                                with gr.Row():
                                    for name in rest[i:i + 3]:
                                        w(name, **({"placeholder": "e.g. runs/run-20260101-120000"}
                                                   if name == "resume_from" else {}))

                    with gr.Tab("4 · Settings & code", id="tab-code", elem_id="tab-code"):
                        with gr.Row():
                            cfg_name = gr.Textbox(label="Name", placeholder="my-run", max_lines=1, scale=2,
                                                  elem_id="config-name",
                                                  info=f"Saved as YAML under {config_dir()}/")
                            save_btn = gr.Button("Save settings", scale=1, elem_id="save-config-btn")
                        with gr.Row():
                            cfg_list = gr.Dropdown(choices=saved_configs(), value=None, label="Saved settings",
                                                   scale=2, elem_id="config-list")
                            load_btn = gr.Button("Load", scale=1, elem_id="load-config-btn")
                        cfg_notice = gr.HTML(elem_id="config-notice")
                        gr.Markdown("**Show code**: the same run as a command and as a standalone script "
                                    "(the chapter's script, corrected for today's transformers, peft and TRL).")
                        code_cli = gr.Code(cli_command(cfg0), language="shell", label="Command line",
                                           interactive=False, elem_id="code-cli", lines=2)
                        code_py = gr.Code(python_script(cfg0), language="python", label="Python script",
                                          interactive=False, elem_id="code-python", max_lines=40)

            # ---------------- run panel ----------------
            with gr.Column(scale=2, min_width=380, elem_id="mt-run-panel"):
                gauge = gr.HTML(render.gauge_html(*read_gpus()), elem_id="vram-gauge")
                summary = gr.HTML(render.summary_html(cfg0, validate(cfg0, hardware()), on0, predicted_gib=peak0),
                                  elem_id="config-summary")
                with gr.Row():
                    start_btn = gr.Button("▶ Start training", variant="primary", elem_id="start-btn")
                    stop_btn = gr.Button("■ Stop", variant="stop", elem_id="stop-btn", interactive=False)
                notice = gr.HTML(elem_id="run-notice")
                progress = gr.HTML(render.progress_html(job_view(None)), elem_id="run-progress")
                loss_plot = gr.LinePlot(pd.DataFrame({"step": [], "loss": []}), x="step", y="loss",
                                        title=None, y_title="training loss", x_title="optimizer step",
                                        height=230, elem_id="loss-plot", label="Loss", show_label=False, visible=False)
                log = gr.HTML(render.log_html([]), elem_id="run-log", padding=False)
                result = gr.HTML(elem_id="run-result")
                download = gr.File(label="Adapter (zip)", visible=False, interactive=False,
                                   elem_id="adapter-download")

        assert set(FIELDS) == set(FIELD_NAMES), set(FIELD_NAMES) ^ set(FIELDS)
        inputs = [FIELDS[n] for n in FIELD_NAMES]
        derived_out = [summary, *checks, preset, code_py, code_cli]
        quiet = dict(show_progress="hidden", queue=True)

        for comp in inputs:
            comp.input(on_fields_changed, inputs=inputs, outputs=derived_out, **quiet)
            if isinstance(comp, (gr.Textbox, gr.Dropdown)):  # a paste may not fire `input`; leaving the box does
                comp.blur(on_fields_changed, inputs=inputs, outputs=derived_out, **quiet)
                if isinstance(comp, gr.Textbox):
                    comp.submit(on_fields_changed, inputs=inputs, outputs=derived_out, **quiet)
        for item, box in zip(checklist.ITEMS, checks):
            box.input(partial(on_checklist, item.key), inputs=[box, *inputs], outputs=inputs + derived_out, **quiet)
        preset.input(on_preset_lever, inputs=[preset, *inputs], outputs=inputs + derived_out, **quiet)
        demo_btn.click(partial(on_start_from, "demo"), outputs=inputs + derived_out, **quiet)
        chapter_btn.click(partial(on_start_from, "chapter"), outputs=inputs + derived_out, **quiet)
        refresh_btn.click(lambda m, d: (gr.update(choices=model_choices(m)), gr.update(choices=dataset_choices(d))),
                          inputs=[FIELDS["model"], FIELDS["dataset"]], outputs=[FIELDS["model"], FIELDS["dataset"]])
        preview_btn.click(on_preview, inputs=inputs, outputs=[preview_out])
        upload.upload(on_upload, inputs=[upload, *inputs], outputs=inputs + derived_out + [preview_out])
        save_btn.click(on_save_config, inputs=[cfg_name, *inputs], outputs=[cfg_notice, cfg_list])
        load_btn.click(on_load_config, inputs=[cfg_list], outputs=inputs + derived_out + [cfg_notice])

        start_btn.click(on_start, inputs=inputs, outputs=[notice, start_btn, stop_btn])
        stop_btn.click(on_stop, outputs=[notice])

        live_out = [gauge, progress, loss_plot, log, result, download, start_btn, stop_btn, tab_state]
        poll = partial(live_update, output_dir=cfg0.output_dir)
        timer = gr.Timer(1.0)
        timer.tick(poll, inputs=[tab_state], outputs=live_out, show_progress="hidden", concurrency_limit=None)
        demo.load(lambda s: poll({}), inputs=[tab_state], outputs=live_out, show_progress="hidden")
    demo.memtune_fields = FIELDS  # for tests: field name -> component
    return demo
