"""Per-row attention for packed micro-batches (TrainConfig.attention = "varlen"): FlashAttention per packed row.

With padding-free packing, transformers' SDPA path attends over the whole flattened micro-batch under a
block-diagonal mask: attention costs grow with the square of the micro-batch's tokens (a third of the GPU time of
an 8-pack micro-step, bench/RESULTS.md), every layer keeps a [T, T] bias (-1.0 GiB at 4k tokens when gone), and
cuDNN builds a new attention plan for each new micro-batch length. This attention function runs each packed row
on its own with torch.nn.attention.varlen (FlashAttention) instead; anything it cannot take (CPU, padded batches,
dropout, an fp32 model) goes to SDPA with an explicit row-and-padding mask, so results are the same everywhere.
fp32 q/k/v of a 16-bit run (a LayerNorm family under autocast on a 4-bit base) are cast to the compute dtype
first, as transformers' FlashAttention wrapper does (`_target_dtype`).

Every feature of the model's own attention is kept, never dropped (tests/test_families.py compares each family with
its eager attention): the sliding window (Mistral, Gemma, Phi-3) is the kernel's `window_size` or part of the SDPA
mask; a custom scale (Gemma's query_pre_attn_scalar) is the kernel's `scale`, or folded into the queries where the
kernel has none; logit soft-capping (Gemma-2), which neither the varlen kernel nor SDPA can express, runs the
eager computation one packed row at a time (exact; each row's scores only, never the pack's [T, T]). `path_note`
says which path a model gets, for the run log.

`_run_varlen` passes only the arguments the installed signature has (torch 2.10 `is_causal`; 2.11 `window_size`
without `enable_gqa`, so it repeats key/value heads itself; 2.13 `enable_gqa` and `scale`).
"""

from __future__ import annotations

import functools
import inspect
import sys

import torch

VARLEN_ATTENTION = "memtune_varlen"
# which path ran (the benchmark reports it); "cast": calls whose fp32 q/k/v were cast to 16 bits for the kernel
VARLEN_CALLS: dict = {"varlen": 0, "sdpa": 0, "eager_rows": 0, "cast": 0, "error": None}


def _segment_mask(position_ids: torch.Tensor, attention_mask: torch.Tensor | None, q_len: int,
                  sliding_window: int | None = None) -> torch.Tensor:
    """Boolean [batch, 1, q, k] mask: causal, within the row that each packed token belongs to, no padding, and
    (with `sliding_window`) only the last `sliding_window` keys, as transformers' sliding_window_overlay."""
    seg = (position_ids == 0).cumsum(-1)  # row index of every token in the pack
    causal = torch.ones(q_len, q_len, dtype=torch.bool, device=position_ids.device).tril()
    if sliding_window:
        causal = causal & ~torch.ones_like(causal).tril(-sliding_window)  # q - k < sliding_window
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


@functools.lru_cache(maxsize=4)
def _parameters(kernel) -> frozenset:
    """The kernel's argument names, read once per kernel: inspect.signature on every layer's call was host time
    in a host-bound step (bench/RESULTS.md run 25)."""
    return frozenset(inspect.signature(kernel).parameters)


def _run_varlen(q, k, v, cu, max_len: int, scaling: float, sliding_window: int | None = None):
    """torch.nn.attention.varlen.varlen_attn on [tokens, heads, dim] tensors, causal, whatever its signature:
    2.10 (`is_causal`), 2.11 (`window_size`, no `enable_gqa`), 2.13 (`window_size`, `enable_gqa`, `scale`).
    None where the installed kernel cannot express the call (the caller then uses SDPA)."""
    varlen_attn = _varlen_kernel()
    params = _parameters(varlen_attn)
    kwargs = {}
    if "window_size" in params:
        # causal; FlashAttention's left window counts the keys before the query: transformers' q - k < window
        kwargs["window_size"] = (sliding_window - 1 if sliding_window else -1, 0)
    elif "is_causal" in params and not sliding_window:
        kwargs["is_causal"] = True
    else:
        return None
    if "scale" in params:
        kwargs["scale"] = scaling
    elif abs(scaling - q.shape[-1] ** -0.5) > 1e-9:
        q = q * (scaling * q.shape[-1] ** 0.5)  # the kernel scales by 1/sqrt(head_dim): fold the model's scale in
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:  # one key/value head per query head
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kwargs)


def _varlen_device(t: torch.Tensor) -> bool:
    return t.is_cuda  # FlashAttention kernels; tests substitute a reference kernel on the CPU


def _target_dtype(query: torch.Tensor, module) -> torch.dtype | None:
    """The 16-bit dtype fp32 q/k/v are cast to before the kernel, or None (already 16-bit, or fp32 meant).

    CUDA autocast runs LayerNorm in fp32 and bitsandbytes' 4-bit linear returns its input's dtype, so a LayerNorm
    family (StarCoder2, GPT-NeoX) on a 4-bit base hands attention fp32 q/k/v. transformers' own FlashAttention
    wrapper casts them to the autocast dtype (or a quantized model's dtype) with `get_target_dtype` and returns the
    kernel's 16-bit output; this does the same, so those families keep FlashAttention per packed row instead of
    SDPA with a [T, T] mask (3.7 GiB on StarCoder2-3B `fastest`). An fp32 model without autocast stays
    fp32 (SDPA)."""
    if query.dtype != torch.float32:
        return None
    from transformers.integrations.flash_attention import get_target_dtype

    try:
        target = get_target_dtype(query, module)
    except (StopIteration, AttributeError):  # no config or nn.Linear on the module: nothing says which dtype is meant
        return None
    return target if target in (torch.bfloat16, torch.float16) else None


def _eager_rows(module, query, key, value, cu: torch.Tensor, dropout: float, scaling: float,
                sliding_window: int | None, softcap: float | None) -> torch.Tensor:
    """The models' eager attention (transformers' eager_attention_forward: scores * scale, tanh soft-cap, mask,
    softmax in fp32, dropout) over each packed row of a [1, heads, tokens, dim] batch on its own: [1, tokens, heads,
    dim]. Exact where no kernel can express the model, with each row's scores only (sum of L^2, not T^2)."""
    import torch.nn.functional as F

    rep = query.shape[1] // key.shape[1]
    out = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        q, k, v = query[:, :, s:e], key[:, :, s:e], value[:, :, s:e]
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * scaling
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        n = e - s
        keep = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        if sliding_window:
            keep = keep & ~torch.ones_like(keep).tril(-sliding_window)
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        if dropout:
            weights = F.dropout(weights, p=dropout, training=module.training)
        out.append(torch.matmul(weights, v).transpose(1, 2))
    return torch.cat(out, dim=1).contiguous()


def _own_eager(module, query, key, value, attention_mask, dropout, scaling, sliding_window, kwargs: dict):
    """The model's own eager attention (its modeling module's eager_attention_forward: gpt-oss' sinks included),
    on each packed row on its own with that row's causal (and sliding-window) mask, or on a padded batch under the
    row-and-padding mask. Exact wherever the model's eager attention is; each row's scores only."""
    own = getattr(sys.modules[type(module).__module__], "eager_attention_forward")
    kwargs = dict(kwargs)
    position_ids, cu = kwargs.get("position_ids"), kwargs.get("cu_seq_lens_q")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    kwargs.pop("is_causal", None)
    VARLEN_CALLS["eager_rows"] += 1

    def bias(keep: torch.Tensor) -> torch.Tensor:
        return torch.zeros(keep.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~keep, torch.finfo(query.dtype).min)

    packed = query.shape[0] == 1 and attention_mask is None and (cu is not None or position_ids is not None)
    if not packed:
        pos = position_ids if position_ids is not None else torch.arange(query.shape[2], device=query.device)[None]
        keep = _segment_mask(pos.expand(query.shape[0], -1), attention_mask, query.shape[2], sliding_window)
        return own(module, query, key, value, bias(keep), dropout=dropout, scaling=scaling,
                   sliding_window=sliding_window, **kwargs)
    if cu is None:
        cu, _ = _rows_from_position_ids(position_ids)
    out = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        keep = _segment_mask(torch.arange(e - s, device=query.device)[None], None, e - s, sliding_window)
        out.append(own(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], bias(keep), dropout=dropout,
                       scaling=scaling, sliding_window=sliding_window, **kwargs)[0])
    return torch.cat(out, dim=1), None


def _softcap(module, kwargs: dict) -> float | None:
    cap = kwargs.pop("softcap", None)
    return cap if cap is not None else getattr(module, "attn_logit_softcapping", None)


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, sliding_window: int | None = None, **kwargs):
    """transformers attention function: FlashAttention per packed row (cu_seq_lens from TRL's padding-free
    collator, or derived from position ids), so rows never see each other and no N x N mask is built. Anything
    else (CPU, padded batches, dropout, an fp32 model) goes to PyTorch's SDPA with an explicit row-and-padding mask; a
    soft-capped model (Gemma-2) to the eager computation per packed row (module docstring)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    softcap = _softcap(module, kwargs)
    position_ids = kwargs.get("position_ids")
    cu = kwargs.get("cu_seq_lens_q")
    if kwargs.get("s_aux") is not None:  # attention sinks (gpt-oss): no kernel here computes them
        return _own_eager(module, query, key, value, attention_mask, dropout, scaling, sliding_window, kwargs)
    head_dim = query.shape[-1]
    scaling = head_dim ** -0.5 if scaling is None else scaling
    sliding_window = sliding_window or None
    packed = query.shape[0] == 1 and attention_mask is None and (cu is not None or position_ids is not None)
    if packed and softcap is not None:
        if cu is None:
            cu, _ = _rows_from_position_ids(position_ids)
        VARLEN_CALLS["eager_rows"] += 1
        return _eager_rows(module, query, key, value, cu.to(query.device), dropout, scaling, sliding_window,
                           softcap), None
    usable = softcap is None and _varlen_device(query) and packed and dropout == 0.0 and _varlen_kernel() is not None
    if usable:
        target = _target_dtype(query, module)
        if target is not None:  # fp32 q/k/v after an fp32 LayerNorm: FlashAttention runs on 16-bit copies
            query, key, value = (t.to(target) for t in (query, key, value))
            VARLEN_CALLS["cast"] += 1
        usable = query.dtype in (torch.bfloat16, torch.float16) and key.dtype == value.dtype == query.dtype
    if usable:
        if cu is None:
            cu, max_len = _rows_from_position_ids(position_ids)
        else:
            max_len = int(kwargs.get("max_length_q") or cu.diff().max())
        cu = cu.to(device=query.device, dtype=torch.int32)
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [tokens, heads, dim]
        try:
            out = _run_varlen(q, k, v, cu, max_len, scaling, sliding_window)
        except (RuntimeError, TypeError, ValueError) as exc:  # a kernel this GPU/torch lacks: SDPA from now on
            VARLEN_CALLS["error"] = f"{type(exc).__name__}: {exc}"[:300]
            _varlen_kernel.cache_clear()
            globals()["_varlen_kernel"] = lambda: None
            out = None
        if out is not None:
            VARLEN_CALLS["varlen"] += 1
            return out.unsqueeze(0), None  # [1, tokens, heads, dim], as sdpa_attention_forward returns
    if (position_ids is not None or (attention_mask is not None and attention_mask.dim() == 2) or sliding_window
            or softcap is not None):  # the mask is built here (the mask builder handed over a 2-D one, or None)
        pos = position_ids if position_ids is not None else torch.arange(query.shape[2], device=query.device)[None]
        attention_mask = _segment_mask(pos.expand(query.shape[0], -1), attention_mask, query.shape[2],
                                       sliding_window)
    kwargs.pop("is_causal", None)
    if softcap is not None:  # a padded batch of a soft-capped model: the eager computation under the same mask
        from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

        VARLEN_CALLS["eager_rows"] += 1
        bias = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attention_mask, torch.finfo(query.dtype).min)
        return eager_attention_forward(module, query, key, value, bias, dropout=dropout, scaling=scaling,
                                       softcap=softcap)
    VARLEN_CALLS["sdpa"] += 1
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=False if attention_mask is not None else None, **kwargs)


def path_note(config, cuda: bool) -> str:
    """One log line: which computation memtune's varlen attention uses for the model `config` describes."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    cap = getattr(text, "attn_logit_softcapping", None)
    window = getattr(text, "sliding_window", None) if getattr(text, "use_sliding_window", True) is not False else None
    features = [f"sliding window {window}"] if window else []
    if cap is not None:
        return (f"Attention: {getattr(text, 'model_type', 'this model')} soft-caps attention logits at {cap:g}, which "
                "FlashAttention varlen and SDPA cannot express: memtune runs the model's eager attention per packed "
                "row (exact" + (", " + ", ".join(features) if features else "") + ").")
    kernel = "FlashAttention per packed row" if cuda else "SDPA with a per-row mask (no CUDA)"
    return f"Attention: {kernel}" + (f", with the model's {', '.join(features)}" if features else "") + "."


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


