"""End to end on the CPU with the real stack: 4-bit NF4 (bitsandbytes) + LoRA (peft) + SFTTrainer (trl).

No part of torch/transformers/peft/trl/bitsandbytes is mocked. The demo model is tiny, so each run takes seconds;
tests that only need "a finished run" share one (conftest's finished_run).
"""

import json
import logging
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from core.config.settings import TrainConfig, demo_config
from core.runs.events import read_events
from core.runs.folders import COMPLETE_MARKER, latest_checkpoint
from core.train.recipe import run_training
from core.train.trainer import build_sft_config



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


# The first losses of the seeded 20-step demo run (finished_run), as torchtune's recipe tests pin theirs: a change
# of data, template, tokenizer, model, LoRA init, learning rate or schedule moves them. Step 1 does not depend on
# the update rule (LoRA B starts at zero); steps 2-5 do. Tolerance: other CPUs' bf16 kernels may round differently;
# 0.01 is still ten times below what an unseeded LoRA init changed at step 2 (8.32 vs 8.42).
EXPECTED_FIRST_LOSSES = [8.6248, 9.0096, 8.4019, 8.6437, 8.2754]


def test_demo_trains_with_real_4bit_lora_and_loss_falls(finished_run):
    result, model = finished_run.result, finished_run.model
    import bitsandbytes as bnb

    quantized = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert quantized and all(m.weight.quant_type == "nf4" for m in quantized)
    losses = finished_run.losses
    assert len(losses) == 20
    assert losses[-1] < losses[0] * 0.75, losses
    s = result.summary
    assert s["steps"] == s["max_steps"] == 20
    assert s["train_tokens"] > 1_000 and s["first_loss"] == losses[0] and s["final_loss"] == losses[-1]


def test_first_losses_of_the_seeded_demo_are_pinned(finished_run):
    assert finished_run.losses[:5] == pytest.approx(EXPECTED_FIRST_LOSSES, abs=1e-2), finished_run.losses[:5]


def test_every_trainable_parameter_changed_and_no_frozen_one_did(finished_run):
    """As TRL's trainer tests check: training moved each LoRA weight and left the (4-bit) base untouched."""
    after = dict(finished_run.model.named_parameters())
    trainable = [n for n, (_, grad) in finished_run.before.items() if grad]
    frozen = [n for n, (_, grad) in finished_run.before.items() if not grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any(".weight" in n and "lora_" not in n for n in frozen)  # the quantized base weights are compared too
    for name in trainable:
        assert not torch.equal(finished_run.before[name][0], after[name].detach()), f"{name} did not change"
    for name in frozen:
        assert torch.equal(finished_run.before[name][0], after[name].detach()), f"{name} changed"


def test_a_seeded_run_repeats_exactly(finished_run, tmp_path):
    """Same config and seed, same process, later: identical losses. (LoRA's initial weights used to come from
    whatever the process had drawn from the global RNG before, so a second run differed from step 2 on.)"""
    events = []  # its first 5 steps: still in the warm-up, whose rates do not depend on max_steps
    again = run_training(finished_run.cfg.replace(output_dir=str(tmp_path), max_steps=5), events.append)
    assert again.status == "completed", again.message
    assert finished_run.cfg.warmup_steps >= 5 and finished_run.cfg.logging_steps == 1
    assert [e["loss"] for e in events if e["kind"] == "metrics"] == finished_run.losses[:5]


def test_events_cover_every_phase_and_go_to_jsonl(finished_run):
    result, events = finished_run.result, finished_run.events
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "run" and kinds[-1] == "done"
    phases = {e["phase"] for e in events if e["kind"] == "phase"}
    assert {"resolving", "tokenizing", "loading_model", "training", "saving"} <= phases
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 21))
    assert all(e["total_steps"] == 20 and e["tokens_per_s"] > 0 and e["eta_s"] is not None for e in steps)
    on_disk = read_events(Path(result.run_dir) / "events.jsonl")
    assert [e["kind"] for e in on_disk] == kinds


def test_saved_adapter_reloads_with_identical_logits(finished_run, demo_model_path):
    cfg, result = finished_run.cfg, finished_run.result
    from core.model.load import load_with_adapter

    adapter = Path(result.adapter_dir)
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "memtune.yaml", "summary.json"):
        assert (adapter / name).is_file(), name
    assert TrainConfig.load(adapter / "memtune.yaml") == cfg
    summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
    assert summary["adapter_bytes"] > 0 and summary["status"] == "completed"

    reloaded = load_with_adapter(cfg, adapter)
    trained = finished_run.model
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
    from core.model.load import load_with_adapter

    model = load_with_adapter(cfg, result.adapter_dir)
    assert model(input_ids=probe_ids()).logits.shape[-1] == 512


def test_resume_takes_the_newest_complete_checkpoint(out):
    cfg = demo_config(output_dir=str(out), run_name="resumable", save_strategy="steps", save_steps=2, max_steps=4)
    first = run_training(cfg)
    run_dir = Path(first.run_dir)
    assert first.status == "completed"
    ckpts = sorted((run_dir / "checkpoints").glob("checkpoint-*"))
    assert [p.name for p in ckpts] == ["checkpoint-2", "checkpoint-4"]
    assert all((p / COMPLETE_MARKER).is_file() for p in ckpts)
    # A checkpoint whose write was interrupted: no COMPLETE marker, truncated weights.
    broken = run_dir / "checkpoints" / "checkpoint-6"
    shutil.copytree(run_dir / "checkpoints" / "checkpoint-4", broken)
    (broken / COMPLETE_MARKER).unlink()
    (broken / "adapter_model.safetensors").write_bytes(b"half")
    assert latest_checkpoint(run_dir).name == "checkpoint-4"

    events = []
    resumed = run_training(cfg.replace(max_steps=8, resume_from=str(run_dir)), events.append)
    assert resumed.status == "completed", resumed.message
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert steps == list(range(5, 9))
    assert resumed.summary["resumed_from"].endswith("checkpoint-4")
    assert resumed.run_dir == first.run_dir


def test_out_of_memory_is_caught_and_explained_and_keeps_adapters(out, capsys):
    """The run records that it ran out of memory; what would help at its settings (core/estimate/advice.py) is said
    by the command line that ran it, and by the page's result and History from the run folder's config.yaml."""
    from core.jobs.view import JobView
    from core.runs.history import load_run
    from core.train.cli import main
    from ui.render import result_html, run_detail_html

    cfg = demo_config(output_dir=str(out), run_name="oom", max_steps=1, save_strategy="steps", save_steps=1)  # resumable
    ok = run_training(cfg)
    adapter = Path(ok.adapter_dir) / "adapter_model.safetensors"
    before = adapter.read_bytes()
    settings = out / "oom.yaml"
    cfg.replace(resume_from=ok.run_dir, max_steps=6).save(settings)
    assert main(["--config", str(settings)], callbacks=[OutOfMemoryAt()]) == 1
    err = capsys.readouterr().err
    assert "training failed (oom): The GPU ran out of memory" in err
    assert "Enable gradient checkpointing" in err  # the demo has it off: the first thing to try
    assert "Use smaller batches" in err
    assert adapter.read_bytes() == before  # the earlier adapter is untouched
    events = read_events(Path(ok.run_dir) / "events.jsonl")  # the resume trained in the first run's folder
    assert events[-1]["kind"] == "done" and events[-2]["kind"] == "error" and events[-2]["error_type"] == "oom"
    assert events[-2]["key"] == "log.oom_ended" and "Nothing was lost" in events[-2]["message"]
    view = JobView(state="failed", run_dir=ok.run_dir, message=events[-2]["message"], error_type="oom")
    detail = load_run(ok.run_dir)
    for lang, tip in (("en", "Enable gradient checkpointing"), ("pt", "Ative gradient checkpointing")):
        for html in (result_html(view, lang), run_detail_html(detail, lang)):  # the advice by its keys
            assert tip in html and ("ran out of memory" in html) == (lang == "en")
    (Path(ok.run_dir) / "config.yaml").write_text("lora_r: [", encoding="utf-8")  # no settings: what it recorded
    assert "Enable gradient" not in result_html(view) and "Nothing was lost" in result_html(view)


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


def run_cli(capsys, *args):
    """`python -m core.train ARGS` in this process: the same parser and code, without a new interpreter."""
    from core.train.cli import main

    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_demo_trains_and_prints_the_adapter(tmp_path, capsys):
    code, out, err = run_cli(capsys, "--demo", "--set", f"output_dir={tmp_path}", "--set", "max_steps=3")
    assert code == 0, err[-3000:]
    adapter = Path(out.strip().splitlines()[-1])
    assert (adapter / "adapter_model.safetensors").is_file()
    events = read_events(adapter.parent / "events.jsonl")
    assert [e["step"] for e in events if e["kind"] == "step"] == [1, 2, 3]
    assert "[memtune]" in err  # phases are announced on the command line


def test_cli_dump_config_and_errors(tmp_path, capsys):
    code, dumped, _ = run_cli(capsys, "--dump-config")
    assert code == 0
    path = tmp_path / "c.yaml"
    path.write_text(dumped)
    assert TrainConfig.load(path) == TrainConfig()
    code, demo, _ = run_cli(capsys, "--demo", "--dump-config", "--set", "max_steps=7")  # the demo's settings
    path.write_text(demo)
    assert code == 0 and TrainConfig.load(path) == demo_config(max_steps=7)
    code, lean, _ = run_cli(capsys, "--dump-config", "--preset", "lowest_memory", "--set", "lora_r=8")
    assert code == 0
    from core.config.presets import apply_preset

    path.write_text(lean)
    assert TrainConfig.load(path) == apply_preset(TrainConfig(), "lowest_memory").replace(lora_r=8)
    code, _, err = run_cli(capsys, "--config", str(path), "--set", "lora_r=zero", "--set", "optimizer=adam")
    assert code == 2
    assert "lora_r" in err and "optimizer: is not a memtune setting" in err
    run = ("--config", str(path), "--set", "dataset=/nowhere/x.jsonl", "--set", f"output_dir={tmp_path}",
           "--set", "model=memtune/demo-tiny-llama")
    if not torch.cuda.is_available():  # the dumped lowest_memory asks for liger's kernels: refused, with the fix
        code, _, err = run_cli(capsys, *run)
        assert code == 1 and "use_liger_kernel" in err and "turn it off" in err
    code, _, err = run_cli(capsys, *run, "--set", "use_liger_kernel=false")
    assert code == 1 and "x.jsonl" in err



def test_an_unreachable_hub_switches_the_run_offline_at_once(monkeypatch, capsys):
    """Offline, a Hub model would cost six "Retrying in Ns" lines (~23 s) before memtune's error: one quick
    connection attempt instead, then the process works from the cache."""
    from huggingface_hub import constants

    from core.quiet import offline_if_unreachable

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)  # monkeypatch puts the suite's values back afterwards
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert not offline_if_unreachable(demo_config())  # the demo needs no Hub: no connection tried
    monkeypatch.setattr(constants, "ENDPOINT", "https://127.0.0.1:9")  # nothing listens on the discard port
    assert offline_if_unreachable(TrainConfig(), timeout_s=2.0)
    assert constants.HF_HUB_OFFLINE and os.environ["HF_HUB_OFFLINE"] == "1"
    assert "cannot be reached" in capsys.readouterr().err


def test_the_libraries_noise_is_silenced_before_they_import():
    """Issue 37: bitsandbytes logs its "Failed to load CPU gemm_4bit_forward ... trust_remote_code" warning while it
    imports (on CPUs with AVX512-BF16), before quiet_libraries ran. The loggers are now silenced first: an import
    hook records their level at the moment bitsandbytes starts importing."""
    import subprocess
    import sys

    probe = (
        "import importlib.abc, logging, os, sys\n"
        "seen = []\n"
        "class Hook(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'bitsandbytes' and not seen:\n"
        "            seen.append(logging.getLogger('bitsandbytes.backends.cpu.ops').getEffectiveLevel())\n"
        "            print(seen, flush=True)\n"
        "            os._exit(0)  # the level is known: the rest of the imports would prove nothing more\n"
        "        return None\n"
        "sys.meta_path.insert(0, Hook())\n"
        "import core.train.libraries\n"
        "print(seen)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"[{logging.CRITICAL}]", out.stdout
