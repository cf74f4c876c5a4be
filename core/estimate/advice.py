"""What would help a run that ran out of memory, from its settings alone: the checklist items they leave off, each
with what the estimator says it saves at these settings when it can tell.

A function of the config and nothing else, so whoever shows an out-of-memory failure says it: the command line where
the run failed (core/train/cli.py, from the config it ran), the page's result and History from the run folder's
config.yaml (ui/render.py). The run itself records only that it ran out of memory (core/train/recipe.py).
"""

from __future__ import annotations

from typing import Protocol

from core.config import checklist
from core.config.slices import PlaceSlice, Training
from core.estimate.predict import savings
from core.messages import Said, lines, named


class _Run(Training, PlaceSlice, Protocol):
    """What the estimate of each item's saving reads (core.estimate.predict.savings)."""


def oom_advice(cfg: _Run) -> Said:
    """Name the checklist items that are off, with what each would save at these settings when we can tell; keyed,
    so a page says it in its language (a label: named(), its English from the checklist)."""
    tips = []
    try:
        by_key = {s.key: s for s in savings(cfg)}
    except Exception:  # the estimator is advice only; never let it hide the real error
        by_key = {}
    for item in checklist.missing(cfg):
        saved = by_key.get(item.key)
        label = named(f"checklist.{item.key}.label", item.label)
        if saved and getattr(saved, "saved_gib", 0) > 0.05:
            tips.append(Said("log.oom_tip_saves", label=label, gib=saved.saved_gib, unit=Said("unit.gib")))
        else:
            tips.append(Said("log.oom_tip", label=label))
    if not cfg.use_liger_kernel:
        tips.append(Said("log.oom_tip", label=Said("log.oom_liger")))
    return lines(Said("log.oom"), *(tips or [Said("log.oom_tip", label=Said("log.oom_all_on"))]))
