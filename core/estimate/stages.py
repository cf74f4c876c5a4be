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

GRPO (`generation_bytes`, `generation_terms`): a step first samples num_generations answers per prompt with
transformers' generate, without gradients, for the whole generation batch at once (per_device_train_batch_size x
gradient_accumulation_steps sequences, TRL's default steps_per_generation), then trains on them a micro-batch at a
time. Training holds what an SFT step of the same micro-batch holds at the prompt's length (up to max_length) plus
max_completion_length: TRL 1.16 scores the completion tokens through the model's fused, chunked LM head
(`fused_lm_head=True`), so SFT's chunked-head term stands for the policy's logits of the group. Generation holds, at
its end, the KV cache of every sequence (2 x layers x key/value width x sequences x (prompt + completion) tokens in
the compute dtype) and one decoding step's logits in fp32 (and their softmax); activations of the training step are
free by then, so the step's working peak is the larger of the two. With grpo_beta > 0 the reference log-probabilities
come from the same model with the adapter disabled (or init_adapter's frozen copy, adapter-sized), under no_grad, a
micro-batch at a time: time, not memory, as DPO's. Not yet checked against a GPU's NVML figures.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from core.config.slices import DataSlice, ModelSlice, StageSlice, TrainerSlice
from core.estimate import preference
from core.estimate.terms import LM_HEAD_TOKEN_CHUNK, LM_HEAD_VOCAB_CHUNK, QUANTIZED_HEAD_ROWS, Terms, dtypes

SEQUENCES_PER_ROW = {"sft": 1, "dpo": 2, "orpo": 2, "kto": 1, "grpo": 1}  # sequences one row puts through the model
SAMPLED_LOGITS_BYTES = 8  # per vocabulary entry per sequence at a decoding step: fp32 logits and their softmax


class _Batch(DataSlice, StageSlice, TrainerSlice, Protocol):
    """The stage, the micro-batch of rows it puts through the model and their length."""


class _Generation(ModelSlice, DataSlice, StageSlice, TrainerSlice, Protocol):
    """What GRPO's sampling holds: the sequences of a generation batch, their length, the cache's dtype."""


class _Head(ModelSlice, StageSlice, Protocol):
    """The stage's loss and the dtypes and head of the model it runs on."""


class _Noted(ModelSlice, DataSlice, StageSlice, TrainerSlice, Protocol):
    """What the stage's notes name: the stage, its reference, the micro-batch and the compute dtype."""


B = TypeVar("B", bound=_Batch)


def as_sft(cfg: B) -> B:
    """The SFT config whose training step holds the memory a step of `cfg`'s stage holds (module docstring)."""
    if cfg.stage == "grpo":  # one sampled answer per sequence, after a prompt of up to max_length
        return cfg.replace(stage="sft", max_length=cfg.max_length + cfg.max_completion_length)
    factor = SEQUENCES_PER_ROW.get(cfg.stage, 1)
    if factor == 1:
        return cfg
    return cfg.replace(stage="sft", per_device_train_batch_size=factor * cfg.per_device_train_batch_size)


def generation_sequences(cfg: TrainerSlice) -> int:
    """Sequences one generate call samples: the generation batch (rows per micro-batch x accumulation), which
    holds generation_batch / num_generations prompts with num_generations answers each."""
    return cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps


def kv_cache_bytes(cfg: _Generation, shape) -> int:
    """GRPO's KV cache at the end of sampling: keys and values of every layer for every sequence of the generation
    batch over prompt (max_length) + completion (max_completion_length) tokens, in the compute dtype."""
    tokens = generation_sequences(cfg) * (cfg.max_length + cfg.max_completion_length)
    return 2 * shape.num_hidden_layers * shape.kv_dim * tokens * dtypes(cfg).c


def generation_bytes(cfg: _Generation, shape) -> int:
    """GRPO's sampling peak beyond the weights: the KV cache and one decoding step's logits (0 for other stages)."""
    if cfg.stage != "grpo":
        return 0
    return kv_cache_bytes(cfg, shape) + generation_sequences(cfg) * shape.vocab_size * SAMPLED_LOGITS_BYTES


def generation_terms(t: Terms, cfg: _Generation, shape) -> None:
    """Put GRPO's sampling in `t` (terms of `as_sft(cfg)`): the step's working memory is the larger of training's
    (activations, logits, temporaries) and sampling's, so what sampling needs beyond training's joins the
    temporaries."""
    beyond = generation_bytes(cfg, shape) - t.working
    if beyond > 0:
        t.temporaries += beyond


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
    if cfg.stage in ("dpo", "kto") or cfg.stage == "grpo" and cfg.grpo_beta > 0:
        out.append(f"{cfg.stage}: the reference pass ("
                   + ("init_adapter's frozen copy" if cfg.init_adapter.strip() else "adapter disabled")
                   + ", no gradient) adds time, not memory")
    if cfg.stage == "grpo":
        out.append(f"grpo: sampling {generation_sequences(cfg)} answers of up to {cfg.max_completion_length} tokens "
                   f"({cfg.num_generations} per prompt) after prompts of up to {cfg.max_length}: their KV cache and "
                   "a decoding step's logits, freed before the training micro-batches")
    return out
