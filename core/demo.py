"""The offline demo: a tiny Llama-architecture model and tokenizer built on this machine, and the shipped data.

Nothing here touches the network. The model has random weights drawn with a fixed seed, so every machine builds
the same one; the tokenizer is a byte-level BPE trained on the shipped demo data. The task (English word ->
French word, in dolly format: 50 words x 2 phrasings = 100 prompts) is one a 2-layer model learns in under a
minute on 2 CPU cores: `score_adapter` counts the adapter's exact greedy answers (scripts/demo_bench.py).

The base model's weights are random, so its own answers are noise: only the adapter's answers mean something.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO_DATA = ROOT / "assets" / "demo" / "demo.jsonl"
DEMO_VERSION = "v3"  # bump when the builder below changes, so old caches are not reused

WORDS = {
    "cat": "chat", "dog": "chien", "house": "maison", "water": "eau", "bread": "pain", "apple": "pomme",
    "book": "livre", "tree": "arbre", "sun": "soleil", "moon": "lune", "star": "etoile", "car": "voiture",
    "sea": "mer", "mountain": "montagne", "river": "riviere", "flower": "fleur", "bird": "oiseau",
    "fish": "poisson", "horse": "cheval", "milk": "lait", "cheese": "fromage", "friend": "ami",
    "school": "ecole", "city": "ville", "road": "route", "door": "porte", "window": "fenetre", "table": "table",
    "chair": "chaise", "bed": "lit", "night": "nuit", "day": "jour", "red": "rouge", "blue": "bleu",
    "green": "vert", "black": "noir", "white": "blanc", "big": "grand", "small": "petit", "hot": "chaud",
    "cold": "froid", "rain": "pluie", "snow": "neige", "wind": "vent", "fire": "feu", "earth": "terre",
    "heart": "coeur", "hand": "main", "head": "tete", "eye": "oeil",
}
TEMPLATES = [
    "Translate the word '{w}' into French.",
    "What is the French word for '{w}'?",
    "Give the French translation of '{w}'.",
    "In French, how do you say '{w}'?",
]


N_TEMPLATES = 2  # 50 words x 2 phrasings = 100 training prompts


def demo_rows() -> list[dict[str, str]]:
    """100 dolly-format rows (instruction, context, response, category), always the same."""
    rng = random.Random(1234)
    rows = []
    for template in TEMPLATES[:N_TEMPLATES]:
        for en, fr in WORDS.items():
            rows.append({"instruction": template.format(w=en), "context": "", "response": fr,
                         "category": "translation"})
    rng.shuffle(rows)
    return rows


def write_demo_dataset(path: Path = DEMO_DATA) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in demo_rows():
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def cache_root() -> Path:
    return Path(os.environ.get("MEMTUNE_HOME", Path.home() / ".cache" / "memtune"))


def demo_model_dir() -> Path:
    return cache_root() / f"demo-tiny-llama-{DEMO_VERSION}"


def build_tokenizer():
    """Byte-level BPE (vocab 512) trained on the demo rows plus the default prompt template's words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = []
    for r in demo_rows():
        corpus.append(f"### Instruction:\n{r['instruction']}\n\n### Response:\n{r['response']}")
    corpus.append("### Input:\n Below is an instruction that describes a task. Write a response.")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<s>", "</s>", "<pad>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    from tokenizers.processors import TemplateProcessing

    tok.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                            special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   model_max_length=512)


ARCH = dict(
    hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    # Wider than the usual 0.02: with a small hidden size and RMSNorm, small head weights cap the logits so low
    # that LoRA could barely move the loss. 0.3 behaves like a (bad) pretrained model.
    initializer_range=0.3,
)


def build_model(vocab_size: int, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, max_position_embeddings=512, bos_token_id=0, eos_token_id=1,
                         pad_token_id=2, tie_word_embeddings=False, **ARCH)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def ensure_demo_model(target: Path | None = None) -> Path:
    """Build the demo model folder once (atomically) and return its path."""
    target = target or demo_model_dir()
    with _BUILD_LOCK:  # the app's warm-up thread and a page's first prediction may ask at once: build once
        return _ensure(target)


_BUILD_LOCK = threading.Lock()


def _ensure(target: Path) -> Path:
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        tokenizer = build_tokenizer()
        model = build_model(len(tokenizer))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first: theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def demo_answers(adapter_dir: str | Path, rows: list[dict[str, str]] | None = None,
                 max_new_tokens: int = 8) -> list[str]:
    """Greedy answers of base + adapter to `rows`' instructions (default: the demo's 100), as Try it asks them:
    each prompt formatted by core.infer.format_prompt (the training formatter), special tokens dropped."""
    from transformers import AutoTokenizer

    from core import infer
    from core.model import load_with_adapter

    cfg = infer.adapter_config(adapter_dir)
    model = load_with_adapter(infer._runnable(cfg), adapter_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(adapter_dir))  # save_adapter writes it beside the weights
    return model_answers(model, tokenizer, rows, max_new_tokens)


def model_answers(model, tokenizer, rows: list[dict[str, str]] | None = None, max_new_tokens: int = 8) -> list[str]:
    """Greedy answers of any causal LM (base + adapter, or a merged model folder loaded by transformers) to
    `rows`' instructions, prompted as Try it prompts."""
    import torch

    from core import infer

    answers = []
    with torch.inference_mode():
        for row in demo_rows() if rows is None else rows:
            prompt = infer.format_prompt(tokenizer, row["instruction"], row.get("context", ""))
            inputs = tokenizer(prompt, return_tensors="pt")
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
                                 temperature=None, top_p=None, top_k=None,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            answers.append(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
    return answers


def count_exact(answers: list[str], rows: list[dict[str, str]] | None = None) -> int:
    """How many answers equal their row's response (surrounding spaces ignored)."""
    rows = demo_rows() if rows is None else rows
    return sum(a.strip() == r["response"].strip() for a, r in zip(answers, rows, strict=True))


def score_adapter(adapter_dir: str | Path, rows: list[dict[str, str]] | None = None) -> tuple[int, int]:
    """(exact answers, prompts): how many of `rows` (default: the demo's 100 training prompts) the adapter answers
    exactly, greedily (surrounding spaces ignored)."""
    rows = demo_rows() if rows is None else rows
    return count_exact(demo_answers(adapter_dir, rows), rows), len(rows)


if __name__ == "__main__":
    print(write_demo_dataset())
    print(ensure_demo_model())
