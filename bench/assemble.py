"""Build bench/grid_measured.json from the raw results of the 2026-11-29 runs (bench/results/).

    python -m bench.assemble

Run 1 (bench/results/2026-11-29-run1-results.json) had a leak: bitsandbytes' GlobalOptimManager kept every
run's embedding module alive (fixed since: core.model.release_library_references), so each later run started with
1-2 GiB of dead embeddings on the GPU. That memory is static, so run 1's peaks are corrected by subtracting it:
allocated/reserved minus (allocated right after loading - the clean value 5.374 GiB), NVML minus (NVML floor before
the run - the clean floor 1.512 GiB of run 2). Checked on the one configuration both runs measured (8 packs of
the call-1 "fastest+liger" = run 2's "fastest-6packs-sdpa"): corrected 16.79 / 17.88 / 19.25 GiB against clean
16.79 / 17.88 / 19.26 GiB. Raw values are kept next to the corrected ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from core.config import TrainConfig
from core.presets import matching

HERE = Path(__file__).resolve().parent
CLEAN_LOAD_GIB = {"llama-3.1-8b": 5.374}  # allocated after building the 4-bit model, after a first run
CLEAN_FLOOR_GIB = 1.512  # NVML before a run, after a first run (CUDA context, cuBLAS workspace)
HUB = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B", "qwen2.5-14b": "Qwen/Qwen2.5-14B",
       "llama-3.1-70b": "meta-llama/Llama-3.1-70B"}
KNOWN = set(TrainConfig().to_dict())
# Run 2 measured each preset twice: with the varlen attention experiment (which fell back to SDPA with an explicit
# row mask on torch 2.11) and with plain SDPA (what the presets now use). Keep the SDPA rows under the preset names.
VARLEN_DUPLICATES = {"lowest_memory", "fastest", "fastest-6packs"}
RENAMES = {"lowest_memory-sdpa": "lowest_memory", "fastest-sdpa": "fastest", "fastest-6packs-sdpa": "fastest-6packs"}


def config_of(r: dict) -> dict:
    """The run's TrainConfig as today's TrainConfig spells it (a field tried in run 2 and dropped is removed)."""
    cfg = {k: v for k, v in r["config"].items() if k in KNOWN}
    return TrainConfig.from_dict(cfg).to_dict()


def row(r: dict, run: str, env: dict) -> dict:
    cfg = config_of(r)
    first_run = r.get("nvml_floor_gib") == env.get("nvml_idle_gib")
    out = {
        "name": r["name"], "source": run, "arch": r["arch"], "hub_id": HUB[r["arch"]], "recipe": r["recipe"],
        "preset": "seed recipe (bench/seed_recipe.py)" if r["recipe"] == "seed" else
                  (matching(TrainConfig.from_dict(cfg)) or "custom"),
        "data": ("full rows: every row longer than max_length, so each micro-batch is batch x max_length tokens"
                 if r["data"] == "full" else "dolly-like lengths (lognormal, median 140 tokens)"),
        "largest_micro_batch_tokens": r.get("largest_micro_batch_tokens"),
        "peak_allocated_gib": r.get("peak_allocated_gib"), "peak_reserved_gib": r.get("peak_reserved_gib"),
        "nvml_peak_gib": r.get("nvml_peak_gib"),
        "tokens_per_s": r.get("tokens_per_s"),
        "config": cfg,
        "breakdown_gib": r.get("breakdown"),
    }
    if run == "run1" and not first_run and r["arch"] in CLEAN_LOAD_GIB and r["config"].get("load_in_4bit", True):
        leak = max(0.0, r["allocated_after_load_gib"] - CLEAN_LOAD_GIB[r["arch"]])
        leak_nvml = max(0.0, r["nvml_floor_gib"] - CLEAN_FLOOR_GIB)
        out["raw"] = {k: out[k] for k in ("peak_allocated_gib", "peak_reserved_gib", "nvml_peak_gib")}
        out["peak_allocated_gib"] = round(out["peak_allocated_gib"] - leak, 3)
        out["peak_reserved_gib"] = round(out["peak_reserved_gib"] - leak, 3)
        out["nvml_peak_gib"] = round(out["nvml_peak_gib"] - leak_nvml, 3)
        out["correction"] = f"leaked {leak:.3f} GiB allocated / {leak_nvml:.3f} GiB NVML subtracted"
    if run == "run2":
        for k in ("setup_peak_allocated_gib", "train_peak_allocated_gib", "train_peak_reserved_gib",
                  "train_peak_nvml_gib", "setup_peak_nvml_gib"):
            out[k] = r.get(k)
        if r["config"].get("attention") == "varlen":
            out["note"] = ("attention ran as SDPA with memtune's explicit row mask (the varlen experiment fell back"
                           " on this torch); memory as with SDPA")
    return out


def main() -> None:
    rows = []
    for run, path in (("run1", "2026-11-29-run1-results.json"), ("run2", "2026-11-29-run2-results.json")):
        data = json.loads((HERE / "results" / path).read_text())
        env = data["environment"]
        for r in data["results"]:
            if r.get("status") != "ok" or r.get("group") == "profile" or r["arch"] not in HUB:
                continue
            if run == "run1" and r["group"] not in ("grid", "lever"):
                continue  # run 2 re-measured the main rows cleanly
            if run == "run2" and r["name"] in VARLEN_DUPLICATES:
                continue  # same memory as the SDPA row of the same configuration; its speed is the fallback's
            rows.append(row(r, run, env))
            rows[-1]["name"] = RENAMES.get(r["name"], r["name"])
    env2 = json.loads((HERE / "results" / "2026-11-29-run2-results.json").read_text())["environment"]
    doc = {
        "about": "Measured peak GPU memory of QLoRA training runs on an NVIDIA H200 (bench/RESULTS.md). Models are "
                 "built from the real architecture configs with random weights (bench/synth.py); each row's "
                 "`config` is the full TrainConfig, ready for core.estimate. NVML = device memory used as "
                 "nvidia-smi reports it (sampled every 5 ms: a transient shorter than that can be missed).",
        "environment": env2,
        "rows": rows,
    }
    (HERE / "grid_measured.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(rows)} rows -> {HERE / 'grid_measured.json'}")
    for r in rows:
        print(f"{r['source']} {r['name']:34s} {r['arch']:14s} {r['preset']:16.16s} alloc {r['peak_allocated_gib']:7.3f} "
              f"reserved {r['peak_reserved_gib']:7.3f} nvml {r['nvml_peak_gib']:7.3f} tok/s {r['tokens_per_s']} "
              f"largest {r['largest_micro_batch_tokens']}")


if __name__ == "__main__":
    main()
