"""What each checklist item costs in speed, from measurements only (no gradio here, no invented numbers).

Two sources, both measured on an H200 with a Llama-3.1-8B-shaped model:

1. The benchmark's machine-readable results (`bench/*.json` with a `rows` list, e.g. bench/grid_measured.json,
   written by `python -m bench.assemble`). Each row has the full TrainConfig it ran and its tokens/s. Where two
   rows of the same run differ only in the settings one checklist item governs (one with the item on, one
   off), their tokens/s ratio is that item's measured speed cost. Rows of different runs are never compared
   (other machine, other warm-up).
2. Where the benchmark has no such pair, a fact measured for the seed recipe or the lever chain
   (shared/gpu/BASELINE.md, bench/RESULTS.md), quoted with its source (`STATIC` below).

An item with neither says so ("not measured").
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from core import checklist
from core.config import TrainConfig
from core.i18n import t

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "bench"
# Settings that do not change what a step computes: two rows differing only here still form a pair.
IGNORED = {"run_name", "output_dir", "max_steps", "num_train_epochs", "dataset", "dataset_split", "logging_steps",
           "save_strategy", "save_steps", "resume_from", "seed", "gradient_accumulation_steps", "device"}
# Items whose tokens/s ratio is not a speed cost: a shorter max_length trains fewer tokens per row, so lower
# tokens/s with it does not mean slower training. Their cost is stated by the static fact instead.
NO_PAIRS = {"short_max_length"}
# Settings shown to say where a pair was measured, and used to pick the pair closest to the user's settings.
CONTEXT = ("max_length", "per_device_train_batch_size", "packing", "gradient_checkpointing", "load_in_4bit",
           "optim", "use_liger_kernel", "upcast_to_fp32", "precision")

# item -> (i18n key of the measured fact, source). Numbers are quoted from the source verbatim.
STATIC: dict[str, tuple[str, str]] = {
    "qlora": ("speed.fact.qlora", "bench/RESULTS.md"),
    "gradient_checkpointing": ("speed.fact.gradient_checkpointing", "shared/gpu/BASELINE.md"),
    "gradient_accumulation": ("speed.fact.gradient_accumulation", ""),
    "efficient_optimizer": ("speed.fact.efficient_optimizer", "shared/gpu/BASELINE.md"),
    "bf16": ("speed.fact.bf16", ""),
    "short_max_length": ("speed.fact.short_max_length", ""),
    "small_batches": ("speed.fact.small_batches", "shared/gpu/BASELINE.md"),
}


@dataclass(frozen=True)
class Pair:
    """Two measured rows of one run that differ only in one checklist item."""

    key: str
    file: str  # e.g. bench/grid_measured.json
    run: str  # the rows' `source` (run1, run2)
    arch: str
    on_name: str
    off_name: str
    on_tps: float
    off_tps: float
    on_config: TrainConfig
    gpu: str = ""

    @property
    def change(self) -> float:
        """Relative tokens/s with the item on vs off (-0.45 = 45% fewer tokens per second)."""
        return self.on_tps / self.off_tps - 1.0


def _rows(path: Path) -> tuple[list[dict], str]:
    """(rows with a config and a tokens/s, the GPU they ran on) of one results file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], ""
    if not isinstance(data, dict):
        return [], ""
    env = data.get("environment") if isinstance(data.get("environment"), dict) else {}
    rows = [r for r in data.get("rows") or [] if isinstance(r, dict) and isinstance(r.get("config"), dict)
            and isinstance(r.get("tokens_per_s"), (int, float)) and r["tokens_per_s"] > 0]
    return rows, str(env.get("gpu") or "")


def find_pairs(rows: list[dict], file: str = "", gpu: str = "") -> list[Pair]:
    """Every pair of rows (same run, same architecture) that differ only in one checklist item's settings."""
    configs = []
    for r in rows:
        try:
            configs.append((r, TrainConfig.from_dict(r["config"])))
        except ValueError:  # a row written by another memtune version
            continue
    out = []
    for (ra, ca), (rb, cb) in itertools.combinations(configs, 2):
        if ra.get("source") != rb.get("source") or ra.get("arch") != rb.get("arch"):
            continue
        on_a, on_b = checklist.active(ca), checklist.active(cb)
        changed = [k for k in on_a if on_a[k] != on_b[k]]
        if len(changed) != 1 or changed[0] in NO_PAIRS:
            continue
        key = changed[0]
        differing = {n for n in ra["config"] if ra["config"].get(n) != rb["config"].get(n)} - IGNORED
        if not differing <= set(checklist.BY_KEY[key].fields):
            continue
        (r_on, c_on), (r_off, _) = ((ra, ca), (rb, cb)) if on_a[key] else ((rb, cb), (ra, ca))
        out.append(Pair(key, file, str(r_on.get("source", "")), str(r_on.get("arch", "")), str(r_on.get("name", "")),
                        str(r_off.get("name", "")), float(r_on["tokens_per_s"]), float(r_off["tokens_per_s"]),
                        c_on, gpu))
    return out


@lru_cache(maxsize=1)
def measured_pairs(bench_dir: Path = BENCH_DIR) -> dict[str, list[Pair]]:
    """item key -> measured pairs, from every bench/*.json with rows (read once per process)."""
    found: dict[str, list[Pair]] = {}
    for path in sorted(Path(bench_dir).glob("*.json")):
        rows, gpu = _rows(path)
        for pair in find_pairs(rows, f"bench/{path.name}", gpu):
            found.setdefault(pair.key, []).append(pair)
    return found


def closest(pairs: list[Pair], cfg: TrainConfig | None) -> Pair | None:
    """The pair measured at settings most like `cfg` (fewest differing CONTEXT settings)."""
    if not pairs:
        return None
    if cfg is None:
        return pairs[0]
    return min(pairs, key=lambda p: sum(getattr(p.on_config, n) != getattr(cfg, n) for n in CONTEXT))


def _where(c: TrainConfig, lang: str) -> str:
    parts = [t("speed.where.length", lang, n=c.max_length),
             t("speed.where.packs" if c.packing else "speed.where.batch", lang, n=c.per_device_train_batch_size)]
    if not c.load_in_4bit:
        parts.append(t("speed.where.bf16_base", lang))
    return ", ".join(parts)


def _tps(x: float) -> str:
    return f"{x:,.0f}".replace(",", "\u202f")  # thin space: reads right in every language


def speed_lines(key: str, cfg: TrainConfig | None = None, lang: str = "en",
                pairs: dict[str, list[Pair]] | None = None) -> list[tuple[str, str]]:
    """What checklist item `key` costs in speed, as (text, source) lines; measured figures only, never a guess.

    First the benchmark pair measured closest to `cfg` (if any), then the measured fact of the seed recipe /
    lever chain (if any). An item with neither gets one line saying it was not measured.
    """
    pairs = measured_pairs() if pairs is None else pairs
    lines = []
    pair = closest(pairs.get(key, []), cfg)
    if pair is not None:
        pct = round(100 * pair.change)
        text = t("speed.pair", lang, change=f"{pct:+d}%".replace("-", "\u2212"), on=_tps(pair.on_tps),
                 off=_tps(pair.off_tps), where=_where(pair.on_config, lang))
        lines.append((text, t("speed.source_pair", lang, file=pair.file, run=pair.run, on=pair.on_name,
                                off=pair.off_name, arch=pair.arch, gpu=pair.gpu or "GPU")))
    fact, source = STATIC.get(key, ("speed.not_measured", ""))
    if source or not lines:  # a sourced measurement always; "not measured" only when nothing else is known
        lines.append((t(fact, lang), t("speed.source", lang, source=source) if source else ""))
    return lines
