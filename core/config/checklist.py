"""The chapter's memory checklist, as data the UI renders and the engine maps onto TrainConfig.

Seven items, in the chapter's order. Each knows whether a config has it on (`is_on`) and how to switch it
(`turn_on` / `turn_off`), so ticking a box changes the config and a loaded config ticks the right boxes.
The trade-off texts say what an item does and carry no figures: what it saves is the estimate at the user's settings,
and what it costs in speed is the measurement printed beside it (assets/lever_facts.json, from bench/RESULTS.md).
An item's fields are levers (core/config/settings.py `Lever`): its library call, estimator term and measured
section are its first field's (core.config.levers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, TypeVar

from core.config.settings import OPTIMIZERS
from core.config.slices import DataSlice, ModelSlice, TrainerSlice

LONG_MAX_LENGTH = 2048  # what "not shortened" means when the box is unticked
SHORT_MAX_LENGTH = 512  # the chapter's value
LARGE_BATCH = 8  # what "not small" means when the box is unticked


class _Levers(ModelSlice, DataSlice, TrainerSlice, Protocol):
    """What the items switch: quantization and precision, the rows' length, batch, accumulation and optimizer."""


L = TypeVar("L", bound=_Levers)
T = TypeVar("T", bound=TrainerSlice)


@dataclass(frozen=True)
class ChecklistItem:
    key: str
    label: str  # the chapter's wording
    tradeoff: str  # what it saves and what it costs, briefly
    fields: tuple[str, ...]  # the config fields it governs
    is_on: Callable[[_Levers], bool]
    turn_on: Callable[[_Levers], _Levers]
    turn_off: Callable[[_Levers], _Levers]
    switch: str = ""  # the one boolean field the item's box is, if it is one (its widget then sits in Advanced)


def _keep_effective_batch(cfg: T, batch: int) -> T:
    """Change the micro-batch while keeping batch x accumulation (rounded up) the same."""
    effective = cfg.effective_batch_size
    return cfg.replace(per_device_train_batch_size=batch, gradient_accumulation_steps=max(1, -(-effective // batch)))


def _accumulate(cfg: T) -> T:
    if cfg.gradient_accumulation_steps > 1:
        return cfg
    # The chapter's pattern: micro-batch 1, accumulated up to the effective batch (16 when there was none).
    effective = cfg.effective_batch_size if cfg.effective_batch_size > 1 else 16
    return cfg.replace(per_device_train_batch_size=1, gradient_accumulation_steps=effective)


def _switch(key: str, label: str, tradeoff: str, name: str) -> ChecklistItem:
    """An item that is one boolean config field: on is True, off is False."""
    return ChecklistItem(key, label, tradeoff, (name,), lambda c: getattr(c, name),
                         lambda c: c.replace(**{name: True}), lambda c: c.replace(**{name: False}), switch=name)


ITEMS: tuple[ChecklistItem, ...] = (
    _switch(
        "qlora", "Use QLoRA (4-bit quantization)",
        "Stores the frozen base weights in 4-bit NF4: ~4x less weight memory (an 8B model: ~15 GiB -> ~5.4 GiB "
        "with bf16 embeddings). Costs dequantization work every step and a little accuracy.",
        "load_in_4bit",
    ),
    _switch(
        "gradient_checkpointing", "Enable gradient checkpointing",
        "Recomputes each layer's activations in the backward pass instead of storing them. Saves activation "
        "memory that grows with batch x length (the estimate beside this box says how much at your settings); "
        "costs a second forward pass of each layer (the measured speed below says how much).",
        "gradient_checkpointing",
    ),
    ChecklistItem(
        "gradient_accumulation", "Use gradient accumulation",
        "Sums gradients over several small micro-batches before each update, so a large effective batch needs "
        "only one micro-batch of activations. Costs nothing in memory; small micro-batches use the GPU poorly.",
        ("gradient_accumulation_steps", "per_device_train_batch_size"),
        lambda c: c.gradient_accumulation_steps > 1,
        _accumulate,
        lambda c: c.replace(per_device_train_batch_size=c.effective_batch_size, gradient_accumulation_steps=1),
    ),
    ChecklistItem(
        "efficient_optimizer", "Use an 8-bit or paged optimizer",
        "Keeps Adam's two moments in 8 bits (and pages them to CPU RAM under pressure): 2 bytes per trainable "
        "parameter instead of 8. With LoRA the trainable set is small, so the saving is tens of MiB, not GiB.",
        ("optim",),
        lambda c: OPTIMIZERS.get(c.optim, (False, False, False))[1] or OPTIMIZERS.get(c.optim, (False,) * 3)[2],
        lambda c: c if OPTIMIZERS.get(c.optim, (False,) * 3)[0] else c.replace(optim="paged_adamw_8bit"),
        lambda c: c.replace(optim="adamw_torch"),
    ),
    ChecklistItem(
        "bf16", "Use bfloat16 precision",
        "Computes in 16-bit brain-float: half the activation memory of fp32 and fast tensor cores, with fp32's "
        "range (no loss scaling). Needs an Ampere-or-newer GPU; older GPUs use fp16.",
        ("precision",),
        lambda c: c.precision == "bf16",
        lambda c: c.replace(precision="bf16"),
        lambda c: c.replace(precision="fp32"),
    ),
    ChecklistItem(
        "short_max_length", "Reduce max_seq_length if possible",
        f"Caps each row at max length, the field beside this box (ticking it sets the chapter's {SHORT_MAX_LENGTH} "
        "if yours is longer): activations and logits grow linearly with length. Rows longer than the cap are "
        "truncated, so check the token-length histogram first.",
        ("max_length",),
        lambda c: c.max_length <= SHORT_MAX_LENGTH,
        lambda c: c.replace(max_length=min(c.max_length, SHORT_MAX_LENGTH)),
        lambda c: c.replace(max_length=max(c.max_length, LONG_MAX_LENGTH)),
    ),
    ChecklistItem(
        "small_batches", "Use smaller batches",
        "One row per micro-batch: the least activation memory. Accumulation keeps the effective batch. Costs "
        "speed: each micro-step has a fixed overhead, so batch 1 uses a large GPU poorly.",
        ("per_device_train_batch_size", "gradient_accumulation_steps"),
        lambda c: c.per_device_train_batch_size == 1,
        lambda c: _keep_effective_batch(c, 1),
        lambda c: c if c.per_device_train_batch_size > 1 else _keep_effective_batch(c, LARGE_BATCH),
    ),
)

BY_KEY = {item.key: item for item in ITEMS}


def active(cfg: _Levers) -> dict[str, bool]:
    """Which checklist items this config has on, in the chapter's order."""
    return {item.key: bool(item.is_on(cfg)) for item in ITEMS}


def toggle(cfg: L, key: str, on: bool) -> L:
    item = BY_KEY[key]
    return item.turn_on(cfg) if on else item.turn_off(cfg)


def missing(cfg: _Levers) -> list[ChecklistItem]:
    """Items that are off: what an out-of-memory message suggests first."""
    return [item for item in ITEMS if not item.is_on(cfg)]
