"""The peer for bench/product.py: Unsloth's QLoRA path for a Llama model, as its documentation shows it.

    python -m bench.unsloth_script --model DIR --data FILE.jsonl --out RUN_DIR [--max-steps N]

Run as its own process (with Unsloth's own pins: trl<=1.15, datasets<5; bench/product.py puts its wheels first on
PYTHONPATH) on the same model folder and data as the other rows. Settings: what Unsloth's Llama notebooks use,
aligned with the chapter where a choice is free, so the comparison is about the engine, not the recipe:
4-bit NF4 load, LoRA r=16, alpha=32 on q/k/v/o (the chapter's modules; Unsloth's notebooks add the MLP), dropout 0
(Unsloth's fast path; the chapter has 0.05), Unsloth's gradient checkpointing, 8-bit AdamW, lr 2e-4, max length
512, the chapter's 16 rows per optimizer step (2 x 8 accumulation; Unsloth's notebooks use 2 x 4), no packing,
the same text per row as the chapter's script. Step events and summary.json are written in the engine's format.

The peer at its best (2026-12-01, issue 25): `--packing` turns on Unsloth's own padding-free packing (SFTConfig
packing=True, best-fit packs of whole rows, per-row positions; the same scheme as memtune's `packing`), `--batch`
and `--accum` set the micro-batch (packs) and accumulation, `--checkpointing unsloth|true|false` Unsloth's
offloaded checkpointing, the plain one, or none. Losses are written to events.jsonl as "metrics" events, like
the engine's, so first losses can be compared.
"""

from __future__ import annotations

import os

from bench.chapter_script import script_args, step_callback, texts, write_summary


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--packing", action="store_true")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument("--checkpointing", default="unsloth", choices=["unsloth", "true", "false"])
    ours, rest = ap.parse_known_args(argv)
    args, out, started = script_args(rest)
    ckpt = {"unsloth": "unsloth", "true": True, "false": False}[ours.checkpointing]
    os.environ.setdefault("UNSLOTH_DISABLE_STATISTICS", "1")  # no network on the GPU machine

    from unsloth import FastLanguageModel  # first: it patches transformers/trl on import

    import torch
    from trl import SFTConfig, SFTTrainer

    torch.cuda.reset_peak_memory_stats()
    model, tokenizer = FastLanguageModel.from_pretrained(model_name=args.model, max_seq_length=512,
                                                         dtype=torch.bfloat16, load_in_4bit=True,
                                                         local_files_only=True)
    model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=32, lora_dropout=0.0,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                             use_gradient_checkpointing=ckpt, random_state=3407)
    config = SFTConfig(output_dir=str(out / "unsloth-output"), per_device_train_batch_size=ours.batch,
                       gradient_accumulation_steps=ours.accum, learning_rate=2e-4, max_steps=args.max_steps, bf16=True,
                       optim="adamw_8bit", max_length=512, dataset_text_field="text", packing=ours.packing,
                       logging_steps=1, save_strategy="no", report_to="none", seed=3407,
                       include_num_input_tokens_seen="non_padding")
    trainer = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=texts(args.data), args=config,
                         callbacks=[step_callback(out / "events.jsonl", losses=True)])
    write_summary(out, trainer, trainer.train(), started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
