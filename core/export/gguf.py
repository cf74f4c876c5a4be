"""GGUF export: a transformers model folder (or a memtune adapter merged into its base) -> .gguf files for llama.cpp,
Ollama and LM Studio, in several formats in one go, with an Ollama Modelfile and a README of the exact commands.

The file format, the quantizers and llama.cpp's tensor names come from the `gguf` package (llama.cpp's own
gguf-py). Which tensors and metadata a transformers model becomes is ours, following llama.cpp's converter
(convert_hf_to_gguf.py) for the architectures below:

- Llama (and Mistral and SmolLM2, which llama.cpp runs as `llama`; SmolLM3 as `smollm3`): q/k projection rows are
  permuted from transformers' rotate-half layout to llama.cpp's interleaved RoPE layout (`permute_qk`; transformers'
  GGUF loader undoes it); Llama-3.1+ "llama3" RoPE scaling becomes the `rope_freqs` tensor llama.cpp multiplies
  the frequencies by. SmolLM3's no-RoPE layers must be every 4th, the rule llama.cpp hard-codes.
- Qwen2 (q/k/v biases), Qwen3 (q/k norms): no permutation (llama.cpp runs them with NEOX RoPE, like transformers).
- Gemma-2 and Gemma-3 (text): every RMSNorm weight gets +1 (transformers multiplies by 1 + w, llama.cpp by w),
  soft-capping and sliding windows go into the metadata, Gemma-3's per-layer sliding pattern and local RoPE base
  too; llama.cpp scales queries by 1/sqrt(head_dim), so another query_pre_attn_scalar is refused.
- Phi-3: fused qkv_proj and gate_up_proj stay fused (llama.cpp's attn_qkv and ffn_up), partial rotary dims.

Tensors are converted and written one at a time from the safetensors files (the GGUF writer's streaming API), so
converting needs little memory beyond one tensor; merging the adapter first is what needs RAM (core.export.adapter).
`export_gguf` writes everything into a temporary folder and renames it into place; memtune's `.memtune.json`
marker (kind export) says the folder is memtune's, the only kind it will replace.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from core.messages import HandsOn, Said

GiB = 2**30
MiB = 2**20
Progress = Callable[[float, str], Any]

# memtune format name -> (GGML tensor type for 2-D weights, llama.cpp file type). 1-D tensors stay F32.
FORMATS = {"f16": ("F16", "MOSTLY_F16"), "bf16": ("BF16", "MOSTLY_BF16"), "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
           "f32": ("F32", "ALL_F32")}
# K-quants, written from the F16 file by llama.cpp's own quantizer (core.export.kquant): format -> (the main GGML
# type, llama.cpp file type); llama.cpp's mix gives some tensors more bits.
KQUANTS = {"q4_k_m": ("Q4_K", "MOSTLY_Q4_K_M"), "q5_k_m": ("Q5_K", "MOSTLY_Q5_K_M"), "q6_k": ("Q6_K", "MOSTLY_Q6_K")}
# transformers architecture -> (llama.cpp architecture, q/k rows permuted for llama.cpp's RoPE, RMSNorm weights
# stored as w - 1 (Gemma), tie_word_embeddings when config.json leaves it out: the config class's default)
ARCHITECTURES = {"LlamaForCausalLM": ("LLAMA", True, False, False), "MistralForCausalLM": ("LLAMA", True, False, False),
                 "Qwen2ForCausalLM": ("QWEN2", False, False, False), "Qwen3ForCausalLM": ("QWEN3", False, False, False),
                 "Gemma2ForCausalLM": ("GEMMA2", False, True, True), "Gemma3ForCausalLM": ("GEMMA3", False, True, True),
                 "Phi3ForCausalLM": ("PHI3", False, False, False), "SmolLM3ForCausalLM": ("SMOLLM3", True, False, True)}
FAMILY_NAMES = "Llama (incl. Llama 3.x, SmolLM2), Mistral, Qwen2, Qwen3, Gemma-2, Gemma-3 (text), Phi-3, SmolLM3"
# Architectures people bring that llama.cpp runs but this export does not convert (yet): named in the refusal
NOT_CONVERTED = {"Gemma3ForConditionalGeneration": "Gemma-3 with its vision tower (multimodal)",
                 "MixtralForCausalLM": "Mixtral (mixture of experts)", "Qwen2MoeForCausalLM": "Qwen2-MoE",
                 "Qwen3MoeForCausalLM": "Qwen3-MoE", "GemmaForCausalLM": "Gemma (1st generation)",
                 "Phi3SmallForCausalLM": "Phi-3-small", "PhiForCausalLM": "Phi-2", "GPT2LMHeadModel": "GPT-2"}
# Byte-level BPE pre-tokenizer regexes (tokenizer.json Split patterns) -> llama.cpp's `tokenizer.ggml.pre` names
PRE_TOKENIZERS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "llama-bpe",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "qwen2",
}
# memtune's own prompt format (core.data.formats.DEFAULT_TEMPLATE and _render_default: the last user turn is the
# instruction, a lone system turn or the other turns the Input section) as a chat template, for models that have
# none: llama.cpp's chat modes and chat front-ends then prompt the model as it was trained. No BOS text: llama.cpp
# adds BOS itself. tests/test_gguf.py renders it against core.data.formats for several conversations.
MEMTUNE_CHAT_TEMPLATE = (
    "{%- if messages[-1]['role'] == 'assistant' -%}{%- set turns = messages[:-1] -%}"
    "{%- else -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- set ns = namespace(at=-1, context='') -%}"
    "{%- for m in turns -%}{%- if m['role'] == 'user' -%}{%- set ns.at = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- if ns.at == -1 or turns | length == 1 -%}{%- set ns.at = turns | length - 1 -%}{%- endif -%}"
    "{%- set before = turns[:ns.at] + turns[ns.at + 1:] -%}"
    "{%- if before | length == 1 and before[0]['role'] == 'system' -%}{%- set ns.context = before[0]['content'] -%}"
    "{%- else -%}{%- for m in before -%}{%- if m['content'] | trim -%}"
    "{%- set ns.context = ns.context + ('\n' if ns.context else '') + (m['role'] | capitalize) + ': ' + m['content'] -%}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '### Instruction:\n' + (turns[ns.at]['content'] | trim) + '\n\n' -}}"
    "{%- if ns.context | trim -%}{{- '### Input:\n' + (ns.context | trim) + '\n\n' -}}{%- endif -%}"
    "{{- '### Response:\n' -}}"
    "{%- if messages[-1]['role'] == 'assistant' -%}{{- messages[-1]['content'] + eos_token -}}{%- endif -%}")
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


class GGUFError(HandsOn, RuntimeError):
    """A GGUF export could not be done; the message says why and what to do: a `gguf.err.*` locale key and its
    parameters (core.messages.Keyed), or a message handed on whole (a Said: core.infer.said), so the page says it in
    its language."""


def supported() -> dict[str, str]:
    """The supported families and architectures, as the parameters of a refusal that names them."""
    return {"families": FAMILY_NAMES, "archs": ", ".join(ARCHITECTURES)}


def parse_formats(formats: str | list[str] | tuple[str, ...]) -> list[str]:
    """'f16,q8_0' or ['f16', 'q8_0'] -> the known format names in order, once each; GGUFError for unknown ones."""
    items = formats.split(",") if isinstance(formats, str) else list(formats)
    names = [f.strip().lower() for f in items if f and f.strip()]
    bad = [f for f in names if f not in FORMATS and f not in KQUANTS]
    if bad or not names:
        raise GGUFError("gguf.err.formats" if bad else "gguf.err.no_formats", bad=", ".join(bad),
                        formats=", ".join([*FORMATS, *KQUANTS]))
    return list(dict.fromkeys(names))


# --- model folder: config, architecture, tensor shapes ----------------------------------------------------------
def read_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise GGUFError("gguf.err.no_config", path=str(model_dir))
    return json.loads(path.read_text(encoding="utf-8"))


def family(config: dict[str, Any]) -> tuple[str, bool, bool, bool]:
    """(llama.cpp architecture name, permute q/k, Gemma norm shift, tied default) for a config.json, or GGUFError
    naming what is supported."""
    import gguf

    archs = config.get("architectures") or []
    for name in archs:
        if name in ARCHITECTURES:
            arch, permute, shift, tied = ARCHITECTURES[name]
            arch = gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, arch)]
            _refuse_unrun_window(config, arch)
            return arch, permute, shift, tied
    named = [f"{NOT_CONVERTED[a]} ({a})" for a in archs if a in NOT_CONVERTED]
    if named:
        what = ", ".join(named)
    elif config.get("vision_config") or config.get("text_config"):
        what = Said("gguf.what.multimodal")
    else:
        what = ", ".join(archs) or config.get("model_type") or Said("gguf.what.unknown")
    raise GGUFError("gguf.err.unsupported", what=what, **supported())


# llama.cpp architectures whose attention honours a sliding window (the window and its layer pattern are written
# by _family_metadata). llama.cpp's llama (Mistral), qwen2, qwen3 and smollm3 have none, and its phi3 reads the
# window but runs without it ("Phi SWA is currently disabled").
SLIDING_WINDOW_ARCHS = ("gemma2", "gemma3")


def attention_window(config: dict[str, Any]) -> int | None:
    """The sliding window transformers runs at least one layer with, or None (full attention everywhere): the
    config class's own resolution (Qwen2's use_sliding_window and max_window_layers, layer_types), so the answer is
    what the model does, not what config.json happens to spell out."""
    from transformers import AutoConfig

    values = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "transformers_version")}
    try:
        hf = AutoConfig.for_model(config.get("model_type", ""), **values)
    except (ValueError, TypeError, KeyError):
        return None
    window = getattr(hf, "sliding_window", None)
    types = getattr(hf, "layer_types", None)
    if not window or (types is not None and "sliding_attention" not in types):
        return None
    return int(window)


def _refuse_unrun_window(config: dict[str, Any], arch: str) -> None:
    """GGUFError when transformers attends through a sliding window that llama.cpp's `arch` does not run: once a
    prompt is longer than the window, llama.cpp would see tokens the model never attends to (Mistral v0.1: 4096,
    Phi-3-mini-4k: 2047). A window at least as long as the model's context never engages, so it passes."""
    window = attention_window(config)
    context = int(config.get("max_position_embeddings") or 0)
    if arch in SLIDING_WINDOW_ARCHS or window is None or (context and window >= context):
        return
    name = next(iter(config.get("architectures") or []), arch)
    raise GGUFError("gguf.err.window", name=name, window=window, arch=arch)


def architecture(config: dict[str, Any]) -> tuple[str, bool]:
    """(llama.cpp architecture name, permute q/k) for a config.json, or GGUFError naming what is supported."""
    arch, permute, _, _ = family(config)
    return arch, permute


def safetensors_shapes(model_dir: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from the folder's safetensors headers (no weights read)."""
    shapes: dict[str, list[int]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with path.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        shapes.update({k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return shapes


def _tied(config: dict[str, Any]) -> bool:
    return bool(config.get("tie_word_embeddings", family(config)[3]))


def tensor_type(fmt: str, gguf_name: str, shape: list[int]) -> str:
    """The GGML type a tensor gets in format `fmt`: 1-D (norms, biases, rope_freqs) stay F32, as in llama.cpp; a
    row not a multiple of the 32-value Q8_0 block falls back to F16."""
    kind = FORMATS[fmt][0]
    if len(shape) < 2 or gguf_name == "rope_freqs.weight":
        return "F32"
    if kind == "Q8_0" and shape[-1] % 32:
        return "F16"
    return kind


def tensor_nbytes(kind: str, shape: list[int]) -> int:
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, kind)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return math.prod(shape[:-1]) * (shape[-1] // block) * size


# --- tensors --------------------------------------------------------------------------------------------------------
def permute_qk(weights: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' rotate-half q/k rows -> llama.cpp's interleaved pairs (convert_hf_to_gguf's LlamaModel.permute);
    n_head is the key/value head count for k_proj."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def rope_params(config: dict[str, Any], layer: str = "full_attention") -> dict[str, Any]:
    """RoPE settings from either transformers 5's `rope_parameters` (flat, or per layer type as Gemma-3's
    full_attention / sliding_attention) or the older `rope_theta` + `rope_scaling` (+ rope_local_base_freq)."""
    params = dict(config.get("rope_scaling") or {})
    given = config.get("rope_parameters") or {}
    if "full_attention" in given or "sliding_attention" in given:
        given = given.get(layer) or {}
    elif layer == "sliding_attention":  # flat settings: the older configs name the local base on its own
        params, given = {}, {"rope_theta": config.get("rope_local_base_freq", given.get("rope_theta"))}
    params.update(given)
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default")) or "default"
    return params


def head_dim(config: dict[str, Any]) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def llama3_rope_factors(config: dict[str, Any]) -> np.ndarray:
    """Per-frequency divisors of Llama-3.1's "llama3" RoPE scaling (llama.cpp reads them from `rope_freqs`)."""
    rp = rope_params(config)
    dim = head_dim(config)
    freqs = 1.0 / (float(rp["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    factor, low, high = float(rp.get("factor", 8.0)), float(rp.get("low_freq_factor", 1.0)), \
        float(rp.get("high_freq_factor", 4.0))
    old_ctx = float(rp.get("original_max_position_embeddings", 8192))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def tensor_plan(model_dir: Path, config: dict[str, Any]) -> list[tuple[str, str | None, list[int]]]:
    """[(gguf name, source safetensors name or None for generated, shape)] in file order; GGUFError if a weight
    has no llama.cpp name (an architecture variant we do not map)."""
    import gguf

    arch, _ = architecture(config)
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_enum, int(config["num_hidden_layers"]))
    plan: list[tuple[str, str | None, list[int]]] = []
    for src, shape in safetensors_shapes(model_dir).items():
        if src.endswith("rotary_emb.inv_freq") or (src == "lm_head.weight" and _tied(config)):
            continue  # recomputed from the metadata / the same matrix as token_embd
        dst = names.get_name(src, try_suffixes=(".weight", ".bias"))
        if dst is None:
            raise GGUFError("gguf.err.weight", weight=src, arch=arch, **supported())
        plan.append((dst, src, shape))
    if not plan:
        raise GGUFError("gguf.err.no_weights", path=str(model_dir))
    if rope_params(config)["rope_type"] == "llama3":
        plan.append(("rope_freqs.weight", None, [head_dim(config) // 2]))
    return plan


def file_bytes(plan: list[tuple[str, str | None, list[int]]], fmt: str) -> int:
    """Bytes of the tensors' data in format `fmt`, each padded to the file's 32-byte alignment."""
    return sum(-(-tensor_nbytes(tensor_type(fmt, name, shape), shape) // 32) * 32 for name, _, shape in plan)


def metadata_bytes(model_dir: Path, plan: list[tuple[str, str | None, list[int]]], vocab_size: int) -> int:
    """Bytes of a GGUF file's header beyond the tensors' data, from tokenizer.json alone (no tokenizer loaded):
    every string is stored as an 8-byte length + UTF-8 bytes, token types and scores as 4 bytes each, each tensor
    info as its name + dims + type + offset."""
    path = Path(model_dir) / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    model = spec.get("model") or {}
    vocab = dict(model.get("vocab") or {})
    vocab.update({a["content"]: a["id"] for a in spec.get("added_tokens", [])})
    n = max(vocab_size, len(vocab))
    strings = sum(8 + len(t.encode("utf-8")) for t in vocab) + 8 * (n - len(vocab)) + 6 * (n - len(vocab))
    merges = sum(8 + len(_token_text(m).encode("utf-8")) for m in model.get("merges", []))
    per_token = 4 + (4 if model.get("byte_fallback") else 0)  # types; scores for SentencePiece-style vocabularies
    config_path = Path(model_dir) / "tokenizer_config.json"
    template = len(config_path.read_text(encoding="utf-8")) if config_path.is_file() else 0
    template += len(MEMTUNE_CHAT_TEMPLATE)
    infos = sum(8 + len(name) + 4 + 8 * len(shape) + 4 + 8 for name, _, shape in plan)
    return strings + merges + per_token * n + template + infos + 4096  # + the scalar keys, alignment


def _tensor_data(model_dir: Path, config: dict[str, Any], plan) -> Iterator[np.ndarray]:
    """float32 arrays in plan order, read one at a time from the safetensors files."""
    from safetensors import safe_open

    _, permute, shift, _ = family(config)
    where = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            where.update({k: path for k in fh.keys()})
    n_head, n_kv = int(config["num_attention_heads"]), int(config.get("num_key_value_heads") or
                                                         config["num_attention_heads"])
    for _, src, _ in plan:
        if src is None:
            yield llama3_rope_factors(config)
            continue
        with safe_open(str(where[src]), framework="pt") as fh:
            data = fh.get_tensor(src).float().numpy()
        if permute and (src.endswith("q_proj.weight") or src.endswith("q_proj.bias")):
            data = permute_qk(data, n_head)
        elif permute and (src.endswith("k_proj.weight") or src.endswith("k_proj.bias")):
            data = permute_qk(data, n_kv)
        if shift and src.endswith("norm.weight"):  # Gemma: transformers scales by (1 + w), llama.cpp by w
            data = data + 1.0
        yield data


def _encode(data: np.ndarray, kind: str) -> np.ndarray:
    import gguf

    if kind == "F32":
        return data.astype(np.float32)
    if kind == "F16":
        return data.astype(np.float16)
    return gguf.quants.quantize(data.astype(np.float32), getattr(gguf.GGMLQuantizationType, kind))


# --- metadata ---------------------------------------------------------------------------------------------------------
# llama.cpp picks token handling by general.name (llama-vocab.cpp: a name containing "phi3" or "phi-3" gets Phi-3's
# special-token attributes, and a vocabulary without Phi-3's tokens then fails to load): these words only ever
# belong in the name of the architecture they stand for.
NAME_TRIGGERS = {"phi3": ("phi-3", "phi3"), "modern-bert": ("modern-bert",)}


def _untriggered(name: str, arch: str | None) -> str:
    """`name` less the words that would make llama.cpp treat the file as another architecture (all of them when
    `arch` is None: free text, which may name any), "model" when nothing is left."""
    for owner, words in NAME_TRIGGERS.items():
        if owner != arch:
            for word in words:
                name = re.sub(re.escape(word), "", name, flags=re.I)
    return re.sub(r"[-_. ]{2,}", lambda m: m.group(0)[0], name).strip("-_. ") or "model"


def general_name(config: dict[str, Any], model: str | None = None) -> str:
    """GGUF `general.name`: what the weights are: the base model's name (e.g. "SmolLM2-135M-Instruct"), or for a
    model folder its folder's name, never the transformers class ("Phi3ForCausalLM" gets llama.cpp's Phi-3 token
    handling, which fails on another vocabulary) nor the bare model type (transformers' GGUF loader reads a
    general.name of exactly "mistral" as its own). Words that trigger another architecture's handling are left out;
    a folder's name is free text, so its own architecture's words too."""
    arch = architecture(config)[0]
    if not model:
        return "model"
    return _untriggered(Path(str(model)).name, arch if not Path(str(model)).expanduser().is_dir() else None)


def naming(config: dict[str, Any], model: str | None, finetune: str | None = None,
           repo: str | None = None) -> dict[str, Any]:
    """The general.* keys of llama.cpp's naming convention: name, basename (the base model's), finetune (what this
    file adds: the run's name), and the base model (its name and, for a Hub repo, its URL)."""
    name = general_name(config, model)
    keys: dict[str, Any] = {"name": name, "basename": name}
    if finetune:
        keys["finetune"] = _untriggered(finetune, None)
        keys["base_models"] = [{"name": name, **({"repo_url": f"https://huggingface.co/{repo}"} if repo else {})}]
    return keys


def write_model_metadata(writer, config: dict[str, Any], name: str | dict[str, Any], fmt: str) -> None:
    """`name`: general.name (general_name), or the general.* keys (naming)."""
    import gguf

    arch, _, _, _ = family(config)
    keys = name if isinstance(name, dict) else {"name": name}
    writer.add_name(keys["name"])
    if keys.get("basename"):
        writer.add_basename(keys["basename"])
    if keys.get("finetune"):
        writer.add_finetune(keys["finetune"])
    if keys.get("base_models"):
        writer.add_base_model_count(len(keys["base_models"]))
        for i, base in enumerate(keys["base_models"]):
            writer.add_base_model_name(i, base["name"])
            if base.get("repo_url"):
                writer.add_base_model_repo_url(i, base["repo_url"])
    writer.add_file_type(getattr(gguf.LlamaFileType, FORMATS[fmt][1]))
    if fmt == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    n_head = int(config["num_attention_heads"])
    writer.add_context_length(int(config.get("max_position_embeddings", 2048)))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(int(config.get("num_key_value_heads") or n_head))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(int(config["vocab_size"]))
    dim = head_dim(config)
    rp = rope_params(config)
    rotary = rp.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    # Phi-3 counts rotary dims from hidden/heads (convert_hf_to_gguf's Phi3MiniModel); the others from head_dim
    writer.add_rope_dimension_count(int(float(rotary) * (int(config["hidden_size"]) if arch == "phi3" else dim * n_head))
                                    // n_head)
    if dim != int(config["hidden_size"]) // n_head or arch in ("gemma2", "gemma3"):  # heads narrower than hidden/heads
        writer.add_key_length(dim)
        writer.add_value_length(dim)
    writer.add_rope_freq_base(float(rp["rope_theta"]))
    kind = rp["rope_type"]
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rp["factor"]))
    elif kind == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rp["factor"]))
        if rp.get("original_max_position_embeddings"):
            writer.add_rope_scaling_orig_ctx_len(int(rp["original_max_position_embeddings"]))
    elif kind not in ("default", "llama3"):  # llama3 is the rope_freqs tensor
        raise GGUFError("gguf.err.rope", kind=repr(kind))
    _family_metadata(writer, config, arch, dim)


def _family_metadata(writer, config: dict[str, Any], arch: str, dim: int) -> None:
    """The keys convert_hf_to_gguf.py writes for one family beyond the common ones, and the refusals for settings
    llama.cpp would run differently from transformers."""
    layers = int(config["num_hidden_layers"])
    if arch in ("gemma2", "gemma3"):
        scalar = config.get("query_pre_attn_scalar", dim)
        # llama.cpp: 1/sqrt(hidden/heads) for the 27B (46 / 62 layers), 1/sqrt(head_dim) for every other size
        big = layers == (46 if arch == "gemma2" else 62)
        expected = int(config["hidden_size"]) // int(config["num_attention_heads"]) if big else dim
        if scalar is not None and int(scalar) != expected:
            raise GGUFError("gguf.err.query_scalar", scalar=scalar, arch=arch, expected=expected)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(float(config.get("attn_logit_softcapping") or 0.0))
        writer.add_final_logit_softcapping(float(config.get("final_logit_softcapping") or 0.0))
        writer.add_sliding_window(int(config.get("sliding_window") or 4096))
        types = config.get("layer_types")
        if types and [t == "sliding_attention" for t in types] != [i % 2 == 0 for i in range(layers)]:
            raise GGUFError("gguf.err.gemma2_pattern")
    elif arch == "gemma3":
        if config.get("attn_logit_softcapping"):
            raise GGUFError("gguf.err.gemma3_softcap")
        if config.get("final_logit_softcapping"):
            writer.add_final_logit_softcapping(float(config["final_logit_softcapping"]))
        types = config.get("layer_types") or [
            "full_attention" if (i + 1) % int(config.get("sliding_window_pattern") or 6) == 0 else "sliding_attention"
            for i in range(layers)]
        if config.get("sliding_window") and any(t == "sliding_attention" for t in types):
            writer.add_sliding_window(int(config["sliding_window"]))
            writer.add_sliding_window_pattern(_swa_period([t == "sliding_attention" for t in types]))
            writer.add_rope_freq_base_swa(float(rope_params(config, "sliding_attention")["rope_theta"]))
    elif arch == "phi3":
        rp = rope_params(config)
        if rp["rope_type"] not in ("default",) or rp.get("long_factor"):
            raise GGUFError("gguf.err.phi3_rope", kind=repr(rp["rope_type"]))
        orig = rp.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
        writer.add_rope_scaling_orig_ctx_len(int(orig or config.get("max_position_embeddings", 4096)))
        writer.add_sliding_window(int(config.get("sliding_window") or 0))
    elif arch == "smollm3":
        nope = config.get("no_rope_layers")
        if nope is not None and list(nope) != [int((i + 1) % 4 != 0) for i in range(layers)]:
            raise GGUFError("gguf.err.smollm3_nope")


def _swa_period(sliding: list[bool]) -> int:
    """The period llama.cpp's gemma3 runs `sliding` (one flag per layer) with: it reads sliding_window_pattern only
    as a number n (layer i slides when i % n < n - 1, every n-th layer is full; 0: all slide) and ignores an array,
    running its default of 6 instead. GGUFError for a layer pattern no period gives."""
    for n in [6, 0, *range(1, len(sliding) + 2)]:
        if all(flag == (n == 0 or i % n < n - 1) for i, flag in enumerate(sliding)):
            return n
    raise GGUFError("gguf.err.gemma3_pattern")


def _token_text(token: Any) -> str:
    return token if isinstance(token, str) else " ".join(token)  # merges: "a b" strings or [a, b] pairs


def tokenizer_metadata(model_dir: Path, vocab_size: int) -> dict[str, Any]:
    """Everything llama.cpp needs to tokenize like transformers: model, pre-tokenizer, tokens + types, merges,
    special token ids, add_bos/eos, chat template. GGUFError for tokenizers llama.cpp cannot reproduce."""
    from transformers import AutoTokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise GGUFError("gguf.err.no_tokenizer", path=str(model_dir))
    spec = json.loads(path.read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise GGUFError("gguf.err.tokenizer_type", type=repr(model.get("type")))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    text = json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
    byte_level = '"ByteLevel"' in text
    if byte_level:
        patterns = [p.get("pattern", {}).get("Regex") for p in _walk(spec.get("pre_tokenizer"))
                    if p.get("type") == "Split"]
        patterns = [p for p in patterns if p]
        if not patterns:
            pre = "gpt-2"  # ByteLevel with its built-in GPT-2 regex
        elif patterns[0] in PRE_TOKENIZERS:
            pre = PRE_TOKENIZERS[patterns[0]]
        else:
            raise GGUFError("gguf.err.pre_tokenizer")
        ggml_model = "gpt2"
    elif model.get("byte_fallback"):
        ggml_model, pre = "llama", "default"  # SentencePiece BPE as exported to tokenizer.json
    else:
        raise GGUFError("gguf.err.tokenizer_kind")
    vocab = tok.get_vocab()
    by_id = {i: t for t, i in vocab.items()}
    added = {a["content"]: a for a in spec.get("added_tokens", [])}
    tokens, types, scores = [], [], []
    for i in range(max(vocab_size, len(by_id))):
        token = by_id.get(i)
        if token is None:  # embedding rows past the tokenizer (padding): llama.cpp's [PAD{i}] convention
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
        else:
            tokens.append(token)
            types.append(_token_type(token, i, ggml_model, added, tok.unk_token_id))
        scores.append(-float(i))  # SentencePiece BPE: earlier pieces merge first
    ids = tok("a")["input_ids"]
    config = read_config(model_dir)
    special = {}
    for key in ("bos", "eos", "unk", "pad"):
        # from the tokenizer, else config.json's id (gguf's SpecialVocab does the same: Qwen2 has no bos_token but
        # a bos_token_id of 151643 in config.json, which llama.cpp's converter writes)
        found = getattr(tok, f"{key}_token_id")
        if found is None and key != "unk" and isinstance(config.get(f"{key}_token_id"), int):
            found = config[f"{key}_token_id"]
        special[key] = found
    own_template = tok.chat_template if isinstance(tok.chat_template, str) else None
    meta = dict(model=ggml_model, pre=pre, tokens=tokens, token_types=types, scores=scores,
                merges=[_token_text(m) for m in model.get("merges", [])], **special,
                add_bos=bool(ids) and tok.bos_token_id is not None and ids[0] == tok.bos_token_id,
                add_eos=bool(ids) and tok.eos_token_id is not None and ids[-1] == tok.eos_token_id and len(ids) > 1,
                chat_template=own_template or MEMTUNE_CHAT_TEMPLATE, has_chat_template=own_template is not None,
                space_prefix=space_prefix(spec) if ggml_model == "llama" else None,
                eos_text=tok.eos_token, bos_text=tok.bos_token)
    if len(tokens) > vocab_size:
        raise GGUFError("gguf.err.vocab", tokens=len(tokens), rows=vocab_size)
    return meta


def space_prefix(spec: dict[str, Any]) -> bool:
    """llama.cpp's add_space_prefix for a SentencePiece-style tokenizer.json. llama.cpp puts one "▁" before the text
    and after every special token. The legacy normalizer (Prepend "▁", Llama-2) does exactly that: True. Metaspace
    with prepend_scheme "always" or "first" prepends too (True) but never doubles a leading space, and "first" adds
    nothing after a special token: llama.cpp then differs on text that starts with whitespace or follows a special
    token (tests/test_llama.py measures both), while every prompt memtune writes starts with a letter after BOS.
    "never", or no prefix rule at all (Gemma): False, which llama.cpp reproduces exactly."""
    text = json.dumps([spec.get("normalizer"), spec.get("pre_tokenizer")])
    if '"Prepend"' in text:
        return True
    schemes = [n.get("prepend_scheme", "always" if n.get("add_prefix_space", True) else "never")
               for n in _walk(spec.get("pre_tokenizer")) if n.get("type") == "Metaspace"]
    return bool(schemes) and schemes[0] != "never"


def _looks_special(token: str) -> bool:
    """convert_hf_to_gguf's does_token_look_special: added tokens some models forget to mark special."""
    return token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (token.startswith("<|") and token.endswith("|>")) \
        or (token.startswith("<\uff5c") and token.endswith("\uff5c>")) or (token.startswith("<unused")
                                                                        and token.endswith(">"))


def _token_type(token: str, i: int, ggml_model: str, added: dict[str, dict], unk: int | None) -> int:
    """llama.cpp's token type, in the order its converter decides it: unknown, then byte tokens (<0xNN>, before
    anything else, as gguf's LlamaHfVocab does), then added tokens (control when special or special-looking)."""
    if ggml_model == "llama" and i == unk:
        return TOKEN_UNKNOWN
    if ggml_model == "llama" and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):
        return TOKEN_BYTE
    if token in added:
        return TOKEN_CONTROL if added[token].get("special") or _looks_special(token) else TOKEN_USER_DEFINED
    return TOKEN_NORMAL


def _walk(node: Any) -> Iterator[dict]:
    if isinstance(node, dict):
        yield node
        for child in node.get("pretokenizers", []) or []:
            yield from _walk(child)


def write_tokenizer_metadata(writer, meta: dict[str, Any]) -> None:
    writer.add_tokenizer_model(meta["model"])
    writer.add_tokenizer_pre(meta["pre"])
    writer.add_token_list(meta["tokens"])
    writer.add_token_types(meta["token_types"])
    if meta["model"] == "llama":
        writer.add_token_scores(meta["scores"])
    if meta["merges"]:
        writer.add_token_merges(meta["merges"])
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("unk", writer.add_unk_token_id), ("pad", writer.add_pad_token_id)):
        if meta[key] is not None:
            add(int(meta[key]))
    writer.add_add_bos_token(meta["add_bos"])
    if meta.get("space_prefix") is not None:
        writer.add_add_space_prefix(meta["space_prefix"])
    writer.add_add_eos_token(meta["add_eos"])
    if meta["chat_template"]:
        writer.add_chat_template(meta["chat_template"])


# --- one file ---------------------------------------------------------------------------------------------------------
def write_gguf(model_dir: Path, path: Path, fmt: str, name: str | dict[str, Any],
               progress: Progress | None = None) -> Path:
    """Convert the transformers model folder `model_dir` into the GGUF file `path` in format `fmt`, one tensor at
    a time (the GGUF writer's streaming API: tensor infos first, then each tensor's data). `name`: general.name
    (general_name: what the model is, never free text llama.cpp would pattern-match), or the general.* keys
    (naming)."""
    import gguf

    model_dir, path = Path(model_dir), Path(path)
    config = read_config(model_dir)
    arch, _ = architecture(config)
    plan = tensor_plan(model_dir, config)
    tok_meta = tokenizer_metadata(model_dir, int(config["vocab_size"]))
    writer = gguf.GGUFWriter(str(path), arch)
    try:
        write_model_metadata(writer, config, name, fmt)
        write_tokenizer_metadata(writer, tok_meta)
        kinds = [tensor_type(fmt, dst, shape) for dst, _, shape in plan]
        for (dst, _, shape), kind in zip(plan, kinds):
            qtype = getattr(gguf.GGMLQuantizationType, kind)
            if kind in ("F32", "F16"):
                writer.add_tensor_info(dst, shape, np.dtype(np.float32 if kind == "F32" else np.float16),
                                       tensor_nbytes(kind, shape))
            else:
                byte_shape = list(gguf.quants.quant_shape_to_byte_shape(tuple(shape), qtype))
                writer.add_tensor_info(dst, byte_shape, np.dtype(np.uint8), tensor_nbytes(kind, shape),
                                       raw_dtype=qtype)
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, (data, kind) in enumerate(zip(_tensor_data(model_dir, config, plan), kinds)):
            writer.write_tensor_data(_encode(data, kind))
            if progress is not None and (i % 8 == 0 or i == len(plan) - 1):
                progress((i + 1) / len(plan), Said("gguf.step.tensor", file=path.name, n=i + 1, total=len(plan)))
    finally:
        writer.close()
    return path
