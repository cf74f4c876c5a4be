"""What a run is before its recipe starts, and what it leaves when it fails.

`RunContext.open` decides once what this process is in the run (the main one or another rank, the world it is part
of), makes its run folder and its event sink, and announces the run; `failure_of` and `record_failed` turn any
exception of the recipe into the failed run's record and the RunResult that `run_training` (core/train/recipe.py)
returns. Both need the whole config as asked (it is checked, written to config.yaml and announced), so they take the
run as asked (a ResolvedRun before anything is decided).
"""

from __future__ import annotations

import os
import tempfile
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.checks import check
from core.config.settings import ConfigError
from core.data.plan import DataError, DataPlan
from core.files import StorageError, has_marker, real, storage_message
from core.gpus import distributed, vram
from core.messages import english, fields_of, keyed
from core.model.load import ModelError, use_cuda
from core.model.resolve import ResolvedRun
from core.runs.events import EventSink, JsonlSink, fan_out, make_event
from core.runs.folders import (STOP_FILE, checkpoint_step, create_run_dir, finish_run, record_failure, resume_point,
                               save_adapter)


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
    world: int = 1  # how many processes train this run
    rank: int = 0  # this one's global rank

    @classmethod
    def open(cls, asked: ResolvedRun, sink: EventSink, stop: threading.Event,
             run_dir: str | Path | None) -> RunContext | RunResult:
        """The context of a run of `asked` (the config as typed), its folder made and the run announced (the `run`
        event: folder, config, checkpoint to resume from); a failed RunResult when the config is refused."""
        cfg = asked.asked
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
            folder = create_run_dir(cfg, cfg.to_yaml(), prepared=prepared) if main else Path(tempfile.mkdtemp(prefix="memtune-rank-"))
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
        return cls(main, folder, sink, use_cuda(cfg), stop, folder / STOP_FILE, resume, distributed.world_size(),
                   distributed.rank())

    def resumed_steps(self) -> int:
        """The optimizer steps the checkpoint resumed from has done (0 for a fresh run)."""
        return checkpoint_step(self.resume) if self.resume else 0

    def save_adapter(self, model, tokenizer, config_yaml: str, summary: dict[str, Any],
                     state_dict: dict | None = None) -> Path:
        """The adapter and the settings it trained with, into this run's folder (core/runs/folders.py: atomic)."""
        return save_adapter(model, tokenizer, config_yaml, self.run_dir, summary, state_dict=state_dict)

    def finish(self, summary: dict[str, Any]) -> Any:
        """summary.json, written atomically; a message when the disk refused it (core/runs/folders.py)."""
        return finish_run(self.run_dir, summary)

    def peak_tracker(self) -> vram.PeakTracker | None:
        """The main process's NVML sampler of the GPU's peak, started (None without CUDA or on another rank)."""
        return vram.PeakTracker().start() if self.cuda and self.main else None


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
