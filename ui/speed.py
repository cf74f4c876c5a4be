"""What each checklist item costs in speed, from measurements only (no gradio here, no invented numbers).

The page reads one small committed table, assets/lever_facts.json, that `python -m bench.assemble` writes from the
benchmark's measured pairs (bench/levers.json): per checklist item, the measurements a user can open (with the item
on and off: tokens/s, seconds per optimizer step, the settings they ran at), the bench/RESULTS.md section that
reports them (the item's lever declares it: core/config/levers.py), whether tokens/s is its cost (`cost`:
"step_time" for max_length, whose shorter rows lower tokens/s without slowing a step) and why an item is not
measured. The first measurement is the headline; the one made at settings closest to the user's is shown too if
it is another. The page never reads bench's own files.

Numbers are written as the page's language writes them (ui.render.integer / num).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from core.config.levers import speed_context
from core.config.slices import DataSlice, ModelSlice, TrainerSlice
from core.i18n import EN, t
from ui.render import integer, num

ROOT = Path(__file__).resolve().parent.parent
FACTS = ROOT / "assets" / "lever_facts.json"
LEVERS_SOURCE = "bench/levers.json"  # where an item's "not measured" reason is kept
# Settings that say where a measurement was made, and by which the one closest to the user's settings is picked.
CONTEXT = speed_context()


class _Context(ModelSlice, DataSlice, TrainerSlice, Protocol):
    """The settings a measurement was made at (CONTEXT): precision and quantization, length and packing, the step."""


@lru_cache(maxsize=1)
def lever_facts(path: Path = FACTS) -> dict[str, dict]:
    """checklist item -> what the page prints for it (assets/lever_facts.json); {} if absent or unreadable."""
    try:
        items = json.loads(Path(path).read_text(encoding="utf-8"))["checklist"]
        for entry in items.values():
            for m in entry["measurements"]:
                m["on"], m["off"]  # noqa: B018 - the shape this module reads
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    return items if isinstance(items, dict) else {}


@lru_cache(maxsize=1)
def preset_facts(path: Path = FACTS) -> dict[str, dict]:
    """preset -> its latest product-path measurement (assets/lever_facts.json `presets`); {} if absent."""
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8")).get("presets", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return found if isinstance(found, dict) else {}


def preset_line(name: str, lang: str = "en") -> str:
    """What a preset measured, in one sentence from the one table README cites too; "" if it was never measured."""
    m = preset_facts().get(name)
    if not m:
        return ""
    ratio = {"ratio": num(m["vs_chapter"], 1, lang)} if m.get("vs_chapter") else {}
    return t("preset.measured_ratio" if ratio else "preset.measured", lang, model=m["model"].rsplit("/", 1)[-1],
             gpu=m["gpu"], tokens=integer(m["tokens_per_s"], lang), gib=num(m["nvml_gib"], 2, lang),
             cite=_cite(m["section"], lang), **ratio)


def _where(s: dict, lang: str) -> str:
    parts = [t("speed.where.length", lang, n=s["max_length"]),
             t("speed.where.packs" if s["packing"] else "speed.where.batch", lang, n=s["per_device_train_batch_size"])]
    if not s["load_in_4bit"]:
        parts.append(t("speed.where.bf16_base", lang))
    return ", ".join(parts) + f", {s['model'].rsplit('/', 1)[-1]}"


def _cite(section: str, lang: str) -> str:
    """Where a measurement is reported, for a user: bench/RESULTS.md and its section (not internal row names)."""
    return t("speed.cite", lang, file="bench/RESULTS.md", section=section)


def _change(ratio: float) -> str:
    return f"{round(100 * (ratio - 1)):+d}%".replace("-", "\u2212")


def _distance(m: dict, cfg: _Context) -> int:
    s = m.get("settings")
    return len(CONTEXT) + 1 if s is None else sum(s.get(n) != getattr(cfg, n) for n in CONTEXT)


def _line(m: dict, entry: dict, lang: str) -> tuple[str, str] | None:
    on, off = m["on"], m["off"]
    cite = _cite(entry["section"], lang)
    source = t("speed.source_rows", lang, where=_where(m["settings"], lang), cite=cite) if m.get("settings") else cite
    if entry.get("cost") == "step_time":  # tokens/s is not a cost for this item: time per optimizer step is
        if isinstance(on.get("s_per_step"), (int, float)) and isinstance(off.get("s_per_step"), (int, float)):
            return (t("speed.step_time", lang, on=num(on["s_per_step"], 2, lang), off=num(off["s_per_step"], 2, lang)),
                    source)
        return None
    ratio = m.get("speed_ratio")
    if not isinstance(ratio, (int, float)) or not isinstance(on.get("tokens_per_s"), (int, float)) \
            or not isinstance(off.get("tokens_per_s"), (int, float)):
        return None
    return (t("speed.ratio", lang, change=_change(ratio), on=integer(on["tokens_per_s"], lang),
              off=integer(off["tokens_per_s"], lang)), source)


def speed_lines(key: str, cfg: _Context | None = None, lang: str = "en",
                facts: dict[str, dict] | None = None) -> list[tuple[str, str]]:
    """What checklist item `key` costs in speed, as (text, source) lines; measured figures only, never a guess.

    `facts` (default: assets/lever_facts.json) is for tests.
    """
    entry = (lever_facts() if facts is None else facts).get(key) or {}
    measurements = [m for m in entry.get("measurements") or [] if isinstance(m, dict)]
    chosen = measurements[:1]
    if cfg is not None and len(measurements) > 1:
        best = min(measurements, key=lambda m: _distance(m, cfg))
        if best is not chosen[0]:
            chosen.append(best)
    lines = [line for m in chosen if (line := _line(m, entry, lang)) is not None]
    if lines:
        return lines
    # Not measured: the item's own words for why, where the locale has them.
    text = t(f"speed.fact.{key}", lang) if f"speed.fact.{key}" in EN else t("speed.not_measured", lang)
    return [(text, t("speed.source", lang, source=LEVERS_SOURCE))]
