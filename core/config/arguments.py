"""The one mapping from a TrainConfig to the libraries' keyword arguments.

The engine (core/model/load.py, core/train/) builds its library objects from these dicts; "Show code" (core/codegen.py)
runs the engine itself, so there is no second mapping to drift apart. Everything
here is pure and cheap: plain values only (the compute dtype is the string "bfloat16", which BitsAndBytesConfig
and from_pretrained both accept), no torch/transformers import at module level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from core.config.slices import DataSlice, LoraSlice, ModelSlice, PlaceSlice, TrainerSlice


class _Placed(ModelSlice, PlaceSlice, Protocol):
    """The weights as this process loads them: their dtype and quantization, and whether FSDP shards them."""


class _Steps(ModelSlice, DataSlice, TrainerSlice, Protocol):
    """The Trainer's step: the optimizer loop, its precision and kernels, and the rows' length and packing."""


class _Evaluated(TrainerSlice, PlaceSlice, Protocol):
    """The Trainer's evals: their schedule and levers, and whether the run resumes (its baseline is then saved)."""


class _Trained(ModelSlice, DataSlice, TrainerSlice, PlaceSlice, Protocol):
    """A stage's whole TRL config: the step, the evals and the tracker."""

DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def dtype_name(cfg: ModelSlice) -> str:
    return DTYPE_NAMES[cfg.precision]


def bnb_kwargs(cfg: _Placed) -> dict[str, Any] | None:
    """BitsAndBytesConfig(**...): the chapter's NF4 + double quantization with the training dtype for compute."""
    if not cfg.load_in_4bit:
        return None
    return {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": cfg.bnb_4bit_quant_type,
        "bnb_4bit_use_double_quant": cfg.bnb_4bit_use_double_quant,
        "bnb_4bit_compute_dtype": dtype_name(cfg),
        # FSDP-QLoRA flattens parameters of one dtype: store the packed 4-bit weights in the compute dtype's width
        **({"bnb_4bit_quant_storage": dtype_name(cfg)} if sharded(cfg) else {}),
    }


def sharded(cfg: PlaceSlice) -> bool:
    """An FSDP run over several processes (the launcher writes the resolved strategy into the workers' config)."""
    return cfg.distributed_strategy == "fsdp" and (cfg.num_gpus != "1" or cfg.num_machines > 1)


def load_kwargs(cfg: _Placed, cuda_device: int | None) -> dict[str, Any]:
    """AutoModelForCausalLM.from_pretrained(path, quantization_config=..., **...); cuda_device None = the CPU.

    The whole model goes on one GPU: device_map="auto" could spill layers to the CPU silently, which trains very
    slowly.
    """
    return {
        "dtype": dtype_name(cfg),  # was torch_dtype= in the chapter
        # FSDP places the shards itself (rank 0 reads the weights, the others receive them): no device_map
        **({} if sharded(cfg) else {"device_map": "cpu" if cuda_device is None else {"": cuda_device}}),
        "trust_remote_code": cfg.trust_remote_code,
    }


def kbit_kwargs(cfg: ModelSlice) -> dict[str, Any] | None:
    """prepare_model_for_kbit_training(model, **...), or None where the base stays in its loaded dtype (lean).

    The chapter's recipe upcasts every non-quantized parameter (embeddings, norms, lm_head) to fp32. Checkpointing
    is left to the Trainer, which enables it with sft_kwargs' settings.
    """
    if not (cfg.load_in_4bit and cfg.upcast_to_fp32):
        return None
    return {"use_gradient_checkpointing": False}


def lora_kwargs(cfg: LoraSlice, modules: list[str] | None = None,
                parameters: list[str] | None = None, exclude: str | None = None) -> dict[str, Any]:
    """peft LoraConfig(**...); `modules`: the target names resolved for the model in hand (core/model/lora_targets.py);
    `parameters`: MoE experts' 3-D weights for peft's target_parameters (lora_experts, core/levers/experts.py);
    `exclude`: peft's exclude_modules, the paths an image-text model keeps without LoRA (core/model/vision.py)."""
    return {
        **({"target_parameters": list(parameters)} if parameters else {}),
        **({"exclude_modules": exclude} if exclude else {}),
        "r": cfg.lora_r,
        "lora_alpha": cfg.lora_alpha,
        "lora_dropout": cfg.lora_dropout,
        "target_modules": list(modules if modules is not None else cfg.lora_target_modules),
        "bias": "none",
        "task_type": "CAUSAL_LM",
        # The LoRA variants, as peft's own options: DoRA, rsLoRA's alpha / sqrt(r), PiSSA/OLoRA/gaussian starts
        "use_dora": cfg.use_dora,
        "use_rslora": cfg.use_rslora,
        "init_lora_weights": True if cfg.lora_init == "default" else cfg.lora_init,
    }


def sft_kwargs(cfg: _Steps, output_dir: str | Path, cuda: bool, console: bool = True) -> dict[str, Any]:
    """TRL SFTConfig(**installed_names(..., SFTConfig)): the chapter's TrainingArguments + SFTTrainer arguments.

    Checkpointing is named gradient_checkpointing here, for every transformers version; installed_names renames it
    for the installed one.
    """
    kwargs: dict[str, Any] = {
        "output_dir": str(output_dir),
        "num_train_epochs": cfg.num_train_epochs,
        "max_steps": cfg.max_steps,
        "per_device_train_batch_size": cfg.per_device_train_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "learning_rate": cfg.learning_rate,
        "lr_scheduler_type": cfg.lr_scheduler_type,
        "warmup_steps": cfg.warmup_steps,
        "weight_decay": cfg.weight_decay,
        "max_grad_norm": cfg.max_grad_norm,
        "optim": cfg.optim,
        "bf16": cfg.precision == "bf16",
        "fp16": cfg.precision == "fp16",
        "gradient_checkpointing": cfg.gradient_checkpointing,
        # Non-reentrant: works with frozen inputs and is what PyTorch recommends; same memory as reentrant.
        **({"gradient_checkpointing_kwargs": {"use_reentrant": False}} if cfg.gradient_checkpointing else {}),
        "max_length": cfg.max_length,  # was SFTTrainer(max_seq_length=...) in the chapter
        "packing": cfg.packing,
        # Compiled layers (compile_layers) and liger's in-layer Triton kernels do not mix: dynamo cannot trace
        # liger's autograd functions (torch 2.11, liger 0.8.5: an AssertionError at the first RMSNorm;
        # bench/RESULTS.md, section "Regional compile"), and inductor fuses the norms, RoPE and the gated MLP itself.
        # TRL's own fused LM head (the loss without the full logits) is applied either way, so liger is not asked for.
        "use_liger_kernel": cfg.use_liger_kernel and cfg.compile_layers != "on",
        # TRL's own offloading (saved-tensor hooks around each training step); it needs an accelerator device
        "activation_offloading": cfg.offload_activations and cuda,
        "logging_steps": cfg.logging_steps,
        "save_strategy": cfg.save_strategy,
        "save_steps": cfg.save_steps,
        "save_only_model": False,  # optimizer state is needed to resume exactly
        "seed": cfg.seed,
        "data_seed": cfg.seed,
        "use_cpu": not cuda,
        "report_to": "none",  # no wandb/tensorboard surprises
        "disable_tqdm": not console,
        "include_num_input_tokens_seen": "non_padding",  # trained-token counts for tokens/s
        "dataloader_num_workers": 0,
    }
    if cfg.packing:
        # Best-fit-decreasing packing implies padding-free batches with per-row position ids (no cross-row attention).
        kwargs["packing_strategy"] = "bfd"
        if cfg.compile_layers == "on":  # auto is settled to on/off before the trainer is built
            # Inductor guards on a micro-batch's length being a multiple of 8 and compiled again for each new
            # residue (each a compile of its own: bench/RESULTS.md, section "Regional compile"); padded to 8, one graph
            # serves all.
            # The padding is one-token rows of their own (position 0, label -100): nothing trains on it.
            kwargs["pad_to_multiple_of"] = 8
    return kwargs


def vision_kwargs() -> dict[str, Any]:
    """What SFTConfig gets on top of sft_kwargs for image rows: TRL's vision collator trains the assistant's turns
    only (its training chat template's generation marks), and rows are never packed (TRL refuses packing there)."""
    # remove_unused_columns off: the rows are opened by the dataset's transform, from a column the collator never reads
    return {"assistant_only_loss": True, "packing": False, "padding_free": False, "remove_unused_columns": False}


def eval_kwargs(cfg: _Evaluated) -> dict[str, Any]:
    """What SFTConfig gets on top of sft_kwargs when there are validation rows (the engine adds them with its
    eval_dataset): the Trainer's own eval, once before training (the baseline) and every eval_steps (a share of the
    run below 1); core.train.callbacks adds the one at the end. Same micro-batch as training and loss only (no logits kept
    across batches): an eval needs no memory beyond the training step's."""
    kwargs: dict[str, Any] = {
        "eval_strategy": "steps",
        "eval_steps": cfg.eval_steps if cfg.eval_steps < 1 else int(cfg.eval_steps),
        "eval_on_start": not cfg.resume_from,  # a resumed run's baseline is in its checkpoint's log history
        "per_device_eval_batch_size": cfg.per_device_train_batch_size,
        "prediction_loss_only": True,
        "metric_for_best_model": "eval_loss",  # the Trainer tracks the best eval (state.best_metric) for both levers
        "greater_is_better": False,
    }
    if cfg.early_stopping_patience:
        kwargs["restore_callback_states_from_checkpoint"] = True  # a resumed run keeps its count of evals without gain
    if cfg.keep_best:
        # "best": a checkpoint at each new best eval loss, the one loaded back at the end (any save_strategy would
        # have to match the eval steps)
        kwargs.update(load_best_model_at_end=True, save_strategy="best")
    return kwargs


def tracking_kwargs(cfg: TrainerSlice, run_dir: str | Path | None) -> dict[str, Any]:
    """report_to for the optional tracker; TensorBoard writes into RUN/tensorboard (logging_dir where the installed
    transformers still has it; core.train.recipe sets TENSORBOARD_LOGGING_DIR for the newer ones)."""
    if cfg.tracking == "none":
        return {}
    out: dict[str, Any] = {"report_to": [cfg.tracking]}
    if cfg.tracking == "tensorboard" and run_dir is not None:
        out["logging_dir"] = str(Path(run_dir) / "tensorboard")
    return out


def trainer_config(config_class: type, cfg: _Trained, output_dir: str | Path, cuda: bool, console: bool = False,
                   evaluate: bool = False, run_dir: str | Path | None = None, **extra: Any):
    """Every stage's TRL config (SFTConfig, DPOConfig ...): sft_kwargs, the eval's with validation rows, the
    tracker's and the stage's own `extra`, in the names the installed `config_class` knows (what it lacks, e.g. a
    preference config's packing, is left out)."""
    kwargs = sft_kwargs(cfg, output_dir, cuda, console)
    if evaluate:
        kwargs.update(eval_kwargs(cfg))
    kwargs.update(tracking_kwargs(cfg, run_dir))
    kwargs.update(extra)
    return config_class(**installed_names(kwargs, config_class))


def installed_names(kwargs: dict[str, Any], config_class: type) -> dict[str, Any]:
    """`kwargs` in the names the installed `config_class` (a dataclass such as SFTConfig) knows.

    transformers 5.2x renamed gradient_checkpointing(_kwargs) to activation_checkpointing(_kwargs) and warns at the
    old names; older versions know only those. Arguments the installed version lacks are left out.
    """
    import dataclasses

    known = {f.name for f in dataclasses.fields(config_class)}
    out = {}
    for name, value in kwargs.items():
        new = name.replace("gradient_checkpointing", "activation_checkpointing")
        if new in known:
            out[new] = value
        elif name in known:
            out[name] = value
    return out
