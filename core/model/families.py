"""README's support matrix as data: the model types memtune's tests and GPU runs verify (tests/test_families.py).

A model outside it still trains on the generic path (LoRA targets resolved from its own module tree, attention as
transformers runs it, or memtune's varlen path where it can express the model), with one log line saying it is not
verified. What cannot work is refused by name: a model that is not a causal LM (core/model/load.py lora_targets).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.config.slices import DataSlice, ModelSlice, TrainerSlice
from core.messages import Said

VERIFIED = {  # config.json model_type -> the families README's matrix lists for it
    "llama": "Llama 3.x (incl. tied-embedding 1B/3B), SmolLM2",
    "mistral": "Mistral",
    "qwen2": "Qwen2.5",
    "qwen3": "Qwen3",
    "gemma2": "Gemma-2",
    "gemma3_text": "Gemma-3 (text)",
    "phi3": "Phi-3, Phi-4",
    "smollm3": "SmolLM3",
}


def note(model_type: str | None) -> Said | None:
    """One log line for a model outside the matrix (log.family_unverified); None for a verified family."""
    if not model_type or model_type in VERIFIED:
        return None
    return Said("log.family_unverified", model_type=model_type)


# --- what a model can do, read from its config.json and its module tree (built on the meta device, no weights) -----
# Layer kinds of attention in config.json's layer_types (or block_types / layers_block_type); any other kind (conv,
# linear_attention, mamba, recurrent, ...) is a sequence mixer that carries a state from token to token.
ATTENTION_KINDS = {"attention", "full_attention", "sliding_attention", "chunked_attention", "global", "local",
                   "global_attention", "local_attention", "full", "sliding", "hybrid"}
# The logit transforms TRL's fused loss head reads from the config (trl.trainer.utils.add_fused_lm_head)
FUSED_HEAD_READS = {"final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                    "logits_scaling"}
_LOGIT_TRANSFORM = re.compile(r"^(final_)?(logits?|lm_head|output)_.*(soft_?cap|scal|multiplier)")


@dataclass
class Traits:
    """What decides how a model may train, from its config and module tree: stateful mixers (packed rows would
    share their state), alibi (a position bias built from the mask), attention sinks, whether its attention runs
    through transformers' AttentionInterface, and logit transforms TRL's fused loss head does not apply."""

    model_type: str | None = None
    mixers: list[str] = field(default_factory=list)  # non-attention layer kinds or their module classes
    alibi: bool = False
    sinks: bool = False
    attention_backend: bool = True
    padding_free: bool = True  # the class declares FlashAttention support: its code reads packed rows' position ids
    checkpointing: bool = True  # the class supports gradient checkpointing (JetMoE's does not)
    unread_logit: dict[str, Any] = field(default_factory=dict)  # config name -> value the fused head would drop


def _layer_kinds(text) -> list[str]:
    for name in ("layer_types", "block_types", "layers_block_type"):
        kinds = getattr(text, name, None)
        if isinstance(kinds, (list, tuple)) and kinds and all(isinstance(k, str) for k in kinds):
            return [k for k in dict.fromkeys(kinds) if k.lower() not in ATTENTION_KINDS]
    return []


def traits(config, tree=None) -> Traits:
    """The model's Traits from its config (transformers PretrainedConfig) and, when given, its module tree."""
    import torch

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    found = Traits(model_type=getattr(text, "model_type", None))
    found.mixers = _layer_kinds(text)
    attn_config = getattr(text, "attn_config", None)
    found.alibi = bool(getattr(text, "alibi", False) or getattr(attn_config, "alibi", False)
                       or (isinstance(attn_config, dict) and attn_config.get("alibi")))
    values = text.to_dict() if hasattr(text, "to_dict") else vars(text)
    found.unread_logit = {k: v for k, v in values.items()
                          if _LOGIT_TRANSFORM.match(k) and k not in FUSED_HEAD_READS and v not in (None, 0, 1, 1.0)
                          and not isinstance(v, bool)}
    if tree is not None:
        cls = type(tree)
        found.attention_backend = bool(getattr(cls, "_supports_attention_backend", False))
        found.padding_free = bool(getattr(cls, "_supports_flash_attn", False))
        found.checkpointing = bool(getattr(cls, "supports_gradient_checkpointing", True))
        module = sys.modules.get(cls.__module__)
        if not hasattr(text, "alibi") and attn_config is None and module is not None:
            # a family whose alibi has no switch (BLOOM): its modeling code builds the alibi tensor
            found.alibi = any("alibi" in name for name in vars(module) if callable(getattr(module, name)))
        convs = {}
        for name, sub in tree.named_modules():
            if isinstance(sub, torch.nn.Conv1d) and "." in name:  # a convolution along the sequence: a mixer
                parent = tree.get_submodule(name.rsplit(".", 1)[0])
                convs[type(parent).__name__] = True
            if name.rsplit(".", 1)[-1] == "sinks" or hasattr(sub, "sinks") and isinstance(
                    getattr(sub, "sinks", None), torch.nn.Parameter):
                found.sinks = True
        if convs and not found.mixers:
            found.mixers = list(convs)
    return found


class _Packed(ModelSlice, DataSlice, TrainerSlice, Protocol):
    """What an adaptation can change: whether rows pack, the attention kernel, gradient checkpointing."""


def adaptations(cfg: _Packed, found: Traits) -> list[tuple[str, Any, Said]]:
    """The config changes this model needs to train exactly what `cfg` asks, as (field, value, why): one keyed
    reason per change (why, and what it costs). Nothing changes for a model that trains as asked."""
    out: list[tuple[str, Any, Said]] = []
    name = found.model_type or "this model"
    packing = cfg.packing
    if packing and found.mixers:
        packing = False
        out.append(("packing", False, Said("log.adapt.unpacked_mixer", model_type=name, kinds=", ".join(found.mixers))))
    elif packing and not found.padding_free:
        # no FlashAttention path: its mask code (BLOOM's alibi from the padding mask) ignores packed rows' positions
        packing = False
        out.append(("packing", False, Said("log.adapt.unpacked_mask", model_type=name)))
    if cfg.attention == "varlen" and (not packing or found.alibi or not found.attention_backend):
        out.append(("attention", "sdpa", Said("log.adapt.no_varlen", model_type=name, why=Said(
            "log.adapt.why_alibi" if found.alibi else "log.adapt.why_own_mask" if not found.attention_backend
            else "log.adapt.why_unpacked"))))
    elif packing and found.sinks and cfg.attention != "varlen":
        # transformers' own attention for sinks (eager) does not keep packed rows apart; memtune's varlen runs the
        # model's own eager attention on each packed row (exact)
        out.append(("attention", "varlen", Said("log.adapt.sinks_rows", model_type=name)))
    if cfg.gradient_checkpointing and not found.checkpointing:  # transformers refuses it for this class
        out.append(("gradient_checkpointing", False, Said("log.adapt.no_checkpointing", model_type=name)))
    return out


def said(cfg: DataSlice, field_name: str, why: Said) -> bool:
    """Whether the run log says this adaptation: varlen falling back to sdpa where packing was never asked for
    (a preference stage, a custom mix) loses nothing the user asked for, and goes unsaid."""
    return cfg.packing or field_name != "attention" or why.key != "log.adapt.no_varlen"


def adapt(cfg: _Packed, found: Traits) -> tuple[dict[str, Any], list[Said]]:
    """`adaptations` as the changes (field -> value) and the lines the run log says."""
    found_changes = adaptations(cfg, found)
    return ({name: value for name, value, _ in found_changes},
            [why for name, _, why in found_changes if said(cfg, name, why)])
