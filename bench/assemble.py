"""The page's speed facts (assets/lever_facts.json) from the committed measurements, and, from the raw results of
the three 2026-11-29 runs (bench/results/), bench/grid_measured.json and bench/levers.json.

    python -m bench.assemble         # writes assets/lever_facts.json from bench/levers.json + grid_measured.json
    python -m bench.assemble --raw   # first rebuilds those two from bench/results/, prints rows and coverage

bench/levers.json compares the pairs of runs that bench/lever_pairs.yaml names (what each lever saves and costs).
assets/lever_facts.json is the small table the page prints from (ui/speed.py reads only it), per checklist item:
the measurements a user can open (their files are in this repository), each with its tokens/s and seconds per step
on and off, its memory saved, and the settings it ran at; the bench/RESULTS.md section each item's lever declares
(core/config/levers.py); and why an item is not measured. Every figure is copied from bench/levers.json.

Every row is one measured training run with its full TrainConfig (`config`, ready for core.estimate.predict), its peaks
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
- run 1 had a leak (fixed then by core.model.load.release_library_references, gone with the grid): bitsandbytes'
  GlobalOptimManager kept every run's embedding on the GPU. Its rows were corrected by subtracting the leaked, static amount. Every
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

import yaml

from bench.archs import HUB_IDS
from core.config import checklist, levers as registry
from core.config.settings import OPTIMIZERS, TrainConfig
from core.config.presets import matching, overrides

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FACTS = ROOT / "assets" / "lever_facts.json"  # what the page prints per checklist item (ui/speed.py)
RESULTS = HERE / "results"
BASELINE_FILE = "shared/gpu/BASELINE.md"  # lever_pairs.yaml's `baseline` rows
SOURCES = (("run1", "2026-11-29-run1-results.json"), ("run2", "2026-11-29-run2-results.json"),
           ("run3", "2026-11-29-run3-results.json"))
CLEAN_LOAD_GIB = {"llama-3.1-8b": 5.374}  # allocated after building the 4-bit model, after a first run
CLEAN_FLOOR_GIB = 1.512  # NVML before a run, after a first run (CUDA context, cuBLAS workspace; run 2)
HUB = {arch: hub for arch, hub in HUB_IDS.items() if arch != "tiny-llama"}  # the GPU rows (tiny-llama: dry runs)
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
    """The settings this run changed on top of the recipe or preset it started from (the removed in-process grid's Variant: bench/RESULTS.md)."""
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


def process_walk(results: list[dict]):
    """Each record of one process in order, with what earlier runs of that process left behind:
    (position, record, liger_patched, paged optimizer buffers left in GiB)."""
    liger_patched, leftover = False, 0.0
    for position, r in enumerate(results):
        yield position, r, liger_patched, leftover
        if r.get("config", {}).get("use_liger_kernel") and r["arch"] in LLAMA and r.get("status") in ("ok", "failed"):
            liger_patched = True
        if r.get("status") == "ok":
            leftover += (r.get("breakdown") or {}).get("cpu: optimizer state (paged)", 0.0)


def leaks_at_floor(results: list[dict]) -> dict[float, float]:
    """Run 1: the leaked allocation seen at each NVML floor, from its 4-bit runs after the first."""
    leaks: dict[float, float] = {}
    for position, r in enumerate(results):
        if (r.get("status") == "ok" and r.get("config", {}).get("load_in_4bit", True) and r["arch"] in CLEAN_LOAD_GIB
                and position):
            leaks[round(r["nvml_floor_gib"], 2)] = r["allocated_after_load_gib"] - CLEAN_LOAD_GIB[r["arch"]]
    return leaks


def process_rows(run: str, data: dict) -> list[dict]:
    """Every ok, non-profile run of one process, with what earlier runs of the process left behind."""
    leaks = leaks_at_floor(data["results"])
    return [build_row(r, run, position, liger_patched, leftover, leaks)
            for position, r, liger_patched, leftover in process_walk(data["results"])
            if r.get("status") == "ok" and r.get("group") != "profile" and r["arch"] in HUB
            and (run, r["name"]) not in VARLEN_DUPLICATES]


def main(argv: list[str] | None = None) -> None:
    import sys

    if "--raw" in (sys.argv[1:] if argv is None else argv):
        rebuild()
    facts = write_facts()
    print(f"{FACTS.relative_to(ROOT)}:")
    for key, entry in facts["checklist"].items():
        print(f"  {key}: {len(entry['measurements'])} measurement(s)"
              + (f", not measured: {entry['not_measured']}" if entry.get("not_measured") else ""))


def rebuild() -> None:
    """bench/grid_measured.json and bench/levers.json from the raw results (bench/results/)."""
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
                 "`config` is the full TrainConfig, ready for core.estimate.predict (bench/validate_estimate.py). NVML = "
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
PAIRS = HERE / "lever_pairs.yaml"  # which measured runs answer what each lever saves and costs (data, hand-kept)


def raw_index() -> dict[tuple[str, str], dict]:
    """(run, name) -> the raw record + what earlier runs of its process left (paged buffers, liger patch)."""
    out = {}
    for run, path in SOURCES:
        results = json.loads((RESULTS / path).read_text())["results"]
        for position, r, liger_patched, leftover in process_walk(results):
            out[(run, r["name"])] = dict(r, _leftover=leftover, _position=position,
                                         _liger_layers=bool(r.get("config", {}).get("use_liger_kernel")) or
                                         (liger_patched and r["arch"] in LLAMA))
    return out


def measured_side(ref: list[str], index: dict, leaks: dict, baseline: dict) -> dict:
    run, name = ref
    if run == "baseline":
        return {"file": BASELINE_FILE, "row": name, **baseline[name]}
    r = index[(run, name)]
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


def measurement(pair: dict, index: dict, leaks: dict, baseline: dict) -> dict:
    """One pair of lever_pairs.yaml: what the lever saved and cost between its two measured runs."""
    on, off = (measured_side(pair[side], index, leaks, baseline) for side in ("with", "without"))
    out = {
        "memory_saved_gib": {"peak_allocated": saving(on, off, "peak_allocated_gib"),
                             "nvml_peak": saving(on, off, "nvml_peak_gib")},
        "speed_ratio": round(on["tokens_per_s"] / off["tokens_per_s"], 3),
        "where": pair["where"], "on": on, "off": off,
    }
    if on.get("s_per_step") and off.get("s_per_step"):
        out["step_time_ratio"] = round(on["s_per_step"] / off["s_per_step"], 3)  # seconds per optimizer step
    train = saving(on, off, "train_peak_allocated_gib")
    if train is not None and train != out["memory_saved_gib"]["peak_allocated"]:
        out["memory_saved_gib"]["training_peak_allocated"] = train
    if pair.get("note"):
        out["note"] = pair["note"]
    return out


def write_levers(rows: list[dict]) -> dict:
    pairs = yaml.safe_load(PAIRS.read_text(encoding="utf-8"))
    index = raw_index()
    leaks = {(r["source"], r["name"]): {"raw": r["raw"], "correction": r["correction"]} for r in rows if "raw" in r}
    run1_leaks = leaks_at_floor(json.loads((RESULTS / dict(SOURCES)["run1"]).read_text())["results"])
    for (run, name), rec in index.items():  # run-1 rows left out of the grid: correct them the same way
        if run == "run1" and (run, name) not in leaks and rec.get("status") == "ok" and rec["_position"] and \
                rec.get("group") != "profile":
            built = build_row(rec, run, rec["_position"], False, 0.0, run1_leaks)
            if "raw" in built:
                leaks[(run, name)] = {"raw": built["raw"], "correction": built["correction"]}
                for k in ("peak_allocated_gib", "peak_reserved_gib", "nvml_peak_gib"):
                    rec[k] = built[k]
    for (run, name), rec in index.items():
        if (run, name) in leaks:
            for k in ("peak_allocated_gib", "peak_reserved_gib", "nvml_peak_gib"):
                rec[k] = next((r[k] for r in rows if r["source"] == run and r["name"] == name), rec[k])

    def collect(section: str) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for pair in pairs[section]:
            m = measurement(pair, index, leaks, pairs["baseline_rows"])
            out.setdefault(pair["key"], {"measurements": []})["measurements"].append(m)
        for key, entry in out.items():  # the first measurement is the headline
            entry["memory_saved_gib"] = entry["measurements"][0]["memory_saved_gib"]
            entry["speed_ratio"] = entry["measurements"][0]["speed_ratio"]
            if key in pairs["speed_not_a_cost"]:
                entry["speed_ratio"] = None
                entry["speed_note"] = pairs["speed_not_a_cost"][key]
        return out

    doc = {
        "about": "What each memory lever saves and costs, measured on one NVIDIA H200 (bench/RESULTS.md). "
                 "memory_saved_gib: the run with the lever off minus the run with it on (positive = the lever saves "
                 "memory; NVML compared without paged buffers that earlier runs of a process left). speed_ratio: "
                 "tokens/s with the lever on / off (0.6 = 40% slower, 2.0 = twice as fast). Each measurement names "
                 "its two rows and file; the first is the headline. `checklist` is keyed by core.config.checklist item "
                 "keys, `levers` by engine setting. Written by `python -m bench.assemble` from the raw results.",
        "checklist": collect("checklist"),
        "levers": collect("levers"),
        "not_measured": pairs["not_measured"],
    }
    (HERE / "levers.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


# --- assets/lever_facts.json: what the page prints per checklist item ---------------------------------------------
def _openable(file: str) -> bool:
    """Whether a measurement's file is in this repository, so a user can check it (shared/gpu/BASELINE.md is not)."""
    return bool(file) and (ROOT / file).is_file()


def _settings(side: dict, configs: dict[tuple[str, str], dict]) -> dict | None:
    """The model and the levers that say where a speed was measured (core.config.levers.speed_context) of the run
    with the lever on, from its row of grid_measured.json."""
    config = configs.get((str(side.get("run", "")), str(side.get("row", ""))))
    if config is None:
        return None
    cfg = TrainConfig.from_dict(config)
    return {"model": cfg.model, **{name: getattr(cfg, name) for name in registry.speed_context()}}


def lever_facts(levers: dict, grid: dict) -> dict:
    """The table ui/speed.py reads, from bench/levers.json (`levers`) and bench/grid_measured.json (`grid`)."""
    configs = {(str(r.get("source", "")), str(r.get("name", ""))): r["config"] for r in grid.get("rows", [])}
    items: dict[str, dict] = {}
    for item in checklist.ITEMS:
        entry = levers["checklist"].get(item.key, {})
        shown = [m for m in entry.get("measurements", []) if _openable(str(m["on"].get("file", "")))]
        section = registry.measured(item.key)
        if shown and not section:
            raise ValueError(f"{item.key} has measurements but its lever {item.fields[0]!r} cites no bench/RESULTS.md "
                             "section (core/config/settings.py: Lever.measured)")
        out: dict = {"section": section if shown else "",
                     "cost": "tokens_per_s" if entry.get("speed_ratio", 0) is not None else "step_time",
                     "measurements": []}
        for m in shown:
            row = {"speed_ratio": m["speed_ratio"], "memory_saved_gib": m["memory_saved_gib"],
                   **{side: {k: m[side][k] for k in ("tokens_per_s", "s_per_step") if m[side].get(k) is not None}
                      for side in ("on", "off")}}
            settings = _settings(m["on"], configs)
            if settings is not None:
                row["settings"] = settings
            out["measurements"].append(row)
        if item.key in levers.get("not_measured", {}):
            out["not_measured"] = levers["not_measured"][item.key]
        items[item.key] = out
    return {"about": "What the memory checklist prints per item (ui/speed.py): measured speed and memory on one "
                     "NVIDIA H200, copied from bench/levers.json (the measurements whose files are in this "
                     "repository) with the settings each ran at (bench/grid_measured.json), and the bench/RESULTS.md "
                     "section that reports them. Written by `python -m bench.assemble`; do not edit.",
            "results": registry.RESULTS, "checklist": items}


def committed_facts() -> dict:
    """assets/lever_facts.json's content from the committed measurements: the checklist's, and under `presets` each
    preset's latest product-path row (bench/presets_measured.json), so the page and README cite one source."""
    facts = lever_facts(json.loads((HERE / "levers.json").read_text()),
                        json.loads((HERE / "grid_measured.json").read_text()))
    facts["presets"] = json.loads((HERE / "presets_measured.json").read_text())["presets"]
    return facts


def write_facts(path: Path = FACTS) -> dict:
    facts = committed_facts()
    path.write_text(json.dumps(facts, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return facts


if __name__ == "__main__":
    main()
