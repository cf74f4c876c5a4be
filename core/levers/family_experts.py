"""4-bit experts for the families whose experts class is their own (core/levers/expert_store.py FAMILY): Llama-4,
DBRX, JetMoE. Their weights are NF4Experts as for transformers' experts interface (each expert quantized on its own
while loading); here is how they compute: the family's own arithmetic, one routed expert at a time through
bitsandbytes' matmul_4bit (`NF4Experts.linear`), swapped in by class once loaded (`use_4bit`) and swapped back
with the 16-bit weights for a merge (`restore`).

- Llama4TextExperts gets every expert's copy of every token, scaled by its router score (0 where not routed), and
  multiplies them all (bmm). A row of zeros gives zeros, and its gradient is zero too (SiLU(0) = 0, up(0) = 0), so
  only the rows routed to an expert are computed: the same result for top-k / experts of the work.
- DbrxExperts: its loop over the routed experts, with w1, v1 (the gate and up, (out, in)) and w2 (x @ W) 4-bit.
- JetMoeParallelExperts (its MLP and its mixture of attention heads): each expert's slice of the sorted rows.
"""

from __future__ import annotations

import functools

import torch

from core.levers.expert_store import FAMILY, layouts


def _out(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.to(like.dtype)


def _llama4_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    rows = hidden_states.view(self.num_experts, -1, self.hidden_size)
    sparse = float(self.act_fn(torch.zeros((), dtype=torch.float32))) == 0.0
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
        gate, up = self.gate_up_proj.linear(x, e).chunk(2, dim=-1)
        y = _out(self.down_proj.linear(up * self.act_fn(gate), e), rows)
        parts.append(torch.zeros_like(rows[e]).index_copy(0, hit, y) if sparse else y)
    return torch.stack(parts).view(-1, self.hidden_size)


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
    parts = inputs.split(expert_size, dim=0)
    return torch.cat([_out(self.weight.linear(x, e), inputs) if x.shape[0] else inputs.new_zeros((0, self.output_size))
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
    subclass with the forward above). Returns how many modules now compute in 4 bits."""
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
