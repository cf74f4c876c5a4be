"""The training recipe: config -> data -> model -> LoRA -> SFTTrainer -> adapter, with events all the way.

`LoRARecipe` has the shape of torchtune's LoRA recipes: `setup()` plans the data (its validation part included),
loads the model with LoRA and builds the trainer with its callbacks; `train()`, `save()` and `cleanup()` follow. Before
it, `RunContext.open` decides once what this process is in the run (the main one or another rank), its run folder and
its event sink. `run_training(cfg, sink, stop)` runs them in that order; read it first.

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
import functools
import inspect
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import torch
from transformers import EarlyStoppingCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import SFTConfig, SFTTrainer

from core.checks import check, check_planned
from core.config import arguments
from core.config.settings import ConfigError, TrainConfig
from core.data import validation
from core.data.pairs import PairPlan, check_pairs, plan_pairs, split_pairs
from core.data.plan import DataError, DataPlan, check_data
from core.files import StorageError, free_memory, has_marker, real, storage_message
from core.gpus import distributed, vram
from core.levers import variants
from core.levers.experts import liger_config, summary as experts_summary
from core.messages import Said, english, fields_of, keyed, words_of
from core.model import compile as regional
from core.model import families
from core.model import load as model_lib
from core.model.load import ModelError
from core.model.resolve import ResolvedRun, resolve
from core.runs.events import EventSink, JsonlSink, fan_out, make_event
from core.runs.folders import (STOP_FILE, checkpoint_step, create_run_dir, finish_run, record_failure, resume_point,
                               save_adapter)
from core.train import preflight
from core.train import stages  # preference stages (dpo, orpo, kto); the hooks below say "stages hook"
from core.train.callbacks import BarOnly, EventCallback, WarmUp, phase, warms_up, watch_stop
from core.train.host import counted_once


@dataclass
class RunResult:
    status: str  # completed | stopped | failed
    run_dir: str | None = None
    adapter_dir: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    error_type: str | None = None  # config | data | model | oom | disk | other


def nowhere(event: dict[str, Any]) -> None:
    """The sink of a run nobody listens to (and of every process but the main one)."""


# --- the recipe ------------------------------------------------------------------------------------------------
def run_training(cfg: TrainConfig, sink: EventSink | None = None, stop: threading.Event | None = None,
                 callbacks=(), console: bool = False, run_dir: str | Path | None = None) -> RunResult:
    """Train `cfg` in this process. `run_dir`: use exactly this folder (the app's job manager made it and wrote
    config.yaml there) instead of choosing a new one; a config error then lands in its events.jsonl too.
    `callbacks`: extra TrainerCallbacks; `console`: the Trainer's progress bar on a terminal."""
    context = RunContext.open(cfg, sink or nowhere, stop or threading.Event(), run_dir)
    if isinstance(context, RunResult):  # the config was refused: there is nothing to train
        return context
    recipe = LoRARecipe(cfg, context, callbacks, console)
    try:
        recipe.setup()
        recipe.train()
        return recipe.save()
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the traceback goes to events.jsonl
        failure = failure_of(exc, context.run_dir)
    finally:
        recipe.cleanup()  # before a failure is recorded: its memory is free for the error path
    return recipe.failed(failure)


@dataclass
class RunContext:
    """What this process is in the run, where the run lives and where its words go: decided once, before the recipe.

    Every process of a multi-process run (accelerate launch) runs the same recipe; only the main one (global rank 0,
    or the only process) writes the run folder, events, summary and adapter. The others train in step and join its
    collectives, with their events nowhere and their Trainer's output in a private temporary folder; Stop reaches
    them through rank 0 (distributed.any_rank), and a failure of theirs goes to their stderr (the launcher's log)."""

    main: bool
    run_dir: Path  # the main process's run folder; another rank's private scratch folder
    emit: EventSink
    cuda: bool
    stop: threading.Event
    stop_file: Path  # the job manager's (or `touch RUN/STOP`'s) way to ask for Stop
    resume: Path | None  # the checkpoint to resume from: resume_from's newest intact one

    @classmethod
    def open(cls, cfg: TrainConfig, sink: EventSink, stop: threading.Event,
             run_dir: str | Path | None) -> RunContext | RunResult:
        """The context of a run of `cfg`, its folder made and the run announced (the `run` event: folder, config,
        checkpoint to resume from); a failed RunResult when the config is refused."""
        main = not distributed.in_worker() or distributed.is_main()
        if distributed.in_worker() and torch.cuda.is_available() and cfg.device != "cpu":
            torch.cuda.set_device(distributed.local_rank())  # before loading: each process its own GPU
        prepared = Path(run_dir) if run_dir is not None and main else None
        attached = prepared is not None and has_marker(prepared, "run")
        sink = sink if main else nowhere
        if attached:
            # The manager's folder (marked by create_run_dir): even a config error lands in the events.jsonl it follows.
            sink = fan_out(sink, JsonlSink(prepared / "events.jsonl"))
        try:
            check(cfg)
            # marked folder + config.yaml (refuses foreign folders); the other ranks: a private scratch folder
            folder = create_run_dir(cfg, prepared=prepared) if main else Path(tempfile.mkdtemp(prefix="memtune-rank-"))
        except ConfigError as exc:
            if attached:  # History lists it as a failed run
                return record_failed(sink, prepared, Failure("config", str(exc), said=fields_of(exc)))
            sink(make_event("error", error_type="config", message=str(exc), **fields_of(exc)))
            return RunResult("failed", str(prepared) if prepared else None, message=str(exc), error_type="config")
        if main and not (attached and real(prepared) == folder):
            sink = fan_out(sink, JsonlSink(folder / "events.jsonl"))
        if cfg.tracking == "tensorboard" and main:  # newer transformers read the folder from here only (no logging_dir)
            os.environ["TENSORBOARD_LOGGING_DIR"] = str(folder / "tensorboard")
        resume = None
        skipped = []
        if cfg.resume_from:  # another rank reads the main process's folder, which resume_from names
            resume, skipped = resume_point(folder if main else cfg.resume_from)
        sink(make_event("run", run_dir=str(folder), config=cfg.to_dict(), resume_from=str(resume or ""),
                        pid=os.getpid(), threads=torch.get_num_threads(),
                        start=os.environ.get("MEMTUNE_START", "")))  # core/jobs/warm.py: "warm", or "cold: why"
        for why in skipped:  # a damaged newer checkpoint is named, and the previous intact one is used
            sink(make_event("log", level="warning", **keyed("log.not_resuming", why=why)))
        return cls(main, folder, sink, model_lib.use_cuda(cfg), stop, folder / STOP_FILE, resume)


class LoRARecipe:
    """One run of `cfg` in `context`: setup() -> train() -> save(), then cleanup() whatever happened.

    Made, it has started the stop watch, the GPU memory tracker and the run's clock."""

    def __init__(self, cfg: TrainConfig, context: RunContext, callbacks=(), console: bool = False) -> None:
        self.asked = cfg
        self.run: ResolvedRun | None = None  # what trains: decided once, in setup, before the trainer exists
        self.context = context
        self.extra_callbacks = list(callbacks)
        self.console = console
        if context.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.watching = watch_stop(context.emit, context.stop, context.stop_file)
        self.started = time.monotonic()
        # from before loading: the load can be the peak
        self.nvml = vram.PeakTracker().start() if context.cuda and context.main else None
        self.plan: DataPlan | None = None
        self.trainer = self.callback = self.output = None
        self.tokenizer = None
        self.trainable = 0
        self.compile_cache: regional.CompileCache | None = None  # compile_layers: where the compiled graphs are kept

    @property
    def cfg(self) -> TrainConfig:
        """The config that trains (the resolved run's)."""
        return self.run.cfg

    def setup(self) -> None:
        """The data planned (its validation part too), the run resolved, the model loaded with LoRA, the trainer
        built with its callbacks: everything train() needs."""
        emit = self.context.emit
        cuda = self.context.cuda
        self.plan, self.tokenizer, path, tree = read_plan(self.asked, emit)
        done = checkpoint_step(self.context.resume) if self.context.resume else 0  # a resumed run: the steps left
        run = resolve(self.asked, tree, self.plan, cuda=cuda, world=distributed.world_size(), done_steps=done)
        announce(run.cfg, self.plan, tree, emit)  # the LoRA targets the run trains, the data and its log lines
        follow(self.plan, run.cfg)
        for level, line in run.lines():  # each change from what was asked, and why
            emit(make_event("log", level=level, **words_of(line)))
        cfg = run.cfg
        check_planned(cfg, self.plan, distributed.world_size())  # public mode: the steps it plans, within the limit
        if self.plan.refusal():
            raise DataError("data.err.refusal", why=self.plan.refusal())
        evaluates = self.plan.evaluates
        with phase(emit, "loading_model", "log.phase.loading_4bit" if cfg.load_in_4bit else "log.phase.loading",
                   model=cfg.model):
            model, self.trainable, compiling = model_lib.load_for_training(cfg, path, emit, evaluates and not cuda)
        if cfg.stage != "sft":  # stages hook: init_adapter's weights, and the reference said
            stages.start_from(model, cfg, emit)
        checkpoints = self.context.run_dir / "checkpoints"
        rows = None
        if preflight.checks_rows(model, cfg):  # before the trainer: packed rows that see each other train unpacked
            args = build_sft_config(cfg, checkpoints, self.console, evaluates, self.context.run_dir, cuda)
            rows, why = preflight.rows(model, cfg, args, self.tokenizer, self.plan.train_dataset(), emit)
            if why is not None:
                run = run.then(why, packing=False, attention="sdpa")
                follow(self.plan, run.cfg)
                emit(make_event("log", level="warning", **words_of(why)))
        self.run = run
        cfg = run.cfg
        samples = validation.samples(self.plan.validation, self.tokenizer, cfg.eval_samples) if evaluates else []
        compiler = None
        if compiling:  # the layers compile in the warm-up or the first step: from the cache when it has them; say so
            self.compile_cache = regional.open_cache(cfg, model, emit)
            compiler = regional.callback(emit, self.compile_cache)
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
        ctx, trainer = self.context, self.trainer
        peaks = {}  # read before the collectives below (gathering a sharded state dict takes memory)
        if self.nvml:
            self.nvml.stop()
            peaks["nvml_peak_gib"] = self.nvml.peak_gib
        if ctx.cuda:
            peaks["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            peaks["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        # collectives, both: every rank calls them
        processes = distributed_summary(ctx.cuda, self.cfg.num_machines, self.cfg.distributed_strategy)
        state_dict = full_state_dict(trainer, self.cfg.distributed_strategy)
        summary = summarize(self.cfg, trainer, self.output, self.callback, self.plan, self.started, self.trainable,
                            ctx.resume)
        summary["preflight"] = getattr(trainer, "memtune_preflight", None)  # core/train/preflight.py
        summary["resolved"] = self.run.as_dict()  # the config that trained, and each change from the asked one
        summary.update(stages.summary_part(self.cfg, trainer))  # stages hook: reward metrics ({} for sft)
        if self.compile_cache is not None and "compile" in summary:  # loaded or compiled, and the seconds it took
            summary["compile"]["cache"] = self.compile_cache.summary()
        summary.update(peaks)
        summary.update(processes)
        if not ctx.main:
            return RunResult(summary["status"])
        adapter = ctx.run_dir / "adapter"
        with phase(ctx.emit, "saving", "log.phase.saving", path=adapter):
            adapter_dir = save_adapter(trainer.model, self.tokenizer, self.cfg, ctx.run_dir, summary,
                                       state_dict=state_dict)
        if (problem := finish_run(ctx.run_dir, summary)):  # h2: atomic summary.json; a full disk is reported
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
            print(f"memtune (rank {distributed.rank()}): {failure.message}", file=sys.stderr)
            return RunResult("failed", message=failure.message, error_type=failure.error_type)
        return record_failed(self.context.emit, self.context.run_dir, failure, self.plan, self.run)


# --- the recipe's steps ------------------------------------------------------------------------------------------
def plan_data(cfg: TrainConfig, emit: EventSink) -> tuple[DataPlan | PairPlan, Any, str, Any]:
    """read_plan then announce, for a config taken as it trains: (plan, tokenizer, model path, the model's module
    tree on the meta device)."""
    plan, tokenizer, path, tree = read_plan(cfg, emit)
    announce(cfg, plan, tree, emit)
    return plan, tokenizer, path, tree


def read_plan(cfg: TrainConfig, emit: EventSink) -> tuple[DataPlan | PairPlan, Any, str, Any]:
    """Read and check the data, find the model and its tokenizer, plan every row: (plan, tokenizer, model path, the
    model's module tree on the meta device, for core.model.resolve).

    The data comes first: a broken file is reported as such before any model is looked up or downloaded. The
    validation rows are held out before the plan (they never reach plan.train_dataset()) and planned alike, as the
    plan's validation part. The caller refuses a plan with nothing to train (plan.refusal()) before loading the
    model, keeping the plan for the failed run's summary."""
    pairs = cfg.stage != "sft"  # stages hook: preference rows (core/data/pairs.py), split for validation alike
    with phase(emit, "tokenizing", "log.phase.reading", source=f"{cfg.dataset} [{cfg.dataset_split}]"):
        raw, fmt = check_pairs(cfg) if pairs else check_data(cfg)
        held = split_pairs(cfg, raw, fmt) if pairs else validation.split(cfg, raw, fmt)
    with phase(emit, "resolving", "log.phase.finding", model=cfg.model):
        path = model_lib.resolve_model_path(cfg, emit)
        tokenizer = model_lib.load_tokenizer(cfg, path)
    with phase(emit, "tokenizing", "log.phase.formatting", n=len(raw), format=fmt) as progressed:
        plan = (plan_pairs(cfg, tokenizer, raw, fmt, held) if pairs else
                validation.plan_parts(cfg, tokenizer, held, fmt, progressed))
    return plan, tokenizer, path, model_lib.skeleton(cfg, path)


def announce(cfg: TrainConfig, plan: DataPlan | PairPlan, tree, emit: EventSink) -> None:
    """The LoRA targets of `cfg` (the run that trains) on the module tree, before any weight loads: a name the
    model lacks is refused here (ConfigError listing its linear layers), and the log says what gets LoRA; then the
    data event and its log lines. A run that needs validation rows and has none is refused."""
    targets = model_lib.lora_targets(cfg, model=tree)
    plan.notes += [targets.describe(), *filter(None, [families.note(targets.model_type)])]
    said, counts, part, lines = plan.describe(), plan.to_dict(), plan.validation_dict(), plan.log_lines()
    emit(make_event("data", **words_of(said), **counts, validation=part))
    for level, line in lines:
        emit(make_event("log", level=level, **words_of(line)))
    if (cfg.keep_best or cfg.early_stopping_patience) and not plan.evaluates:  # a stage's are refused before
        raise DataError("data.err.no_validation_rows", why=plan.held.why)


def follow(plan: DataPlan | PairPlan, cfg: TrainConfig) -> None:
    """The data plan trains as `cfg` does: no packs where its rows train unpacked."""
    if getattr(plan, "packing", False) and not cfg.packing:
        plan.packing, plan.n_packs = False, None


def adapted(run: ResolvedRun) -> list[dict[str, Any]]:
    """The family's adaptations as summary.json's preflight lists them: the key and its plain values, once each."""
    out = []
    for change in run.adapted():
        item = {"key": change.key, **{k: v for k, v in change.params.items() if isinstance(v, (str, int))}}
        if item not in out:
            out.append(item)
    return out


# --- config -> library arguments (core/config/arguments.py holds the mapping) -----------------------------------------
def build_sft_config(cfg: TrainConfig, output_dir: str | Path, console: bool = False, evaluate: bool = False,
                     run_dir: str | Path | None = None, cuda: bool | None = None) -> SFTConfig:
    """The chapter's TrainingArguments + SFTTrainer arguments, as one TRL SFTConfig (+ the eval's, with validation
    rows, and the tracker's). `cuda`: whether the run trains on CUDA (RunContext.cuda; None: as cfg.device says)."""
    return arguments.trainer_config(SFTConfig, cfg, output_dir, model_lib.use_cuda(cfg) if cuda is None else cuda,
                                    console, evaluate, run_dir)


def build_trainer(cfg: TrainConfig, model, tokenizer, train_dataset, output_dir: Path, callbacks=(),
                  console: bool = False, eval_dataset=None, cuda: bool | None = None) -> SFTTrainer:
    if cfg.stage != "sft":  # stages hook: TRL's DPO/ORPO/KTO trainer
        trainer = stages.trainer_for(cfg, model, tokenizer, train_dataset, output_dir, callbacks, console,
                                     eval_dataset, cuda)
    else:
        args = build_sft_config(cfg, output_dir, console, eval_dataset is not None, output_dir.parent, cuda)
        if args.use_liger_kernel:  # what of liger this model can take (4-bit MoE experts: not its SwiGLU)
            args.liger_kernel_config = {**(args.liger_kernel_config or {}), **liger_config(model)}
        trainer = counted_once(SFTTrainer)(  # the Trainer's flop count without a walk per micro-batch (host.py)
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=tokenizer,  # was `tokenizer=` in the chapter
            callbacks=list(callbacks),
        )
    if cfg.loraplus_lr_ratio:
        # LoRA+: peft's optimizer (lora_B at loraplus_lr_ratio x the lr) over the class `optim` names; the Trainer
        # reads this attribute when it builds the optimizer (TRL's preference trainers take no such argument)
        trainer.optimizer_cls_and_kwargs = variants.loraplus_optimizer(trainer.args, cfg.loraplus_lr_ratio,
                                                                       cfg.weight_decay)
    # memtune's own "step N/M  loss ..." lines carry the metrics: the Trainer printing every log dict again (as a
    # dict after each bar update, or PrinterCallback's lines in a log file) only buries them.
    trainer.remove_callback(PrinterCallback)
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(BarOnly())
    distributed.fsdp_wrap_policy(trainer)  # FSDP-QLoRA: LoRA layers wrapped on their own (no-op otherwise)
    return trainer


def keep_adapter_dtype(trainer) -> None:
    """A resume reloads the checkpoint's adapter through peft's load_adapter, which by default upcasts bf16 LoRA
    weights to fp32 (autocast_adapter_dtype): the resumed run then trained and saved in fp32, twice the size of the
    bf16 adapter TRL makes for QLoRA. Loading without the upcast keeps the dtype the model already trains in."""
    model = trainer.model
    load = getattr(model, "load_adapter", None)
    if load is not None and "autocast_adapter_dtype" in inspect.signature(load).parameters:
        model.load_adapter = functools.partial(load, autocast_adapter_dtype=False)  # this model object only


# --- what a run leaves: its summary, or why it failed ----------------------------------------------------------
def summarize(cfg: TrainConfig, trainer, output, callback: EventCallback, plan: DataPlan, started: float,
              trainable: int, resume_ckpt: Path | None) -> dict[str, Any]:
    """summary.json of a run that trained (completed or stopped); LoRARecipe.save adds the memory peaks."""
    summary = {
        "status": "stopped" if callback.stopped else "completed",
        "model": cfg.model,
        "dataset": cfg.dataset,
        "steps": trainer.state.global_step,
        "max_steps": trainer.state.max_steps,
        "epoch": trainer.state.epoch,
        "first_loss": callback.first_loss,
        "final_loss": callback.last_loss,
        "train_loss": output.training_loss if not math.isnan(output.training_loss) else None,
        "train_tokens": int(trainer.state.num_input_tokens_seen or 0),
        "runtime_s": round(time.monotonic() - started, 2),
        "train_runtime_s": output.metrics.get("train_runtime"),
        # the warm-up pass before step 1 (kernel_warmup), inside train_runtime_s; None when it did not run
        "warmup_s": callback.warmup.seconds if callback.warmup else None,
        "tokens_per_s": None,
        "peak_allocated_gib": None,
        "peak_reserved_gib": None,
        "nvml_peak_gib": None,
        "trainable_params": trainable,
        "lora_modules": lora_modules(trainer.model),  # what peft really adapted
        **experts_summary(trainer.model),  # MoE: lora_parameters (LoRA on experts), experts_4bit_layers
        "resumed_from": str(resume_ckpt) if resume_ckpt else None,
        "data": plan.to_dict(),  # every row of the split, accounted for (core.data.plan.plan_rows)
        "validation": plan.validation_dict(),
        "eval": callback.eval_summary(trainer.args, trainer.state),
        "finished_at": datetime.now().isoformat(timespec="seconds"),
    }
    if regional.compiles(cfg):  # dynamo's graphs, compiles and graph breaks (bench rows read them here)
        summary["compile"] = regional.stats()
    if summary["train_runtime_s"]:
        summary["tokens_per_s"] = round(summary["train_tokens"] / summary["train_runtime_s"], 1)
    return summary


def lora_modules(model) -> list[str] | None:
    """The leaf names peft put LoRA on (its target_modules after resolution), as adapter_config.json lists them."""
    peft_config = getattr(model, "peft_config", None) or {}
    return sorted(peft_config["default"].target_modules) if "default" in peft_config else None


@dataclass
class Failure:
    """Why a run failed: its error type (failure_of), its message, the traceback (events.jsonl only) and what a page
    needs to say the message in its language (`said`: core.messages.fields_of)."""

    error_type: str
    message: str
    trace: str | None = None
    said: dict[str, Any] = field(default_factory=dict)


def record_failed(emit: EventSink, run_dir: Path, failure: Failure, plan: DataPlan | None = None,
                  run: ResolvedRun | None = None) -> RunResult:
    """A run that failed in this process: its record (runs.record_failure, with the data plan and the resolved run
    once there are: History lists the run and why), as the RunResult run_training returns."""
    summary = record_failure(run_dir, failure.message, failure.error_type, emit=emit, trace=failure.trace,
                             data=plan.to_dict() if plan is not None else None,
                             resolved=run.as_dict() if run is not None else None, **failure.said)
    return RunResult("failed", str(run_dir), None, summary, failure.message, failure.error_type)


def failure_of(exc: Exception, run_dir: Path | None = None) -> Failure:
    """Why a run failed, as its error type and message: out of memory (what would help is said by whoever shows the
    failure, from the config: core/estimate/advice.py), the user's to fix (config, data, model, disk) or not (other,
    its traceback kept for events.jsonl)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return Failure("oom", english("log.oom_ended"), said={"key": "log.oom_ended", "params": {}})
    kinds = ((DataError, "data"), (ModelError, "model"), (ConfigError, "config"),
             (StorageError, "disk"))  # h2: disk full / read-only: "No space left in FOLDER ..."
    kind = next((name for cls, name in kinds if isinstance(exc, cls)), "other")
    message = str(exc) if kind != "other" else f"{type(exc).__name__}: {exc}"
    if kind == "other" and run_dir is not None and (disk := storage_message(exc, run_dir)):
        kind, message = "disk", disk  # e.g. a checkpoint save, in the Trainer
    return Failure(kind, message, traceback.format_exc(limit=12), fields_of(exc))


# --- several processes (core/gpus/distributed.py launches them) -------------------------------------------------------
def distributed_summary(cuda: bool, num_machines: int, strategy: str) -> dict[str, Any]:
    """World size, strategy and every process's peak (a collective: every rank calls it). Tokens/s in the summary
    is already over all processes: the Trainer gathers the token count across ranks."""
    if cuda:
        mine = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    else:
        mine = round(psutil.Process().memory_info().rss / 2**30, 3)
    peaks = distributed.gather(mine)
    return {"world_size": distributed.world_size(), "num_machines": num_machines,
            "strategy": strategy if distributed.world_size() > 1 else "single",
            "per_process_peak_gib": peaks, "per_process_peak_kind": "cuda_allocated" if cuda else "cpu_rss"}


def full_state_dict(trainer, strategy: str):
    """Under FSDP the LoRA weights are sharded: gather them (every rank calls this) so rank 0 saves one adapter."""
    if distributed.world_size() == 1 or strategy != "fsdp":
        return None
    trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    return trainer.accelerator.get_state_dict(trainer.model)
