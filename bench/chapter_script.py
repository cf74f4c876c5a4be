"""The course chapter's complete memory-efficient training script (shared/seeds), as written, for bench/product.py.

    python -m bench.chapter_script --model DIR --data FILE.jsonl --out RUN_DIR [--max-steps N]

Run as its own process on a model folder saved with `save_pretrained`, like a user would. What differs from the
chapter, and why (bench/BASELINE.md, bench/seed_recipe.py):
- the model and data are local paths (random weights of the real architecture; dolly-format rows);
- dolly rows have no `text` column, so the script's `dataset_text_field="text"` is given one: the row's prompt and
  response joined with memtune's default (Alpaca-style) template, the same text the engine trains on;
- today's API names (`processing_class=`, `SFTConfig(max_length=, dataset_text_field=)`, see seed_recipe.py);
- benchmark-only: `max_steps`, nothing saved, and a callback writing step events (tokens seen, seconds since the
  start of training) and summary.json (torch's memory peaks) in the engine's format, so both are read the same way.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def step_callback(events_path: Path, losses: bool = False):
    """Step events in the engine's format; with `losses`, each logged loss as a "metrics" event too."""
    from transformers import TrainerCallback

    class StepEvents(TrainerCallback):
        start = 0.0

        def on_log(self, args, state, control, logs=None, **kw):
            if losses and logs and "loss" in logs:
                self._write(kind="metrics", step=state.global_step, loss=float(logs["loss"]))

        def _write(self, **event):
            with events_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"time": round(time.time(), 3), **event}) + "\n")

        def on_train_begin(self, args, state, control, **kw):
            self.start = time.monotonic()
            self._write(kind="phase", phase="training")

        def on_step_end(self, args, state, control, **kw):
            self._write(kind="step", step=state.global_step, tokens=int(state.num_input_tokens_seen or 0),
                        elapsed_s=round(time.monotonic() - self.start, 3))

    return StepEvents()


def script_args(argv=None) -> tuple[argparse.Namespace, Path, float]:
    """The benchmark scripts' common arguments (also bench/unsloth_script.py): args, the run folder, the start."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-steps", type=int, default=5)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return args, out, time.monotonic()


def texts(data: str):
    """The dolly rows as one `text` column: the prompt with memtune's default template, then the response."""
    from datasets import load_dataset

    from core.data.formats import default_prompt

    dataset = load_dataset("json", data_files=data, split="train")
    return dataset.map(lambda r: {"text": default_prompt(r["instruction"], r.get("context") or "") + r["response"]},
                       remove_columns=dataset.column_names)


def write_summary(out: Path, trainer, output, started: float) -> None:
    """summary.json in the engine's format (torch's memory peaks, tokens, times), printed too."""
    import torch

    cuda = torch.cuda.is_available()
    summary = {
        "status": "completed",
        "steps": trainer.state.global_step,
        "train_tokens": int(trainer.state.num_input_tokens_seen or 0),
        "train_runtime_s": output.metrics.get("train_runtime"),
        "runtime_s": round(time.monotonic() - started, 2),
        "final_loss": next((h["loss"] for h in reversed(trainer.state.log_history) if "loss" in h), None),
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3) if cuda else None,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(json.dumps(summary))


def main(argv=None) -> int:
    args, out, started = script_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    from bench import seed_recipe

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    # --- the chapter's script from here (model and data paths are the benchmark's) ---
    bnb_config = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, quantization_config=bnb_config, device_map="auto")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = seed_recipe.prepare(model, tokenizer)  # pad = eos, prepare_model_for_kbit_training, LoRA r16 q,k,v,o
    dataset = texts(args.data)
    training_args = seed_recipe.training_args(str(out / "qlora-output"), args.max_steps, logging_steps=10,
                                              include_num_input_tokens_seen="non_padding", use_cpu=not cuda)
    trainer = seed_recipe.trainer(model, tokenizer, dataset, training_args, callbacks=[step_callback(out / "events.jsonl")])
    output = trainer.train()
    # --- end of the chapter's script (it then saves the adapter: skipped, as in seed_recipe) ---
    write_summary(out, trainer, output, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
