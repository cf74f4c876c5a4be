"""LoRA on 4-bit experts (core/levers/expert_lora.py): `lora_experts` with `load_in_4bit` trains per-expert A/B on
the NF4 experts in both experts forwards, saves the adapter in peft's own layout for 3-D weights (peft loads it), and
Try it, merge and the estimate use it.

Tiny CPU models of Qwen3-MoE and OLMoE (tests/test_moe.py's: their real configs scaled down, experts of whole 64-value
blocks), random weights from a fixed seed, NF4 through bitsandbytes on the CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.test_moe import WHOLE_BLOCKS, _build, _cfg, families_vocab

FAMILIES = ("qwen3_moe", "olmoe")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora4")
    return {name: _build(name, root / name, **WHOLE_BLOCKS[name]) for name in FAMILIES}


def _ids(seed: int, rows: int = 2, length: int = 16) -> torch.Tensor:
    return torch.randint(3, families_vocab(), (rows, length), generator=torch.Generator().manual_seed(seed))


def _expert_lora(model) -> list:
    from core.levers.expert_lora import ExpertLoRA

    return [m for m in model.modules() if isinstance(m, ExpertLoRA)]


def _loss_and_grads(model, how: str, ids) -> tuple[float, dict[str, torch.Tensor]]:
    model.get_base_model().set_experts_implementation(how)
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("name", FAMILIES)
def test_lora_on_4bit_experts_trains_and_grouped_equals_the_loop(name, folders):
    """lora_experts + load_in_4bit: an ExpertLoRA on each NF4 weight, trainable (the frozen NF4 bytes untouched);
    with every B made non-zero, the grouped path and the one-expert-at-a-time loop give the same loss and the same
    gradient of every LoRA matrix; three optimizer steps keep the loss finite and move every expert LoRA matrix.
    The estimator's LoRA count is the model's trainable count."""
    from core.estimate.terms import expert_lora_matrices
    from core.levers import experts as moe
    from core.model.load import load_model, prepare_for_training
    from core.model.shapes import get_shape

    # OLMoE at r 4: the grouped path pads r to 8 for torch's grouped GEMM (expert_lora.ExpertLoRA.factors)
    cfg = _cfg(folders[name], lora_experts=True, lora_dropout=0.0, upcast_to_fp32=False,
               **({"lora_r": 4, "lora_alpha": 8} if name == "olmoe" else {}))
    model = prepare_for_training(load_model(cfg, str(folders[name])), cfg)
    loras = _expert_lora(model)
    assert len(loras) == 2 * 2  # 2 layers x (gate_up_proj, down_proj)
    assert {n.key for n in model.memtune_moe_notes} >= {"log.moe.lora_experts", "log.moe.experts_4bit_grouped"}
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert sum(".experts." in n for n in trainable) == 2 * 2 * 2
    assert not any(b.requires_grad for m in model.modules() if isinstance(m, moe.NF4Experts) for b in m.buffers())
    shape = get_shape(str(folders[name]))
    assert sum(p.numel() for p in trainable.values()) == (
        shape.lora_params(cfg.lora_r, cfg.lora_target_modules) + sum(expert_lora_matrices(shape, cfg)))

    packed = [m.packed.clone() for m in model.modules() if isinstance(m, moe.NF4Experts)]
    torch.manual_seed(5)
    with torch.no_grad():
        for m in loras:
            m.lora_B["default"].weight.normal_(std=0.05)
    model.train()
    ids = _ids(2)
    grouped_loss, grouped = _loss_and_grads(model, moe.GROUPED, ids)
    loop_loss, loop = _loss_and_grads(model, moe.LOOP, ids)
    assert torch.isfinite(torch.tensor(grouped_loss))
    assert grouped_loss == pytest.approx(loop_loss, rel=2e-3)
    experts = [n for n in grouped if ".experts." in n]
    assert len(experts) == 8 and all(grouped[n].abs().max() > 0 for n in experts)
    for n in grouped:
        scale = grouped[n].abs().max().item()
        torch.testing.assert_close(grouped[n], loop[n], rtol=0, atol=0.03 * scale + 1e-6, msg=n)

    model.get_base_model().set_experts_implementation(moe.GROUPED)
    start = {n: trainable[n].detach().clone() for n in experts}
    opt = torch.optim.AdamW(list(trainable.values()), lr=1e-2)
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        assert torch.isfinite(loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert [n for n in experts if torch.equal(trainable[n], start[n])] == []
    assert all(torch.equal(a, m.packed) for a, m in zip(packed, (m for m in model.modules()
                                                               if isinstance(m, moe.NF4Experts))))


def test_dropout_is_allowed_on_4bit_experts_and_acts_on_the_experts_rows(folders):
    """lora_dropout with lora_experts is refused only on 16-bit experts (peft's ParamWrapper); on 4-bit experts the
    experts' LoRA drops its input rows in training (two training forwards differ) and not in eval."""
    from core.config.settings import config_problems
    from core.levers import experts as moe
    from core.model.load import load_model, prepare_for_training

    folder = folders["qwen3_moe"]
    assert not [p for p in config_problems(_cfg(folder, lora_experts=True, lora_dropout=0.05))
                if p.field == "lora_experts"]
    assert ("lora_experts", "problem.lora_experts_dropout") in {
        (p.field, p.key) for p in config_problems(_cfg(folder, lora_experts=True, lora_dropout=0.05,
                                                      load_in_4bit=False))}
    cfg = _cfg(folder, lora_experts=True, lora_dropout=0.5, upcast_to_fp32=False,
               lora_target_modules=["q_proj"])
    model = prepare_for_training(load_model(cfg, str(folder)), cfg)
    for m in _expert_lora(model):
        assert m.lora_dropout["default"].p == 0.5
        with torch.no_grad():
            m.lora_B["default"].weight.normal_(std=0.05)
    # only the experts' LoRA can make two forwards differ: q_proj's B stays zero
    for how in (moe.GROUPED, moe.LOOP):
        model.get_base_model().set_experts_implementation(how)
        ids = _ids(3)
        model.train()
        with torch.no_grad():
            a, b = model(input_ids=ids).logits, model(input_ids=ids).logits
        assert not torch.allclose(a, b), how
        model.eval()
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)


@pytest.fixture(scope="module")
def trained(folders, tmp_path_factory):
    """A QLoRA run of the product path with lora_experts and dropout, a high learning rate so the experts' LoRA
    matters: (its config, its adapter folder)."""
    from core.train.recipe import run_training

    tmp = tmp_path_factory.mktemp("lora4run")
    cfg = _cfg(folders["qwen3_moe"], tmp, lora_experts=True, lora_dropout=0.05, learning_rate=0.2, max_steps=3)
    events = []
    result = run_training(cfg, sink=events.append)
    assert result.status == "completed", result.message
    assert result.summary["lora_parameters"] == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    return cfg, Path(result.adapter_dir)


def _peft_layout(folder: Path, r: int) -> dict[str, tuple[int, ...]]:
    """The expert LoRA keys and shapes peft itself writes for target_parameters on the bf16 model at `folder`."""
    from peft import LoraConfig, get_peft_model
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=r, target_modules=["q_proj"], target_parameters=[
        "mlp.experts.gate_up_proj", "mlp.experts.down_proj"]))
    out = folder.parent / "peft_own"
    model.save_pretrained(out)
    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if ".experts." in k}


def test_the_adapter_is_saved_in_peft_layout_and_try_it_and_merge_answer_as_peft_does(trained, folders, tmp_path):
    """The saved adapter: peft's own keys and shapes for LoRA on 3-D weights (r x experts rows), target_parameters,
    lora_dropout 0; adapter_problem accepts it. peft's PeftModel.from_pretrained on the bf16 base whose weights are
    the 4-bit model's dequantized values (every Linear4bit and expert: what the 4-bit model computes with) gives the
    logits of Try it's model (memtune's loader: the adapter back on the 4-bit experts), and so does the merged model
    (the LoRA merged into the dequantized experts). The experts' LoRA matters: without it the logits move by far
    more than those tolerances. Measured: 0.016 (peft) and 0.012 (merge) of
    logits up to 1.08; the experts' LoRA moves them by 2.08."""
    from peft import PeftModel
    from safetensors import safe_open

    from core.export.adapter import dequantize_4bit_linears, merge_adapter
    from core.infer import adapter_problem
    from core.levers.experts import dequantize_experts
    from core.model.load import load_model, load_with_adapter

    cfg, adapter = trained
    settings = json.loads((adapter / "adapter_config.json").read_text())
    assert sorted(settings["target_parameters"]) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    assert settings["lora_dropout"] == 0.0
    with safe_open(str(adapter / "adapter_model.safetensors"), framework="pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if ".experts." in k}
        b = f.get_tensor("base_model.model.model.layers.0.mlp.experts.lora_B.weight")
    assert saved == _peft_layout(folders["qwen3_moe"], cfg.lora_r)
    assert b.abs().max() > 0  # trained
    assert adapter_problem(adapter) is None

    ids = _ids(4)
    cfg = cfg.replace(upcast_to_fp32=False)  # bf16 throughout, as the merge and the bf16 base peft loads onto
    tried = load_with_adapter(cfg, adapter, str(folders["qwen3_moe"]))
    with torch.no_grad():
        try_it = tried(input_ids=ids).logits.float()
        with tried.disable_adapter():
            base = tried(input_ids=ids).logits.float()
        for m in _expert_lora(tried):
            m.lora_B["default"].weight.zero_()
        no_experts = tried(input_ids=ids).logits.float()
    tol = 3e-2 * try_it.abs().max().item()  # bf16 rounding: peft adds B A to W in bf16, memtune x B A apart
    assert (try_it - no_experts).abs().max() > 10 * tol and (try_it - base).abs().max() > 10 * tol

    plain = load_model(cfg, str(folders["qwen3_moe"]))
    dequantize_4bit_linears(plain)
    assert dequantize_experts(plain) == 4
    peft_model = PeftModel.from_pretrained(plain, str(adapter)).eval()
    with torch.no_grad():
        by_peft = peft_model(input_ids=ids).logits.float()
    torch.testing.assert_close(by_peft, try_it, rtol=0, atol=tol)

    merged = merge_adapter(adapter, tmp_path / "merged")
    from transformers import AutoModelForCausalLM

    merged_model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.bfloat16).eval()
    assert not any(".lora" in n for n, _ in merged_model.named_parameters())
    with torch.no_grad():
        by_merge = merged_model(input_ids=ids).logits.float()
    torch.testing.assert_close(by_merge, try_it, rtol=0, atol=tol)


def test_adapter_problem_takes_r_x_experts_rows_only_on_target_parameters(tmp_path):
    """adapter_problem: a LoRA matrix of a 3-D weight (adapter_config.json's target_parameters, peft's nested
    ParamWrapper keys) has r x experts rows; any other matrix with other than r rows is still refused."""
    from safetensors.torch import save_file

    from core.infer import adapter_problem

    r, experts = 4, 8
    tensors = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(r, 16),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(16, r),
               "base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight": torch.zeros(r * experts, 16),
               "base_model.model.model.layers.0.mlp.experts.base_layer.lora_B.weight": torch.zeros(32, r * experts),
               "base_model.model.model.layers.0.mlp.experts.lora_A.weight": torch.zeros(r * experts, 16),
               "base_model.model.model.layers.0.mlp.experts.lora_B.weight": torch.zeros(16, r * experts)}
    save_file(tensors, str(tmp_path / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": r, "lora_alpha": 8, "target_modules": ["q_proj"],
              "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    assert adapter_problem(tmp_path) is None
    config["target_parameters"] = None  # the same rows without target_parameters: another rank
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    assert adapter_problem(tmp_path) is not None


def test_the_estimate_counts_expert_lora_without_peft_s_whole_weight_on_4bit_experts():
    """lora_experts on a 12-layer Qwen3-30B-A3B shape in 4 bits: the estimate adds the experts' LoRA parameters and
    grads (bf16 under TRL's cast of a quantized model's adapters) and their optimizer state, and a few routed rows'
    LoRA activations; not peft's 16-bit W + BA of a whole layer's experts (the 4-bit path never makes it)."""
    from core.config.presets import apply_preset
    from core.config.settings import TrainConfig
    from core.estimate.terms import GIB, single_gpu_terms
    from core.model.shapes import CONFIGS as HUB, ModelShape

    shape = ModelShape.from_config({**HUB["Qwen/Qwen3-30B-A3B"], "num_hidden_layers": 12})
    cfg = apply_preset(TrainConfig(model="q12"), "lowest_memory").replace(validation_share=0.0)
    assert cfg.load_in_4bit
    off = single_gpu_terms(cfg, shape)
    on = single_gpu_terms(cfg.replace(lora_experts=True, lora_dropout=0.0), shape)
    n = shape.expert_lora_params(cfg.lora_r)
    assert n > 0 and on.lora - off.lora == 2 * 2 * n
    assert on.optimizer > off.optimizer
    layer_experts = 2 * shape.expert_weight_params // shape.moe_layers  # peft's W + BA of one layer, bf16
    grown = (on.activations + on.temporaries) - (off.activations + off.temporaries)
    assert 0 < grown < layer_experts / 10, grown / GIB
    # with dropout each routed row's dropped input too (k copies of the hidden state and of the expert activation)
    dropped = single_gpu_terms(cfg.replace(lora_experts=True, lora_dropout=0.05), shape)
    assert dropped.activations + dropped.temporaries > on.activations + on.temporaries


def test_a_checkpoint_holds_the_experts_lora_and_peft_s_load_adapter_restores_it(folders, tmp_path):
    """A Trainer checkpoint is peft's save_pretrained of the training model: the experts' LoRA (a peft tuner layer)
    is in it under memtune's own keys, and peft's load_adapter (what the Trainer's resume calls) puts it back into a
    freshly prepared model; an init_adapter (peft's layout) loads through expert_lora.from_peft the same way."""
    from peft import load_peft_weights, set_peft_model_state_dict

    from core.levers import expert_lora
    from core.model.load import load_model, prepare_for_training

    cfg = _cfg(folders["olmoe"], lora_experts=True, lora_dropout=0.0, upcast_to_fp32=False)
    trained = prepare_for_training(load_model(cfg, str(folders["olmoe"])), cfg)
    torch.manual_seed(7)
    with torch.no_grad():
        for m in _expert_lora(trained):
            m.lora_B["default"].weight.normal_(std=0.05)
    want = {n: p.detach().clone() for n, p in trained.named_parameters() if ".experts." in n}
    trained.save_pretrained(tmp_path / "checkpoint")
    assert any(".lora.lora_A." in k for k in load_peft_weights(str(tmp_path / "checkpoint")))

    fresh = prepare_for_training(load_model(cfg, str(folders["olmoe"])), cfg)
    fresh.load_adapter(str(tmp_path / "checkpoint"), adapter_name="default", is_trainable=True)
    got = dict(fresh.named_parameters())
    assert all(torch.equal(got[n], want[n]) for n in want)

    expert_lora.to_peft_files(trained, tmp_path / "checkpoint")  # now the layout a run's adapter is saved in
    fresh = prepare_for_training(load_model(cfg, str(folders["olmoe"])), cfg)
    result = set_peft_model_state_dict(fresh, expert_lora.from_peft(
        fresh, load_peft_weights(str(tmp_path / "checkpoint"))))
    assert not result.unexpected_keys
    got = dict(fresh.named_parameters())
    assert all(torch.equal(got[n], want[n]) for n in want)
