"""Presets that keep their promise for the model in hand: "Fastest within 24 GB" stays within 24 GB.

A preset is a fixed set of levers measured on Llama-3.1-8B (core/presets.py). On another model the same levers can
need more: Gemma-2-9B's 256k vocabulary and 42 layers took 29.0 GiB with `fastest` (issue 20). `apply` sets the
preset's levers, then, for a preset with a memory promise, asks the estimator (core/estimate.py) for this model and
takes the fastest micro-batch / checkpointing that keeps the promise: fewer packs per micro-step first (with the
accumulation raised to keep ~the same packs per optimizer step), then checkpointing. It says what it changed, or,
when even the smallest setting does not fit, what the preset gives for this model.

Its own module because the estimator imports core/presets.py (an import the other way would be a circle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.config import Hardware, TrainConfig
from core.presets import PRESETS, apply_preset

GIB = 2**30
BUDGETS_GIB = {"fastest": 24.0}  # the preset's promise: NVML peak on one GPU (a "24 GB" card holds 24 GiB)
MARGIN = 0.97  # the estimator's error on the GPU rows is within 3% (bench/RESULTS.md): aim below the promise by that


@dataclass
class Fit:
    cfg: TrainConfig
    preset: str = ""
    key: str | None = None  # core/locales key of the note (preset.fit.*), None when there is nothing to say
    values: dict[str, Any] = field(default_factory=dict)  # the note's placeholders
    predicted_gib: float | None = None

    def note(self, lang: str = "en") -> str:
        if not self.key:
            return ""
        from core.i18n import t

        from core.i18n import normalize

        label = t(f"preset.{self.preset}.label", lang)
        comma = normalize(lang) in ("pt", "fr")  # 23,0 GiB, as the rest of the page writes decimals there
        values = {k: (f"{v:.1f}".replace(".", ",") if comma else f"{v:.1f}") if isinstance(v, float) else v
                  for k, v in self.values.items()}
        return t(self.key, lang, **{**values, "preset": label if label != f"preset.{self.preset}.label"
                                    else PRESETS[self.preset]["label"]})


def _predict(cfg: TrainConfig) -> float | None:
    from core.data import known_longest_row
    from core.estimate import estimate

    try:
        return estimate(cfg, max_row_tokens=known_longest_row(cfg)).total_gib
    except Exception:  # noqa: BLE001 - a model the estimator cannot read: the preset stays as written
        return None


def candidates(cfg: TrainConfig) -> list[TrainConfig]:
    """The preset's own setting first, then fewer packs per micro-step, then the same with checkpointing."""
    packs = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps  # per optimizer step
    out = []
    for ckpt in (cfg.gradient_checkpointing, True):
        for batch in (8, 6, 4, 3, 2, 1):
            if batch <= cfg.per_device_train_batch_size:
                out.append(cfg.replace(per_device_train_batch_size=batch, gradient_checkpointing=ckpt,
                                       gradient_accumulation_steps=max(1, -(-packs // batch))))
    return _unique(out)


def _unique(items: list[TrainConfig]) -> list[TrainConfig]:
    seen, out = set(), []
    for c in items:
        key = (c.per_device_train_batch_size, c.gradient_checkpointing)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def apply(cfg: TrainConfig, name: str, hw: Hardware | None = None) -> Fit:
    """`cfg` with preset `name` applied for this model (see the module docstring), and the note saying what changed."""
    base = apply_preset(cfg, name, hw)
    budget = BUDGETS_GIB.get(name)
    if budget is None:
        return Fit(base)
    first = _predict(base)
    if first is None:
        return Fit(base)
    label = PRESETS[name]["label"]  # in the note's language when it is shown (Fit.note)
    if first <= budget * MARGIN:
        return Fit(base, name, "preset.fit.holds", {"gib": first, "budget": f"{budget:g}"}, first)
    for option in candidates(base)[1:]:
        gib = _predict(option)
        if gib is not None and gib <= budget * MARGIN:
            changes = [f"per_device_train_batch_size={option.per_device_train_batch_size}",
                       f"gradient_accumulation_steps={option.gradient_accumulation_steps}"]
            if option.gradient_checkpointing != base.gradient_checkpointing:
                changes.append("gradient_checkpointing=true")
            return Fit(option, name, "preset.fit.changed",
                       {"changes": ", ".join(changes), "gib": gib, "budget": f"{budget:g}",
                        "before": first, "preset": label}, gib)
    smallest = candidates(base)[-1]
    gib = _predict(smallest)
    return Fit(smallest, name, "preset.fit.cannot", {"gib": gib if gib is not None else first,
                                               "budget": f"{budget:g}", "preset": label}, gib)
