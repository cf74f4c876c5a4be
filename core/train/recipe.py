"""The training recipe: config -> data -> model -> LoRA -> SFTTrainer -> adapter, with events all the way.

`run_training(cfg, sink, stop)` is the one entry point; read it top to bottom: check the config and make the run
folder, plan the data (`plan_data`), load the model and build the trainer (`build_run`), train, summarize, save.
The command line (`python -m core.train`, core/train/cli.py) calls it; the app's job manager runs that same CLI as a
child process (one run = one process; every process of a multi-process run runs it too), and tests may call it
in-process. It never raises for a user's mistake or an out-of-memory error: it returns a RunResult whose message
says what went wrong and what to do, and it leaves saved adapters intact. What the run says while it trains (phases, the Trainer callback, Stop) lives in
core/train/callbacks.py; the run folder (markers, checkpoints, atomic writes) in core/runs/folders.py.

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
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from core.config import checklist
from core.runs.folders import STOP_FILE
from core.train.callbacks import BarOnly, make_callback, make_warmup, phase, watch_stop
from core.checks import check
from core.config.settings import ConfigError, TrainConfig
from core.runs.events import EventSink, JsonlSink, fan_out, make_event
from core.files import StorageError, free_memory, has_marker, real, storage_message
from core.messages import fields_of
from core.runs.folders import create_run_dir, finish_run, record_failure, resume_point, save_adapter


@dataclass
class RunResult:
    status: str  # completed | stopped | failed
    run_dir: str | None = None
    adapter_dir: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    error_type: str | None = None  # config | data | model | oom | disk | other


def uses_cuda(cfg: TrainConfig) -> bool:
    import torch

    return cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())


def warms_up(cfg: TrainConfig, cuda: bool) -> bool:
    """kernel_warmup: auto is on with CUDA (the first step pays seconds of one-time set-up there), off on the CPU,
    which has no such set-up: there the pass would only cost one more micro-step."""
    return cfg.kernel_warmup == "on" or (cfg.kernel_warmup == "auto" and cuda)


# --- config -> library arguments (core/config/arguments.py holds the mapping) -----------------------------------------
def build_sft_config(cfg: TrainConfig, output_dir: str | Path, console: bool = False, evaluate: bool = False,
                     run_dir: str | Path | None = None):
    """The chapter's TrainingArguments + SFTTrainer arguments, as one TRL SFTConfig (+ the eval's, with validation
    rows, and the tracker's)."""
    from trl import SFTConfig

    from core.config import arguments as recipe

    kwargs = recipe.sft_kwargs(cfg, output_dir, uses_cuda(cfg), console)
    if evaluate:
        kwargs.update(recipe.eval_kwargs(cfg))
    kwargs.update(recipe.tracking_kwargs(cfg, run_dir))
    return SFTConfig(**recipe.installed_names(kwargs, SFTConfig))


def build_trainer(cfg: TrainConfig, model, tokenizer, train_dataset, output_dir: str | Path,
                  callbacks=(), console: bool = False, eval_dataset=None):
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import SFTTrainer

    trainer = SFTTrainer(
        model=model,
        args=build_sft_config(cfg, output_dir, console=console, evaluate=eval_dataset is not None,
                              run_dir=Path(output_dir).parent),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,  # was `tokenizer=` in the chapter
        callbacks=list(callbacks),
    )
    # memtune's own "step N/M  loss ..." lines carry the metrics: the Trainer printing every log dict again (as a
    # dict after each bar update, or PrinterCallback's lines in a log file) only buries them.
    trainer.remove_callback(PrinterCallback)
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(BarOnly())
    return trainer


# --- the recipe's steps ------------------------------------------------------------------------------------------
def plan_data(cfg: TrainConfig, emit: EventSink):
    """Read and check the data, find the model and its tokenizer, plan every row: (plan, tokenizer, model path).

    The data comes first: a broken file is reported as such before any model is looked up or downloaded.
    The caller refuses a plan with nothing to train (plan.refusal()) before loading the model, keeping the plan for
    the failed run's summary."""
    from core.data import plan as data
    from core.model import load as model_lib
    from core.data import validation

    with phase(emit, "tokenizing", f"Reading {cfg.dataset} [{cfg.dataset_split}]"):
        raw, fmt = data.check_data(cfg)
        held = validation.split(cfg, raw, fmt)  # before the plan: validation rows never reach plan.train_dataset()
    with phase(emit, "resolving", f"Finding {cfg.model}"):
        path = model_lib.resolve_model_path(cfg, emit)
        tokenizer = model_lib.load_tokenizer(cfg, path)
    with phase(emit, "tokenizing", f"Formatting and tokenizing {len(raw)} rows ({fmt})"):
        plan = data.plan_rows(cfg, tokenizer, held.train, fmt, n_examples=0)
        val_plan = None
        if held.val is not None:  # the same row plan: formatting, truncation, every row counted
            val_plan = data.plan_rows(validation.val_config(cfg), tokenizer, held.val, held.val_format, n_examples=0)
    plan.validation = val_plan  # what build_run evaluates on
    plan.held = held
    # LoRA targets from the module tree on the meta device, before any weight loads: a name the model lacks is
    # refused here (ConfigError listing its linear layers), and the log says what gets LoRA.
    from core.model import families

    targets = model_lib.lora_targets(cfg, path)
    plan.notes += [targets.describe(), *filter(None, [families.note(targets.model_type)])]
    emit(make_event("data", message=plan.describe(), **plan.to_dict(), validation=validation_dict(held, val_plan)))
    for line in filter(None, [plan.describe(), plan.describe_turns(), *plan.notes, held.why]):
        emit(make_event("log", level="info", message=line))
    if val_plan is not None:
        emit(make_event("log", level="info", message="Validation rows: " + val_plan.describe().removeprefix("Data: ")))
        if not val_plan.n_train:
            emit(make_event("log", level="warning", message="No validation row fits max_length: no eval"))
    if (cfg.keep_best or cfg.early_stopping_patience) and not (val_plan and val_plan.n_train):
        raise data.DataError("data.err.no_validation_rows", why=held.why)
    return plan, tokenizer, path


def validation_dict(held, val_plan) -> dict[str, Any]:
    """The validation part's accounting (events.jsonl's data event, summary.json["validation"])."""
    out = held.to_dict()
    if val_plan is not None:
        out["plan"] = val_plan.to_dict()
    return out


def build_run(cfg: TrainConfig, emit: EventSink, plan, tokenizer, path: str, stop: threading.Event, cuda: bool,
              stop_file: Path | None, output_dir: Path, callbacks=(), console: bool = False):
    """Load and prepare the model, then the trainer over exactly the plan's rows: (trainer, callback, trainable)."""
    from core.gpus import distributed
    from core.model import load as model_lib

    what = "Loading and quantizing to 4-bit" if cfg.load_in_4bit else "Loading"
    with phase(emit, "loading_model", f"{what} {cfg.model}"):
        model = model_lib.prepare_for_training(model_lib.load_model(cfg, path), cfg)
    trainable, total = model_lib.trainable_parameters(model)
    emit(make_event("log", level="info", message=f"LoRA: {trainable:,} trainable parameters of {total:,}"))
    callback = make_callback(emit, stop, cuda, stop_file)
    extra = []
    if cfg.compile_layers:
        from core.model import compile as regional

        note = getattr(model, "memtune_compile_note", "")
        emit(make_event("log", level="info", message=note))
        if note.startswith("Regional compile:"):
            extra.append(regional.callback(emit))  # the compile happens in the first step: say so, and how long
    val_plan = getattr(plan, "validation", None)
    evaluating = val_plan is not None and val_plan.n_train > 0
    if evaluating:
        from core.data import validation

        if not cuda:
            # bitsandbytes on a CPU with AVX512-BF16 repacks a 4-bit weight for inference the first time it runs in
            # eval mode, and training then goes through a kernel without a backward (wrong gradients, silently):
            # an eval must leave training exactly as it was.
            for module in model.modules():
                if getattr(module, "support_avx512bf16_for_cpu", False):
                    module.support_avx512bf16_for_cpu = False

        callback.samples = validation.samples(val_plan, tokenizer, cfg.eval_samples)
        callback.tokenizer, callback.max_new_tokens = tokenizer, cfg.eval_max_new_tokens
        if cfg.early_stopping_patience:
            from transformers import EarlyStoppingCallback

            extra.append(EarlyStoppingCallback(early_stopping_patience=cfg.early_stopping_patience))
    # The warm-up before the event callback: training's clock (step events, tokens/s) starts after it.
    warm = [make_warmup(emit)] if warms_up(cfg, cuda) else []
    with phase(emit, "tokenizing", "Tokenizing"):
        # plan.train_dataset(): exactly the plan's training rows, already tokenized and cut (validation's likewise)
        trainer = build_trainer(cfg, model, tokenizer, plan.train_dataset(), output_dir,
                                callbacks=[*warm, callback, *extra, *callbacks], console=console,
                                eval_dataset=val_plan.train_dataset() if evaluating else None)
        distributed.fsdp_wrap_policy(trainer)  # FSDP-QLoRA: LoRA layers wrapped on their own (no-op otherwise)
    for w in warm:
        w.trainer = trainer  # it runs the Trainer's own training_step on the Trainer's own dataloader
    callback.warmup = warm[0] if warm else None
    return trainer, callback, trainable


# --- the recipe -----------------------------------------------------------------------------------------------
def run_training(cfg: TrainConfig, sink: EventSink | None = None, stop: threading.Event | None = None,
                 callbacks=(), console: bool = False, run_dir: str | Path | None = None) -> RunResult:
    """Train `cfg` in this process. `run_dir`: use exactly this folder (the app's job manager made it and wrote
    config.yaml there) instead of choosing a new one; a config error then lands in its events.jsonl too.

    Every process of a multi-process run (accelerate launch) runs this same recipe; `main` guards what only global
    rank 0 does: write the run folder, events, summary and adapter. The others train in step and join rank 0's
    collectives, with their events nowhere and their Trainer's output in a private temporary folder; Stop reaches
    them through rank 0 (distributed.any_rank), and a failure of theirs goes to their stderr (the launcher's log)."""
    import torch

    from core.gpus import distributed

    stop = stop or threading.Event()
    user_sink = sink or (lambda e: None)
    main = not distributed.in_worker() or distributed.is_main()
    if distributed.in_worker() and torch.cuda.is_available() and cfg.device != "cpu":
        torch.cuda.set_device(distributed.local_rank())  # before loading: each process its own GPU
    if not main:
        user_sink, run_dir = (lambda e: None), None
    prepared = Path(run_dir) if run_dir is not None else None
    attached = prepared is not None and has_marker(prepared, "run")
    if attached:
        # The manager's folder (marked by create_run_dir): even a config error lands in the events.jsonl it follows.
        user_sink = fan_out(user_sink, JsonlSink(prepared / "events.jsonl"))
    try:
        check(cfg)
        # marked folder + config.yaml (refuses foreign folders); the other ranks: a private scratch folder
        run_dir = create_run_dir(cfg, prepared=prepared) if main else Path(tempfile.mkdtemp(prefix="memtune-rank-"))
    except ConfigError as exc:
        if attached:  # History lists it as a failed run
            return record_failed(user_sink, prepared, "config", str(exc), said=fields_of(exc))
        user_sink(make_event("error", error_type="config", message=str(exc), **fields_of(exc)))
        return RunResult("failed", str(prepared) if prepared else None, message=str(exc), error_type="config")

    write_events = main and not (attached and real(prepared) == run_dir)
    emit = fan_out(user_sink, JsonlSink(run_dir / "events.jsonl")) if write_events else user_sink
    if cfg.tracking == "tensorboard" and main:  # newer transformers read the folder from here only (no logging_dir)
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(run_dir / "tensorboard")
    resume_ckpt, skipped = resume_point(run_dir if main else cfg.resume_from) if cfg.resume_from else (None, [])
    emit(make_event("run", run_dir=str(run_dir), config=cfg.to_dict(), resume_from=str(resume_ckpt or ""),
                    pid=os.getpid(), threads=torch.get_num_threads(),
                    start=os.environ.get("MEMTUNE_START", "")))  # core/jobs/warm.py: "warm", or "cold: why"
    for why in skipped:  # a damaged newer checkpoint is named, and the previous intact one is used
        emit(make_event("log", level="warning", message=f"Not resuming from it: {why}"))

    cuda = uses_cuda(cfg)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    stop_file = run_dir / STOP_FILE
    watching = watch_stop(emit, stop, stop_file)
    trainer = plan = None
    started = time.monotonic()
    from core.gpus import vram

    nvml = vram.PeakTracker().start() if cuda and main else None  # from before loading: the load can be the peak
    try:
        from core.data.plan import DataError

        plan, tokenizer, path = plan_data(cfg, emit)
        if plan.refusal():
            raise DataError("data.err.refusal", why=plan.refusal())
        trainer, callback, trainable = build_run(cfg, emit, plan, tokenizer, path, stop, cuda, stop_file,
                                                 run_dir / "checkpoints", callbacks, console)
        if resume_ckpt:
            keep_adapter_dtype(trainer)
        output = trainer.train(resume_from_checkpoint=str(resume_ckpt) if resume_ckpt else None)

        summary = summarize(cfg, trainer, output, callback, plan, started, trainable, resume_ckpt)
        if nvml:
            nvml.stop()
            summary["nvml_peak_gib"] = nvml.peak_gib
        if cuda:
            summary["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            summary["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        summary.update(distributed_summary(cfg, trainer, cuda))  # a collective: every rank
        state_dict = full_state_dict(cfg, trainer)  # a collective too
        if not main:
            return RunResult(summary["status"])
        with phase(emit, "saving", f"Saving the adapter to {run_dir / 'adapter'}"):
            adapter_dir = save_adapter(trainer.model, tokenizer, cfg, run_dir, summary, state_dict=state_dict)
        if (problem := finish_run(run_dir, summary)):  # h2: atomic summary.json; a full disk is reported
            emit(make_event("log", level="warning", message=problem))
        status = summary["status"]
        message = (f"{'Stopped' if status == 'stopped' else 'Finished'} after {summary['steps']} step{'' if summary['steps'] == 1 else 's'}; "
                   f"adapter saved to {adapter_dir} ({summary['adapter_bytes'] / 2**20:.1f} MiB)")
        emit(make_event("done", status=status, run_dir=str(run_dir), adapter_dir=str(adapter_dir),
                        summary=summary, message=message))
        return RunResult(status, str(run_dir), str(adapter_dir), summary, message)
    except torch.OutOfMemoryError:
        error_type, message, trace, said = "oom", oom_message(cfg), None, {}
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the traceback goes to events.jsonl
        import traceback

        error_type, message = classify(exc, run_dir)
        said = fields_of(exc)  # key + params: the page says it in its own language
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
        if not main:
            shutil.rmtree(run_dir, ignore_errors=True)
    if not main:  # rank 0 and the launcher report the run
        print(f"memtune (rank {distributed.rank()}): {message}", file=sys.stderr)
        return RunResult("failed", message=message, error_type=error_type)
    return record_failed(emit, run_dir, error_type, message, trace, plan, said)


def lora_modules(model) -> list[str] | None:
    """The leaf names peft put LoRA on (its target_modules after resolution), as adapter_config.json lists them."""
    peft_config = getattr(model, "peft_config", None) or {}
    return sorted(peft_config["default"].target_modules) if "default" in peft_config else None


def keep_adapter_dtype(trainer) -> None:
    """A resume reloads the checkpoint's adapter through peft's load_adapter, which by default upcasts bf16 LoRA
    weights to fp32 (autocast_adapter_dtype): the resumed run then trained and saved in fp32, twice the size of the
    bf16 adapter TRL makes for QLoRA. Loading without the upcast keeps the dtype the model already trains in."""
    model = trainer.model
    load = getattr(model, "load_adapter", None)
    if load is not None and "autocast_adapter_dtype" in inspect.signature(load).parameters:
        model.load_adapter = functools.partial(load, autocast_adapter_dtype=False)  # this model object only


def summarize(cfg: TrainConfig, trainer, output, callback, plan, started: float, trainable: int,
              resume_ckpt: Path | None) -> dict[str, Any]:
    """summary.json of a run that trained (completed or stopped); run_training adds the memory peaks."""
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
        "warmup_s": getattr(getattr(callback, "warmup", None), "seconds", None),
        "tokens_per_s": None,
        "peak_allocated_gib": None,
        "peak_reserved_gib": None,
        "nvml_peak_gib": None,
        "trainable_params": trainable,
        "lora_modules": lora_modules(trainer.model),  # what peft really adapted
        "resumed_from": str(resume_ckpt) if resume_ckpt else None,
        "data": plan.to_dict(),  # every row of the split, accounted for (core.data.plan.plan_rows)
        "validation": validation_dict(plan.held, plan.validation) if hasattr(plan, "held") else None,
        "eval": callback.eval_summary(trainer.args, trainer.state) if hasattr(callback, "eval_summary") else None,
        "finished_at": datetime.now().isoformat(timespec="seconds"),
    }
    if cfg.compile_layers:  # dynamo's graphs, compiles and graph breaks (bench rows read them here)
        from core.model import compile as regional

        summary["compile"] = regional.stats()
    if summary["train_runtime_s"]:
        summary["tokens_per_s"] = round(summary["train_tokens"] / summary["train_runtime_s"], 1)
    return summary


def record_failed(emit: EventSink, run_dir: Path, error_type: str, message: str, trace: str | None = None,
                  plan=None, said: dict[str, Any] | None = None) -> RunResult:
    """A run that failed in this process: its record (runs.record_failure, with the data plan once there is one:
    History lists the run and why), as the RunResult run_training returns. `said`: core.messages.fields_of(exc)."""
    summary = record_failure(run_dir, message, error_type, emit=emit, trace=trace,
                             data=plan.to_dict() if plan is not None else None, **(said or {}))
    return RunResult("failed", str(run_dir), None, summary, message, error_type)


# --- what went wrong, in words ---------------------------------------------------------------------------------
def classify(exc: Exception, run_dir: Path | None = None) -> tuple[str, str]:
    from core.data.plan import DataError
    from core.model.load import ModelError

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


def oom_message(cfg: TrainConfig) -> str:
    """Name the checklist items that are off, with what each would save at these settings when we can tell."""
    tips = []
    try:
        from core.estimate.predict import savings

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


# --- several processes (core/gpus/distributed.py launches them) -------------------------------------------------------
def distributed_summary(cfg: TrainConfig, trainer, cuda: bool) -> dict[str, Any]:
    """World size, strategy and every process's peak (a collective: every rank calls it). Tokens/s in the summary
    is already over all processes: the Trainer gathers the token count across ranks."""
    import torch

    from core.gpus import distributed

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
    from core.gpus import distributed

    if distributed.world_size() == 1 or cfg.distributed_strategy != "fsdp":
        return None
    trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    return trainer.accelerator.get_state_dict(trainer.model)
