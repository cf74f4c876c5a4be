"""Which linear layers of the model in hand get LoRA: TrainConfig.lora_target_modules resolved against its module tree.

Users (and the chapter) name layers the Llama way: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
Other families fuse or rename them: Phi-3 has one qkv_proj and one gate_up_proj, so the chapter's four names match
only its o_proj (a quarter of what was asked, silently, if handed to peft as they are). Here every requested name is
mapped onto the layers the model really has, before any weight loads (the tree is built on the meta device):

- a group: "attention" (the attention projections of any family), "mlp", "all_linear" (every linear layer of the
  decoder blocks; never the output head);
- a Llama-style name the model lacks maps to the fused layer that holds it (q_proj -> qkv_proj, up_proj ->
  gate_up_proj, ...); the fused layer then trains whole (its k and v parts too), which the log says;
- any other name must be a linear layer of the model, or the run is refused with the model's real layers listed.

peft gets the resolved leaf names, so the adapter_config.json it writes lists what was really adapted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.messages import Said

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
GROUPS = {"attention": ATTENTION, "mlp": MLP, "all_linear": ()}
# A Llama-style name -> the names the same projection has in families that fuse or rename it (in that order)
ALIASES: dict[str, tuple[str, ...]] = {
    "q_proj": ("qkv_proj", "W_pack", "query_key_value", "c_attn", "wq"),
    "k_proj": ("qkv_proj", "W_pack", "query_key_value", "c_attn", "wk"),
    "v_proj": ("qkv_proj", "W_pack", "query_key_value", "c_attn", "wv"),
    "o_proj": ("out_proj", "wo", "c_proj"),
    "gate_proj": ("gate_up_proj", "w1"),
    "up_proj": ("gate_up_proj", "w3", "c_fc"),
    "down_proj": ("w2", "c_proj"),
}
# What a fused layer holds, in words (the page says them in its language: ui/render.py, locale keys log.lora_parts.*)
# a fused layer -> what it holds (key log.lora_parts.<it>); c_proj: one name for two projections (log.lora_shared)
FUSED = {"qkv_proj": "qkv", "W_pack": "qkv", "query_key_value": "qkv", "c_attn": "qkv", "gate_up_proj": "gate_up",
         "c_proj": "shared"}


class TargetError(ValueError):
    """Requested LoRA targets that match no linear layer of the model (`missing`), and the model's real ones."""

    def __init__(self, missing: list[str], linear: list[str]):
        self.missing, self.linear = missing, linear
        super().__init__(f"{', '.join(missing)} match{'es' if len(missing) == 1 else ''} no linear layer of this "
                         f"model; its linear layers are {', '.join(linear)}")


@dataclass
class Targets:
    modules: list[str]  # leaf names handed to peft, in the model's order
    layers: int  # how many linear layers get an adapter
    trainable: int  # LoRA parameters: r x (in + out) per adapted layer
    mapped: dict[str, list[str]] = field(default_factory=dict)  # requested name -> the leaf names it became
    linear: list[str] = field(default_factory=list)  # every linear leaf name of the decoder blocks
    model_type: str | None = None  # config.json's, when resolved from a model folder

    def describe(self) -> Said:
        """One line for the run log and the preview (preview.lora, then renamed, fused and shared-name layers, "; "
        between the parts), keyed so the page says it in its language."""
        renamed = [f"{k} -> {'+'.join(v)}" for k, v in self.mapped.items() if v != [k] and k not in GROUPS]
        fused = [Said("log.lora_shared", name=m) if m == "c_proj" else
                 Said("preview.lora_fused", fused=m, parts=Said(f"log.lora_parts.{FUSED[m]}")) for m in self.modules
                 if m in FUSED]
        extra = Said("log.lora_more", parts=[*renamed, *fused]) if renamed or fused else ""
        return Said("log.lora_targets", modules=", ".join(self.modules), layers=self.layers, params=self.trainable,
                    more=extra)


def linear_layers(model: Any) -> dict[str, list[tuple[int, int]]]:
    """Leaf name -> (in, out) of every linear layer under the model's decoder blocks (not the output head)."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    found: dict[str, list[tuple[int, int]]] = {}
    for name, module in model.named_modules():
        if module is head or not name:
            continue
        if isinstance(module, torch.nn.Linear):
            dims = (module.in_features, module.out_features)
        elif type(module).__name__ == "Conv1D":  # GPT-2 style: weight is [in, out]
            dims = tuple(module.weight.shape)
        else:
            continue
        found.setdefault(name.rsplit(".", 1)[-1], []).append(dims)
    return found


def resolve(requested: list[str], linear: dict[str, list[tuple[int, int]]], rank: int) -> Targets:
    """`requested` (names and groups) as the leaf names of `linear` (linear_layers), or TargetError naming them."""
    chosen: list[str] = []
    mapped: dict[str, list[str]] = {}
    missing: list[str] = []

    def want(name: str) -> list[str]:
        if name in linear:
            return [name]
        return next(([alias] for alias in ALIASES.get(name, ()) if alias in linear), [])

    for name in requested:
        if name == "all_linear":
            hits = list(linear)
        elif name in GROUPS:
            hits = [h for part in GROUPS[name] for h in want(part)]
        else:
            hits = want(name)
        if not hits:
            missing.append(name)
        mapped[name] = list(dict.fromkeys(hits))
        chosen += hits
    if missing:
        raise TargetError(missing, list(linear))
    order = [n for n in linear if n in set(chosen)]
    layers = sum(len(linear[n]) for n in order)
    trainable = sum(rank * (a + b) for n in order for a, b in linear[n])
    return Targets(order, layers, trainable, mapped, list(linear))


def skeleton(path: str, trust_remote_code: bool = False):
    """The model at `path` (a folder or Hub snapshot) as a module tree on the meta device: no weights, no memory."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def for_path(requested: list[str], rank: int, path: str, trust_remote_code: bool = False) -> Targets:
    tree = skeleton(path, trust_remote_code)
    found = resolve(list(requested), linear_layers(tree), rank)
    found.model_type = getattr(tree.config, "model_type", None)
    return found
