"""Mixture-of-experts models: their fused 3-D experts stored in 4 bits, their routing loss, LoRA on their experts.

transformers 5 holds each MoE layer's experts as fused 3-D parameters (`experts.gate_up_proj`, `experts.down_proj`,
classes decorated with `use_experts_implementation`: Qwen3MoeExperts, MixtralExperts, OlmoeExperts, GptOssExperts, ...).
bitsandbytes' 4-bit quantizer converts nn.Linear only, so without this lever the experts (most of a MoE model's
weights) stay 16-bit, and fp32 after the chapter's upcast.

- Loading (`quantizing_experts`, around from_pretrained): while the weights are read, each experts module's 3-D
  weight is replaced, the moment transformers sets it, by `NF4Experts`: every expert quantized on its own by
  bitsandbytes' `quantize_4bit` (the config's quant type and double quantization), as a Linear4bit weight would be.
  So at most one layer's one 3-D weight exists in 16 bits at a time, never the whole model. Which weights of which
  families (the interface's, and Llama-4's, DBRX's and JetMoE's own experts classes) is core/levers/expert_store.py's
  rule, which the estimate reads too; the families' own classes compute through core/levers/family_experts.py.
- Training: two forwards registered in transformers' ExpertsInterface, chosen in `finish` (`path`):
  - "memtune_nf4_grouped" (`nf4_grouped_experts_forward`, the default): transformers' grouped layout (tokens sorted
    by expert, one grouped matrix product per weight through transformers' `_grouped_mm`: torch's grouped GEMM on the
    GPU, its fallback loop on the CPU). Each expert's rows end where the GPU says (offsets computed on the device,
    never read back: no host sync in forward or backward). A layer's experts are dequantized in fixed chunks of
    consecutive experts, one bitsandbytes call each (every expert's absmax and double-quant statistics stacked at
    load time so one call covers the chunk), chunks sized to `GROUP_BYTES` (core/levers/grouping.py, torch-free: the
    estimate reads it); a chunk's grouped product reads the rows from its first expert's start on, so it computes
    only its own experts' rows. A custom autograd Function saves nothing of the weight: backward dequantizes the
    same chunks again (the frozen weights need no gradient, the input's is grad @ W). A call with fewer routed rows
    than experts (generation's single tokens) goes through the loop below, which dequantizes only what it uses.
  - "memtune_nf4" (`nf4_experts_forward`, the reference): the family's eager loop over the routed experts, each
    expert's matmul through bitsandbytes' `matmul_4bit` (the Linear4bit path: one expert dequantized at a time).
  `MEMTUNE_EXPERTS=loop` (or `grouped`) in the environment picks one; unset: grouped wherever transformers has its
  grouped product, else the loop. The log's line says which.
- Routing (`routing_note`): the router's load-balancing loss is on exactly when config.json's
  `output_router_logits` says so (TRL's SFTTrainer turns it on whenever `router_aux_loss_coef` is non-zero, so the
  coefficient is set to 0 in memory when the config says off).
- LoRA on experts (`lora_experts`): on 16-bit experts, peft's `target_parameters` on the 3-D weights (peft adds its
  update to the whole 3-D tensor, a parametrization of the parameter); on 4-bit experts, which never hold that
  tensor, per-expert A/B beside each NF4Experts weight (core/levers/expert_lora.py), added to each expert's rows by
  both forwards here (`_with_lora`, `_grouped_with_lora`; a family's own forwards through NF4Experts.product and
  .grouped), saved in peft's layout for those 3-D weights. Llama-4's and JetMoE's own experts classes take it too;
  DBRX's is refused before loading (core/levers/expert_store.py NO_LORA).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, NamedTuple

import torch

from core.config.arguments import bnb_kwargs
from core.config.settings import ConfigError, Problem
from core.levers import expert_store, family_experts
from core.levers.expert_store import WEIGHTS, is_experts  # noqa: F401 - this lever's names for them
from core.levers.grouping import GROUPED, LOOP, chunks, requested


class Note(NamedTuple):
    """A log line of this lever: its key is log.moe.<name> (core/locales), the training recipe emits it as a keyed
    event with `params` (the levers import nothing of memtune but core.config)."""

    name: str
    params: dict[str, Any]

    @property
    def key(self) -> str:
        return f"log.moe.{self.name}"


def _note(key: str, **params: Any) -> Note:
    return Note(key.removeprefix("log.moe."), params)


# WEIGHTS: the 3-D weights of transformers' experts interface (use_experts_implementation): what this lever stores in
# 4 bits, one expert at a time, and what lora_experts puts LoRA on. Which weights of which families are stored in 4
# bits, for the loader here and the estimate alike: core/levers/expert_store.py.


def experts_modules(model) -> list[tuple[str, torch.nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if is_experts(m)]


def lora_modules(model) -> list[tuple[str, torch.nn.Module]]:
    """The experts modules lora_experts adapts: the interface's and the families' own that peft can wrap
    (expert_store.lora_adaptable)."""
    return [(n, m) for n, m in model.named_modules() if expert_store.lora_adaptable(m)]


class NF4Experts(torch.nn.Module):
    """One 3-D experts weight, every expert quantized on its own by bitsandbytes (4-bit, in the (out, in) layout of
    a Linear4bit weight, whatever the family's layout). `packed`: [experts, bytes] uint8; `states`: one bitsandbytes
    QuantState per expert (absmax, double-quant statistics), on the packed weight's device."""

    def __init__(self, weight: torch.Tensor, transposed: bool, quant_type: str, double_quant: bool,
                 compute_dtype: torch.dtype):
        super().__init__()
        import bitsandbytes.functional as bnbf

        experts = int(weight.shape[0])
        self.transposed, self.dtype, self.compute_dtype = transposed, weight.dtype, compute_dtype
        self.shape = tuple(weight.shape)  # the 16-bit parameter's shape (the family's layout)
        packed, self.states = None, []
        for e in range(experts):  # one expert at a time: a 16-bit copy of one expert at most
            w = weight[e].t() if transposed else weight[e]
            q, state = bnbf.quantize_4bit(w.contiguous(), blocksize=64, compress_statistics=double_quant,
                                          quant_type=quant_type, quant_storage=torch.uint8)
            if packed is None:
                packed = torch.empty((experts, q.numel()), dtype=torch.uint8, device=q.device)
            packed[e].copy_(q.view(-1))
            self.states.append(state)
        self.register_buffer("packed", packed)
        self._stacked = _stack_statistics(self.states)
        self._is_hf_initialized = True  # transformers' weight init must not touch it

    @property
    def out_in(self) -> tuple[int, int]:
        """One expert's (out, in): the Linear4bit layout every expert is quantized in."""
        return (self.shape[2], self.shape[1]) if self.transposed else (self.shape[1], self.shape[2])

    def dequantize_group(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """Experts [start, stop) dequantized at once: [stop - start, out, in] in `dtype`, each expert's values exactly
        those its own dequantize (and matmul_4bit) gives. One bitsandbytes call for the group (two with double
        quantization) on views of the stored bytes, where every expert's blocks are whole; else one call per expert."""
        import bitsandbytes.functional as bnbf

        first, (rows, cols), count = self.states[0], self.out_in, stop - start
        if self._stacked is None:  # partial 64-value blocks: experts' data cannot be laid end to end
            return torch.stack([bnbf.dequantize_4bit(self.packed[e].view(-1, 1), self.states[e]).to(dtype)
                                for e in range(start, stop)])
        absmax, absmax2, offset = self._stacked
        if first.nested:  # the absmax are themselves 8-bit blocks of 256 (padded per expert to whole blocks)
            n = first.absmax.numel()
            scale = bnbf.dequantize_blockwise(absmax[start:stop].reshape(-1), absmax=absmax2[start:stop].reshape(-1),
                                              code=first.state2.code, blocksize=first.state2.blocksize)
            scale = scale.view(count, -1)[:, :n] + offset[start:stop, None]
        else:
            scale = absmax[start:stop]
        state = bnbf.QuantState(absmax=scale.reshape(-1).float(), shape=torch.Size((count * rows, cols)),
                                dtype=first.dtype, blocksize=first.blocksize, quant_type=first.quant_type,
                                code=first.code)
        w = bnbf.dequantize_4bit(self.packed[start:stop].reshape(-1, 1), state)
        return w.view(count, rows, cols).to(dtype)

    @property
    def num_experts(self) -> int:
        return self.shape[0]

    def linear(self, x: torch.Tensor, e: int) -> torch.Tensor:
        """x @ W_e^T (the expert's (out, in) weight) through bitsandbytes' matmul_4bit, in the compute dtype."""
        import bitsandbytes as bnb

        return bnb.matmul_4bit(x.to(self.compute_dtype), self.packed[e].view(-1, 1).t(), quant_state=self.states[e])

    def product(self, x: torch.Tensor, e: int) -> torch.Tensor:
        """Expert e's rows x times its weight (`linear`), plus its LoRA term where it has one."""
        return _with_lora(self.linear(x, e), self, x, e)

    def grouped(self, x: torch.Tensor, ends: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Every expert's rows of the expert-sorted x (expert e's ending at ends[e]) times its weight in grouped
        products (`_GroupedNF4`), plus their LoRA terms where the weight has LoRA."""
        return _grouped_with_lora(_GroupedNF4.apply(x, self, ends, dtype), self, x, ends, dtype)

    def dequantize(self, e: int) -> torch.Tensor:
        """Expert e's weight in its 16-bit dtype and the family's layout (what the 3-D parameter held at [e])."""
        import bitsandbytes.functional as bnbf

        w = bnbf.dequantize_4bit(self.packed[e].view(-1, 1), self.states[e]).to(self.dtype)
        return w.t() if self.transposed else w

    def stored_bytes(self) -> int:
        """Bytes held: packed data + every expert's quantization constants (as a Linear4bit weight's)."""
        total = self.packed.numel()
        for s in self.states:
            tensors = [s.absmax, s.code] + ([s.state2.absmax, s.state2.code, s.offset] if s.nested else [])
            total += sum(t.numel() * t.element_size() for t in tensors)
        return total

    def extra_repr(self) -> str:
        return f"{self.shape}, {self.states[0].quant_type} per expert" if self.states else str(self.shape)


def _stack_statistics(states: list) -> tuple | None:
    """Every expert's quantization statistics as rows of one tensor each, so a group of experts dequantizes in one
    call: (absmax [E, n] (uint8, padded to whole blocks of 256 when double-quantized), the second-level absmax
    [E, m] or None, the offsets [E] or None). Each QuantState then holds views of its rows: no memory is added but
    the padding. None where an expert's data ends inside a 64-value block (its packed bytes cannot be concatenated)."""
    first = states[0]
    n = first.absmax.numel()
    if torch.Size(first.shape).numel() % first.blocksize or any(s.absmax.numel() != n for s in states):
        return None
    if not first.nested:
        absmax = torch.stack([s.absmax for s in states])
        for e, s in enumerate(states):
            s.absmax = absmax[e]
        return absmax, None, None
    width = -(-n // first.state2.blocksize) * first.state2.blocksize
    absmax = torch.zeros((len(states), width), dtype=first.absmax.dtype, device=first.absmax.device)
    absmax[:, :n] = torch.stack([s.absmax for s in states])
    absmax2 = torch.stack([s.state2.absmax for s in states])
    offset = torch.stack([torch.as_tensor(s.offset, device=first.absmax.device).reshape(()) for s in states])
    for e, s in enumerate(states):
        s.absmax, s.state2.absmax, s.offset = absmax[e, :n], absmax2[e], offset[e]
    return absmax, absmax2, offset


def nf4_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts interface's eager loop (transformers' own, e.g. Qwen3MoeExperts.forward) over the experts the
    batch routes to, with each expert's weight 4-bit (NF4Experts.linear). Biases, the family's gate (_apply_gate:
    gpt-oss' clamped SwiGLU) and activation are the module's own."""
    out = torch.zeros_like(hidden_states)
    with torch.no_grad():
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    first = self.gate_up_proj if self.has_gate else self.up_proj
    first_bias = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias) if self.has_bias else None
    for e in hit.flatten().tolist():
        if e == self.num_experts:  # expert parallelism's sentinel
            continue
        pos, token = torch.where(mask[e])
        h = _with_lora(first.linear(hidden_states[token], e), first, hidden_states[token], e)
        if first_bias is not None:
            h = h + first_bias[e]
        h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
        h = _with_lora(self.down_proj.linear(h, e), self.down_proj, h, e)
        if self.has_bias:
            h = h + self.down_proj_bias[e]
        if getattr(self, "has_post_expert_norm", False):
            h = self.post_expert_norm(h)
        h = h * top_k_weights[token, pos, None]
        out.index_add_(0, token, h.to(out.dtype))
    return out


LORA = "lora"  # the NF4Experts child holding its LoRA (core/levers/expert_lora.py: ExpertLoRA)


def lora_of(weight: NF4Experts):
    """The LoRA added to this weight's products (its ExpertLoRA child), when it has one and peft's adapters are on;
    else None."""
    lora = weight._modules.get(LORA)
    return lora if lora is not None and lora.active else None


def _with_lora(h: torch.Tensor, weight: NF4Experts, x: torch.Tensor, e: int) -> torch.Tensor:
    """Expert e's product h (of its rows x) plus its LoRA term, when the weight has LoRA."""
    lora = lora_of(weight)
    return h if lora is None else h + lora.expert(x, e, h.dtype)


def _grouped_with_lora(h: torch.Tensor, weight: NF4Experts, x: torch.Tensor, ends: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
    """The grouped product h (of the expert-sorted rows x) plus every expert's LoRA term, when the weight has LoRA."""
    lora = lora_of(weight)
    return h if lora is None else h + lora.grouped(x, ends, dtype)


def _matmul(rows: torch.Tensor, weights: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    from transformers.integrations.moe import _grouped_mm

    if weights.device.type == "cuda" and weights.dtype != torch.bfloat16:  # torch's grouped GEMM is bf16-only on CUDA
        return torch.ops.transformers.grouped_mm_fallback(rows.to(weights.dtype), weights, offs=offsets)
    return _grouped_mm(rows, weights, offs=offsets)


def _grouped_product(x: torch.Tensor, weight: NF4Experts, ends: torch.Tensor, dtype: torch.dtype,
                     transposed: bool) -> torch.Tensor:
    """x @ W_e^T for the rows of each expert e (transposed: x @ W_e, backward's product); expert e's rows end at
    ends[e] (int32, on x's device) of the expert-sorted rows. Rows past ends[-1] are left unwritten. The experts are
    dequantized a chunk at a time; a chunk after the first reads the rows from its first expert's start on (a
    gather whose offsets stay on the device), and its results are written back in place, the rows it does not own
    sent to a spare last row."""
    rows = x.shape[0]
    width = weight.out_in[1 if transposed else 0]
    plan = chunks(weight.num_experts, _expert_bytes(weight, dtype))
    x = x.contiguous()  # torch's grouped GEMM reads row-major inputs
    if len(plan) == 1:
        w = weight.dequantize_group(0, weight.num_experts, dtype)
        return _matmul(x, w if transposed else w.transpose(-2, -1), ends)
    out = x.new_empty((rows + 1, width), dtype=dtype)
    position = torch.arange(rows, device=x.device)
    for start, stop in plan:
        w = weight.dequantize_group(start, stop, dtype)
        first = ends[start - 1] if start else ends.new_zeros(())
        offsets = ends[start:stop] - first
        part = _matmul(x[(position + first).clamp_(max=rows - 1)], w if transposed else w.transpose(-2, -1), offsets)
        del w
        out.index_copy_(0, torch.where(position < offsets[-1], position + first, rows), part.to(dtype))
    return out[:rows]


class _GroupedNF4(torch.autograd.Function):
    """The grouped product with 4-bit experts: forward and backward each dequantize the chunks they need, so no
    16-bit copy of the experts outlives a call. Only the experts' row ends are saved: the weights are frozen (no
    gradient) and the input's gradient needs only the weights."""

    @staticmethod
    def forward(ctx, x, weight, ends, dtype):
        ctx.weight, ctx.dtype, ctx.x_dtype = weight, dtype, x.dtype
        ctx.save_for_backward(ends)
        return _grouped_product(x, weight, ends, dtype, transposed=False)

    @staticmethod
    def backward(ctx, grad):
        (ends,) = ctx.saved_tensors
        dx = _grouped_product(grad, ctx.weight, ends, ctx.dtype, transposed=True)
        return dx.to(ctx.x_dtype), None, None, None


@torch.compiler.disable  # bitsandbytes' calls on NF4Experts (a module argument): eager
def nf4_grouped_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' grouped experts forward (grouped_mm_experts_forward: tokens sorted by expert, one grouped
    product per weight, the k copies of a token summed) with 4-bit weights (`_GroupedNF4`), nothing read back to
    the host. Biases, the family's gate (_apply_gate) and activation are the module's own, as in
    `nf4_experts_forward`; expert parallelism's sentinel rows (ids past the last expert) sort last and are zeroed,
    as transformers does. Fewer routed rows than experts: the loop (`nf4_experts_forward`)."""
    tokens, k = top_k_index.shape
    if tokens * k < self.num_experts:
        return nf4_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    first = self.gate_up_proj if self.has_gate else self.up_proj
    first_bias = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias) if self.has_bias else None
    dtype = first.compute_dtype
    ids, order = torch.sort(top_k_index.reshape(-1), stable=True)
    with torch.no_grad():  # each expert's end in the sorted rows, on the device
        bounds = torch.arange(1, self.num_experts + 1, device=ids.device, dtype=ids.dtype)
        ends = torch.searchsorted(ids, bounds, out_int32=True)
    sentinel = (ids >= self.num_experts)[:, None] if getattr(self, "_is_expert_parallel", False) else None
    if sentinel is not None:
        ids = ids.clamp(max=self.num_experts - 1)
    x = hidden_states[order // k]
    if sentinel is not None:  # its backward zeroes the unwritten rows of the input's gradient
        x = x.masked_fill(sentinel, 0.0)
    h = _grouped_with_lora(_GroupedNF4.apply(x, first, ends, dtype), first, x, ends, dtype)
    if first_bias is not None:
        h = h + first_bias[ids]
    h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
    h = _grouped_with_lora(_GroupedNF4.apply(h, self.down_proj, ends, dtype), self.down_proj, h, ends, dtype)
    if self.has_bias:
        h = h + self.down_proj_bias[ids]
    if sentinel is not None:
        h = h.masked_fill(sentinel, 0.0)
    if getattr(self, "has_post_expert_norm", False):
        h = self.post_expert_norm(h)
    h = h * top_k_weights.reshape(-1)[order, None]
    out = hidden_states.new_empty((tokens * k, hidden_states.shape[-1]))
    out = out.index_copy(0, order, h.to(out.dtype))  # back in token order
    return out.view(tokens, k, -1).sum(dim=1)


def _expert_bytes(weight: NF4Experts, dtype: torch.dtype) -> int:
    rows, cols = weight.out_in
    return rows * cols * torch.empty((), dtype=dtype).element_size()


def grouped_available() -> bool:
    """transformers' grouped product (and its CPU fallback) is there to call."""
    try:
        from transformers.integrations.moe import _grouped_mm  # noqa: F401
    except ImportError:
        return False
    return True


def path() -> str:
    """The experts forward this process uses for 4-bit experts: `MEMTUNE_EXPERTS` (core/levers/grouping.py), grouped
    only where transformers has its grouped product."""
    return GROUPED if requested() == GROUPED and grouped_available() else LOOP


def _register() -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    for name, forward in ((LOOP, nf4_experts_forward), (GROUPED, nf4_grouped_experts_forward)):
        if name not in ALL_EXPERTS_FUNCTIONS:
            ALL_EXPERTS_FUNCTIONS.register(name, forward)


def _experts_classes(config) -> list[type]:
    """The experts classes of the model class transformers builds for `config`, found without building the model:
    those its modeling module decorated with use_experts_implementation, and the family's own experts class where
    core/levers/expert_store.py has a 4-bit route for it (FAMILY)."""
    from transformers import AutoModelForCausalLM

    try:
        model_class = AutoModelForCausalLM._model_mapping[type(config)]
    except (KeyError, AttributeError):
        return []
    module = sys.modules.get(model_class.__module__)
    # use_experts_implementation gives every class it decorates an _apply_gate (its own, or the default SwiGLU)
    return [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, torch.nn.Module)
            and (hasattr(c, "_apply_gate") or c.__name__ in expert_store.FAMILY)]


def _quantized(module: torch.nn.Module, name: str, value, quant_type: str, double_quant: bool,
               compute_dtype: torch.dtype):
    """`value` as NF4Experts where expert_store's rule stores this weight of this module in 4 bits, else None."""
    if not (isinstance(value, torch.Tensor) and value.device.type != "meta" and value.is_floating_point()
            and value.dim() in (2, 3)):
        return None
    layout = expert_store.layouts(module).get(name)
    if layout is None:
        return None
    experts, transposed = layout
    stacked = expert_store.experts_view(value.detach(), experts)
    q = NF4Experts(stacked, transposed, quant_type, double_quant, compute_dtype)
    q.param_shape = tuple(value.shape)  # the family's own shape (DBRX's 2-D stacks), for a merge's restore
    return q


@contextlib.contextmanager
def quantizing_experts(path: str, quant_type: str, double_quant: bool, compute_dtype: torch.dtype,
                       trust_remote_code: bool = False):
    """Around from_pretrained: each experts module's weight (expert_store's rule: the experts interface's 3-D
    weights, a family's own experts class's) is quantized (NF4Experts) the moment transformers sets it from the
    checkpoint (core_model_loading.set_param_for_module's setattr), on the device it was read to. A model without
    experts classes: nothing changes."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        classes = _experts_classes(config)
    except Exception:  # noqa: BLE001 - not a config this transformers knows: load as before
        classes = []
    originals = {}

    def hooked(original):
        def __setattr__(self, name, value):
            q = _quantized(self, name, value, quant_type, double_quant, compute_dtype)
            if q is not None:
                self._parameters.pop(name, None)  # the 16-bit placeholder parameter becomes a submodule
                value = q
            original(self, name, value)
        return __setattr__

    for cls in classes:
        originals[cls] = cls.__dict__.get("__setattr__")
        cls.__setattr__ = hooked(cls.__setattr__)
    # transformers reserves the GPU memory the loaded model will hold before reading it (caching_allocator_warmup,
    # sized by the quantizer's param_element_size): counted as 16-bit, the experts made the loading peak their bf16
    # size (bench/RESULTS.md, run 15). They are stored in 4 bits, and counted so.
    quantizer = _bnb_quantizer_class() if classes else None
    own_size = quantizer.__dict__.get("param_element_size") if quantizer else None
    if quantizer is not None:
        quantizer.param_element_size = _experts_element_size(quantizer.param_element_size, tuple(classes))
    try:
        yield
    finally:
        for cls, original in originals.items():
            if original is None:
                del cls.__setattr__
            else:
                cls.__setattr__ = original
        if quantizer is not None:
            if own_size is None:
                del quantizer.param_element_size
            else:
                quantizer.param_element_size = own_size


def _bnb_quantizer_class():
    try:
        from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer
    except ImportError:  # a transformers without it: nothing to size
        return None
    return Bnb4BitHfQuantizer if hasattr(Bnb4BitHfQuantizer, "param_element_size") else None


def _experts_element_size(original, classes: tuple[type, ...]):
    def param_element_size(self, model, param_name, param):
        path, _, name = param_name.rpartition(".")
        if path and isinstance(module := model.get_submodule(path), classes) and name in expert_store.layouts(module):
            return 0.5  # 4 bits per weight, as the quantizer counts its own Linear4bit weights
        return original(self, model, param_name, param)
    return param_element_size


def finish(model) -> list[Note]:
    """After loading: the quantized experts compute through `path()`'s forward (a family's own experts class:
    core/levers/family_experts.py, grouped where it has a grouped path); the routing loss follows config.json.
    Returns the log's lines (what was quantized, what stays 16-bit, what the routing loss does)."""
    notes = []
    found = experts_modules(model)
    quantized = [m for _, m in found if isinstance(getattr(m, "down_proj", None), NF4Experts)]
    if quantized and len(quantized) != len(found):  # a partial swap would be a model computing two ways: refuse it
        raise RuntimeError(f"{len(quantized)} of {len(found)} experts modules were quantized while loading")
    family = [(n, m) for n, m in model.named_modules() if expert_store.route(m) == expert_store.FAMILY_ROUTE]
    own = [(n, m) for n, m in family if any(isinstance(q, NF4Experts) for q in m.children())]
    if own and len(own) != len(family):
        raise RuntimeError(f"{len(own)} of {len(family)} experts modules were quantized while loading")
    if quantized:
        _register()
        model.memtune_experts_default = model.config._experts_implementation  # what dequantize_experts restores
        how = path()
        model.set_experts_implementation(how)
        first = quantized[0].down_proj
        notes.append(_note("log.moe.experts_4bit_grouped" if how == GROUPED else "log.moe.experts_4bit",
                           layers=len(quantized), experts=first.num_experts, quant=first.states[0].quant_type,
                           gib=sum(stored_bytes(m) for m in quantized) / 2**30))
    elif own:
        family_experts.use_4bit(model)
        grouped = family_experts.set_grouped(model, path() == GROUPED)
        first = next(q for _, m in own for q in m.children() if isinstance(q, NF4Experts))
        notes.append(_note("log.moe.experts_4bit_grouped" if grouped else "log.moe.experts_4bit", layers=_layers(own),
                           experts=first.num_experts, quant=first.states[0].quant_type,
                           gib=sum(stored_bytes(m) for _, m in own) / 2**30))
    elif found or family:
        every = found + family
        weight = next(p for _, m in every for p in m.parameters() if p.is_floating_point())
        notes.append(_note("log.moe.experts_16bit", layers=_layers(every),
                           experts=next(iter(expert_store.layouts(every[0][1]).values()))[0],
                           dtype=str(weight.dtype).removeprefix("torch.")))
    unrouted = expert_store.plan(model).unrouted
    if unrouted:  # several experts in one parameter that no route stores in 4 bits: said, and counted 16-bit
        dtype = model.get_parameter(unrouted[0][0]).dtype
        notes.append(_note("log.moe.experts_unrouted", n=len(unrouted), params=sum(n for _, n in unrouted),
                           names=", ".join(dict.fromkeys(p.rsplit(".", 1)[-1] for p, _ in unrouted)),
                           dtype=str(dtype).removeprefix("torch.")))
    if found or family:
        notes.append(routing_note(model))
    return notes


def _layers(modules: list[tuple[str, torch.nn.Module]]) -> int:
    """Decoder layers holding these experts modules (JetMoE has four per layer: its MLP's two, its attention's two)."""
    def layer(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:next((i + 1 for i, p in enumerate(parts) if p.isdigit()), len(parts))])
    return len({layer(n) for n, _ in modules})


def stored_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's 4-bit experts weights."""
    return sum(m.stored_bytes() for m in module.modules() if isinstance(m, NF4Experts))


def routing_note(model) -> Note:
    """The router's load-balancing loss on or off as config.json's `output_router_logits` says. TRL's SFTTrainer
    enables it whenever the config's `router_aux_loss_coef` is non-zero (and rewrites output_router_logits to
    match), so where config.json says off, the coefficient is set to 0 here and TRL leaves it off."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    coef = float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0)
    on = bool(getattr(config, "output_router_logits", False)) and coef != 0.0
    if hasattr(config, "router_aux_loss_coef") and not on:
        config.router_aux_loss_coef = 0.0
    if on:
        return _note("log.moe.aux_on", coef=coef)
    return _note("log.moe.aux_off")


def quantized(model) -> bool:
    """The model's experts are stored in 4 bits (NF4Experts)."""
    return any(isinstance(m, NF4Experts) for m in model.modules())


def lora_parameters(model, cfg) -> list[str]:
    """The experts weights lora_experts puts LoRA on (peft's target_parameters names), named in the log's lines; a
    model without experts is refused by name (a ConfigError on lora_experts)."""
    names = expert_parameters(model)
    if not names:
        raise ConfigError([Problem.of("lora_experts", "problem.lora_experts_dense", model=cfg.model)])
    notes = getattr(model, "memtune_moe_notes", None)
    if isinstance(notes, list):
        notes.append(_note("log.moe.lora_experts", params=", ".join(names)))
    return names


def summary(model) -> dict:
    """summary.json's words on a MoE model: the experts' weights peft put LoRA on (adapter_config.json's
    target_parameters), and how many experts modules were stored in 4 bits."""
    peft_config = (getattr(model, "peft_config", None) or {}).get("default")
    found = lora_modules(model)
    if not found:
        return {}
    on_4bit = {".".join(n.split(".")[-2:] + [w]) for n, m in found for w in expert_store.layouts(m)
               if isinstance(m._modules.get(w), NF4Experts) and LORA in m._modules[w]._modules}
    return {"lora_parameters": sorted(set(getattr(peft_config, "target_parameters", None) or []) | on_4bit),
            "experts_4bit_layers": _layers([(n, m) for n, m in found
                                            if any(isinstance(q, NF4Experts) for q in m.children())])}


def expert_parameters(model) -> list[str]:
    """peft's target_parameters for LoRA on every adaptable experts module's weights ("mlp.experts.gate_up_proj",
    Llama-4's "feed_forward.experts.down_proj", JetMoE's "mlp.input_linear.weight", ...), 16-bit (3-D) or 4-bit
    (NF4Experts)."""
    names = []
    for name, module in lora_modules(model):
        for w in expert_store.layouts(module):
            p = module._parameters.get(w)
            if isinstance(module._modules.get(w), NF4Experts) or (p is not None and p.dim() == 3):
                suffix = ".".join(name.split(".")[-2:] + [w])
                if suffix not in names:
                    names.append(suffix)
    return names


def dequantize_experts(model) -> int:
    """Replace the model's NF4Experts by 16-bit parameters holding their dequantized values, the family's own
    layout and forward again: the weights the adapter trained against, to merge into (core/export/adapter.py) and
    save as a plain model. Returns how many experts weights it dequantized."""
    n = 0
    for _, experts in experts_modules(model):
        for w in WEIGHTS:
            q = experts._modules.get(w)
            if isinstance(q, NF4Experts):
                full = torch.stack([q.dequantize(e) for e in range(q.num_experts)])
                del experts._modules[w]
                experts.register_parameter(w, torch.nn.Parameter(full, requires_grad=False))
                n += 1
    if n and getattr(model, "memtune_experts_default", None):
        model.set_experts_implementation(model.memtune_experts_default)
    return n + family_experts.restore(model)


def while_loading(cfg, path: str):
    """The loading hook for a TrainConfig: experts quantized as they load when the config loads in 4 bits."""
    kwargs = bnb_kwargs(cfg)
    if kwargs is None:
        return contextlib.nullcontext()
    return quantizing_experts(path, kwargs["bnb_4bit_quant_type"], kwargs["bnb_4bit_use_double_quant"],
                              getattr(torch, kwargs["bnb_4bit_compute_dtype"]), cfg.trust_remote_code)


def liger_config(model) -> dict:
    """Liger's in-layer kernels for this model: its SwiGLU kernel replaces a MoE experts module's forward
    (LigerExperts) with one that reads the 3-D weights as tensors, which 4-bit experts are not; the rest of liger
    (RMSNorm, RoPE) still applies."""
    quantized = any(isinstance(m, NF4Experts) for _, m in model.named_modules())
    return {"swiglu": False} if quantized else {}

