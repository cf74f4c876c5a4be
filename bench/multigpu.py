"""Data-parallel on the product path: one GPU vs two, same per-GPU micro-batch, each variant one process tree.

    python -m bench.multigpu --out OUT [--steps 20] [--smoke]

Each variant is `python -m core.train --config F --preset P --set num_gpus=N ...` (memtune launches the workers
through accelerate itself); NVML is sampled every 10 ms for every GPU from this process; tokens/s come from the
run's own step events (the Trainer counts tokens over all processes). The 2-GPU run keeps the per-GPU micro-batch
and splits the accumulation (the preset's, rounded up to an even number), so the effective batch, and so the loss
curve, is the 1-GPU run's.
--smoke runs the same on the CPU with the tiny demo model and 2 CPU processes (gloo), to check the script here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.product import ROOT, read_events, speeds, versions, write_dolly
from core.gpus.vram import PeakTracker, device_count, device_used_bytes


class AllGpus:
    """Peak NVML 'used' per GPU while entered: one core.gpus.vram sampler per GPU (threads of this process; nothing inside
    the measured processes). No NVML (the CPU smoke run): no GPUs, empty lists."""

    def __init__(self, interval: float = 0.01):
        self.trackers = [PeakTracker(i, interval=interval) for i in range(device_count())]

    def used(self) -> list[int]:
        return [device_used_bytes(t.device) or 0 for t in self.trackers]

    @property
    def peaks(self) -> list[int]:
        return [t.peak_bytes or 0 for t in self.trackers]

    def __enter__(self):
        for t in self.trackers:
            t.start()
        return self

    def __exit__(self, *exc):
        for t in self.trackers:
            t.stop()


VARIANTS = [  # (name, preset, processes, strategy, model); the effective batch is the same for 1 and 2 processes
    ("lowest_memory-1gpu", "lowest_memory", 1, "ddp", "llama-3.1-8b"),
    ("lowest_memory-2gpu", "lowest_memory", 2, "ddp", "llama-3.1-8b"),
    ("fastest-1gpu", "fastest", 1, "ddp", "llama-3.1-8b"),
    ("fastest-2gpu", "fastest", 2, "ddp", "llama-3.1-8b"),
    # FSDP-QLoRA: the 70B saved in 4-bit with bf16 storage (bench/product.py --quantized), sharded over 2 GPUs;
    # the embedding stays on the GPU (FSDP shards it). Its 1-GPU reference is run 6's lowest_memory 70B row.
    ("fsdp-70b-lowest_memory-2gpu", "lowest_memory", 2, "fsdp", "llama-3.1-70b-nf4"),
]


def run(name: str, preset: str, n: int, strategy: str, model: Path, data: Path, root: Path, steps: int,
        smoke: bool) -> dict:
    from core.config.settings import TrainConfig, apply_overrides
    from core.config.presets import apply_preset

    base = apply_preset(TrainConfig(model=str(model), dataset=str(data), dataset_split="train", max_length=512,
                                    save_strategy="no", logging_steps=1, output_dir=str(root / "runs"), run_name=name),
                        preset, None)
    # The same effective batch on 1 and 2 GPUs (rows per optimizer step): the preset's accumulation rounded up to
    # an even number, split over the processes, so the loss curves are comparable step for step.
    accumulation = (base.gradient_accumulation_steps + base.gradient_accumulation_steps % 2) // n
    sets = [f"num_gpus={n}", f"gradient_accumulation_steps={accumulation}", f"max_steps={steps}",
            f"distributed_strategy={strategy}", f"main_process_port={29500 + len(name)}"]
    if strategy == "fsdp":
        sets += ["offload_embeddings=false"]
    if smoke:
        sets += ["device=cpu", "use_liger_kernel=false", "attention=sdpa", "offload_embeddings=false",
                 "expandable_segments=false"]
    cfg_path = root / f"{name}.yaml"
    base.save(cfg_path)
    cmd = [sys.executable, "-m", "core.train", "--config", str(cfg_path)] + [a for s in sets for a in ("--set", s)]
    log = (root / f"{name}.log").open("w")
    started = time.time()
    floor = AllGpus().used()  # what is in use before the run (CUDA contexts of nobody else: should be ~0)
    with AllGpus() as gpus:
        code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              env=dict(os.environ, PYTHONUNBUFFERED="1")).returncode
    run_dir = root / "runs" / name
    events = read_events(run_dir / "events.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    steps_ev = [e for e in events if e.get("kind") == "step"]
    row = {"name": name, "rc": code, "processes": n, "accumulation": accumulation,
           "micro_batch": base.per_device_train_batch_size, "wall_s": round(time.time() - started, 1),
           "nvml_peak_gib": [round(b / 2**30, 3) for b in gpus.peaks],
           "nvml_floor_gib": [round(b / 2**30, 3) for b in floor],
           "per_process_peak_allocated_gib": summary.get("per_process_peak_gib"),
           "losses": [e["loss"] for e in events if e.get("kind") == "metrics"], "status": summary.get("status"),
           "world_size": summary.get("world_size"), "strategy": summary.get("strategy"),
           "arch": model.name.removeprefix("model-"),
           "config": apply_overrides(base, sets).to_dict()}  # what the workers ran: bench.validate_estimate reads it
    row.update({k: v for k, v in speeds(steps_ev, 3, started).items() if k != "step_s"})
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.multigpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", default="")
    args = ap.parse_args(argv)
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("BENCH_WORK", "/tmp/memtune-bench"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "dolly.jsonl"
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "versions": versions(),
            "data": write_dolly(data, 3000)}
    rows = []
    for name, preset, n, strategy, arch in VARIANTS:
        if (args.only and name not in args.only.split(",")) or (args.smoke and strategy == "fsdp"):
            continue  # FSDP needs CUDA: no CPU smoke of it
        arch = "tiny-llama" if args.smoke else arch
        model = work / f"model-{arch}"
        if not (model / "config.json").is_file():  # in another process: this one must hold no GPU memory
            subprocess.run([sys.executable, "-m", "bench.product", "--out", str(root),
                            "--arch", arch.removesuffix("-nf4"), *(["--quantized"] if arch.endswith("-nf4") else []),
                            "--build-only", str(model)], cwd=ROOT, check=True)
        rows.append(run(name, preset, n, strategy, model, data, root, args.steps, args.smoke))
        print(json.dumps({k: rows[-1].get(k) for k in ("name", "rc", "nvml_peak_gib", "steady_tokens_per_s",
                                                          "to_first_step_s", "losses")}), flush=True)
        (root / "multigpu.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    for preset in ("lowest_memory", "fastest"):
        one = next((r for r in rows if r["name"] == f"{preset}-1gpu"), None)
        two = next((r for r in rows if r["name"] == f"{preset}-2gpu"), None)
        if one and two and one.get("steady_tokens_per_s") and two.get("steady_tokens_per_s"):
            k = min(len(one["losses"]), len(two["losses"]), 5)
            print(f"{preset}: 2 GPUs / 1 GPU = {two['steady_tokens_per_s'] / one['steady_tokens_per_s']:.2f}x; "
                  f"first {k} losses 1 GPU {one['losses'][:k]} vs 2 GPUs {two['losses'][:k]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
