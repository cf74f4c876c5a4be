"""Architecture shapes: the config.json numbers that decide how much GPU memory training needs.

A config.json (local, cached, or one of CONFIGS below) is built into a model on the meta device (transformers'
AutoModelForCausalLM.from_config: no weights) and every parameter is counted by how memtune's loader stores it
(StoredCount): the weights transformers' 4-bit quantizer converts, the embeddings, and the rest (norms, biases,
routers, mixture-of-experts' fused 3-D experts, which bitsandbytes leaves 16-bit). The architecture numbers come
through transformers' attribute_map (gpt2's n_embd reads as hidden_size) and the MLP width from the real modules, so
no family is listed by hand. A model_type this transformers cannot build falls back to the Llama-style keys.

`get_shape(model)` reads them from, in order: the demo model (built locally by core.demo), a local model folder
or config.json file, the Hugging Face cache (offline: never downloads), then the built-in table below.

The table of hand shapes (SHAPES: no transformers import, the same counts as the meta model for these dense
families, Qwen3's and Gemma-3's q/k norms aside) holds the values of each model's config.json on the Hub
(vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
tie_word_embeddings, max_position_embeddings). -Instruct / -it variants share their base model's shape (the Qwen2.5 instruct configs
say max_position_embeddings 32768, which does not change memory).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.config.settings import DEMO_MODEL, DEMO_VISION_MODEL
from core.model.lora_targets import TREE_LOCK
from core.model import vision


class ShapeError(ValueError):
    """The model's shape could not be found; the message says where we looked and what to do."""


@dataclass(frozen=True)
class ModelShape:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    model_type: str = "llama"
    attention_bias: bool = False  # Qwen2: q, k and v carry a bias
    norms_per_layer: int = 2  # Gemma 2 has four (pre/post attention and MLP)
    attn_softcap: bool = False  # Gemma 2 soft-caps attention logits (memtune's varlen path then runs eager per row)
    # Counted from the model built of config.json on the meta device (None for the built-in table's hand shapes)
    stored: "StoredCount | None" = None
    # Mixture of experts: experts per MoE layer, routed per token (top-k), each expert's MLP width, MoE layers
    num_experts: int = 0
    num_experts_per_tok: int = 0
    expert_intermediate_size: int = 0
    moe_layers: int = 0
    dense_mlp: bool = True  # the layers hold an nn.Linear MLP (gate/up/down); an all-MoE model's layers do not
    # the config.json text it was built from (core.estimate.measure builds one decoder layer of it); "" for a hand shape
    config_text: str = field(default="", compare=False, repr=False)
    # an image-text model's whole config.json text (its vision_config: core/estimate/vision.py); "" for a text model
    vision_config_text: str = field(default="", compare=False, repr=False)

    # --- derived sizes ------------------------------------------------------------------------------------------
    q_dim = property(lambda self: self.num_attention_heads * self.head_dim, doc="width of the query projection")
    kv_dim = property(lambda self: self.num_key_value_heads * self.head_dim, doc="width of the key/value projections")

    def module_dims(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear layer in one decoder block."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.q_dim, self.kv_dim
        dims = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
        if self.dense_mlp:
            dims.update(gate_proj=(h, i), up_proj=(h, i), down_proj=(i, h))
        return dims

    @property
    def fused(self) -> bool:
        """Phi-3/Phi-4 hold q, k, v in one qkv_proj and gate, up in one gate_up_proj linear layer."""
        return self.model_type == "phi3"

    def linear_dims(self) -> list[tuple[int, int]]:
        """(in, out) of each linear layer of one block as the model holds it: a fused layer is one weight (what
        bitsandbytes quantizes and dequantizes whole, and what one LoRA adapter wraps)."""
        dims = self.module_dims()
        if not self.fused or not self.dense_mlp:
            return list(dims.values())
        h = self.hidden_size
        return [(h, self.q_dim + 2 * self.kv_dim), dims["o_proj"], (h, 2 * self.intermediate_size), dims["down_proj"]]

    @property
    def linear_params_per_layer(self) -> int:
        return sum(a * b for a, b in self.module_dims().values())

    def quantized_weights(self) -> list[tuple[int, int]]:
        """(in, out) of every weight bitsandbytes quantizes to 4 bits, the whole model's."""
        if self.stored is not None:
            return list(self.stored.quantizable)
        return self.num_hidden_layers * self.linear_dims()

    @property
    def linear_params(self) -> int:
        """Parameters of the linear layers bitsandbytes quantizes to 4 bits (the decoder blocks')."""
        if self.stored is not None:
            return sum(a * b for a, b in self.stored.quantizable)
        return self.num_hidden_layers * self.linear_params_per_layer

    @property
    def embed_params(self) -> int:
        """The input embedding's parameters."""
        return self.stored.embed if self.stored is not None else self.vocab_size * self.hidden_size

    @property
    def head_params(self) -> int:
        """The output projection (lm_head); 0 when it shares the input embedding's matrix."""
        if self.stored is not None:
            return self.stored.head
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def expert_params(self) -> int:
        """MoE experts' fused 3-D parameters: not nn.Linear, so bitsandbytes leaves them in their dtype."""
        return self.stored.experts if self.stored is not None else 0

    @property
    def largest_expert_params(self) -> int:
        return self.stored.largest_expert if self.stored is not None else 0

    def expert_weights(self) -> list[tuple[int, int, int]]:
        """(experts, rows, columns): the shape of every fused 3-D experts weight of the model (each MoE layer's
        gate_up_proj, down_proj): what core/levers/experts.py quantizes under load_in_4bit, expert by expert."""
        return list(self.stored.expert_weights) if self.stored is not None else []

    @property
    def experts_grouped(self) -> bool:
        """Whether the 4-bit experts compute in grouped products (transformers' experts interface, Llama-4's and
        JetMoE's own classes); DBRX's computes one expert at a time (core/levers/family_experts.py)."""
        return self.stored.experts_grouped if self.stored is not None else True

    @property
    def expert_weight_params(self) -> int:
        return sum(e * a * b for e, a, b in self.expert_weights())

    @property
    def largest_expert_weight(self) -> int:
        """One expert's largest weight (what the 4-bit experts dequantize at a time)."""
        return max((a * b for _, a, b in self.expert_weights()), default=0)

    def expert_lora_params(self, rank: int) -> int:
        """LoRA on every experts weight (lora_experts: peft's target_parameters): per weight, A is
        (rank x experts) x one side and B the other side x (rank x experts)."""
        return sum(rank * e * (a + b) for e, a, b in self.expert_weights())

    @property
    def small_params(self) -> int:
        """Everything else kept unquantized: norms, biases (counted from the model: routers, MoE experts, position
        embeddings too)."""
        if self.stored is not None:
            return self.stored.other
        norms = (self.norms_per_layer * self.num_hidden_layers + 1) * self.hidden_size
        bias = self.num_hidden_layers * (self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0
        return norms + bias

    @property
    def unquantized_params(self) -> int:
        return self.embed_params + self.head_params + self.small_params

    @property
    def total_params(self) -> int:
        return self.linear_params + self.unquantized_params

    @property
    def largest_linear(self) -> int:
        # Phi-3's gate_up_proj (h x 2 intermediate) is one weight, dequantized whole: twice its gate_proj part
        return max((a * b for a, b in self.quantized_weights()), default=0)

    def lora_names(self, targets: list[str] | tuple[str, ...]) -> list[str]:
        """TrainConfig.lora_target_modules as Llama-style names (groups expanded; fused names split), in block order."""
        groups = {"attention": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj"),
                  "qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
        dims = self.module_dims()
        wanted = set(dims) if "all_linear" in targets else {n for t in targets for n in groups.get(t, (t,))}
        return [n for n in dims if n in wanted]

    def lora_dims(self, targets: list[str] | tuple[str, ...]) -> list[tuple[int, int]]:
        """(in, out) of each adapted linear layer of one block. Phi-3 fuses q/k/v and gate/up: one adapter each
        (core/model/lora_targets.py maps q_proj to its qkv_proj), so asking for any part adapts the whole fused layer."""
        names, dims = self.lora_names(targets), self.module_dims()
        if not self.fused:
            return [dims[n] for n in names]
        out = []
        if any(n in names for n in ("q_proj", "k_proj", "v_proj")):
            out.append((self.hidden_size, self.q_dim + 2 * self.kv_dim))
        if "o_proj" in names:
            out.append(dims["o_proj"])
        if any(n in names for n in ("gate_proj", "up_proj")):
            out.append((self.hidden_size, 2 * self.intermediate_size))
        if "down_proj" in names:
            out.append(dims["down_proj"])
        return out

    def lora_params(self, rank: int, targets: list[str] | tuple[str, ...]) -> int:
        return self.num_hidden_layers * sum(rank * (a + b) for a, b in self.lora_dims(targets))

    @classmethod
    def from_config(cls, config: dict[str, Any], name: str = "") -> "ModelShape":
        """The shape of a Hugging Face config.json mapping, counted from the model transformers builds of it on the
        meta device (every parameter as the loader stores it); read from its Llama-style keys where transformers
        cannot build it (a model_type it does not know: remote code)."""
        if isinstance(config.get("model_type"), str):
            try:
                shape = _shape_from_json(json.dumps(config, sort_keys=True))
            except Exception:  # noqa: BLE001 - unknown to this transformers, or not a causal LM: the keys below
                shape = None
            if shape is not None:
                return replace(shape, name=name or str(config.get("_name_or_path", "") or shape.model_type))
        return cls.from_keys(config, name)

    @classmethod
    def from_keys(cls, config: dict[str, Any], name: str = "") -> "ModelShape":
        """Read the Llama-style keys of a config.json mapping (a multimodal one's text_config too)."""
        cfg = config
        if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
            cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
        try:
            model_type = str(cfg.get("model_type", "llama"))
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(
                name=name or str(cfg.get("_name_or_path", "") or model_type),
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", model_type.startswith("gemma"))),
                max_position_embeddings=int(cfg.get("max_position_embeddings") or 0),
                model_type=model_type,
                attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
                norms_per_layer=4 if model_type in ("gemma2", "gemma3", "gemma3_text") else 2,
                attn_softcap=cfg.get("attn_logit_softcapping", 50.0 if model_type == "gemma2" else None) is not None,
                vision_config_text=json.dumps(config, sort_keys=True) if config.get("vision_config") else "",
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ShapeError(f"config of {name or 'the model'} lacks a usable {exc} entry: it does not look like "
                             "a decoder-only causal LM config") from None


# --- what the model really stores, counted on the meta device ---------------------------------------------------
@dataclass(frozen=True)
class StoredCount:
    """Parameters of the model transformers builds from config.json, by how memtune's loader stores them: the
    weights bitsandbytes quantizes (every nn.Linear / Conv1D that transformers' 4-bit quantizer converts: not the
    output head, not tied or fp32-kept modules), the input embedding, an untied head, and everything else (norms,
    biases, routers, MoE experts' fused 3-D tensors, position embeddings, conv/SSM parameters), which stays in
    the compute dtype, or fp32 after the recipe's upcast (peft's prepare_model_for_kbit_training upcasts every
    16-bit parameter that is not 4-bit)."""

    quantizable: tuple[tuple[int, int], ...]  # (in, out) of each weight the 4-bit quantizer converts
    embed: int
    head: int  # 0 when tied to the input embedding
    other: int
    experts: int = 0  # of `other`: the MoE experts' 3-D parameters
    largest_expert: int = 0  # the largest one (one layer's gate_up_proj) where loading stacks it from one tensor per
    # expert (transformers' checkpoint conversion merges them: Qwen3-MoE, Mixtral, OLMoE); 0 where stored fused (gpt-oss)
    # [experts, rows, cols] of each experts weight stored in 4 bits under load_in_4bit (core/levers/expert_store.py,
    # the loader's own rule); any other weight holding several experts stays 16-bit, counted in `other`
    expert_weights: tuple[tuple[int, int, int], ...] = ()
    experts_grouped: bool = True  # the 4-bit experts compute in grouped products (expert_store.Stored.grouped)
    moe_layers: int = 0  # decoder layers holding experts


def _count_meta(model, config, exclude: tuple[str, ...] = ()) -> tuple[StoredCount, dict[str, Any]]:
    """(the stored count, the architecture numbers read from real module shapes) of a model on the meta device;
    the modules under `exclude` (an image-text model's vision side, which its own estimate counts) left out."""
    import torch
    from transformers.pytorch_utils import Conv1D

    from core.levers import expert_store  # what the loader stores in 4 bits
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = list(set(get_keys_to_not_convert(model)) | set(getattr(model, "_keep_in_fp32_modules", None) or []))
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    quantized, counted = [], set()
    # the widest input of a non-attention linear producing the hidden size: the dense MLP's down projection
    # (llama down_proj, gpt2 mlp.c_proj, opt fc2, bloom/falcon dense_4h_to_h)
    hidden = int(config.hidden_size)
    mlp_inter = 0
    def outside(name: str) -> bool:
        return not any(name == e or name.startswith(e + ".") for e in exclude)

    for name, module in model.named_modules():
        if not outside(name):
            continue
        conv = isinstance(module, Conv1D)
        if not (conv or isinstance(module, torch.nn.Linear)):
            continue
        a, b = module.weight.shape if conv else (module.in_features, module.out_features)
        if b == hidden and "attn" not in name and "attention" not in name:
            mlp_inter = max(mlp_inter, int(a))
        # the quantizer's own test: exactly nn.Linear (a subclass such as Falcon's FalconLinear stays 16-bit) or Conv1D
        if (conv or type(module) is torch.nn.Linear) and should_convert_module(name, skip):
            quantized.append((int(a), int(b)))
            counted.add(id(module.weight))
    embed = emb.weight.numel() if emb is not None else 0
    tied = head is None or emb is None or head.weight is emb.weight
    head_n = 0 if tied else head.weight.numel()
    skip_ids = counted | ({id(emb.weight)} if emb is not None else set()) | ({id(head.weight)} if not tied else set())
    other = experts = largest = 0
    store = expert_store.plan(model)
    routed = {s.path: s for s in store.quantized}
    expert_inter = n_experts = 0
    for name, p in model.named_parameters(remove_duplicate=True):
        if id(p) in skip_ids or not outside(name):
            continue
        other += p.numel()
        stored = routed.get(name)
        if stored is not None or (p.dim() == 3 and "expert" in name):
            experts += p.numel()
            largest = max(largest, p.numel())
            n_experts = stored.experts if stored is not None else int(p.shape[0])
            if name.endswith("gate_up_proj"):  # (experts, hidden, 2 x width) or (experts, 2 x width, hidden)
                dims = [int(d) for d in p.shape[1:]]
                wide = dims[1] if dims[0] == hidden else dims[0]
                expert_inter = wide // 2
            elif name.endswith(".w1") and stored is not None:  # DBRX: [experts x width, hidden]
                expert_inter = stored.rows
    layers = {_layer_of(path) for path in [*routed, *(n for n, _ in store.unrouted)]}
    numbers = {"mlp_inter": mlp_inter, "experts": n_experts, "expert_inter": expert_inter}
    return StoredCount(tuple(quantized), int(embed), int(head_n), int(other), int(experts), int(largest),
                       tuple(s.shape for s in store.quantized),
                       experts_grouped=all(s.grouped for s in store.quantized), moe_layers=len(layers)), numbers


def _layer_of(path: str) -> str:
    """A parameter path up to its decoder layer's index ("model.layers.3"), which experts share per layer."""
    parts = path.split(".")
    return ".".join(parts[:next((i + 1 for i, p in enumerate(parts) if p.isdigit()), len(parts))])


def _stacks_experts(model_type: str) -> bool:
    """Whether transformers loads this family's checkpoint one tensor per expert and stacks them (MergeModulelist)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        mapping = get_checkpoint_conversion_mapping(model_type) or []
    except Exception:  # noqa: BLE001 - another transformers without this table: assume the Hub's per-expert layout
        return True
    return any(type(op).__name__ == "MergeModulelist" for m in mapping for op in getattr(m, "operations", []))


def _first(config, *names):
    for n in names:
        v = getattr(config, n, None)
        if v is not None and not isinstance(v, bool):
            return v
    return None


def _special_float(value: dict) -> Any:
    """transformers writes inf and nan into config.json as {"__float__": "Infinity"} (Mamba's time_step_limit)."""
    return float(value["__float__"]) if set(value) == {"__float__"} else value


@functools.lru_cache(maxsize=32)
def _shape_from_json(text: str) -> "ModelShape":
    """The shape of config.json `text` from the model transformers builds of it on the meta device (no weights,
    a second or two for 30B), so no family is listed by hand. Cached per config text."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(text, object_hook=_special_float)
    values = {k: v for k, v in data.items() if k not in ("model_type", "architectures", "auto_map")}
    config = AutoConfig.for_model(data["model_type"], **values)
    text_cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    image_text = vision.is_vision_config(config)
    with TREE_LOCK, torch.device("meta"):  # the app builds trees in several threads: one at a time
        model = vision.skeleton(config) if image_text else AutoModelForCausalLM.from_config(config)
    stored, numbers = _count_meta(model, text_cfg, tuple(vision.vision_modules(model)) if image_text else ())
    if stored.largest_expert and not _stacks_experts(str(config.model_type)):
        stored = replace(stored, largest_expert=0)
    c = text_cfg
    # transformers' attribute_map gives Llama names to gpt2's n_embd/n_head/n_layer, opt's, bloom's, falcon's ...
    hidden, heads, layers = int(c.hidden_size), int(c.num_attention_heads), int(c.num_hidden_layers)
    kv = _first(c, "num_key_value_heads", "num_kv_heads", "multi_query_group_num")
    if kv is None:
        kv = 1 if getattr(c, "multi_query", False) and not getattr(c, "new_decoder_architecture", False) else heads
    head_dim = int(_first(c, "head_dim") or hidden // heads)
    n_experts = numbers["experts"]
    top_k = int(_first(c, "num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk") or 0)
    expert_inter = numbers["expert_inter"] or int(_first(c, "moe_intermediate_size") or 0)
    inter = numbers["mlp_inter"] or expert_inter or int(_first(c, "intermediate_size") or 4 * hidden)
    vocab = int(c.vocab_size)
    model_type = str(c.model_type)
    norms_per_layer = 4 if model_type in ("gemma2", "gemma3", "gemma3_text") else 2
    moe_layers = stored.moe_layers if n_experts else 0
    return ModelShape(
        name=model_type, vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=int(kv), head_dim=head_dim, tie_word_embeddings=stored.head == 0,
        max_position_embeddings=int(_first(c, "max_position_embeddings") or 0), model_type=model_type,
        attention_bias=bool(getattr(c, "attention_bias", model_type == "qwen2")), norms_per_layer=norms_per_layer,
        attn_softcap=getattr(c, "attn_logit_softcapping", None) is not None, stored=stored,
        num_experts=n_experts, num_experts_per_tok=top_k if n_experts else 0,
        expert_intermediate_size=expert_inter if n_experts else 0, moe_layers=moe_layers,
        dense_mlp=bool(numbers["mlp_inter"]), config_text=_text_config_text(text_cfg) if image_text else text,
        vision_config_text=text if image_text else "")


def _text_config_text(text_cfg) -> str:
    """An image-text model's language model as a config.json text core/estimate/measure.py builds one decoder layer
    of, where transformers has a causal LM class for its model_type (Gemma-3's, LLaVA's and Idefics3's Llama);
    "" where it has none (Qwen2.5-VL's text model: the formula then)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if text_cfg.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return ""
    return json.dumps(text_cfg.to_dict(), sort_keys=True)


def _llama(name, vocab, h, i, layers, heads, kv, head_dim, tie, max_pos, **kw) -> ModelShape:
    return ModelShape(name, vocab, h, i, layers, heads, kv, head_dim, tie, max_pos, **kw)


def _qwen(name, vocab, h, i, layers, heads, kv, tie, max_pos) -> ModelShape:
    return ModelShape(name, vocab, h, i, layers, heads, kv, h // heads, tie, max_pos, model_type="qwen2",
                      attention_bias=True)


def _gemma2(name, h, i, layers, heads, kv, head_dim) -> ModelShape:
    return ModelShape(name, 256000, h, i, layers, heads, kv, head_dim, True, 8192, model_type="gemma2",
                      norms_per_layer=4, attn_softcap=True)


# name: vocab, hidden, intermediate, layers, heads, kv heads, (head_dim), tied, max positions
SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    _llama("meta-llama/Llama-2-7b-hf", 32000, 4096, 11008, 32, 32, 32, 128, False, 4096),
    _llama("meta-llama/Llama-2-13b-hf", 32000, 5120, 13824, 40, 40, 40, 128, False, 4096),
    _llama("meta-llama/Llama-3.2-1B", 128256, 2048, 8192, 16, 32, 8, 64, True, 131072),
    _llama("meta-llama/Llama-3.2-3B", 128256, 3072, 8192, 28, 24, 8, 128, True, 131072),
    _llama("meta-llama/Llama-3.1-8B", 128256, 4096, 14336, 32, 32, 8, 128, False, 131072),
    _llama("meta-llama/Llama-3.1-70B", 128256, 8192, 28672, 80, 64, 8, 128, False, 131072),
    _llama("mistralai/Mistral-7B-v0.3", 32768, 4096, 14336, 32, 32, 8, 128, False, 32768, model_type="mistral"),
    _qwen("Qwen/Qwen2.5-0.5B", 151936, 896, 4864, 24, 14, 2, True, 32768),
    _qwen("Qwen/Qwen2.5-1.5B", 151936, 1536, 8960, 28, 12, 2, True, 131072),
    _qwen("Qwen/Qwen2.5-3B", 151936, 2048, 11008, 36, 16, 2, True, 32768),
    _qwen("Qwen/Qwen2.5-7B", 152064, 3584, 18944, 28, 28, 4, False, 131072),
    _qwen("Qwen/Qwen2.5-14B", 152064, 5120, 13824, 48, 40, 8, False, 131072),
    _qwen("Qwen/Qwen2.5-32B", 152064, 5120, 27648, 64, 40, 8, False, 131072),
    _qwen("Qwen/Qwen2.5-72B", 152064, 8192, 29568, 80, 64, 8, False, 131072),
    _gemma2("google/gemma-2-2b", 2304, 9216, 26, 8, 4, 256),
    _gemma2("google/gemma-2-9b", 3584, 14336, 42, 16, 8, 256),
    _gemma2("google/gemma-2-27b", 4608, 36864, 46, 32, 16, 128),
    # the rest of README's support matrix (config.json on the Hub)
    _llama("mistralai/Mistral-7B-v0.1", 32000, 4096, 14336, 32, 32, 8, 128, False, 32768, model_type="mistral"),
    _llama("Qwen/Qwen3-0.6B", 151936, 1024, 3072, 28, 16, 8, 128, True, 40960, model_type="qwen3"),
    _llama("Qwen/Qwen3-4B", 151936, 2560, 9728, 36, 32, 8, 128, True, 40960, model_type="qwen3"),
    _llama("Qwen/Qwen3-8B", 151936, 4096, 12288, 36, 32, 8, 128, False, 40960, model_type="qwen3"),
    _llama("Qwen/Qwen3-14B", 151936, 5120, 17408, 40, 40, 8, 128, False, 40960, model_type="qwen3"),
    ModelShape("google/gemma-3-1b-pt", 262144, 1152, 6912, 26, 4, 1, 256, True, 32768, model_type="gemma3_text",
               norms_per_layer=4),
    ModelShape("google/gemma-3-4b-pt", 262208, 2560, 10240, 34, 8, 4, 256, True, 131072, model_type="gemma3_text",
               norms_per_layer=4),
    _llama("microsoft/Phi-3-mini-4k-instruct", 32064, 3072, 8192, 32, 32, 32, 96, False, 4096, model_type="phi3"),
    _llama("microsoft/phi-4", 100352, 5120, 17920, 40, 40, 10, 128, False, 16384, model_type="phi3"),
    _llama("HuggingFaceTB/SmolLM2-135M", 49152, 576, 1536, 30, 9, 3, 64, True, 8192),
    _llama("HuggingFaceTB/SmolLM2-1.7B", 49152, 2048, 8192, 24, 32, 32, 64, True, 8192),
    _llama("HuggingFaceTB/SmolLM3-3B", 128256, 2048, 11008, 36, 16, 4, 128, True, 65536, model_type="smollm3"),
)}

# Hub models without a hand shape: their config.json (the numbers that decide the stored parameters), built on the
# meta device like a local config, so their MoE experts are counted as the model holds them.
CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-30B-A3B": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                               moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                               num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                               decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
                               max_position_embeddings=40960),
    "mistralai/Mixtral-8x7B-v0.1": dict(model_type="mixtral", vocab_size=32000, hidden_size=4096,
                                        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                                        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                                        tie_word_embeddings=False, max_position_embeddings=32768),
    "openai/gpt-oss-20b": dict(model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880,
                               num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                               num_local_experts=32, num_experts_per_tok=4, experts_per_token=4,
                               tie_word_embeddings=False,
                               max_position_embeddings=131072),
    "allenai/OLMoE-1B-7B-0924": dict(model_type="olmoe", vocab_size=50304, hidden_size=2048, intermediate_size=1024,
                                     num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                                     num_experts=64, num_experts_per_tok=8, tie_word_embeddings=False,
                                     max_position_embeddings=4096),
}

_ALIASES = {"meta-llama/meta-llama-3.1-8b": "meta-llama/Llama-3.1-8B",
            "meta-llama/meta-llama-3.1-70b": "meta-llama/Llama-3.1-70B",
            "meta-llama/llama-2-7b-chat-hf": "meta-llama/Llama-2-7b-hf",
            "meta-llama/llama-2-13b-chat-hf": "meta-llama/Llama-2-13b-hf"}
_SUFFIXES = ("-instruct", "-it", "-chat")


def table_lookup(model_id: str) -> ModelShape | None:
    """The built-in shape for a Hub id (case-insensitive; -Instruct/-it variants map to their base)."""
    key = model_id.strip().lower()
    by_lower = {k.lower(): v for k, v in SHAPES.items()}
    for candidate in (key, *(key[: -len(s)] for s in _SUFFIXES if key.endswith(s))):
        candidate = _ALIASES.get(candidate, candidate).lower()
        if candidate in by_lower:
            return by_lower[candidate]
    # A bare name without the organisation, e.g. "Llama-3.1-8B"
    names = {k.split("/")[-1]: v for k, v in by_lower.items()}
    for candidate in (key, *(key[: -len(s)] for s in _SUFFIXES if key.endswith(s))):
        if "/" not in candidate and candidate in names:
            return names[candidate]
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ShapeError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ShapeError(f"{path} does not hold a JSON object")
    return data


def _hf_cache_config(model_id: str) -> Path | None:
    """config.json of a Hub model already in the local Hugging Face cache; never touches the network."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model_id, "config.json")
    except Exception:  # not a valid repo id, or no huggingface_hub
        return None
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def config_source(model: str, demo_folder: Path | None = None) -> dict[str, Any] | ModelShape | None:
    """Where `model`'s shape comes from, without building anything: config.json's mapping (the demo model's, in
    `demo_folder`, the text or the vision demo's; a local folder or file; the Hugging Face cache; memtune's CONFIGS) or the built-in table's shape.
    None for the demo model before its folder exists; ShapeError naming what was tried for an unknown model."""
    model = (model or "").strip()
    if not model:
        raise ShapeError("no model given")
    if model in (DEMO_MODEL, DEMO_VISION_MODEL):
        path = (demo_folder or Path()) / "config.json"
        return _read_json(path) if demo_folder is not None and path.is_file() else None
    local = Path(model).expanduser()
    if local.is_dir():
        if (local / "config.json").is_file():
            return _read_json(local / "config.json")
        raise ShapeError(f"the folder {local} has no config.json")
    if local.is_file():
        return _read_json(local)
    cached = _hf_cache_config(model)
    if cached is not None:
        return _read_json(cached)
    for hub_id, config in CONFIGS.items():
        if model.lower() in (hub_id.lower(), hub_id.split("/")[-1].lower()) or \
                any(model.lower() == (hub_id + s).lower() for s in _SUFFIXES):
            return config
    shape = table_lookup(model)
    if shape is not None:
        return replace(shape, name=model) if shape.name.lower() != model.lower() else shape
    known = ", ".join([*SHAPES, *CONFIGS])
    raise ShapeError(f"the shape of {model!r} is unknown: it is not a local folder, not in the Hugging Face cache "
                     f"and not in memtune's table ({known}). Download the model once, or give the path of its "
                     "config.json.")


def get_shape(model: str) -> ModelShape:
    """The shape of `model`: a Hub id, a local model folder, a config.json path, or the demo model."""
    model = (model or "").strip()
    demo = None
    if model == DEMO_MODEL:
        from core.demo import ensure_demo_model

        demo = ensure_demo_model()
    elif model == DEMO_VISION_MODEL:
        from core.demo_vision import ensure_tiny_model

        demo = ensure_tiny_model()
    source = config_source(model, demo)
    return source if isinstance(source, ModelShape) else ModelShape.from_config(source, model)
