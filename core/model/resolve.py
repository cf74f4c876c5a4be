"""What will train, decided in one place.

    resolve(cfg, tree, plan=None, *, cuda: bool, world: int = 1, done_steps: int = 0) -> ResolvedRun

The config as typed is what was asked; the run that trains can differ, each difference for a reason the run log
says (its locale key and values):
1. the stage's starting values: a preference stage from init_adapter takes that adapter's LoRA shape (rank, alpha,
   layers, dropout, DoRA, rsLoRA), so the fresh adapter has the saved one's tensors and scaling;
2. the family's adaptations, from config.json and the module tree on the meta device (core/model/families.py):
   rows unpacked for a stateful mixer or a model without a FlashAttention path, sdpa where varlen cannot express the
   model (alibi, its own mask code), varlen for attention sinks on packed rows; image rows unpacked (TRL's vision
   collator never packs them);
3. compile_layers auto settled on or off (core/model/compile.py `settle`; `plan` None: left auto where only the
   data plan's step count can decide).
The pre-flight's row check (core/train/preflight.py) runs on the loaded model, before the trainer is built; a
rejected packing is added with `ResolvedRun.then`, so the trainer is built once, from the final run.

`resolve` is pure: no events and no writes. It reads what its inputs name: init_adapter's adapter_config.json and
the compile cache's manifest. The recipe (core/train/recipe.py) resolves once and says each change from `changes`;
the inspect child (core/jobs) resolves on the meta device with `plan=None`, to show the page the run that trains.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config.settings import TrainConfig
from core.config.slices import StageSlice
from core.messages import Said, said_again
from core.model import compile as regional
from core.model import families


@dataclass(frozen=True)
class Change:
    """One field the run trains with another value than asked, and why (`key` + `params`: a locale line)."""

    field: str
    before: Any
    after: Any
    key: str
    params: dict
    level: str = "warning"  # the run log's level for the line
    logged: bool = True  # False: recorded, not said (nothing the user asked for is lost)

    def said(self) -> Said:
        return said_again(self.key, self.params)

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "before": self.before, "after": self.after, "key": self.key,
                "params": self.params}


@dataclass(frozen=True)
class ResolvedRun:
    """The run that trains (`cfg`), the config as asked, and each change between them, in the order decided."""

    asked: TrainConfig
    cfg: TrainConfig
    changes: tuple[Change, ...] = ()

    def then(self, why: Said, level: str = "warning", logged: bool = True, **values: Any) -> ResolvedRun:
        """This run with `values` set for `why`; a value the run already has is no change."""
        new = tuple(Change(name, getattr(self.cfg, name), value, why.key, dict(why.params), level, logged)
                    for name, value in values.items() if getattr(self.cfg, name) != value)
        if not new:
            return self
        return dataclasses.replace(self, cfg=self.cfg.replace(**{c.field: c.after for c in new}),
                                   changes=self.changes + new)

    def lines(self) -> list[tuple[str, Said]]:
        """The run log's lines, as (level, line): one per reason (a reason may change several fields)."""
        seen, out = set(), []
        for change in self.changes:
            mark = json.dumps([change.key, change.params], sort_keys=True, default=str)
            if change.logged and mark not in seen:
                seen.add(mark)
                out.append((change.level, change.said()))
        return out

    def adapted(self) -> list[Change]:
        """The family's adaptations that the log says (what sets this run apart from the measured ones)."""
        return [c for c in self.changes if c.key.startswith("log.adapt.") and c.logged]

    def as_dict(self) -> dict[str, Any]:
        """JSON for events, summary.json and the page: the config that trains and each change with its reason."""
        return {"config": self.cfg.to_dict(), "changes": [c.as_dict() for c in self.changes]}


def adapter_dir(cfg: StageSlice) -> Path | None:
    """init_adapter's adapter folder (a run folder's `adapter`), or None."""
    return Path(cfg.init_adapter.strip()).expanduser() / "adapter" if cfg.init_adapter.strip() else None


def starting_values(cfg: TrainConfig) -> dict[str, Any]:
    """With init_adapter in a preference stage, that adapter's LoRA shape as field values; else {} (sft: always)."""
    folder = adapter_dir(cfg) if cfg.stage != "sft" else None
    if folder is None:
        return {}
    saved = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    return {"lora_r": int(saved["r"]), "lora_alpha": int(saved["lora_alpha"]),
            "lora_dropout": float(saved.get("lora_dropout") or 0.0),
            "lora_target_modules": sorted(saved["target_modules"]),
            "use_dora": bool(saved.get("use_dora")), "use_rslora": bool(saved.get("use_rslora"))}


def resolve(cfg: TrainConfig, tree, plan=None, *, cuda: bool, world: int = 1, done_steps: int = 0) -> ResolvedRun:
    """The run of `cfg` that trains on this model (`tree`: its module tree on the meta device, core.model.load
    .skeleton), with its data plan (None: what can be decided without it), on CUDA or not, over `world` processes,
    `done_steps` optimizer steps behind it (a resumed run)."""
    run = ResolvedRun(cfg, cfg)
    if start := starting_values(cfg):
        run = run.then(Said("log.pref.init_adapter", path=str(adapter_dir(cfg)), r=start["lora_r"],
                            alpha=start["lora_alpha"], modules=", ".join(start["lora_target_modules"])),
                       level="info", logged=False, **start)  # start_from says it once the weights are in
    started = run.cfg
    if getattr(plan, "images", False):  # TRL's vision collator pads rows apart: it refuses packing
        run = run.then(Said("log.adapt.images_unpacked"), level="info", packing=False)
    for name, value, why in families.adaptations(started, families.traits(tree.config, tree)):
        run = run.then(why, logged=families.said(started, name, why), **{name: value})
    settled, why = regional.settle(run.cfg, tree, plan, cuda, world, run.adapted(), done_steps)
    if why is not None:
        run = run.then(why, level="info", compile_layers=settled.compile_layers)
    return run
