"""Issue 40: the first losses of a MoE run with its experts in NF4 against the same run with its experts in bf16.

    python -m bench.moe_losses --arch qwen3-30b-a3b-12l --preset lowest_memory --batches 4 --out DIR

One process, two loads of the same random-weight folder through the product's own steps (core.train.data's
plan_data, core.train.trainer's build_trainer, core.model.load's load_for_training): once as memtune loads it (every expert quantized
to NF4 as it is read, core/levers/experts.py), once with the experts left in bf16 (the loading hook off; everything
else, the attention and MLP Linears included, still in 4 bits). On the first `--batches` micro-batches of the Trainer's own dataloader
(the same rows, packed the same way) it records the Trainer's own loss (trainer.compute_loss, the preset's loss path)
and, on the first batch, the logits' relative difference. The adapter is at its initialisation (B = 0): the losses
are the base model's, as at step 1. Writes DIR/moe_losses.json.

Random weights make every loss close to ln(vocab): the logits' relative difference is the sharper of the two figures.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def losses_of(cfg, experts_nf4: bool, batches: int) -> dict:
    """The Trainer's first `batches` losses and the first batch's logits (on the CPU, fp32) for one load."""
    import torch

    from core.levers import experts as moe
    from core.model import load as model_load
    from core.train import data, trainer as train_lib

    events = []
    emit = events.append
    plan, tokenizer, path, _ = data.plan_data(cfg, emit)
    hook = moe.while_loading
    if not experts_nf4:  # the product's loader with only the experts' quantization off
        model_load.moe.while_loading = lambda c, p: contextlib.nullcontext()
    try:
        t0 = time.time()
        model, trainable, _ = model_load.load_for_training(cfg, path, emit, False)
        load_s = time.time() - t0
    finally:
        model_load.moe.while_loading = hook
    out_dir = Path(cfg.output_dir) / ("nf4" if experts_nf4 else "bf16")
    trainer = train_lib.build_trainer(cfg, model, tokenizer, plan.train_dataset(), out_dir, (), False, None,
                                      torch.cuda.is_available())
    loader = trainer.get_train_dataloader()
    losses, logits = [], None
    model.eval()  # no dropout; the adapter is at B = 0 either way
    with torch.no_grad():
        for i, batch in enumerate(loader):
            if i >= batches:
                break
            batch = trainer._prepare_inputs(batch)
            losses.append(float(trainer.compute_loss(trainer.model, batch)))
            if i == 0:
                keep = {k: v for k, v in batch.items() if k != "labels"}
                logits = trainer.model(**keep).logits.float().cpu()
    stored = {"experts_dtype": next((str(p.dtype) for n, p in model.named_parameters() if "experts" in n), None),
              "experts_buffers": sum(b.numel() * b.element_size() for n, b in model.named_buffers() if "experts" in n),
              "allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None}
    del trainer, model, loader
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return {"losses": losses, "load_s": round(load_s, 1), "trainable": trainable, "logits": logits, **stored,
            "moe_notes": [e.get("key") for e in events if str(e.get("key", "")).startswith("log.moe.")]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.moe_losses")
    ap.add_argument("--arch", default="qwen3-30b-a3b-12l")
    ap.add_argument("--preset", default="lowest_memory")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--rows", type=int, default=400)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from bench.product import write_dolly
    from core.config.presets import apply_preset
    from core.config.settings import TrainConfig

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("BENCH_WORK", "/tmp/memtune-bench"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = work / f"model-{args.arch}"
    if not (model_dir / "config.json").is_file():  # the same builder (and seed) as bench.product's rows
        subprocess.run([sys.executable, "-m", "bench.product", "--out", str(out), "--arch", args.arch,
                        "--build-only", str(model_dir)], cwd=str(ROOT), check=True)
    data = work / f"dolly-{args.rows}.jsonl"
    write_dolly(data, args.rows)
    cfg = TrainConfig(model=str(model_dir), dataset=str(data), dataset_split="train", max_steps=args.batches,
                      save_strategy="no", output_dir=str(work / "moe-losses"), run_name="moe-losses",
                      validation_share=0)
    cfg = apply_preset(cfg, args.preset)
    if not torch.cuda.is_available():
        cfg = cfg.replace(device="cpu")
    torch.manual_seed(0)
    nf4 = losses_of(cfg, True, args.batches)
    torch.manual_seed(0)
    bf16 = losses_of(cfg, False, args.batches)
    a, b = nf4.pop("logits"), bf16.pop("logits")
    rel_logits = float((a - b).norm() / b.norm()) if a is not None and b is not None else None
    rel = [abs(x - y) / abs(y) for x, y in zip(nf4["losses"], bf16["losses"])]
    result = {"arch": args.arch, "preset": args.preset, "nf4": nf4, "bf16": bf16,
              "loss_rel_diff": rel, "loss_rel_diff_max": max(rel) if rel else None,
              "logits_rel_diff_first_batch": rel_logits,
              "versions": {m: __import__(m).__version__ for m in ("torch", "transformers", "peft", "trl", "bitsandbytes")}}
    (out / "moe_losses.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
