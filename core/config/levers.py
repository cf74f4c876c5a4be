"""The lever registry: every memory/speed lever as its field declares it (core/config/settings.py `Lever`), and
the lists the rest of memtune derives from those declarations instead of naming fields again.

- the page's placement (ui/layout.py): `beside(item)` (the fields shown beside a checklist item), `placed("beyond")`
  ("Beyond the chapter", in order);
- Fit to my GPU's fields (`fit_fields()`: ui/handlers.py's note, `python -m core.estimate --fit --json`);
- the presets' levers at the chapter's values (`chapter_values()`: core/config/presets.py) and those dropped
  without CUDA (`cuda_only()`);
- per checklist item, where its measured saving and cost are reported (`measured(item)`: bench/assemble.py writes
  assets/lever_facts.json, which ui/speed.py reads), and the settings that say where a speed measurement was made
  (`speed_context()`).

A lever is a field with `lever=Lever(...)` in its metadata, so adding one touches its field, the code that hands it
to the libraries, its estimator term, its translations and its test (tests/test_registry.py imports what the
declarations name and checks it against them).
"""

from __future__ import annotations

from dataclasses import MISSING, fields

from core.config.checklist import BY_KEY
from core.config.settings import RESULTS, Lever, TrainConfig

__all__ = ["RESULTS", "Lever", "LEVERS", "beside", "placed", "fit_fields", "chapter_values", "cuda_only",
           "measured", "speed_context"]

# field name -> its declaration, in TrainConfig's order
LEVERS: dict[str, Lever] = {f.name: f.metadata["lever"] for f in fields(TrainConfig) if "lever" in f.metadata}


def _default(name: str):
    f = next(f for f in fields(TrainConfig) if f.name == name)
    return f.default_factory() if f.default is MISSING else f.default


def beside(item: str) -> list[str]:
    """The fields whose widgets sit beside checklist item `item` (not the box itself: a switch item's field)."""
    return [n for n, lv in LEVERS.items() if lv.place == "checklist" and lv.item == item and n != BY_KEY[item].switch]


def placed(place: str) -> list[str]:
    """The fields shown in one section of the page ("beyond", "training"), in their declared order."""
    return sorted((n for n, lv in LEVERS.items() if lv.place == place), key=lambda n: LEVERS[n].order)


def fit_fields() -> tuple[str, ...]:
    """What Fit to my GPU (core.estimate.predict.fit_to_gpu) may change, in the order its note lists them."""
    return tuple(sorted((n for n, lv in LEVERS.items() if lv.fit), key=lambda n: LEVERS[n].fit))


def chapter_values() -> dict:
    """Every lever a preset may set, at the chapter's value (TrainConfig's defaults are the chapter's recipe)."""
    return {n: _default(n) for n, lv in LEVERS.items() if lv.preset}


def cuda_only() -> tuple[str, ...]:
    """Levers that need a CUDA GPU (and a package): presets leave them off where there is none."""
    return tuple(n for n, lv in LEVERS.items() if lv.cuda_only)


def measured(item: str) -> str:
    """The bench/RESULTS.md section with checklist item `item`'s measured saving and cost ("" = none): its first
    field's."""
    return LEVERS[BY_KEY[item].fields[0]].measured


def speed_context() -> tuple[str, ...]:
    """The levers by which the page says where a speed measurement was made and picks the one closest to the user's
    settings (ui/speed.py; assets/lever_facts.json records each measurement's values of these)."""
    return tuple(n for n, lv in LEVERS.items() if lv.speed)
