"""What a preference stage (TrainConfig.stage: dpo, orpo, kto) changes in the memory estimate (issue 44).

DPO and ORPO put the chosen and the rejected sequence of each pair through the model together (TRL's collators
concatenate them: one micro-batch of 2 x per_device_train_batch_size rows), so the kept activations, the logits'
working memory and the tokens per micro-batch are those of an SFT step with twice the micro-batch at the same
length: `as_sft` gives predict.py that config and every derived figure (allocated, reserved, NVML) follows.
KTO's batch holds each completion once with a gradient (its KL completions go through without one), as SFT does.

The reference pass (DPO, KTO) runs the same model with the adapter disabled, under no_grad and before the policy's
forward: it keeps nothing for the backward pass, and its transient (one layer's tensors, a chunk of log-probs) is
below what the policy's forward and backward then hold, so it adds nothing to the peak; it costs time (one more
forward per step), not memory. No second copy of the base exists (core/train/stages.py); with init_adapter the
reference is TRL's frozen copy of the adapter, adapter-sized (megabytes), left out of the figures. Not yet checked
against NVML on a GPU.
"""

from __future__ import annotations

from core.config.settings import TrainConfig

SEQUENCES_PER_ROW = {"sft": 1, "dpo": 2, "orpo": 2, "kto": 1}  # sequences one data row puts through the model


def as_sft(cfg: TrainConfig) -> TrainConfig:
    """The SFT config whose training step holds the memory a step of `cfg`'s stage holds (module docstring)."""
    factor = SEQUENCES_PER_ROW.get(cfg.stage, 1)
    if factor == 1:
        return cfg
    return cfg.replace(stage="sft", per_device_train_batch_size=factor * cfg.per_device_train_batch_size)


def notes(cfg: TrainConfig) -> list[str]:
    """The estimate's words about the stage (none for sft)."""
    if cfg.stage == "sft":
        return []
    out = []
    if SEQUENCES_PER_ROW.get(cfg.stage, 1) > 1:
        out.append(f"{cfg.stage}: chosen and rejected go through together, "
                   f"{SEQUENCES_PER_ROW[cfg.stage]} x {cfg.per_device_train_batch_size} sequences per micro-batch")
    if cfg.stage in ("dpo", "kto"):
        out.append(f"{cfg.stage}: the reference pass ("
                   + ("init_adapter's frozen copy" if cfg.init_adapter.strip() else "adapter disabled")
                   + ", no gradient) adds time, not memory")
    return out
