"""Benchmark: the chapter's recipe against memtune's engine and presets, on real architectures with random weights.

    python -m bench.run --out DIR [--plan all|main|followup|grid|dry]
                        [--models llama-3.1-8b,qwen2.5-14b,llama-3.1-70b] [--only NAME,...] [--skip NAME,...]
                        [--budget-s SECONDS]

Plans: main = the 8B table (seed recipe, engine chapter preset, presets and variants); grid = issue 5's rows
(8B, 14B, 70B; every micro-batch full); followup = what bench/RESULTS.md lists as not measured yet; all =
everything (more than one 10-minute call); dry = a tiny model on the CPU.

Every run builds its model afresh (bench.synth: 4-bit, layer by layer, fixed seed), trains a few optimizer steps
and records: peak allocated / reserved (torch), NVML peak (device used memory, sampled every 5 ms), steady-state
non-padding tokens/s and s/step (steps after the first), the loss of every step, a memory breakdown and, for some
runs, a torch.profiler summary of two micro-steps. Writes DIR/results.json, DIR/grid_measured.json,
DIR/profiles.txt, DIR/table.md and prints the table last. Runs run one after another in this process; memory is
released between them (the NVML floor before each run is recorded).

`--plan dry` runs a tiny model on the CPU: it checks the code paths, not the numbers.
The plans are in bench/plans.py, what is written from the results in bench/run_report.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.archs import HUB_IDS
from bench.plans import Variant, dry_plan, followup_plan, gpu_plan, grid_plan, main_plan
from bench.run_report import grid_rows, math_check, profile_text, table


# --- one run ----------------------------------------------------------------------------------------------------
def engine_config(v: Variant, out_dir: Path, cuda: bool):
    from core.config import Hardware, TrainConfig
    from core.presets import apply_preset

    base = TrainConfig(model=HUB_IDS[v.arch], dataset=f"bench/synthetic-{v.data}", dataset_split="train",
                       max_steps=v.steps, logging_steps=1, save_strategy="no", output_dir=str(out_dir),
                       run_name=v.name.replace("+", "plus-"), device="cuda" if cuda else "cpu")
    hw = None if cuda else Hardware(cuda=False, bf16=True, bitsandbytes=True)  # CPU dry run: no liger
    return apply_preset(base, v.preset, hw).replace(**v.changes)


def seed_changes(v: Variant, cuda: bool) -> dict[str, Any]:
    """SFTConfig arguments that the seed recipe's grid rows change (the chapter's own values otherwise)."""
    keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "max_length", "gradient_checkpointing",
            "optim")
    out = {k: v.changes[k] for k in keys if k in v.changes}
    if not cuda:
        out["use_cpu"] = True
    return out


def gib(n: float | int | None) -> float | None:
    return None if n is None else round(n / 2**30, 3)


def run_one(v: Variant, tokenizer, datasets, nvml, cuda: bool, workdir: Path) -> dict[str, Any]:
    import torch

    from bench import measure, seed_recipe, synth
    from core import model as model_lib
    from core import train as train_lib

    cfg = engine_config(v, workdir, cuda)
    if v.recipe == "seed":
        # The seed recipe has no TrainConfig; this is the chapter preset with the same changes, for the grid file.
        cfg = cfg.replace(optim=v.changes.get("optim", "paged_adamw_8bit"))
    device = "cuda" if cuda else "cpu"
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model_lib.release_library_references()
    model_lib.configure_cuda(cfg)  # the seed rows get the default allocator (expandable_segments False)
    nvml.start()
    rec: dict[str, Any] = {"name": v.name, "arch": v.arch, "recipe": v.recipe, "preset": v.preset if v.recipe ==
                           "engine" else "seed", "group": v.group, "note": v.note, "data": v.data,
                           "nvml_floor_gib": gib(nvml.floor), "grid": v.grid}
    t0 = time.perf_counter()
    model = trainer = counter = None
    try:
        dataset = datasets(v.data, cfg.max_length)
        model = synth.build_model(v.arch, device, quantize=cfg.load_in_4bit)
        rec["build_s"] = round(time.perf_counter() - t0, 1)
        rec["allocated_after_load_gib"] = gib(torch.cuda.memory_allocated()) if cuda else None
        if v.recipe == "seed":
            model = seed_recipe.prepare(model, tokenizer, lora_seed=cfg.seed)
            args = seed_recipe.training_args(str(workdir / v.name), v.steps, **seed_changes(v, cuda))
        else:
            model.config.use_cache = False  # what core.model.load_model does after loading
            torch.manual_seed(cfg.seed)  # LoRA A init: the same draw as the seed recipe's
            model = model_lib.prepare_for_training(model, cfg)
            if v.varlen:
                from core import attention as varlen

                varlen.use_varlen_attention(model.get_base_model())
        rec["allocated_after_prepare_gib"] = gib(torch.cuda.memory_allocated()) if cuda else None
        if v.recipe == "engine" and cfg.packing and v.group != "grid":
            rec["packing_check"] = packing_check(model, device)
        decoder = model.get_base_model().model
        counter = measure.TokenCounter(decoder, device)
        meter = measure.StepMeter(counter, cuda, nvml if cuda else None)
        prof = measure.ProfileStep(at_step=v.steps, micro_steps=2, cuda=cuda) if v.profile else None
        callbacks = [meter] + ([prof] if prof else [])
        if v.recipe == "seed":
            trainer = seed_recipe.trainer(model, tokenizer, dataset, args, callbacks)
        else:
            trainer = train_lib.build_trainer(cfg, model, tokenizer, dataset, workdir / v.name, callbacks=callbacks)
        rec["setup_s"] = round(time.perf_counter() - t0, 1)
        if v.varlen:
            from core import attention as varlen

            varlen.VARLEN_CALLS.update(varlen=0, sdpa=0)
        trainer.train()
        if v.varlen:
            rec["varlen_calls"] = dict(varlen.VARLEN_CALLS)
        rec["train_s"] = round(time.perf_counter() - t0 - rec["setup_s"], 1)
        steady = meter.steady(skip=1) if not v.profile else steady_without_last(meter)
        setup = meter.setup_peaks
        train_alloc = torch.cuda.max_memory_allocated() if cuda else None
        train_reserved = torch.cuda.max_memory_reserved() if cuda else None
        rec.update(
            status="ok",
            peak_allocated_gib=gib(max(train_alloc, setup.get("allocated", 0))) if cuda else None,
            peak_reserved_gib=gib(max(train_reserved, setup.get("reserved", 0))) if cuda else None,
            setup_peak_allocated_gib=gib(setup.get("allocated")), setup_peak_reserved_gib=gib(setup.get("reserved")),
            setup_peak_nvml_gib=gib(setup.get("nvml")),
            allocated_at_train_start_gib=gib(setup.get("allocated_at_train_start")),
            train_peak_allocated_gib=gib(train_alloc), train_peak_reserved_gib=gib(train_reserved),
            tokens_per_s=round(steady["tokens_per_s"], 1) if steady["tokens_per_s"] else None,
            s_per_step=round(steady["s_per_step"], 3) if steady["s_per_step"] else None,
            steady_steps=steady["steps"], steady_tokens=steady["tokens"],
            tokens_per_step=round(steady["tokens"] / steady["steps"]) if steady["steps"] else None,
            largest_micro_batch_tokens=int(counter.largest.item()),
            losses=[meter.losses[k] for k in sorted(meter.losses)],
            steps=meter.steps,
            trl_num_tokens=[log.get("num_tokens") for log in meter.logs if "num_tokens" in log],
            breakdown=measure.static_breakdown(model, getattr(trainer, "optimizer", None)),
        )
        if prof and prof.summary:
            rec["profile"] = prof.summary
    except Exception as exc:  # noqa: BLE001 - one failed run must not lose the others
        rec.update(status="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=6))
        if cuda:
            rec["peak_allocated_gib"] = gib(torch.cuda.max_memory_allocated())
            rec["peak_reserved_gib"] = gib(torch.cuda.max_memory_reserved())
    finally:
        if counter is not None:
            counter.remove()
        train_nvml = nvml.stop() if cuda else None
        rec["train_peak_nvml_gib"] = gib(train_nvml)
        setup_nvml = (rec.get("setup_peak_nvml_gib") or 0) * 2**30
        rec["nvml_peak_gib"] = gib(max(train_nvml, setup_nvml)) if cuda else None
        rec["wall_s"] = round(time.perf_counter() - t0, 1)
        rec["config"] = cfg.to_dict()
        if trainer is not None:
            trainer.accelerator.free_memory() if hasattr(trainer, "accelerator") else None
        del trainer, model
        gc.collect()
        model_lib.release_library_references()  # bitsandbytes keeps the embedding module otherwise (a leak)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            rec["allocated_after_cleanup_gib"] = gib(torch.cuda.memory_allocated())
    return rec


def steady_without_last(meter) -> dict:
    """Steady state over steps 2..n-1: the last step is the profiled one (profiling slows it down)."""
    from bench.measure import StepMeter

    trimmed = StepMeter(meter.counter, False)
    trimmed.steps = meter.steps[:-1]
    return trimmed.steady(skip=1)


def packing_check(model, device) -> dict:
    """Does attention respect row boundaries in a padding-free pack? Logits of row b packed after row a (with
    per-row position ids) against row b alone. Uses the model's own attention implementation (sdpa)."""
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 8000, (1, 37), generator=g)
    b = torch.randint(0, 8000, (1, 53), generator=g)
    base = model.get_base_model()
    was_training = base.training
    base.eval()
    with torch.no_grad(), torch.autocast(device_type="cuda" if device == "cuda" else "cpu", dtype=torch.bfloat16):
        packed = torch.cat([a, b], 1).to(device)
        pos = torch.cat([torch.arange(37), torch.arange(53)])[None].to(device)
        # use_cache=False as in training: with a KV cache, transformers does not look for packed rows
        out_packed = base(input_ids=packed, position_ids=pos, use_cache=False).logits[0, 37:].float()
        out_alone = base(input_ids=b.to(device), use_cache=False).logits[0].float()
        out_causal = base(input_ids=packed, use_cache=False).logits[0, 37:].float()  # rows see each other
        # bf16 noise floor: row b again, in a longer sequence (later tokens cannot change it: causal)
        out_longer = base(input_ids=torch.cat([b, a], 1).to(device), use_cache=False).logits[0, :53].float()
    base.train(was_training)
    rel = ((out_packed - out_alone).norm() / out_alone.norm()).item()
    rel_wrong = ((out_causal - out_alone).norm() / out_alone.norm()).item()
    noise = ((out_longer - out_alone).norm() / out_alone.norm()).item()
    return {"rel_diff_packed_vs_alone": round(rel, 5), "rel_diff_without_position_ids": round(rel_wrong, 5),
            "rel_diff_bf16_noise_floor": round(noise, 5),
            "respects_boundaries": rel < max(2 * noise, 0.02) and rel < rel_wrong / 10}


# --- report -----------------------------------------------------------------------------------------------------
def environment(cuda: bool, argv: list[str]) -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    versions = {}
    for pkg in ("torch", "transformers", "peft", "trl", "bitsandbytes", "accelerate", "datasets", "liger-kernel",
                "triton"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0) if cuda else "none (CPU dry run)",
        "python": platform.python_version(),
        "versions": versions,
        "command": "python -m bench.run " + " ".join(argv),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m bench.run")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plan", default="all", choices=["all", "main", "followup", "grid", "dry"])
    ap.add_argument("--models", default="", help="comma-separated architectures to keep (bench/archs.py)")
    ap.add_argument("--only", default="", help="comma-separated run names to keep")
    ap.add_argument("--skip", default="", help="comma-separated run names to leave out")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no run that would end after this")
    args = ap.parse_args(argv)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from bench import measure, synth

    started = time.monotonic()
    cuda = torch.cuda.is_available() and args.plan != "dry"
    plan = {"all": gpu_plan, "main": main_plan, "followup": followup_plan, "grid": grid_plan,
            "dry": dry_plan}[args.plan]()
    if args.models:
        keep = set(args.models.split(","))
        plan = [v for v in plan if v.arch in keep]
    if args.only:
        keep = set(args.only.split(","))
        plan = [v for v in plan if v.name in keep]
    if args.skip:
        drop = set(args.skip.split(","))
        plan = [v for v in plan if v.name not in drop]
    if not cuda:
        plan = [v for v in plan if not v.changes.get("use_liger_kernel")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    nvml = measure.NvmlPeak()
    idle = nvml.used() if cuda else None  # before this process creates its CUDA context
    env = environment(cuda, argv)
    env["nvml_idle_gib"] = gib(idle)
    print(json.dumps(env), flush=True)

    tokenizer = synth.make_tokenizer()
    cache: dict[tuple, Any] = {}

    def datasets(kind: str, max_length: int):
        key = (kind, max_length if kind == "full" else 0)
        if key not in cache:
            cache[key] = synth.make_dataset(kind, 600 if kind == "dolly" else 400, max_length, seed=0)[0]
        return cache[key]

    results: list[dict] = []
    workdir = Path(tempfile.mkdtemp(prefix="memtune-bench-"))
    for v in plan:
        elapsed = time.monotonic() - started
        if elapsed + v.est_s > args.budget_s:
            print(f"[bench] skip {v.name}: {elapsed:.0f} s used, ~{v.est_s:.0f} s needed, budget {args.budget_s:.0f} s",
                  flush=True)
            results.append({"name": v.name, "arch": v.arch, "recipe": v.recipe, "group": v.group,
                            "status": "skipped (time budget)", "config": engine_config(v, workdir, cuda).to_dict()})
            continue
        print(f"[bench] {v.name} ({v.arch}, {v.recipe}/{v.preset}) ...", flush=True)
        rec = run_one(v, tokenizer, datasets, nvml, cuda, workdir)
        results.append(rec)
        print(f"[bench] {v.name}: {rec.get('status')} alloc {rec.get('peak_allocated_gib')} reserved "
              f"{rec.get('peak_reserved_gib')} nvml {rec.get('nvml_peak_gib')} tok/s {rec.get('tokens_per_s')} "
              f"s/step {rec.get('s_per_step')} wall {rec.get('wall_s')} s {rec.get('error', '')}", flush=True)
        if rec.get("status") == "failed":
            print(rec.get("traceback", ""), flush=True)
        # write after every run: a run stopped at its time limit still returns what it measured
        payload = {"environment": env, "math_check": math_check(results), "results": results}
        (out / "results.json").write_text(json.dumps(payload, indent=1, default=str))
        (out / "grid_measured.json").write_text(json.dumps({"environment": env, "rows": grid_rows(results, env)},
                                                           indent=1, default=str))
        (out / "profiles.txt").write_text(profile_text(results))
        text = table(results)
        (out / "table.md").write_text(text + "\n\nmath check: " + json.dumps(math_check(results), indent=1) + "\n")
    print("\nmath check (loss vs seed recipe):", json.dumps(math_check(results)), flush=True)
    print(f"total {time.monotonic() - started:.0f} s\n", flush=True)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
