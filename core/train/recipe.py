"""The training recipe: config -> data -> model -> LoRA -> SFTTrainer -> adapter, with events all the way.

`LoRARecipe` has the shape of torchtune's LoRA recipes: `setup()` plans the data (its validation part included),
resolves the run (core/model/resolve.py), loads the model with LoRA and builds the trainer with its callbacks;
`train()`, `save()` and `cleanup()` follow. Before it, `RunContext.open` (core/train/context.py) decides once what
this process is in the run (the main one or another rank), its run folder and its event sink. `run_training(cfg, sink,
stop)` runs them in that order; read it first. Each part of setup has its builder: the data (core/train/data.py), the
model (core/train/model.py), the trainer and the summary it leaves (core/train/trainer.py).

The command line (`python -m core.train`, core/train/cli.py) calls it; the app's job manager runs that same CLI as a
child process (one run = one process; every process of a multi-process run runs it too), and tests may call it
in-process. It never raises for a user's mistake or an out-of-memory error: it returns a RunResult whose message
says what went wrong and what to do (what would help after an out-of-memory error depends on the settings alone:
core/estimate/advice.py, said by whoever shows the failure), and it leaves saved adapters intact. What the run
says while it trains (phases, the Trainer callbacks, Stop) lives in core/train/callbacks.py; the run folder
(markers, checkpoints, atomic writes) in core/runs/folders.py. This module is imported once the libraries are (core/train/libraries.py, core/train/cli.py),
so it imports them at its top.

CLI:
    python -m core.train --config FILE.yaml [--set field=value ...]
    python -m core.train --demo            # the offline demo, < 60 s on 2 CPU cores
    python -m core.train --dump-config     # the default (chapter) configuration as YAML
    python -m core.train --config FILE.yaml --preset lowest_memory   # a preset's levers, then any --set
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from transformers import EarlyStoppingCallback

from core.config.settings import TrainConfig
from core.files import free_memory
from core.messages import Said, words_of
from core.model.resolve import ResolvedRun, resolve
from core.runs.events import EventSink, make_event
from core.train import data, model as model_setup, preflight
from core.train.heldout import HeldOut, heldout_end, heldout_start, unscored
from core.train.callbacks import EventCallback, WarmUp, phase, warms_up, watch_stop
from core.train.context import Failure, RunContext, RunResult, failure_of, nowhere, record_failed
from core.train.trainer import (build_sft_config, build_trainer, distributed_summary, full_state_dict,
                                keep_adapter_dtype, memory_peaks, summarize)


# --- the recipe ------------------------------------------------------------------------------------------------
def run_training(cfg: TrainConfig, sink: EventSink | None = None, stop: threading.Event | None = None,
                 callbacks=(), console: bool = False, run_dir: str | Path | None = None) -> RunResult:
    """Train `cfg` in this process. `run_dir`: use exactly this folder (the app's job manager made it and wrote
    config.yaml there) instead of choosing a new one; a config error then lands in its events.jsonl too.
    `callbacks`: extra TrainerCallbacks; `console`: the Trainer's progress bar on a terminal."""
    asked = ResolvedRun(cfg, cfg)  # the run as asked: setup resolves it, once the data and the model's tree are read
    context = RunContext.open(asked, sink or nowhere, stop or threading.Event(), run_dir)
    if isinstance(context, RunResult):  # the config was refused: there is nothing to train
        return context
    recipe = LoRARecipe(asked, context, callbacks, console)
    try:
        recipe.setup()
        recipe.train()
        return recipe.save()
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the traceback goes to events.jsonl
        failure = failure_of(exc, context.run_dir)
    finally:
        recipe.cleanup()  # before a failure is recorded: its memory is free for the error path
    return recipe.failed(failure)


class LoRARecipe:
    """One run in `context`: setup() -> train() -> save(), then cleanup() whatever happened.

    Made, it has started the stop watch, the GPU memory tracker and the run's clock."""

    def __init__(self, asked: ResolvedRun, context: RunContext, callbacks=(), console: bool = False) -> None:
        self.asked = asked.asked  # the config as typed; setup resolves the run that trains from it
        self.run: ResolvedRun | None = None  # what trains: decided once, in setup, before the trainer exists
        self.context = context
        self.extra_callbacks = list(callbacks)
        self.console = console
        if context.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.watching = watch_stop(context.emit, context.stop, context.stop_file)
        self.started = time.monotonic()
        self.nvml = context.peak_tracker()  # from before loading: the load can be the peak
        self.plan = None
        self.trainer = self.callback = self.output = None
        self.tokenizer = None
        self.trainable = 0
        self.compile_cache = None  # compile_layers: where the compiled graphs are kept
        self.heldout: HeldOut | None = None  # the held-out rows and their scores before training (the main process)

    @property
    def cfg(self) -> TrainConfig:
        """The config that trains (the resolved run's)."""
        return self.run.cfg

    def setup(self) -> None:
        """The data planned (its validation part too), the run resolved, the model loaded with LoRA, the trainer
        built with its callbacks: everything train() needs."""
        emit = self.context.emit
        cuda, world = self.context.cuda, self.context.world
        self.plan, self.tokenizer, path, tree = data.read_plan(self.asked, emit)
        done = self.context.resumed_steps()  # a resumed run: the steps left
        run = resolve(self.asked, tree, self.plan, cuda=cuda, world=world, done_steps=done)
        data.announce(run.cfg, self.plan, tree, emit)  # the LoRA targets the run trains, the data and its log lines
        data.follow(self.plan, run.cfg)
        for level, line in run.lines():  # each change from what was asked, and why
            emit(make_event("log", level=level, **words_of(line)))
        data.checked(run, self.plan, world)
        evaluates = self.plan.evaluates
        scorer = data.heldout_scorer(run.cfg)  # a bad scorer or options refused before the model loads
        model, self.trainable, compiling = model_setup.load(run.cfg, path, emit, evaluates and not cuda)
        checkpoints = self.context.run_dir / "checkpoints"
        rows = None
        if preflight.checks_rows(model, run.cfg):  # before the trainer: packed rows that see each other train unpacked
            args = build_sft_config(run.cfg, checkpoints, self.console, evaluates, self.context.run_dir, cuda)
            rows, why = preflight.rows(model, run.cfg, args, self.tokenizer, self.plan.train_dataset(), emit)
            if why is not None:
                run = run.then(why, packing=False, attention="sdpa")
                data.follow(self.plan, run.cfg)
                emit(make_event("log", level="warning", **words_of(why)))
        self.run = run
        cfg = run.cfg
        samples = data.samples(self.plan, self.tokenizer, cfg)
        if self.context.main:  # did it help? the base (and a continued run's parent) before training
            self.heldout = unscored(emit, heldout_start, cfg, self.plan, self.tokenizer, model, scorer, emit)
        compiler = None
        if compiling:  # the layers compile in the warm-up or the first step: from the cache when it has them; say so
            self.compile_cache, compiler = model_setup.compile_cache(cfg, model, emit)
        extra = [compiler] if compiler else []
        if evaluates and cfg.early_stopping_patience:
            extra.append(EarlyStoppingCallback(early_stopping_patience=cfg.early_stopping_patience))
        warmup = WarmUp(emit, compiler) if warms_up(cfg, cuda) else None
        self.callback = EventCallback(emit, self.context.stop, self.context.stop_file, cuda, samples, self.tokenizer,
                                      cfg.eval_max_new_tokens, warmup)
        # The warm-up before the event callback: training's clock (step events, tokens/s) starts after it.
        callbacks = [*([warmup] if warmup else []), self.callback, *extra, *self.extra_callbacks]
        with phase(emit, "tokenizing", "log.phase.tokenizing"):
            # plan.train_dataset(): exactly the plan's training rows, already tokenized and cut (validation's likewise)
            self.trainer = build_trainer(cfg, model, self.tokenizer, self.plan.train_dataset(), checkpoints, callbacks,
                                         self.console, self.plan.validation.train_dataset() if evaluates else None,
                                         cuda)
        preflight.check(self.trainer, cfg, emit, adapted(run), rows)  # before step 1: the loss path, LoRA
        if warmup:
            warmup.trainer = self.trainer  # it runs the Trainer's own training_step on the Trainer's own dataloader

    def train(self) -> None:
        """The Trainer's loop, from the checkpoint to resume from when there is one."""
        resume = self.context.resume
        if resume:
            keep_adapter_dtype(self.trainer)
        self.output = self.trainer.train(resume_from_checkpoint=str(resume) if resume else None)

    def save(self) -> RunResult:
        """The summary (every process: it gathers their peaks), the adapter and summary.json (the main process)."""
        ctx, trainer, cfg = self.context, self.trainer, self.cfg
        peaks = memory_peaks(self.nvml, ctx.cuda)  # read before the collectives below
        # collectives, both: every rank calls them
        processes = distributed_summary(ctx.cuda, cfg.num_machines, cfg.distributed_strategy)
        state_dict = full_state_dict(trainer, cfg.distributed_strategy)
        summary = summarize(self.run, trainer, self.output, self.callback, self.plan, self.started, self.trainable,
                            ctx.resume, self.compile_cache)
        summary.update(peaks)
        summary.update(processes)
        if not ctx.main:
            return RunResult(summary["status"])
        if self.heldout is not None:  # the adapter on the same held-out rows, and the verdict
            summary["heldout"] = unscored(ctx.emit, heldout_end, cfg, self.heldout, trainer.model, self.tokenizer,
                                          ctx.emit)
        adapter = ctx.run_dir / "adapter"
        with phase(ctx.emit, "saving", "log.phase.saving", path=adapter):
            adapter_dir = ctx.save_adapter(trainer.model, self.tokenizer, cfg.to_yaml(), summary,
                                           state_dict=state_dict)
        if (problem := ctx.finish(summary)):  # h2: atomic summary.json; a full disk is reported
            ctx.emit(make_event("log", level="warning", **words_of(problem)))
        status, steps = summary["status"], summary["steps"]
        one = steps == 1
        message = Said(("log.done.stopped_one" if one else "log.done.stopped") if status == "stopped" else
                       ("log.done.completed_one" if one else "log.done.completed"),
                       steps=steps, path=str(adapter_dir), mib=summary["adapter_bytes"] / 2**20, unit=Said("unit.mib"))
        ctx.emit(make_event("done", status=status, run_dir=str(ctx.run_dir), adapter_dir=str(adapter_dir),
                            summary=summary, **words_of(message)))
        return RunResult(status, str(ctx.run_dir), str(adapter_dir), summary, message)

    def cleanup(self) -> None:
        """Whatever happened: the stop watch and tracker ended, the stop file removed, the memory freed."""
        self.watching.set()
        with contextlib.suppress(OSError):
            # ours: a later resume into this folder must not stop at once
            self.context.stop_file.unlink(missing_ok=True)
        # Drop references so a failed run's memory is free for the error path (the CLI process ends right after);
        # the callback's warm-up holds the trainer too.
        self.trainer = self.callback = None
        if self.nvml:
            self.nvml.stop()
        free_memory()
        if not self.context.main:
            shutil.rmtree(self.context.run_dir, ignore_errors=True)

    def failed(self, failure: Failure) -> RunResult:
        """A failure's record: the main process's run folder and events; another rank's stderr (the launcher's
        log), since rank 0 and the launcher report the run."""
        if not self.context.main:
            print(f"memtune (rank {self.context.rank}): {failure.message}", file=sys.stderr)
            return RunResult("failed", message=failure.message, error_type=failure.error_type)
        return record_failed(self.context.emit, self.context.run_dir, failure, self.plan, self.run)


# --- the recipe's steps ------------------------------------------------------------------------------------------
def adapted(run: ResolvedRun) -> list[dict[str, Any]]:
    """The family's adaptations as summary.json's preflight lists them: the key and its plain values, once each."""
    out = []
    for change in run.adapted():
        item = {"key": change.key, **{k: v for k, v in change.params.items() if isinstance(v, (str, int))}}
        if item not in out:
            out.append(item)
    return out
