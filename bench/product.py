"""Benchmark on the product path: one process per variant, `python -m core.train --config F` as a user runs it.

    python -m bench.product --out DIR [--plan call1|call2|smoke] [--only NAME,...] [--budget-s SECONDS]

Per call: a model folder with random bf16 weights of the architecture (bench/archs.py) is saved with
`save_pretrained` (in a child process, so this parent never holds GPU memory) and a dolly-format jsonl with
lognormal lengths (bench/synth.py) is written, once, with preference pairs of the same lengths when a plan's rows read
them (Variant.data "pairs": prompt, chosen, rejected), or photo-sized image rows (Variant.data "images", an image-text
architecture saved with its processor). Then every variant runs as its own process: a script (the
chapter's, bench/chapter_script.py, or Variant.module's) or `python -m core.train --config F --preset P --set ...`. This parent samples
NVML every 10 ms from outside (device used memory; GPU utilisation every 100 ms) and reads tokens and times from
the run's own events.jsonl (step events: cumulative tokens, seconds since training began).

Reported per variant: peak allocated (the run's summary.json), NVML peak (device used, minus nothing: the card
is idle between runs; the idle floor is recorded), steady tokens/s over the steps after the first `warm` steps,
and the warm-up apart: process start to the first step's end, time to training start, first-step time, median
steady step, and the warm-up pass (kernel_warmup) apart: its seconds from its own phase event; the first step and
the time to training start are counted from after it (training's clock starts when it ends), the time to the first
step from the process start (it holds the warm-up, as it holds the loading). Raw files (events, summary, log, NVML trace) go to DIR/runs/NAME/; DIR/results.json and DIR/table.md
sum them up; the table is printed last. `--plan smoke` runs the tiny model on the CPU (checks the code paths).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench.product_plans import Variant, plan
from core.gpus.vram import PeakTracker, device_used_bytes, driver_version, snapshot

ROOT = Path(__file__).resolve().parent.parent
PAIRS = 1000  # preference pairs written at most: a row trains on a few dozen; every pair is tokenized at the start


# --- model folder and data (built once per call) ------------------------------------------------------------------
def build_model_folder(arch: str, folder: Path, quantized: bool = False) -> None:
    """Random bf16 weights of `arch` (on the GPU when there is one: seconds for 8B), saved like a Hub download.

    quantized: saved already in 4-bit NF4 (double quant, data packed in bf16 so FSDP can shard it), like the Hub's
    "-bnb-nf4" repositories: a bf16 70B is 141 GB, more than the GPU machines' disks; in 4-bit it is ~40 GB. It is
    built straight into 4-bit one Linear at a time (bench/synth.py), never existing in bf16."""
    import torch
    from transformers import AutoModelForCausalLM

    from bench.archs import VISION_ARCHS, hf_config
    from bench.synth import build_model, make_tokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(1234)
    if arch in VISION_ARCHS:  # an image-text model: saved with its family's processor (bench/synth.py)
        from bench.synth import build_vision_model

        model, processor = build_vision_model(arch, device)
        model.to("cpu").save_pretrained(folder, max_shard_size="5GB")
        processor.save_pretrained(folder)
        return
    if quantized:
        model = build_model(arch, device, quantize=True, quant_storage=torch.bfloat16)
    else:
        try:
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(hf_config(arch), dtype=torch.bfloat16)
        except torch.OutOfMemoryError:  # larger than the GPU: drawn on the CPU (minutes for a 30B)
            model = None
            torch.cuda.empty_cache()
            model = AutoModelForCausalLM.from_config(hf_config(arch), dtype=torch.bfloat16)
        # saved from the CPU: transformers 5 splits fused experts back into per-expert tensors as it saves, a copy a
        # 61 GB MoE has no room for beside itself on an 80 GB card
        model.to("cpu")
        torch.cuda.empty_cache()
    model.save_pretrained(folder, max_shard_size="5GB")
    make_tokenizer().save_pretrained(folder)


def write_dolly(path: Path, n: int, seed: int = 0) -> dict:
    """Dolly-format rows (instruction, context, response) whose token counts follow synth.dolly_lengths."""
    from bench.synth import dolly_rows

    rows, lengths = dolly_rows(n, seed)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return {"rows": n, "median_tokens": float(statistics.median(lengths)), "mean_tokens": float(lengths.mean())}


def write_pairs(path: Path, n: int, seed: int = 0) -> dict:
    """Preference pairs (prompt, chosen, rejected) of dolly-like lengths (bench/synth.py preference_pairs)."""
    from bench.synth import preference_pairs

    rows, sides = preference_pairs(n, seed)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return {"rows": n, "median_sequence_tokens": float(statistics.median(sides)),
            "mean_sequence_tokens": round(float(sides.mean()), 1),
            "over_512_share": round(float((sides > 512).mean()), 4)}


# --- NVML sampler (outside the measured process): core.gpus.vram's, the one the run and the app use -------------------
def make_sampler() -> PeakTracker:
    """Device 0's used memory every 10 ms, the GPU utilisation every 100 ms, every sample kept (the trace)."""
    return PeakTracker(0, interval=0.01, series=True, util_every=10)


# --- one variant ----------------------------------------------------------------------------------------------------
def command(v: Variant, model_dir: Path, data: Path, run_dir: Path, smoke: bool) -> list[str]:
    if v.script:
        script = v.module or ("bench.unsloth_script" if v.peer else "bench.chapter_script")
        return [sys.executable, "-m", script, "--model", str(model_dir), "--data", str(data),
                "--out", str(run_dir), "--max-steps", str(v.steps), *v.script_args]
    if v.code:  # another commit's tree: only the fields every version since 2026-12-01 reads, as its own YAML
        cfg_path = run_dir.parent / f"{run_dir.name}.yaml"
        cfg_path.write_text("".join(f"{k}: {json.dumps(val)}\n" for k, val in {
            "model": str(model_dir), "dataset": str(data), "dataset_split": "train", "max_length": v.max_length,
            "max_steps": v.steps, "save_strategy": "no", "output_dir": str(run_dir.parent),
            "run_name": run_dir.name}.items()))
        return [sys.executable, "-m", "core.train", "--config", str(cfg_path), "--preset", v.preset,
                *(a for s in v.sets for a in ("--set", s))]
    from core.config.settings import TrainConfig

    cfg = TrainConfig(model=str(model_dir), dataset=str(data), dataset_split="train", max_length=v.max_length,
                      max_steps=v.steps, save_strategy="no", output_dir=str(run_dir.parent), run_name=run_dir.name)
    if smoke:
        cfg = cfg.replace(device="cpu")
    cfg_path = run_dir.parent / f"{run_dir.name}.yaml"
    cfg.save(cfg_path)
    cmd = [sys.executable, "-m", "core.train", "--config", str(cfg_path), "--preset", v.preset]
    if v.card_gib:  # the allocator capped like a smaller card (bench/capped.py runs the same CLI)
        cmd[1:3] = ["-m", "bench.capped", "--card-gib", f"{v.card_gib:g}", "--"]
    elif v.torch_steps:
        cmd[1:3] = ["-m", "bench.stepprof", "--out", str(run_dir.parent / f"{run_dir.name}.prof.json"),
                    "--torch-steps", v.torch_steps, "--"]
    elif v.profile:
        cmd[1:3] = ["-m", "bench.stepprof", "--out", str(run_dir.parent / f"{run_dir.name}.steps.json"), "--"]
    for s in v.sets:
        cmd += ["--set", s]
    return cmd


def read_events(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def speeds(steps: list[dict], warm: int, started: float) -> dict:
    """Steady tokens/s (steps after `warm`) and the warm-up, from step events (cumulative tokens, elapsed_s)."""
    if not steps:
        return {}
    el = [s["elapsed_s"] for s in steps]
    tok = [s["tokens"] for s in steps]
    dur = [el[0]] + [b - a for a, b in zip(el, el[1:])]
    res = {"steps_done": len(steps), "first_step_s": round(dur[0], 3),
           "to_first_step_s": round(steps[0]["time"] - started, 2),
           "to_train_start_s": round(steps[0]["time"] - el[0] - started, 2),
           "tokens_per_step": round(tok[-1] / len(steps), 1), "step_s": [round(d, 3) for d in dur]}
    k = min(warm, len(steps) - 1)
    if len(steps) - k >= 1 and el[-1] > el[k - 1 if k else 0]:
        base_t, base_n = (el[k - 1], tok[k - 1]) if k else (0.0, 0)
        res["steady_tokens_per_s"] = round((tok[-1] - base_n) / (el[-1] - base_t), 1)
        res["steady_window"] = f"steps {k + 1}-{len(steps)}"
        res["steady_step_s_median"] = round(statistics.median(dur[k:]), 3)
        res["first_over_steady"] = round(dur[0] / res["steady_step_s_median"], 2)
    res["overall_tokens_per_s"] = round(tok[-1] / el[-1], 1) if el[-1] else None
    return res


def warmup(events: list[dict], row: dict) -> dict:
    """The warm-up pass's seconds (the last `warming_up` phase event carries them; None: it did not run) and the
    one-time cost it holds: warm-up + first step against a steady step."""
    done = [e for e in events if e.get("kind") == "phase" and e.get("phase") == "warming_up" and "seconds" in e]
    out = {"warmup_s": done[-1]["seconds"] if done else None, "warmup_tokens": done[-1].get("tokens") if done else None}
    steady = row.get("steady_step_s_median")
    if done and steady and row.get("first_step_s") is not None:
        out["warmup_and_first_over_steady"] = round((out["warmup_s"] + row["first_step_s"]) / steady, 2)
    return out


def run_variant(v: Variant, model_dir: Path, data: Path, root: Path, sampler: PeakTracker, smoke: bool) -> dict:
    run_dir = root / "runs" / v.name
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = command(v, model_dir, data, run_dir, smoke)
    floor = device_used_bytes(0)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **v.env)
    if v.peer:  # the peer's own pins (trl<=1.15, datasets<5) ahead of the bench's wheels
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("UNSLOTH_SITE", ""), str(ROOT)) if p)
    log = (root / "runs" / f"{v.name}.log").open("w", encoding="utf-8")
    log.write(" ".join(cmd) + "\n")
    log.flush()
    sampler.start()
    started = time.time()
    if v.code:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / v.code), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(cmd, cwd=str(ROOT / v.code if v.code else ROOT), env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        rc = proc.wait(timeout=v.timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
        rc = f"timeout after {v.timeout_s} s (killed)"
    wall = time.time() - started
    sampler.stop()
    log.close()
    events = read_events(run_dir / "events.jsonl")
    steps = [e for e in events if e.get("kind") == "step"]
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    row = {"name": v.name, "variant": asdict(v), "command": " ".join(cmd[1:]), "rc": rc, "wall_s": round(wall, 1),
           "peak_allocated_gib": summary.get("peak_allocated_gib"), "peak_reserved_gib": summary.get("peak_reserved_gib"),
           "status": summary.get("status"), "final_loss": summary.get("final_loss"),
           **compile_split(summary.get("compile")),
           **({"stream_layers": summary["stream_layers"]} if summary.get("stream_layers") else {}),
           "nvml_floor_gib": round(floor / 2**30, 3) if floor is not None else None}
    samples = sampler.series
    if samples:
        row["nvml_peak_gib"] = round(max(s[1] for s in samples) / 2**30, 3)
        row["nvml_samples"] = len(samples)
        if steps:  # where in the run the NVML peak fell, and how busy the GPU was in the steady window
            t_peak = max(samples, key=lambda s: s[1])[0]
            t_train = steps[0]["time"] - steps[0]["elapsed_s"]
            row["nvml_peak_phase"] = "loading" if t_peak < t_train else "training"
            row["nvml_peak_loading_gib"] = round(max([s[1] for s in samples if s[0] < t_train] or [0]) / 2**30, 3)
            row["nvml_peak_training_gib"] = round(max([s[1] for s in samples if s[0] >= t_train] or [0]) / 2**30, 3)
            k = min(v.warm, len(steps) - 1)
            t0 = steps[k - 1]["time"] if k else t_train
            utils = [s[2] for s in samples if t0 <= s[0] <= steps[-1]["time"] and s[2] >= 0]
            row["gpu_util_steady_pct"] = round(sum(utils) / len(utils), 1) if utils else None
        with (root / "runs" / f"{v.name}.nvml.csv").open("w") as f:
            f.write("t_s,used_mib,util_pct\n")
            for t, used, util in samples[::5]:  # every 50 ms: the file stays small; the peak above uses all
                f.write(f"{t - started:.3f},{used / 2**20:.0f},{util}\n")
    # A profiled window (the last steps) is slower than the product: the steady speed is read before it.
    first_prof = int(v.torch_steps.split("-")[0]) if v.torch_steps else 0
    row.update(speeds(steps[:first_prof - 1] if first_prof > v.warm + 1 else steps, v.warm, started))
    row.update(warmup(events, row))
    losses = [e.get("loss") for e in events if e.get("kind") == "metrics" and e.get("loss") is not None]
    row.update(sampling_share(events, v.warm, row.get("steady_step_s_median")))
    row["first_losses"] = [round(x, 4) for x in losses[:5]]
    run_cfg = next((e.get("config") for e in events if e.get("kind") == "run" and e.get("config")), None) or {}
    row["settings"] = {k: run_cfg.get(k) for k in (  # what the preset resolved to: a changed lever shows here
        "per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "packing",
        "attention", "use_liger_kernel", "optim", "precision", "quantize_output_head", "offload_embeddings",
        "upcast_to_fp32", "kernel_warmup", "compile_layers", "offload_activations", "lora_target_modules") if k in run_cfg}
    row.update(predicted(cmd, v))
    prof = root / "runs" / f"{v.name}.prof.json"
    if prof.is_file():
        row["profile"] = json.loads(prof.read_text())
    return row


def sampling_share(events: list[dict], warm: int, steady_step_s: float | None) -> dict:
    """GRPO: the median seconds a steady step spent sampling answers (the metrics events' `sampling_s`, timed around
    GRPOTrainer's generate) and their share of the median step; {} for the stages that sample nothing."""
    sampled = [e["sampling_s"] for e in events if e.get("kind") == "metrics" and e.get("sampling_s") is not None
               and e.get("step", 0) > warm]
    if not sampled or not steady_step_s:
        return {}
    median = statistics.median(sampled)
    return {"sampling_s_median": round(median, 3), "sampling_share": round(median / steady_step_s, 3)}


def compile_split(compiled: dict | None) -> dict:
    """A compile_layers row's compile (summary.json `compile`): its seconds, graphs loaded and compiled, and where the
    seconds went by dynamo's own timers (core/model/compile.py `phases`): `capture_s` dynamo tracing the layers
    (everything below included), `backend_s` the backend inside it (AOT autograd + inductor, or their cache loads),
    the rest of `compile_s` the warm-up step itself and what runs outside dynamo's timers (kernel loads at first call)."""
    if not compiled:
        return {}
    cache = compiled.get("cache") or {}
    phases = cache.get("phases") or {}
    capture = next((t for k, t in phases.items() if k.endswith("compile_inner")), None)
    return {"compile": compiled, "compile_s": cache.get("seconds"), "compile_loaded": cache.get("loaded"),
            "compile_compiled": cache.get("compiled"), "capture_s": capture,
            "backend_s": phases.get("OutputGraph.call_user_compiler"),
            "tracing_s": round(capture - phases.get("OutputGraph.call_user_compiler", 0.0), 3) if capture else None}


def predicted(cmd: list[str], v: Variant) -> dict:
    """The estimate a user reads before Start for this row's config (`python -m core.estimate`, its own process, the
    same --preset and --set as the run; sized for the data's longest row), beside what NVML measured."""
    if v.script or v.code or "core.train" not in cmd:
        return {}
    at = cmd.index("--config")
    args = [a for a in cmd[at:] if a != "--"]
    out = subprocess.run([sys.executable, "-m", "core.estimate", *args, "--json", "--data"], cwd=str(ROOT),
                         capture_output=True, text=True, timeout=300)
    if out.returncode:
        return {"estimate_error": (out.stderr or out.stdout).strip()[-300:]}
    est = json.loads(out.stdout.strip().splitlines()[-1])
    return {"estimate_nvml_gib": est.get("nvml_peak_gib"), "estimate_allocated_gib": est.get("peak_allocated_gib"),
            "estimate_parts": {k: v for k, v in est.items() if k.endswith("_gib")}}


# --- the call ---------------------------------------------------------------------------------------------------------
def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "peft", "trl", "bitsandbytes", "accelerate", "datasets", "liger-kernel"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def fmt(x, nd=2, unit=""):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{nd}f}{unit}" if isinstance(x, (int, float)) else str(x)


def estimate_error(r: dict) -> str:
    """The estimate a user read before Start against the NVML peak measured: "7.12 GiB (+3.1%)", or "-"."""
    est, got = r.get("estimate_nvml_gib"), r.get("nvml_peak_gib")
    if est is None:
        return "-"
    return f"{est:.2f} GiB ({100 * (est / got - 1):+.1f}%)" if got else f"{est:.2f} GiB"


def table(rows: list[dict]) -> str:
    head = ("| run | peak allocated | NVML peak (phase) | estimate (error) | steady tokens/s (window) | median step | "
            "to first step | warm-up | first step | first/steady | GPU busy | rc |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['name']} | {fmt(r.get('peak_allocated_gib'), 2, ' GiB')} | "
            f"{fmt(r.get('nvml_peak_gib'), 2, ' GiB')} ({r.get('nvml_peak_phase', '-')}) | {estimate_error(r)} | "
            f"{fmt(r.get('steady_tokens_per_s'), 0)} ({r.get('steady_window', '-')}) | "
            f"{fmt(r.get('steady_step_s_median'), 2, ' s')} | {fmt(r.get('to_first_step_s'), 1, ' s')} | "
            f"{fmt(r.get('warmup_s'), 2, ' s')} | {fmt(r.get('first_step_s'), 2, ' s')} | {fmt(r.get('first_over_steady'), 1, 'x')} | "
            f"{fmt(r.get('gpu_util_steady_pct'), 0, '%')} | {r.get('rc')} |")
    return "\n".join(lines)


# --- against the last figures ---------------------------------------------------------------------------------------
SLOWER = 0.05  # a preset more than this much below its last same-call ratio to the chapter's script is flagged
MEASURED = ROOT / "bench" / "presets_measured.json"


def compared(rows: list[dict], last: dict[str, dict], arch: str, gpu: str = "") -> list[dict]:
    """Each plain preset row of this tree (the 8B shape, no settings but validation off, not a discarded warm row)
    against that preset's last figure (bench/presets_measured.json), as a ratio to the chapter's script in the same
    call: the yardstick absorbs a slower or faster machine (run 13: the same code ran 9,757-13,324 tok/s in one call;
    the chapter's script 311-336 across calls). A row without a same-call yardstick, or a last figure without one, is
    compared by tokens/s and says so, only on the GPU that figure was measured on (`gpu`: this call's card, e.g.
    "NVIDIA H100 80GB HBM3"; run 21's H100 rows were flagged -19% against H200 figures). Profiled rows (stepprof)
    are never compared: the profiler slows the step it measures."""
    chapter = next((r.get("steady_tokens_per_s") for r in rows if r.get("name") == "chapter-script"), None)
    out = []
    for r in rows:
        v = r.get("variant") or {}
        preset = v.get("preset")
        if (preset not in last or v.get("code") or r.get("name", "").endswith("-discarded")
                or v.get("profile") or v.get("torch_steps")
                or set(v.get("sets") or []) - {"validation_share=0"} or (v.get("arch") or arch) != "llama-3.1-8b"
                or not r.get("steady_tokens_per_s")):
            continue
        before, now = last[preset], r["steady_tokens_per_s"]
        if chapter and before.get("vs_chapter"):
            ratio, was, unit = now / chapter, before["vs_chapter"], "x the chapter's script"
        elif not same_gpu(gpu, before.get("gpu", "")):
            continue
        else:
            ratio, was, unit = now, before.get("tokens_per_s"), "tokens/s (no same-call yardstick)"
        if not was:
            continue
        change = ratio / was - 1
        out.append({"row": r["name"], "preset": preset, "now": round(ratio, 2), "last": was, "unit": unit,
                    "last_from": f'{before.get("section")}, {before.get("date")}', "change": round(change, 3),
                    "slower": change < -SLOWER})
    return out


def same_gpu(card: str, named: str) -> bool:
    """Whether this call's card (NVML's name) is the one a last figure names ("H200"); unknown on either side: yes."""
    return not card or not named or named.lower() in card.lower()


def say_compared(found: list[dict]) -> str:
    lines = []
    for c in found:
        text = (f'{c["row"]}: {c["now"]:,} {c["unit"]}, {100 * c["change"]:+.1f}% against its last figure '
                f'({c["last"]:,}, {c["last_from"]})')
        lines.append(("*** SLOWER: " + text + ": rerun to tell a regression from noise, then bisect "
                      "(bench/bisect_trees.sh) ***") if c["slower"] else text)
    return "\n".join(lines)


def with_warm_row(variants: list[Variant], smoke: bool) -> list[Variant]:
    """A discarded copy of the first preset row before it: in run 13 the first `fastest` process of each call ran
    9,757-10,247 tok/s where the same code ran 11,260-13,324 after it (GPU busy 57-59% against 69-83%)."""
    if smoke or any(v.name.endswith("-discarded") for v in variants):
        return variants
    i = next((i for i, v in enumerate(variants) if v.preset), None)
    if i is None:
        return variants
    v = variants[i]
    warm = Variant(f"{v.name}-discarded", v.preset, list(v.sets), steps=8, warm=3, timeout_s=90, arch=v.arch,
                   max_length=v.max_length, code=v.code, data=v.data, note="warms the machine: not compared")
    return variants[:i] + [warm] + variants[i:]


def rows_to_run(variants: list[Variant], only: set[str], warm: bool, smoke: bool) -> list[Variant]:
    """--only first, then the warm row, a copy of the first row that runs (run 20's `--only lowest_memory` was warmed
    by a discarded `fastest`, the plan's first row)."""
    kept = [v for v in variants if not only or v.name in only or v.name.endswith("-discarded")]
    return with_warm_row(kept, smoke) if warm else kept


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.product")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plan", default="call1")
    ap.add_argument("--arch", default=None, help="default: llama-3.1-8b (tiny-llama for --plan smoke)")
    ap.add_argument("--only", default="")
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--budget-s", type=float, default=540.0, help="skip variants that would end past this")
    ap.add_argument("--quantized", action="store_true", help="save the model already in 4-bit (70B: disk)")
    ap.add_argument("--no-warm-row", action="store_true", help="no discarded warm row (the machine is warm already)")
    ap.add_argument("--build-only", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    smoke = args.plan.endswith("smoke")
    arch = args.arch or ("tiny-llama" if smoke else "llama-3.1-8b")
    if args.build_only:  # child process: build the model folder
        build_model_folder(arch, Path(args.build_only), args.quantized)
        return 0
    t0 = time.time()
    root = Path(args.out)
    (root / "runs").mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("BENCH_WORK", "/tmp/memtune-bench"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "dolly.jsonl"
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "arch": arch, "plan": args.plan,
            "versions": versions(), "data": write_dolly(data, args.rows), "model_build_s": {}, "model_bytes": {}}
    variants = plan(args.plan)
    datas = {"": data, "pairs": work / "pairs.jsonl"}
    if any(v.data == "pairs" for v in variants):  # the preference rows' data (prompt, chosen, rejected)
        info["pairs"] = write_pairs(datas["pairs"], min(args.rows, PAIRS))
    datas["images"] = work / "images" / "train.jsonl"
    if any(v.data == "images" for v in variants):  # image rows: photo-sized PNGs with questions and answers
        from bench.synth import image_rows

        info["images"] = image_rows(datas["images"].parent)

    def folder(name: str) -> Path:
        """The model folder of architecture `name`, built the first time a variant needs it."""
        model_dir = work / f"model-{name}{'-nf4' if args.quantized else ''}"
        if not (model_dir / "config.json").is_file():
            b = time.time()
            subprocess.run([sys.executable, "-m", "bench.product", "--out", str(root), "--arch", name,
                            *(["--quantized"] if args.quantized else []), "--build-only", str(model_dir)],
                           cwd=str(ROOT), check=True)
            info["model_build_s"][name] = round(time.time() - b, 1)
            info["model_bytes"][name] = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
        return model_dir

    folder(arch)
    sampler = make_sampler()
    snap = snapshot()
    if snap.ok:
        info["gpu"], info["driver"] = snap.gpus[0].name, driver_version()
    else:
        info["gpu"] = snap.message  # the CPU smoke run: "no NVIDIA GPU found"
    print(json.dumps(info), flush=True)
    only = {s for s in args.only.split(",") if s}
    rows = []
    # MoE rows load for minutes and compare memory, not speed across calls: no discarded warm row; nor the preference
    # plans (dpo*), whose script row, first, warms the machine within one call's time
    warm = not (args.plan.startswith(("moe", "dpo")) or args.no_warm_row)
    for v in rows_to_run(variants, only, warm, smoke):
        left = args.budget_s - (time.time() - t0)
        if left < min(v.timeout_s, 60):
            rows.append({"name": v.name, "rc": f"skipped: {left:.0f} s left of the budget"})
            continue
        v.timeout_s = int(min(v.timeout_s, left))
        row = run_variant(v, folder(v.arch or arch), datas[v.data], root, sampler, smoke)
        row["arch"] = v.arch or arch
        rows.append(row)
        print(json.dumps({k: row.get(k) for k in ("name", "rc", "wall_s", "peak_allocated_gib", "nvml_peak_gib",
                                                  "steady_tokens_per_s", "to_first_step_s", "warmup_s", "first_step_s",
                                                  "steady_step_s_median", "gpu_util_steady_pct", "compile_s", "compile_loaded",
                                                  "compile_compiled", "tracing_s", "backend_s", "sampling_share")}), flush=True)
        (root / "results.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1), encoding="utf-8")
    found = compared(rows, json.loads(MEASURED.read_text())["presets"], arch, info.get("gpu", ""))
    (root / "results.json").write_text(json.dumps({"info": info, "rows": rows, "compared": found}, indent=1),
                                       encoding="utf-8")
    (root / "table.md").write_text(table(rows) + "\n\n" + say_compared(found) + "\n", encoding="utf-8")
    print(table(rows))
    print(say_compared(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
