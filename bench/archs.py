"""Architecture configs of the models the benchmark builds (values from each model's config.json on the Hub).

Memory and speed depend on these shapes, not on the weights' values, so the benchmark builds each model with
random weights. `tiny-llama` exists for dry runs on a CPU.
"""

from __future__ import annotations

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
# What Llama 3.1's sizes share (vocabulary, GQA with 8 KV heads of 128, RoPE scaling, token ids); each adds its widths.
LLAMA31 = dict(
    model_type="llama", vocab_size=128256, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
    rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, hidden_act="silu", attention_bias=False,
    mlp_bias=False, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001, initializer_range=0.02,
    torch_dtype="bfloat16",
)

# The Hub model each architecture is (a run's TrainConfig names it; its estimate reads the shape by this id)
HUB_IDS = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B", "qwen2.5-14b": "Qwen/Qwen2.5-14B",
           "qwen2.5-32b": "Qwen/Qwen2.5-32B",
           "gemma-2-9b": "google/gemma-2-9b", "phi-3-mini": "microsoft/Phi-3-mini-4k-instruct",
           "qwen3-8b": "Qwen/Qwen3-8B", "llama-3.2-3b": "meta-llama/Llama-3.2-3B",
           "llama-2-7b": "meta-llama/Llama-2-7b-hf",
           "llama-3.1-70b": "meta-llama/Llama-3.1-70B", "tiny-llama": "bench/tiny-llama",
           "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b-12l": "Qwen/Qwen3-30B-A3B",
           "qwen3-30b-a3b-24l": "Qwen/Qwen3-30B-A3B", "gpt-oss-20b": "openai/gpt-oss-20b",
           "qwen2.5-1.5b-instruct": "Qwen/Qwen2.5-1.5B-Instruct"}

QWEN25_14B = dict(
    model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
    num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
    rope_theta=1000000.0, hidden_act="silu", tie_word_embeddings=False, use_sliding_window=False,
    sliding_window=131072, max_window_layers=48, bos_token_id=151643, eos_token_id=151643,
    initializer_range=0.02, torch_dtype="bfloat16",
)

ARCHS: dict[str, dict] = {
    # meta-llama/Llama-3.1-8B
    "llama-3.1-8b": dict(LLAMA31, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32),
    # meta-llama/Llama-3.2-3B (tied embeddings: the head is the input embedding)
    "llama-3.2-3b": dict(LLAMA31, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                         num_attention_heads=24, tie_word_embeddings=True,
                         rope_scaling=dict(LLAMA3_ROPE, factor=32.0)),
    # meta-llama/Llama-2-7b-hf (the chapter's "7B": 32k vocabulary, no GQA)
    "llama-2-7b": dict(
        model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_theta=10000.0, hidden_act="silu", attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, initializer_range=0.02, torch_dtype="float16",
    ),
    # Qwen/Qwen2.5-14B (q/k/v carry biases)
    "qwen2.5-14b": QWEN25_14B,
    # Qwen/Qwen2.5-32B (the 14B's widths and vocabulary; 64 layers, MLP 27648)
    "qwen2.5-32b": dict(QWEN25_14B, intermediate_size=27648, num_hidden_layers=64, max_window_layers=64),
    # Qwen/Qwen2.5-1.5B-Instruct (GRPO on a 6 GiB card: 2 KV heads of 128, tied embeddings, q/k/v biases)
    "qwen2.5-1.5b-instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, hidden_act="silu", tie_word_embeddings=True, use_sliding_window=False,
        sliding_window=32768, max_window_layers=21, bos_token_id=151643, eos_token_id=151645,
        initializer_range=0.02, torch_dtype="bfloat16",
    ),
    # meta-llama/Llama-3.1-70B
    "llama-3.1-70b": dict(LLAMA31, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64),
    # issue 20's families (config.json on the Hub), for bench/families_gpu.py
    "gemma-2-9b": dict(
        model_type="gemma2", vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=4096, max_position_embeddings=8192,
        hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0, torch_dtype="bfloat16"),
    "phi-3-mini": dict(
        model_type="phi3", vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, sliding_window=2047,
        rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False, bos_token_id=1,
        eos_token_id=32000, pad_token_id=32000, torch_dtype="bfloat16"),
    "qwen3-8b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, hidden_act="silu", tie_word_embeddings=False,
        use_sliding_window=False, bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16"),
    # Qwen/Qwen3-30B-A3B (issue 40): 128 experts of width 768 in every layer, 8 routed per token
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        output_router_logits=False, router_aux_loss_coef=0.001, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_theta=1000000.0, hidden_act="silu", tie_word_embeddings=False, use_sliding_window=False,
        bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16"),
    # openai/gpt-oss-20b (bf16 experts here; the Hub's checkpoint is MXFP4): 32 experts, 4 routed, attention sinks,
    # a 128-token window on every other layer
    "gpt-oss-20b": dict(
        model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
        experts_per_token=4, sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 12,
        rope_theta=150000.0, rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                           "truncate": False, "original_max_position_embeddings": 4096},
        max_position_embeddings=131072, initial_context_length=4096, rms_norm_eps=1e-5, attention_bias=True,
        swiglu_limit=7.0, router_aux_loss_coef=0.9, output_router_logits=False, tie_word_embeddings=False,
        eos_token_id=200002, pad_token_id=199999, torch_dtype="bfloat16"),
    # CPU dry runs only
    "tiny-llama": dict(
        model_type="llama", vocab_size=9000, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu", attention_bias=False, mlp_bias=False,
        tie_word_embeddings=False, bos_token_id=8000, eos_token_id=8001, initializer_range=0.02,
        torch_dtype="bfloat16",
    ),
}


# a CPU dry run of the MoE rows (bench.product --plan moesmoke --arch tiny-qwen3-moe)
ARCHS["tiny-qwen3-moe"] = dict(ARCHS["qwen3-30b-a3b"], vocab_size=9000, hidden_size=64, intermediate_size=96,
                               moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                               bos_token_id=8000, eos_token_id=8001)
HUB_IDS["tiny-qwen3-moe"] = "bench/tiny-qwen3-moe"
# the same shapes with fewer decoder layers (the estimator checked at two depths; a bf16 folder that fits the disk)
ARCHS["qwen3-30b-a3b-12l"] = dict(ARCHS["qwen3-30b-a3b"], num_hidden_layers=12)
ARCHS["qwen3-30b-a3b-24l"] = dict(ARCHS["qwen3-30b-a3b"], num_hidden_layers=24)
# meta-llama/Llama-4-Scout-17B-16E's text model (config.json's text_config: 16 experts of width 8192, top-1, a shared
# expert of 16384, chunked attention, q/k norms, NoPE every 4th layer), cut to 4 of its 48 layers (each layer's
# experts ~1 GiB in NF4); values that do not change memory are the family's defaults
ARCHS["llama4-scout-text-4l"] = dict(
    model_type="llama4_text", vocab_size=202048, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
    num_hidden_layers=4, num_attention_heads=40, num_key_value_heads=8, head_dim=128, num_local_experts=16,
    num_experts_per_tok=1, interleave_moe_layer_step=1, no_rope_layers=[1, 1, 1, 0], attention_chunk_size=8192,
    use_qk_norm=True, max_position_embeddings=10485760, rms_norm_eps=1e-5, hidden_act="silu",
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "high_freq_factor": 4.0,
                     "low_freq_factor": 1.0, "original_max_position_embeddings": 8192},
    tie_word_embeddings=False, bos_token_id=200000, eos_token_id=200008, pad_token_id=200018, torch_dtype="bfloat16")
# a CPU dry run of those rows (bench.product --plan moe9smoke)
ARCHS["tiny-llama4-text"] = dict(ARCHS["llama4-scout-text-4l"], vocab_size=9000, hidden_size=64, intermediate_size=64,
                                 intermediate_size_mlp=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16, num_local_experts=4, no_rope_layers=[1, 0],
                                 bos_token_id=8000, eos_token_id=8001, pad_token_id=8002)


def hf_config(name: str):
    from transformers import AutoConfig

    values = dict(ARCHS[name])
    return AutoConfig.for_model(values.pop("model_type"), **values)


def parameter_count(name: str) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(name))
    return sum(p.numel() for p in model.parameters())


# Issue 41: families outside Llama/Qwen/Mistral at full size (bench/families_gpu.py --archs ...). Each one's widths are
# its config.json's as public code quotes them (the source in the comment); values that do not change memory
# (token ids, multipliers) are the family's defaults where the source leaves them out.
FAMILIES_41 = {
    # allenai/OLMoE-1B-7B-0924 (MoE: 64 experts of width 1024, 8 routed; q/k norms). Source: the config.json fields
    # quoted in a public moe_engine test ("The fields of allenai/OLMoE-1B-7B-0924's config.json").
    "olmoe-1b-7b": dict(
        model_type="olmoe", vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, hidden_act="silu",
        norm_topk_prob=False, router_aux_loss_coef=0.01, output_router_logits=False, max_position_embeddings=4096,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=50279,
        pad_token_id=1, torch_dtype="bfloat16"),
    # ibm-granite/granite-3.1-2b-base. Source: a public Rust test "Exact config from ibm-granite/granite-3.1-2b-base"
    # (vocab 49155, hidden 2048, MLP 8192, 40 layers, 32 heads, 8 KV heads, rope_theta 5e6); the multipliers are
    # granite's scaled values (they change the numbers, not the memory).
    "granite-3.1-2b": dict(
        model_type="granite", vocab_size=49155, hidden_size=2048, intermediate_size=8192, num_hidden_layers=40,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rope_theta=5000000.0,
        rms_norm_eps=1e-5, hidden_act="silu", attention_bias=False, mlp_bias=False, embedding_multiplier=12.0,
        attention_multiplier=0.015625, residual_multiplier=0.22, logits_scaling=8.0, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, torch_dtype="bfloat16"),
    # bigcode/starcoder2-3b (LayerNorm with biases, GELU MLP c_fc/c_proj, GQA 24/2, sliding window 4096). Source: a
    # public Rust test "Exact config from bigcode/starcoder2-3b".
    "starcoder2-3b": dict(
        model_type="starcoder2", vocab_size=49152, hidden_size=3072, intermediate_size=12288, num_hidden_layers=30,
        num_attention_heads=24, num_key_value_heads=2, rope_theta=999999.4420358813, sliding_window=4096,
        max_position_embeddings=16384, norm_epsilon=1e-5, hidden_act="gelu_pytorch_tanh", use_bias=True,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, torch_dtype="bfloat16"),
    # togethercomputer/RedPajama-INCITE-Instruct-3B-v1 (gpt_neox: fused query_key_value, dense, LayerNorm, GELU MLP,
    # no GQA). Source: the model_config mlc-llm's gen_config prints for it in a public write-up (hidden 2560, MLP
    # 10240, 32 heads, 32 layers, vocab 50432, rotary_pct 1.0, use_parallel_residual false, eps 1e-5).
    "redpajama-3b": dict(
        model_type="gpt_neox", vocab_size=50432, hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
        num_attention_heads=32, rotary_pct=1.0, rotary_emb_base=10000, use_parallel_residual=False,
        layer_norm_eps=1e-5, max_position_embeddings=2048, hidden_act="gelu", tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0, torch_dtype="float16"),
}
ARCHS.update(FAMILIES_41)

# Image-text models (bench/product_plans.py `vision1`): config.json of Qwen/Qwen2.5-VL-7B-Instruct and
# google/gemma-3-12b-it, vision_config included (Gemma-3's text_config lists only what differs from Gemma3TextConfig's
# defaults, as the Hub's file does). The benchmark builds them with AutoModelForImageTextToText and saves the family's
# processor beside them (bench/synth.py vision_processor), its token ids written into the config.
VISION_ARCHS = {
    "qwen2.5-vl-7b": dict(
        model_type="qwen2_5_vl", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=128000, max_window_layers=28,
        rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=32768, use_sliding_window=False, hidden_act="silu",
        attention_dropout=0.0, tie_word_embeddings=False, initializer_range=0.02, torch_dtype="bfloat16",
        rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}, bos_token_id=151643, eos_token_id=151645,
        vision_start_token_id=151652, vision_end_token_id=151653, vision_token_id=151654, image_token_id=151655,
        video_token_id=151656,
        vision_config=dict(depth=32, hidden_act="silu", hidden_size=1280, intermediate_size=3420, num_heads=16,
                           in_chans=3, out_hidden_size=3584, patch_size=14, spatial_merge_size=2,
                           spatial_patch_size=14, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
                           tokens_per_second=2, temporal_patch_size=2)),
    "gemma-3-12b-it": dict(
        model_type="gemma3", boi_token_index=255999, eoi_token_index=256000, eos_token_id=[1, 106],
        image_token_index=262144, initializer_range=0.02, mm_tokens_per_image=256, torch_dtype="bfloat16",
        text_config=dict(model_type="gemma3_text", hidden_size=3840, intermediate_size=15360, num_attention_heads=16,
                         num_hidden_layers=48, num_key_value_heads=8, sliding_window=1024,
                         rope_scaling={"factor": 8.0, "rope_type": "linear"}),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=1152, image_size=896, intermediate_size=4304,
                           num_attention_heads=16, num_hidden_layers=27, patch_size=14, vision_use_head=False)),
}
ARCHS.update(VISION_ARCHS)
HUB_IDS.update({"qwen2.5-vl-7b": "Qwen/Qwen2.5-VL-7B-Instruct", "gemma-3-12b-it": "google/gemma-3-12b-it"})
