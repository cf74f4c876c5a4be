"""The offline demo's model, tokenizer and data: a tiny Llama-architecture model built on this machine.

Nothing here touches the network. The model has random weights drawn with a fixed seed, so every machine builds
the same one; the tokenizer is a byte-level BPE trained on the shipped demo data. The task (English word ->
French word, in dolly format: 50 words x 2 phrasings = 100 prompts) is one a 2-layer model learns in under a
minute on 2 CPU cores: core.infer.score_adapter counts the adapter's exact greedy answers (scripts/demo_bench.py).

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

from core.config.settings import DEMO_DATA, DEMO_PAIRS, cache_root

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


WRONG_SHIFT = 17  # the rejected answer: the French word of the word 17 places further on (never the right one)


def preference_rows() -> list[dict[str, str]]:
    """The demo's 100 prompts as preference pairs (stages dpo, orpo, kto): the prompt as the SFT demo's template
    renders it, the right French word chosen and another word's French rejected; always the same."""
    from core.data.formats import default_prompt

    french = list(WORDS.values())
    wrong = {en: french[(i + WRONG_SHIFT) % len(french)] for i, en in enumerate(WORDS)}
    rows = []
    for row in demo_rows():
        en = row["instruction"].split("'")[1]
        rows.append({"prompt": default_prompt(row["instruction"]), "chosen": row["response"], "rejected": wrong[en]})
    return rows


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def write_demo_dataset(path: Path = DEMO_DATA) -> Path:
    return _write_jsonl(path, demo_rows())


def write_demo_pairs(path: Path = DEMO_PAIRS) -> Path:
    """The shipped preference pairs (assets/demo/pairs.jsonl), which core.data.pairs reads for the demo dataset."""
    return _write_jsonl(path, preference_rows())


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


if __name__ == "__main__":
    print(write_demo_dataset())
    print(write_demo_pairs())
    print(ensure_demo_model())
