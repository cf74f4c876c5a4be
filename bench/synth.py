"""Random-weight models built straight into 4-bit on the GPU, a word-level tokenizer, dolly-like data and pairs.

`build_model` never materialises the bf16 model: the skeleton is built on the meta device, then every decoder
Linear is replaced, one at a time, by a bitsandbytes Linear4bit quantized on the GPU from freshly drawn random
bf16 data (at most one matrix of bf16 exists at a time: 470 MB for Llama-3.1-70B's MLP). The result is what
`from_pretrained(..., quantization_config=BitsAndBytesConfig(...), device_map={"": 0})` returns: the same
module types, quant states, dtypes and attributes (hf_quantizer, is_loaded_in_4bit, hf_device_map), so the
chapter's recipe and memtune's engine run on it unchanged. A fixed generator seed gives the same weights every
time, so two recipes can be compared on the same model.
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch
from torch import nn

from bench.archs import hf_config

N_WORDS = 8000  # word-level vocabulary: ids 0..7999, then <bos> <eos> <unk>; all inside every model's vocab


# --- model ---------------------------------------------------------------------------------------------------
def bnb_config(quant_type: str = "nf4", double_quant: bool = True, compute_dtype=torch.bfloat16,
               quant_storage=torch.uint8):
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                              bnb_4bit_use_double_quant=double_quant, bnb_4bit_compute_dtype=compute_dtype,
                              bnb_4bit_quant_storage=quant_storage)


def _quantized_linear(linear: nn.Linear, cfg, device, gen, std: float, dtype):
    import bitsandbytes as bnb

    out_f, in_f = linear.out_features, linear.in_features
    new = bnb.nn.Linear4bit(in_f, out_f, bias=linear.bias is not None, compute_dtype=cfg.bnb_4bit_compute_dtype,
                            compress_statistics=cfg.bnb_4bit_use_double_quant, quant_type=cfg.bnb_4bit_quant_type,
                            quant_storage=cfg.bnb_4bit_quant_storage, device="meta")
    data = torch.empty(out_f, in_f, device=device, dtype=dtype).normal_(0.0, std, generator=gen)
    new.weight = bnb.nn.Params4bit(data, requires_grad=False, compress_statistics=cfg.bnb_4bit_use_double_quant,
                                   quant_type=cfg.bnb_4bit_quant_type,
                                   quant_storage=cfg.bnb_4bit_quant_storage, module=new).to(device)
    del data
    if linear.bias is not None:
        new.bias = nn.Parameter(torch.zeros(out_f, device=device, dtype=dtype), requires_grad=False)
    return new


def build_model(arch: str, device: str | torch.device = "cuda", quantize: bool = True, seed: int = 1234,
                dtype=torch.bfloat16, quant_type: str = "nf4", double_quant: bool = True, quant_storage=torch.uint8):
    """A causal LM of architecture `arch` with random weights, 4-bit quantized layer by layer when `quantize`.

    quant_storage=dtype packs the 4-bit data in that dtype, as FSDP-QLoRA needs (FSDP flattens tensors of one
    dtype); saved with save_pretrained, such a model loads pre-quantized on one GPU or sharded by FSDP."""
    from transformers import AutoModelForCausalLM

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    config = hf_config(arch)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.to(dtype)
    std = float(getattr(config, "initializer_range", 0.02))
    gen = torch.Generator(device=device).manual_seed(seed)
    qcfg = bnb_config(quant_type, double_quant, dtype, quant_storage) if quantize else None

    # 1. Decoder Linears: quantized one at a time (or materialised in bf16 without quantization).
    for _, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not nn.Linear or child_name == "lm_head":
                continue
            if quantize:
                setattr(parent, child_name, _quantized_linear(child, qcfg, device, gen, std, dtype))
            else:
                child.weight = nn.Parameter(torch.empty(child.weight.shape, device=device, dtype=dtype)
                                            .normal_(0.0, std, generator=gen), requires_grad=True)
                if child.bias is not None:
                    child.bias = nn.Parameter(torch.zeros(child.out_features, device=device, dtype=dtype))
    # 2. Everything else (embeddings, lm_head, norms, biases) in bf16, as from_pretrained(dtype="auto") loads them.
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or not p.is_meta:
                continue
            t = torch.empty(p.shape, device=device, dtype=dtype)
            if "norm" in type(module).__name__.lower():
                t.fill_(1.0)
            elif name == "bias":
                t.zero_()
            else:
                t.normal_(0.0, std, generator=gen)
            module._parameters[name] = nn.Parameter(t, requires_grad=True)
    # 3. Buffers (rotary frequencies) are computed, not loaded: rebuild those modules on the device.
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if any(b.is_meta for b in child.buffers(recurse=False)) and "Rotary" in type(child).__name__:
                with torch.device(device):  # the rotary module computes its frequencies on the default device
                    setattr(parent, child_name, type(child)(config=config))
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"still on the meta device: {left[:5]}")

    if quantize:
        from transformers.utils.quantization_config import QuantizationMethod

        try:
            from transformers.quantizers.auto import AutoHfQuantizer

            model.hf_quantizer = AutoHfQuantizer.from_config(qcfg, pre_quantized=False)
        except Exception:  # noqa: BLE001 - the attribute only tells Trainer that bnb 4-bit is trainable
            model.hf_quantizer = None
        model.is_quantized = True
        model.quantization_method = QuantizationMethod.BITS_AND_BYTES
        model.is_loaded_in_4bit = True
        model.config.quantization_config = qcfg
    model.hf_device_map = {"": device.index if device.type == "cuda" else "cpu"}
    model.eval()  # like from_pretrained; Trainer switches to train()
    return model


# --- tokenizer -----------------------------------------------------------------------------------------------
def make_tokenizer():
    """Word-level tokenizer: 'w123' -> id 123; adds <bos> in front like Llama-3's tokenizer; pad = eos."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(N_WORDS)}
    vocab.update({"<bos>": N_WORDS, "<eos>": N_WORDS + 1, "<unk>": N_WORDS + 2})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", N_WORDS)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                        unk_token="<unk>", model_max_length=1_000_000)
    return tokenizer


# --- data ----------------------------------------------------------------------------------------------------
def dolly_lengths(n: int, seed: int = 0, median: float = 140.0, sigma: float = 0.75) -> np.ndarray:
    """Token lengths like databricks-dolly-15k rows under a Llama-3 tokenizer: lognormal, median ~140,
    mean ~185, ~4% past 512 tokens (long contexts), few under 16."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(math.log(median), sigma, n), 12, 6000).astype(int)


def texts_of(lengths: np.ndarray, seed: int = 0) -> list[str]:
    """One text per length; `length` counts <bos> and the <eos> TRL appends. Word frequencies are Zipf-like."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for length in lengths:
        ids = (rng.zipf(1.3, max(1, int(length) - 2)) - 1) % N_WORDS
        out.append(" ".join(f"w{i}" for i in ids))
    return out


def dolly_rows(n: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    """Dolly-format rows (instruction, context, response) whose token counts follow dolly_lengths, and the counts."""
    lengths = dolly_lengths(n, seed)
    rows = []
    for i, text in enumerate(texts_of(lengths, seed)):
        w = text.split()
        cut = max(1, len(w) // 4)  # a quarter of the row is the instruction, the rest the answer
        context = " ".join(w[cut:2 * cut]) if i % 3 == 0 else ""  # a third of dolly rows have context
        rest = w[2 * cut:] if context else w[cut:]
        rows.append({"instruction": " ".join(w[:cut]), "context": context, "response": " ".join(rest) or "w1",
                     "category": "open_qa"})
    return rows, lengths


def preference_pairs(n: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    """Preference pairs (prompt, chosen, rejected: TRL's standard format with an explicit prompt) as long as dolly
    rows, and the token count of each sequence the trainers make of them (prompt + chosen, prompt + rejected).

    The prompt and the chosen answer are dolly_rows(n, seed)'s row (its instruction and context in memtune's
    default template, the same text the SFT rows train on), the rejected answer the response of another draw's
    row (dolly_rows(n, seed + 1)): both answers follow dolly's length law, independently, as a preferred and a
    dispreferred completion of one prompt do. Same seed, same pairs."""
    from core.data.formats import default_prompt

    rows, _ = dolly_rows(n, seed)
    other, _ = dolly_rows(n, seed + 1)
    pairs, sides = [], []
    for row, alt in zip(rows, other):
        prompt = default_prompt(row["instruction"], row["context"])
        pairs.append({"prompt": prompt, "chosen": row["response"], "rejected": alt["response"]})
        # word-level tokens: <bos> + the prompt's words, the answer's words + <eos> (make_tokenizer, TRL's EOS)
        sides += [2 + len(prompt.split()) + len(answer.split()) for answer in (row["response"], alt["response"])]
    return pairs, np.asarray(sides)


# --- image-text models and image rows (bench/product_plans.py `vision1`) ---------------------------------------------
# Each family's special tokens (its processor and chat template read them) and the config fields naming their ids.
VISION_SPECIAL = {
    "qwen2_5_vl": {"tokens": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                              "<|image_pad|>", "<|video_pad|>"],
                   "ids": {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                           "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
                           "bos_token_id": "<|endoftext|>", "eos_token_id": "<|im_end|>",
                           "pad_token_id": "<|endoftext|>"}},
    "gemma3": {"tokens": ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                          "<end_of_image>", "<image_soft_token>"],
               "ids": {"image_token_id": "<image_soft_token>", "boi_token_id": "<start_of_image>",
                       "eoi_token_id": "<end_of_image>", "pad_token_id": "<pad>", "bos_token_id": "<bos>",
                       "eos_token_id": "<end_of_turn>"}},
}
IMAGE_WORDS = ("photo receipt total item price chart axis label street car tree sky window person shelf product "
               "colour red blue green left right top bottom small large number date store what which how many is "
               "the a of in on and shows there are this image describe answer").split()


def vision_processor(model_type: str):
    """The family's own processor (Qwen2.5-VL: its image processor at the Hub's max_pixels 12,845,056 and its video
    processor, which needs torchvision; Gemma-3: 896 x 896, 256 image tokens) around a byte-level BPE over
    IMAGE_WORDS with the family's special tokens, and TRL's chat template of the family."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from trl import chat_template_utils as templates

    special = VISION_SPECIAL[model_type]["tokens"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([" ".join(IMAGE_WORDS), "system user assistant model You are a helpful assistant."],
                            trainer=trainers.BpeTrainer(vocab_size=600, special_tokens=special, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if model_type == "qwen2_5_vl":
        from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=131072,
            extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                  "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"})
        images = Qwen2VLImageProcessor(size={"longest_edge": 12_845_056, "shortest_edge": 3136})
        return Qwen2_5_VLProcessor(image_processor=images, tokenizer=tokenizer, video_processor=Qwen2VLVideoProcessor(),
                                   chat_template=templates.qwen2_5_vl_chat_template)
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<end_of_turn>", pad_token="<pad>", model_max_length=131072,
        extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                              "image_token": "<image_soft_token>"})
    images = Gemma3ImageProcessor(size={"height": 896, "width": 896})
    return Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=256,
                           chat_template=templates.gemma3_chat_template)


def build_vision_model(arch: str, device: str = "cpu", dtype=torch.bfloat16):
    """(model, processor) of the image-text architecture `arch` (bench/archs.py VISION_ARCHS): random weights, the
    processor's token ids written into the config (the shapes, vocabulary size included, stay the real ones)."""
    from transformers import AutoModelForImageTextToText

    config = hf_config(arch)
    processor = vision_processor(config.model_type)
    ids = processor.tokenizer.convert_tokens_to_ids
    for name, token in VISION_SPECIAL[config.model_type]["ids"].items():
        for holder in (config, config.get_text_config()):
            setattr(holder, name, ids(token))
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model, processor


def image_rows(folder, n_rows: int = 256, n_images: int = 64, size: tuple[int, int] = (1024, 768),
               seed: int = 0) -> dict:
    """Photo-sized PNGs (`size`, a colour gradient under noise, so they neither compress to nothing nor are all
    alike) in folder/images, and folder/train.jsonl: `n_rows` rows in messages format, each a question about one
    image and an answer of 20 to 120 words. What it wrote, for the call's info."""
    from pathlib import Path

    from PIL import Image

    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w, h = size
    ramp = np.linspace(0, 1, w)[None, :, None] * np.linspace(0, 1, h)[:, None, None]
    for i in range(n_images):
        path = folder / "images" / f"photo_{i:03d}.png"
        if path.is_file():
            continue
        base = rng.uniform(0, 255, 3) * ramp + rng.uniform(0, 255, 3) * (1 - ramp)
        noisy = np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(path)
    words = np.array(IMAGE_WORDS)
    lengths = []
    with (folder / "train.jsonl").open("w", encoding="utf-8") as f:
        for r in range(n_rows):
            question = " ".join(rng.choice(words, int(rng.integers(6, 20))))
            answer = " ".join(rng.choice(words, int(rng.integers(20, 121))))
            lengths.append(len(answer.split()))
            f.write(json.dumps({"messages": [
                {"role": "user", "content": [{"type": "image", "image": f"images/photo_{r % n_images:03d}.png"},
                                             {"type": "text", "text": question}]},
                {"role": "assistant", "content": [{"type": "text", "text": answer}]}]}) + "\n")
    return {"rows": n_rows, "images": n_images, "image_size": list(size),
            "median_answer_words": float(np.median(lengths))}
