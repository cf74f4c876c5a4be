"""What the inspect child does for the page (core/jobs/act.py, kind "inspect"): the run resolved on the meta device, and
every measurement its estimate needs written to core.estimate.measure's disk cache, where the web server reads them.

The server (which never builds a model: measure.measuring_here(False)) sends the config, the measurements its own
estimates lacked (measure.Wants.missing: those of the checklist's and the presets' variants included) and the
dataset's longest row when a preview measured it; the child measures those, then estimates the resolved run (its
shape, layers, ORPO's loss) with measuring on, and answers the resolved changes and any measurement that failed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from core.config.settings import TrainConfig
from core.estimate import measure, preference, vision
from core.estimate.known import remember_shape
from core.estimate.predict import estimate, fit_floor, savings

CHANGE_FIELDS = ("field", "before", "after", "key", "params")


def measure_one(spec: dict[str, Any]) -> None:
    """One thing an estimate lacked (a Wants.missing value), measured into the cache."""
    args = {k: v for k, v in spec.items() if k != "kind"}
    kind = spec.get("kind")
    if kind == "layer":
        measure.layer_saved(**{**args, "targets": tuple(args["targets"])})
    elif kind == "orpo":
        preference.orpo_bytes_per_logit(args["dtype_name"])
    elif kind == "shape":
        remember_shape(args["model"])
    elif kind == "vision":  # an image-text model's vision parameters (core/estimate/vision.py)
        vision.remember_params(args["config_text"])
    else:
        raise ValueError(f"unknown measurement {kind!r}")


def change_dict(change: Any) -> dict[str, Any]:
    """A resolved change (field, before, after, key, params) as JSON: a dataclass, a named tuple or a tuple."""
    if dataclasses.is_dataclass(change):
        data = dataclasses.asdict(change)
    elif hasattr(change, "_asdict"):
        data = change._asdict()
    elif isinstance(change, dict):
        data = dict(change)
    else:
        data = dict(zip(CHANGE_FIELDS, change))
    return {"field": str(data.get("field", "")), "before": data.get("before"), "after": data.get("after"),
            "key": str(data.get("key") or ""), "params": dict(data.get("params") or {})}


def inspect(config: dict[str, Any], wanted: list[dict[str, Any]], *, resolve: Callable[..., Any] | None = None,
            cuda: bool = False, world: int = 1, max_row_tokens: int | None = None) -> dict[str, Any]:
    """The child's answer: {"changes": [change_dict...], "failed": {cache key: error}}; the cache holds the rest."""
    measure.measuring_here(True)
    cfg = TrainConfig.from_dict(config)
    with measure.collecting() as wants:
        remember_shape(cfg.model)
        run, changes = cfg, []
        if resolve is not None:  # what trains: `resolve` run on the model's tree on the meta device
            from core.model.load import resolve_model_path, skeleton

            resolved = resolve(cfg, skeleton(cfg, resolve_model_path(cfg)), cuda=cuda, world=world)
            run, changes = resolved.cfg, [change_dict(c) for c in resolved.changes]
        for spec in wanted:
            measure_one(spec)
        for c in (cfg, run) if run != cfg else (cfg,):
            estimate(c, max_row_tokens=max_row_tokens)
            savings(c, max_row_tokens=max_row_tokens)
            fit_floor(c, max_row_tokens=max_row_tokens)
    return {"changes": changes, "failed": dict(wants.failed)}
