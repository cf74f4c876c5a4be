"""Tiny random vision-language models built on this machine: the vision demo's model, and one per family for the
tests (Idefics3 / SmolVLM, Gemma-3 image-text, LLaVA).

Each is its family's real architecture and processor (config.json's shapes scaled down, the family's own chat
template as TRL ships it, so TRL finds its training variant for assistant-only loss), with random weights drawn from
a fixed seed and a byte-level BPE tokenizer trained on the demo's questions and answers plus the family's special
tokens. Nothing touches the network; the image processors are transformers' PIL ones (no torchvision).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

from core.config.settings import DEMO_VISION_DATA, cache_root

VISION_VERSION = "v3"  # bump when a builder below changes, so old caches are not reused
# Qwen2-VL / Qwen2.5-VL / Qwen3-VL are not among them: their processors need torchvision (their video processor).
FAMILIES = ("idefics3", "gemma3", "llava")
DEMO_FAMILY = "idefics3"

# The shipped demo images: a shape of one colour on white, asked about in two questions each.
SHAPES = ("circle", "square", "triangle")
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 20)}
QUESTIONS = {"shape": "What shape is this?", "colour": "What colour is the shape?"}
IMAGE_SIZE = 56
PLACEMENTS = 6  # per shape and colour: 72 images
HELD_OUT = 12  # the last images (by their seeded order) are never trained on: the demo's held-out set


# --- the demo's images and rows ------------------------------------------------------------------------------------
def draw(shape: str, colour: str, size: int = IMAGE_SIZE, shift: tuple[int, int] = (0, 0), scale: float = 1.0):
    """One demo image: `shape` filled with `colour` on white, deterministic (PIL only)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    half = int(size * 0.32 * scale)
    cx, cy = size // 2 + shift[0], size // 2 + shift[1]
    box = (cx - half, cy - half, cx + half, cy + half)
    fill = COLOURS[colour]
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(cx, cy - half), (cx - half, cy + half), (cx + half, cy + half)], fill=fill)
    return image


def demo_items() -> list[dict[str, object]]:
    """Every demo image as (file name, shape, colour, shift, scale): 3 shapes x 4 colours x PLACEMENTS placements
    (each a seeded shift and size), in a seeded order; the last HELD_OUT are the held-out images."""
    import random

    rng = random.Random(7)
    items = []
    for shape in SHAPES:
        for colour in COLOURS:
            for p in range(PLACEMENTS):
                shift = (0, 0) if p == 0 else (rng.randint(-7, 7), rng.randint(-7, 7))
                scale = 1.0 if p == 0 else round(rng.uniform(0.6, 1.0), 2)
                items.append({"file": f"{shape}-{colour}-{p}.png", "shape": shape, "colour": colour, "shift": shift,
                              "scale": scale})
    rng.shuffle(items)
    return items


def demo_rows(items: list[dict[str, object]] | None = None) -> list[dict[str, object]]:
    """The demo's rows in TRL's vision format: messages whose user turn holds an image part (a path relative to the
    dataset's folder) and a question, and the one-word answer."""
    rows = []
    for item in items if items is not None else demo_items():
        for kind, question in QUESTIONS.items():
            rows.append({"messages": [
                {"role": "user", "content": [{"type": "image", "image": f"images/{item['file']}"},
                                             {"type": "text", "text": question}]},
                {"role": "assistant", "content": [{"type": "text", "text": str(item[kind])}]}]})
    return rows


def write_demo_images(folder: Path = DEMO_VISION_DATA.parent) -> Path:
    """The shipped demo set (assets/demo_vision/): the PNG images and train.jsonl / heldout.jsonl."""
    items = demo_items()
    (folder / "images").mkdir(parents=True, exist_ok=True)
    for item in items:
        draw(item["shape"], item["colour"], shift=item["shift"], scale=item["scale"]).save(
            folder / "images" / str(item["file"]), optimize=True)
    for name, part in (("train.jsonl", items[:-HELD_OUT]), ("heldout.jsonl", items[-HELD_OUT:])):
        with (folder / name).open("w", encoding="utf-8") as fh:
            for row in demo_rows(part):
                fh.write(json.dumps(row) + "\n")
    return folder


# --- the tokenizer ---------------------------------------------------------------------------------------------------
SPECIAL = {
    "llava": ["<unk>", "<s>", "</s>", "<pad>", "<image>", "[INST]", "[/INST]"],
    "idefics3": ["<|begin_of_text|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>",
                 "<|endoftext|>"] + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)],
    "gemma3": ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
               "<image_soft_token>"],
}


def build_tokenizer(family: str):
    """A byte-level BPE over the demo's words and the chat templates' words, with the family's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [f"{q} {s} {c}" for q in QUESTIONS.values() for s in SHAPES for c in COLOURS]
    corpus += ["system\nYou are a helpful assistant.", "user\n", "assistant\n", "User: Assistant:", "model\n"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL[family], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if family == "llava":
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                       unk_token="<unk>", model_max_length=4096)
    if family == "idefics3":
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<end_of_utterance>",
                                       pad_token="<|endoftext|>", bos_token="<|im_start|>", model_max_length=4096)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<end_of_turn>", pad_token="<pad>", model_max_length=4096,
        extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                              "image_token": "<image_soft_token>"})


# --- the processor and the model, per family ---------------------------------------------------------------------------
def build_processor(family: str, tokenizer):
    """The family's own processor class around the tiny tokenizer, with a small image budget."""
    from trl import chat_template_utils as templates

    if family == "llava":
        from transformers import CLIPImageProcessorPil, LlavaProcessor

        # 28 x 28 pixels in patches of 14: 4 image tokens (the CLS token is dropped by the "default" strategy)
        images = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
        return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=14,
                              vision_feature_select_strategy="default", num_additional_image_tokens=1,
                              chat_template=templates.llava_next_chat_template)
    if family == "idefics3":
        from transformers import Idefics3ImageProcessorPil, Idefics3Processor

        images = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": 64},
                                           max_image_size={"longest_edge": 64})
        # 64 x 64 pixels in patches of 8: 64 patches, merged by scale factor 2 into 16 image tokens
        return Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=16,
                                 chat_template=templates.idefics3_chat_template)
    from transformers import Gemma3ImageProcessorPil, Gemma3Processor

    images = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    return Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=4,
                           chat_template=templates.gemma3_chat_template)


# initializer_range 0.3 as the text demo's (core/demo.py ARCH): the usual 0.02 caps a tiny model's logits so low
# that LoRA can barely move the loss
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            initializer_range=0.3)


def build_model(family: str, tokenizer, seed: int = 0):
    """The family's image-text-to-text model at a tiny size, random weights from `seed`."""
    import torch

    vocab = len(tokenizer)
    ids = tokenizer.convert_tokens_to_ids
    if family == "llava":
        from transformers import LlavaConfig, LlavaForConditionalGeneration as Model

        config = LlavaConfig(
            text_config=dict(model_type="llama", vocab_size=vocab, max_position_embeddings=4096,
                             tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id, **TEXT),
            vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14,
                               projection_dim=32),
            image_token_id=ids("<image>"), vision_feature_layer=-1, vision_feature_select_strategy="default",
            tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id)
    elif family == "idefics3":
        from transformers import Idefics3Config, Idefics3ForConditionalGeneration as Model

        config = Idefics3Config(
            text_config=dict(model_type="llama", vocab_size=vocab, max_position_embeddings=4096,
                             tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id, **TEXT),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=64, patch_size=8),
            scale_factor=2, image_token_id=ids("<image>"), tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id)
    else:
        from transformers import Gemma3Config, Gemma3ForConditionalGeneration as Model

        config = Gemma3Config(
            text_config=dict(vocab_size=vocab, max_position_embeddings=4096, head_dim=16, sliding_window=64,
                             layer_types=["sliding_attention", "full_attention"], **TEXT),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=32, patch_size=8),
            mm_tokens_per_image=4, boi_token_id=ids("<start_of_image>"), eoi_token_id=ids("<end_of_image>"),
            image_token_id=ids("<image_soft_token>"), pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = Model(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def build(family: str, target: Path, seed: int = 0) -> Path:
    """Write the tiny model of `family` (config, weights, tokenizer, processor) into `target`."""
    tokenizer = build_tokenizer(family)
    processor = build_processor(family, tokenizer)
    model = build_model(family, processor.tokenizer, seed)
    model.save_pretrained(target)
    processor.save_pretrained(target)
    return target


def tiny_model_dir(family: str = DEMO_FAMILY) -> Path:
    return cache_root() / f"tiny-{family}-{VISION_VERSION}"


_LOCK = threading.Lock()


def ensure_tiny_model(family: str = DEMO_FAMILY, target: Path | None = None) -> Path:
    """Build the tiny model of `family` once (atomically, cached under MEMTUNE_HOME) and return its folder."""
    target = target or tiny_model_dir(family)
    with _LOCK:
        if (target / "config.json").is_file() and (target / "processor_config.json").is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
        try:
            build(family, tmp)
            try:
                os.replace(tmp, target)
            except OSError:  # another process finished first: theirs is identical
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


if __name__ == "__main__":
    print(write_demo_images())
