"""The recipe's trainer, and what it leaves: TRL's trainer built from the config (core/config/arguments.py holds the
mapping), a preference stage's through core/train/stages.py, with LoRA+'s optimizer, memtune's log callbacks and
FSDP's wrap policy; then the run's summary (summary.json) and the processes' peaks."""

from __future__ import annotations

import functools
import inspect
import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import psutil
import torch
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import SFTConfig, SFTTrainer

from core.config import arguments
from core.config.slices import DataSlice, Loading, ModelSlice, PlaceSlice, StageSlice, TrainerSlice
from core.data.plan import DataPlan
from core.gpus import distributed, link, vram
from core.levers import stream_layers as streaming, variants
from core.levers.experts import liger_config, summary as experts_summary
from core.model import compile as regional
from core.model import load as model_lib
from core.model.resolve import ResolvedRun
from core.train import grpo, stages, vision
from core.train.callbacks import BarOnly, EventCallback
from core.train.host import counted_once


class _Configured(ModelSlice, DataSlice, TrainerSlice, PlaceSlice, Protocol):
    """The SFT run's TRL config: the step, its precision and kernels, the rows' length and packing, evals, tracker."""


class _Built(Loading, DataSlice, StageSlice, TrainerSlice, PlaceSlice, Protocol):
    """A trainer of any stage: its TRL config, the stage's own arguments and LoRA+'s optimizer."""


# --- config -> library arguments (core/config/arguments.py holds the mapping) -----------------------------------------
def build_sft_config(cfg: _Configured, output_dir: str | Path, console: bool = False, evaluate: bool = False,
                     run_dir: str | Path | None = None, cuda: bool | None = None) -> SFTConfig:
    """The chapter's TrainingArguments + SFTTrainer arguments, as one TRL SFTConfig (+ the eval's, with validation
    rows, and the tracker's). `cuda`: whether the run trains on CUDA (RunContext.cuda; None: as cfg.device says)."""
    return arguments.trainer_config(SFTConfig, cfg, output_dir, model_lib.use_cuda(cfg) if cuda is None else cuda,
                                    console, evaluate, run_dir)


def build_trainer(cfg: _Built, model, tokenizer, train_dataset, output_dir: Path, callbacks=(),
                  console: bool = False, eval_dataset=None, cuda: bool | None = None) -> SFTTrainer:
    if cfg.stage == "grpo":  # stages hook: TRL's GRPOTrainer on the plan's prompts, the scorers as rewards
        trainer = grpo.trainer_for(cfg, model, tokenizer, train_dataset, output_dir, callbacks, console, cuda)
    elif vision.is_vision(train_dataset):  # image rows: TRL's vision collator, the processor as processing class
        trainer = vision.build_trainer(cfg, model, tokenizer, train_dataset, output_dir, callbacks, console,
                                       model_lib.use_cuda(cfg) if cuda is None else cuda)
    elif cfg.stage != "sft":  # stages hook: TRL's DPO/ORPO/KTO trainer
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


# --- what a run leaves: its summary ----------------------------------------------------------------------------------
def summarize(run: ResolvedRun, trainer, output, callback: EventCallback, plan: DataPlan, started: float,
              trainable: int, resume_ckpt: Path | None,
              compile_cache: regional.CompileCache | None = None) -> dict[str, Any]:
    """summary.json of a run that trained (completed or stopped): its steps, losses, tokens, data, evals, the
    pre-flight's results, the resolved run and the stage's rewards; LoRARecipe.save adds the memory peaks."""
    cfg = run.cfg
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
    summary["preflight"] = getattr(trainer, "memtune_preflight", None)  # core/train/preflight.py
    summary["resolved"] = run.as_dict()  # the config that trained, and each change from the asked one
    summary.update(stages.summary_part(cfg, trainer))  # stages hook: reward metrics ({} for sft)
    summary.update(streaming.summary_part(trainer.model, summary["train_runtime_s"]))  # stream_layers: the copies' wait
    measured = link.cached() if "stream_layers" in summary else None
    if measured is not None:  # the rates the estimate's slowdown used, beside the wait the run measured
        summary["stream_layers"].update(link_gb_s=round(measured.h2d_bytes_per_s / 1e9, 2),
                                        matmul_tflops=round(measured.matmul_flops / 1e12, 1))
    if compile_cache is not None and "compile" in summary:  # loaded or compiled, and the seconds it took
        summary["compile"]["cache"] = compile_cache.summary()
    return summary


def lora_modules(model) -> list[str] | None:
    """The leaf names peft put LoRA on (its target_modules after resolution), as adapter_config.json lists them."""
    peft_config = getattr(model, "peft_config", None) or {}
    return sorted(peft_config["default"].target_modules) if "default" in peft_config else None


def memory_peaks(nvml: vram.PeakTracker | None, cuda: bool) -> dict[str, Any]:
    """This process's peaks: NVML's (the tracker stopped) and torch's allocated and reserved on CUDA. Read before
    the collectives (gathering a sharded state dict takes memory)."""
    peaks = {}
    if nvml:
        nvml.stop()
        peaks["nvml_peak_gib"] = nvml.peak_gib
    if cuda:
        peaks["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        peaks["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
    return peaks


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
