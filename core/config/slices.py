"""Typed slices of the one configuration: what each part of memtune may read.

`TrainConfig` stays one flat object for the people who write it (the page, `--set name=value`, YAML, Show code).
The code that reads it takes a slice instead: a Protocol naming the fields that part depends on, so a loader cannot
quietly start depending on the learning rate, and a reader sees at a glance what a function uses. Every TrainConfig
(and the run `resolve` decides, `ResolvedRun.cfg`) satisfies every slice, so callers pass the config they hold.

The six base slices split the fields between them, each field in exactly one (tests/test_slices.py checks that,
the types against TrainConfig's, and that each function reads only the fields of the slice it declares, passing its
slice on only to functions that need no more). A function needing two parts declares a slice made of both
(`class _Both(ModelSlice, LoraSlice, Protocol)`), with no fields of its own. Only the code that handles the whole
config (defining and checking it, resolving the run, showing it as a script, mapping the page's widgets, queueing a
the recipe's entry) takes `TrainConfig`; the job manager takes `Queued`, which writes the whole config as text.
"""

from __future__ import annotations

from typing import Any, Protocol, Self


class Slice(Protocol):
    def replace(self, **changes: Any) -> Self:
        """The same config with `changes` (fields of the caller's slice only: the test checks)."""


class ModelSlice(Slice, Protocol):
    """Which model loads, and how: the weights, their precision and quantization, the kernels and the device."""

    model: str
    trust_remote_code: bool
    load_in_4bit: bool
    bnb_4bit_quant_type: str
    bnb_4bit_use_double_quant: bool
    precision: str
    upcast_to_fp32: bool
    offload_embeddings: bool
    stream_layers: bool
    quantize_output_head: bool
    expandable_segments: bool
    attention: str
    compile_layers: str
    small_cublas_workspace: bool
    device: str
    kernel_warmup: str


class LoraSlice(Slice, Protocol):
    """The adapter that trains: its shape, the layers it reaches and how it starts."""

    lora_r: int
    lora_alpha: int
    lora_dropout: float
    lora_target_modules: list[str]
    lora_experts: bool
    lora_vision: bool
    use_dora: bool
    use_rslora: bool
    lora_init: str
    loraplus_lr_ratio: float


class DataSlice(Slice, Protocol):
    """The rows: where they come from, their format, their length, packing and the held-out part."""

    dataset: str
    dataset_split: str
    dataset_format: str
    max_length: int
    image_max_pixels: int
    long_prompts: str
    train_turns: str
    packing: bool
    validation_share: float
    validation_data: str
    validation_split: str


class StageSlice(Slice, Protocol):
    """What the run optimizes: supervised, a preference objective or GRPO's rewards and sampling, and the adapter it
    starts from."""

    stage: str
    beta: float
    dpo_loss_type: str
    init_adapter: str
    grpo_rewards: str
    grpo_reward_options: str
    num_generations: int
    max_completion_length: int
    temperature: float
    grpo_beta: float


class TrainerSlice(Slice, Protocol):
    """The optimizer loop: batch, steps, schedule, optimizer, memory levers of the step, evaluation and saving."""

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    num_train_epochs: float
    max_steps: int
    learning_rate: float
    lr_scheduler_type: str
    warmup_steps: int
    weight_decay: float
    max_grad_norm: float
    optim: str
    gradient_checkpointing: bool
    use_liger_kernel: bool
    offload_activations: bool
    seed: int
    logging_steps: int
    eval_steps: float
    eval_samples: int
    eval_max_new_tokens: int
    heldout_scorer: str
    heldout_options: str
    heldout_rows: int
    keep_best: bool
    early_stopping_patience: int
    tracking: str
    save_strategy: str
    save_steps: int

    @property
    def effective_batch_size(self) -> int: ...


class PlaceSlice(Slice, Protocol):
    """Where the run lives and on how many processes: its folder, its name, resume, GPUs and machines."""

    output_dir: str
    run_name: str
    resume_from: str
    num_gpus: str
    distributed_strategy: str
    num_machines: int
    machine_rank: int
    main_process_ip: str
    main_process_port: int


BASE_SLICES = (ModelSlice, LoraSlice, DataSlice, StageSlice, TrainerSlice, PlaceSlice)


class Loading(ModelSlice, LoraSlice, Protocol):
    """Loading the model with its adapter: the weights and the LoRA that wraps them."""


class Queued(ModelSlice, DataSlice, PlaceSlice, TrainerSlice, Protocol):
    """A run handed to the job manager: the names its folder and messages use, its planned steps (the queue's view),
    and its whole text, which the child reads back and resolves; the manager decides nothing from the rest."""

    def to_yaml(self) -> str: ...


class Training(ModelSlice, LoraSlice, DataSlice, StageSlice, TrainerSlice, Protocol):
    """Everything that decides the step's work and memory (the estimator's input), but not where the run lives."""
