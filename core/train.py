"""The training recipe: config -> data -> model -> LoRA -> SFTTrainer -> adapter, with events all the way.

`run_training(cfg, sink, stop)` is the one entry point. The CLI below calls it; the app's job manager runs that same
CLI as a child process (one run = one process), and tests and the benchmark may call it in-process. It never raises
for a user's mistake or an out-of-memory error: it returns a RunResult whose message says what went wrong and what
to do, and it leaves saved adapters intact.

CLI:
    python -m core.train --config FILE.yaml [--set field=value ...]
    python -m core.train --demo            # the offline demo, < 60 s on 2 CPU cores
    python -m core.train --dump-config     # the default (chapter) configuration as YAML
    python -m core.train --config FILE.yaml --preset lowest_memory   # a preset's levers, then any --set
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from core import checklist
from core.config import ConfigError, Hardware, TrainConfig, apply_overrides, check, demo_config
from core.events import EventSink, JsonlSink, fan_out, make_event
from core.files import StorageError, free_memory, has_marker, real, storage_message
from core.presets import PRESETS, apply_preset
from core.runs import (COMPLETE_MARKER, complete_checkpoints, create_run_dir, dir_size, finish_run,  # noqa: F401
                       latest_checkpoint, new_run_dir, resume_point, save_adapter)

STOP_FILE = "STOP"  # in a run folder: asks the run to end after its current step and save the adapter
HEARTBEAT_S = 2.0  # no phase stays silent longer than this


@dataclass
class RunResult:
    status: str  # completed | stopped | failed
    run_dir: str | None = None
    adapter_dir: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    error_type: str | None = None  # config | data | model | oom | disk | other


# --- config -> library arguments (core/recipe.py holds the mapping) -----------------------------------------
def build_sft_config(cfg: TrainConfig, output_dir: str | Path, console: bool = False):
    """The chapter's TrainingArguments + SFTTrainer arguments, as one TRL SFTConfig."""
    import torch
    from trl import SFTConfig

    from core import recipe

    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    return SFTConfig(**recipe.installed_names(recipe.sft_kwargs(cfg, output_dir, cuda, console), SFTConfig))


def build_trainer(cfg: TrainConfig, model, tokenizer, train_dataset, output_dir: str | Path,
                  callbacks=(), console: bool = False):
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import SFTTrainer

    trainer = SFTTrainer(
        model=model,
        args=build_sft_config(cfg, output_dir, console=console),
        train_dataset=train_dataset,
        processing_class=tokenizer,  # was `tokenizer=` in the chapter
        callbacks=list(callbacks),
    )
    # memtune's own "step N/M  loss ..." lines carry the metrics: the Trainer printing every log dict again (as a
    # dict after each bar update, or PrinterCallback's lines in a log file) only buries them.
    trainer.remove_callback(PrinterCallback)
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(BarOnly())
    return trainer


def _bar_only():
    from transformers.trainer_callback import ProgressCallback

    class BarOnly(ProgressCallback):
        """The Trainer's progress bar on a terminal, without its copy of every log dict."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            return None

    return BarOnly


def BarOnly():  # noqa: N802 - built lazily: transformers is imported only when a trainer is built
    return _bar_only()()


# --- run folder: core.runs (markers, checkpoints, atomic writes); names kept here for existing callers ---------
# --- events during training -----------------------------------------------------------------------------------
@contextlib.contextmanager
def phase(sink: EventSink, name: str, message: str) -> Iterator[None]:
    """Announce a phase and keep saying it is alive every few seconds until it ends."""
    sink(make_event("phase", phase=name, message=message, progress=None))
    done = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            sink(make_event("phase", phase=name, progress=None,
                            message=f"{message} ({time.monotonic() - start:.0f} s)"))

    thread = threading.Thread(target=beat, daemon=True, name=f"memtune-heartbeat-{name}")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def watch_stop(emit: EventSink, stop: threading.Event, stop_file: Path) -> threading.Event:
    """Until the returned event is set: turn a stop file into the stop flag, and say at once that Stop was seen.

    The stop file (written by the app's job manager, or `touch RUN/STOP` by hand) and a signal (SIGTERM sets the
    flag in `main`) are the two ways to ask; the `ack` event tells the manager the run is alive and ending, so it
    waits for the current step instead of killing the run.
    """
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            if stop.is_set() or stop_file.exists():
                stop.set()
                emit(make_event("log", level="info", ack="stop",
                                message="Stop requested: finishing the current step, then saving the adapter."))
                return

    threading.Thread(target=watch, daemon=True, name="memtune-stop-watch").start()
    return done


def make_callback(sink: EventSink, stop: threading.Event, cuda: bool, stop_file: Path | None = None):
    """A TrainerCallback that emits step events, honours Stop (flag or stop file) and marks checkpoints complete."""
    from transformers import TrainerCallback

    from core import distributed, vram

    class EventCallback(TrainerCallback):
        def __init__(self) -> None:
            self.start = time.monotonic()
            self.first_loss: float | None = None
            self.last_loss: float | None = None
            self.tokens_at_start = 0
            self.steps_at_start = 0
            self.stopped = False

        def on_train_begin(self, args, state, control, **kw):
            self.start = time.monotonic()
            self.tokens_at_start = state.num_input_tokens_seen or 0
            self.steps_at_start = state.global_step
            sink(make_event("phase", phase="training", progress=0.0,
                            message=f"Training: {state.max_steps} optimizer steps"))

        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            if "loss" not in logs:
                return
            loss = float(logs["loss"])
            self.first_loss = loss if self.first_loss is None else self.first_loss
            self.last_loss = loss
            lr, grad_norm = logs.get("learning_rate"), logs.get("grad_norm")
            sink(make_event("metrics", step=state.global_step, total_steps=state.max_steps,
                            epoch=round(state.epoch or 0.0, 4), loss=loss, learning_rate=lr,
                            grad_norm=float(grad_norm) if grad_norm is not None else None))
            sink(make_event("log", level="info", message=(
                f"step {state.global_step}/{state.max_steps}  loss {loss:.4f}  lr {float(lr or 0):.2e}  "
                f"grad_norm {float(grad_norm or 0):.3f}")))

        def on_step_end(self, args, state, control, **kw):
            elapsed = time.monotonic() - self.start
            done = state.global_step - self.steps_at_start
            remaining = max(0, state.max_steps - state.global_step)
            tokens = (state.num_input_tokens_seen or 0) - self.tokens_at_start
            mem = vram.torch_peaks() if cuda else None
            sink(make_event(
                "step", step=state.global_step, total_steps=state.max_steps, epoch=round(state.epoch or 0.0, 4),
                tokens=int(state.num_input_tokens_seen or 0),
                tokens_per_s=round(tokens / elapsed, 1) if elapsed > 0 else None,
                elapsed_s=round(elapsed, 2),
                eta_s=round(elapsed / done * remaining, 1) if done else None,
                gpu_mem_gib=mem["allocated_gib"] if mem else None,
                peak_gib=mem["peak_allocated_gib"] if mem else None,
            ))
            wanted = stop.is_set() or (stop_file is not None and stop_file.exists())
            if distributed.world_size() > 1:
                wanted = distributed.any_rank(wanted)  # every process ends after the same step
            if wanted:
                stop.set()
                self.stopped = True
                control.should_training_stop = True
                sink(make_event("log", level="info", ack="stop",
                                message=f"Stop requested: ending after step {state.global_step}"))
            return control

        def on_save(self, args, state, control, **kw):
            # Called after the Trainer has fully written the checkpoint: only now is it safe to resume from.
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir() and distributed.is_main():
                (ckpt / COMPLETE_MARKER).write_text(str(time.time()), encoding="utf-8")
                sink(make_event("log", level="info", message=f"Checkpoint saved: {ckpt}"))

    return EventCallback()


def oom_message(cfg: TrainConfig) -> str:
    """Name the checklist items that are off, with what each would save at these settings when we can tell."""
    tips = []
    try:
        from core.estimate import savings

        by_key = {s.key: s for s in savings(cfg)}
    except Exception:  # the estimator is advice only; never let it hide the real error
        by_key = {}
    for item in checklist.missing(cfg):
        saved = by_key.get(item.key)
        amount = f" (saves ~{saved.saved_gib:.1f} GiB here)" if saved and getattr(saved, "saved_gib", 0) > 0.05 else ""
        tips.append(f"- {item.label}{amount}")
    if not cfg.use_liger_kernel:
        tips.append("- Fused kernels (use_liger_kernel, CUDA) recompute SwiGLU/RMSNorm activations instead of storing them")
    advice = "\n".join(tips) if tips else "- Every checklist item is already on: lower max_length or pick a smaller model."
    return ("The GPU ran out of memory. Nothing was lost: earlier checkpoints and adapters are intact, and the "
            f"memory has been released. These would help at your settings:\n{advice}")


# --- the recipe's steps, shared by rank 0 (run_training) and the other ranks (run_other_rank) --------------------
def plan_data(cfg: TrainConfig, emit: EventSink):
    """Read and check the data, find the model and its tokenizer, plan every row: (plan, tokenizer, model path).

    The data comes first: a broken file is reported as such before any model is looked up or downloaded.
    The caller refuses a plan with nothing to train (plan.refusal()) before loading the model, keeping the plan for
    the failed run's summary."""
    from core import data, model as model_lib

    with phase(emit, "tokenizing", f"Reading {cfg.dataset} [{cfg.dataset_split}]"):
        raw, fmt = data.check_data(cfg)
    with phase(emit, "resolving", f"Finding {cfg.model}"):
        path = model_lib.resolve_model_path(cfg, emit)
        tokenizer = model_lib.load_tokenizer(cfg, path)
    with phase(emit, "tokenizing", f"Formatting and tokenizing {len(raw)} rows ({fmt})"):
        plan = data.plan_rows(cfg, tokenizer, raw, fmt, n_examples=0)
    emit(make_event("data", message=plan.describe(), **plan.to_dict()))
    for line in [plan.describe(), *plan.notes]:
        emit(make_event("log", level="info", message=line))
    return plan, tokenizer, path


def build_run(cfg: TrainConfig, emit: EventSink, plan, tokenizer, path: str, stop: threading.Event, cuda: bool,
              stop_file: Path | None, output_dir: Path, callbacks=(), console: bool = False):
    """Load and prepare the model, then the trainer over exactly the plan's rows: (trainer, callback, trainable)."""
    from core import distributed, model as model_lib

    what = "Loading and quantizing to 4-bit" if cfg.load_in_4bit else "Loading"
    with phase(emit, "loading_model", f"{what} {cfg.model}"):
        model = model_lib.prepare_for_training(model_lib.load_model(cfg, path), cfg)
    trainable, total = model_lib.trainable_parameters(model)
    emit(make_event("log", level="info", message=f"LoRA: {trainable:,} trainable parameters of {total:,}"))
    callback = make_callback(emit, stop, cuda, stop_file)
    with phase(emit, "tokenizing", "Tokenizing"):
        # plan.train_dataset(): exactly the plan's training rows, already tokenized and cut
        trainer = build_trainer(cfg, model, tokenizer, plan.train_dataset(), output_dir,
                                callbacks=[callback, *callbacks], console=console)
        distributed.fsdp_wrap_policy(trainer)  # FSDP-QLoRA: LoRA layers wrapped on their own (no-op otherwise)
    return trainer, callback, trainable


# --- the recipe -----------------------------------------------------------------------------------------------
def run_training(cfg: TrainConfig, sink: EventSink | None = None, stop: threading.Event | None = None,
                 callbacks=(), console: bool = False, run_dir: str | Path | None = None) -> RunResult:
    """Train `cfg` in this process. `run_dir`: use exactly this folder (the app's job manager made it and wrote
    config.yaml there) instead of choosing a new one; a config error then lands in its events.jsonl too."""
    import torch

    from core import distributed

    stop = stop or threading.Event()
    user_sink = sink or (lambda e: None)
    if distributed.in_worker():  # one of several processes (accelerate launch): only global rank 0 writes the run
        if torch.cuda.is_available() and cfg.device != "cpu":
            torch.cuda.set_device(distributed.local_rank())  # before loading: each process its own GPU
        if not distributed.is_main():
            return run_other_rank(cfg, stop, callbacks)
    prepared = Path(run_dir) if run_dir is not None else None
    attached = prepared is not None and has_marker(prepared, "run")
    if attached:
        # The manager's folder (marked by create_run_dir): even a config error lands in the events.jsonl it follows.
        user_sink = fan_out(user_sink, JsonlSink(prepared / "events.jsonl"))
    try:
        check(cfg)
        run_dir = create_run_dir(cfg, prepared=prepared)  # marked folder + config.yaml; refuses foreign folders
    except ConfigError as exc:
        user_sink(make_event("error", error_type="config", message=str(exc)))
        if attached:  # History lists it as a failed run
            summary = {"status": "failed", "error_type": "config", "message": str(exc),
                       "finished_at": datetime.now().isoformat(timespec="seconds")}
            finish_run(prepared, summary)
            user_sink(make_event("done", status="failed", run_dir=str(prepared), summary=summary, message=str(exc)))
        return RunResult("failed", str(prepared) if prepared else None, message=str(exc), error_type="config")

    emit = user_sink if attached and real(prepared) == run_dir else fan_out(user_sink, JsonlSink(run_dir / "events.jsonl"))
    resume_ckpt, skipped = resume_point(run_dir) if cfg.resume_from else (None, [])
    emit(make_event("run", run_dir=str(run_dir), config=cfg.to_dict(), resume_from=str(resume_ckpt or ""),
                    pid=os.getpid(), threads=torch.get_num_threads()))
    for why in skipped:  # a damaged newer checkpoint is named, and the previous intact one is used
        emit(make_event("log", level="warning", message=f"Not resuming from it: {why}"))

    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    stop_file = run_dir / STOP_FILE
    watching = watch_stop(emit, stop, stop_file)
    trainer = plan = None
    started = time.monotonic()
    from core import vram

    nvml = vram.PeakTracker().start() if cuda else None  # from before loading: the load can be the peak
    try:
        from core.data import DataError

        plan, tokenizer, path = plan_data(cfg, emit)
        if plan.refusal():
            raise DataError(plan.refusal())
        trainer, callback, trainable = build_run(cfg, emit, plan, tokenizer, path, stop, cuda, stop_file,
                                                 run_dir / "checkpoints", callbacks, console)
        output = trainer.train(resume_from_checkpoint=str(resume_ckpt) if resume_ckpt else None)

        status = "stopped" if callback.stopped else "completed"
        summary = {
            "status": status,
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
            "tokens_per_s": None,
            "peak_allocated_gib": None,
            "peak_reserved_gib": None,
            "nvml_peak_gib": None,
            "trainable_params": trainable,
            "resumed_from": str(resume_ckpt) if resume_ckpt else None,
            "data": plan.to_dict(),  # every row of the split, accounted for (core.data.plan_rows)
            "finished_at": datetime.now().isoformat(timespec="seconds"),
        }
        if summary["train_runtime_s"]:
            summary["tokens_per_s"] = round(summary["train_tokens"] / summary["train_runtime_s"], 1)
        if nvml:
            nvml.stop()
            summary["nvml_peak_gib"] = nvml.peak_gib
        if cuda:
            summary["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            summary["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)

        summary.update(distributed_summary(cfg, trainer, cuda))
        state_dict = full_state_dict(cfg, trainer)
        with phase(emit, "saving", f"Saving the adapter to {run_dir / 'adapter'}"):
            adapter_dir = save_adapter(trainer.model, tokenizer, cfg, run_dir, summary, state_dict=state_dict)
        if (problem := finish_run(run_dir, summary)):  # h2: atomic summary.json; a full disk is reported
            emit(make_event("log", level="warning", message=problem))
        message = (f"{'Stopped' if status == 'stopped' else 'Finished'} after {summary['steps']} steps; "
                   f"adapter saved to {adapter_dir} ({summary['adapter_bytes'] / 2**20:.1f} MiB)")
        emit(make_event("done", status=status, run_dir=str(run_dir), adapter_dir=str(adapter_dir),
                        summary=summary, message=message))
        return RunResult(status, str(run_dir), str(adapter_dir), summary, message)
    except torch.OutOfMemoryError:
        error_type, message, trace = "oom", oom_message(cfg), None
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the traceback goes to events.jsonl
        import traceback

        error_type, message = classify(exc, run_dir)
        trace = traceback.format_exc(limit=12)
    finally:
        watching.set()
        with contextlib.suppress(OSError):
            stop_file.unlink(missing_ok=True)  # ours: a later resume into this folder must not stop at once
        # Drop references so a failed run's memory is free for the error path (the CLI process ends right after).
        trainer = None
        if nvml:
            nvml.stop()
        free_memory()
    emit(make_event("error", error_type=error_type, message=message, traceback=trace))
    summary = {"status": "failed", "error_type": error_type, "message": message,
               "finished_at": datetime.now().isoformat(timespec="seconds")}
    if plan is not None:
        summary["data"] = plan.to_dict()
    if (problem := finish_run(run_dir, summary)):  # never a 0-byte summary.json; temp folders removed
        emit(make_event("log", level="warning", message=problem))
    emit(make_event("done", status="failed", run_dir=str(run_dir), summary=summary, message=message))
    return RunResult("failed", str(run_dir), None, summary, message, error_type)


# --- several processes (core/distributed.py launches them) -------------------------------------------------------
def distributed_summary(cfg: TrainConfig, trainer, cuda: bool) -> dict[str, Any]:
    """World size, strategy and every process's peak (a collective: every rank calls it). Tokens/s in the summary
    is already over all processes: the Trainer gathers the token count across ranks."""
    import torch

    from core import distributed

    if cuda:
        mine = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    else:
        import psutil

        mine = round(psutil.Process().memory_info().rss / 2**30, 3)
    peaks = distributed.gather(mine)
    return {"world_size": distributed.world_size(), "num_machines": cfg.num_machines,
            "strategy": cfg.distributed_strategy if distributed.world_size() > 1 else "single",
            "per_process_peak_gib": peaks, "per_process_peak_kind": "cuda_allocated" if cuda else "cpu_rss"}


def full_state_dict(cfg: TrainConfig, trainer):
    """Under FSDP the LoRA weights are sharded: gather them (every rank calls this) so rank 0 saves one adapter."""
    from core import distributed

    if distributed.world_size() == 1 or cfg.distributed_strategy != "fsdp":
        return None
    trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    return trainer.accelerator.get_state_dict(trainer.model)


def run_other_rank(cfg: TrainConfig, stop: threading.Event, callbacks=()) -> RunResult:
    """Ranks other than 0 run the same recipe but write nothing of the run folder: their Trainer's output goes to a
    private temporary folder, their events nowhere; Stop reaches them through rank 0 (distributed.any_rank)."""
    import tempfile

    import torch

    scratch = Path(tempfile.mkdtemp(prefix="memtune-rank-"))
    quiet: EventSink = lambda e: None  # noqa: E731
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    from core.data import DataError

    try:
        plan, tokenizer, path = plan_data(cfg, quiet)
        if plan.refusal():
            raise DataError(plan.refusal())
        trainer, callback, _ = build_run(cfg, quiet, plan, tokenizer, path, stop, cuda, None, scratch / "checkpoints",
                                         callbacks)
        resume, _ = resume_point(cfg.resume_from) if cfg.resume_from else (None, [])  # the checkpoint rank 0 takes
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        distributed_summary(cfg, trainer, cuda)  # the collectives rank 0 makes
        full_state_dict(cfg, trainer)
        return RunResult("stopped" if callback.stopped else "completed")
    except Exception as exc:  # noqa: BLE001 - rank 0 and the launcher report the run; this process's log has it
        error_type, message = classify(exc)
        print(f"memtune (rank {os.environ.get('RANK')}): {message}", file=sys.stderr)
        return RunResult("failed", message=message, error_type=error_type)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


def classify(exc: Exception, run_dir: Path | None = None) -> tuple[str, str]:
    from core.data import DataError
    from core.model import ModelError

    if isinstance(exc, DataError):
        return "data", str(exc)
    if isinstance(exc, ModelError):
        return "model", str(exc)
    if isinstance(exc, ConfigError):
        return "config", str(exc)
    if isinstance(exc, StorageError):  # h2: disk full / read-only: "No space left in FOLDER ..."
        return "disk", str(exc)
    if run_dir is not None and (message := storage_message(exc, run_dir)):  # e.g. a checkpoint save, in the Trainer
        return "disk", message
    return "other", f"{type(exc).__name__}: {exc}"


# --- command line -------------------------------------------------------------------------------------------------
def console_sink(event: dict[str, Any]) -> None:
    """Phase messages and log lines on stderr; the Trainer's own progress bar shows steps, ETA and speed.

    Errors are not printed here: `main` prints the failure once, and the traceback stays in events.jsonl.
    """
    kind = event["kind"]
    if (kind == "phase" and event.get("phase") != "training") or kind == "log":
        print(f"[memtune] {event['message']}", file=sys.stderr, flush=True)


def quiet_libraries(console: bool) -> None:
    """A clean command line: memtune's own progress lines, not the libraries' noise.

    peft itself reads `is_gradient_checkpointing` (deprecated in transformers 5) on every run, so that FutureWarning
    says nothing about the user's settings; datasets' per-map progress bars are kilobytes of \r in a log file.
    """
    import warnings

    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    import logging

    # bitsandbytes on a CPU without its optional `kernels` package says so on every load; it falls back by itself.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    if not console:
        import datasets
        from transformers.utils import logging as hf_logging

        datasets.disable_progress_bars()
        hf_logging.disable_progress_bar()


def set_threads_from_env() -> None:
    """MEMTUNE_NUM_THREADS (the app sets it to cores - 1 for its child, leaving a core to the page); else all cores."""
    value = os.environ.get("MEMTUNE_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        import torch

        torch.set_num_threads(int(value))


def stop_on_signals(stop: threading.Event, run_dir: str | None = None) -> None:
    """SIGTERM / Ctrl-C: finish the current step and save the adapter. A signal after a Stop was already asked for
    (this flag, or the run folder's stop file: the app's second Stop) ends the process at once."""
    stop_file = Path(run_dir) / STOP_FILE if run_dir else None

    def handler(signum, frame):  # only sets a flag: never write or lock inside a signal handler
        if stop.is_set() or (stop_file is not None and stop_file.exists()):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def stop_when_orphaned(stop: threading.Event) -> None:
    """Started by the app (MEMTUNE_PARENT_PID): if the app dies without stopping us, stop and save, never linger."""
    parent = os.environ.get("MEMTUNE_PARENT_PID", "")
    if not parent.isdigit():
        return

    def watch() -> None:
        while not stop.wait(1.0):
            if os.getppid() != int(parent):
                stop.set()

    threading.Thread(target=watch, daemon=True, name="memtune-parent-watch").start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.train", description="Fine-tune with LoRA/QLoRA, headless.")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="YAML file of settings (start from --dump-config)")
    src.add_argument("--demo", action="store_true", help="train the offline demo (tiny model, shipped data)")
    src.add_argument("--dump-config", action="store_true", help="print the default configuration as YAML")
    parser.add_argument("--preset", choices=list(PRESETS), help="apply a preset's memory/speed levers first "
                        "(chapter: the recipe as written; lowest_memory; fastest), then --set")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override one setting; repeatable")
    # Internal (the app's job manager): train into exactly this folder, which it made and wrote config.yaml into.
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.dump_config:
            cfg = TrainConfig()
        else:
            cfg = demo_config() if args.demo else TrainConfig.load(args.config)
        if args.preset:
            # A dumped file may be meant for another machine; a run here keeps CUDA-only levers off without CUDA.
            cfg = apply_preset(cfg, args.preset, None if args.dump_config else Hardware.detect())
        cfg = apply_overrides(cfg, args.overrides)
    except ConfigError as exc:
        print(f"memtune: {exc}", file=sys.stderr)
        return 2
    if args.dump_config:
        from core.codegen import accelerate_note

        print(f"# memtune configuration: python -m core.train --config this.yaml{accelerate_note(cfg, 'this.yaml')}"
              f"\n{cfg.to_yaml()}", end="")
        return 0
    from core import distributed

    if distributed.pin_one_gpu(cfg):  # one process, several GPUs visible: use GPU 0, not nn.DataParallel
        print("[memtune] several GPUs are visible and num_gpus is 1: training on GPU 0 "
              "(set num_gpus to use more)", file=sys.stderr, flush=True)
    if distributed.plan(cfg).distributed and not distributed.in_worker():
        return distributed.run_launcher(cfg, args.run_dir)  # accelerate launch: this machine's workers
    set_threads_from_env()
    quiet_libraries(console=sys.stderr.isatty())
    stop = threading.Event()
    stop_on_signals(stop, args.run_dir)
    stop_when_orphaned(stop)
    try:
        # A progress bar only on a terminal: in a log file (the app's RUN/train.log, a pipe) it is kilobytes of \r.
        result = run_training(cfg, console_sink, stop=stop, console=sys.stderr.isatty(), run_dir=args.run_dir)
    except OSError as exc:  # e.g. an output folder that cannot be created: the user's to fix, not a bug report
        what = f"{exc.strerror}: {exc.filename}" if exc.filename and exc.strerror else str(exc)
        print(f"memtune: cannot write the run folder ({what}); choose an output_dir you can write to",
              file=sys.stderr)
        return 1
    if result.status == "failed":
        where = f" (details in {Path(result.run_dir) / 'events.jsonl'})" if result.run_dir else ""
        kind = f" ({result.error_type})" if result.error_type else ""
        print(f"memtune: training failed{kind}: {result.message}{where if result.error_type == 'other' else ''}",
              file=sys.stderr)
        return 1
    s = result.summary
    print(f"{result.message}\nfirst loss {s.get('first_loss')}, last loss {s.get('final_loss')}, "
          f"{s.get('train_tokens')} tokens in {s.get('train_runtime_s')} s")
    print(result.adapter_dir)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written and closed by now. Skipping the interpreter's teardown (seconds, once torch is loaded)
    # ends the process at once, so the app can take the next Start (and the GPU is free) as soon as "done" shows.
    os._exit(code)
