"""The estimator counts what the loaded model really stores (core/model/shapes.py builds the model of config.json on
the meta device): every parameter by how memtune's loader keeps it, 4-bit or not, so mixture-of-experts models'
fused 3-D experts (not nn.Linear: core/levers/experts.py stores them in 4 bits, expert by expert) and families
without Llama-style config keys are counted.

Each tiny model is its family's real config.json scaled down (the same model_type and layer structure; MoE: the
same routing, fewer and narrower experts), built with random weights from a fixed seed, saved in bf16 and loaded by
memtune's own loader in 4 bits on the CPU.
"""

import json

import pytest
import torch

from core.config.arguments import kbit_kwargs
from core.config.presets import apply_preset
from core.config.settings import TrainConfig, demo_config
from core.estimate.predict import estimate
from core.estimate.terms import GIB, moe_routed_bytes_per_token, nf4_bytes, single_gpu_terms
from core.model.shapes import ModelShape, get_shape
from tests import families

TINY = dict(vocab_size=families.VOCAB, num_hidden_layers=2, max_position_embeddings=256, bos_token_id=0,
            eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
CONFIGS = {
    # Qwen/Qwen3-30B-A3B: hidden 2048, 32 / 4 heads, head_dim 128, 128 experts of width 768, top-8, every layer MoE
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                      num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[]),
    # mistralai/Mixtral-8x7B-v0.1: hidden 4096, 32 / 8 heads, 8 experts of width 14336, top-2
    "mixtral": dict(model_type="mixtral", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=96, num_local_experts=4, num_experts_per_tok=2),
    # openai/gpt-oss-20b: hidden 2880, 64 / 8 heads, head_dim 64, 32 experts of width 2880, top-4, attention sinks
    "gpt_oss": dict(model_type="gpt_oss", hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                    intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    # allenai/OLMoE-1B-7B-0924: hidden 2048, 16 heads, 64 experts of width 1024, top-8, q/k norms
    "olmoe": dict(model_type="olmoe", hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                  intermediate_size=32, num_experts=8, num_experts_per_tok=2),
    # gpt2: n_embd 768, 12 heads, Conv1D layers, learned positions, tied
    "gpt2": dict(model_type="gpt2", n_embd=32, n_head=2, n_layer=2, n_positions=128, tie_word_embeddings=True),
    # facebook/opt-125m: hidden 768, ffn_dim 3072, learned positions, biases, tied
    "opt": dict(model_type="opt", hidden_size=32, num_attention_heads=2, ffn_dim=128, word_embed_proj_dim=32,
                tie_word_embeddings=True),
    # bigscience/bloom-560m: hidden 1024, 16 heads, ALiBi, embedding LayerNorm, tied
    "bloom": dict(model_type="bloom", hidden_size=32, n_head=2, n_layer=2, tie_word_embeddings=True),
    # tiiuae/falcon-7b: hidden 4544, 71 heads, multi-query, parallel attention, no biases
    "falcon": dict(model_type="falcon", hidden_size=32, num_attention_heads=4, multi_query=True,
                   parallel_attn=True, bias=False, new_decoder_architecture=False),
    # meta-llama/Llama-3.1-8B (tests/families.py)
    "llama": {**families.FAMILIES["llama3"]},
}
MOE = ("qwen3_moe", "mixtral", "gpt_oss", "olmoe")


def _config(name: str) -> dict:
    values = {**TINY, **CONFIGS[name]}
    if name in ("gpt2", "bloom"):  # their own layer-count key (attribute_map gives num_hidden_layers)
        values.pop("num_hidden_layers")
    return values


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    out = {}
    for name in CONFIGS:
        folder = tmp_path_factory.mktemp(name)
        values = _config(name)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(values.pop("model_type"), **values))
        model.to(torch.bfloat16).save_pretrained(folder)
        out[name] = folder
    return out


def _stored(model) -> dict[str, int]:
    """Bytes the loaded model holds: 4-bit weights (packed data + quantization constants: bitsandbytes' Params4bit
    and the MoE experts' NF4Experts, core/levers/experts.py) and the rest by dtype."""
    from core.levers.experts import stored_bytes

    out = {"4bit": stored_bytes(model)}
    for p in model.parameters():
        if type(p).__name__ == "Params4bit":
            s = p.quant_state
            tensors = [p.data, s.absmax, s.code] + ([s.state2.absmax, s.state2.code, s.offset] if s.nested else [])
            out["4bit"] += sum(t.numel() * t.element_size() for t in tensors)
        else:
            key = str(p.dtype).removeprefix("torch.")
            out[key] = out.get(key, 0) + p.numel() * p.element_size()
    return out


@pytest.mark.parametrize("upcast", [False, True], ids=["lean", "upcast"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_estimated_weights_are_what_memtunes_4bit_loader_stores(name, upcast, folders):
    """Per storage class: the 4-bit bytes (MoE experts included: every expert its own 4-bit weight), and the other
    weights' bytes in their dtype (bf16 as loaded; fp32 after the recipe's upcast), equal what the estimator counts."""
    from peft import prepare_model_for_kbit_training

    from core.model.load import load_model

    cfg = demo_config(model=str(folders[name]), load_in_4bit=True, upcast_to_fp32=upcast, offload_embeddings=False,
                      quantize_output_head=False, bnb_4bit_use_double_quant=True)
    model = load_model(cfg, str(folders[name]))
    if kbit_kwargs(cfg) is not None:
        model = prepare_model_for_kbit_training(model, **kbit_kwargs(cfg))
    held = _stored(model)
    shape = get_shape(str(folders[name]))
    terms = single_gpu_terms(cfg, shape)
    # Falcon's layers are FalconLinear, a subclass of nn.Linear that transformers' 4-bit quantizer leaves alone
    # (it converts exactly nn.Linear): its QLoRA base is 16-bit, and the estimate says so.
    assert held.pop("4bit") == terms.quantized and (terms.quantized > 0) == (name != "falcon"), name
    assert held == {("float32" if upcast else "bfloat16"): terms.unquantized}, name
    numel = sum(p.numel() for p in model.parameters() if type(p).__name__ != "Params4bit")
    # small_params: what transformers' 4-bit quantizer leaves 16-bit, MoE experts included (then stored in 4 bits)
    assert numel == shape.embed_params + shape.head_params + shape.small_params - shape.expert_weight_params
    if name in MOE:
        from core.levers.experts import NF4Experts

        held_experts = [m for m in model.modules() if isinstance(m, NF4Experts)]
        assert len(held_experts) == len(shape.expert_weights()) == 2 * 2  # gate_up_proj + down_proj, 2 layers
        assert sum(e * a * b for e, a, b in shape.expert_weights()) == sum(
            m.num_experts * m.shape[1] * m.shape[2] for m in held_experts) == shape.expert_params > 0
        assert not any(p.dim() == 3 for p in model.parameters())  # no 16-bit expert weight left
        assert shape.num_experts == CONFIGS[name].get("num_experts", CONFIGS[name].get("num_local_experts"))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_architecture_numbers_come_from_the_config_and_the_real_modules(name, folders):
    shape = get_shape(str(folders[name]))
    c = CONFIGS[name]
    hidden = c.get("hidden_size", c.get("n_embd"))
    assert shape.hidden_size == hidden and shape.num_hidden_layers == 2 and shape.vocab_size == families.VOCAB
    mlp = {"gpt2": 4 * hidden, "opt": 128, "bloom": 4 * hidden, "falcon": 4 * hidden, "llama": 224,
           "qwen3_moe": 32, "mixtral": 96, "gpt_oss": 64, "olmoe": 32}
    assert shape.intermediate_size == mlp[name]
    if name == "falcon":
        assert shape.num_key_value_heads == 1  # multi-query
    if name in MOE:
        assert shape.num_experts_per_tok == 2 and shape.moe_layers == 2 and not shape.dense_mlp
        assert shape.expert_intermediate_size == mlp[name]
        # gpt-oss checkpoints hold the experts fused: nothing to stack while loading
        assert (shape.largest_expert_params > 0) == (name != "gpt_oss")
    else:
        assert shape.num_experts == 0 and shape.dense_mlp


def test_qwen3_30b_a3b_counts_its_experts_under_lowest_memory():
    """Qwen3-30B-A3B: 48 layers x 128 experts x 3 x 2048 x 768 = 28.99 B expert parameters, 54.0 GiB in bf16, which
    the estimate of before counted as nothing (3.80 GiB in all); core/levers/experts.py stores them in NF4 (about
    14 GiB), every expert its own 4-bit weight."""
    shape = get_shape("Qwen/Qwen3-30B-A3B")
    assert shape.expert_params == shape.expert_weight_params == 48 * 128 * 3 * 2048 * 768
    assert shape.expert_params * 2 / GIB == pytest.approx(54.0, abs=0.05)
    assert len(shape.expert_weights()) == 2 * 48 and shape.largest_expert_weight == 2 * 768 * 2048
    est = estimate(apply_preset(TrainConfig(model="Qwen/Qwen3-30B-A3B"), "lowest_memory"), shape)
    # only attention is nn.Linear: 48 x (q 2048x4096 + k, v 2048x512 + o 4096x2048), 4-bit; the experts too
    assert shape.linear_params == 48 * (2 * 2048 * 4096 + 2 * 2048 * 512)
    experts = sum(e * nf4_bytes(a * b, True) for e, a, b in shape.expert_weights())
    assert experts / GIB == pytest.approx(13.9, abs=0.1)
    assert est.quantized_weights == sum(nf4_bytes(a * b, True) for a, b in shape.quantized_weights()) + experts
    assert est.unquantized_weights / GIB < 1.0 and 14.0 < est.total_gib < 20.0  # issue 40: <= 20 GiB NVML
    bf16 = estimate(apply_preset(TrainConfig(model="Qwen/Qwen3-30B-A3B"), "lowest_memory").replace(
        load_in_4bit=False), shape)
    assert bf16.unquantized_weights / GIB > 54.0  # without 4 bits the experts stay bf16, and are counted so
    for hub in ("mistralai/Mixtral-8x7B-v0.1", "openai/gpt-oss-20b", "allenai/OLMoE-1B-7B-0924"):
        moe = get_shape(hub)
        assert moe.num_experts and moe.expert_params > moe.linear_params, hub


@pytest.mark.parametrize("config", [
    dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257),
    dict(model_type="opt", hidden_size=768, num_hidden_layers=12, num_attention_heads=12, ffn_dim=3072,
         vocab_size=50272, word_embed_proj_dim=768),
    dict(model_type="bloom", hidden_size=1024, n_layer=24, n_head=16, vocab_size=250880),
    dict(model_type="falcon", hidden_size=4544, num_hidden_layers=32, num_attention_heads=71, multi_query=True,
         vocab_size=65024, parallel_attn=True, bias=False),
], ids=["gpt2", "opt-125m", "bloom-560m", "falcon-7b"])
def test_decoders_without_llama_keys_get_an_estimate(config, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config))
    est = estimate(TrainConfig(model=str(tmp_path)))
    assert est.total_gib > 1.0 and est.unquantized_weights > 0


def test_moe_activations_route_top_k_copies_per_token():
    base = dict(model_type="qwen3_moe", vocab_size=512, hidden_size=64, intermediate_size=96,
                moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, num_experts=8, decoder_sparse_step=1, mlp_only_layers=[])
    cfg = TrainConfig(model="x")
    two, four = (ModelShape.from_config({**base, "num_experts_per_tok": k}) for k in (2, 4))
    router = (2 + 4) * 8
    assert moe_routed_bytes_per_token(cfg, two) == 2 * 2 * (64 + 3 * 32) + router
    assert moe_routed_bytes_per_token(cfg, four) - router == 2 * (moe_routed_bytes_per_token(cfg, two) - router)
    dense = ModelShape.from_config(_config("llama"))
    assert moe_routed_bytes_per_token(cfg, dense) == 0


def test_the_meta_count_is_cached_per_config_and_an_unknown_type_reads_the_keys():
    from core.model.shapes import _shape_from_json

    config = {**_config("llama"), "hidden_size": 48}  # a config no other test builds
    first = ModelShape.from_config(dict(config), "a")
    hits = _shape_from_json.cache_info().hits
    assert ModelShape.from_config(dict(config), "b") == first.__class__(**{**first.__dict__, "name": "b"})
    assert _shape_from_json.cache_info().hits == hits + 1
    remote = {**config, "model_type": "acme_remote_code", "num_key_value_heads": 2, "head_dim": 8}
    shape = ModelShape.from_config(remote)
    assert shape.stored is None and shape.hidden_size == 48 and shape.intermediate_size == 224


def test_loading_a_moe_checkpoint_caches_the_stacked_experts_as_measured():
    """Measured on an H200 (transformers 5.17, torch 2.11): a 12-layer Qwen3-30B-A3B shape (random weights, saved
    one expert per tensor as on the Hub) loaded in bf16 to the GPU: 15.10 GiB allocated, peak allocated 15.85, reserved
    17.34 (transformers stacks each layer's experts on the GPU; the freed blocks stay cached)."""
    from core.model.shapes import CONFIGS as HUB

    shape = ModelShape.from_config({**HUB["Qwen/Qwen3-30B-A3B"], "num_hidden_layers": 12})
    cfg = apply_preset(TrainConfig(model="q12"), "lowest_memory").replace(load_in_4bit=False,
                                                                        offload_embeddings=False)
    est = estimate(cfg, shape)
    assert est.peak_allocated / GIB == pytest.approx(15.85, rel=0.01)
    assert est.peak_reserved / GIB == pytest.approx(17.34, rel=0.01)
    assert est.peak_phase == "loading"


def test_the_chapters_upcast_of_a_moe_model_empties_the_stacking_cache_as_measured():
    """Measured on an H200 (transformers 5.17, peft 0.21.0, torch 2.11; run r40 of 2026-12-04, its `chapter` row:
    runs/chapter/summary.json and chapter.nvml.csv, NVML sampled from outside): the 12-layer Qwen3-30B-A3B shape with
    the `chapter` preset (fp32 upcast, experts NF4 as they load) held 9.60 GiB NVML after loading and 9.63 through
    training; peak allocated 6.51, peak reserved 8.95. peft's prepare_model_for_kbit_training empties the CUDA cache
    after its upcast, so most of the experts' stacking segments go back to the driver: the estimate counted them all
    (and the whole context on top) and said 10.77 GiB (+11.8%)."""
    from core.model.shapes import CONFIGS as HUB

    shape = ModelShape.from_config({**HUB["Qwen/Qwen3-30B-A3B"], "num_hidden_layers": 12})
    cfg = apply_preset(TrainConfig(model="q12"), "chapter").replace(validation_share=0.0)
    assert kbit_kwargs(cfg) is not None  # the row ran peft's upcast
    est = estimate(cfg, shape)
    assert est.nvml_peak / GIB == pytest.approx(9.63, rel=0.05)
    assert est.peak_allocated / GIB == pytest.approx(6.51, rel=0.05)
    assert est.peak_reserved / GIB == pytest.approx(8.95, rel=0.06)  # the moment before peft empties the cache
    assert est.peak_phase == "loading"
    # Without the upcast nothing empties the cache: the loader's stacking segments stay whole (the bf16-load
    # measurement above), more than after the upcast's empty_cache.
    lean = single_gpu_terms(cfg.replace(upcast_to_fp32=False), shape)
    chapter = single_gpu_terms(cfg, shape)
    assert (lean.load_reserved - lean.quantized - lean.unquantized
            > chapter.load_reserved - chapter.quantized - chapter.unquantized - 2 * shape.embed_params
            - 2 * shape.head_params)
