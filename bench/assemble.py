"""Build bench/grid_measured.json from the raw results of the three 2026-11-29 runs (bench/results/).

    python -m bench.assemble   # writes bench/grid_measured.json and bench/levers.json, prints rows and coverage

Every row is one measured training run with its full TrainConfig (`config`, ready for core.estimate), its peaks
and the facts about the process it ran in that a reader (and bench/validate_estimate.py) needs:

- `source`: run1 | run2 | run3 (bench/results/2026-11-29-<source>-results.json), `process_position`: its place in
  that process (all runs of one call run one after another in one Python process).
- `liger_layers`: whether liger-kernel's RMSNorm / SwiGLU / RoPE ran in the model. liger patches transformers'
  Llama *module* (modeling_llama.LlamaRMSNorm, LlamaMLP, apply_rotary_pos_emb) when a run asks for it, so every
  Llama-architecture model built later in the same process gets them whatever its config says
  (`use_liger_kernel` stays the config's value: the Trainer-level fused loss). Rows where the two differ say so.
- `attention`: sdpa (transformers' SDPA; with packing, one attention over the whole micro-batch under a
  block-diagonal mask built from the position ids), varlen (bench/varlen.py: FlashAttention per packed row) or
  sdpa-fallback (run 2: varlen asked for, SDPA with bench/varlen.py's explicit row mask ran: memory as sdpa, 20-30%
  slower).
- `nvml_leftover_gib`: bitsandbytes paged optimizer buffers left by earlier runs of the process. bitsandbytes
  pages only state tensors of >= 1e5 elements (Llama-70B's LoRA matrices; none on 8B or 14B at r=16) and never
  frees them, so NVML counts them in every later run (the NVML floor before each run rises by exactly that).
  Torch's allocated/reserved peaks do not include them.

Which rows:
- run 2 and run 3 rows are used as measured (`raw` = the measurement).
- run 1 had a leak (fixed since: core.model.release_library_references): bitsandbytes' GlobalOptimManager kept
  every run's embedding on the GPU. Its rows were corrected by subtracting the leaked, static amount. Every
  run-1 configuration of the grid and of the lever chain was measured again, clean, in run 3, so run-1 rows are
  left out when a run-2/run-3 row has the same configuration (the raw file keeps them). A run-1 row with no
  clean twin would be kept with its `raw` values and `correction` (none remains).
- run 2 measured each preset with the varlen experiment (which fell back to SDPA with an explicit row mask on that
  torch) and with plain SDPA: the SDPA rows are kept under the preset names.
- Profile runs are left out (the profiler's own buffers inflate NVML).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from core.config import OPTIMIZERS, TrainConfig
from core.presets import matching, overrides

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SOURCES = (("run1", "2026-11-29-run1-results.json"), ("run2", "2026-11-29-run2-results.json"),
           ("run3", "2026-11-29-run3-results.json"))
CLEAN_LOAD_GIB = {"llama-3.1-8b": 5.374}  # allocated after building the 4-bit model, after a first run
CLEAN_FLOOR_GIB = 1.512  # NVML before a run, after a first run (CUDA context, cuBLAS workspace; run 2)
HUB = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B", "qwen2.5-14b": "Qwen/Qwen2.5-14B",
       "llama-3.1-70b": "meta-llama/Llama-3.1-70B"}
LLAMA = {"llama-3.1-8b", "llama-3.1-70b", "tiny-llama"}  # built from transformers' modeling_llama
KNOWN = set(TrainConfig().to_dict())
VARLEN_DUPLICATES = {("run2", "lowest_memory"), ("run2", "fastest"), ("run2", "fastest-6packs")}
RENAMES = {"lowest_memory-sdpa": "lowest_memory", "fastest-sdpa": "fastest", "fastest-6packs-sdpa": "fastest-6packs"}
# Settings that do not change what a step computes or holds: two runs differing only here are "the same".
NOT_MEMORY = {"run_name", "output_dir", "max_steps", "num_train_epochs", "logging_steps", "save_strategy",
              "save_steps", "resume_from", "device", "dataset_split", "seed"}


def config_of(r: dict) -> dict:
    """The run's TrainConfig as today's TrainConfig spells it (a field tried in run 2 and dropped is removed)."""
    cfg = {k: v for k, v in r["config"].items() if k in KNOWN}
    return TrainConfig.from_dict(cfg).to_dict()


def attention_of(r: dict) -> str:
    if (r.get("varlen_calls") or {}).get("varlen"):
        return "varlen"
    if r["config"].get("attention") == "varlen":  # run 2: fell back to SDPA with an explicit row mask (RESULTS.md)
        return "sdpa-fallback"  # memory as sdpa, speed 20-30% lower: not comparable in speed with plain sdpa rows
    return "sdpa"


def same_key(row: dict) -> tuple:
    cfg = {k: v for k, v in row["config"].items() if k not in NOT_MEMORY}
    return row["arch"], row["recipe"], row["attention"], json.dumps(cfg, sort_keys=True)


def changes_from(r: dict, cfg: dict) -> dict:
    """The settings this run changed on top of the recipe or preset it started from (bench/run.py's Variant)."""
    base = overrides("chapter" if r["recipe"] == "seed" else r.get("preset", "chapter"))
    base["max_length"] = 512
    return {k: cfg[k] for k in base if cfg.get(k) != base[k]}


def build_row(r: dict, run: str, position: int, liger_patched: bool, leftover: float,
              leaks_at_floor: dict[float, float]) -> dict:
    cfg = config_of(r)
    liger_layers = bool(cfg["use_liger_kernel"]) or (liger_patched and r["arch"] in LLAMA)
    row = {
        "name": RENAMES.get(r["name"], r["name"]), "source": run, "process_position": position,
        "arch": r["arch"], "hub_id": HUB[r["arch"]], "recipe": r["recipe"],
        "preset": "seed recipe (bench/seed_recipe.py)" if r["recipe"] == "seed" else
                  (matching(TrainConfig.from_dict(cfg)) or "custom"),
        "started_from": "seed recipe" if r["recipe"] == "seed" else r.get("preset", "chapter"),
        "changes": changes_from(r, cfg),
        "data": ("full rows: every row longer than max_length, so each micro-batch is batch x max_length tokens"
                 if r["data"] == "full" else "dolly-like lengths (lognormal, median 140 tokens)"),
        "attention": attention_of(r),
        "liger_layers": liger_layers,
        "largest_micro_batch_tokens": r.get("largest_micro_batch_tokens"),
        "peak_allocated_gib": r.get("peak_allocated_gib"), "peak_reserved_gib": r.get("peak_reserved_gib"),
        "nvml_peak_gib": r.get("nvml_peak_gib"),
        "nvml_floor_gib": r.get("nvml_floor_gib"),
        "nvml_leftover_gib": round(leftover, 4),
        "tokens_per_s": r.get("tokens_per_s"), "s_per_step": r.get("s_per_step"),
        "steady_steps": r.get("steady_steps"), "tokens_per_step": r.get("tokens_per_step"),
        "first_loss": (r.get("losses") or [None])[0],
        "config": cfg,
        "breakdown_gib": r.get("breakdown"),
    }
    for k in ("allocated_after_load_gib", "setup_peak_allocated_gib", "setup_peak_reserved_gib",
              "setup_peak_nvml_gib", "train_peak_allocated_gib", "train_peak_reserved_gib", "train_peak_nvml_gib"):
        if r.get(k) is not None:
            row[k] = r[k]
    notes = []
    if liger_layers and not cfg["use_liger_kernel"]:
        notes.append("liger's RMSNorm/SwiGLU/RoPE were active: an earlier run of this process patched transformers' "
                     "Llama classes (use_liger_kernel: false is the Trainer-level setting of this run)")
    if row["attention"] == "sdpa-fallback":
        notes.append("asked for the varlen experiment, which fell back to SDPA with an explicit row mask on this "
                     "torch: memory as with SDPA, speed lower")
    if leftover:
        notes.append(f"NVML includes {leftover:.3f} GiB of paged optimizer buffers left by earlier runs")
    if run == "run1" and r.get("nvml_floor_gib") is not None and position > 0 and r["arch"] in CLEAN_LOAD_GIB:
        leak_nvml = max(0.0, r["nvml_floor_gib"] - CLEAN_FLOOR_GIB)
        if cfg["load_in_4bit"]:
            leak = max(0.0, r["allocated_after_load_gib"] - CLEAN_LOAD_GIB[r["arch"]])
        else:  # a bf16 model loads more than 5.374 GiB: take the leak of a 4-bit run of the process at this floor
            leak = leaks_at_floor[round(r["nvml_floor_gib"], 2)]
        row["raw"] = {k: row[k] for k in ("peak_allocated_gib", "peak_reserved_gib", "nvml_peak_gib")}
        row["peak_allocated_gib"] = round(row["peak_allocated_gib"] - leak, 3)
        row["peak_reserved_gib"] = round(row["peak_reserved_gib"] - leak, 3)
        row["nvml_peak_gib"] = round(row["nvml_peak_gib"] - leak_nvml, 3)
        row["correction"] = f"leaked {leak:.3f} GiB allocated / {leak_nvml:.3f} GiB NVML subtracted"
    if notes:
        row["notes"] = notes
    return row


def process_rows(run: str, data: dict) -> list[dict]:
    """Every ok, non-profile run of one process, with what earlier runs of the process left behind."""
    rows, liger_patched, leftover = [], False, 0.0
    leaks_at_floor: dict[float, float] = {}  # run 1: the leaked allocation seen at each NVML floor (4-bit runs)
    for position, r in enumerate(data["results"]):
        ok = r.get("status") == "ok"
        if ok and r.get("config", {}).get("load_in_4bit", True) and r["arch"] in CLEAN_LOAD_GIB and position:
            leaks_at_floor[round(r["nvml_floor_gib"], 2)] = r["allocated_after_load_gib"] - CLEAN_LOAD_GIB[r["arch"]]
        if ok and r.get("group") != "profile" and r["arch"] in HUB and (run, r["name"]) not in VARLEN_DUPLICATES:
            rows.append(build_row(r, run, position, liger_patched, leftover, leaks_at_floor))
        if r.get("config", {}).get("use_liger_kernel") and r["arch"] in LLAMA and r.get("status") in ("ok", "failed"):
            liger_patched = True
        if ok:
            leftover += (r.get("breakdown") or {}).get("cpu: optimizer state (paged)", 0.0)
    return rows


def main() -> None:
    by_run: dict[str, list[dict]] = {}
    envs: dict[str, dict] = {}
    for run, path in SOURCES:
        data = json.loads((RESULTS / path).read_text())
        envs[run] = data["environment"]
        rows = process_rows(run, data)
        if run == "run1":
            rows = [r for r in rows if r["name"] != "seed"]  # run 2's first run is the same, clean
        by_run[run] = rows
    clean = {same_key(r) for run in ("run2", "run3") for r in by_run[run]}
    kept1 = [r for r in by_run["run1"] if same_key(r) not in clean]
    dropped1 = [r["name"] for r in by_run["run1"] if r not in kept1]
    rows = by_run["run3"] + by_run["run2"] + kept1
    doc = {
        "about": "Measured peak GPU memory of QLoRA training runs on one NVIDIA H200 (bench/RESULTS.md). Models are "
                 "built from the real architecture configs with random weights (bench/synth.py); each row's "
                 "`config` is the full TrainConfig, ready for core.estimate (bench/validate_estimate.py). NVML = "
                 "device memory used as nvidia-smi reports it (sampled every 5 ms: a transient shorter than that "
                 "can be missed). See bench/assemble.py for `liger_layers`, `attention` and `nvml_leftover_gib`.",
        "environment": envs["run3"],  # the latest run's; every run's below
        "environments": envs,
        "left_out": {"run1": f"{len(dropped1)} leak-corrected rows whose configuration run 2 or 3 measured again "
                             "(bench/results/2026-11-29-run1-results.json keeps them): " + ", ".join(dropped1)},
        "rows": rows,
    }
    (HERE / "grid_measured.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(rows)} rows -> {HERE / 'grid_measured.json'} (run-1 rows left out: {len(dropped1)})")
    for r in rows:
        print(f"{r['source']} {r['name']:34s} {r['arch']:14s} {r['preset'][:16]:16s} alloc {r['peak_allocated_gib']:7.3f} "
              f"reserved {r['peak_reserved_gib']:7.3f} nvml {r['nvml_peak_gib']:7.3f} tok/s {r['tokens_per_s']} "
              f"tokens {r['largest_micro_batch_tokens']} {'liger-layers' if r['liger_layers'] else ''} "
              f"{r['attention']} leftover {r['nvml_leftover_gib']}")
    print("\ncoverage:")
    for line in coverage(rows):
        print("  " + line)
    levers = write_levers(rows)
    print(f"\n{HERE / 'levers.json'}:")
    for section in ("checklist", "levers"):
        for key, entry in levers[section].items():
            print(f"  {section}.{key}: saves {entry['memory_saved_gib']} GiB, speed x{entry['speed_ratio']} "
                  f"({len(entry['measurements'])} measurement(s))")


def coverage(rows: list[dict]) -> list[str]:
    """What issue 5's grid asks for, and what the rows cover."""
    cfgs = [r["config"] for r in rows]
    archs = Counter(r["arch"] for r in rows)
    lengths = sorted({c["max_length"] for c in cfgs})
    batches = sorted({c["per_device_train_batch_size"] for c in cfgs})
    optims = sorted({c["optim"] for c in cfgs})
    kinds = {("8-bit" if OPTIMIZERS[o][1] else "32-bit") + (" paged" if OPTIMIZERS[o][2] else "") for o in optims}
    presets = Counter(r["preset"] for r in rows)
    return [
        f"rows: {len(rows)} (>= 12)",
        f"architectures: {', '.join(f'{a} ({n})' for a, n in sorted(archs.items()))}",
        f"max_length: {lengths}",
        f"micro-batch (rows or packs): {batches}",
        f"tokens per micro-batch: {min(r['largest_micro_batch_tokens'] for r in rows)}-"
        f"{max(r['largest_micro_batch_tokens'] for r in rows)}",
        f"gradient checkpointing: on {sum(c['gradient_checkpointing'] for c in cfgs)}, "
        f"off {sum(not c['gradient_checkpointing'] for c in cfgs)}",
        f"optimizers: {', '.join(optims)} ({', '.join(sorted(kinds))})",
        f"recipes/presets: {', '.join(f'{p} ({n})' for p, n in sorted(presets.items()))}",
    ]


# --- bench/levers.json: what each lever saves and costs, measured -------------------------------------------------
# shared/gpu/BASELINE.md (one process per row, real from_pretrained load, Llama-3.1-8B shape, max length 512):
BASELINE_ROWS = {
    "seed recipe": dict(peak_allocated_gib=8.22, peak_reserved_gib=9.48, nvml_peak_gib=10.87, tokens_per_s=235),
    "same, adamw_torch": dict(peak_allocated_gib=8.25, peak_reserved_gib=9.51, nvml_peak_gib=10.89, tokens_per_s=233),
    "same, gradient checkpointing off": dict(peak_allocated_gib=8.22, peak_reserved_gib=9.48, nvml_peak_gib=10.87,
                                             tokens_per_s=315),
    "no quantization (bf16 LoRA), no checkpointing, adamw_torch": dict(
        peak_allocated_gib=18.17, peak_reserved_gib=18.42, nvml_peak_gib=19.80, tokens_per_s=607),
}
BASELINE_FILE = "shared/gpu/BASELINE.md"

# (key, on = (run, name), off = (run, name), where, note). "run" is run1|run2|run3 or "baseline".
CHECKLIST_MEASUREMENTS = [
    ("gradient_checkpointing", ("run3", "+liger"), ("run3", "+no-ckpt"),
     "8B, 4-bit, one packed micro-batch of <= 512 tokens, liger, embedding in CPU memory, accumulation 4",
     "the lever chain's last step: checkpointing on vs off, nothing else changed"),
    ("gradient_checkpointing", ("run1", "+packing"), ("run1", "+packing-ckpt"),
     "8B, 4-bit, one packed micro-batch of <= 512 tokens, liger's layers, embedding in CPU memory",
     "run 1: memory corrected for its leak (bench/assemble.py)"),
    ("gradient_checkpointing", ("baseline", "seed recipe"), ("baseline", "same, gradient checkpointing off"),
     "8B, the seed recipe: batch 1, rows of ~165 tokens (<= 512), fp32 upcast",
     "the seed recipe's peak is loading's (fp32 upcast), so checkpointing cannot lower it here"),
    ("efficient_optimizer", ("baseline", "seed recipe"), ("baseline", "same, adamw_torch"),
     "8B, the seed recipe (paged_adamw_8bit vs adamw_torch), LoRA r=16 on q,k,v,o",
     "LoRA's optimizer state is tens of MiB: 0.026 vs 0.051 GiB on 8B, 0.125 vs 0.244 GiB on 70B (measured state "
     "sizes, bench/grid_measured.json breakdown_gib)"),
    ("qlora", ("baseline", "same, gradient checkpointing off"),
     ("baseline", "no quantization (bf16 LoRA), no checkpointing, adamw_torch"),
     "8B, batch 1, no checkpointing; 4-bit with the seed's fp32 upcast and paged 8-bit AdamW vs a bf16 base "
     "with adamw_torch", "two settings differ besides 4-bit (upcast and optimizer); the optimizer is worth 0.03 GiB"),
    ("qlora", ("run1", "fastest+ckpt"), ("run1", "fastest-bf16+ckpt"),
     "8B, 6 packs of <= 512 tokens per micro-batch, checkpointing, no fp32 upcast, liger's layers",
     "run 1: memory corrected for its leak (bench/assemble.py)"),
    ("small_batches", ("run2", "lowest_memory-1pack"), ("run2", "lowest_memory"),
     "8B, lowest_memory: 1 pack (<= 512 tokens) x 6 vs 2 packs x 3 per optimizer step",
     "both ran the varlen experiment's SDPA fallback (same memory as SDPA, 20-30% slower); the ratio is like for "
     "like. The peak is loading's in both, so the smaller micro-batch saves nothing at the peak"),
    ("small_batches", ("run1", "+packing"), ("run1", "lowest_memory-b2"),
     "8B, lowest_memory's levers: 1 pack x accumulation 4 vs 2 packs x 3, liger's layers",
     "run 1: memory corrected for its leak; accumulation differs (4 vs 3)"),
    ("short_max_length", ("run3", "g8-seed-512"), ("run3", "g8-seed-2048"),
     "8B, the seed recipe, batch 1, rows longer than max_length: 512 vs 2048",
     "tokens/s is not a cost here: a shorter max_length trains fewer tokens per row (time per optimizer step: "
     "1.23 s vs 1.22 s). The seed recipe's peak at 512 is loading's"),
    ("short_max_length", ("run3", "g8-low-512"), ("run3", "g8-low-2048"),
     "8B, lowest_memory (2 packs), max_length 512 vs 2048", "tokens/s is not a cost here (see above)"),
    ("short_max_length", ("run3", "g70-low-512"), ("run3", "g70-low-2048"),
     "70B, lowest_memory (2 packs), max_length 512 vs 2048", "tokens/s is not a cost here (see above)"),
]
LEVER_MEASUREMENTS = [
    ("no_fp32_upcast", ("run3", "+no-upcast"), ("run3", "chapter-acc4"),
     "8B, chapter settings, accumulation 4 (upcast_to_fp32: false)",
     "chapter-acc4's sampled NVML missed its loading transient (its twin g8-seed-512 caught 11.17 GiB)"),
    ("lora_dropout_0", ("run3", "+dropout0"), ("run3", "+no-upcast"), "8B, as above + no upcast", ""),
    ("offload_embeddings", ("run3", "+embed-on-cpu"), ("run3", "+dropout0"), "8B, as above + dropout 0",
     "the peak moves to loading (the embedding is loaded to the GPU, then moved); in training -0.98 GiB"),
    ("expandable_segments", ("run3", "+expandable"), ("run3", "+embed-on-cpu"), "8B, as above + embedding on CPU",
     "the peak is loading's; in training NVML 6.67 vs 7.25 GiB"),
    ("expandable_segments", ("run3", "fastest+expandable"), ("run3", "fastest (profile)"),
     "8B, fastest (8 packs, no checkpointing, liger)",
     "ONE run: 2 of its 7 steady steps took 2.3-2.6 s (others 0.45-0.58 s vs 0.43 s); the other run's speed is its "
     "one unprofiled steady step and its NVML includes profiler buffers (reserved: 22.24 vs 21.46 GiB)"),
    ("packing", ("run3", "+packing"), ("run3", "+expandable"), "8B, as above + expandable segments",
     "one pack of <= 512 tokens (~3 dolly rows) per micro-step instead of one row"),
    ("use_liger_kernel", ("run3", "+liger"), ("run3", "+packing"), "8B, as above + packing",
     "liger's layers were already active in this process (see grid_measured.json `liger_layers`): this is the "
     "Trainer-level part (fused loss) only"),
    ("use_liger_kernel", ("run1", "fastest+liger"), ("run1", "fastest"),
     "8B, 6 packs of <= 512 tokens, no checkpointing, no upcast", "clean: the first liger run of its process; "
     "run 1's memory corrected for its leak"),
    ("no_gradient_checkpointing", ("run3", "+no-ckpt"), ("run3", "+liger"), "8B, as above + liger", ""),
    ("varlen_attention", ("run3", "fastest+varlen"), ("run3", "fastest (profile)"),
     "8B, fastest (8 packs, no checkpointing, liger); bench/varlen.py, not an engine setting yet",
     "the other run's speed is its one unprofiled steady step; NVML vs g8-fast-512 (same settings, full rows): "
     "22.96 vs 23.76 GiB"),
]
SPEED_NOT_A_COST = {
    "short_max_length": "no speed cost per optimizer step (8B seed recipe, batch 1: 1.23 s at 512 vs 1.22 s at 2048); "
                        "tokens/s is lower only because rows are cut to fewer tokens",
}
NOT_MEASURED = {
    "bf16": "every benchmark run computed in bf16; no fp32 run was measured",
    "gradient_accumulation": "no pair of runs differs only in accumulation at the same micro-batch",
}


def raw_index() -> dict[tuple[str, str], dict]:
    """(run, name) -> the raw record + what earlier runs of its process left (paged buffers, liger patch)."""
    out = {}
    for run, path in SOURCES:
        liger_patched, leftover = False, 0.0
        for position, r in enumerate(json.loads((RESULTS / path).read_text())["results"]):
            out[(run, r["name"])] = dict(r, _leftover=leftover, _position=position,
                                         _liger_layers=bool(r.get("config", {}).get("use_liger_kernel")) or
                                         (liger_patched and r["arch"] in LLAMA))
            if r.get("config", {}).get("use_liger_kernel") and r["arch"] in LLAMA:
                liger_patched = True
            if r.get("status") == "ok":
                leftover += (r.get("breakdown") or {}).get("cpu: optimizer state (paged)", 0.0)
    return out


def measured_side(ref: tuple[str, str], index: dict, leaks: dict) -> dict:
    run, name = ref
    if run == "baseline":
        return {"file": BASELINE_FILE, "row": name, **BASELINE_ROWS[name]}
    r = index[ref]
    side = {"file": f"bench/results/{dict(SOURCES)[run]}", "run": run, "row": name}
    for k in ("peak_allocated_gib", "peak_reserved_gib", "nvml_peak_gib", "tokens_per_s", "s_per_step",
              "largest_micro_batch_tokens", "train_peak_allocated_gib", "train_peak_nvml_gib"):
        if r.get(k) is not None:
            side[k] = r[k]
    side["liger_layers"] = r["_liger_layers"]
    if r["_leftover"]:
        side["nvml_leftover_gib"] = round(r["_leftover"], 4)
    if (run, name) in leaks:
        side["leak_corrected"] = leaks[(run, name)]
    return side


def saving(on: dict, off: dict, key: str) -> float | None:
    if on.get(key) is None or off.get(key) is None:
        return None
    a, b = off[key], on[key]
    if key == "nvml_peak_gib":  # like for like: without paged buffers earlier runs of the process left
        a, b = a - off.get("nvml_leftover_gib", 0.0), b - on.get("nvml_leftover_gib", 0.0)
    return round(a - b, 3)


def measurement(spec: tuple, index: dict, leaks: dict) -> dict:
    _, on_ref, off_ref, where, note = spec
    on, off = measured_side(on_ref, index, leaks), measured_side(off_ref, index, leaks)
    out = {
        "memory_saved_gib": {"peak_allocated": saving(on, off, "peak_allocated_gib"),
                             "nvml_peak": saving(on, off, "nvml_peak_gib")},
        "speed_ratio": round(on["tokens_per_s"] / off["tokens_per_s"], 3),
        "where": where, "on": on, "off": off,
    }
    if on.get("s_per_step") and off.get("s_per_step"):
        out["step_time_ratio"] = round(on["s_per_step"] / off["s_per_step"], 3)  # seconds per optimizer step
    train = saving(on, off, "train_peak_allocated_gib")
    if train is not None and train != out["memory_saved_gib"]["peak_allocated"]:
        out["memory_saved_gib"]["training_peak_allocated"] = train
    if note:
        out["note"] = note
    return out


def write_levers(rows: list[dict]) -> dict:
    index = raw_index()
    leaks = {(r["source"], r["name"]): {"raw": r["raw"], "correction": r["correction"]} for r in rows if "raw" in r}
    for (run, name), rec in index.items():  # run-1 rows left out of the grid: correct them the same way
        if run == "run1" and (run, name) not in leaks and rec.get("status") == "ok" and rec["_position"] and \
                rec.get("group") != "profile":
            built = build_row(rec, run, rec["_position"], False, 0.0, _run1_leaks())
            if "raw" in built:
                leaks[(run, name)] = {"raw": built["raw"], "correction": built["correction"]}
                for k in ("peak_allocated_gib", "peak_reserved_gib", "nvml_peak_gib"):
                    rec[k] = built[k]
    for (run, name), rec in index.items():
        if (run, name) in leaks:
            for k in ("peak_allocated_gib", "peak_reserved_gib", "nvml_peak_gib"):
                rec[k] = next((r[k] for r in rows if r["source"] == run and r["name"] == name), rec[k])

    def collect(specs):
        out: dict[str, dict] = {}
        for spec in specs:
            m = measurement(spec, index, leaks)
            entry = out.setdefault(spec[0], {"measurements": []})
            entry["measurements"].append(m)
        for key, entry in out.items():  # the first measurement is the headline
            entry["memory_saved_gib"] = entry["measurements"][0]["memory_saved_gib"]
            entry["speed_ratio"] = entry["measurements"][0]["speed_ratio"]
            if key in SPEED_NOT_A_COST:
                entry["speed_ratio"] = None
                entry["speed_note"] = SPEED_NOT_A_COST[key]
        return out

    doc = {
        "about": "What each memory lever saves and costs, measured on one NVIDIA H200 (bench/RESULTS.md). "
                 "memory_saved_gib: the run with the lever off minus the run with it on (positive = the lever saves "
                 "memory; NVML compared without paged buffers that earlier runs of a process left). speed_ratio: "
                 "tokens/s with the lever on / off (0.6 = 40% slower, 2.0 = twice as fast). Each measurement names "
                 "its two rows and file; the first is the headline. `checklist` is keyed by core.checklist item "
                 "keys, `levers` by engine setting. Written by `python -m bench.assemble` from the raw results.",
        "checklist": collect(CHECKLIST_MEASUREMENTS),
        "levers": collect(LEVER_MEASUREMENTS),
        "not_measured": NOT_MEASURED,
    }
    (HERE / "levers.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def _run1_leaks() -> dict[float, float]:
    leaks: dict[float, float] = {}
    for position, r in enumerate(json.loads((RESULTS / dict(SOURCES)["run1"]).read_text())["results"]):
        if r.get("status") == "ok" and r.get("config", {}).get("load_in_4bit", True) and position:
            leaks[round(r["nvml_floor_gib"], 2)] = r["allocated_after_load_gib"] - CLEAN_LOAD_GIB[r["arch"]]
    return leaks


if __name__ == "__main__":
    main()
