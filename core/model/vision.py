"""Image-text-to-text models: recognised from config.json, loaded with their processor (transformers'
AutoModelForImageTextToText + AutoProcessor), the language model in 4-bit NF4 and the vision side (its encoder and
the projector into the language model) left unquantized in the load's 16-bit dtype and frozen; LoRA on the
language model's layers only, unless `lora_vision` asks for the vision encoder's too.
"""

from __future__ import annotations

import re
from typing import Any

from core.messages import Keyed

LANGUAGE = ("language_model", "text_model")  # the text decoder's name (Idefics3 / SmolVLM: text_model)


def is_vision_config(config: Any) -> bool:
    """An image-text-to-text model: its config has a vision part (Gemma-3's text-only checkpoints have none)."""
    return getattr(config, "vision_config", None) is not None


def skeleton(config: Any, trust_remote_code: bool = False):
    """The image-text-to-text model as a module tree on the meta device (core/model/lora_targets.py for text)."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_config(config, trust_remote_code=trust_remote_code)


def language_prefix(model: Any) -> str:
    """The module path of the language model inside `model` (e.g. `model.language_model`)."""
    for name, _ in model.named_modules():
        if name.rsplit(".", 1)[-1] in LANGUAGE:
            return name
    raise ValueError(f"{type(model).__name__} has no language model module ({', '.join(LANGUAGE)})")


def vision_modules(model: Any) -> list[str]:
    """The paths of the modules beside the language model (the vision encoder, the projector): never quantized."""
    prefix = language_prefix(model)
    parent, _, own = prefix.rpartition(".")
    holder = model.get_submodule(parent) if parent else model
    return [f"{parent}.{name}" if parent else name for name, _ in holder.named_children() if name != own]


def encoder_modules(model: Any) -> list[str]:
    """The vision encoder's path(s) (not the projector): where `lora_vision` puts LoRA too."""
    return [path for path in vision_modules(model) if "vision" in path.rsplit(".", 1)[-1]]


def exclude_pattern(model: Any, lora_vision: bool) -> str:
    """peft's exclude_modules (a regex on module paths): everything outside the language model, or, with
    `lora_vision`, outside it and the vision encoder (the projector stays as trained)."""
    keep = [language_prefix(model)] + (encoder_modules(model) if lora_vision else [])
    return rf"(?!(?:{'|'.join(re.escape(k) for k in keep)})\.).*"


def skip_modules(model: Any) -> list[str]:
    """BitsAndBytesConfig's llm_int8_skip_modules: the vision side and the output head stay unquantized."""
    return [*vision_modules(model), "lm_head"]


class ImageBudgetError(Keyed, ValueError):
    """image_max_pixels given for a processor that resizes every image to one fixed size (a keyed message)."""

    def __init__(self, key: str, **params: Any) -> None:
        super().__init__(self._keyed(key, params))


def budget_kind(image_processor: Any) -> str:
    """How the family's image processor takes an image budget: "pixels" (Qwen2-VL / Qwen2.5-VL / Qwen3-VL: size's
    longest_edge is a pixel count, their max_pixels), "edge" (Idefics3 / SmolVLM: the resized longest edge, split
    into tiles of max_image_size), or "fixed" (Gemma-3, LLaVA: one size for every image)."""
    size = getattr(image_processor, "size", None) or {}
    get = size.get if isinstance(size, dict) else (lambda k: getattr(size, k, None))
    if getattr(image_processor, "merge_size", None) and get("longest_edge") and get("shortest_edge"):
        return "pixels"
    if get("longest_edge") and getattr(image_processor, "max_image_size", None):
        return "edge"
    return "fixed"


def budget_edge(max_pixels: int, tile: int) -> int:
    """Idefics3's longest edge for a pixel budget: the square root, in whole tiles, at least one."""
    return max(tile, int(max_pixels ** 0.5) // tile * tile)


def apply_image_budget(processor: Any, max_pixels: int) -> Any:
    """The processor resizing every image within `max_pixels` (image_max_pixels; 0: as it came), as its own
    resizing then counts the image tokens; ImageBudgetError for a family that resizes to one fixed size."""
    if not max_pixels:
        return processor
    from transformers.image_processing_utils import SizeDict

    images = processor.image_processor
    kind = budget_kind(images)
    if kind == "pixels":
        shortest = min(int(images.size["shortest_edge"]), max_pixels)
        images.size = SizeDict(longest_edge=max_pixels, shortest_edge=shortest)
    elif kind == "edge":
        images.size = SizeDict(longest_edge=budget_edge(max_pixels, int(images.max_image_size["longest_edge"])))
    else:
        raise ImageBudgetError("model.err.image_budget_fixed", processor=type(images).__name__,
                               pixels=max_pixels)
    return processor


def load_processor(path: str, trust_remote_code: bool = False, max_pixels: int = 0):
    """The model's processor, its image budget applied (apply_image_budget), pad token set."""
    from transformers import AutoProcessor

    processor = apply_image_budget(AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code),
                                   max_pixels)
    tokenizer = processor.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return processor


def load(path: str, kwargs: dict[str, Any]):
    """The model at `path` with from_pretrained's `kwargs` (dtype, device map, the 4-bit config)."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, **kwargs)


def keep_vision_dtype(model: Any, dtype: Any) -> None:
    """The vision side back in the load's 16-bit dtype after peft's k-bit preparation upcast every unquantized
    weight to fp32: it is frozen, and fp32 would double its memory for nothing."""
    for path in vision_modules(model):
        model.get_submodule(path).to(dtype)
