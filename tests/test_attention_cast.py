"""memtune's varlen attention casts fp32 q/k/v to the compute dtype before FlashAttention (issue 41), as transformers'
own FlashAttention wrapper does (integrations.flash_attention.get_target_dtype), so LayerNorm families on a 4-bit base
keep FlashAttention per packed row instead of SDPA with a [T, T] mask, and packed rows still equal rows run alone.

The CPU stands in for CUDA as core/estimate/measure.py does: `_CudaAutocastStandIn` makes LayerNorm compute in fp32
and the frozen linears return their input's dtype (bitsandbytes' 4-bit contract), under CPU autocast; a reference
varlen kernel (per-row softmax, as FlashAttention defines it) replaces torch's CUDA-only one.
"""

from __future__ import annotations

import pytest
import torch

from core.estimate.measure import _CudaAutocastStandIn
from core.model import attention as varlen
from tests import families_any

ROWS = (5, 9, 7)


def _kernel(dtypes: list):
    """torch.nn.attention.varlen.varlen_attn's contract (torch 2.13 signature) computed row by row on the CPU; it
    refuses fp32 as FlashAttention does, and records the dtype it was given."""
    def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1),
                    enable_gqa=False):
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise AssertionError(f"FlashAttention got {q.dtype}")
        dtypes.append(q.dtype)
        if enable_gqa:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out = []
        for s, e in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
            qi, ki, vi = (t[s:e].transpose(0, 1).float() for t in (q, k, v))
            scores = qi @ ki.transpose(1, 2) * (scale if scale is not None else qi.shape[-1] ** -0.5)
            n = e - s
            i, j = torch.arange(n)[:, None], torch.arange(n)[None]
            keep = (j <= i) & ((window_size[0] < 0) | (i - j <= window_size[0]))
            out.append((scores.masked_fill(~keep, float("-inf")).softmax(-1) @ vi).transpose(0, 1).to(q.dtype))
        return torch.cat(out)
    return varlen_attn


def _rows():
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(3, families_any.VOCAB, (1, n), generator=g) for n in ROWS]
    return rows, torch.cat(rows, 1), torch.cat([torch.arange(n) for n in ROWS])[None]


def _logits(m, rows, packed, pos, autocast: bool):
    """(packed logits, the rows run one at a time), under CUDA's dtypes as stood in on the CPU."""
    with (torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
          _CudaAutocastStandIn(m, torch.bfloat16, four_bit=True)):
        got = m(input_ids=packed, position_ids=pos, use_cache=False).logits[0].float()
        alone = torch.cat([m(input_ids=r, position_ids=torch.arange(r.shape[1])[None], use_cache=False).logits[0]
                           for r in rows]).float()
    return got, alone


def _calls(before: dict) -> dict:
    return {k: varlen.VARLEN_CALLS[k] - before[k] for k in ("varlen", "sdpa", "cast")}


@pytest.mark.parametrize("name", ["starcoder2", "gpt_neox"])
def test_fp32_qkv_of_a_layernorm_family_run_flashattention_per_row(name, monkeypatch):
    torch.manual_seed(0)
    dtypes: list = []
    monkeypatch.setattr(varlen, "_varlen_kernel", lambda: _kernel(dtypes))
    monkeypatch.setattr(varlen, "_varlen_device", lambda t: True)
    ref = families_any.model(name)  # fp32 weights: the LayerNorm and the frozen linears' dtypes come from the stand-in
    m = families_any.model(name)
    varlen.use_varlen_attention(m)
    rows, packed, pos = _rows()
    before = dict(varlen.VARLEN_CALLS)
    got, alone = _logits(m, rows, packed, pos, autocast=True)
    layers = m.config.num_hidden_layers
    # every layer of the packed forward and of each row alone: cast to bf16, then the kernel; never SDPA's mask
    assert _calls(before) == {"varlen": layers * (1 + len(rows)), "sdpa": 0, "cast": layers * (1 + len(rows))}
    assert set(dtypes) == {torch.bfloat16}
    assert torch.equal(got, alone)  # packed rows equal the rows run alone, bit for bit
    # and they are the model's own (eager) attention of each row, to bf16 precision
    with (torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16),
          _CudaAutocastStandIn(ref, torch.bfloat16, four_bit=True)):
        eager = torch.cat([ref(input_ids=r, use_cache=False).logits[0] for r in rows]).float()
    assert ((got - eager).abs().max() / eager.abs().max()).item() < 2e-2


def test_an_fp32_model_without_autocast_stays_fp32(monkeypatch):
    """fp32 meant (no autocast, fp32 weights): nothing is cast; SDPA with the row mask computes in fp32, exactly."""
    dtypes: list = []
    monkeypatch.setattr(varlen, "_varlen_kernel", lambda: _kernel(dtypes))
    monkeypatch.setattr(varlen, "_varlen_device", lambda t: True)
    m = families_any.model("starcoder2")
    varlen.use_varlen_attention(m)
    rows, packed, pos = _rows()
    before = dict(varlen.VARLEN_CALLS)
    got, alone = _logits(m, rows, packed, pos, autocast=False)
    assert _calls(before) == {"varlen": 0, "sdpa": m.config.num_hidden_layers * (1 + len(rows)), "cast": 0}
    assert not dtypes and got.dtype == torch.float32
    assert ((got - alone).abs().max() / alone.abs().max()).item() < 1e-5


def test_the_cpu_path_is_unchanged():
    """No FlashAttention (the CPU): fp32 q/k/v go to SDPA with the row mask as they are, not cast."""
    m = families_any.model("gpt_neox")
    varlen.use_varlen_attention(m)
    rows, packed, pos = _rows()
    before = dict(varlen.VARLEN_CALLS)
    got, alone = _logits(m, rows, packed, pos, autocast=True)
    assert _calls(before) == {"varlen": 0, "sdpa": m.config.num_hidden_layers * (1 + len(rows)), "cast": 0}
    assert ((got - alone).abs().max() / alone.abs().max()).item() < 2e-2
