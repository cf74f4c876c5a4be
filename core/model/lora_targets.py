"""Which linear layers of the model in hand get LoRA: TrainConfig.lora_target_modules resolved against its module tree.

Users (and the chapter) name layers the Llama way: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
Other families fuse or rename them: Phi-3 has one qkv_proj and one gate_up_proj, so the chapter's four names match
only its o_proj (a quarter of what was asked, silently, if handed to peft as they are). Here every requested name is
mapped onto the layers the model really has, before any weight loads (the tree is built on the meta device):

- a group: "attention" (the attention projections of any family), "mlp", "all_linear" (every linear layer of the
  decoder blocks; never the output head). No group and no q/k/v/o role takes a mixture-of-experts router (a
  linear layer choosing experts: Llama-4's, DBRX's, JetMoE's, inside its attention too): a router is adapted only
  when named;
- a Llama-style name the model lacks maps to the fused layer that holds it (q_proj -> qkv_proj, up_proj ->
  gate_up_proj, ...); the fused layer then trains whole (its k and v parts too), which the log says;
- any other name must be a linear layer of the model, or the run is refused with the model's real layers listed.

peft gets the resolved leaf names, so the adapter_config.json it writes lists what was really adapted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from core.messages import Said
from core.model import vision

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
         "c_proj": "shared", "kv_proj": "kv"}


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
                 Said("preview.lora_fused", fused=m, parts=Said(f"log.lora_parts.{FUSED[_leaf(m)]}"))
                 for m in self.modules if _leaf(m) in FUSED and (m == "c_proj" or FUSED[_leaf(m)] != "shared")]
        extra = Said("log.lora_more", parts=[*renamed, *fused]) if renamed or fused else ""
        return Said("log.lora_targets", modules=", ".join(self.modules), layers=self.layers, params=self.trainable,
                    more=extra)


class Layers(dict):
    """Target name -> (in, out) of each linear layer it names; `attention`: the names inside an attention block;
    `routers`: the names of mixture-of-experts routers. A leaf name found both inside and outside the attention
    block (GPT-2's c_proj, LFM2's out_proj) is split into "parent.leaf" names (attn.c_proj, mlp.c_proj), which peft
    matches as module-path suffixes."""

    attention: set
    routers: set


ROUTER_WORDS = ("router", "gating")


def _is_router(model: Any, path: str) -> bool:
    """Whether the linear layer at `path` routes tokens to experts: named so (a path part "router"), or its class or
    its parent's names a router or a gating (Llama4Router, DbrxRouter, JetMoeTopKGating)."""
    parts = path.split(".")
    if "router" in parts:
        return True
    classes = [type(model.get_submodule(path)).__name__]
    if len(parts) > 1:
        classes.append(type(model.get_submodule(".".join(parts[:-1]))).__name__)
    return any(w in c.lower() for c in classes for w in ROUTER_WORDS)


def _in_attention(model: Any, path: str) -> bool:
    """Whether the layer at `path` sits in an attention block (a module whose class names attention; never a
    linear-attention or convolution mixer)."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        cls = type(model.get_submodule(".".join(parts[:i]))).__name__.lower()
        if "attention" in cls and "linear" not in cls:
            return True
    return False


def _linear_paths(model: Any) -> list[tuple[str, tuple[int, int]]]:
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    found = []
    wrapped = ()  # peft's LoRA layers: the linear layer they wrap counts once, at the LoRA layer's path
    for name, module in model.named_modules():
        if module is head or not name or (wrapped and name.startswith(wrapped)):
            continue
        if hasattr(module, "lora_A"):  # a LoRA layer's own matrices are never targets
            wrapped += (name + ".",)
            if not hasattr(module, "base_layer"):  # LoRA beside a weight (expert_lora.ExpertLoRA): nothing wrapped
                continue
            module = module.base_layer
        if isinstance(module, torch.nn.Linear):
            found.append((name, (module.in_features, module.out_features)))
        elif type(module).__name__ == "Conv1D":  # GPT-2 style: weight is [in, out]
            found.append((name, tuple(module.weight.shape)))
    return found


def adapted_part(model: Any, lora_vision: bool = False) -> list[Any]:
    """The parts of `model` whose linear layers LoRA may target: the whole model, or an image-text model's language
    model (and with `lora_vision` its vision encoder too): never the vision side by accident of a shared name."""
    if not vision.is_vision_config(getattr(model, "config", None)):
        return [model]
    names = [vision.language_prefix(model)] + (vision.encoder_modules(model) if lora_vision else [])
    return [model.get_submodule(n) for n in names]


def adaptable_layers(model: Any, lora_vision: bool = False) -> Layers:
    """linear_layers over the parts LoRA may target (adapted_part), merged."""
    parts = adapted_part(model, lora_vision)
    if len(parts) == 1:
        return linear_layers(parts[0])
    found = Layers()
    found.attention, found.routers = set(), set()
    for part in parts:
        layers = linear_layers(part)
        for name, dims in layers.items():
            found.setdefault(name, []).extend(dims)
        found.attention |= layers.attention
        found.routers |= layers.routers
    return found


def linear_layers(model: Any) -> Layers:
    """Target name -> (in, out) of every linear layer under the model's decoder blocks (not the output head), with
    the names inside an attention block (Layers)."""
    entries = [(path, dims, _in_attention(model, path)) for path, dims in _linear_paths(model)]
    roles: dict[str, set] = {}
    for path, _, attn in entries:
        roles.setdefault(path.rsplit(".", 1)[-1], set()).add(attn)
    found = Layers()
    found.attention, found.routers = set(), set()
    for path, dims, attn in entries:
        leaf = path.rsplit(".", 1)[-1]
        name = ".".join(path.split(".")[-2:]) if len(roles[leaf]) > 1 else leaf
        found.setdefault(name, []).append(dims)
        if attn:
            found.attention.add(name)
        if _is_router(model, path):
            found.routers.add(name)
    return found


def paths(model: Any, modules: list[str], lora_vision: bool = False) -> list[str]:
    """The module paths peft adapts for target names `modules` (a name matches a path equal to it or ending in it);
    in an image-text model, those of the parts LoRA may target only (adapted_part: peft's exclude_modules)."""
    found = [path for path, _ in _linear_paths(model) if any(path == m or path.endswith("." + m) for m in modules)]
    if not vision.is_vision_config(getattr(model, "config", None)):
        return found
    parts = [vision.language_prefix(model)] + (vision.encoder_modules(model) if lora_vision else [])
    return [path for path in found if any(path.startswith(part + ".") for part in parts)]


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


# The attention block's projections by role, where a family names them otherwise (fused, MLA, out_proj/dense)
INPUTS = ("qkv_proj", "W_pack", "query_key_value", "c_attn", "Wqkv", "wqkv")
MLA = {"q_proj": ("q_a_proj", "q_b_proj"), "k_proj": ("kv_a_proj_with_mqa", "kv_b_proj"),
       "v_proj": ("kv_a_proj_with_mqa", "kv_b_proj")}
SPLIT = {"q_proj": ("wq",), "k_proj": ("wk", "kv_proj"), "v_proj": ("wv", "kv_proj")}  # kv_proj: JetMoE's k and v
OUTPUTS = ("o_proj", "dense", "out_proj", "c_proj", "wo", "o")


def resolve(requested: list[str], linear: dict[str, list[tuple[int, int]]], rank: int) -> Targets:
    """`requested` (names and groups) as the target names of `linear` (linear_layers), or TargetError naming them.
    q, k, v and o are roles of the attention block: its input projections (fused or MLA ones included) and its
    output projection (o_proj, dense, out_proj, c_proj, ...), never a layer outside it."""
    chosen: list[str] = []
    mapped: dict[str, list[str]] = {}
    missing: list[str] = []
    attention = getattr(linear, "attention", None)
    if attention is None:  # a plain {name: dims}: names only
        attention = {n for n in linear if _leaf(n) in ATTENTION or any(_leaf(n) in ALIASES[a] for a in ATTENTION)}
    routers = getattr(linear, "routers", set())
    attention = {n for n in attention if n not in routers}  # a router in an attention block (JetMoE's) is no role
    outside = [n for n in linear if n not in attention and n not in routers]

    def among(names: list[str], wanted: tuple[str, ...]) -> list[str]:
        for w in wanted:  # in order of preference
            hits = [n for n in names if _leaf(n) == w]
            if hits:
                return hits
        return []

    def want(name: str) -> list[str]:
        attn = [n for n in linear if n in attention]
        if name in ("q_proj", "k_proj", "v_proj"):
            return (among(attn, (name,)) or among(attn, INPUTS) or [h for w in MLA[name] for h in among(attn, (w,))]
                    or among(attn, SPLIT[name]))
        if name == "o_proj":
            return among(attn, OUTPUTS)
        if name in MLP:
            return among(outside, (name, *ALIASES[name]))
        if name in linear:
            return [name]
        return [n for n in linear if _leaf(n) == name]  # a leaf name split by role: every layer of that name

    for name in requested:
        if name == "all_linear":
            hits = [n for n in linear if n not in routers]
        elif name == "attention":
            hits = [n for n in linear if n in attention]
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


# transformers builds a model under process-wide switches (torch's default dtype; accelerate's init_empty_weights
# patches nn.Module.register_parameter): two trees built at once by the app's threads (a Preview beside an edit's
# estimate, core/model/shapes.py) would each be built under the other's. One at a time, in every builder here.
TREE_LOCK = threading.RLock()


def skeleton(path: str, trust_remote_code: bool = False):
    """The model at `path` (a folder or Hub snapshot) as a module tree on the meta device: no weights, no memory."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with TREE_LOCK, init_empty_weights():
        if vision.is_vision_config(config):  # an image-text-to-text model: its own auto class
            return vision.skeleton(config, trust_remote_code)
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def for_path(requested: list[str], rank: int, path: str, trust_remote_code: bool = False) -> Targets:
    tree = skeleton(path, trust_remote_code)
    found = resolve(list(requested), linear_layers(tree), rank)
    found.model_type = getattr(tree.config, "model_type", None)
    return found
