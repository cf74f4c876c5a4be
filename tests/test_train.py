"""End to end on the CPU with the real stack: 4-bit NF4 (bitsandbytes) + LoRA (peft) + SFTTrainer (trl).

No part of torch/transformers/peft/trl/bitsandbytes is mocked. The demo model is tiny, so each run takes seconds.
"""

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from core.config import TrainConfig, demo_config
from core.events import read_events
from core.train import COMPLETE_MARKER, build_sft_config, latest_checkpoint, run_training

ROOT = Path(__file__).resolve().parent.parent


class Capture(TrainerCallback):
    """Keeps the trained in-memory model so its logits can be compared with the saved adapter's."""

    def on_train_end(self, args, state, control, model=None, **kw):
        self.model = model


class StopAt(TrainerCallback):
    def __init__(self, stop: threading.Event, step: int):
        self.stop, self.step = stop, step

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step + 1 >= self.step:
            self.stop.set()  # what the UI's Stop button does, from another thread


class OutOfMemoryAt(TrainerCallback):
    """Raises the error CUDA raises when the GPU is full (injected: a CPU run cannot run out of GPU memory)."""

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def probe_ids():
    return torch.tensor([[0, 261, 283, 28, 201, 312, 307, 289, 284, 297]])


@pytest.fixture
def out(tmp_path):
    return tmp_path / "runs"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, demo_model_path):
    capture, events = Capture(), []
    cfg = demo_config(output_dir=str(tmp_path_factory.mktemp("runs")), run_name="demo")
    result = run_training(cfg, events.append, callbacks=[capture])
    return cfg, result, events, capture


def test_demo_trains_with_real_4bit_lora_and_loss_falls(demo_run):
    cfg, result, events, capture = demo_run
    assert result.status == "completed", result.message
    import bitsandbytes as bnb

    quantized = [m for m in capture.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert quantized and all(m.weight.quant_type == "nf4" for m in quantized)
    losses = [e["loss"] for e in events if e["kind"] == "metrics"]
    assert len(losses) >= 10
    assert losses[-1] < losses[0] / 2, losses
    s = result.summary
    assert s["steps"] == s["max_steps"] == 750
    assert s["train_tokens"] > 10_000 and s["first_loss"] == losses[0] and s["final_loss"] == losses[-1]


def test_events_cover_every_phase_and_go_to_jsonl(demo_run):
    cfg, result, events, _ = demo_run
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "run" and kinds[-1] == "done"
    phases = {e["phase"] for e in events if e["kind"] == "phase"}
    assert {"resolving", "tokenizing", "loading_model", "training", "saving"} <= phases
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 751))
    assert all(e["total_steps"] == 750 and e["tokens_per_s"] > 0 and e["eta_s"] is not None for e in steps)
    on_disk = read_events(Path(result.run_dir) / "events.jsonl")
    assert [e["kind"] for e in on_disk] == kinds


def test_saved_adapter_reloads_with_identical_logits(demo_run, demo_model_path):
    cfg, result, _, capture = demo_run
    from core.model import load_with_adapter

    adapter = Path(result.adapter_dir)
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "memtune.yaml", "summary.json"):
        assert (adapter / name).is_file(), name
    assert TrainConfig.load(adapter / "memtune.yaml") == cfg
    summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
    assert summary["adapter_bytes"] > 0 and summary["status"] == "completed"

    reloaded = load_with_adapter(cfg, adapter)
    trained = capture.model
    trained.eval(), reloaded.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a = trained(input_ids=probe_ids()).logits.float()
        b = reloaded(input_ids=probe_ids()).logits.float()
    assert torch.equal(a, b), (a - b).abs().max()
    # and the adapter changed something: the base alone answers differently
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), reloaded.disable_adapter():
        base = reloaded(input_ids=probe_ids()).logits.float()
    assert (a - base).abs().max() > 0.1


def test_stop_mid_run_saves_a_loadable_adapter(out, demo_model_path):
    stop = threading.Event()
    cfg = demo_config(output_dir=str(out), run_name="stopped")
    result = run_training(cfg, stop=stop, callbacks=[StopAt(stop, 7)])
    assert result.status == "stopped", result.message
    assert result.summary["steps"] == 7
    from core.model import load_with_adapter

    model = load_with_adapter(cfg, result.adapter_dir)
    assert model(input_ids=probe_ids()).logits.shape[-1] == 512


def test_resume_takes_the_newest_complete_checkpoint(out):
    cfg = demo_config(output_dir=str(out), run_name="resumable", save_strategy="steps", save_steps=5, max_steps=10)
    first = run_training(cfg)
    run_dir = Path(first.run_dir)
    assert first.status == "completed"
    ckpts = sorted((run_dir / "checkpoints").glob("checkpoint-*"))
    assert [p.name for p in ckpts] == ["checkpoint-10", "checkpoint-5"]
    assert all((p / COMPLETE_MARKER).is_file() for p in ckpts)
    # A checkpoint whose write was interrupted: no COMPLETE marker, truncated weights.
    broken = run_dir / "checkpoints" / "checkpoint-15"
    shutil.copytree(run_dir / "checkpoints" / "checkpoint-10", broken)
    (broken / COMPLETE_MARKER).unlink()
    (broken / "adapter_model.safetensors").write_bytes(b"half")
    assert latest_checkpoint(run_dir).name == "checkpoint-10"

    events = []
    resumed = run_training(cfg.replace(max_steps=20, resume_from=str(run_dir)), events.append)
    assert resumed.status == "completed", resumed.message
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert steps == list(range(11, 21))
    assert resumed.summary["resumed_from"].endswith("checkpoint-10")
    assert resumed.run_dir == first.run_dir


def test_out_of_memory_is_caught_and_explained_and_keeps_adapters(out):
    cfg = demo_config(output_dir=str(out), run_name="oom", max_steps=3)
    ok = run_training(cfg)
    adapter = Path(ok.adapter_dir) / "adapter_model.safetensors"
    before = adapter.read_bytes()
    events = []
    result = run_training(cfg.replace(resume_from=ok.run_dir, max_steps=6), events.append,
                          callbacks=[OutOfMemoryAt()])
    assert result.status == "failed" and result.error_type == "oom"
    assert "ran out of memory" in result.message
    assert "Enable gradient checkpointing" in result.message  # the demo has it off: the first thing to try
    assert "Use smaller batches" in result.message
    assert adapter.read_bytes() == before  # the earlier adapter is untouched
    assert events[-1]["kind"] == "done" and events[-2]["kind"] == "error"


def test_bad_inputs_fail_with_messages_not_crashes(out, tmp_path):
    bad = run_training(demo_config(output_dir=str(out), learning_rate=9.0, lora_r=0))
    assert bad.status == "failed" and bad.error_type == "config"
    assert "learning_rate" in bad.message and "lora_r" in bad.message

    missing = run_training(demo_config(output_dir=str(out), dataset=str(tmp_path / "nope.jsonl")))
    assert missing.status == "failed" and missing.error_type == "data"
    assert "nope.jsonl" in missing.message

    no_model = run_training(demo_config(output_dir=str(out), model=str(tmp_path / "no-such-model")))
    assert no_model.error_type == "model" and "does not exist" in no_model.message

    offline = run_training(demo_config(output_dir=str(out), model="someone/not-cached-model"))
    assert offline.error_type == "model"
    assert "not on this machine and the Hugging Face Hub cannot be reached" in offline.message


def test_sft_config_maps_the_chapter_settings(tmp_path):
    args = build_sft_config(TrainConfig(device="cpu"), tmp_path)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (1, 16)
    assert (args.learning_rate, args.optim, args.max_length, args.logging_steps) == (2e-4, "paged_adamw_8bit", 512, 10)
    assert args.bf16 and not args.fp16 and args.num_train_epochs == 1.0 and args.save_strategy == "epoch"
    checkpointing = getattr(args, "activation_checkpointing", None) or args.gradient_checkpointing
    assert checkpointing is True


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "core.train", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_cli_demo_finishes_under_a_minute_and_learns(tmp_path):
    import time

    start = time.monotonic()
    proc = run_cli("--demo", "--set", f"output_dir={tmp_path}")
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    adapter = Path(proc.stdout.strip().splitlines()[-1])
    assert (adapter / "adapter_model.safetensors").is_file()
    events = read_events(adapter.parent / "events.jsonl")
    losses = [e["loss"] for e in events if e["kind"] == "metrics"]
    assert losses[-1] < losses[0] / 2
    assert "[memtune]" in proc.stderr  # phases are announced on the command line
    assert elapsed < 60, f"demo took {elapsed:.1f} s"


def test_cli_dump_config_and_errors(tmp_path):
    dumped = run_cli("--dump-config")
    assert dumped.returncode == 0
    path = tmp_path / "c.yaml"
    path.write_text(dumped.stdout)
    assert TrainConfig.load(path) == TrainConfig()
    lean = run_cli("--dump-config", "--preset", "lowest_memory", "--set", "lora_r=8")
    assert lean.returncode == 0
    from core.presets import apply_preset

    path.write_text(lean.stdout)
    assert TrainConfig.load(path) == apply_preset(TrainConfig(), "lowest_memory").replace(lora_r=8)
    bad = run_cli("--config", str(path), "--set", "lora_r=zero", "--set", "optimizer=adam")
    assert bad.returncode == 2
    assert "lora_r" in bad.stderr and "optimizer: is not a memtune setting" in bad.stderr
    failed = run_cli("--config", str(path), "--set", "dataset=/nowhere/x.jsonl", "--set", f"output_dir={tmp_path}",
                     "--set", "model=memtune/demo-tiny-llama")
    assert failed.returncode == 1 and "x.jsonl" in failed.stderr
