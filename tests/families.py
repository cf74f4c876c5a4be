"""Tiny models of the families in README's support matrix, for CPU tests (a shared helper, not fixtures).

Each config is the family's real config.json scaled down: the same model_type, head ratio (query heads per key/value
head), head_dim relative to hidden, q/k norms, biases, fused projections, soft-caps, sliding window (shorter than a
test row, so it engages), query_pre_attn_scalar (different from head_dim where the real model's is), RoPE variant,
tie_word_embeddings and layer pattern; the vocabulary is the demo tokenizer's (512), so every family trains on the
demo data with the demo tokenizer. Weights are random with a fixed seed: `build(name, folder)` writes the same model
on every machine.

Real values (config.json on the Hub) next to each entry: hidden / heads / kv heads / head_dim.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

VOCAB = 512  # the demo tokenizer's
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 500000.0}
COMMON = dict(vocab_size=VOCAB, max_position_embeddings=256, num_hidden_layers=2, initializer_range=0.02,
              bos_token_id=0, eos_token_id=1, pad_token_id=2)  # the demo tokenizer's

FAMILIES: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-3.1-8B: 4096 / 32 / 8 / 128, untied, llama3 RoPE
    "llama3": dict(model_type="llama", hidden_size=64, intermediate_size=224, num_attention_heads=8,
                   num_key_value_heads=2, head_dim=8, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False),
    # meta-llama/Llama-3.2-1B: 2048 / 32 / 8 / 64, tied embeddings
    "llama3-tied": dict(model_type="llama", hidden_size=64, intermediate_size=256, num_attention_heads=8,
                        num_key_value_heads=2, head_dim=8, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=True),
    # mistralai/Mistral-7B-v0.1: 4096 / 32 / 8 / 128, sliding_window 4096 (v0.3: null)
    "mistral": dict(model_type="mistral", hidden_size=64, intermediate_size=224, num_attention_heads=8,
                    num_key_value_heads=2, head_dim=8, sliding_window=8, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # Qwen/Qwen2.5-7B: 3584 / 28 / 4 / 128, q/k/v biases, no sliding window in use
    "qwen2.5": dict(model_type="qwen2", hidden_size=56, intermediate_size=296, num_attention_heads=7,
                    num_key_value_heads=1, head_dim=8, use_sliding_window=False, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    # Qwen/Qwen3-8B: 4096 / 32 / 8 / 128, q/k RMSNorm, no biases
    "qwen3": dict(model_type="qwen3", hidden_size=64, intermediate_size=192, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=8, use_sliding_window=False, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    # google/gemma-2-9b: 3584 / 16 / 8 / 256, attn softcap 50, final softcap 30, sliding 4096 every other layer,
    # query_pre_attn_scalar 256 (gemma-2-27b: 144 with head_dim 128, i.e. not head_dim), tied
    "gemma2": dict(model_type="gemma2", hidden_size=64, intermediate_size=256, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=18, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, sliding_window=8, hidden_activation="gelu_pytorch_tanh",
                   tie_word_embeddings=True),
    # google/gemma-3-1b-pt (gemma3_text): 1152 / 4 / 1 / 256, sliding 512 on 5 of 6 layers, no softcap,
    # query_pre_attn_scalar 256 (27B: 168), local RoPE 10k / global 1M
    "gemma3": dict(model_type="gemma3_text", hidden_size=48, intermediate_size=192, num_attention_heads=4,
                   num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=10, sliding_window=8,
                   layer_types=["sliding_attention", "full_attention"], hidden_activation="gelu_pytorch_tanh",
                   tie_word_embeddings=True),
    # microsoft/Phi-3-mini-4k-instruct: 3072 / 32 / 32 / 96, fused qkv_proj and gate_up_proj, sliding_window 2047
    "phi3": dict(model_type="phi3", hidden_size=64, intermediate_size=192, num_attention_heads=4,
                 num_key_value_heads=4, sliding_window=8, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # microsoft/Phi-4-mini-instruct: 3072 / 24 / 8 / 128, partial rotary 0.75, tied, no sliding window
    "phi4-mini": dict(model_type="phi3", hidden_size=48, intermediate_size=128, num_attention_heads=6,
                      num_key_value_heads=2, partial_rotary_factor=0.75, sliding_window=None,
                      tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # HuggingFaceTB/SmolLM2-135M (llama): 576 / 9 / 3 / 64, tied
    "smollm2": dict(model_type="llama", hidden_size=48, intermediate_size=128, num_attention_heads=6,
                    num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    # HuggingFaceTB/SmolLM3-3B: 2048 / 16 / 4 / 128, no RoPE on every 4th layer, tied
    "smollm3": dict(model_type="smollm3", hidden_size=64, intermediate_size=192, num_attention_heads=8,
                    num_key_value_heads=2, no_rope_layer_interval=2, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 2000000.0}),
}
NAMES = tuple(FAMILIES)


def hf_config(name: str, attn: str = "eager"):
    from transformers import AutoConfig

    values = {**COMMON, **FAMILIES[name]}
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    config._attn_implementation = attn
    return config


def model(name: str, seed: int = 0, dtype=None, attn: str = "eager"):
    """The family's tiny model with random weights drawn from `seed` (fp32 unless `dtype`), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(hf_config(name, attn), attn_implementation=attn)
    if dtype is not None:
        m = m.to(dtype)
    return m.eval()


def build(name: str, folder: Path, seed: int = 0) -> Path:
    """Save the family's tiny model (bf16 weights) and the demo tokenizer into `folder`, like a Hub download."""
    import torch

    from core.demo import ensure_demo_model

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    m = model(name, seed)
    m.config.use_cache = False
    m.to(torch.bfloat16).save_pretrained(folder)
    demo = ensure_demo_model()
    for f in demo.iterdir():
        if "token" in f.name or f.name == "chat_template.jinja":
            shutil.copy(f, folder / f.name)
    return folder
