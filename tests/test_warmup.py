"""kernel_warmup (issue 25): one forward + backward on the first micro-batch before step 1, paid visibly as its own
phase, changes nothing of training. The same seeded demo run with the warm-up forced on and off (the CPU's `auto` is
off) gives identical losses, grad norms, TRL metrics (token accuracy, entropy, token count) and adapter; a resumed
run with the warm-up on continues exactly as the run that never stopped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from core.config.settings import TrainConfig, config_problems, demo_config
from core.runs.events import read_events
from core.train.callbacks import warms_up
from core.train.recipe import run_training

# What the Trainer times itself (its clock starts before on_train_begin, so it includes the warm-up): not training.
CLOCKS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_tokens_per_second"}


class Logs(TrainerCallback):
    """Every dict the Trainer logs (loss, grad_norm, learning_rate and TRL's entropy, mean_token_accuracy,
    num_tokens), without its clocks."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kw):
        self.logs.append({k: v for k, v in (logs or {}).items() if k not in CLOCKS})


def small(out: Path, **changes) -> TrainConfig:
    # 4 steps of 2 micro-batches of 4 rows, a checkpoint at step 2 (the resume test's), a log every step. LoRA
    # dropout on (the demo's is 0): each step draws from torch's RNG, so a warm-up that moved it would change every
    # loss after it. Two micro-batches per step: the warm-up's batch is step 1's first, so a leaked TRL metric would
    # move step 1's average (with one micro-batch per step it would average to the same number).
    return demo_config(output_dir=str(out), max_steps=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                       logging_steps=1, save_strategy="steps", save_steps=2, lora_dropout=0.1, **changes)


def train(cfg: TrainConfig):
    logs = Logs()
    result = run_training(cfg, callbacks=[logs])
    assert result.status == "completed", result.message
    return result, logs.logs, read_events(Path(result.run_dir) / "events.jsonl")


def adapter(run_dir: str) -> dict:
    return load_file(str(Path(run_dir) / "adapter" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_model_path):
    """The same seeded run twice: the warm-up off, then on."""
    root = tmp_path_factory.mktemp("warmup")
    return {mode: train(small(root / mode, run_name=mode, kernel_warmup=mode)) for mode in ("off", "on")}


def test_warm_up_changes_no_loss_grad_norm_metric_or_adapter_weight(runs):
    (_, logs_off, _), (on, logs_on, _) = runs["off"], runs["on"]
    steps = [x for x in logs_on if "loss" in x]
    assert len(steps) == 4 and all({"entropy", "mean_token_accuracy", "num_tokens", "grad_norm"} <= set(x) for x in steps)
    # exact, step by step: the data order, dropout's random numbers, the gradients and TRL's per-step metrics
    # (a leaked warm-up batch would add its tokens and its entropy to step 1's)
    assert logs_on == logs_off
    a, b = adapter(runs["off"][0].run_dir), adapter(on.run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert on.summary["warmup_s"] > 0 and runs["off"][0].summary["warmup_s"] is None


def test_the_warm_up_is_a_phase_of_its_own_with_its_duration_before_training_starts(runs):
    (_, _, events_off), (_, _, events) = runs["off"], runs["on"]
    assert not [e for e in events_off if e.get("phase") == "warming_up"]  # off: not run at all
    kinds = [(e["kind"], e.get("phase")) for e in events]
    warm = [i for i, k in enumerate(kinds) if k == ("phase", "warming_up")]
    training = kinds.index(("phase", "training"))
    first_step = kinds.index(("step", None))
    assert warm and warm[-1] < training < first_step  # paid before training's clock and step 1
    assert events[warm[0]]["message"].startswith("Warming up on the first micro-batch (")
    last = events[warm[-1]]
    assert last["seconds"] > 0 and last["tokens"] > 0 and last["message"] == f"Warm-up done in {last['seconds']:.2f} s"
    # training's clock starts after it: step 1's elapsed time does not hold the warm-up
    step1 = events[first_step]
    assert step1["elapsed_s"] <= step1["time"] - last["time"] + 0.01


def test_a_resumed_run_with_the_warm_up_continues_exactly_as_the_run_that_never_stopped(runs, tmp_path):
    off, logs_off, _ = runs["off"]
    copy = tmp_path / "runs" / "off"
    shutil.copytree(off.run_dir, copy)
    shutil.rmtree(copy / "checkpoints" / "checkpoint-4")  # resume from step 2
    cfg = small(tmp_path / "runs", run_name="off", kernel_warmup="on", resume_from=str(copy))
    resumed, logs, events = train(cfg)
    assert resumed.summary["resumed_from"].endswith("checkpoint-2")
    assert [e["step"] for e in events if e["kind"] == "step"][-2:] == [3, 4]
    assert any(e.get("phase") == "warming_up" and e.get("seconds") for e in events)
    # TRL counts num_tokens from 0 again in a resumed process (it is not in the checkpoint): with or without a warm-up
    def same(rows):
        return [{k: v for k, v in x.items() if k != "num_tokens"} for x in rows if "loss" in x]

    assert same(logs) == same(logs_off)[2:]
    a, b = adapter(off.run_dir), adapter(resumed.run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_setting_auto_on_off_is_validated_and_auto_follows_cuda():
    assert warms_up(TrainConfig(kernel_warmup="auto"), cuda=True)
    assert not warms_up(TrainConfig(kernel_warmup="auto"), cuda=False)
    assert warms_up(TrainConfig(kernel_warmup="on"), cuda=False)
    assert not warms_up(TrainConfig(kernel_warmup="off"), cuda=True)
    problems = [p for p in config_problems(TrainConfig(kernel_warmup="yes")) if p.field == "kernel_warmup"]
    assert [str(p) for p in problems] == ["kernel_warmup: 'yes' is not one of the choices -> pick one of: auto, on, off"]
    # Show code and the YAML carry it as they carry every field
    from core.codegen import cli_command, config_yaml

    cfg = TrainConfig(kernel_warmup="off")
    assert "kernel_warmup: 'off'" in config_yaml(cfg) and "kernel_warmup=off" in cli_command(cfg)
    assert TrainConfig.from_yaml(config_yaml(cfg)) == cfg
    # written by hand, unquoted: YAML reads on/off as true/false, which must still mean on/off
    assert TrainConfig.from_yaml("kernel_warmup: off").kernel_warmup == "off"
    assert TrainConfig.from_yaml("kernel_warmup: on").kernel_warmup == "on"


def test_the_warm_up_lines_read_in_pt_and_fr(runs):
    from core.jobs.view import format_event
    from ui.render import log_line

    from tests.test_log_language import check_lines, every_event_keyed

    every_event_keyed([e for e in runs["on"][2] if e.get("phase") == "warming_up"])
    lines = [x for x in map(format_event, runs["on"][2]) if x and "[warming_up]" in x]
    assert len(lines) >= 2
    said = check_lines(lines)
    assert any("Préchauffage : un forward + backward sur le premier micro-lot" in x for x in said["fr"])
    assert any(x.endswith(" s") and "concluído em " in x for x in said["pt"])
    assert "," in log_line(lines[-1], "fr").rsplit("en ", 1)[1]  # the decimal comma


def test_the_bench_counts_the_first_step_after_the_warm_up_and_records_the_warm_up_apart():
    """bench/product.py on a run's events: step 1 is timed from training's start (after the warm-up), the warm-up's
    seconds come from its phase event; plan "warmup" holds the rows the goal is judged on."""
    from bench.product import speeds, warmup
    from bench.product_plans import plan

    started = 1000.0
    events = [{"kind": "phase", "phase": "warming_up", "time": 1030.0, "message": "Warming up ..."},
              {"kind": "phase", "phase": "warming_up", "time": 1035.0, "seconds": 5.0, "tokens": 4096},
              {"kind": "phase", "phase": "training", "time": 1035.0}]
    events += [{"kind": "step", "step": i, "time": 1035.0 + 0.6 + 0.3 * (i - 1), "elapsed_s": 0.6 + 0.3 * (i - 1),
                "tokens": 4096 * i} for i in range(1, 7)]
    row = speeds([e for e in events if e["kind"] == "step"], 3, started)
    row.update(warmup(events, row))
    assert row["first_step_s"] == 0.6 and row["steady_step_s_median"] == 0.3 and row["first_over_steady"] == 2.0
    assert row["to_train_start_s"] == 35.0 and row["to_first_step_s"] == 35.6  # from the process start
    assert row["warmup_s"] == 5.0 and row["warmup_tokens"] == 4096 and row["warmup_and_first_over_steady"] == 18.67
    assert warmup(events[2:], row)["warmup_s"] is None  # no warm-up ran

    rows = {v.name: v for v in plan("warmup")}
    assert set(rows) == {"fastest", "fastest-nowarmup", "lowest_memory", "six_gb", "3b-fastest"}
    assert all("validation_share=0" in v.sets for v in rows.values())
    assert "kernel_warmup=off" in rows["fastest-nowarmup"].sets and rows["3b-fastest"].arch == "llama-3.2-3b"
    assert not any("kernel_warmup=on" in v.sets for v in rows.values())  # on the GPU: the default (auto) is on
    assert all("kernel_warmup=on" in v.sets for v in plan("warmupsmoke") if v.name != "fastest-nowarmup")
