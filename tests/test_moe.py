"""Mixture-of-experts models (core/levers/experts.py): experts stored in 4 bits as they load, computed in grouped
products (tests/test_moe_grouped.py: equal to one expert at a time through bitsandbytes); the router's
load-balancing loss as config.json says; LoRA on experts (16-bit experts; 4-bit ones: tests/test_lora_experts_4bit.py).

Tiny CPU models of Qwen3-MoE, Mixtral, gpt-oss and OLMoE: their real configs scaled down (tests/test_estimate_stored.py's
CONFIGS: same model_type, routing, layer structure; fewer, narrower experts), random weights from a fixed seed, saved
in bf16 with the demo tokenizer, loaded by memtune's own loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.config.settings import demo_config
from tests.test_estimate_stored import CONFIGS, MOE, _config
from tests.helpers import tiny_model_folder

FAMILIES = MOE  # qwen3_moe, mixtral, gpt_oss, olmoe


def _build(name: str, folder: Path, **changes) -> Path:
    from transformers import AutoConfig

    values = {**_config(name), **changes}
    return tiny_model_folder(AutoConfig.for_model(values.pop("model_type"), **values), folder)


# Expert widths of whole 64-value quantization blocks, as every real MoE's (768, 14336, 2880, 1024): bitsandbytes'
# AVX512 CPU dequantize kernel (0.50) reads blocks per row and gets narrower rows wrong (core/model/nf4_cpu.py).
WHOLE_BLOCKS = {"qwen3_moe": dict(moe_intermediate_size=64), "mixtral": dict(intermediate_size=64),
                "olmoe": dict(intermediate_size=64)}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {name: _build(name, root / name, **WHOLE_BLOCKS.get(name, {})) for name in FAMILIES}


def _cfg(folder, tmp_path=None, **changes):
    base = dict(model=str(folder), load_in_4bit=True, upcast_to_fp32=True, offload_embeddings=False,
                quantize_output_head=False, lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                max_steps=2, logging_steps=1, per_device_train_batch_size=4, gradient_accumulation_steps=1,
                max_length=32, dataset_split="train[:8]", validation_share=0.0, eval_samples=0)
    if tmp_path is not None:
        base["output_dir"] = str(tmp_path / "runs")
    return demo_config(**{**base, **changes})


def _logs(events) -> dict[str, dict]:
    return {e["key"]: e.get("params", {}) for e in events if e.get("kind") == "log" and e.get("key")}


def _experts_count(name: str) -> int:
    return CONFIGS[name].get("num_experts", CONFIGS[name].get("num_local_experts"))


@pytest.mark.parametrize("name", FAMILIES)
def test_nf4_experts_forward_equals_the_model_with_its_experts_dequantized_to_bf16(name, folders):
    """Loaded in 4 bits, every expert weight is bitsandbytes NF4 (no 16-bit 3-D weight left, the quantization is
    real: its dequantized values differ from the checkpoint's); the model's logits equal those of the same model
    whose experts hold those dequantized values in bf16 and run transformers' own eager experts loop."""
    from transformers import AutoModelForCausalLM

    from core.levers import experts as moe
    from core.model.load import load_model

    model = load_model(_cfg(folders[name], upcast_to_fp32=False), str(folders[name]))
    assert [n.key for n in model.memtune_moe_notes] == ["log.moe.experts_4bit_grouped", "log.moe.aux_off"]
    assert model.memtune_moe_notes[0].params["experts"] == _experts_count(name)
    assert model.memtune_moe_notes[0].params["layers"] == 2
    assert model.config._experts_implementation == moe.GROUPED  # tests/test_moe_grouped.py: equal to moe.LOOP
    quantized = [m for m in model.modules() if isinstance(m, moe.NF4Experts)]
    assert len(quantized) == 4 and all(m.packed.dtype == torch.uint8 for m in quantized)
    assert all(s.quant_type == "nf4" and s.nested for m in quantized for s in m.states)  # double quant as configured
    assert not any(p.dim() == 3 for p in model.parameters())
    saved = AutoModelForCausalLM.from_pretrained(folders[name], dtype=torch.bfloat16)  # the checkpoint, 16-bit
    experts = model.model.layers[0].mlp.experts
    dequantized = torch.stack([experts.down_proj.dequantize(e) for e in range(experts.down_proj.num_experts)])
    original = saved.model.layers[0].mlp.experts.down_proj.detach()
    assert dequantized.shape == original.shape and not torch.equal(dequantized, original)
    assert (dequantized.float() - original.float()).abs().max() < 0.25 * original.float().abs().max()

    ids = torch.randint(3, families_vocab(), (2, 12), generator=torch.Generator().manual_seed(1))
    model.eval()
    with torch.no_grad():
        nf4 = model(ids).logits.float()
    default = model.memtune_experts_default
    assert moe.dequantize_experts(model) == 4  # what a merge into the dequantized weights starts from
    assert model.config._experts_implementation == default not in (moe.GROUPED, moe.LOOP)
    model.set_experts_implementation("eager")  # transformers' own per-expert loop
    assert not any(isinstance(m, moe.NF4Experts) for m in model.modules())
    assert all(p.dtype == torch.bfloat16 for n, p in model.named_parameters() if p.dim() == 3)
    with torch.no_grad():
        bf16 = model(ids).logits.float()
    torch.testing.assert_close(nf4, bf16, rtol=0, atol=1e-3 * bf16.abs().max().item())


def families_vocab() -> int:
    from tests import families

    return families.VOCAB


@pytest.mark.parametrize("name", FAMILIES)
def test_qlora_trains_with_the_experts_in_4_bits(name, folders, tmp_path):
    """The product path (core.train, the chapter's recipe: NF4, double quant, fp32 upcast of the rest) trains a few
    steps on every family; the log says what was quantized and what the routing loss does."""
    from core.train.recipe import run_training

    events = []
    result = run_training(_cfg(folders[name], tmp_path), sink=events.append)
    assert result.status == "completed", result.message
    logs = _logs(events)
    assert logs["log.moe.experts_4bit_grouped"]["layers"] == 2
    assert logs["log.moe.experts_4bit_grouped"]["experts"] == _experts_count(name)
    assert logs["log.moe.experts_4bit_grouped"]["quant"] == "nf4"
    assert "log.moe.aux_off" in logs and "log.moe.lora_experts" not in logs
    assert result.summary["experts_4bit_layers"] == 2 and result.summary["lora_parameters"] == []
    losses = [e["params"]["loss"] for e in events if e.get("key") == "log.step"]
    assert len(losses) == 2 and all(0 < x < 20 for x in losses)


@pytest.mark.parametrize("name", FAMILIES)
def test_lora_on_experts_trains_every_lora_parameter(name, folders):
    """lora_experts on 16-bit experts: peft's target_parameters on each layer's gate_up_proj and down_proj; three
    optimizer steps change every LoRA parameter (A too: it gets a gradient once B is no longer zero), and the
    estimator's LoRA count is what peft made."""
    from core.estimate.terms import expert_lora_matrices
    from core.model.load import load_model, prepare_for_training
    from core.model.shapes import get_shape

    cfg = _cfg(folders[name], load_in_4bit=False, upcast_to_fp32=False, lora_experts=True, lora_dropout=0.0)
    model = prepare_for_training(load_model(cfg, str(folders[name])), cfg)
    notes = {n.key: n.params for n in model.memtune_moe_notes}
    assert notes["log.moe.lora_experts"]["params"] == "mlp.experts.gate_up_proj, mlp.experts.down_proj"
    assert "log.moe.experts_16bit" in notes
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert sum(".experts." in n for n in trainable) == 2 * 2 * 2  # 2 layers x 2 weights x (A, B)
    shape = get_shape(str(folders[name]))
    assert sum(p.numel() for p in trainable.values()) == (
        shape.lora_params(cfg.lora_r, cfg.lora_target_modules) + sum(expert_lora_matrices(shape, cfg)))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(3, families_vocab(), (2, 16), generator=torch.Generator().manual_seed(2))
    model.train()
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    unchanged = [n for n, p in model.named_parameters() if p.requires_grad and torch.equal(p, trainable[n])]
    assert unchanged == []


def test_lora_on_experts_is_said_in_the_log_summary_and_adapter_config(folders, tmp_path):
    from core.train.recipe import run_training

    events = []
    cfg = _cfg(folders["qwen3_moe"], tmp_path, load_in_4bit=False, lora_experts=True, lora_dropout=0.0)
    result = run_training(cfg, sink=events.append)
    assert result.status == "completed", result.message
    expected = ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    assert _logs(events)["log.moe.lora_experts"]["params"] == "mlp.experts.gate_up_proj, mlp.experts.down_proj"
    assert result.summary["lora_parameters"] == expected and result.summary["experts_4bit_layers"] == 0
    saved = json.loads((Path(result.adapter_dir) / "adapter_config.json").read_text())
    assert sorted(saved["target_parameters"]) == expected


def test_lora_on_16bit_experts_with_dropout_or_on_a_dense_model_is_refused_by_name(folders, demo_model_path):
    """peft's ParamWrapper (16-bit experts) refuses dropout; 4-bit experts carry memtune's own LoRA
    (tests/test_lora_experts_4bit.py), dropout included."""
    from core.config.settings import ConfigError, config_problems
    from core.model.load import load_model, prepare_for_training

    problems = {(p.field, p.key) for p in config_problems(_cfg(folders["mixtral"], lora_experts=True,
                                                                lora_dropout=0.05, load_in_4bit=False))}
    assert ("lora_experts", "problem.lora_experts_dropout") in problems
    for changes in (dict(lora_dropout=0.0, load_in_4bit=False), dict(lora_dropout=0.05, load_in_4bit=True)):
        assert not [p for p in config_problems(_cfg(folders["mixtral"], lora_experts=True, **changes))
                    if p.field == "lora_experts"]
    cfg = demo_config(load_in_4bit=False, lora_experts=True, lora_dropout=0.0)
    with pytest.raises(ConfigError) as err:
        prepare_for_training(load_model(cfg, str(demo_model_path)), cfg)
    assert "lora_experts" in str(err.value) and "mixture-of-experts" in str(err.value)


def test_the_router_loss_is_on_exactly_where_config_json_says(tmp_path):
    """Qwen3-MoE's config.json says output_router_logits false (coefficient 0.001): no aux loss (TRL would turn it on
    from the coefficient alone). A config saying true: on, with its coefficient, and the model returns it."""
    from core.model.load import load_model
    from core.train.recipe import run_training

    on = _build("qwen3_moe", tmp_path / "on", output_router_logits=True, router_aux_loss_coef=0.01)
    events = []
    result = run_training(_cfg(on, tmp_path), sink=events.append)
    assert result.status == "completed", result.message
    assert _logs(events)["log.moe.aux_on"]["coef"] == 0.01
    off = _build("qwen3_moe", tmp_path / "off", router_aux_loss_coef=0.01)
    model = load_model(_cfg(off), str(off))
    assert [n.key for n in model.memtune_moe_notes][-1] == "log.moe.aux_off"
    assert model.config.router_aux_loss_coef == 0.0 and not model.config.output_router_logits


@pytest.mark.parametrize("name", FAMILIES)
def test_without_4_bits_the_experts_stay_16_bit_and_are_counted_so(name, folders):
    """load_in_4bit off: nothing is quantized (the log says the experts are kept in bf16) and the estimator's weights
    are every parameter of the loaded model in bf16, its experts included."""
    from core.estimate.terms import single_gpu_terms
    from core.model.load import load_model
    from core.model.shapes import get_shape

    cfg = _cfg(folders[name], load_in_4bit=False, upcast_to_fp32=False)
    model = load_model(cfg, str(folders[name]))
    assert [n.key for n in model.memtune_moe_notes] == ["log.moe.experts_16bit", "log.moe.aux_off"]
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    terms = single_gpu_terms(cfg, get_shape(str(folders[name])))
    assert terms.quantized == 0 and terms.unquantized == held
    assert sum(p.numel() for p in model.parameters() if p.dim() == 3) == get_shape(str(folders[name])).expert_params


def test_the_experts_are_quantized_as_transformers_sets_each_weight(folders, monkeypatch):
    """Loading never holds the model's experts in 16 bits: each 3-D weight becomes 4-bit the moment transformers'
    loader sets it (set_param_for_module), layer by layer, before the next weight is read."""
    import inspect

    from core.levers import experts as moe
    from core.model.load import load_model

    seen = []
    init = moe.NF4Experts.__init__

    def recording(self, weight, *args, **kwargs):
        seen.append(("set_param_for_module" in {f.function for f in inspect.stack()}, tuple(weight.shape)))
        init(self, weight, *args, **kwargs)

    monkeypatch.setattr(moe.NF4Experts, "__init__", recording)
    model = load_model(_cfg(folders["qwen3_moe"]), str(folders["qwen3_moe"]))
    assert len(seen) == 4 and all(during for during, _ in seen)
    assert sorted(shape for _, shape in seen) == sorted(m.shape for m in model.modules() if isinstance(m, moe.NF4Experts))


@pytest.mark.parametrize("name", FAMILIES)
def test_the_memory_transformers_reserves_before_loading_counts_the_experts_in_4_bits(name, folders):
    """transformers reserves the loaded model's size on the GPU before reading it (caching_allocator_warmup, sized by
    get_total_byte_count through the quantizer): inside the loader's context the experts count 4 bits a weight, as
    they are stored; outside it, 16 as before (the H200's loading peak was the experts' bf16 size)."""
    from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig
    from transformers.modeling_utils import get_total_byte_count
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer

    from core.levers import experts as moe

    folder = folders[name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16)
    quantizer = Bnb4BitHfQuantizer(BitsAndBytesConfig(load_in_4bit=True))
    names = [n for n, _ in model.named_parameters()]
    experts = {n for n in names if n.rpartition(".")[2] in moe.WEIGHTS and model.get_parameter(n).dim() == 3}
    assert experts
    device = torch.device("cuda", 0)  # only counted: nothing is allocated
    before = get_total_byte_count(model, {n: device for n in names}, quantizer)[device]
    with moe.quantizing_experts(str(folder), "nf4", True, torch.bfloat16):
        during = get_total_byte_count(model, {n: device for n in names}, quantizer)[device]
    after = get_total_byte_count(model, {n: device for n in names}, quantizer)[device]
    expert_numel = sum(model.get_parameter(n).numel() for n in experts)
    assert before == after
    assert before - during == pytest.approx(expert_numel * 1.5)  # 2 bytes -> 0.5 bytes a weight
