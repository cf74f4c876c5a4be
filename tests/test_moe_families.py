"""Every mixture-of-experts family gets 4-bit experts, counted by the estimate as the loader stores them
(core/levers/expert_store.py: one rule for both); the families whose experts class is their own (Llama-4, DBRX,
JetMoE: core/levers/family_experts.py) compute with them exactly as with their dequantized weights; Llama-4 trains
on the product path, on TRL's fused loss head (or its own logits where that head fails);
lora_experts is refused before loading where it cannot adapt the experts, with the true reason; routers are never
LoRA targets unless named.

Tiny models of the real configs (tests/families_any.py OWN_EXPERTS and its MoE families, tests/test_estimate_stored.py
MOE), random weights from a fixed seed, saved in bf16 with the demo tokenizer, loaded by memtune's own loader in 4
bits (bitsandbytes NF4 on the CPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.config.settings import ConfigError, demo_config
from tests import families_any
from tests.test_estimate_stored import MOE, _config, _stored
from tests.helpers import tiny_model_folder

OWN = tuple(families_any.OWN_EXPERTS)
ANY_MOE = ("mixtral", "qwen2_moe", "deepseek_v3", "gpt_oss", "qwen3_next", "granitemoehybrid")
EVERY = [*(("stored", n) for n in MOE), *(("any", n) for n in ANY_MOE), *(("any", n) for n in OWN)]


def _hf_config(source: str, name: str):
    from transformers import AutoConfig

    if source == "any":
        return families_any.hf_config(name)
    values = _config(name)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def _save(config, folder):
    return tiny_model_folder(config, folder)


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    return {name: _save(_hf_config("any", name), root / name) for name in OWN}


def _cfg(folder, **changes):
    base = dict(model=str(folder), load_in_4bit=True, upcast_to_fp32=False, offload_embeddings=False,
                quantize_output_head=False, bnb_4bit_use_double_quant=True)
    return demo_config(**{**base, **changes})


@pytest.mark.parametrize("source,name", EVERY, ids=[f"{s}-{n}" for s, n in EVERY])
def test_the_estimate_counts_the_experts_as_the_loader_stores_them(source, name, tmp_path):
    """For every MoE family: the bytes the loaded model holds in 4 bits and in bf16 equal what the estimator counts
    from the same config (the experts through expert_store's rule on both sides), and no weight holding several
    experts is left 16-bit where the rule routes it to 4 bits."""
    from core.estimate.terms import single_gpu_terms
    from core.levers import expert_store
    from core.model.load import load_model
    from core.model.shapes import get_shape

    folder = _save(_hf_config(source, name), tmp_path / name)
    cfg = _cfg(folder)
    model = load_model(cfg, str(folder))
    held = _stored(model)
    shape = get_shape(str(folder))
    terms = single_gpu_terms(cfg, shape)
    assert held.pop("4bit") == terms.quantized, name  # Linear4bit weights and every 4-bit expert
    # the rest in bf16 (DeepSeek-V3 keeps its routers' score-correction bias in fp32, which the estimate counts
    # 16-bit like every other small parameter)
    assert held.get("bfloat16", 0) + held.get("float32", 0) // 2 == terms.unquantized, name
    assert shape.expert_weights(), name  # every one of these families has experts the rule stores in 4 bits
    assert not expert_store.plan(model).unrouted
    left = [n for n, p in model.named_parameters() if p.dim() == 3 and "expert" in n]  # not convolutions' [o, i, w]
    assert not left, (name, left)


@pytest.mark.parametrize("name", OWN)
def test_a_familys_own_experts_are_stored_in_4_bits_and_said(name, own):
    """Llama-4, DBRX and JetMoE: every experts weight is bitsandbytes NF4 once loaded (none left 16-bit), the log's
    line says so, and the estimate counts them 4-bit, in grouped products where the family computes so (Llama-4,
    JetMoE) and one expert at a time where it does not (DBRX)."""
    from core.levers import experts as moe
    from core.model.load import load_model
    from core.model.shapes import get_shape

    model = load_model(_cfg(own[name]), str(own[name]))
    notes = {n.key: n.params for n in model.memtune_moe_notes}
    grouped = name != "dbrx"
    said = "log.moe.experts_4bit_grouped" if grouped else "log.moe.experts_4bit"
    assert list(notes) == [said, "log.moe.aux_off"], notes
    assert notes[said]["layers"] == 2 and notes[said]["experts"] == 4
    quantized = [m for m in model.modules() if isinstance(m, moe.NF4Experts)]
    shape = get_shape(str(own[name]))
    assert len(quantized) == len(shape.expert_weights()) > 0 and shape.experts_grouped == grouped
    assert all(s.quant_type == "nf4" and s.nested for m in quantized for s in m.states)
    assert shape.moe_layers == 2


@pytest.mark.parametrize("name", OWN)
def test_a_familys_own_experts_compute_in_4_bits_as_their_dequantized_selves(name, own):
    """The family's 4-bit forward (one routed expert at a time through bitsandbytes) gives the logits and the
    gradients of the family's own forward on the dequantized weights (a real quantization: those differ from the
    checkpoint's)."""
    from transformers import AutoModelForCausalLM

    from core.levers import expert_store, experts as moe
    from core.model.load import load_model

    model = load_model(_cfg(own[name]), str(own[name]))  # bf16, as trained
    ids = torch.randint(3, families_any.VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))

    def run():
        model.zero_grad()
        emb = model.get_input_embeddings().weight
        emb.requires_grad_(True)
        out = model(ids, labels=ids)
        out.loss.backward()
        return out.logits.detach(), emb.grad.clone()

    nf4_logits, nf4_grad = run()
    paths = [w.path for w in expert_store.plan(model).quantized]
    assert paths and moe.dequantize_experts(model) == len(paths)
    assert not any(isinstance(m, moe.NF4Experts) for m in model.modules())
    assert all(not type(m).__name__.startswith("NF4") for m in model.modules())  # the family's own forward again
    own_logits, own_grad = run()
    torch.testing.assert_close(nf4_logits, own_logits, rtol=0, atol=1e-2 * own_logits.abs().max().item())
    assert (nf4_grad.float() - own_grad.float()).norm() <= 1e-2 * own_grad.float().norm()
    saved = AutoModelForCausalLM.from_pretrained(own[name], dtype=torch.float32)
    for path in paths:  # restored in the family's own shape, with the 4-bit values (not the checkpoint's)
        restored, original = model.get_parameter(path).detach().float(), saved.get_parameter(path).detach()
        assert restored.shape == original.shape and not torch.equal(restored, original), path
        assert (restored - original).abs().max() < 0.25 * original.abs().max(), path


@pytest.mark.parametrize("load_in_4bit", [False, True])
def test_lora_experts_is_refused_before_loading_on_dbrx_with_the_true_reason(load_in_4bit, own):
    """DBRX's experts read their weights as attributes of a child module, which peft's target_parameters replaces by
    its wrapper: no adapter on them could run under peft, so lora_experts is refused on the module tree (before any
    weight loads), saying so by the class's name, not that the model has no experts. Llama-4 and JetMoE pass."""
    from core.model.load import lora_targets, skeleton

    def refused(name):
        cfg = _cfg(own[name], load_in_4bit=load_in_4bit, lora_experts=True, lora_dropout=0.0,
                   lora_target_modules=["attention"])
        try:
            lora_targets(cfg, model=skeleton(cfg, str(own[name])))
        except ConfigError as err:
            return err.problems
        return []

    [problem] = refused("dbrx")
    assert problem.field == "lora_experts" and problem.key == "problem.lora_experts_family", problem
    assert "DbrxExpertGLU" in problem.message and "no mixture-of-experts" not in problem.message
    assert refused("llama4_text") == [] and refused("jetmoe") == []


def test_lora_experts_on_a_dense_model_is_refused_before_loading(demo_model_path):
    from core.model.load import lora_targets, skeleton

    cfg = demo_config(load_in_4bit=False, lora_experts=True, lora_dropout=0.0)
    with pytest.raises(ConfigError) as err:
        lora_targets(cfg, model=skeleton(cfg, str(demo_model_path)))
    assert err.value.problems[0].key == "problem.lora_experts_dense"


@pytest.mark.parametrize("name", OWN)
def test_routers_are_never_lora_targets_unless_named(name):
    """No group (attention, mlp, all_linear) and no q/k/v/o role takes a router (JetMoE's sits in its attention
    block); a router named by the user is adapted."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from core.model import lora_targets as lt

    with init_empty_weights():
        tree = AutoModelForCausalLM.from_config(families_any.hf_config(name))
    linear = lt.linear_layers(tree)
    assert linear.routers, name
    for group in (["attention"], ["all_linear"]):
        chosen = lt.resolve(group, linear, 8).modules
        assert chosen and not set(chosen) & linear.routers, (name, group, chosen)
        assert not any(lt._is_router(tree, p) for p in lt.paths(tree, chosen)), (name, group)
    router = sorted(linear.routers)[0]
    assert lt.resolve([router], linear, 8).modules == [router]
    if name == "jetmoe":  # its attention's linear layers: kv_proj (k and v) and the heads' router
        assert lt.resolve(["attention"], linear, 8).modules == ["kv_proj"]
        assert lt.resolve(["k_proj", "v_proj"], linear, 8).modules == ["kv_proj"]


@pytest.mark.parametrize("backbone", ["named", "unnamed"])
def test_llama4_text_trains_in_4_bits_on_trls_fused_head_or_its_own_logits_where_that_fails(backbone, own, tmp_path,
                                                                                            monkeypatch):
    """The product path on Llama-4 (text): experts in 4 bits. TRL's fused loss head finds its backbone by
    base_model_prefix, which Llama-4's text model inherits from the multimodal one ("language_model"); memtune's
    loader names the backbone on the instance (`name_backbone`), so the run trains on the fused head, the pre-flight
    having found it equal to the model's own logits. Without that (`unnamed`: the head fails on the model), the
    pre-flight makes the model's own logits the loss, says why in the log, and the run still trains: no crash, losses
    finite, summary.json records the loss path."""
    from core.model import load
    from core.train.recipe import run_training

    if backbone == "unnamed":
        monkeypatch.setattr(load, "name_backbone", lambda model: None)
    events = []
    cfg = _cfg(own["llama4_text"], output_dir=str(tmp_path / "runs"), upcast_to_fp32=True,
               lora_target_modules=["attention"], max_steps=2, logging_steps=1, per_device_train_batch_size=2,
               gradient_accumulation_steps=1, max_length=32, dataset_split="train[:8]", validation_share=0.0,
               eval_samples=0, heldout_rows=0)
    result = run_training(cfg, sink=events.append)
    assert result.status == "completed", result.message
    keys = [e.get("key") for e in events]
    pre = result.summary["preflight"]
    assert "log.moe.experts_4bit_grouped" in keys
    if backbone == "named":
        assert pre["loss_path"] == "fused" and pre["loss"]["ok"] and "failed" not in pre["loss"], pre
        assert "log.preflight.own_head" not in keys and "log.preflight.done" in keys
    else:
        assert "log.preflight.done_own" in keys
        own_head = next(e for e in events if e.get("key") == "log.preflight.own_head")
        assert own_head["params"]["why"]["key"] == "log.preflight.why_failed"
        assert pre["loss_path"] == "own_logits" and pre["loss"]["failed"] and pre["loss"]["own"] > 0
    losses = [e["params"]["loss"] for e in events if e.get("key") == "log.step"]
    assert len(losses) == 2 and all(0 < x < 20 for x in losses)


def test_a_family_without_gradient_checkpointing_trains_without_it_and_says_so():
    """JetMoE's class refuses gradient checkpointing (transformers raises once the Trainer enables it): the run is
    resolved without it before loading, with the reason in the log; a family that supports it keeps it."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from core.config.presets import apply_preset
    from core.config.settings import TrainConfig
    from core.model import families

    cfg = apply_preset(TrainConfig(), "lowest_memory")
    assert cfg.gradient_checkpointing
    for name, refused in (("jetmoe", True), ("llama4_text", False), ("dbrx", False)):
        config = families_any.hf_config(name)
        with init_empty_weights():
            found = families.traits(config, AutoModelForCausalLM.from_config(config))
        changes, said = families.adapt(cfg, found)
        assert (changes.get("gradient_checkpointing") is False) == refused, (name, changes)
        assert ("log.adapt.no_checkpointing" in [s.key for s in said]) == refused


def test_the_preview_refuses_lora_experts_with_the_runs_reason(own):
    """The data preview says what the run would: lora_experts on DBRX's own experts class, not "no experts"."""
    import json

    from core.jobs.preview import model_changes

    cfg = _cfg(own["dbrx"], load_in_4bit=False, lora_experts=True, lora_dropout=0.0)
    _, lines, tree = model_changes(cfg)
    said = json.dumps(lines)
    assert tree is not None and "problem.lora_experts_family" in said and "problem.lora_experts_dense" not in said


LORA_OWN = ("llama4_text", "jetmoe")


def _family_lora(model) -> list:
    from core.levers.expert_lora import ExpertLoRA

    return [m for m in model.modules() if isinstance(m, ExpertLoRA)]


@pytest.mark.parametrize("name", LORA_OWN)
def test_lora_on_a_familys_own_4bit_experts_trains_and_grouped_equals_the_loop(name, own):
    """lora_experts + load_in_4bit on Llama-4 and JetMoE (their own experts classes): an ExpertLoRA on every NF4
    weight (JetMoE: its MLP's and its attention heads' experts; Llama-4's in peft's flipped reading of x @ W), counted
    by the estimate; with every B non-zero the grouped path and the one-expert-at-a-time loop give the same loss and
    the same gradient of every LoRA matrix; a few optimizer steps move every experts LoRA matrix and never the NF4
    bytes."""
    from core.estimate.terms import expert_lora_matrices
    from core.levers import experts as moe, family_experts
    from core.model.load import load_model, prepare_for_training
    from core.model.shapes import get_shape

    cfg = _cfg(own[name], lora_experts=True, lora_dropout=0.0, lora_target_modules=["attention"])
    model = prepare_for_training(load_model(cfg, str(own[name])), cfg)
    notes = [n.key for n in model.get_base_model().memtune_moe_notes]
    assert "log.moe.experts_4bit_grouped" in notes and "log.moe.lora_experts" in notes, notes
    loras = _family_lora(model)
    weights = [m for m in model.modules() if isinstance(m, moe.NF4Experts)]
    assert len(loras) == len(weights) == (2 * 2 if name == "llama4_text" else 2 * 4)
    assert all(m.flipped == (name == "llama4_text") for m in loras)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    shape = get_shape(str(own[name]))
    assert sum(p.numel() for n, p in trainable.items() if ".lora.lora_" in n) == sum(expert_lora_matrices(shape, cfg))

    packed = [m.packed.clone() for m in weights]
    torch.manual_seed(5)
    with torch.no_grad():
        for m in loras:
            m.lora_B["default"].weight.normal_(std=0.05)
    model.train()
    ids = torch.randint(3, families_any.VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    runs = {}
    for grouped in (True, False):
        assert family_experts.set_grouped(model, grouped) == grouped
        model.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        runs[grouped] = loss.item(), {n: p.grad.clone() for n, p in trainable.items()}
    (g_loss, g), (l_loss, loop) = runs[True], runs[False]
    assert torch.isfinite(torch.tensor(g_loss)) and g_loss == pytest.approx(l_loss, rel=2e-3)
    experts = [n for n in g if ".lora.lora_" in n]
    assert experts and all(g[n].abs().max() > 0 for n in experts)
    for n in g:
        torch.testing.assert_close(g[n], loop[n], rtol=0, atol=0.03 * g[n].abs().max().item() + 1e-6, msg=n)

    family_experts.set_grouped(model, True)
    start = {n: trainable[n].detach().clone() for n in experts}
    opt = torch.optim.AdamW(list(trainable.values()), lr=1e-2)
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    assert [n for n in experts if torch.equal(trainable[n], start[n])] == []
    assert all(torch.equal(a, m.packed) for a, m in zip(packed, weights))


def _peft_keys(folder, targets: list[str], r: int, out) -> dict[str, tuple[int, ...]]:
    """The experts LoRA keys and shapes peft itself writes for target_parameters on the bf16 model at `folder`."""
    from peft import LoraConfig, get_peft_model
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    get_peft_model(model, LoraConfig(r=r, target_modules=[], target_parameters=targets)).save_pretrained(out)
    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.mark.parametrize("name", LORA_OWN)
def test_a_familys_experts_adapter_is_peft_s_layout_and_reloads_to_the_same_logits(name, own, tmp_path):
    """A QLoRA run with lora_experts on Llama-4 / JetMoE saves its experts' LoRA as peft saves target_parameters on
    that family (the same keys and shapes); Try it's model (the adapter back on the 4-bit experts), peft's
    PeftModel.from_pretrained on the dequantized bf16 base and the merged model give the same logits, and the
    experts' LoRA (its B made larger in the saved file) moves them by far more than that."""
    import json

    from peft import PeftModel
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from core.export.adapter import dequantize_4bit_linears, merge_adapter
    from core.infer import adapter_problem
    from core.levers.experts import dequantize_experts
    from core.model.load import load_model, load_with_adapter
    from core.train.recipe import run_training

    cfg = _cfg(own[name], output_dir=str(tmp_path / "runs"), lora_experts=True, lora_dropout=0.05,
               lora_target_modules=["attention"], max_steps=2, logging_steps=1,
               per_device_train_batch_size=2, gradient_accumulation_steps=1, max_length=32,
               dataset_split="train[:8]", validation_share=0.0, eval_samples=0, heldout_rows=0)
    result = run_training(cfg, sink=lambda e: None)
    assert result.status == "completed", result.message
    adapter = Path(result.adapter_dir)
    settings = json.loads((adapter / "adapter_config.json").read_text())
    targets = settings["target_parameters"]
    assert targets == sorted(result.summary["lora_parameters"]) and settings["lora_dropout"] == 0.0
    with safe_open(str(adapter / "adapter_model.safetensors"), framework="pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if ".lora.lora_" not in k}
        assert len(saved) == len(list(f.keys()))
    by_peft_keys = _peft_keys(own[name], targets, cfg.lora_r, tmp_path / "peft_own")
    assert {k: v for k, v in saved.items() if k in by_peft_keys} == by_peft_keys
    assert adapter_problem(adapter) is None
    # two tiny steps barely move the experts' B: made larger in the file (still peft's adapter) so they matter
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    torch.manual_seed(6)
    for key in by_peft_keys:
        if ".lora_B." in key:
            weights[key] = (weights[key].float() + 0.05 * torch.randn(weights[key].shape)).to(weights[key].dtype)
    save_file(weights, str(adapter / "adapter_model.safetensors"), metadata={"format": "pt"})

    ids = torch.randint(3, families_any.VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    cfg = cfg.replace(upcast_to_fp32=False, precision="fp32")  # fp32: no top-k choice flips on rounding
    tried = load_with_adapter(cfg, adapter, str(own[name]))
    with torch.no_grad():
        try_it = tried(input_ids=ids).logits.float()
        for m in _family_lora(tried):
            m.lora_B["default"].weight.zero_()
        no_experts = tried(input_ids=ids).logits.float()
    tol = 3e-2 * try_it.abs().max().item()
    assert (try_it - no_experts).abs().max() > 5 * tol

    plain = load_model(cfg, str(own[name]))
    dequantize_4bit_linears(plain)
    assert dequantize_experts(plain) > 0
    with torch.no_grad():
        by_peft = PeftModel.from_pretrained(plain, str(adapter)).eval()(input_ids=ids).logits.float()
    torch.testing.assert_close(by_peft, try_it, rtol=0, atol=tol)
    merged = AutoModelForCausalLM.from_pretrained(merge_adapter(adapter, tmp_path / "merged"),
                                                  dtype=torch.bfloat16).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits.float(), try_it, rtol=0, atol=tol)


def _llama4_layer(folder, experts: int):
    """A one-layer Llama-4 (text) of real proportions at a small width, `experts` experts, top-1."""
    from transformers import AutoConfig

    values = dict(num_hidden_layers=1, hidden_size=256, intermediate_size=512, intermediate_size_mlp=512,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=experts,
                  num_experts_per_tok=1, interleave_moe_layer_step=1, no_rope_layers=[1], attention_chunk_size=8192,
                  use_qk_norm=True, max_position_embeddings=4096, vocab_size=families_any.VOCAB, **families_any.IDS,
                  tie_word_embeddings=False)
    return _save(AutoConfig.for_model("llama4_text", **values), folder)


def _kept_per_token(model, layer, tokens: int) -> float:
    """Bytes per token autograd keeps inside `layer` in one training forward of `tokens` tokens (weights and the
    4-bit experts' buffers excluded), as core/estimate/measure.py counts them."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    inside, kept = [False], {}
    layer.register_forward_pre_hook(lambda *a: inside.__setitem__(0, True))
    layer.register_forward_hook(lambda *a: inside.__setitem__(0, False))

    def pack(t):
        storage = t.untyped_storage()
        if inside[0] and storage.data_ptr() not in own and storage.nbytes():
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.arange(tokens)[None] % (families_any.VOCAB - 3) + 3
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids)
    return sum(kept.values()) / tokens


def test_the_estimate_counts_llama4s_copy_of_every_token_to_every_expert(tmp_path, monkeypatch):
    """Llama-4's MoE block hands every expert a copy of every token (scaled by its router score, 0 where not routed)
    and keeps those copies for backward: experts x hidden per token, however few experts a token routes to. The
    estimate's layer term is measured (core/estimate/measure.py: the router and memtune's 4-bit forward of those
    copies stood in), and grows with the experts as memtune's own training forward does: 4 -> 16 experts, within
    10%. (The formula it fell back to when the measurement failed counted k copies: about 70 bytes of the growth.)"""
    from core.estimate import terms
    from core.estimate.measure import TOKENS
    from core.model.load import load_model, prepare_for_training
    from core.model.shapes import get_shape

    monkeypatch.setenv("MEMTUNE_CACHE", str(tmp_path / "cache"))
    real, estimated = {}, {}
    for experts in (4, 16):
        folder = _llama4_layer(tmp_path / f"e{experts}", experts)
        cfg = _cfg(folder, precision="bf16", lora_target_modules=["attention"], lora_dropout=0.0,
                   gradient_checkpointing=False)
        model = prepare_for_training(load_model(cfg, str(folder)), cfg)
        assert model.get_base_model().model.layers[0].feed_forward.experts.memtune_grouped
        real[experts] = _kept_per_token(model, model.get_base_model().model.layers[0], TOKENS)
        shape = get_shape(str(folder))
        assert terms.measured_saved(cfg, shape, False) is not None  # measured, not the formula
        estimated[experts] = terms.layer_bytes_per_token(cfg, shape)[0]
    grown, estimate_grown = real[16] - real[4], estimated[16] - estimated[4]
    assert grown > 12 * 256 * 2  # the 12 more copies of each token's bf16 hidden state
    assert estimate_grown == pytest.approx(grown, rel=0.10), (real, estimated)
