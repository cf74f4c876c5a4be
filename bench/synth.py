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
