"""4-bit experts for the families whose experts class is their own (core/levers/expert_store.py FAMILY): Llama-4,
DBRX, JetMoE. Their weights are NF4Experts as for transformers' experts interface (each expert quantized on its own
while loading); here is how they compute: the family's own arithmetic with the 4-bit weights, swapped in by class
once loaded (`use_4bit`) and swapped back with the 16-bit weights for a merge (`restore`). Llama-4 and JetMoE
compute in grouped products on the grouped path (`set_grouped`, NF4Experts.grouped: nothing read back to the host)
and one routed expert at a time on the loop (NF4Experts.product: bitsandbytes' matmul_4bit), each with the weight's
LoRA where lora_experts put one (core/levers/expert_lora.py); DBRX, whose experts lora_experts refuses, by its loop.

- Llama4TextExperts gets every expert's copy of every token, scaled by its router score (0 where not routed), and
  multiplies them all (bmm). A row of zeros gives zeros, and its gradient is zero too (SiLU(0) = 0, up(0) = 0), so
  only the rows routed to an expert are computed: the same result for top-k / experts of the work.
- DbrxExperts: its loop over the routed experts, with w1, v1 (the gate and up, (out, in)) and w2 (x @ W) 4-bit.
- JetMoeParallelExperts (its MLP and its mixture of attention heads): each expert's slice of the sorted rows.
"""

from __future__ import annotations

import functools
import itertools

import torch

from core.levers.expert_store import FAMILY, GROUPED_FAMILIES, layouts


def _out(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.to(like.dtype)


def _llama4_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    if getattr(self, "memtune_grouped", False):
        return _llama4_grouped(self, hidden_states)
    return _llama4_loop(self, hidden_states)


def _zero_at_zero(act) -> bool:
    """The activation maps 0 to 0 (SiLU): a row of zeros then gives zeros through the expert."""
    return float(act(torch.zeros((), dtype=torch.float32))) == 0.0


def _llama4_loop(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """The reference: expert by expert, its routed rows found on the host (nonzero)."""
    rows = hidden_states.view(self.num_experts, -1, self.hidden_size)
    sparse = _zero_at_zero(self.act_fn)
    parts = []
    for e in range(self.num_experts):
        x = rows[e]
        if sparse:
            with torch.no_grad():
                hit = (x != 0).any(dim=-1).nonzero().flatten()
            if hit.numel() == 0:
                parts.append(torch.zeros_like(x))
                continue
            x = x[hit]
        gate, up = self.gate_up_proj.product(x, e).chunk(2, dim=-1)
        y = _out(self.down_proj.product(up * self.act_fn(gate), e), rows)
        parts.append(torch.zeros_like(rows[e]).index_copy(0, hit, y) if sparse else y)
    return torch.stack(parts).view(-1, self.hidden_size)


def _llama4_grouped(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """Every expert's routed rows in grouped products, nothing read back to the host. The router gives each token
    at most top_k non-zero copies (its other experts' copies are scaled by 0), so the routed rows, sorted by expert
    ahead of all the zero rows, are among the first tokens x top_k: those are computed, expert e's ending at ends[e]
    (found on the device); any of them past the last end (a copy whose score is 0) is a zero row, whose result is 0
    (SiLU(0) = 0) and is written so, its gradient zeroed."""
    n, experts = hidden_states.shape[0], self.num_experts
    if n < experts:
        return _llama4_loop(self, hidden_states)
    routed = min(n, n // experts * self.memtune_top_k)
    dtype = self.gate_up_proj.compute_dtype
    with torch.no_grad():
        expert = torch.arange(n, device=hidden_states.device) // (n // experts)
        key = expert + experts * (hidden_states == 0).all(dim=-1).to(expert.dtype)  # zero rows after every expert
        key, order = torch.sort(key, stable=True)
        key, order = key[:routed], order[:routed]
        bounds = torch.arange(1, experts + 1, device=key.device, dtype=key.dtype)
        ends = torch.searchsorted(key, bounds, out_int32=True)
        spare = (torch.arange(routed, device=key.device) >= ends[-1])[:, None]
    x = hidden_states[order].masked_fill(spare, 0.0)  # its backward zeroes the spare rows' gradient
    gate, up = self.gate_up_proj.grouped(x, ends, dtype).chunk(2, dim=-1)
    y = self.down_proj.grouped(up * self.act_fn(gate), ends, dtype).masked_fill(spare, 0.0)
    out = hidden_states.new_zeros(hidden_states.shape)  # written in place: one buffer of every expert's rows
    return out.index_copy_(0, order, _out(y, hidden_states))


def _dbrx_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                  top_k_weights: torch.Tensor) -> torch.Tensor:
    batch = hidden_states.shape[0]
    h = hidden_states.reshape(-1, self.hidden_size)
    out = torch.zeros_like(h)
    mlp = self.mlp
    with torch.no_grad():
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit.flatten().tolist():
        if e == self.num_experts:
            continue
        pos, token = torch.where(mask[e])
        x = h[token]
        g = mlp.activation_fn(mlp.w1.linear(x, e)) * mlp.v1.linear(x, e)
        y = mlp.w2.linear(g, e) * top_k_weights[token, pos, None]
        out.index_add_(0, token, _out(y, out))
    return out.view(batch, -1, self.hidden_size)


def _jetmoe_forward(self, inputs: torch.Tensor, expert_size) -> torch.Tensor:
    if getattr(self, "memtune_grouped", False) and inputs.shape[0]:
        # the rows come sorted by expert, their counts already on the host (JetMoE's gate reads them back)
        ends = torch.tensor(list(itertools.accumulate(expert_size)), dtype=torch.int32, device=inputs.device)
        return _out(self.weight.grouped(inputs, ends, self.weight.compute_dtype), inputs)
    parts = inputs.split(expert_size, dim=0)
    return torch.cat([_out(self.weight.product(x, e), inputs) if x.shape[0] else inputs.new_zeros((0, self.output_size))
                      for e, x in enumerate(parts)], dim=0)


# the module whose forward computes with the 4-bit weights -> that forward (DBRX: the weights sit in its child `mlp`)
FORWARDS = {"Llama4TextExperts": _llama4_forward, "DbrxExperts": _dbrx_forward,
            "JetMoeParallelExperts": _jetmoe_forward}



@functools.cache
def _nf4_class(cls: type) -> type:
    return type(f"NF4{cls.__name__}", (cls,), {"forward": FORWARDS[cls.__name__], "memtune_nf4": True})


def _holds_4bit(module: torch.nn.Module) -> bool:
    return any(type(m).__name__ == "NF4Experts" for m in module.children())


def use_4bit(model) -> int:
    """Each family experts module whose weights were stored in 4 bits computes with them (its class swapped for a
    subclass with the forward above; one expert at a time until `set_grouped`). Returns how many modules now
    compute in 4 bits."""
    n = 0
    for _, module in model.named_modules():
        cls = type(module)
        if cls.__name__ not in FORWARDS:
            continue
        held = module.mlp if cls.__name__ == "DbrxExperts" else module
        if _holds_4bit(held):
            module.__class__ = _nf4_class(cls)
            n += 1
    return n


def set_grouped(model, grouped: bool) -> bool:
    """The family modules computing in 4 bits take the grouped path (or the loop, the reference); Llama-4's learns
    its MoE block's top_k, which bounds its routed rows. Returns whether any now computes grouped."""
    any_grouped = False
    for name, module in model.named_modules():
        if not getattr(type(module), "memtune_nf4", False):
            continue
        family = type(module).__bases__[0].__name__
        module.memtune_grouped = grouped and family in GROUPED_FAMILIES
        if family == "Llama4TextExperts":  # its grouped rows: the routed ones, which need its block's top_k
            parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else None
            module.memtune_top_k = int(getattr(parent, "top_k", 0) or 0)
            module.memtune_grouped = module.memtune_grouped and module.memtune_top_k > 0 and _zero_at_zero(
                module.act_fn)
        any_grouped = any_grouped or module.memtune_grouped
    return any_grouped


def restore(model) -> int:
    """The family modules' 4-bit weights back as 16-bit parameters of their own shape (their dequantized values),
    and their own forwards: what a merge into the dequantized weights starts from. Returns how many weights."""
    n = 0
    for _, module in model.named_modules():
        if getattr(type(module), "memtune_nf4", False):
            module.__class__ = type(module).__bases__[0]
        if type(module).__name__ not in FAMILY:
            continue
        for name, (experts, _) in layouts(module).items():
            q = module._modules.get(name)
            if q is None or type(q).__name__ != "NF4Experts":
                continue
            full = torch.stack([q.dequantize(e) for e in range(q.num_experts)])
            shape = getattr(q, "param_shape", full.shape)
            del module._modules[name]
            module.register_parameter(name, torch.nn.Parameter(full.reshape(shape), requires_grad=False))
            n += 1
    return n
