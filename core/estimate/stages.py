"""What a preference stage (TrainConfig.stage: dpo, orpo, kto) changes in the memory estimate.

DPO and ORPO put the chosen and the rejected sequence of each pair through the model together (TRL's collators
concatenate them: one micro-batch of 2 x per_device_train_batch_size rows), so the kept activations, the logits'
working memory and the tokens per micro-batch are those of an SFT step with twice the micro-batch at the same
length: `as_sft` gives predict.py that config and every derived figure (allocated, reserved, NVML) follows.
KTO's batch holds each completion once with a gradient (its KL completions go through without one), as SFT does.

The reference pass (DPO, KTO) runs the same model with the adapter disabled, under no_grad and before the policy's
forward: it keeps nothing for the backward pass, and its transient (one layer's tensors, a chunk of log-probs) is
below what the policy's forward and backward then hold, so it adds nothing to the peak; it costs time (one more
forward per step), not memory. No second copy of the base exists (core/train/stages.py); with init_adapter the
reference is TRL's frozen copy of the adapter, adapter-sized (megabytes), left out of the figures.

The LM head + loss (`logits_terms`): DPO's and KTO's per-token log-probs go through TRL's lean paths, so SFT's
chunked-head term stands. ORPO's does not: TRL's ORPOTrainer keeps the whole [2B, T, V] logits (fp32: accelerate
converts the model's outputs) and runs a plain cross-entropy and a log-softmax over them, whatever liger does;
core.estimate.preference measures the peak bytes that holds per (token x vocab) element on the CPU, and that
replaces the chunked head's tile. bench/RESULTS.md run 19 (H200, Llama-3.1-8B lowest_memory, 4 pairs x 512 tokens): ORPO allocated
10.42 GiB, NVML 13.06: estimated 10.69 / 12.37 (+2.5% / -5.3%; SFT's term gave 5.35 / 6.82, -48.7% / -47.8%);
DPO 5.24 / 6.80: estimated 5.35 / 6.81 (+2.0% / +0.2%), unchanged.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from core.config.slices import ModelSlice, StageSlice, TrainerSlice
from core.estimate import preference
from core.estimate.terms import LM_HEAD_TOKEN_CHUNK, LM_HEAD_VOCAB_CHUNK, QUANTIZED_HEAD_ROWS, Terms, dtypes

SEQUENCES_PER_ROW = {"sft": 1, "dpo": 2, "orpo": 2, "kto": 1}  # sequences one data row puts through the model


class _Batch(StageSlice, TrainerSlice, Protocol):
    """The stage and the micro-batch of rows it puts through the model."""


class _Head(ModelSlice, StageSlice, Protocol):
    """The stage's loss and the dtypes and head of the model it runs on."""


class _Noted(ModelSlice, StageSlice, TrainerSlice, Protocol):
    """What the stage's notes name: the stage, its reference, the micro-batch and the compute dtype."""


B = TypeVar("B", bound=_Batch)


def as_sft(cfg: B) -> B:
    """The SFT config whose training step holds the memory a step of `cfg`'s stage holds (module docstring)."""
    factor = SEQUENCES_PER_ROW.get(cfg.stage, 1)
    if factor == 1:
        return cfg
    return cfg.replace(stage="sft", per_device_train_batch_size=factor * cfg.per_device_train_batch_size)


TORCH_DTYPES = {2: "bfloat16", 4: "float32"}  # compute dtype bytes -> the measurement's dtype (fp16: bf16's sizes)


def full_logits_bytes(cfg: _Head, shape, tokens: int) -> int:
    """ORPO's LM head + loss peak that grows with the vocabulary: measured bytes per logit x tokens x vocab; 0 for
    the other stages (their log-probs never hold the whole logits)."""
    if cfg.stage != "orpo":
        return 0
    per_logit = preference.orpo_bytes_per_logit(TORCH_DTYPES.get(dtypes(cfg).c, "bfloat16"))
    return int(per_logit * tokens * shape.vocab_size)


def logits_terms(t: Terms, cfg: _Head, shape) -> None:
    """Put ORPO's whole-logits loss in `t` (terms of `as_sft(cfg)`): its measured bytes replace the chunked head's
    tile (TRL's chunked log-prob never runs under ORPOTrainer), and the layers' backward phase, counted in
    `temporaries` as what it needs beyond the logits term, shrinks to what is left beyond the new term."""
    full = full_logits_bytes(cfg, shape, t.tokens)
    if not full:
        return
    d = dtypes(cfg)
    rows = QUANTIZED_HEAD_ROWS if (cfg.load_in_4bit and cfg.quantize_output_head and shape.head_params) else \
        LM_HEAD_VOCAB_CHUNK  # the tile terms.single_gpu_terms counted
    tile = min(t.tokens, LM_HEAD_TOKEN_CHUNK) * min(shape.vocab_size, rows) * d.c
    working_peak = t.logits + t.temporaries - t.workspace  # max(layer phase, old logits term)
    t.logits = t.logits - tile + full
    t.temporaries = max(0, working_peak - t.logits) + t.workspace


def notes(cfg: _Noted) -> list[str]:
    """The estimate's words about the stage (none for sft)."""
    if cfg.stage == "sft":
        return []
    out = []
    if SEQUENCES_PER_ROW.get(cfg.stage, 1) > 1:
        out.append(f"{cfg.stage}: chosen and rejected go through together, "
                   f"{SEQUENCES_PER_ROW[cfg.stage]} x {cfg.per_device_train_batch_size} sequences per micro-batch")
    if cfg.stage == "orpo":
        out.append("orpo: TRL's ORPO loss keeps the whole logits in fp32 (cross-entropy and log-softmax over batch "
                   "x length x vocab), not a chunked head: "
                   f"{preference.orpo_bytes_per_logit(TORCH_DTYPES.get(dtypes(cfg).c, 'bfloat16')):.1f} bytes "
                   "per logit at the peak, measured")
    if cfg.stage in ("dpo", "kto"):
        out.append(f"{cfg.stage}: the reference pass ("
                   + ("init_adapter's frozen copy" if cfg.init_adapter.strip() else "adapter disabled")
                   + ", no gradient) adds time, not memory")
    return out
