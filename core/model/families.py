"""README's support matrix as data: the model types memtune's tests and GPU runs verify (tests/test_families.py).

A model outside it still trains on the generic path (LoRA targets resolved from its own module tree, attention as
transformers runs it, or memtune's varlen path where it can express the model), with one log line saying it is not
verified. What cannot work is refused by name: a model that is not a causal LM (core/model/load.py lora_targets).
"""

from __future__ import annotations

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
