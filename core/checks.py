"""Validation of a whole run: the config's own checks plus those that need other parts of memtune.

core/config/settings.py is a leaf (it imports none of memtune but its own helpers), so the checks that need the run folders
(resume), public mode or the multi-GPU plan cannot live there; `validate()` here adds them to
`config.config_problems()`, and `check()` raises them all at once. Everything that asks "can this config run?" (the
page, the CLI, the launcher) calls these two.
"""

from __future__ import annotations

from core.gpus import distributed
from core.config.settings import ConfigError, Hardware, Problem, TrainConfig, config_problems
from core.runs.public import public_problems
from core.runs.folders import resume_problem


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
    return problems


def check(cfg: TrainConfig, hw: Hardware | None = None) -> TrainConfig:
    """Raise ConfigError listing every problem, or return cfg unchanged."""
    problems = validate(cfg, hw)
    if problems:
        raise ConfigError(problems)
    return cfg
