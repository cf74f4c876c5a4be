"""LoRA on 4-bit experts (`lora_experts` with `load_in_4bit`): per-expert A/B beside each NF4Experts weight, on
transformers' experts interface and on Llama-4's and JetMoE's own experts classes (expert_store.lora_adaptable).

peft's `target_parameters` adds its update to a whole 16-bit 3-D parameter (a parametrization), which 4-bit experts
never hold. Here each NF4Experts weight gets an `ExpertLoRA` child holding the same matrices peft's ParamWrapper
holds for that 3-D weight, in its layout (A: [r x experts, in], expert e's rows e*r..e*r+r-1; B: [out, r x experts],
expert e's columns e, e+experts, ...), and memtune's two experts forwards (core/levers/experts.py,
core/levers/family_experts.py) add scaling * B_e A_e dropout(x) to each expert's rows (where peft reads the weight
the other way round, Llama-4's x @ W: scaling * dropout(x) B_e A_e, `flipped`): the loop per expert, the grouped
path with the same grouped product and row ends as the frozen weight (no host sync). The frozen NF4 bytes are never
touched.

`ExpertLoRA` is a peft tuner layer (BaseTunerLayer): peft saves and reloads it in checkpoints with the rest of the
adapter (resume), and turns it off with the others (`disable_adapter`, a preference stage's reference). The adapter a
run hands over is rewritten to peft's own layout for those 3-D weights (`to_peft_files`: ParamWrapper's key names,
adapter_config.json's target_parameters), so `PeftModel.from_pretrained` on the 16-bit base loads it; memtune loads
it back onto 4-bit experts (`load_onto`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from peft.tuners.tuners_utils import BaseTunerLayer

from core.levers import expert_store
from core.levers.experts import LORA as CHILD, NF4Experts, _matmul, lora_modules

ADAPTER = "default"  # peft's adapter name; memtune's keys: "<experts>.<weight>.lora.lora_A.weight"


class ExpertLoRA(torch.nn.Module, BaseTunerLayer):
    """Every expert's LoRA of one 3-D experts weight, in peft ParamWrapper's layout (see the module docstring)."""

    adapter_layer_names = ("lora_A", "lora_B")
    other_param_names = ("r", "lora_alpha", "scaling", "lora_dropout")

    def __init__(self, experts: int, in_features: int, out_features: int, r: int, alpha: float,
                 dropout: float = 0.0, rslora: bool = False, init: bool | str = True,
                 device: torch.device | None = None, flipped: bool = False):
        super().__init__()
        # in/out: one expert's product (x [n, in] -> [n, out]); `flipped`: peft reads the 3-D weight the other way
        # round (expert_store.lora_flipped), so its A holds the out side and B the in side
        self.num_experts, self.in_features, self.out_features = experts, in_features, out_features
        self.flipped = flipped
        a_in, b_out = (out_features, in_features) if flipped else (in_features, out_features)
        self.r, self.lora_alpha = {ADAPTER: r}, {ADAPTER: alpha}
        self.scaling = {ADAPTER: alpha / math.sqrt(r) if rslora else alpha / r}
        self.lora_A = torch.nn.ModuleDict({ADAPTER: torch.nn.Linear(a_in, r * experts, bias=False, device=device)})
        self.lora_B = torch.nn.ModuleDict({ADAPTER: torch.nn.Linear(r * experts, b_out, bias=False, device=device)})
        self.lora_dropout = torch.nn.ModuleDict({ADAPTER: torch.nn.Dropout(dropout) if dropout > 0
                                                 else torch.nn.Identity()})
        self._disable_adapters, self._active_adapter, self.merged_adapters = False, ADAPTER, []
        a, b = self.lora_A[ADAPTER].weight, self.lora_B[ADAPTER].weight
        with torch.no_grad():  # peft's starts (reset_lora_parameters): B = 0, so the model starts as the base
            if init == "gaussian":
                torch.nn.init.normal_(a, std=1 / r)
            else:
                torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5))
            torch.nn.init.zeros_(b)

    def factors(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(the in side per expert [experts, in, r'], the out side [experts, r', out]) in `dtype`: the grouped
        product's weights, r' = r rounded up to a multiple of 8 with zeros (the same products): torch's grouped GEMM
        on the GPU needs rows of a multiple of 16 bytes."""
        e, r = self.num_experts, self.r[ADAPTER]
        a, b = self.lora_A[ADAPTER].weight, self.lora_B[ADAPTER].weight
        if self.flipped:  # x B_e A_e
            a, b = b.view(self.in_features, r, e).permute(2, 0, 1), a.view(e, r, self.out_features)
        else:  # x A_e^T B_e^T
            a, b = a.view(e, r, self.in_features).transpose(1, 2), b.view(self.out_features, r, e).permute(2, 1, 0)
        pad = -r % 8
        if pad:
            a = torch.nn.functional.pad(a, (0, pad))
            b = torch.nn.functional.pad(b, (0, 0, 0, pad))
        return a.to(dtype).contiguous(), b.to(dtype).contiguous()

    @property
    def active(self) -> bool:
        return not self.disable_adapters and ADAPTER in self.active_adapters

    def expert(self, x: torch.Tensor, e: int, dtype: torch.dtype) -> torch.Tensor:
        """scaling * dropout(x) A_e^T B_e^T (flipped: dropout(x) B_e A_e): expert e's LoRA term for its rows x (the
        loop's)."""
        r = self.r[ADAPTER]
        a = self.lora_A[ADAPTER].weight[e * r:(e + 1) * r]
        b = self.lora_B[ADAPTER].weight[:, e::self.num_experts]
        first, second = (b, a) if self.flipped else (a.t(), b.t())
        h = self.lora_dropout[ADAPTER](x).to(dtype) @ first.to(dtype)
        return (h @ second.to(dtype)) * self.scaling[ADAPTER]

    def grouped(self, x: torch.Tensor, ends: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The LoRA term of every expert's rows at once (x sorted by expert, expert e's rows ending at ends[e]): two
        grouped products, the frozen weight's own offsets."""
        a, b = self.factors(dtype)
        h = _matmul(self.lora_dropout[ADAPTER](x).to(dtype).contiguous(), a, ends)
        return _matmul(h.to(dtype).contiguous(), b, ends) * self.scaling[ADAPTER]

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, in={self.in_features}, out={self.out_features}, r={self.r[ADAPTER]}"
                + (", flipped" if self.flipped else ""))


def _nf4_weights(model):
    """(experts module path, module, weight name, its NF4Experts) for every 4-bit experts weight lora_experts adapts
    (experts.lora_modules), in the order the module registered its weights (expert_store.layouts)."""
    for path, experts in lora_modules(model):
        for w in expert_store.layouts(experts):
            q = experts._modules.get(w)
            if isinstance(q, NF4Experts):
                yield path, experts, w, q


def _suffix(path: str, weight: str) -> str:
    return ".".join(path.split(".")[-2:] + [weight])


def attach(model, r: int, alpha: float, dropout: float = 0.0, rslora: bool = False, init: bool | str = True,
           ) -> list[str]:
    """An ExpertLoRA on every NF4Experts weight of the model (after get_peft_model: trainable, fp32, on the weight's
    device). Returns peft's target_parameters for them ("mlp.experts.gate_up_proj", ...)."""
    names = []
    for path, experts, w, q in _nf4_weights(model):
        out, inp = q.out_in
        q.add_module(CHILD, ExpertLoRA(q.num_experts, inp, out, r, alpha, dropout, rslora, init,
                                       device=q.packed.device, flipped=expert_store.lora_flipped(experts, w)))
        if _suffix(path, w) not in names:
            names.append(_suffix(path, w))
    return names


def has_lora(model) -> bool:
    return any(isinstance(m, ExpertLoRA) for m in model.modules())


# --- peft's layout: ParamWrapper's keys for 3-D weights ---------------------------------------------------------
def layout(model) -> dict[str, str]:
    """memtune's key prefix of each ExpertLoRA ("<experts>.gate_up_proj.lora.") -> peft ParamWrapper's for that
    weight. peft nests one wrapper per targeted parameter of a module in the order the module registered them
    (transformers' experts classes: gate_up_proj or up_proj before down_proj), the last one outermost: its keys are
    "<experts>.lora_A.weight", the one before "<experts>.base_layer.lora_A.weight", and so on."""
    prefixes, targeted = {}, {}
    for path, _, w, q in _nf4_weights(model):
        if CHILD in q._modules:
            targeted.setdefault(path, []).append(w)
    for path, weights in targeted.items():
        for depth, w in enumerate(reversed(weights)):
            prefixes[f"{path}.{w}.{CHILD}."] = f"{path}{'.base_layer' * depth}."
    return prefixes


def _renamed(state: dict, prefixes: dict[str, str]) -> dict:
    out = {}
    for key, value in state.items():
        for old, new in prefixes.items():
            if key.startswith(old) and key[len(old):].startswith(("lora_A.", "lora_B.")):
                key = new + key[len(old):]
                break
        out[key] = value
    return out


def to_peft(model, state: dict) -> dict:
    """An adapter state dict (peft's keys, adapter name removed) with the experts' LoRA under ParamWrapper's keys."""
    return _renamed(state, layout(model))


def from_peft(model, state: dict) -> dict:
    """The inverse of `to_peft`: ParamWrapper's keys for the experts' LoRA back to this model's ExpertLoRA keys."""
    return _renamed(state, {new: old for old, new in layout(model).items()})


def to_peft_files(model, folder: str | Path) -> None:
    """A saved adapter (peft's save_pretrained of a model with ExpertLoRA) rewritten in peft's own layout for LoRA on
    3-D weights: ParamWrapper's key names, adapter_config.json's target_parameters, lora_dropout 0 (peft's
    ParamWrapper refuses any other; dropout only acts in training)."""
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    weights, config = folder / "adapter_model.safetensors", folder / "adapter_config.json"
    save_file(to_peft(model, load_file(str(weights))), str(weights), metadata={"format": "pt"})
    settings = json.loads(config.read_text(encoding="utf-8"))
    settings["target_parameters"] = target_parameters(model)
    settings["lora_dropout"] = 0.0
    config.write_text(json.dumps(settings, indent=2, sort_keys=True), encoding="utf-8")


def target_parameters(model) -> list[str]:
    """peft's target_parameters for the model's ExpertLoRA weights, sorted as peft sorts them."""
    return sorted({_suffix(path, w) for path, _, w, q in _nf4_weights(model) if CHILD in q._modules})


def load_onto(model, adapter_dir: str | Path, config) -> None:
    """A saved adapter's experts LoRA (peft's layout, `config`: its LoraConfig) onto a PeftModel whose experts are
    4-bit and which peft loaded without its target_parameters: ExpertLoRA attached, its weights read from the file.
    Raises ValueError when the file's experts matrices and the model's do not match one to one."""
    from peft import load_peft_weights

    attach(model, config.r, config.lora_alpha, 0.0, bool(config.use_rslora))
    state = from_peft(model, load_peft_weights(str(adapter_dir)))
    own = {}
    for name, module in model.named_modules():
        if isinstance(module, ExpertLoRA):
            for part in ("lora_A", "lora_B"):
                own[f"{name}.{part}.weight"] = getattr(module, part)[ADAPTER].weight
    for key, param in own.items():
        saved = state.get(key)
        if saved is None or tuple(saved.shape) != tuple(param.shape):
            raise ValueError(f"the adapter's experts LoRA does not fit this model at {key}")
        with torch.no_grad():
            param.copy_(saved.to(param.device, param.dtype))
        param.requires_grad_(False)
