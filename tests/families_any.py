"""Tiny models of families outside README's support matrix (tests/test_any_model.py), for CPU tests.

Each entry is the family's real config.json scaled down (model_type, head layout, fused or MLA projections,
soft-caps, sinks, alibi, recurrent/conv/state-space mixers, MoE routing), with the demo tokenizer's 512-token
vocabulary. The real model each one stands for is named beside it.
"""

from __future__ import annotations

from typing import Any

VOCAB = 512
IDS = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)
ROPE = {"rope_type": "default", "rope_theta": 10000.0}

FAMILIES: dict[str, dict[str, Any]] = {
    # openai-community/gpt2: Conv1D layers, fused c_attn, learned positions
    "gpt2": dict(model_type="gpt2", n_layer=2, n_embd=32, n_head=2, n_positions=128),
    # facebook/opt-125m: learned positions with an offset, out_proj
    "opt": dict(model_type="opt", num_hidden_layers=2, hidden_size=32, ffn_dim=64, num_attention_heads=2,
                word_embed_proj_dim=32, max_position_embeddings=128),
    # bigscience/bloom-560m: alibi, fused query_key_value, dense
    "bloom": dict(model_type="bloom", n_layer=2, hidden_size=32, n_head=4),
    # tiiuae/falcon-rw-1b: alibi, fused query_key_value, dense
    "falcon-alibi": dict(model_type="falcon", num_hidden_layers=2, hidden_size=32, num_attention_heads=4, alibi=True,
                         new_decoder_architecture=False, multi_query=False, parallel_attn=False, bias=True),
    # tiiuae/falcon-7b: rotary, multi-query, parallel attention + MLP
    "falcon": dict(model_type="falcon", num_hidden_layers=2, hidden_size=32, num_attention_heads=4, alibi=False,
                   multi_query=True, parallel_attn=True),
    # EleutherAI/pythia-160m: fused query_key_value, dense, partial rotary
    "gpt_neox": dict(model_type="gpt_neox", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                     intermediate_size=64, rotary_pct=0.25, max_position_embeddings=128),
    # microsoft/phi-2: q/k/v + dense, partial rotary, parallel block
    "phi": dict(model_type="phi", num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                partial_rotary_factor=0.5, max_position_embeddings=128),
    # CohereForAI/c4ai-command-r-v01: logit_scale 0.0625, parallel block, layer norm
    "cohere": dict(model_type="cohere", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=64, logit_scale=0.0625, rope_parameters=ROPE),
    # ibm-granite/granite-3.0-2b-base: logits_scaling 8, residual/embedding/attention multipliers
    "granite": dict(model_type="granite", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=64, logits_scaling=8.0, residual_multiplier=0.22,
                    embedding_multiplier=12.0, attention_multiplier=0.015625, rope_parameters=ROPE),
    # mistralai/Mixtral-8x7B-v0.1: MoE (8 experts, top 2), sliding window off
    "mixtral": dict(model_type="mixtral", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                    rope_parameters=ROPE),
    # Qwen/Qwen1.5-MoE-A2.7B: MoE with a shared expert, q/k/v biases
    "qwen2_moe": dict(model_type="qwen2_moe", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, moe_intermediate_size=16,
                      shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                      use_sliding_window=False, rope_parameters=ROPE),
    # deepseek-ai/DeepSeek-V3: multi-head latent attention (q_a/q_b, kv_a_with_mqa/kv_b), MoE after a dense layer
    "deepseek_v3": dict(model_type="deepseek_v3", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                        num_key_value_heads=4, intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4,
                        num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
                        q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8,
                        rope_parameters=ROPE, rope_interleave=True),
    # openai/gpt-oss-20b: attention sinks, sliding window on every other layer, MoE
    "gpt_oss": dict(model_type="gpt_oss", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, intermediate_size=32, num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                    rope_parameters={"rope_type": "default", "rope_theta": 150000.0}),
    # google/recurrentgemma-2b: logits_soft_cap 30, recurrent (RG-LRU + conv) blocks and local attention
    "recurrent_gemma": dict(model_type="recurrent_gemma", num_hidden_layers=3, hidden_size=32, lru_width=32,
                            num_attention_heads=4, num_key_value_heads=1, intermediate_size=96, attention_window_size=8,
                            block_types=["recurrent", "recurrent", "attention"], logits_soft_cap=30.0,
                            conv1d_width=4),
    # LiquidAI/LFM2-350M: short-conv blocks and attention blocks (layer_types)
    "lfm2": dict(model_type="lfm2", num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=64, layer_types=["conv", "full_attention"], conv_L_cache=3, block_auto_adjust_ff_dim=False),
    # Qwen/Qwen3-Next-80B-A3B: gated delta-net (linear attention) and full attention layers, MoE
    "qwen3_next": dict(model_type="qwen3_next", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, intermediate_size=64, moe_intermediate_size=16,
                       shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                       layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                       linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4),
    # ibm-granite/granite-4.0-h-tiny: mamba2 and attention layers, MoE
    "granitemoehybrid": dict(model_type="granitemoehybrid", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=32, shared_intermediate_size=32,
                             num_local_experts=4, num_experts_per_tok=2, layer_types=["mamba", "attention"],
                             mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_expand=2,
                             mamba_chunk_size=16, position_embedding_type="rope"),
    # allenai/OLMo-2-1124-7B: q/k norms after projection, post-norms
    "olmo2": dict(model_type="olmo2", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                  num_key_value_heads=4, intermediate_size=64, rope_parameters=ROPE),
    # stabilityai/stablelm-2-1_6b: partial rotary, layer norm, q/k/v biases
    "stablelm": dict(model_type="stablelm", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                     num_key_value_heads=4, intermediate_size=64, partial_rotary_factor=0.25, use_qkv_bias=True),
    # bigcode/starcoder2-3b: sliding window, biases, c_fc/c_proj MLP
    "starcoder2": dict(model_type="starcoder2", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=64, sliding_window=8, rope_parameters=ROPE),
    # google/gemma-7b: head_dim 256 > hidden/heads, scaled embeddings, GeGLU
    "gemma": dict(model_type="gemma", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, intermediate_size=64, hidden_activation="gelu_pytorch_tanh"),
    # EleutherAI/gpt-j-6b: parallel block, rotary on part of each head, fused-free q/k/v + out_proj
    "gptj": dict(model_type="gptj", n_layer=2, n_embd=32, n_head=4, rotary_dim=4, n_positions=128),
    # THUDM/GLM-4-9B-0414 (glm4): partial rotary, fused gate_up_proj, post-norms
    "glm4": dict(model_type="glm4", num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, intermediate_size=64, partial_rotary_factor=0.5),
    # mosaicml/mpt-7b: alibi, fused Wqkv, out_proj
    "mpt": dict(model_type="mpt", n_layers=2, d_model=32, n_heads=4, max_seq_len=128,
                attn_config={"alibi": True}),
}
NAMES = tuple(FAMILIES)

# Mixture-of-experts families whose experts class is their own, not transformers' experts interface
# (core/levers/expert_store.py FAMILY; tests/test_moe_families.py). Widths of whole 64-value quantization blocks, as
# the real models' (tests/test_moe.py WHOLE_BLOCKS). Not in NAMES: their q/o projections are experts (JetMoE) and
# TRL's fused head cannot run Llama-4 (the pre-flight falls back), which NAMES' tests do not expect.
OWN_EXPERTS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-4-Scout-17B-16E (text_config): 16 experts, top-1, a shared expert, chunked attention, NoPE
    # every 4th layer, q/k norms, llama3 rope scaling
    "llama4_text": dict(model_type="llama4_text", num_hidden_layers=2, hidden_size=64, intermediate_size=64,
                        intermediate_size_mlp=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=1,
                        no_rope_layers=[1, 0], attention_chunk_size=16, use_qk_norm=True,
                        max_position_embeddings=1024,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
                                         "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                         "original_max_position_embeddings": 64}),
    # databricks/dbrx-base: 16 experts of width 10752, top-4, fused Wqkv with clip_qkv 8, experts as 2-D stacks
    "dbrx": dict(model_type="dbrx", n_layers=2, d_model=64, n_heads=4, max_seq_len=256,
                 attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 500000.0},
                 ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2,
                             "moe_normalize_expert_weights": 1.0}),
    # jetmoe/jetmoe-8b: 8 experts, top-2, in its MLP and in its attention (mixture of attention heads), kv_proj
    "jetmoe": dict(model_type="jetmoe", num_hidden_layers=2, hidden_size=64, num_key_value_heads=2, kv_channels=32,
                   intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256),
}


def hf_config(name: str, attn: str = "eager"):
    from transformers import AutoConfig

    values = {"vocab_size": VOCAB, **IDS, **(FAMILIES.get(name) or OWN_EXPERTS[name])}
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    config._attn_implementation = attn
    return config


def model(name: str, seed: int = 0, attn: str = "eager"):
    """The family's tiny model, fp32, random weights from `seed`, sharpened (x3) so a dropped feature shows."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(hf_config(name, attn), attn_implementation=attn)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.mul_(3.0)
    return m.eval()
