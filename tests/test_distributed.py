"""Past one GPU: validation and launch plans (pure), then real multi-process runs of the demo on the CPU (gloo)."""

from __future__ import annotations

import pytest

from core.gpus import distributed
from core.checks import validate
from core.config.settings import Hardware, TrainConfig

CPU = Hardware(cuda=False, bf16=True, bitsandbytes=True)
TWO_GPUS = Hardware(cuda=True, bf16=True, bitsandbytes=True, gpus=2)


def fields(problems) -> set[str]:
    return {p.field for p in problems}


def test_one_gpu_is_the_default_and_needs_no_launcher():
    cfg = TrainConfig()
    assert cfg.num_gpus == "1" and not distributed.plan(cfg, n_gpus=2).distributed
    assert distributed.launch_command_text(cfg, n_gpus=2) == ""


def test_impossible_multi_gpu_settings_name_the_field_and_the_fix():
    bad = TrainConfig(num_gpus="4", num_machines=2, machine_rank=2, main_process_ip="", main_process_port=80)
    problems = validate(bad, TWO_GPUS)
    assert {"num_gpus", "machine_rank", "main_process_ip", "main_process_port"} <= fields(problems)
    text = "\n".join(str(p) for p in problems)
    assert "4 GPUs asked for but this machine shows 2" in text and "num_gpus: 2 or all" in text
    assert "outside 0..1" in text
    assert fields(validate(TrainConfig(num_gpus="two"), TWO_GPUS)) >= {"num_gpus"}
    assert fields(validate(TrainConfig(num_gpus="0"), TWO_GPUS)) >= {"num_gpus"}
    assert "distributed_strategy" in fields(validate(TrainConfig(distributed_strategy="zero3"), TWO_GPUS))


def test_fsdp_refuses_what_it_cannot_combine_with():
    cfg = TrainConfig(num_gpus="2", distributed_strategy="fsdp", offload_embeddings=True, optim="adamw_torch")
    assert "offload_embeddings" in fields(validate(cfg, TWO_GPUS))
    cpu = TrainConfig(num_gpus="2", distributed_strategy="fsdp", device="cpu", optim="adamw_torch")
    problems = [p for p in validate(cpu, CPU) if p.field == "distributed_strategy"]
    assert problems and "needs CUDA" in problems[0].message
    ok = TrainConfig(num_gpus="all", distributed_strategy="fsdp", optim="adamw_torch")
    assert not [p for p in validate(ok, TWO_GPUS) if p.field in ("num_gpus", "distributed_strategy")]
    assert "upcast_to_fp32" in fields(validate(ok, TWO_GPUS))  # the chapter's fp32 norms cannot share a 4-bit unit
    assert "upcast_to_fp32" not in fields(validate(ok.replace(upcast_to_fp32=False), TWO_GPUS))
    assert "upcast_to_fp32" not in fields(validate(ok.replace(distributed_strategy="ddp"), TWO_GPUS))


def test_auto_picks_ddp_when_the_model_fits_one_gpu_and_fsdp_otherwise_and_says_why():
    cfg = TrainConfig(num_gpus="all")
    fits = distributed.plan(cfg, n_gpus=2, fits_one_gpu=True)
    assert (fits.strategy, fits.world_size) == ("ddp", 2) and "fits one GPU" in fits.reason
    big = distributed.plan(cfg, n_gpus=2, fits_one_gpu=False)
    assert big.strategy == "fsdp" and "does not fit one GPU" in big.reason


def test_quant_storage_matches_the_compute_dtype_only_for_fsdp():
    cfg = TrainConfig(num_gpus="2", distributed_strategy="fsdp")
    assert distributed.quant_storage(cfg, distributed.plan(cfg, n_gpus=2)) == "bfloat16"
    ddp = cfg.replace(distributed_strategy="ddp")
    assert distributed.quant_storage(ddp, distributed.plan(ddp, n_gpus=2)) is None


def test_the_equivalent_accelerate_command_is_shown():
    cfg = TrainConfig(num_gpus="2", num_machines=2, machine_rank=0, main_process_ip="10.0.0.1",
                      main_process_port=29555, distributed_strategy="ddp")
    text = distributed.launch_command_text(cfg, "my.yaml", n_gpus=2)
    assert text.startswith("accelerate launch --num_processes 4 --num_machines 2 --machine_rank 0")
    assert "--main_process_ip 10.0.0.1 --main_process_port 29555" in text and "-m core.train --config my.yaml" in text
    fsdp = cfg.replace(distributed_strategy="fsdp", num_machines=1)
    assert "--fsdp_cpu_ram_efficient_loading true" in distributed.launch_command_text(fsdp, "my.yaml", n_gpus=2)


# --- real multi-process runs of the demo on the CPU (gloo): accelerate launch, no fakes -------------------------------
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WAIT = 600  # a bound for a busy 2-core machine, not a timing assert


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str, timeout: float = WAIT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "core.train", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)


def short_run(out: Path, port: int, *extra: str) -> list[str]:
    return ["--demo", "--set", "device=cpu", "--set", "num_gpus=2", "--set", f"main_process_port={port}",
            "--set", f"output_dir={out}", "--set", "max_steps=8", "--set", "logging_steps=1",
            "--set", "num_train_epochs=1", *extra]


def test_two_processes_over_loopback_train_one_adapter_and_rank_0_alone_writes(tmp_path, demo_model_path):
    """One data-parallel run of two processes, each started as its own "machine" (the multi-machine path; the
    one-machine launch of two workers is the Stop test below): one adapter, written by rank 0 alone, and the summary
    of both processes. Every 2-process run costs seconds of imports per process, so this one checks it all."""
    port = free_port()
    config = tmp_path / "two.yaml"
    from core.config.settings import demo_config

    # 10 rows per process and step: the 1-process run below takes the same 20 rows per step as 10 x 2 accumulation.
    cfg = demo_config(device="cpu", num_gpus="1", num_machines=2, main_process_ip="127.0.0.1", main_process_port=port,
                      max_steps=8, logging_steps=1, num_train_epochs=1, per_device_train_batch_size=10)
    cfg.save(config)
    # Both "machines" are this one: each takes one of its threads, not all of them.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MEMTUNE_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "core.train", "--config", str(config),
                               "--set", f"machine_rank={rank}", "--set", f"output_dir={tmp_path / f'machine{rank}'}"],
                              cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for rank in (0, 1)]
    outputs = [p.communicate(timeout=WAIT)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    runs = list((tmp_path / "machine0").iterdir())
    assert len(runs) == 1 and (runs[0] / "adapter" / "adapter_model.safetensors").is_file()
    assert (runs[0] / "adapter" / "adapter_config.json").is_file()
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["num_machines"] == 2
    assert summary["strategy"] == "ddp" and summary["status"] == "completed"
    assert len(summary["per_process_peak_gib"]) == 2
    assert not (tmp_path / "machine1").exists() or not any((tmp_path / "machine1").iterdir())  # rank 1: no folder
    losses = [e["loss"] for e in map(json.loads, (runs[0] / "events.jsonl").read_text().splitlines())
              if e["kind"] == "metrics"]
    assert len(losses) == 8 and losses[-1] < losses[0], losses
    # The same effective batch on one process (10 rows x 2 accumulation) sees the same rows in every optimizer step
    # (accelerate hands rank r every other batch of the one seeded order): the loss curves must agree, step by step.
    from core.train.recipe import run_training

    one = run_training(cfg.replace(num_machines=1, main_process_ip="", gradient_accumulation_steps=2,
                                   output_dir=str(tmp_path / "one")))
    one_losses = [e["loss"] for e in map(json.loads, (Path(one.run_dir) / "events.jsonl").read_text().splitlines())
                  if e["kind"] == "metrics"]
    assert one_losses == pytest.approx(losses, rel=1e-4), (one_losses, losses)


def test_stop_during_a_two_process_run_saves_the_adapter_and_leaves_no_process(tmp_path, demo_model_path):
    import time

    import psutil

    from core.config.settings import demo_config
    from core.jobs.manager import JobManager
    from core.jobs.view import job_view

    mgr = JobManager()
    job = mgr.start(demo_config(device="cpu", num_gpus="2", main_process_port=free_port(), max_steps=100000,
                                output_dir=str(tmp_path / "runs"), run_name="ddp-stop"))
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and job.running and not any(e["kind"] == "step" for e in job.events_since(0)):
        time.sleep(0.2)
    assert job.running, job_view(job).message
    pgid = job.pid
    mgr.stop()
    assert job.wait(WAIT)
    view = job_view(job)
    assert view.state == "stopped", view.message
    assert (Path(view.adapter_dir) / "adapter_model.safetensors").is_file()
    from tests.helpers import group_members

    assert not group_members(pgid)
    # the workers' own sessions too: no core.train.recipe process of this run is left anywhere
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def test_fsdp_on_the_cpu(tmp_path, demo_model_path):
    """accelerate's FSDP needs an accelerator device; run it for real where it can run, otherwise say exactly why."""
    script = tmp_path / "fsdp_probe.py"
    script.write_text("import torch\nfrom accelerate import Accelerator\nacc = Accelerator()\n"
                      "model = acc.prepare(torch.nn.Linear(4, 4))\nacc.backward(model(torch.ones(2, 4)).sum())\n")
    from core.gpus import distributed
    from core.config.settings import demo_config

    cfg = demo_config(device="cpu", num_gpus="2", distributed_strategy="fsdp", main_process_port=free_port())
    argv = distributed.worker_argv(distributed.plan(cfg, n_gpus=0), cfg, "unused")
    launcher = argv[:argv.index("-m", 3)]  # python -m accelerate.commands.launch FLAGS
    probe = subprocess.run([*launcher, str(script)], capture_output=True, text=True, timeout=WAIT)
    if probe.returncode != 0:
        errors = [line.strip() for line in probe.stderr.splitlines() if "Error:" in line]
        why = errors[0] if errors else f"exit code {probe.returncode}"
        pytest.skip(f"accelerate's FSDP does not run on this CPU-only machine ({why}); "
                    "FSDP-QLoRA needs a machine with two or more GPUs (not measured yet: bench/RESULTS.md, run 6)")
    out = tmp_path / "runs"
    proc = cli(*short_run(out, free_port(), "--set", "distributed_strategy=fsdp"))
    assert proc.returncode == 0, proc.stderr[-3000:]
