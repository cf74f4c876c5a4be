"""Issue 5's proof: core.estimate.predict's prediction for every measured row of bench/grid_measured.json.

    python -m bench.validate_estimate            # prints the tables, writes them into bench/RESULTS.md and the
                                                 # chapter's table to bench/CHAPTER_TABLE.md; exit 1 on a miss
    python -m bench.validate_estimate --no-write # the same check without touching RESULTS.md (tests/CI)
    python -m bench.validate_estimate --strict   # compare with the sampled NVML peak only (see "reference" below)

For each row: the row's TrainConfig and the built-in shape of its hub id (core.model.shapes.SHAPES: never the Hugging
Face cache), plus what is known about how the row ran (bench/assemble.py):
- `liger_layers`: liger's RMSNorm/SwiGLU/RoPE were in the model (an earlier run of the process patched transformers'
  Llama module), passed as `estimate(..., liger_layers=)`;
- `attention`: sdpa or varlen (bench/varlen.py), passed as `estimate(..., attention=)`;
- full-row data (every row longer than max_length): `equal_length_rows=True` (no padding mask);
- `nvml_leftover_gib`: paged optimizer buffers left on the GPU by earlier runs of the process, added to the predicted
  NVML (core.estimate.predict predicts a fresh process).

Reference for the NVML check: the sampled NVML peak (every 5 ms). Where it is provably below the true peak, i.e.
more than MISSED_MARGIN_GIB below what torch's own reserved peak implies (peak reserved + the process's measured
non-PyTorch memory + paged buffers, `implied_nvml`), the sampler missed a transient and that lower bound is the
reference; the table marks those rows with `*` and `--strict` ignores this rule. A row passes within TOLERANCE of
its reference.

Several GPUs (`--multigpu FILE ...`, default: MULTIGPU): rows of `python -m bench.multigpu` (one process tree per row,
NVML sampled for every GPU from the bench process). Each row's per-GPU estimate (core.estimate.predict for the row's config,
world size and strategy) against the NVML peak of every GPU the run used: device-level "used" memory, the figure
the one-GPU calibration uses too (it includes the driver's ~0.60 GiB floor). The config is the row's `config`
(TrainConfig.to_dict()) when it records one, else rebuilt the way bench/multigpu.py builds it: the preset named by
the row (`preset`, or the name before its last "-"), max_length 512, `micro_batch`, `accumulation`, `processes`,
`strategy` (default ddp) and `sets` ("field=value"); rows measured before the fastest preset switched to varlen
attention (VARLEN_PRESET_SINCE) ran with SDPA.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from core.config.settings import TrainConfig, apply_overrides
from core.config.slices import ModelSlice, PlaceSlice, TrainerSlice, Training
from core.estimate.predict import GIB, estimate
from core.config.presets import PRESETS, apply_preset
from core.model.shapes import SHAPES

HERE = Path(__file__).resolve().parent
GRID = HERE / "grid_measured.json"
RESULTS_MD = HERE / "RESULTS.md"
TOLERANCE = 0.10
MISSED_MARGIN_GIB = 0.05  # a sampled NVML peak this far below what torch's reserved peak implies: a missed transient
BEGIN, END = "<!-- validate_estimate: begin -->", "<!-- validate_estimate: end -->"
CHAPTER_MD = HERE / "CHAPTER_TABLE.md"
CHAPTER_BEGIN, CHAPTER_END = "<!-- chapter_table: begin -->", "<!-- chapter_table: end -->"
MULTIGPU = [HERE / "results" / "2026-12-01-multigpu.json"]  # bench/RESULTS.md run 5 (DDP, 2x H200)
VARLEN_PRESET_SINCE = "2026-12-01 01:51"  # from this commit on, the fastest preset uses varlen attention
OFFLOAD_PRESET_SINCE = "2026-12-02 05:00"  # ... and lowest_memory offloads its layer inputs (run 11)
LEAN_PACKS_SINCE = "2026-12-04 19:00"  # ... and lowest_memory runs 4 packs x 2 with varlen attention (run 18)


class _Levers(ModelSlice, TrainerSlice, Protocol):
    """The levers a preset changed since: attention, activation offloading, the micro-batch and accumulation."""


class _Run(Training, PlaceSlice, Protocol):
    """What core.estimate.predict.estimate reads."""


L = TypeVar("L", bound=_Levers)


def preset_as_run(cfg: L, date: str, preset: str | None = None) -> L:
    """A config built from today's presets, as the presets were on `date` (a results file's info date); `preset`:
    the preset the config was built from, for changes that were one preset's."""
    if date < VARLEN_PRESET_SINCE:
        cfg = cfg.replace(attention="sdpa")
    if date < OFFLOAD_PRESET_SINCE:
        cfg = cfg.replace(offload_activations=False)
    if date < LEAN_PACKS_SINCE and preset == "lowest_memory":
        cfg = cfg.replace(per_device_train_batch_size=2, gradient_accumulation_steps=3,
                          attention=TrainConfig.attention)
    return cfg
ARCH_HUB = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B", "qwen2.5-14b": "Qwen/Qwen2.5-14B",
            "llama-3.1-70b": "meta-llama/Llama-3.1-70B", "llama-3.1-70b-nf4": "meta-llama/Llama-3.1-70B"}


@dataclass
class Check:
    row: dict
    pred_alloc: float
    pred_reserved: float
    pred_nvml: float  # fresh process
    pred_nvml_here: float  # + what earlier runs of the process left on the GPU
    phase: str
    reference: float
    missed_transient: bool

    @property
    def alloc_error(self) -> float:
        return (self.pred_alloc - self.row["peak_allocated_gib"]) / self.row["peak_allocated_gib"]

    @property
    def nvml_error(self) -> float:
        return (self.pred_nvml_here - self.reference) / self.reference

    @property
    def raw_nvml_error(self) -> float:
        return (self.pred_nvml_here - self.row["nvml_peak_gib"]) / self.row["nvml_peak_gib"]

    @property
    def ok(self) -> bool:
        return abs(self.nvml_error) <= TOLERANCE


def process_context(rows: list[dict]) -> dict[str, float]:
    """Per process (`source`): its non-PyTorch GPU memory (CUDA context, cuBLAS/cuDNN, ...), the median over its rows
    whose peaks are in training of NVML - reserved - paged optimizer buffers (its own and earlier runs')."""
    out: dict[str, float] = {}
    for source in sorted({r["source"] for r in rows}):
        values = sorted(
            r["train_peak_nvml_gib"] - r["train_peak_reserved_gib"] - r.get("nvml_leftover_gib", 0.0)
            - (r.get("breakdown_gib") or {}).get("cpu: optimizer state (paged)", 0.0)
            for r in rows if r["source"] == source and r.get("train_peak_reserved_gib") is not None
            and r["train_peak_reserved_gib"] >= (r.get("setup_peak_reserved_gib") or 0.0))
        if values:
            out[source] = values[len(values) // 2]
    return out


def implied_nvml(row: dict, context: dict[str, float]) -> float | None:
    """The NVML peak torch's own reserved peak implies (reserved + the process's non-PyTorch memory + paged buffers),
    or None where it cannot be known: no per-phase peaks (run 1), or the first run of a process, whose CUDA
    libraries are not all initialised while it loads."""
    if row["source"] not in context or not row.get("process_position"):
        return None
    in_training = (row.get("train_peak_reserved_gib") or 0.0) >= (row.get("setup_peak_reserved_gib") or 0.0)
    own_paged = (row.get("breakdown_gib") or {}).get("cpu: optimizer state (paged)", 0.0) if in_training else 0.0
    return row["peak_reserved_gib"] + context[row["source"]] + row.get("nvml_leftover_gib", 0.0) + own_paged


def check_row(row: dict, context: dict[str, float] | None = None) -> Check:
    cfg = TrainConfig.from_dict(row["config"])
    est = estimate(cfg, SHAPES[row["hub_id"]], liger_layers=row.get("liger_layers"),
                   attention="varlen" if row.get("attention") == "varlen" else "sdpa",
                   equal_length_rows=str(row.get("data", "")).startswith("full rows"),
                   # runs 1-3 predate the loader that puts an offloaded embedding straight into CPU memory
                   embedding_via_gpu=row.get("embedding_via_gpu", row["source"] in ("run1", "run2", "run3")))
    measured = row["nvml_peak_gib"]
    implied = None if context is None else implied_nvml(row, context)
    missed = implied is not None and implied > measured + MISSED_MARGIN_GIB
    return Check(row, est.peak_allocated_gib, est.peak_reserved_gib, est.total_gib,
                 est.total_gib + row.get("nvml_leftover_gib", 0.0), est.peak_phase,
                 implied if missed else measured, missed_transient=missed)


def load_rows(path: Path = GRID) -> list[dict]:
    return json.loads(path.read_text())["rows"]


def validate(rows: list[dict] | None = None, strict: bool = False) -> list[Check]:
    rows = load_rows() if rows is None else rows
    context = None if strict else process_context(rows)
    return [check_row(r, context) for r in rows]


def _what(row: dict) -> str:
    base = row.get("started_from") or row.get("preset", "")
    changes = row.get("changes") or {}
    short = {"per_device_train_batch_size": "b", "max_length": "len", "gradient_checkpointing": "ckpt",
             "optim": "", "gradient_accumulation_steps": None, "use_liger_kernel": "liger",
             "offload_embeddings": "embed-cpu", "expandable_segments": "expandable", "upcast_to_fp32": "upcast",
             "lora_dropout": "dropout", "packing": "packing", "load_in_4bit": "4bit"}
    parts = []
    for k, v in changes.items():
        label = short.get(k, k)
        if label is None:
            continue
        parts.append(str(v) if label == "" else f"{label} {'on' if v is True else 'off' if v is False else v}")
    if row.get("attention") == "varlen":
        parts.append("varlen attention")
    return base + (" + " + ", ".join(parts) if parts else "")


def table(checks: list[Check]) -> str:
    arch = {"llama-3.1-8b": "8B", "llama-3.1-70b": "70B", "qwen2.5-14b": "14B"}
    lines = ["| row | run | model | recipe / preset + changes | tokens | alloc predicted | alloc measured | error | "
             "NVML predicted | NVML measured | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        r = c.row
        nvml = f"{r['nvml_peak_gib']:.2f}"
        err = f"{100 * c.raw_nvml_error:+.1f}%"
        if c.missed_transient:
            nvml += f" (>= {c.reference:.2f} *)"
            err += f" ({100 * c.nvml_error:+.1f}% *)"
        if not c.ok:
            err = f"**{err}**"
        flags = ("L" if r.get("liger_layers") and not r["config"]["use_liger_kernel"] else "") + \
                ("+" if r.get("nvml_leftover_gib") else "")
        lines.append(f"| {r['name']}{' ' + flags if flags else ''} | {r['source']} | {arch.get(r['arch'], r['arch'])} | "
                     f"{_what(r)} | {r['largest_micro_batch_tokens']:,} | {c.pred_alloc:.2f} | "
                     f"{r['peak_allocated_gib']:.2f} | {100 * c.alloc_error:+.1f}% | {c.pred_nvml_here:.2f} | {nvml} | "
                     f"{err} |")
    return "\n".join(lines)


def summary(checks: list[Check]) -> str:
    n_ok = sum(c.ok for c in checks)
    worst = max(checks, key=lambda c: abs(c.nvml_error))
    worst_alloc = max(checks, key=lambda c: abs(c.alloc_error))
    raw_misses = [c for c in checks if abs(c.raw_nvml_error) > TOLERANCE]
    within5 = sum(abs(c.nvml_error) <= 0.05 for c in checks)
    text = (f"{n_ok} of {len(checks)} rows within {TOLERANCE:.0%} of the measured NVML peak ({within5} within 5%); "
            f"worst: {worst.row['name']} ({worst.row['source']}) {100 * worst.nvml_error:+.1f}%. Peak allocated: worst "
            f"{worst_alloc.row['name']} ({worst_alloc.row['source']}) {100 * worst_alloc.alloc_error:+.1f}%, "
            f"{sum(abs(c.alloc_error) <= 0.02 for c in checks)} of {len(checks)} within 2%.")
    if raw_misses:
        text += (" Against the sampled NVML peak alone (`--strict`), " + ", ".join(
            f"{c.row['name']} ({c.row['source']}) {100 * c.raw_nvml_error:+.1f}%" for c in raw_misses) +
            " miss: their sampler missed the loading transient that torch's reserved peak proves (*).")
    return text


def write_results(text: str, path: Path = RESULTS_MD, begin: str = BEGIN, end: str = END) -> None:
    md = path.read_text()
    block = f"{begin}\n{text}\n{end}"
    if begin in md and end in md:
        md = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, md, flags=re.S)
    else:
        md = md.rstrip() + "\n\n" + block + "\n"
    path.write_text(md)


# --- issue 5, item 4: the chapter's table beside memtune's prediction and the measured peaks ------------------------
CHAPTER = {"7B": ("~14 GB", "~4-6 GB"), "13B": ("~26 GB", "~8-10 GB"), "70B": ("~140 GB", "~40-48 GB")}
# (chapter row, shape, measured seed-recipe row, measured lowest_memory row); rows are (source, name) of the grid
CHAPTER_ROWS = [
    ("7B", "meta-llama/Llama-2-7b-hf", None, None),
    ("7B", "meta-llama/Llama-3.1-8B", ("run2", "seed"), ("run2", "lowest_memory")),
    ("13B", "meta-llama/Llama-2-13b-hf", None, None),
    ("13B", "Qwen/Qwen2.5-14B", ("run2", "g14-seed-512"), ("run2", "g14-low-512")),
    ("70B", "meta-llama/Llama-3.1-70B", ("run3", "g70-seed-512"), ("run3", "g70-low-512")),
]
BF16_LORA_MEASURED = {"meta-llama/Llama-3.1-8B": (18.17, 19.80)}  # shared/gpu/BASELINE.md: allocated, NVML


def chapter_table(rows: list[dict] | None = None) -> str:
    from core.config.presets import apply_preset

    rows = load_rows() if rows is None else rows
    by = {(r["source"], r["name"]): r for r in rows}
    context = process_context(rows)
    seed = TrainConfig()  # the chapter's recipe: QLoRA, batch 1 x 16, max length 512, checkpointing, paged 8-bit
    plain = seed.replace(load_in_4bit=False, upcast_to_fp32=False, gradient_checkpointing=False, optim="adamw_torch")
    low = apply_preset(seed, "lowest_memory").replace(offload_activations=False)  # as runs 2 and 3 measured it

    def pred(cfg, shape) -> str:
        e = estimate(cfg, shape)
        return f"{e.total_gib:.1f} ({e.peak_allocated_gib:.1f})"

    def meas(ref) -> str:
        if ref is None:
            return "not measured"
        r = by[ref]
        implied = implied_nvml(r, context)
        star = " *" if implied is not None and implied > r["nvml_peak_gib"] + MISSED_MARGIN_GIB else ""
        return f"{r['nvml_peak_gib']:.1f}{star} ({r['peak_allocated_gib']:.1f})"

    lines = ["| chapter | without optimization (chapter) | with full optimization (chapter) | shape | bf16 weights "
             "alone | memtune: bf16 LoRA, no optimization | memtune: the chapter's recipe | measured: the chapter's "
             "recipe | memtune: lowest_memory | measured: lowest_memory |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for size, hub, seed_ref, low_ref in CHAPTER_ROWS:
        shape = SHAPES[hub]
        without, with_ = CHAPTER[size]
        weights = 2 * shape.total_params
        bf16 = pred(plain, shape)
        if hub in BF16_LORA_MEASURED:
            a, n = BF16_LORA_MEASURED[hub]
            bf16 += f"; measured {n:.1f} ({a:.1f})"
        lines.append(f"| {size} | {without} | {with_} | {hub.split('/')[-1]} ({shape.total_params / 1e9:.1f} B params, "
                     f"vocab {shape.vocab_size // 1000}k) | {weights / GIB:.1f} GiB = {weights / 1e9:.1f} GB | {bf16} | "
                     f"{pred(seed, shape)} | {meas(seed_ref)} | {pred(low, shape)} | {meas(low_ref)} |")
    return "\n".join(lines) + (
        "\n\nGPU memory used (NVML) in GiB, peak allocated by PyTorch in parentheses; the chapter's figures are in "
        "GB (1 GiB = 1.074 GB). \"bf16 weights alone\" is what the chapter's \"without\" column counts. memtune = "
        "`core.estimate.predict` (`python -m core.estimate --set model=... [--set ...]`); the chapter's recipe = max length "
        "512, batch 1 x 16, 4-bit NF4 + double quant, fp32 upcast, LoRA r=16 on q,k,v,o, checkpointing, paged 8-bit "
        "AdamW; lowest_memory = memtune's preset (core/config/presets.py). Measured on one H200 (bench/RESULTS.md): 8B and "
        "14B in run 2, 70B in run 3; the 14B and 70B rows with every row longer than 512 tokens (the worst case), "
        "accumulation 2. The chapter's 13B is measured with the Qwen2.5-14B shape (14.8 B parameters, 152k "
        "vocabulary), the nearest architecture the benchmark builds; Llama-2 7B/13B are predicted only. `*`: the "
        "5 ms NVML sampler missed the loading transient; torch's reserved peak implies "
        f"{implied_nvml(by[('run2', 'g14-seed-512')], context):.1f} GiB. The 70B lowest_memory NVML includes 0.12 GiB "
        "of paged optimizer buffers an earlier run of the process left.\n\n"
        + reading(seed, low, by))


def reading(seed: _Run, low: _Run, by: dict) -> str:
    """The paragraph under the chapter's table, from the same numbers."""
    gb = GIB / 1e9
    l7, l13, l8 = (estimate(seed, SHAPES[m]) for m in ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-13b-hf",
                                                        "meta-llama/Llama-3.1-8B"))
    s70, s8, low8, low70 = by[("run3", "g70-seed-512")], by[("run2", "seed")], by[("run2", "lowest_memory")], \
        by[("run3", "g70-low-512")]
    return (
        "Reading it: with the chapter's own recipe, what PyTorch allocates matches the chapter's \"with full "
        f"optimization\" column for Llama-2's 7B and 13B shapes (32k vocabulary) and for Llama-3.1-70B: {l7.peak_allocated_gib * gb:.1f} GB predicted for the 7B "
        f"(chapter: 4-6), {l13.peak_allocated_gib * gb:.1f} GB for the 13B (8-10), {s70['peak_allocated_gib'] * gb:.1f} GB "
        f"measured for the 70B (40-48). What the GPU shows (NVML: + CUDA context ~1.4 GiB + allocator cache) is higher: "
        f"{l7.total_gib * gb:.1f}, {l13.total_gib * gb:.1f} and {s70['nvml_peak_gib'] * gb:.1f} GB. Llama-3's 128k "
        "vocabulary breaks the 7B row: its embedding and head are 2 GiB in bf16 and 4 GiB after the recipe's fp32 "
        f"upcast, so the recipe needs {s8['peak_allocated_gib']:.1f} GiB allocated / {s8['nvml_peak_gib']:.1f} GiB on "
        f"the GPU for an 8B (predicted {l8.peak_allocated_gib:.1f} / {l8.total_gib:.1f}). memtune's lowest_memory "
        f"brings the 8B to {low8['nvml_peak_gib']:.1f} GiB on the GPU (an 8 GB card) and the 70B to "
        f"{low70['nvml_peak_gib']:.1f} GiB.")


# --- several GPUs: rows of bench/multigpu.py ------------------------------------------------------------------------
@dataclass
class GpuCheck:
    name: str
    world_size: int
    strategy: str
    predicted: float  # NVML per GPU, GiB
    measured: list[float]  # NVML peak of each GPU the run used, GiB
    pred_alloc: float
    measured_alloc: list[float] | None  # torch peak allocated of each process, GiB

    @property
    def error(self) -> float:
        """Against the fullest GPU of the run."""
        return (self.predicted - max(self.measured)) / max(self.measured)

    @property
    def ok(self) -> bool:
        return abs(self.error) <= TOLERANCE


def multigpu_config(row: dict, info: dict) -> TrainConfig:
    """The row's TrainConfig: recorded, or rebuilt as bench/multigpu.py builds it (see the module docstring)."""
    if row.get("config"):  # as configured; `strategy` is what the launcher resolved `auto` to (summary.json)
        cfg = TrainConfig.from_dict(row["config"])
        auto = cfg.distributed_strategy == "auto" and row.get("strategy") in ("ddp", "fsdp")
        return cfg.replace(distributed_strategy=row["strategy"]) if auto else cfg
    preset = row.get("preset") or row["name"].rsplit("-", 1)[0]
    if preset not in PRESETS:
        raise ValueError(f"row {row['name']!r} records no config and names no preset: add `config` "
                         "(TrainConfig.to_dict()) to the row")
    arch = row.get("arch") or info["arch"]
    cfg = apply_preset(TrainConfig(model=ARCH_HUB[arch], max_length=row.get("max_length", 512)), preset, None)
    cfg = preset_as_run(cfg, info.get("date", ""), preset)
    strategy = row.get("strategy") if row.get("strategy") in ("ddp", "fsdp") else "ddp"
    cfg = cfg.replace(num_gpus=str(row["processes"]), gradient_accumulation_steps=row["accumulation"],
                      per_device_train_batch_size=row["micro_batch"], distributed_strategy=strategy)
    return apply_overrides(cfg, row.get("sets", []))


def check_gpu_row(row: dict, info: dict) -> GpuCheck:
    cfg = multigpu_config(row, info)
    arch = row.get("arch") or info["arch"]
    gpus = len(row["nvml_peak_gib"])
    est = estimate(cfg, SHAPES[ARCH_HUB[arch]], n_gpus=gpus, gpu_bytes=info.get("gpu_total_bytes"))
    used = row["nvml_peak_gib"][:max(1, est.world_size)]
    return GpuCheck(row["name"], est.world_size, est.strategy, est.total_gib, used, est.peak_allocated_gib,
                    row.get("per_process_peak_allocated_gib"))


def validate_multigpu(paths: list[Path] | None = None) -> list[GpuCheck]:
    out = []
    for path in paths or MULTIGPU:
        data = json.loads(Path(path).read_text())
        out += [check_gpu_row(r, data["info"]) for r in data["rows"] if r.get("rc", 0) == 0]
    return out


def multigpu_table(checks: list[GpuCheck]) -> str:
    lines = ["| run | GPUs | strategy | NVML per GPU predicted | NVML per GPU measured | error | allocated predicted | "
             "allocated measured |", "|---|---|---|---|---|---|---|---|"]
    for c in checks:
        alloc = " / ".join(f"{a:.2f}" for a in c.measured_alloc) if c.measured_alloc else "-"
        err = f"{100 * c.error:+.1f}%"
        lines.append(f"| {c.name} | {c.world_size} | {c.strategy} | {c.predicted:.2f} | "
                     f"{' / '.join(f'{m:.2f}' for m in c.measured)} | {err if c.ok else f'**{err}**'} | "
                     f"{c.pred_alloc:.2f} | {alloc} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.validate_estimate")
    ap.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    ap.add_argument("--strict", action="store_true", help="reference = the sampled NVML peak, always")
    ap.add_argument("--multigpu", nargs="+", type=Path, metavar="FILE",
                    help="only the per-GPU check of these bench/multigpu.py result files")
    args = ap.parse_args(argv)
    if args.multigpu:
        gpu_checks = validate_multigpu(args.multigpu)
        print(multigpu_table(gpu_checks))
        return 0 if all(c.ok for c in gpu_checks) else 1
    checks = validate(strict=args.strict)
    body = (table(checks) + "\n\n" + summary(checks) + "\n\n"
            "`L`: liger's layers were active although the config has use_liger_kernel false (an earlier run of the "
            "process patched transformers' Llama module). `+`: the process held paged optimizer buffers of earlier "
            "runs (`nvml_leftover_gib`), added to the prediction. `*`: the 5 ms NVML sampler missed a transient; "
            "`>=` is the NVML that torch's reserved peak + the process's measured non-PyTorch memory (+ paged "
            "buffers) imply, used as the reference (`--strict` ignores it and exits 1 on the two rows above). Predicted = `core.estimate.predict` for the row's config and built-in shape "
            "(`python -m bench.validate_estimate`).")
    print(body)
    chapter = chapter_table()
    print("\n" + chapter)
    if not args.no_write and not args.strict:
        write_results(body)
        write_results(chapter, RESULTS_MD, CHAPTER_BEGIN, CHAPTER_END)
        CHAPTER_MD.write_text("## The chapter's memory table, reproduced\n\n" + chapter + "\n")
    gpu_checks = validate_multigpu()
    print("\nSeveral GPUs (per GPU):\n" + multigpu_table(gpu_checks))
    misses = [c for c in checks if not c.ok]
    for c in [c for c in gpu_checks if not c.ok]:
        print(f"MISS: {c.name}: predicted {c.predicted:.2f} GiB per GPU, measured {max(c.measured):.2f} GiB "
              f"({100 * c.error:+.1f}%)", file=sys.stderr)
    for c in misses:
        print(f"MISS: {c.row['name']} ({c.row['source']}): predicted {c.pred_nvml_here:.2f} GiB, reference "
              f"{c.reference:.2f} GiB ({100 * c.nvml_error:+.1f}%)", file=sys.stderr)
    return 1 if misses or not all(c.ok for c in gpu_checks) else 0


if __name__ == "__main__":
    sys.exit(main())
