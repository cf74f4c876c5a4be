"""The Gradio app without a browser: building, widget <-> config mapping, handlers, launch flags, generated code."""

import subprocess
import sys
from pathlib import Path

import gradio as gr
import pytest
import yaml

import app
from core import checklist
from core.codegen import cli_command, python_script
from core.config import (DEMO_MODEL, LORA_TARGET_CHOICES, TrainConfig, apply_overrides, demo_config, field_meta)
from core.events import make_event
from core.jobs import JobManager, JobView
from ui import blocks, render
from ui.fields import FIELD_NAMES, collect, out_of_range, to_values

ROOT = Path(__file__).resolve().parent.parent


def widget_values(cfg):
    v = to_values(cfg)
    return [v[n] for n in FIELD_NAMES]


def as_config(field_outputs):
    cfg, problems = collect(dict(zip(FIELD_NAMES, field_outputs)))
    assert not problems, problems
    return cfg


def value_of(update):
    return update["value"] if isinstance(update, dict) else update


# --- building ----------------------------------------------------------------------------------------------------
def test_build_ui_builds_without_launching():
    demo = blocks.build_ui(demo_config())
    assert isinstance(demo, gr.Blocks)
    assert not getattr(demo, "is_running", False)
    fields = demo.memtune_fields
    assert set(fields) == set(FIELD_NAMES)  # one widget per TrainConfig field
    assert all(c.elem_id == f"field-{n}" for n, c in fields.items())


def test_number_widgets_are_bounded_from_field_meta():
    fields = blocks.build_ui(demo_config()).memtune_fields
    for name, comp in fields.items():
        meta = field_meta(name)
        if isinstance(comp, (gr.Slider, gr.Number)):
            assert comp.minimum == meta.get("min") and comp.maximum == meta.get("max"), name
        assert not (isinstance(comp, gr.Textbox) and ("min" in meta or "max" in meta)), f"{name} is free text"
    assert isinstance(fields["lora_target_modules"], gr.CheckboxGroup)
    assert isinstance(fields["max_length"], gr.Slider)
    with pytest.raises(gr.Error, match="LoRA rank r .lora_r.*minimum"):  # a bounds error names the field
        fields["lora_r"].preprocess(0)


def test_initial_config_is_the_demo_without_a_gpu():
    if blocks.hardware().cuda:
        assert blocks.initial_config() == TrainConfig()
    else:
        assert blocks.initial_config() == demo_config()


# --- widgets <-> config ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [
    TrainConfig(),
    demo_config(),
    TrainConfig(lora_r=64, lora_alpha=16, lora_dropout=0.1, lora_target_modules=list(LORA_TARGET_CHOICES),
                max_steps=123, learning_rate=3e-5, packing=True, save_strategy="steps", save_steps=7,
                run_name="my.run-1", precision="fp32", optim="sgd", device="cpu", upcast_to_fp32=False),
])
def test_widgets_round_trip(cfg):
    assert as_config(widget_values(cfg)) == cfg


def test_widget_values_are_coerced_and_bad_ones_all_reported():
    v = to_values(demo_config())
    v.update(lora_r=8.0, max_length=128.0, model="  memtune/demo-tiny-llama  ")  # what sliders/textboxes send
    cfg, problems = collect(v)
    assert cfg.lora_r == 8 and isinstance(cfg.lora_r, int) and cfg.max_length == 128 and cfg.model == DEMO_MODEL
    v.update(learning_rate=None, max_steps=None, optim=None)
    cfg, problems = collect(v)
    assert cfg is None
    assert {p.field for p in problems} == {"learning_rate", "max_steps", "optim"}


def test_checklist_ticks_change_the_config_and_back():
    base = TrainConfig()
    for item in checklist.ITEMS:
        for on in (False, True):
            out = blocks.on_checklist(item.key, on, *widget_values(base))
            n = len(FIELD_NAMES)
            cfg = as_config(out[:n])
            assert cfg == checklist.toggle(base, item.key, on)
            assert checklist.active(cfg)[item.key] is on, item.key
            ticks = [value_of(u) for u in out[n + 1:n + 1 + len(checklist.ITEMS)]]
            assert ticks == [checklist.active(cfg)[i.key] for i in checklist.ITEMS]
            summary, code_py, cli = out[n], out[-2], out[-1]
            assert "checklist" in summary
            compile(code_py, "generated.py", "exec")
            assert cli.startswith("python -m core.train")
            base = cfg


def test_summary_and_code_follow_a_field_change():
    values = widget_values(demo_config())
    values[FIELD_NAMES.index("gradient_checkpointing")] = True
    summary, *rest = blocks.on_fields_changed(*values)
    assert "checkpointing on" in summary
    assert "gradient_checkpointing=true" in rest[-1]
    assert "gradient_checkpointing=True" in rest[-2]


def test_presets_load_the_demo_and_the_chapter():
    assert as_config(blocks.on_start_from("demo")[:len(FIELD_NAMES)]) == demo_config()
    assert as_config(blocks.on_start_from("chapter")[:len(FIELD_NAMES)]) == TrainConfig()


# --- start / stop -------------------------------------------------------------------------------------------------
class Blocking:
    def __init__(self):
        import threading

        self.go = threading.Event()

    def __call__(self, cfg, sink=None, stop=None):
        sink(make_event("run", run_dir="/tmp/x", config=cfg.to_dict(), total_steps=None))
        while not (stop.is_set() or self.go.is_set()):
            stop.wait(0.01)
        sink(make_event("done", status="stopped" if stop.is_set() else "completed", run_dir="/tmp/x",
                        summary={}, message="bye"))


@pytest.mark.filterwarnings("ignore:Not started")
def test_start_lists_every_problem_at_once(monkeypatch):
    monkeypatch.setattr(blocks, "MANAGER", JobManager(runner=Blocking()))
    values = widget_values(demo_config(model="", dataset="", max_steps=0, run_name="../evil"))
    notice, *_ = blocks.on_start(*values)
    for name in ("model", "dataset", "max_steps", "run_name"):
        assert f"<code>{name}</code>" in notice
    assert not blocks.MANAGER.busy()


@pytest.mark.filterwarnings("ignore:A training run is already")
def test_second_start_is_refused_with_a_message(monkeypatch):
    runner = Blocking()
    monkeypatch.setattr(blocks, "MANAGER", JobManager(runner=runner))
    first, *_ = blocks.on_start(*widget_values(demo_config()))
    assert "started" in first
    second, *_ = blocks.on_start(*widget_values(demo_config()))  # e.g. from another tab
    assert "already running" in second
    assert "Stopping" in blocks.on_stop()
    assert blocks.MANAGER.current().wait(5)
    assert "No run" in blocks.on_stop()


def test_live_update_reattaches_and_skips_when_nothing_changed(monkeypatch):
    runner = Blocking()
    monkeypatch.setattr(blocks, "MANAGER", JobManager(runner=runner))
    blocks.MANAGER.start(demo_config())
    out = blocks.live_update({})
    gauge, progress, plot, log, result, download, start, stop, state = out
    assert 'data-state="running"' in progress and "run folder" in log
    assert start["interactive"] is False and stop["interactive"] is True
    again = blocks.live_update(state)  # same events: nothing re-sent
    assert all(isinstance(x, dict) and x.get("__type__") == "update" and len(x) == 1 for x in again[1:8])
    fresh = blocks.live_update({})  # a reloaded page: everything again
    assert 'data-state="running"' in fresh[1]
    runner.go.set()
    blocks.MANAGER.current().wait(5)
    assert 'data-state="completed"' in blocks.live_update(state)[1]


def test_long_runs_are_thinned_for_the_plot():
    pts = [(i, 1.0 / i) for i in range(1, 5001)]
    out = blocks.thin(pts, 400)
    assert len(out) <= 401 and out[0] == pts[0] and out[-1] == pts[-1]
    assert blocks.thin(pts[:10], 400) == pts[:10]


# --- save / load settings ---------------------------------------------------------------------------------------
def test_settings_save_and_load_with_safe_names(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMTUNE_CONFIG_DIR", str(tmp_path / "configs"))
    cfg = demo_config(lora_r=4, max_steps=33)
    for bad in ("../evil", "a b", "", "/abs", ".hidden"):
        notice, _ = blocks.on_save_config(bad, *widget_values(cfg))
        assert "mt-note-error" in notice, bad
    assert not (tmp_path / "configs").exists() or not list((tmp_path / "configs").iterdir())
    notice, listing = blocks.on_save_config("my-run.yaml", *widget_values(cfg))
    assert "Saved" in notice and listing["value"] == "my-run"
    assert TrainConfig.load(tmp_path / "configs" / "my-run.yaml") == cfg
    out = blocks.on_load_config("my-run")
    assert as_config(out[:len(FIELD_NAMES)]) == cfg and "Loaded" in out[-1]
    (tmp_path / "configs" / "broken.yaml").write_text("lora_r: 0\noptim: adam_bogus\n")
    out = blocks.on_load_config("broken")
    assert "Not loaded" in out[-1] and "lora_r" in out[-1] and "optim" in out[-1]
    (tmp_path / "configs" / "typo.yaml").write_text("lora_rank: 8\n")
    assert "lora_rank" in blocks.on_load_config("typo")[-1]
    assert "Pick" in blocks.on_load_config("../../etc/passwd")[-1]


def test_out_of_range_names_the_fields():
    bad = TrainConfig(lora_r=0, optim="nope", lora_target_modules=["q_proj", "zz"])
    assert {p.field for p in out_of_range(bad)} == {"lora_r", "optim", "lora_target_modules"}


# --- data preview and upload --------------------------------------------------------------------------------------
def test_preview_shows_examples_and_histogram(demo_model_path):
    html = blocks.on_preview(*widget_values(demo_config()))
    assert "Format: dolly" in html and "<svg" in html and "max_length 64" in html


def test_format_errors_are_shown_in_place(tmp_path, demo_model_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "b"}\n')
    html = blocks.on_preview(*widget_values(demo_config(dataset=str(bad))))
    assert "mt-data-error" in html and "question" in html


def test_upload_sets_the_dataset_and_previews(tmp_path, monkeypatch, demo_model_path):
    monkeypatch.setenv("MEMTUNE_HOME", str(tmp_path / "home"))
    f = tmp_path / "my data.jsonl"
    f.write_text("\n".join('{"text": "hello world %d"}' % i for i in range(5)) + "\n")
    out = blocks.on_upload(str(f), *widget_values(demo_config()))
    cfg = as_config(out[:len(FIELD_NAMES)])
    assert Path(cfg.dataset).name == "my_data.jsonl" and Path(cfg.dataset).is_file() and cfg.dataset_split == "train"
    assert "Format: text" in out[-1]
    exe = tmp_path / "x.exe"
    exe.write_text("MZ")
    assert "Upload not used" in blocks.on_upload(str(exe), *widget_values(demo_config()))[-1]


# --- rendering ---------------------------------------------------------------------------------------------------
def test_gauge_without_a_gpu_says_so_plainly():
    html = render.gauge_html([], "no NVIDIA GPU found")
    assert "no NVIDIA GPU found" in html


def test_gauge_bands_and_peak_marker():
    gpus = [{"index": 0, "name": "RTX <4090>", "used_gib": 22.0, "total_gib": 24.0},
            {"index": 1, "name": "A", "used_gib": 1.0, "total_gib": 24.0}]
    html = render.gauge_html(gpus, run_peak_gib=23.0)
    assert 'data-band="high"' in html and 'data-band="ok"' in html
    assert "RTX &lt;4090&gt;" in html and "mt-peak" in html and "23.0 GiB" in html


def test_result_panel_shows_path_size_loss_and_peak():
    v = JobView(state="completed", step=10, adapter_dir="runs/r/adapter", run_dir="runs/r",
                summary={"adapter_bytes": 3 * 2**20, "first_loss": 8.0, "final_loss": 2.5, "steps": 10,
                         "peak_allocated_gib": 5.25, "nvml_peak_gib": 6.5, "runtime_s": 61})
    html = render.result_html(v)
    for text in ("runs/r/adapter", "3.0 MiB", "2.5000", "5.25 GiB", "6.50 GiB", "1:01"):
        assert text in html
    failed = render.result_html(JobView(state="failed", message="The GPU ran out of memory <b>", error_type="oom"))
    assert "ran out of memory &lt;b&gt;" in failed and "(oom)" in failed


# --- generated code ----------------------------------------------------------------------------------------------
CONFIGS = [
    TrainConfig(),
    demo_config(),
    demo_config(packing=True, max_steps=5, device="cpu"),
    TrainConfig(load_in_4bit=False, precision="fp16", optim="adamw_torch", gradient_checkpointing=False),
    TrainConfig(dataset="data/chat.jsonl", dataset_format="messages", trust_remote_code=True, use_liger_kernel=True),
    TrainConfig(dataset="tatsu-lab/alpaca", dataset_format="alpaca", lr_scheduler_type="cosine", warmup_steps=10,
                weight_decay=0.01, save_strategy="steps", save_steps=50, seed=7, upcast_to_fp32=False),
    TrainConfig(dataset="some/unknown", dataset_format="auto", run_name="it's \"quoted\""),
    TrainConfig(dataset="notes.txt", dataset_format="sharegpt"),
    TrainConfig(offload_embeddings=True, expandable_segments=True, resume_from="runs/old"),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_generated_script_compiles_and_uses_current_apis(cfg):
    code = python_script(cfg)
    compile(code, "generated.py", "exec")
    assert "processing_class=tokenizer" in code and "max_length=" in code
    assert "max_seq_length=" not in code.replace("max_seq_length=...", "") and "tokenizer=tokenizer" not in code
    assert "dataset_text_field" not in code
    assert ("BitsAndBytesConfig(" in code) is cfg.load_in_4bit


def test_chapter_script_formats_dolly_instead_of_a_missing_text_column():
    code = python_script(TrainConfig())
    assert 'load_dataset("databricks/databricks-dolly-15k", split="train[:1000]")' in code
    assert 'row["response"]' in code and 'optim="paged_adamw_8bit"' in code


@pytest.mark.parametrize("cfg", CONFIGS)
def test_cli_command_round_trips_through_the_engine_parser(cfg, tmp_path):
    import shlex

    cmd = cli_command(cfg).splitlines()[0].split(" > ")[0]
    args = shlex.split(cmd)
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    base = demo_config() if "--demo" in args else TrainConfig()
    assert apply_overrides(base, sets) == cfg
    saved = tmp_path / "x.yaml"
    demo_config().save(saved)
    args = shlex.split(cli_command(cfg, config_path=saved))
    assert args[:5] == ["python", "-m", "core.train", "--config", str(saved)]
    assert apply_overrides(demo_config(), [args[i + 1] for i, a in enumerate(args) if a == "--set"]) == cfg


def test_script_names_what_it_does_not_reproduce():
    code = python_script(TrainConfig(resume_from="runs/old", expandable_segments=True, offload_embeddings=True))
    assert "Not reproduced" in code and "resume_from=runs/old" in code
    assert "expandable_segments:True" in code and "offload_input_embeddings(model)" in code


def test_preset_radio_applies_levers_and_follows_the_config():
    from core import presets

    out = blocks.on_preset_lever("lowest_memory", *widget_values(TrainConfig()))
    cfg = as_config(out[:len(FIELD_NAMES)])
    assert cfg == presets.apply_preset(TrainConfig(), "lowest_memory", blocks.hardware())
    assert out[-3] == presets.matching(cfg) or out[-3] == "custom"
    assert blocks.on_fields_changed(*widget_values(TrainConfig()))[-3] == "chapter"
    assert blocks.on_fields_changed(*widget_values(TrainConfig(lora_dropout=0.3)))[-3] == "custom"


def test_cli_lists_only_changed_fields():
    assert cli_command(demo_config()) == "python -m core.train --demo"
    assert cli_command(demo_config(lora_r=4)) == "python -m core.train --demo --set lora_r=4"


# --- launch flags ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("host,share,auth,refused", [
    ("127.0.0.1", False, None, False),
    ("localhost", False, None, False),
    ("::1", False, None, False),
    ("127.0.0.2", False, None, False),
    ("0.0.0.0", False, None, True),
    ("192.168.1.5", False, None, True),
    ("myhost.local", False, None, True),
    ("::", False, None, True),
    ("127.0.0.1", True, None, True),
    ("0.0.0.0", False, ("me", "pw"), False),
    ("127.0.0.1", True, ("me", "pw"), False),
])
def test_exposure_without_auth_is_refused(host, share, auth, refused):
    assert (app.exposure_problem(host, share, auth) is not None) is refused


def test_on_a_space_the_space_front_end_is_the_exposure(monkeypatch):
    assert app.exposure_problem("0.0.0.0", False, None, space=True) is None
    monkeypatch.setenv("SPACE_ID", "someone/memtune")
    assert app.parse_args([]).host == "0.0.0.0"
    monkeypatch.delenv("SPACE_ID")
    assert app.parse_args([]).host == "127.0.0.1" and app.parse_args([]).port == 7860


def test_parse_auth():
    assert app.parse_auth("me:pa:ss") == ("me", "pa:ss")
    assert app.parse_auth(None) is None and app.parse_auth("") is None
    for bad in ("nopassword", ":pw", "me:"):
        with pytest.raises(ValueError):
            app.parse_auth(bad)


def _run_app(*args, env_extra=None):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("MEMTUNE_AUTH", "SPACE_ID")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, str(ROOT / "app.py"), *args], capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.mark.parametrize("args", [("--host", "0.0.0.0"), ("--share",), ("--host", "0.0.0.0", "--auth", "bad")])
def test_app_exits_non_zero_when_exposed_without_auth(args):
    proc = _run_app(*args)
    assert proc.returncode != 0
    assert "memtune:" in proc.stderr and ("auth" in proc.stderr.lower())


def test_app_help_lists_the_flags():
    proc = _run_app("--help")
    assert proc.returncode == 0
    for flag in ("--host", "--port", "--share", "--auth"):
        assert flag in proc.stdout
