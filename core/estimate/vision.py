"""The vision side of an image-text model's estimate (core/model/vision.py loads it): its weights, what its frozen
tower keeps for backward, and the image tokens of a micro-batch, from config.json's vision_config and the image
budget (image_max_pixels, the processor's own resizing rule per family: core/model/vision.py apply_image_budget).

  weights      the vision encoder and its projector stay unquantized in the load's 16-bit dtype
               (core/model/vision.keep_vision_dtype), counted on the meta device (`vision_params`; the formula
               below from the widths where no model may be built). With the chapter's fp32 upcast they pass
               through fp32 while loading (peft upcasts every non-4-bit weight before keep_vision_dtype casts them
               back): a load-time spike of 2 bytes per parameter.
  image tokens per row: the VisionPlan's real counts when the data is read (the processor's own resizing); else one
               image at the budget (Qwen2-VL family: pixels / (patch x merge)^2; Idefics3 / SmolVLM: (edge / tile)^2
               tiles + the global one, `image_seq_len` each; Gemma-3: mm_tokens_per_image; LLaVA: (size / patch)^2),
               at most max_length (a longer row is dropped, never cut). Patches = image tokens x patches per token.
  activations  transformers' enable_input_require_grads hooks every input embedding, the vision tower's patch
               embedding included, so the frozen tower's activations carry a gradient and autograd keeps, per patch
               and layer (`layer_bytes_per_patch`): both norms' fp32 inputs (CUDA autocast's fp32 LayerNorm; an
               RMSNorm upcasts itself) + 8, attention's q, k, v and output in the compute dtype (a fused qkv's v keeps
               the whole 3-wide output) + fp32 log-sum-exp per head, and the MLP's activation (GELU: its input; CLIP's
               quick_gelu: its input and sigmoid; SwiGLU: gate, up and act(gate)). Frozen linears keep no input. Per patch once: the
               post-norm's input and the projector's (`extra_bytes_per_patch`). With gradient checkpointing (the
               vision blocks are GradientCheckpointingLayers) each block keeps its input only, and one block is
               recomputed in backward. offload_activations moves them to CPU memory as the text layers' (TRL's
               context holds the whole forward), about OFFLOAD_STASH blocks' worth staying. tests/test_vision_estimate.py checks the formula against autograd's saved
               tensors of three tiny towers on the CPU (within 10%).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Protocol

from core.config.slices import DataSlice, LoraSlice, ModelSlice, StageSlice, TrainerSlice
from core.estimate import measure
from core.estimate.terms import OFFLOAD_STASH, dtypes, upcast
from core.model import vision as model_vision
from core.model.shapes import ModelShape

QWEN_DEFAULT_PIXELS = 12_845_056  # Qwen2-VL / Qwen2.5-VL preprocessor_config.json's max_pixels
IDEFICS3_DEFAULT_TILES = 4  # Idefics3 / SmolVLM: size.longest_edge = 4 x max_image_size (their processors' default)
FIT_FLOOR_TOKENS = 64  # Fit lowers an image's budget down to about this many image tokens, never below


class _Seen(ModelSlice, LoraSlice, DataSlice, TrainerSlice, Protocol):
    """The micro-batch's rows and images, the image budget, the step's checkpointing and LoRA on the tower."""


@dataclass(frozen=True)
class VisionShape:
    model_type: str
    hidden: int
    intermediate: int
    depth: int
    heads: int
    patch: int  # patch edge in pixels
    per_token: int  # patches per image token (the merger's / pixel shuffle's / pooling's factor)
    budget: str  # "pixels" | "edge" | "fixed": how the processor takes image_max_pixels (core/model/vision.py)
    mlp_kept: int  # intermediate-wide tensors the MLP keeps: SwiGLU 3 (gate, up, act), quick_gelu 2, GELU 1
    fused_qkv: bool  # one qkv linear: v a view of its output
    tile: int  # Idefics3 / SmolVLM: the tile edge; else the fixed image edge
    fixed_tokens: int  # image tokens of one image where the size is fixed
    projector: int  # per patch: the width of the projector's kept input (LLaVA's GELU, Qwen's merger GELU, Gemma-3's
    # average pooling), else 0
    text_hidden: int
    cls: int = 0  # extra patches per image (CLIP's class token)


def vision_shape(shape: ModelShape) -> VisionShape | None:
    """The vision side of `shape`'s config.json, None for a text model."""
    if not shape.vision_config_text:
        return None
    return read_vision(json.loads(shape.vision_config_text))


def read_vision(config: dict[str, Any]) -> VisionShape:
    v = config["vision_config"]
    text = config.get("text_config") or {}
    family = str(config.get("model_type", ""))  # the Hub's Qwen2.5-VL config.json names no vision model_type
    kind = str(v.get("model_type") or f"{family}_vision")
    text_hidden = int(text.get("hidden_size") or config.get("hidden_size") or 0)
    if family.startswith(("qwen2_vl", "qwen2_5_vl", "qwen3_vl")):
        hidden = int(v.get("embed_dim") or v["hidden_size"])
        inter = int(v.get("intermediate_size") or hidden * int(v.get("mlp_ratio", 4)))
        merge = int(v.get("spatial_merge_size", 2))
        return VisionShape(kind, hidden, inter, int(v["depth"]), int(v["num_heads"]), int(v.get("patch_size", 14)),
                           merge * merge, "pixels", _mlp_kept(v, family.startswith("qwen2_5_vl")), True, 0, 0, hidden,
                           text_hidden)
    hidden, inter = int(v["hidden_size"]), int(v["intermediate_size"])
    depth, heads = int(v["num_hidden_layers"]), int(v["num_attention_heads"])
    patch, size = int(v["patch_size"]), int(v["image_size"])
    patches = (size // patch) ** 2
    if family in ("idefics3", "smolvlm"):
        scale = int(config.get("scale_factor", 2))
        return VisionShape(kind, hidden, inter, depth, heads, patch, scale * scale, "edge", _mlp_kept(v), False,
                           size, patches // (scale * scale), 0, text_hidden)
    tokens = int(config.get("mm_tokens_per_image") or patches)  # Gemma-3 pools 4096 patches into 256
    clip = kind.startswith("clip")
    projector = text_hidden if clip else hidden if tokens < patches else 0  # LLaVA's GELU; Gemma-3's pooling
    return VisionShape(kind, hidden, inter, depth, heads, patch, max(1, patches // tokens), "fixed", _mlp_kept(v),
                       False, size, tokens, projector, text_hidden, cls=1 if clip else 0)


def _mlp_kept(v: dict[str, Any], glu: bool = False) -> int:
    if glu:
        return 3
    return 2 if v.get("hidden_act") == "quick_gelu" else 1  # x * sigmoid(1.702 x) keeps x and the sigmoid


def tokens_per_image(vs: VisionShape, pixels: int) -> int:
    """Image tokens of one image resized within `pixels` (0: the processor's default), the processor's rule."""
    if vs.budget == "pixels":
        side = vs.patch * int(round(vs.per_token ** 0.5))
        return max(4, (pixels or QWEN_DEFAULT_PIXELS) // (side * side))
    if vs.budget == "edge":
        edge = model_vision.budget_edge(pixels, vs.tile) if pixels else IDEFICS3_DEFAULT_TILES * vs.tile
        tiles = (edge // vs.tile) ** 2 + (1 if edge > vs.tile else 0)  # the global image beside the tiles
        return tiles * vs.fixed_tokens
    return vs.fixed_tokens


def budgets(cfg: DataSlice, shape: ModelShape) -> list[int]:
    """The image budgets Fit may try, the user's first: halved down to about FIT_FLOOR_TOKENS image tokens per image
    (Qwen2-VL family) or one tile (Idefics3); only the user's for a text model or a fixed-size family."""
    vs = vision_shape(shape)
    if vs is None or vs.budget == "fixed":
        return [cfg.image_max_pixels]
    if vs.budget == "pixels":
        side = vs.patch * int(round(vs.per_token ** 0.5))
        floor = FIT_FLOOR_TOKENS * side * side
    else:
        floor = vs.tile * vs.tile
    start = cfg.image_max_pixels or (QWEN_DEFAULT_PIXELS if vs.budget == "pixels"
                                     else (IDEFICS3_DEFAULT_TILES * vs.tile) ** 2)
    out = [cfg.image_max_pixels]
    pixels = start // 2
    while pixels >= floor:
        out.append(pixels)
        pixels //= 2
    return out


@dataclass(frozen=True)
class Images:
    """A micro-batch's images as the estimate sees them: image tokens per row, patches per micro-batch, and the
    longest row in tokens (None: rows reach max_length)."""

    tokens_per_row: int
    patches: int
    row_tokens: int | None
    counted: bool  # from the dataset's real rows (VisionPlan), not the budget


def images(cfg: _Seen, shape: ModelShape, max_row_tokens: int | None, image_tokens: int | None,
           images_per_row: int = 1) -> Images | None:
    """The micro-batch's images (see the module docstring); None for a text model. `image_tokens`: the most image
    tokens of a row of the dataset, counted by the processor (VisionPlan), with `images_per_row` the most images
    of a row; a budget lowered since then (Fit) bounds them by its own count."""
    vs = vision_shape(shape)
    if vs is None:
        return None
    bound = images_per_row * tokens_per_image(vs, cfg.image_max_pixels)
    if image_tokens:
        per_row = min(image_tokens, bound)
        row = max(1, max_row_tokens - (image_tokens - per_row)) if max_row_tokens else None
    else:
        per_row, row = min(bound, cfg.max_length), max_row_tokens
    n_images = -(-per_row // max(1, tokens_per_image(vs, cfg.image_max_pixels)))
    patches = cfg.per_device_train_batch_size * (per_row * vs.per_token + n_images * vs.cls)
    return Images(per_row, patches, row, bool(image_tokens))


def vision_params(shape: ModelShape) -> int:
    """Parameters of the vision encoder and projector: counted on the meta device (cached as measure's entries, so
    the web server reads them), else the formula from the widths meanwhile."""
    vs = vision_shape(shape)
    if vs is None:
        return 0
    text = shape.vision_config_text
    found = measure.lookup(params_key(text), {"kind": "vision", "config_text": text},
                           lambda: {"params": count_params(text)})
    return int(found["params"]) if found else formula_params(vs)


def params_key(config_text: str) -> str:
    return "vision|" + hashlib.sha256(json.dumps([config_text, *measure.versions("transformers")]).encode()).hexdigest()


def remember_params(config_text: str) -> None:
    """In the inspect child: the vision parameters counted into the cache the web server reads."""
    measure.remember(params_key(config_text), {"params": count_params(config_text)})


def count_params(config_text: str) -> int:
    """The vision side's parameters of the model config.json `config_text` builds on the meta device."""
    import torch
    from transformers import AutoConfig

    from core.model.lora_targets import TREE_LOCK

    data = json.loads(config_text)
    values = {k: v for k, v in data.items() if k not in ("model_type", "architectures", "auto_map")}
    config = AutoConfig.for_model(data["model_type"], **values)
    with TREE_LOCK, torch.device("meta"):
        model = model_vision.skeleton(config)
    return sum(p.numel() for path in model_vision.vision_modules(model)
               for p in model.get_submodule(path).parameters())


def formula_params(vs: VisionShape) -> int:
    """Vision parameters from the widths: per block 4 h^2 attention and 2 (SwiGLU 3) h x intermediate MLP, the
    patch embedding (3 x patch^2 x h; Qwen's two temporal frames: twice) and a projector into the text width."""
    mlp = (3 if vs.mlp_kept == 3 else 2) * vs.hidden * vs.intermediate
    patch_embed = (2 if vs.budget == "pixels" else 1) * 3 * vs.patch * vs.patch * vs.hidden
    projector = vs.hidden * vs.per_token * vs.text_hidden + (vs.hidden * vs.per_token) ** 2 * (vs.budget == "pixels")
    return vs.depth * (4 * vs.hidden * vs.hidden + mlp) + patch_embed + projector


def layer_bytes_per_patch(vs: VisionShape, compute: int) -> int:
    """What autograd keeps per patch in one frozen vision block whose input carries a gradient (module docstring)."""
    h = vs.hidden
    norms = 2 * (4 * h + 8)
    v_kept = 3 * h if vs.fused_qkv else h
    attention = compute * (3 * h + v_kept) + 4 * vs.heads
    mlp = compute * vs.intermediate * vs.mlp_kept
    return norms + attention + mlp


def extra_bytes_per_patch(vs: VisionShape, compute: int) -> int:
    """Kept once per patch outside the blocks: the post-norm's (or the merger's norm's) fp32 input, the projector's
    activation input."""
    return 4 * vs.hidden + 8 + compute * vs.projector


def kept_bytes(vs: VisionShape, patches: int, compute: int, checkpointing: bool) -> tuple[int, int]:
    """(bytes the tower keeps for backward over `patches`, bytes one block recomputed in backward adds)."""
    layer = layer_bytes_per_patch(vs, compute)
    extra = extra_bytes_per_patch(vs, compute)
    if checkpointing:
        return patches * (vs.depth * compute * vs.hidden + extra), patches * layer
    return patches * (vs.depth * layer + extra), 0


def vision_terms(t: Any, cfg: _Seen, shape: ModelShape, seen: Images | None) -> None:
    """The vision side added to core/estimate/terms.py's Terms `t` (core/estimate/predict.py calls it after
    single_gpu_terms): its 16-bit weights, the tower's kept activations and recomputed block, the fp32 pass while
    loading with the upcast, and notes saying the image tokens."""
    if seen is None:
        return
    vs = vision_shape(shape)
    c = dtypes(cfg).c
    weights = c * vision_params(shape)
    t.unquantized += weights
    t.load_alloc += weights
    t.load_reserved += weights
    if upcast(cfg):  # peft upcasts the vision side to fp32 before keep_vision_dtype casts it back
        t.load_alloc += (4 - c) * weights // c
        t.load_reserved += (4 - c) * weights // c
    kept, recomputed = kept_bytes(vs, seen.patches, c, cfg.gradient_checkpointing)
    if cfg.offload_activations:  # TRL's offloading context holds the whole forward, the tower's included
        on_gpu = kept * min(vs.depth, OFFLOAD_STASH) // max(1, vs.depth)
        t.host_activations += kept - on_gpu
        kept = on_gpu
    t.activations += kept
    t.temporaries += recomputed
    where = "the dataset's rows, counted by the processor" if seen.counted else (
        f"one image at image_max_pixels {cfg.image_max_pixels}" if cfg.image_max_pixels else
        "one image at the processor's default budget")
    if cfg.lora_vision:  # its adapters' parameters and the inputs they keep are not modelled (small beside the tower)
        t.notes.append("lora_vision: the LoRA on the vision encoder (its parameters, their optimizer state and the "
                       "inputs they keep) is not in this estimate")
    t.notes.append(f"images: {seen.tokens_per_row:,} image tokens per row ({where}), {seen.patches:,} patches per "
                   f"micro-batch through the {vs.depth}-layer vision tower: {weights / 2**30:.2f} GiB of 16-bit "
                   f"vision weights, {kept / 2**30:.2f} GiB of its activations kept for backward")


class _Counted(ModelSlice, DataSlice, StageSlice, Protocol):
    """The image dataset, the model whose processor counts its rows, the image budget it resizes to, and the stage
    (image rows train supervised only)."""


def measured_images(cfg: _Counted) -> dict[str, int] | None:
    """The estimate's keywords for cfg's image dataset, its kept rows counted by the model's processor at the image
    budget (core/data/images.py plan_images): the longest row, the most image tokens and images in a row. None
    for text rows and the stages that read none (core/estimate/predict.py measured_row_tokens then)."""
    from core.data import images as image_rows
    from core.data.plan import check_data
    from core.model.load import load_processor, resolve_model_path

    if cfg.stage != "sft":  # preference and GRPO rows are text rows (core/train/data.py refuses images there)
        return None
    raw, _ = check_data(cfg)
    if not image_rows.has_images(raw):
        return None
    processor = load_processor(cfg, resolve_model_path(cfg))
    plan = image_rows.plan_images(cfg.dataset, cfg.max_length, processor, raw, cfg.dataset)
    kept = plan.kept or list(range(len(plan.lengths)))
    return {"max_row_tokens": max((plan.lengths[i] for i in kept), default=0) or None,
            "image_tokens": max((plan.image_tokens[i] for i in kept), default=0) or None,
            "images_per_row": max((len(plan.rows[i].images) for i in kept), default=1) or 1}
