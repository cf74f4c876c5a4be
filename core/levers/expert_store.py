"""How a mixture-of-experts model's experts are stored once loaded in 4 bits: the one rule that the loader
(core/levers/experts.py) and the estimate (core/model/shapes.py) both read, so the two cannot disagree.

An experts module is a module whose parameters hold the weights of several experts at once (not nn.Linear, so
bitsandbytes' quantizer leaves them alone). Each is stored in 4 bits (NF4Experts: every expert quantized on its own)
by one of two routes:
- transformers' experts interface (classes decorated with use_experts_implementation: Qwen3-MoE, Mixtral, OLMoE,
  gpt-oss, DeepSeek-V3, ...): their 3-D `gate_up_proj` / `up_proj` / `down_proj`, computed by memtune's forwards
  registered in the interface;
- a family whose experts class is its own (`FAMILY`): Llama-4's Llama4TextExperts (3-D, x @ W layout), DBRX's
  DbrxExpertGLU (w1, v1, w2: 2-D stacks [experts x width, hidden]), JetMoE's JetMoeParallelExperts (3-D [experts,
  out, in]: its MLP and its mixture of attention heads). The same NF4Experts, and the family's own arithmetic in
  grouped products (Llama-4, JetMoE: GROUPED_FAMILIES) or one routed expert at a time (DBRX)
  (core/levers/family_experts.py), swapped in by class once loaded.
Any other parameter holding several experts (a 3-D floating parameter named for experts, outside these) stays in
its dtype: the estimate counts it 16-bit and the run log says so (`unrouted`).

Only module classes and parameter shapes are read: it works on the meta device (no weights) and without CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# transformers' experts interface: the 3-D weights memtune stores in 4 bits (and lora_experts adapts)
WEIGHTS = ("gate_up_proj", "up_proj", "down_proj")
INTERFACE = "interface"
FAMILY_ROUTE = "family"

# experts class name -> {weight: True where the family stores each expert as (in, out), i.e. computes x @ W}, and the
# attribute that holds the expert count
FAMILY: dict[str, tuple[dict[str, bool], str]] = {
    "Llama4TextExperts": ({"gate_up_proj": True, "down_proj": True}, "num_experts"),
    "DbrxExpertGLU": ({"w1": False, "v1": False, "w2": True}, "moe_num_experts"),
    "JetMoeParallelExperts": ({"weight": False}, "num_experts"),
}


# the family experts classes that compute in grouped products on the grouped path (core/levers/family_experts.py);
# the others compute one routed expert at a time whatever the path
GROUPED_FAMILIES = frozenset({"Llama4TextExperts", "JetMoeParallelExperts"})


def is_experts(module: Any) -> bool:
    """An experts module of transformers' experts interface (the decorator sets has_gate / is_transposed)."""
    return hasattr(module, "has_gate") and hasattr(module, "is_transposed") and hasattr(module, "num_experts")


def route(module: Any) -> str | None:
    """How this module's experts reach 4 bits: INTERFACE, FAMILY_ROUTE, or None (not an experts module here)."""
    if is_experts(module):
        return INTERFACE
    if any(c.__name__ in FAMILY for c in type(module).__mro__):
        return FAMILY_ROUTE
    return None


def _family_entry(module: Any) -> tuple[dict[str, bool], str]:
    for cls in type(module).__mro__:
        if cls.__name__ in FAMILY:
            return FAMILY[cls.__name__]
    raise KeyError(type(module).__name__)


def layouts(module: Any) -> dict[str, tuple[int, bool]]:
    """The weights of an experts module stored in 4 bits: name -> (experts, transposed). {} for any other module."""
    which = route(module)
    if which == INTERFACE:
        transposed = bool(getattr(module, "is_transposed", False))
        return {w: (int(module.num_experts), transposed) for w in WEIGHTS if _three_d(module, w)}
    if which == FAMILY_ROUTE:
        weights, count = _family_entry(module)
        return {w: (int(getattr(module, count)), t) for w, t in weights.items()}
    return {}


def _three_d(module: Any, weight: str) -> bool:
    """The module holds `weight` as a 3-D experts weight: a 3-D parameter, or once loaded its NF4Experts (which
    keeps the 16-bit parameter's shape)."""
    value = module._parameters.get(weight)
    if value is not None:
        return value.dim() == 3
    return len(getattr(module._modules.get(weight), "shape", ())) == 3


def experts_view(value, experts: int):
    """A family's stacked weight as [experts, rows, cols] (DBRX's 2-D [experts x width, hidden]: a view, no copy)."""
    return value if value.dim() == 3 else value.view(experts, -1, value.shape[-1])


@dataclass(frozen=True)
class Stored:
    """One experts weight of the model as stored in 4 bits: its parameter path, the route, and [experts, rows,
    cols] of its 3-D view (the family's layout)."""

    path: str
    route: str
    experts: int
    rows: int
    cols: int
    grouped: bool = True  # computed in grouped products on the grouped path (GROUPED_FAMILIES, or the interface)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.experts, self.rows, self.cols


@dataclass(frozen=True)
class Plan:
    """The model's experts: those stored in 4 bits (`quantized`) and the parameters that hold several experts and
    stay in their dtype (`unrouted`: path -> element count)."""

    quantized: tuple[Stored, ...] = ()
    unrouted: tuple[tuple[str, int], ...] = ()

    @property
    def routes(self) -> set[str]:
        return {s.route for s in self.quantized}


def plan(model: Any) -> Plan:
    """The rule on a model (built on the meta device, or loaded: an NF4Experts counts by its 16-bit shape)."""
    quantized, covered = [], set()
    for name, module in model.named_modules():
        found = layouts(module)
        which = route(module) if found else None
        for weight, (experts, _) in found.items():
            value = module._parameters.get(weight)
            if value is None:  # loaded already: an NF4Experts submodule keeps the parameter's shape
                held = module._modules.get(weight)
                shape = getattr(held, "shape", None)
                if shape is None:
                    continue
                shape = tuple(shape) if len(shape) == 3 else (experts, shape[0] // experts, shape[-1])
            else:
                covered.add(id(value))
                if not value.is_floating_point():
                    continue
                shape = tuple(experts_view(value, experts).shape)
            path = f"{name}.{weight}" if name else weight
            grouped = which == INTERFACE or any(c.__name__ in GROUPED_FAMILIES for c in type(module).__mro__)
            quantized.append(Stored(path, which, int(shape[0]), int(shape[1]), int(shape[2]), grouped))
    unrouted = tuple((n, int(p.numel())) for n, p in model.named_parameters()
                     if p.dim() == 3 and p.is_floating_point() and id(p) not in covered and _holds_experts(model, n))
    return Plan(tuple(quantized), unrouted)


def _holds_experts(model: Any, path: str) -> bool:
    """A 3-D parameter named for experts, or of a module class named so (not a convolution's [out, in, width])."""
    owner = model.get_submodule(path.rpartition(".")[0]) if "." in path else model
    return "expert" in path.lower() or "expert" in type(owner).__name__.lower()


# A family's experts class whose LoRA peft cannot apply: peft's target_parameters replaces the module holding the
# parameter by its wrapper, and DbrxExperts reads w1 / v1 / w2 as attributes of that child (`self.mlp.w1`), which the
# wrapper does not have: an adapter saved in peft's layout would not run under peft, so lora_experts refuses it.
NO_LORA = frozenset({"DbrxExpertGLU"})


def lora_flipped(module: Any, weight: str) -> bool:
    """peft's ParamWrapper reads a 3-D experts weight [experts, d1, d2] as (experts, in, out) where the module says
    `is_transposed` (transformers' experts interface, x @ W), else as (experts, out, in). True where that is the
    other way round from how the family computes with it (Llama-4's x @ W with no `is_transposed`): its LoRA's A
    then holds the product's out side and B its in side (core/levers/expert_lora.py)."""
    experts_layout = layouts(module).get(weight)
    if experts_layout is None:
        raise KeyError(weight)
    return experts_layout[1] != bool(getattr(module, "is_transposed", False))


def lora_adaptable(module: Any) -> bool:
    """lora_experts puts LoRA on this module's experts weights: transformers' experts interface, or a family's own
    experts class whose LoRA peft can apply (not NO_LORA)."""
    which = route(module)
    return which == INTERFACE or (which == FAMILY_ROUTE and not any(c.__name__ in NO_LORA
                                                                     for c in type(module).__mro__))


def lora_problem(model: Any) -> tuple[str, str] | None:
    """Why lora_experts cannot adapt this model's experts, from its module tree before any weight loads: ("family",
    its experts classes peft cannot apply LoRA on: NO_LORA) or ("dense", ""); None where it can."""
    own = sorted({c.__name__ for _, m in model.named_modules() if route(m) == FAMILY_ROUTE
                  for c in type(m).__mro__ if c.__name__ in NO_LORA})
    if own:
        return "family", ", ".join(own)
    if not plan(model).quantized:
        return "dense", ""
    return None
