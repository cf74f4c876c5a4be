"""The memory/speed levers (core.model.load, core/levers/), on the CPU with the demo model (no mocks of the ML stack).

Liger kernels and the CUDA allocator setting need a CUDA GPU: their tests only check that they are refused or
inert on the CPU (bench/RESULTS.md measures them on an H200).
"""

import pytest
import torch

from core.levers import embedding
from core.model import attention as varlen
from core.model import load as model_lib
from core.checks import validate
from core.config.settings import Hardware, TrainConfig, demo_config
from core.config.presets import apply_preset

CPU = Hardware(cuda=False, bf16=True, bitsandbytes=True)


@pytest.fixture
def demo_model(demo_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32).eval()
    model.requires_grad_(False)  # frozen, as prepare_for_training leaves the base
    return model


def ids():
    return torch.tensor([[0, 261, 283, 28, 201, 312, 307, 289, 284, 297]])


def test_embedding_offload_gives_identical_logits_and_hides_the_matrix(demo_model):
    before = demo_model(input_ids=ids()).logits
    n_params = sum(p.numel() for p in demo_model.parameters())
    emb_numel = demo_model.get_input_embeddings().weight.numel()
    assert embedding.offload_input_embeddings(demo_model)
    wrapped = demo_model.get_input_embeddings()
    assert isinstance(wrapped, embedding.CpuEmbedding)
    assert wrapped.weight.device.type == "cpu" and wrapped.num_embeddings == emb_numel // wrapped.embedding_dim
    # Not registered: .to()/parameters()/state_dict never see it, so Trainer/Accelerate cannot move it back.
    assert sum(p.numel() for p in demo_model.parameters()) == n_params - emb_numel
    assert not any("embed_tokens" in k for k in demo_model.state_dict())
    demo_model.to(torch.float32)
    assert wrapped.cpu_embedding.weight.device.type == "cpu"
    assert torch.equal(demo_model(input_ids=ids()).logits, before)
    assert embedding.offload_input_embeddings(demo_model)  # idempotent


def test_the_embedding_loader_leaves_a_16bit_config_without_quantization_as_it_was():
    """offload_embeddings on a 16-bit base (load_in_4bit off): the flag put back after loading must not assume a
    quantization config (run 19: AttributeError, then a second full load beside the first, 28.9 GiB for an 8B)."""
    from transformers import BitsAndBytesConfig, LlamaConfig

    plain = LlamaConfig()
    embedding.saved_as_asked(plain)
    assert getattr(plain, "quantization_config", None) is None
    quantized = LlamaConfig()
    quantized.quantization_config = BitsAndBytesConfig(load_in_4bit=True, llm_int8_enable_fp32_cpu_offload=True)
    embedding.saved_as_asked(quantized)
    assert quantized.quantization_config.llm_int8_enable_fp32_cpu_offload is False


def test_embedding_offload_skips_tied_and_trainable_embeddings(demo_model):
    demo_model.get_output_embeddings().weight = demo_model.get_input_embeddings().weight  # tie them
    assert embedding.embeddings_tied(demo_model)
    assert not embedding.offload_input_embeddings(demo_model)
    assert isinstance(demo_model.get_input_embeddings(), torch.nn.Embedding)


def test_embedding_offload_refuses_a_trainable_embedding(demo_model):
    demo_model.get_input_embeddings().weight.requires_grad_(True)
    assert not embedding.offload_input_embeddings(demo_model)


def test_prepare_for_training_applies_the_lean_levers_with_4bit(demo_model_path):
    import bitsandbytes as bnb

    cfg = apply_preset(demo_config(), "lowest_memory", CPU)
    model = model_lib.load_model(cfg, str(demo_model_path))
    model = model_lib.prepare_for_training(model, cfg)
    base = model.get_base_model()
    assert isinstance(base.get_input_embeddings(), embedding.CpuEmbedding)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in base.modules())
    # No fp32 upcast: every frozen non-quantized weight stays in the compute dtype.
    frozen = [p for p in base.parameters() if not p.requires_grad and type(p).__name__ != "Params4bit"]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    # lora_dropout 0 -> peft uses Identity, no dropout module at all
    assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
    # A backward pass reaches the LoRA weights through checkpointed blocks and the CPU embedding.
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    out = model(input_ids=ids(), labels=ids())
    out.loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_chapter_upcast_then_offload_keeps_the_fp32_embedding(demo_model_path):
    cfg = demo_config(load_in_4bit=True, upcast_to_fp32=True, offload_embeddings=True)
    model = model_lib.prepare_for_training(model_lib.load_model(cfg, str(demo_model_path)), cfg)
    emb = model.get_base_model().get_input_embeddings()
    assert isinstance(emb, embedding.CpuEmbedding) and emb.weight.dtype == torch.float32


def test_padding_free_packing_respects_row_boundaries_with_sdpa(demo_model):
    """Rows packed in one sequence with per-row position ids see only themselves (transformers' SDPA path
    builds a block-diagonal mask from the position ids); without position ids they would see each other."""
    assert demo_model.config._attn_implementation == "sdpa"
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(3, 500, (1, 7), generator=g), torch.randint(3, 500, (1, 11), generator=g)
    # use_cache=False as in training (TRL passes it): with a KV cache transformers does not look for packing.
    with torch.no_grad():
        alone = demo_model(input_ids=b, use_cache=False).logits[0]
        packed = demo_model(input_ids=torch.cat([a, b], 1), use_cache=False,
                            position_ids=torch.cat([torch.arange(7), torch.arange(11)])[None]).logits[0, 7:]
        leaky = demo_model(input_ids=torch.cat([a, b], 1), use_cache=False).logits[0, 7:]
    assert torch.allclose(packed, alone, atol=1e-4)
    assert not torch.allclose(leaky, alone, atol=1e-2)


def test_expandable_segments_is_inert_without_cuda():
    model_lib.configure_cuda(demo_config(expandable_segments=True, device="cpu"))  # must not raise


def test_liger_needs_cuda_and_is_dropped_on_the_cpu():
    cfg = TrainConfig(use_liger_kernel=True, device="cpu")
    assert any(p.field == "use_liger_kernel" for p in validate(cfg, CPU))
    assert apply_preset(cfg, "fastest", CPU).use_liger_kernel is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="liger-kernel's Triton kernels need a CUDA GPU")
def test_liger_validates_on_a_cuda_gpu():  # pragma: no cover - CPU CI never runs it
    hw = Hardware.detect()
    if not hw.liger:
        pytest.skip("liger-kernel is not installed")
    assert not [p for p in validate(TrainConfig(use_liger_kernel=True), hw) if p.field == "use_liger_kernel"]


# --- varlen attention (core/model/attention.py, TrainConfig.attention) -------------------------------------------------
def _packed_pair(seed=1):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randint(3, 500, (1, 7), generator=g), torch.randint(3, 500, (1, 11), generator=g)
    pos = torch.cat([torch.arange(7), torch.arange(11)])[None]
    return a, b, pos


def test_varlen_attention_falls_back_to_masked_sdpa_on_the_cpu(demo_model_path):
    """On the CPU (no FlashAttention) the varlen setting must still keep packed rows apart and handle padding."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32).eval()
    m = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32).eval()
    varlen.use_varlen_attention(m)
    assert m.config._attn_implementation == varlen.VARLEN_ATTENTION
    a, b, pos = _packed_pair()
    x = torch.randint(3, 500, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        alone = ref(input_ids=b, use_cache=False).logits[0]
        packed = m(input_ids=torch.cat([a, b], 1), position_ids=pos, use_cache=False).logits[0, 7:]
        assert torch.allclose(packed, alone, atol=1e-4)
        padded_ref = ref(input_ids=x, attention_mask=mask, use_cache=False).logits
        padded = m(input_ids=x, attention_mask=mask, use_cache=False).logits
        assert torch.allclose(padded[0], padded_ref[0], atol=1e-5)
        assert torch.allclose(padded[1, :6], padded_ref[1, :6], atol=1e-5)


def _reference_varlen(api: str, calls: list):
    """A per-row SDPA stand-in for torch.nn.attention.varlen.varlen_attn (FlashAttention needs CUDA), with the
    signature of torch 2.13 (window_size, enable_gqa, scale), 2.11 (window_size, no enable_gqa: what the H200 image
    has) or 2.10 (is_causal)."""
    import torch.nn.functional as F

    def rows(q, k, v, cu, causal, scale, gqa):
        assert gqa or k.shape[1] == q.shape[1], "no grouped-query attention in this API"
        out = []
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            qi, ki, vi = (t[s:e].transpose(0, 1)[None] for t in (q, k, v))
            out.append(F.scaled_dot_product_attention(qi, ki, vi, is_causal=causal, scale=scale,
                                                      enable_gqa=gqa)[0].transpose(0, 1))
        calls.append(len(cu) - 1)
        return torch.cat(out)

    if api == "2.13":
        def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1),
                        enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
            return rows(q, k, v, cu_q, window_size == (-1, 0), scale, enable_gqa)
    elif api == "2.11":
        def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)):
            return rows(q, k, v, cu_q, window_size == (-1, 0), scale, False)
    else:
        def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None):
            return rows(q, k, v, cu_q, is_causal, None, False)
    return varlen_attn


@pytest.mark.parametrize("api", ["2.13", "2.11", "2.10"])
def test_varlen_attention_glue_keeps_rows_apart(demo_model_path, monkeypatch, api):
    """The FlashAttention path itself runs only on CUDA (bench/RESULTS.md checks it on the H200); here a reference
    kernel with the same signature checks memtune's glue: layouts, row boundaries, GQA, both API versions."""
    from transformers import AutoModelForCausalLM

    calls = []
    monkeypatch.setattr(varlen, "_varlen_kernel", lambda: _reference_varlen(api, calls))
    monkeypatch.setattr(varlen, "_varlen_device", lambda t: True)
    ref = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32).eval()
    m = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.bfloat16).eval()
    varlen.use_varlen_attention(m)
    a, b, pos = _packed_pair()
    with torch.no_grad():
        alone = ref.to(torch.bfloat16)(input_ids=b, use_cache=False).logits[0].float()
        packed = m(input_ids=torch.cat([a, b], 1), position_ids=pos, use_cache=False).logits[0, 7:].float()
    assert calls and all(n == 2 for n in calls)  # every layer went through the kernel, with 2 rows
    assert (packed - alone).norm() / alone.norm() < 2e-2


def test_rows_from_position_ids():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    cu, longest = varlen._rows_from_position_ids(pos)
    assert cu.tolist() == [0, 3, 5, 9] and longest == 4
    assert varlen._rows_from_position_ids(pos)[0] is cu  # one lookup per forward, not per layer


def test_embedding_offload_keywords_for_a_checkpoint_saved_in_4bit(demo_model_path, tmp_path):
    """A "-bnb-4bit" checkpoint brings its own quantization config, and transformers ignores the CPU-offload flag
    on the config passed in: bitsandbytes then refused lowest_memory's device map (found on the GPU, run 6)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.quantizers.auto import AutoHfQuantizer

    cfg = demo_config().replace(model=str(tmp_path / "nf4"))
    saved = AutoModelForCausalLM.from_pretrained(demo_model_path, quantization_config=model_lib.build_bnb_config(cfg),
                                                 device_map="cpu")
    saved.save_pretrained(tmp_path / "nf4")
    dmap = {"model.embed_tokens": "cpu", "model.layers": 0, "model.norm": 0, "model.rotary_emb": 0, "lm_head": 0}

    def validate(config) -> None:
        merged = AutoHfQuantizer.merge_quantization_configs(config, model_lib.build_bnb_config(cfg))
        AutoHfQuantizer.from_config(merged, pre_quantized=True).validate_environment(device_map=dmap)

    with pytest.raises(ValueError, match="dispatched on the CPU"):  # what transformers does with the flag passed in
        validate(AutoConfig.from_pretrained(tmp_path / "nf4").quantization_config)
    kwargs = embedding.offload_kwargs(AutoConfig.from_pretrained(cfg.model),
                                      {"quantization_config": model_lib.build_bnb_config(cfg)}, dmap)
    assert kwargs["device_map"] is dmap and kwargs["quantization_config"].llm_int8_enable_fp32_cpu_offload
    validate(kwargs["config"].quantization_config)  # the checkpoint's own config now carries the flag
    plain = embedding.offload_kwargs(AutoConfig.from_pretrained(demo_model_path), {"quantization_config": None}, dmap)
    assert "config" not in plain  # a bf16 checkpoint: nothing to change
