"""What each checklist item costs in speed, from measurements only (no gradio here, no invented numbers).

Sources, in order, all measured on one NVIDIA H200 with real architecture shapes:

1. bench/levers.json (written by `python -m bench.assemble`): per checklist item, measured pairs of runs with the
   item on and off (`speed_ratio` = tokens/s on / off, the two rows and their files; the first is the headline),
   items whose tokens/s ratio is not a cost (`speed_ratio` null: max_length, shown as time per step) and items
   `not_measured`. The headline is shown, and the measurement made at settings closest to the user's if that is
   another one.
2. Without it, pairs found in the benchmark's grid (`bench/*.json` with a `rows` list, e.g.
   bench/grid_measured.json): two rows of one run that differ only in the settings one item governs, with the
   same code path, attention kernel, liger layers and data lengths (`SAME_ROW`).
3. Where neither has the item, a fact measured for the chapter's recipe or the lever chain, quoted with its source
   (`STATIC` below), or "not measured".

A source is cited only when a user can open it: bench/RESULTS.md and its section (`RESULTS_SECTION`), never a
file outside the repository or the benchmark's internal row names. Numbers are written as the page's language writes
them (ui.render.integer / num).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from core.config import checklist
from core.config.settings import TrainConfig
from core.i18n import t
from ui.render import integer, num

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "bench"
LEVERS = BENCH_DIR / "levers.json"
SEED_RECIPE_FILES = ("shared/gpu/BASELINE.md",)  # rows measured on the seed recipe = the chapter's settings
# bench/RESULTS.md's section that reports the measured pairs of bench/levers.json (runs 1-3): what a source cites.
RESULTS_SECTION = "Levers, one at a time"
NOT_MEASURED_TEXT = {"bf16", "gradient_accumulation"}  # STATIC texts that themselves say "not measured"
# Settings that do not change what a step computes: two rows differing only here still form a pair.
IGNORED = {"run_name", "output_dir", "max_steps", "num_train_epochs", "dataset", "dataset_split", "logging_steps",
           "save_strategy", "save_steps", "resume_from", "seed", "gradient_accumulation_steps", "device"}
# Row facts outside the config that change speed: two rows are compared only when all of these agree (the same
# process run, architecture, training code path, attention kernel, liger layers in the model, and data lengths).
SAME_ROW = ("source", "arch", "recipe", "attention", "liger_layers", "data")
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

# Static facts that quote the very rows the grid pairs (bench/RESULTS.md's qlora figures are run 1's
# fastest+ckpt vs fastest-bf16+ckpt): shown only when the grid has no pair, never twice.
SAME_AS_PAIR = {"qlora"}


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


def _rows(path: Path) -> list[dict]:
    """The rows with a config and a tokens/s of one results file, each with the GPU it ran on (`_gpu`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict):
        return []
    env = data.get("environment") if isinstance(data.get("environment"), dict) else {}
    rows = []
    for r in data.get("rows") or []:
        if not (isinstance(r, dict) and isinstance(r.get("config"), dict)
                and isinstance(r.get("tokens_per_s"), (int, float)) and r["tokens_per_s"] > 0):
            continue
        per_run = env.get(str(r.get("source"))) if isinstance(env.get(str(r.get("source"))), dict) else {}
        rows.append(dict(r, _gpu=str(per_run.get("gpu") or env.get("gpu") or "")))  # one environment, or one per run
    return rows


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
        if any(ra.get(k) != rb.get(k) for k in SAME_ROW):
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
                        c_on, str(r_on.get("_gpu") or gpu)))
    return out


@lru_cache(maxsize=1)
def measured_pairs(bench_dir: Path = BENCH_DIR) -> dict[str, list[Pair]]:
    """item key -> measured pairs, from every bench/*.json with rows (read once per process)."""
    found: dict[str, list[Pair]] = {}
    for path in sorted(Path(bench_dir).glob("*.json")):
        for pair in find_pairs(_rows(path), f"bench/{path.name}"):
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


def _tps(x: float, lang: str = "en") -> str:
    return integer(x, lang)  # 1,698 (en), 1.698 (pt), 1 698 (fr): as every other count on the page


def openable(file: str) -> bool:
    """Whether a measurement's file is in this repository (a user can open it): shared/gpu/BASELINE.md is not."""
    return bool(file) and (ROOT / file).is_file()


def _cite(file: str, lang: str) -> str:
    """Where a measured pair is reported, for a user: bench/RESULTS.md and its section (not internal row names)."""
    return t("speed.cite", lang, file="bench/RESULTS.md", section=RESULTS_SECTION, rows=file)


def _change(ratio: float) -> str:
    return f"{round(100 * (ratio - 1)):+d}%".replace("-", "\u2212")


@lru_cache(maxsize=1)
def lever_facts(path: Path = LEVERS) -> tuple[dict, dict] | None:
    """(checklist item -> entry, item -> why not measured) from bench/levers.json; None if absent or unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        items, missing = data["checklist"], data.get("not_measured") or {}
        if not isinstance(items, dict) or not isinstance(missing, dict):
            return None
        for entry in items.values():
            for m in entry["measurements"]:
                m["on"]["row"], m["off"]["row"]  # noqa: B018 - the shape this module reads
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return items, missing


@lru_cache(maxsize=1)
def grid_configs(bench_dir: Path = BENCH_DIR) -> dict[tuple[str, str], TrainConfig]:
    """(run, row name) -> the TrainConfig that row ran, from the benchmark's grid files."""
    out = {}
    for path in sorted(Path(bench_dir).glob("*.json")):
        for r in _rows(path):
            try:
                out[(str(r.get("source", "")), str(r.get("name", "")))] = TrainConfig.from_dict(r["config"])
            except ValueError:
                continue
    return out


def _measurement_config(m: dict, configs: dict[tuple[str, str], TrainConfig]) -> TrainConfig | None:
    on = m["on"]
    if str(on.get("file", "")) in SEED_RECIPE_FILES:
        return TrainConfig()  # the seed recipe is the chapter's settings (TrainConfig's defaults)
    return configs.get((str(on.get("run", "")), str(on.get("row", ""))))


def _distance(c: TrainConfig | None, cfg: TrainConfig) -> int:
    return len(CONTEXT) + 1 if c is None else sum(getattr(c, n) != getattr(cfg, n) for n in CONTEXT)


def _lever_line(key: str, m: dict, entry: dict, lang: str,
                configs: dict[tuple[str, str], TrainConfig] | None = None) -> tuple[str, str] | None:
    on, off = m["on"], m["off"]
    c = _measurement_config(m, configs if configs is not None else grid_configs())
    # Where it was measured, in the page's language (levers.json's own `where` is English prose).
    where = f"{_where(c, lang)}, {c.model.rsplit('/', 1)[-1]}" if c is not None else ""
    source = t("speed.source_rows", lang, where=where, cite=_cite(str(on.get("file", "")), lang)) if where else \
        _cite(str(on.get("file", "")), lang)
    if entry.get("speed_ratio") is None:  # tokens/s is not a cost for this item: time per optimizer step is
        if isinstance(on.get("s_per_step"), (int, float)) and isinstance(off.get("s_per_step"), (int, float)):
            return (t("speed.step_time", lang, on=num(on["s_per_step"], 2, lang), off=num(off["s_per_step"], 2, lang)),
                    source)
        return None
    ratio = m.get("speed_ratio")
    if not isinstance(ratio, (int, float)) or not isinstance(on.get("tokens_per_s"), (int, float)) \
            or not isinstance(off.get("tokens_per_s"), (int, float)):
        return None
    return (t("speed.ratio", lang, change=_change(ratio), on=_tps(on["tokens_per_s"], lang),
              off=_tps(off["tokens_per_s"], lang)), source)


def _from_levers(key: str, cfg: TrainConfig | None, lang: str, facts: tuple[dict, dict]) -> list[tuple[str, str]]:
    items, missing = facts
    levers = t("speed.source", lang, source="bench/levers.json")
    if key in missing or key not in items:
        if key in NOT_MEASURED_TEXT:
            return [(t(STATIC[key][0], lang), levers)]
        return [(t("speed.not_measured", lang), levers)]
    entry = items[key]
    measurements = [m for m in entry.get("measurements", [])  # only what a user can open and check
                    if isinstance(m, dict) and openable(str(m["on"].get("file", "")))]
    chosen = measurements[:1]
    if cfg is not None and len(measurements) > 1:
        configs = grid_configs()
        best = min(measurements, key=lambda m: _distance(_measurement_config(m, configs), cfg))
        if best is not chosen[0]:
            chosen.append(best)
    lines = [line for m in chosen if (line := _lever_line(key, m, entry, lang)) is not None]
    return lines or [(t("speed.not_measured", lang), levers)]


def speed_lines(key: str, cfg: TrainConfig | None = None, lang: str = "en",
                pairs: dict[str, list[Pair]] | None = None,
                facts: tuple[dict, dict] | None | bool = True) -> list[tuple[str, str]]:
    """What checklist item `key` costs in speed, as (text, source) lines; measured figures only, never a guess.

    `facts` (default: bench/levers.json) and `pairs` (default: the grid) are for tests.
    """
    facts = lever_facts() if facts is True else facts
    if facts:
        return _from_levers(key, cfg, lang, facts)
    pairs = measured_pairs() if pairs is None else pairs
    lines = []
    pair = closest(pairs.get(key, []), cfg)
    if pair is not None:
        text = t("speed.ratio", lang, change=_change(pair.on_tps / pair.off_tps), on=_tps(pair.on_tps, lang),
                 off=_tps(pair.off_tps, lang))
        where = ", ".join(x for x in (_where(pair.on_config, lang), pair.arch, pair.gpu) if x)
        lines.append((text, t("speed.source_rows", lang, where=where, cite=pair.file)))
    fact, source = STATIC.get(key, ("speed.not_measured", ""))
    if lines and key in SAME_AS_PAIR:
        return lines
    if source and not openable(source):  # quoted from a file a user does not have: not cited, not shown
        fact, source = "speed.not_measured", ""
    if source or not lines:  # a sourced measurement always; "not measured" only when nothing else is known
        lines.append((t(fact, lang), t("speed.source", lang, source=source) if source else ""))
    return lines
