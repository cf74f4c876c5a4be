"""The grouped 4-bit experts path (core/levers/experts.py `nf4_grouped_experts_forward`) reads nothing back from the
device in a training step: the experts' row ends stay on the device, the chunks of experts are fixed by the shapes.
A read-back stalls the host until the GPU has caught up, once per MoE layer and pass, and leaves the GPU idle while
the host then launches the layer's next kernels.

On the CPU every read of a tensor's values by the host is recorded in the MoE block's forward and backward: the ops
that make the host wait on CUDA (a scalar read, nonzero, unique, bincount, ...) and `tolist`, which reads a CPU
tensor without an op. On a GPU, torch's own sync debug mode turns any synchronizing call into an error.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Real families scaled down (tests/test_estimate_stored.py's CONFIGS, expert widths of whole 64-value blocks):
# Qwen3-MoE (gated, no bias) and gpt-oss (biases, transposed layout, its own clamped gate).
TINY = dict(num_hidden_layers=1, vocab_size=256, max_position_embeddings=256, bos_token_id=0, eos_token_id=1,
            pad_token_id=2, tie_word_embeddings=False)
FAMILIES = {
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, intermediate_size=96, moe_intermediate_size=64, num_experts=8,
                      num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[]),
    "gpt_oss": dict(model_type="gpt_oss", hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                    intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
}
# aten ops whose CUDA kernels make the host wait for the device (a value read back, or an output sized by the data)
SYNCING = {"_local_scalar_dense", "item", "nonzero", "nonzero_static", "masked_select", "_unique", "_unique2",
           "unique_dim", "unique_consecutive", "bincount", "repeat_interleave", "equal", "is_nonzero",
           "_assert_async"}


def _moe_block(name: str, device: str, compute: torch.dtype):
    """The MoE block of a one-layer tiny model with its experts in NF4 (as memtune's loader stores them), computing
    through the grouped path."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.levers import experts as moe

    values = {**TINY, **FAMILIES[name]}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(values.pop("model_type"), **values))
    model.to(device=device, dtype=compute)
    for _, module in moe.experts_modules(model):
        for weight in moe.WEIGHTS:
            p = module._parameters.pop(weight, None)
            if p is not None:
                module.add_module(weight, moe.NF4Experts(p.detach(), bool(module.is_transposed), "nf4", True,
                                                         compute))
    moe._register()
    model.set_experts_implementation(moe.GROUPED)
    return model.model.layers[0].mlp, model.config.hidden_size


class _HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in SYNCING:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def _step(block, hidden: torch.Tensor) -> torch.Tensor:
    out = block(hidden)
    out = out[0] if isinstance(out, tuple) else out
    out.float().square().sum().backward()
    return hidden.grad


@pytest.mark.parametrize("chunk", [None, 3])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_grouped_experts_read_nothing_back_from_the_device(name, chunk, monkeypatch):
    """Forward and backward of a MoE block (router and 4-bit experts), with the layer's experts in one chunk or
    split by the memory budget: no op that syncs on CUDA, no tolist, and the input still gets its gradient."""
    from core.levers import experts as moe
    from core.levers import grouping

    if chunk:
        monkeypatch.setattr(moe, "chunks", lambda n, one: grouping.chunks(n, one, budget=chunk * one))
    block, width = _moe_block(name, "cpu", torch.float32)
    hidden = torch.randn(2, 16, width, requires_grad=True)
    tolist = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: tolist.append(tuple(t.shape)) or original(t))
    with _HostReads() as reads:
        grad = _step(block, hidden)
    assert reads.seen == [] and tolist == [], (reads.seen, tolist)
    assert grad is not None and grad.abs().sum() > 0


def test_the_loop_is_what_reads_back():
    """The check can fail: the one-at-a-time reference reads the routed experts' ids back (its Python loop)."""
    from core.levers import experts as moe

    block, width = _moe_block("qwen3_moe", "cpu", torch.float32)
    block.experts.config._experts_implementation = moe.LOOP
    hidden = torch.randn(2, 16, width, requires_grad=True)
    with _HostReads() as reads:
        _step(block, hidden)
    assert reads.seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's sync debug mode needs a CUDA device")
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_on_the_gpu_the_grouped_experts_never_synchronize(name):
    block, width = _moe_block(name, "cuda", torch.bfloat16)
    hidden = torch.randn(4, 64, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    _step(block, hidden)  # bitsandbytes and cuBLAS set up once, outside the check
    hidden.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        grad = _step(block, hidden)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert grad is not None and torch.isfinite(grad).all()


def _llama4_block(grouped: bool):
    """The MoE block of a one-layer tiny Llama-4 (tests/families_any.py's config) with its own experts class in NF4
    as memtune's loader stores them (core/levers/family_experts.py), on the grouped path or the loop."""
    from transformers import AutoModelForCausalLM

    from core.levers import expert_store, family_experts
    from core.levers import experts as moe
    from tests import families_any

    config = families_any.hf_config("llama4_text")
    config.num_hidden_layers, config.no_rope_layers = 1, [1]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # every expert's output well above rounding
    experts = model.model.layers[0].feed_forward.experts
    for weight, (_, transposed) in expert_store.layouts(experts).items():
        p = experts._parameters.pop(weight)
        experts.add_module(weight, moe.NF4Experts(p.detach(), transposed, "nf4", True, torch.float32))
    assert family_experts.use_4bit(model) == 1
    assert family_experts.set_grouped(model, grouped) == grouped
    return model.model.layers[0].feed_forward, config.hidden_size


def test_llama4s_grouped_experts_read_nothing_back_and_equal_its_loop(monkeypatch):
    """Llama-4's own experts class (every token copied to every expert, scaled by its router score) on the grouped
    path: forward and backward of its MoE block read nothing back from the device (its loop reads each expert's
    routed rows with nonzero, once per expert per layer), and give the loop's output and input gradient."""
    results, tolist = {}, []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: tolist.append(tuple(t.shape)) or original(t))
    for grouped in (True, False):
        block, width = _llama4_block(grouped)
        hidden = torch.randn(2, 16, width, generator=torch.Generator().manual_seed(1), requires_grad=True)
        tolist.clear()
        with _HostReads() as reads:
            out = block(hidden)[0]
            out.float().square().sum().backward()
        results[grouped] = out.detach(), hidden.grad, reads.seen + [f"tolist{s}" for s in tolist]
    (out, grad, seen), (loop_out, loop_grad, loop_seen) = results[True], results[False]
    assert seen == [] and any("nonzero" in s for s in loop_seen), (seen, loop_seen)
    assert grad is not None and grad.abs().sum() > 0
    torch.testing.assert_close(out, loop_out, rtol=1e-5, atol=1e-5 * loop_out.abs().max().item())
    torch.testing.assert_close(grad, loop_grad, rtol=1e-5, atol=1e-5 * loop_grad.abs().max().item())
