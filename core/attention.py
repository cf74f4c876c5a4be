"""Per-row attention for packed micro-batches (TrainConfig.attention = "varlen"): FlashAttention per packed row.

With padding-free packing, transformers' SDPA path attends over the whole flattened micro-batch under a
block-diagonal mask: attention costs grow with the square of the micro-batch's tokens (a third of the GPU time of
an 8-pack micro-step, bench/RESULTS.md), every layer keeps a [T, T] bias (-1.0 GiB at 4k tokens when gone), and
cuDNN builds a new attention plan for each new micro-batch length. This attention function runs each packed row
on its own with torch.nn.attention.varlen (FlashAttention) instead; anything it cannot take (CPU, padded batches,
dropout, fp32) goes to SDPA with an explicit row-and-padding mask, so results are the same everywhere.

`_run_varlen` passes only the arguments the installed signature has (torch 2.10 `is_causal`; 2.11 `window_size`
without `enable_gqa`, so it repeats key/value heads itself; 2.13 `enable_gqa` and `scale`).
"""

from __future__ import annotations

import functools
import inspect

import torch

VARLEN_ATTENTION = "memtune_varlen"
VARLEN_CALLS: dict = {"varlen": 0, "sdpa": 0, "error": None}  # which path ran (the benchmark reports it)


def _segment_mask(position_ids: torch.Tensor, attention_mask: torch.Tensor | None, q_len: int) -> torch.Tensor:
    """Boolean [batch, 1, q, k] mask: causal, within the row that each packed token belongs to, no padding."""
    seg = (position_ids == 0).cumsum(-1)  # row index of every token in the pack
    causal = torch.ones(q_len, q_len, dtype=torch.bool, device=position_ids.device).tril()
    mask = (seg[:, :, None] == seg[:, None, :]) & causal
    if attention_mask is not None and attention_mask.dim() == 2:
        mask = mask & attention_mask[:, None, :].bool()
    return mask[:, None]


@functools.lru_cache(maxsize=1)
def _varlen_kernel():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


_ROWS_CACHE: list = [None, None, 0]  # position ids tensor -> (cu_seq_lens, longest row): one lookup per forward


def _rows_from_position_ids(position_ids: torch.Tensor):
    """Row boundaries of a pack from its position ids (a row starts where the position is 0). Every layer of one
    forward (and its checkpoint recompute) passes the same tensor, so the device sync happens once per forward."""
    if _ROWS_CACHE[0] is position_ids:
        return _ROWS_CACHE[1], _ROWS_CACHE[2]
    starts = (position_ids[0] == 0).nonzero().flatten()
    cu = torch.cat([starts, starts.new_tensor([position_ids.shape[-1]])]).to(torch.int32)
    max_len = int(cu.diff().max())
    _ROWS_CACHE[:] = [position_ids, cu, max_len]
    return cu, max_len


def _run_varlen(q, k, v, cu, max_len: int, scaling: float):
    """torch.nn.attention.varlen.varlen_attn on [tokens, heads, dim] tensors, causal, whatever its signature:
    2.10 (`is_causal`), 2.11 (`window_size`, no `enable_gqa`), 2.13 (`window_size`, `enable_gqa`, `scale`).
    None where the installed kernel cannot express the call (the caller then uses SDPA)."""
    varlen_attn = _varlen_kernel()
    params = inspect.signature(varlen_attn).parameters
    kwargs = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)  # causal
    elif "is_causal" in params:
        kwargs["is_causal"] = True
    else:
        return None
    if "scale" in params:
        kwargs["scale"] = scaling
    elif abs(scaling - q.shape[-1] ** -0.5) > 1e-9:
        return None  # the kernel would scale by 1/sqrt(head_dim)
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:  # one key/value head per query head
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kwargs)


def _varlen_device(t: torch.Tensor) -> bool:
    return t.is_cuda  # FlashAttention kernels; tests substitute a reference kernel on the CPU


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, **kwargs):
    """transformers attention function: FlashAttention per packed row (cu_seq_lens from TRL's padding-free
    collator, or derived from position ids), so rows never see each other and no N x N mask is built. Anything
    else (CPU, padded batches, dropout, fp32) goes to PyTorch's SDPA with an explicit row-and-padding mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    position_ids = kwargs.get("position_ids")
    cu = kwargs.get("cu_seq_lens_q")
    head_dim = query.shape[-1]
    scaling = head_dim ** -0.5 if scaling is None else scaling
    usable = (_varlen_device(query) and query.shape[0] == 1 and dropout == 0.0 and attention_mask is None
              and query.dtype in (torch.bfloat16, torch.float16) and key.dtype == query.dtype
              and (cu is not None or position_ids is not None) and _varlen_kernel() is not None)
    if usable:
        if cu is None:
            cu, max_len = _rows_from_position_ids(position_ids)
        else:
            max_len = int(kwargs.get("max_length_q") or cu.diff().max())
        cu = cu.to(device=query.device, dtype=torch.int32)
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [tokens, heads, dim]
        try:
            out = _run_varlen(q, k, v, cu, max_len, scaling)
        except (RuntimeError, TypeError, ValueError) as exc:  # a kernel this GPU/torch lacks: SDPA from now on
            VARLEN_CALLS["error"] = f"{type(exc).__name__}: {exc}"[:300]
            _varlen_kernel.cache_clear()
            globals()["_varlen_kernel"] = lambda: None
            out = None
        if out is not None:
            VARLEN_CALLS["varlen"] += 1
            return out.unsqueeze(0), None  # [1, tokens, heads, dim], as sdpa_attention_forward returns
    VARLEN_CALLS["sdpa"] += 1
    if position_ids is not None or (attention_mask is not None and attention_mask.dim() == 2):
        pos = position_ids if position_ids is not None else torch.arange(query.shape[2], device=query.device)[None]
        attention_mask = _segment_mask(pos.expand(query.shape[0], -1), attention_mask, query.shape[2])
    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=False if attention_mask is not None else None, **kwargs)


def use_varlen_attention(model) -> None:
    """Register memtune's varlen attention with transformers and switch `model` to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    _varlen_kernel()  # imported now, while the model loads: ~0.7 s that the first training step paid (profiled)
    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
    # Like FlashAttention: the mask builder hands over the 2-D padding mask (or None) instead of an N x N mask.
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])
    try:
        model.set_attn_implementation(VARLEN_ATTENTION)
    except Exception:  # noqa: BLE001 - older transformers: set it on the config the attention layers read
        model.config._attn_implementation = VARLEN_ATTENTION
    if model.config._attn_implementation != VARLEN_ATTENTION:
        model.config._attn_implementation = VARLEN_ATTENTION


