"""The recipe's model setup: the model loaded (quantized), prepared and wrapped with LoRA (core/model/load.py, with
the levers of core/levers/), a preference stage's start from init_adapter (core/train/stages.py), and the compiled
layers' cache (core/model/compile.py)."""

from __future__ import annotations

from typing import Any, Protocol

from core.config.settings import ConfigError
from core.config.slices import DataSlice, Loading, PlaceSlice, StageSlice, TrainerSlice
from core.estimate.terms import host_memory_problem
from core.gpus import link
from core.model import compile as regional
from core.model import load as model_lib
from core.runs.events import EventSink
from core.train import stages
from core.train.callbacks import phase


class _Loaded(Loading, DataSlice, StageSlice, TrainerSlice, PlaceSlice, Protocol):
    """The model as this process trains it: its weights, the adapter and where it starts, the step's levers."""


class _Compiled(Loading, DataSlice, TrainerSlice, Protocol):
    """What the compiled graphs depend on: the weights, the adapter, the rows' shapes and the step's levers."""


def load(cfg: _Loaded, path: str, emit: EventSink, cpu_eval: bool) -> tuple[Any, int, bool]:
    """The model at `path` ready to train, said in the log: (model, trainable parameters, whether its layers
    compile in the first step). `cpu_eval`: evals on the CPU come between training steps. stream_layers on a
    machine whose available RAM cannot hold what it keeps there is refused by name first (a ConfigError)."""
    if cfg.stream_layers:
        from core.model.shapes import get_shape

        problem = host_memory_problem(cfg, get_shape(path), name=cfg.model)
        if problem is not None:
            raise ConfigError([problem])
        link.measured()  # the host link's rate, once per machine, while the GPU is empty: the estimate's speed note
    with phase(emit, "loading_model", "log.phase.loading_4bit" if cfg.load_in_4bit else "log.phase.loading",
               model=cfg.model):
        model, trainable, compiling = model_lib.load_for_training(cfg, path, emit, cpu_eval)
    if cfg.stage != "sft":  # stages hook: init_adapter's weights, and the reference said
        stages.start_from(model, cfg, emit)
    return model, trainable, compiling


def compile_cache(cfg: _Compiled, model, emit: EventSink) -> tuple[regional.CompileCache, Any]:
    """The compiled layers' cache for this run (the graphs load from it when it has them) and the Trainer callback
    that says, at the first steps, whether they were loaded or compiled and what it took."""
    cache = regional.open_cache(cfg, model, emit)
    return cache, regional.callback(emit, cache)
