"""The offline demo: a tiny Llama-architecture model and tokenizer built on this machine, and the shipped data.

Nothing here touches the network. The model has random weights drawn with a fixed seed, so every machine builds
the same one; the tokenizer is a byte-level BPE trained on the shipped demo data. The task (English word ->
French word, in dolly format: 50 words x 2 phrasings = 100 prompts) is one a 2-layer model learns in under a
minute on 2 CPU cores: `score_adapter` counts the adapter's exact greedy answers (scripts/demo_bench.py).

The base model's weights are random, so its own answers are noise: only the adapter's answers mean something.
"""

from __future__ import annotations

from pathlib import Path

# The demo's model, tokenizer and data are core/demo/build.py's (core.model.load builds the model through it, below this
# module); named here too, where callers have always imported them.
from core.demo.build import (DEMO_DATA, TEMPLATES, WORDS, cache_root, demo_model_dir, demo_rows,  # noqa: F401
                             ensure_demo_model, write_demo_dataset)


def demo_answers(adapter_dir: str | Path, rows: list[dict[str, str]] | None = None,
                 max_new_tokens: int = 8) -> list[str]:
    """Greedy answers of base + adapter to `rows`' instructions (default: the demo's 100), as Try it asks them:
    each prompt formatted by core.infer.format_prompt (the training formatter), special tokens dropped."""
    from transformers import AutoTokenizer

    from core import infer
    from core.model.load import load_with_adapter

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
