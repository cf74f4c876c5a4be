"""Validation of a whole run: the config's own checks plus those that need other parts of memtune.

core/config/settings.py is a leaf (it imports none of memtune but its own helpers), so the checks that need the run folders
(resume), public mode or the multi-GPU plan cannot live there; `validate()` here adds them to
`config.config_problems()`, and `check()` raises them all at once. Everything that asks "can this config run?" (the
page, the CLI, the launcher) calls these two. What needs the data too (public mode's limit on the steps a run plans)
is `rows_to_train()` before Start and `check_planned()` in the training child, once its rows are planned.
"""

from __future__ import annotations

from typing import Protocol

from core.gpus import distributed
from core.config.settings import ConfigError, Hardware, Problem, TrainConfig, config_problems
from core.config.slices import DataSlice, ModelSlice, StageSlice, TrainerSlice
from core.runs.public import plan_problems, public_problems
from core.runs.folders import resume_problem


class _Counted(ModelSlice, DataSlice, StageSlice, TrainerSlice, Protocol):
    """The rows a run reads and holds out, and the steps it plans on them."""


def validate(cfg: TrainConfig, hw: Hardware | None = None) -> list[Problem]:
    """Return every problem with `cfg` (an empty list means it is good to run)."""
    hw = hw or Hardware.detect()
    problems = config_problems(cfg, hw)
    if cfg.resume_from:
        why = resume_problem(cfg.resume_from)
        if why:
            problems.append(Problem.of("resume_from", "problem.resume", why=why))
    problems.extend(public_problems(cfg))  # public mode: no local paths, no remote code, runs in the app's folder
    # distributed's (field, message, fix) are English only: said as they are (problem.as_said)
    problems.extend(Problem.of(name, "problem.as_said", why=why, fix=fix)
                    for name, why, fix in distributed.problems(cfg, hw.n_gpus))
    problems.extend(ram_problems(cfg))
    return problems


def ram_problems(cfg: TrainConfig, available: int | None = None) -> list[Problem]:
    """stream_layers on a machine whose available RAM (`available`, default: read now) cannot hold what the run
    keeps there, refused before Start, naming the GiB needed and available; [] where the model's shape cannot be
    read yet (the training child refuses it then, before loading)."""
    if not cfg.stream_layers:
        return []
    from core.estimate.known import shape_of
    from core.estimate.terms import host_memory_problem
    from core.model.shapes import ShapeError

    try:
        shape = shape_of(cfg.model)
    except (ShapeError, OSError, ValueError):  # an unknown or unreachable model: its own check says so
        return []
    problem = host_memory_problem(cfg, shape, available=available, name=cfg.model)
    return [problem] if problem is not None else []


def check(cfg: TrainConfig, hw: Hardware | None = None) -> TrainConfig:
    """Raise ConfigError listing every problem, or return cfg unchanged."""
    problems = validate(cfg, hw)
    if problems:
        raise ConfigError(problems)
    return cfg


def rows_to_train(cfg: _Counted) -> int | None:
    """Before Start: the rows that may train (the split less its held-out part), read where that is cheap (the demo
    and local files); None where it is not (Hub data: the training child counts them) or where the rows are not what
    trains (packing; image rows never pack). An upper bound of what the plan keeps: the plan drops rows, never adds
    any."""
    from core.config.settings import DEMO_DATASET, PREFERENCE_STAGES
    from core.data.read import is_local

    local = [v for v in (cfg.dataset, cfg.validation_data) if v.strip() and v.strip() != DEMO_DATASET]
    if not all(is_local(v.strip()) for v in local):
        return None
    if cfg.stage in PREFERENCE_STAGES:  # GRPO reads SFT rows (prompts and their answers)
        if cfg.packing:
            return None
        from core.data.pairs import check_pairs, split_pairs

        raw, fmt = check_pairs(cfg)
        return len(split_pairs(cfg, raw, fmt).train)
    from core.data.images import has_images
    from core.data.plan import check_data
    from core.data.validation import split

    raw, fmt = check_data(cfg)
    if has_images(raw):  # the vision run's plan: every row, never packed, nothing held out of it (validation_data
        return len(raw)  # is read apart), core/train/data.py read_images
    return None if cfg.packing else len(split(cfg, raw, fmt).train)


def check_planned(cfg: _Counted, plan, world: int) -> None:
    """The training child, its rows planned (a DataPlan or PairPlan): raise ConfigError when the run would take more
    optimizer steps or tokens than public mode allows, naming the numbers."""
    rows = plan.n_packs if cfg.packing and getattr(plan, "n_packs", None) else plan.n_train
    problems = plan_problems(cfg, rows, world)
    if problems:
        raise ConfigError(problems)
