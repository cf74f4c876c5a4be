"""4-bit MoE experts computed in grouped matrix products (core/levers/experts.py `nf4_grouped_experts_forward`) against
the one-expert-at-a-time reference (`nf4_experts_forward`): the same loss and the same gradient of every trainable
parameter on tiny real-family models, no 16-bit copy of the experts kept for backward, the groups as planned.

Exactness is checked in fp32 compute (precision fp32, no upcast): both paths dequantize the same NF4 values, so what
differs is only the order of fp32 additions (a token's k copies summed, the grouped product's own loop), well under
1e-5 relative; bf16 would hide a wrong expert or a wrong row behind its rounding.
"""

from __future__ import annotations

import pytest
import torch

from core.levers import grouping
from tests.test_moe import WHOLE_BLOCKS, _build, _cfg, families_vocab
from tests.helpers import tiny_model_folder

# DeepSeek-V3's tiny config (tests/families_any.py) with expert widths of whole 64-value blocks (tests/test_moe.py)
DEEPSEEK_V3 = dict(model_type="deepseek_v3", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                   num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=64, n_routed_experts=4,
                   num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
                   q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rope_interleave=True,
                   vocab_size=512, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                   tie_word_embeddings=False)
FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss", "olmoe", "deepseek_v3")


def _folder(name: str, root):
    if name == "deepseek_v3":
        return _build_raw(DEEPSEEK_V3, root / name)
    return _build(name, root / name, **WHOLE_BLOCKS.get(name, {}))


def _build_raw(values: dict, folder):
    from transformers import AutoConfig

    values = dict(values)
    return tiny_model_folder(AutoConfig.for_model(values.pop("model_type"), **values), folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_grouped")
    return {name: _folder(name, root) for name in FAMILIES}


def _loss_and_grads(model, ids) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("chunk", [None, 3])
@pytest.mark.parametrize("name", FAMILIES)
def test_grouped_experts_equal_the_one_at_a_time_path(name, chunk, folders, monkeypatch):
    """The grouped path is the default where transformers has a grouped product (here, its CPU fallback), the log
    says so, and the loss and every LoRA gradient (the attention's, which reach back through both layers' experts)
    equal the one-expert-at-a-time path's on the same batch; also where the memory budget splits a layer's experts
    into chunks (`chunk` experts each), whose rows start wherever the routing put them."""
    from core.levers import experts as moe
    from core.model.load import load_model, prepare_for_training

    monkeypatch.delenv(grouping.CHOICE, raising=False)
    if chunk:
        monkeypatch.setattr(moe, "chunks", lambda n, one: grouping.chunks(n, one, budget=chunk * one))
    cfg = _cfg(folders[name], precision="fp32", upcast_to_fp32=False, lora_dropout=0.0)
    model = prepare_for_training(load_model(cfg, str(folders[name])), cfg)
    assert model.config._experts_implementation == moe.GROUPED
    assert model.memtune_moe_notes[0].key == "log.moe.experts_4bit_grouped"
    calls = []
    product = moe._grouped_product
    monkeypatch.setattr(moe, "_grouped_product", lambda *a, **k: calls.append(k["transposed"]) or product(*a, **k))
    ids = torch.randint(3, families_vocab(), (2, 24), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(4)
    for n, p in model.named_parameters():  # B nonzero, as after a step: A gets its gradient too
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    model.train()

    grouped_loss, grouped = _loss_and_grads(model, ids)
    assert calls.count(False) >= 2 * len(moe.experts_modules(model)) and True in calls  # forward and backward ran
    calls.clear()
    model.set_experts_implementation(moe.LOOP)
    loop_loss, loop = _loss_and_grads(model, ids)
    assert calls == []  # the reference did not go through the grouped product

    assert grouped_loss == pytest.approx(loop_loss, rel=1e-6)
    assert grouped.keys() == loop.keys() and len(loop) >= 8
    for n, g in loop.items():
        assert g.abs().max() > 0, n
        torch.testing.assert_close(grouped[n], g, rtol=1e-4, atol=1e-5 * g.abs().max().item(), msg=n)


def test_grouped_experts_keep_no_dequantized_weight_for_backward(folders):
    """Between forward and backward the grouped path holds only activations: nothing autograd saves is 3-D (a
    dequantized experts weight is [experts, out, in]) and all it saves together is smaller than one expert's 16-bit
    weight (a few tokens, wide experts). Backward still gives the input its gradient, dequantizing again."""
    from core.levers import experts as moe
    from core.model.load import load_model

    path = folders["qwen3_moe"]
    model = load_model(_cfg(path, precision="fp32", upcast_to_fp32=False), str(path))
    model.set_experts_implementation(moe.GROUPED)
    layer = model.model.layers[0].mlp
    hidden = torch.randn(1, 5, model.config.hidden_size, requires_grad=True)
    index = torch.tensor([[0, 5], [2, 5], [7, 1], [0, 3], [6, 5]])  # 5 tokens, top-2 of 8 experts
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.numel() * t.element_size()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer.experts(hidden.view(-1, hidden.shape[-1]), index, torch.softmax(torch.randn(5, 2), dim=-1))
    rows, cols = layer.experts.gate_up_proj.out_in
    assert not [s for s, _ in saved if len(s) == 3], saved
    assert sum(b for _, b in saved) < rows * cols * 2, saved
    out.sum().backward()
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0


def test_chunks_are_fixed_by_the_shapes_within_the_budget():
    from core.levers.grouping import chunks

    assert chunks(6, expert_bytes=10, budget=100) == [(0, 6)]
    assert chunks(6, expert_bytes=10, budget=25) == [(0, 2), (2, 4), (4, 6)]
    assert chunks(5, expert_bytes=10, budget=30) == [(0, 3), (3, 5)]
    assert chunks(3, expert_bytes=10, budget=1) == [(0, 1), (1, 2), (2, 3)]


def test_group_bytes_is_the_largest_buffer_the_chunks_dequantize():
    from core.levers.grouping import chunks, group_bytes

    # Qwen3-30B-A3B's gate_up (768 MiB in bf16): one chunk within 1 GiB, chunks of 85 experts within 512 MiB
    assert group_bytes(128, 1536 * 2048, 2, budget=2**30) == 128 * 1536 * 2048 * 2
    assert group_bytes(128, 1536 * 2048, 2, budget=512 * 2**20) == 85 * 1536 * 2048 * 2
    largest = max(stop - start for start, stop in chunks(128, 1536 * 2048 * 2, budget=512 * 2**20))
    assert largest * 1536 * 2048 * 2 == group_bytes(128, 1536 * 2048, 2, budget=512 * 2**20)


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("layout", [(6, 128, 64, False), (4, 64, 192, True), (3, 96, 40, False)])
def test_a_group_dequantizes_to_each_experts_own_values(nested, layout):
    """One bitsandbytes call per chunk gives every expert exactly its own dequantized values, double-quantized or
    not, whole blocks of 256 absmax or not (96 x 40 / 64 = 60), any run of experts, either family layout."""
    from core.levers.experts import NF4Experts

    experts, a, b, transposed = layout
    torch.manual_seed(0)
    q = NF4Experts(torch.randn(experts, a, b, dtype=torch.bfloat16), transposed, "nf4", nested, torch.float32)
    for start, stop in ((0, 3), (0, experts), (1, experts), (experts - 1, experts)):
        got = q.dequantize_group(start, stop, torch.float32)
        own = torch.stack([q.dequantize(e).float() for e in range(start, stop)])
        assert torch.equal(got, own.transpose(-2, -1) if transposed else own)


def test_the_environment_chooses_the_one_at_a_time_path(folders, monkeypatch):
    from core.levers import experts as moe
    from core.model.load import load_model

    monkeypatch.setenv(grouping.CHOICE, "loop")
    path = folders["olmoe"]
    model = load_model(_cfg(path, upcast_to_fp32=False), str(path))
    assert model.config._experts_implementation == moe.LOOP
    assert model.memtune_moe_notes[0].key == "log.moe.experts_4bit"


def test_the_estimate_counts_the_group_the_grouped_path_dequantizes(monkeypatch):
    """Qwen3-30B-A3B under lowest_memory: the transient of 4-bit experts is a group of a layer's experts (gate_up:
    85 experts x 1536 x 2048 in bf16 within 512 MiB) on the grouped path, one expert's weight on the loop."""
    from core.config.presets import apply_preset
    from core.config.settings import TrainConfig
    from core.estimate.terms import experts_transient
    from core.model.shapes import get_shape

    shape = get_shape("Qwen/Qwen3-30B-A3B")
    cfg = apply_preset(TrainConfig(model="Qwen/Qwen3-30B-A3B"), "lowest_memory")
    monkeypatch.delenv(grouping.CHOICE, raising=False)
    assert experts_transient(cfg, shape, 2) == 85 * 1536 * 2048 * 2 <= grouping.GROUP_BYTES
    monkeypatch.setenv(grouping.CHOICE, "loop")
    assert experts_transient(cfg, shape, 2) == 1536 * 2048 * 2
    assert experts_transient(cfg.replace(load_in_4bit=False), shape, 2) == 0


@pytest.mark.parametrize("name", ["moe4", "moe4smoke"])
def test_the_gpu_plan_pairs_each_model_loop_against_grouped(name, tmp_path):
    """bench/product_plans.py moe4: every row a setting the CLI accepts; each pair the same preset, settings, model
    and steps' logging, differing only in how the experts compute; every architecture known to bench/archs.py."""
    from bench.archs import ARCHS
    from bench.product_plans import GROUPED_PAIRS, plan
    from tests.test_bench_plans import test_every_row_is_a_setting_the_cli_accepts

    test_every_row_is_a_setting_the_cli_accepts(name, tmp_path)
    rows = {v.name: v for v in plan(name)}
    for tag in GROUPED_PAIRS:
        loop, grouped = rows[f"{tag}-lowest_memory-loop"], rows[f"{tag}-lowest_memory-grouped"]
        assert (loop.preset, loop.sets, loop.arch) == (grouped.preset, grouped.sets, grouped.arch)
        assert "logging_steps=1" in loop.sets
        assert (loop.env, grouped.env) == ({"MEMTUNE_EXPERTS": "loop"}, {"MEMTUNE_EXPERTS": "grouped"})
    assert all(not v.arch or v.arch in ARCHS for v in rows.values())


def test_the_plans_verdict_says_pass_and_fail_per_check(tmp_path):
    import json

    from bench.product_plans import grouped_verdict

    def row(name, losses, speed, est=None, nvml=None):
        folder = tmp_path / name
        folder.mkdir()
        key = "log.moe.experts_4bit_grouped" if name.endswith("grouped") else "log.moe.experts_4bit"
        (folder / "events.jsonl").write_text(json.dumps({"kind": "log", "key": key}) + "\n")
        return {"name": name, "rc": 0, "first_losses": losses, "steady_tokens_per_s": speed,
                "estimate_nvml_gib": est, "nvml_peak_gib": nvml}

    rows = [row("olmoe-lowest_memory-loop", [11.0, 10.5], 500.0),
            row("olmoe-lowest_memory-grouped", [11.01, 10.5], 4000.0, est=6.0, nvml=6.2),
            row("qwen3-12l-lowest_memory-loop", [12.0], 600.0),
            row("qwen3-12l-lowest_memory-grouped", [12.5], 3000.0, est=9.0, nvml=7.0),
            row("llama8b-lowest_memory", [1.0], 1500.0)]
    lines = grouped_verdict({"rows": rows}, tmp_path)
    assert "PASS first loss olmoe" in "\n".join(lines) and "FAIL first loss qwen3-12l" in "\n".join(lines)
    assert any(x.startswith("PASS estimate olmoe-lowest_memory-grouped") for x in lines)
    assert any(x.startswith("FAIL estimate qwen3-12l-lowest_memory-grouped") for x in lines)
    assert any(x.startswith("PASS log: qwen3-12l-lowest_memory-loop") for x in lines)
    assert any(x.startswith("PASS OLMoE grouped / dense 8B lowest_memory: 2.67x") for x in lines)
    assert not [x for x in lines if x.startswith("FAIL ran")]


@pytest.mark.parametrize("name", ["moe5", "moe5smoke", "moe5b"])
def test_the_no_sync_plans_are_settings_the_cli_accepts(name, tmp_path):
    """bench/product_plans.py moe5 / moe5b: every row a setting the CLI accepts, on an architecture bench/archs.py
    knows; the compile pair differs only in compile_layers."""
    from bench.archs import ARCHS
    from bench.product_plans import plan
    from tests.test_bench_plans import test_every_row_is_a_setting_the_cli_accepts

    test_every_row_is_a_setting_the_cli_accepts(name, tmp_path)
    rows = {v.name: v for v in plan(name)}
    assert all(not v.arch or v.arch in ARCHS for v in rows.values())
    if name == "moe5":
        on, off = rows["olmoe-fastest-grouped"], rows["olmoe-fastest-grouped-nocompile"]
        assert off.sets == [*on.sets, "compile_layers=off"] and on.env == off.env
