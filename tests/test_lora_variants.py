"""The LoRA variants as levers (issue 44): DoRA, rsLoRA, PiSSA/OLoRA initialisation and LoRA+, each through peft's own
options, on the tiny demo model with the real stack (4-bit NF4 where peft supports the variant there).

Each run trains 2 steps: what is checked is what peft was asked (adapter_config.json), what trains (DoRA's
magnitudes), the optimizer's groups (LoRA+), that PiSSA's start leaves the model's output unchanged and that its
saved (converted) adapter, loaded or merged into the original base, answers as the trained model did; the refusals;
and DoRA's estimator term against what autograd really keeps.
"""

import gc
import json
import math
import weakref
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from core.config.settings import TrainConfig, config_problems, demo_config
from core.train.recipe import run_training

PROBE = torch.tensor([[0, 261, 283, 28, 201, 312, 307, 289, 284, 297]])


class Keep(TrainerCallback):
    """The trainable tensors before step 1, the optimizer, and the model at the end."""

    def on_train_begin(self, args, state, control, model=None, **kw):
        self.before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def on_step_end(self, args, state, control, optimizer=None, **kw):
        self.optimizer = optimizer

    def on_train_end(self, args, state, control, model=None, **kw):
        self.model = model


def train(tmp_path, **changes):
    keep = Keep()
    cfg = demo_config(output_dir=str(tmp_path / "runs"), max_steps=2, logging_steps=1, eval_samples=0,
                      validation_share=0.0, **changes)
    result = run_training(cfg, callbacks=[keep])
    assert result.status == "completed", result.message
    saved = json.loads((Path(result.adapter_dir) / "adapter_config.json").read_text())
    return result, keep, saved


def logits(model, ids=PROBE):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_dora_on_a_4bit_base_trains_its_magnitudes_and_answers_as_trained(tmp_path, demo_model_path):
    from core.export.adapter import merge_adapter
    from core.model.load import load_model, load_with_adapter
    from transformers import AutoModelForCausalLM

    result, keep, saved = train(tmp_path, use_dora=True, warmup_steps=0)  # the full lr: two steps that move it
    assert saved["use_dora"] is True and saved["use_rslora"] is False and saved["init_lora_weights"] is True
    import bitsandbytes as bnb

    assert any(isinstance(m, bnb.nn.Linear4bit) for m in keep.model.modules())  # the real QLoRA path
    magnitudes = {n: p for n, p in keep.model.named_parameters() if "lora_magnitude_vector" in n}
    assert len(magnitudes) == 2 * 7  # 2 layers x 7 adapted linears
    assert all(p.requires_grad for p in magnitudes.values())
    assert all(not torch.equal(keep.before[n], p.detach()) for n, p in magnitudes.items())  # they learned
    from safetensors import safe_open

    with safe_open(str(Path(result.adapter_dir) / "adapter_model.safetensors"), framework="pt") as f:
        assert sum("lora_magnitude_vector" in k for k in f.keys()) == 14
    cfg = demo_config(use_dora=True)
    trained = logits(keep.model.eval())
    # Try it loads the adapter in fp32 where training held it in bf16: plain LoRA's answers then differ by 3.4% of
    # what two steps moved them, DoRA's by 4.8% (measured on this run)
    loaded = logits(load_with_adapter(cfg, result.adapter_dir, str(demo_model_path)))
    base = logits(load_model(cfg, str(demo_model_path)))
    merged = merge_adapter(result.adapter_dir, tmp_path / "merged")  # peft merges DoRA into the dequantized weights
    merged_logits = logits(AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32))
    moved = (trained - base).abs().mean()
    errors = [(loaded - trained).abs().mean() / moved, (merged_logits - trained).abs().mean() / moved]
    assert max(errors) < 0.1, errors


def test_rslora_scales_by_the_square_root_of_the_rank(tmp_path):
    _, keep, saved = train(tmp_path, use_rslora=True)
    assert saved["use_rslora"] is True and saved["use_dora"] is False
    layer = keep.model.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.scaling["default"] == pytest.approx(64 / math.sqrt(32))  # lora_alpha / sqrt(r), not / r (2.0)


def test_loraplus_gives_lora_b_the_higher_rate_with_the_configured_8bit_optimizer(tmp_path):
    import bitsandbytes as bnb

    _, keep, saved = train(tmp_path, loraplus_lr_ratio=16.0, optim="paged_adamw_8bit", warmup_steps=0)
    opt = keep.optimizer
    inner = getattr(opt, "optimizer", opt)  # accelerate's wrapper
    assert isinstance(inner, bnb.optim.AdamW)  # the class `optim` names, 8-bit state as asked
    assert inner.args.optim_bits == 8 and inner.is_paged  # as optim="paged_adamw_8bit" builds it
    names = {id(p): n for n, p in keep.model.named_parameters()}
    rates = {}
    for group in inner.param_groups:
        for p in group["params"]:
            rates["B" if "lora_B" in names[id(p)] else "A"] = group["initial_lr"]  # before the schedule
    assert rates == {"A": pytest.approx(8e-3), "B": pytest.approx(16 * 8e-3)}  # demo_config's learning_rate
    big = [p for g in inner.param_groups for p in g["params"] if p.numel() >= 4096]  # bnb's min_8bit_size
    assert big and all(inner.state[p]["state1"].dtype == torch.uint8 for p in big)  # 8-bit moments kept
    assert "loraplus" not in json.dumps(saved)  # the adapter is a plain LoRA: LoRA+ is a training choice only


def test_pissa_starts_where_the_base_is_and_its_saved_adapter_answers_as_trained(tmp_path, demo_model_path):
    from core.export.adapter import merge_adapter
    from core.model.load import load_model, load_with_adapter, prepare_for_training
    from transformers import AutoModelForCausalLM

    changes = dict(load_in_4bit=False, precision="fp32", lora_init="pissa")
    cfg = demo_config(**changes)
    original = load_model(cfg, str(demo_model_path))
    expected = logits(original)
    wrapped = prepare_for_training(load_model(cfg, str(demo_model_path)), cfg)
    layer = wrapped.base_model.model.model.layers[0].self_attn.q_proj
    assert not torch.equal(layer.base_layer.weight, original.model.layers[0].self_attn.q_proj.weight)  # residual
    assert layer.lora_B["default"].weight.abs().sum() > 0  # not plain LoRA's B = 0
    torch.testing.assert_close(logits(wrapped), expected, rtol=1e-4, atol=1e-4)  # step 0: the original model

    result, keep, saved = train(tmp_path, **changes)
    # saved converted (peft's path_initial_model_for_weight_conversion): a plain LoRA of twice the rank
    assert saved["r"] == 64 and saved["lora_alpha"] == 128 and saved["init_lora_weights"] is True
    trained = logits(keep.model.eval())
    assert (trained - expected).abs().max() > 1e-2  # two steps moved it
    loaded = load_with_adapter(cfg, result.adapter_dir, str(demo_model_path))  # what Try it loads: original base
    torch.testing.assert_close(logits(loaded), trained, rtol=1e-4, atol=1e-4)
    merged = merge_adapter(result.adapter_dir, tmp_path / "merged")  # into the original weights, saved in bf16
    merged_logits = logits(AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32))
    # the merged folder stores bf16 weights: its error is what bf16 storage costs the original model, no more
    storage = (logits(original.to(torch.bfloat16).float()) - expected).abs().mean()
    assert (merged_logits - trained).abs().mean() < 2 * storage < (trained - expected).abs().mean()


def test_olora_saves_a_plain_lora_that_answers_as_trained(tmp_path, demo_model_path):
    from core.model.load import load_with_adapter

    changes = dict(load_in_4bit=False, precision="fp32", lora_init="olora")
    result, keep, saved = train(tmp_path, **changes)
    assert saved["r"] == 64 and saved["init_lora_weights"] is True
    loaded = load_with_adapter(demo_config(**changes), result.adapter_dir, str(demo_model_path))  # original base
    torch.testing.assert_close(logits(loaded), logits(keep.model.eval()), rtol=1e-4, atol=1e-4)


def test_the_variants_peft_cannot_combine_are_refused_together():
    cfg = TrainConfig(lora_init="pissa", use_dora=True, lora_experts=True, lora_dropout=0.0,
                      load_in_4bit=True, loraplus_lr_ratio=0.5)
    keys = {(p.field, p.key) for p in config_problems(cfg)}
    assert {("lora_init", "problem.init_4bit"), ("use_dora", "problem.dora_init"),
            ("lora_experts", "problem.variant_experts"),
            ("loraplus_lr_ratio", "problem.loraplus_ratio")} <= keys
    # olora on a 4-bit base: the converted adapter would not answer as trained (peft re-quantizes W - B0 A0)
    assert ("lora_init", "problem.init_4bit") in {(p.field, p.key) for p in config_problems(
        TrainConfig(lora_init="olora"))}
    fine = TrainConfig(lora_init="gaussian", use_dora=True, loraplus_lr_ratio=16.0, use_rslora=True)
    assert not {p.key for p in config_problems(fine)} & {
        "problem.init_4bit", "problem.dora_init", "problem.variant_experts", "problem.loraplus_ratio"}
    bad = TrainConfig(lora_init="lora_ga")
    assert any(p.field == "lora_init" and p.key == "problem.not_a_choice" for p in config_problems(bad))


def _kept_bytes(model, ids) -> int:
    """Bytes autograd keeps for backward after a forward (saved tensors still alive; parameters not counted)."""
    refs = []

    def pack(t):
        refs.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids).logits
    gc.collect()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    alive = {}
    for ref in refs:
        t = ref()
        if t is not None and t.untyped_storage().data_ptr() not in params:
            alive[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    del out
    return sum(alive.values())


def test_dora_term_is_what_autograd_keeps(demo_model_path):
    """The estimator's DoRA activations (core.estimate.terms.dora_terms) against a real forward: DoRA minus plain
    LoRA, saved tensors still alive, on the demo model in fp32 without checkpointing."""
    from core.estimate.terms import dora_terms, single_gpu_terms
    from core.model.load import load_model, prepare_for_training
    from core.model.shapes import get_shape

    tokens = 48
    ids = torch.randint(1, 300, (1, tokens), generator=torch.Generator().manual_seed(0))
    kept = {}
    for dora in (False, True):
        cfg = demo_config(load_in_4bit=False, precision="fp32", use_dora=dora, max_length=tokens,
                          per_device_train_batch_size=1)
        model = prepare_for_training(load_model(cfg, str(demo_model_path)), cfg).train()
        kept[dora] = _kept_bytes(model, ids)
    measured = kept[True] - kept[False]
    shape = get_shape(str(demo_model_path))
    t = single_gpu_terms(cfg, shape)
    before = t.activations
    dora_terms(t, cfg, shape)
    term = t.activations - before
    widths = sum(b for _, b in shape.lora_dims(cfg.lora_target_modules)) * shape.num_hidden_layers
    # the term counts per token; the few out-wide vectors per layer (norm, scale) are left out of it
    assert term <= measured <= term + 3 * 4 * widths
    assert term == shape.num_hidden_layers * tokens * 8 * sum(b for _, b in shape.lora_dims(cfg.lora_target_modules))


def test_dora_costs_memory_in_the_estimate_and_the_other_variants_none():
    from core.config.presets import apply_preset
    from core.estimate.predict import estimate

    cfg = apply_preset(TrainConfig(), "lowest_memory")  # Llama-3.1-8B shape
    plain = estimate(cfg).nvml_peak
    dora = estimate(cfg.replace(use_dora=True))
    assert dora.nvml_peak > plain and any("DoRA" in n for n in dora.notes)
    all_linear = cfg.replace(lora_target_modules=["all_linear"])
    assert (estimate(all_linear.replace(use_dora=True)).nvml_peak - estimate(all_linear).nvml_peak
            > dora.nvml_peak - plain)  # more adapted layers, more magnitudes and kept outputs
    for other in (dict(use_rslora=True), dict(lora_init="olora"), dict(loraplus_lr_ratio=16.0)):
        assert estimate(cfg.replace(**other)).nvml_peak == plain
