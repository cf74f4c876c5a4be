"""TRL's documented QLoRA DPO setup, as written, for bench/product.py: issue 44's baseline row beside memtune's.

    python -m bench.trl_dpo_script --model DIR --data PAIRS.jsonl --out RUN_DIR [--max-steps N]

The setup, from TRL's own documentation (huggingface/trl, docs/source/peft_integration.md as of commit 067322f,
published as https://huggingface.co/docs/trl/peft_integration):
- section "PEFT with Different Trainers", DPO, "With LoRA": `python trl/scripts/dpo.py --model_name_or_path
  Qwen/Qwen2-0.5B-Instruct --dataset_name trl-lib/ultrafeedback_binarized --learning_rate 5.0e-6
  --per_device_train_batch_size 2 --gradient_accumulation_steps 8 --use_peft --lora_r 32 --lora_alpha 16
  --output_dir Qwen2-0.5B-DPO-LoRA`;
- section "QLoRA", "Using QLoRA with TRL": "Simply combine `load_in_4bit=True` with PEFT configuration", on the
  command line `--load_in_4bit` (its example runs sft.py; the flag is TRL's ModelConfig's, which dpo.py reads too).
This script parses exactly those arguments (DOCUMENTED) with trl/scripts/dpo.py's own parser (`make_parser`) and
builds the trainer as that script's `main` does: `DPOTrainer(model=<path>, args, train_dataset,
quantization_config=get_quantization_config(model_args), peft_config=get_peft_config(model_args))`, so every
setting not on the command line is TRL's default (trl 1.16): the base loaded by the trainer in float32
(ModelConfig.dtype; the 4-bit layers' compute dtype follows it), NF4 without double quantization
(use_bnb_nested_quant=False), LoRA r 32, alpha 16, dropout 0.05 on peft's default modules for Llama (q_proj,
v_proj), DPOConfig's bf16 autocast, gradient checkpointing on, max_length 1024, beta 0.1, the sigmoid loss, the
reference being the base with the adapter disabled, Trainer's default optimizer (AdamW, fused torch).

What differs from the documented command, and why:
- `--model_name_or_path` is the bench's local model folder (random weights of the real architecture, saved like a
  Hub download) and the data the bench's synthetic pairs (bench/synth.py preference_pairs: TRL's standard format
  with an explicit prompt, dolly-like lengths), read with `load_dataset("json", data_files=...)`: the GPU machine
  has no network, and ultrafeedback_binarized is conversational, which needs a chat template the bench's
  word-level tokenizer has not;
- benchmark-only: `--max_steps N` instead of one epoch, `--save_strategy no` and no `trainer.save_model` (as the
  chapter's script row), `--report_to none`, `--logging_steps 1` (a loss every step: DPO's first loss is ln 2 =
  0.6931 while the policy still equals its reference), `include_num_input_tokens_seen="non_padding"` (the tokens
  behind tokens/s: prompt + chosen and prompt + rejected, as memtune's rows count them), and the chapter script's
  step callback writing events.jsonl and summary.json in the engine's format; on a machine without CUDA
  `--use_cpu` and no bf16 (the CPU smoke run of the plan only).
"""

from __future__ import annotations

import json
import time

from bench.chapter_script import script_args, step_callback, write_summary

# The documented command's arguments (module docstring), the model and dataset aside.
DOCUMENTED = ["--learning_rate", "5.0e-6", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "8",
              "--use_peft", "--lora_r", "32", "--lora_alpha", "16", "--load_in_4bit"]


def bench_args(model: str, out: str, max_steps: int, cuda: bool) -> list[str]:
    """The benchmark's own arguments (module docstring: what differs and why)."""
    return ["--model_name_or_path", model, "--dataset_name", "json", "--output_dir", out, "--max_steps",
            str(max_steps), "--save_strategy", "no", "--report_to", "none", "--logging_steps", "1",
            *([] if cuda else ["--use_cpu", "--bf16", "false"])]


def settings(trainer, model_args) -> dict:
    """What the documented setup resolved to, under the names bench/product.py's table reads from a run event."""
    args = trainer.args
    peft = getattr(trainer.model, "peft_config", {}).get("default")
    return {"per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "gradient_checkpointing": args.gradient_checkpointing, "optim": getattr(args.optim, "value", args.optim),
            "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32", "max_length": args.max_length,
            "learning_rate": args.learning_rate, "beta": args.beta, "loss_type": args.loss_type,
            "load_in_4bit": model_args.load_in_4bit, "dtype": model_args.dtype,
            "bnb_4bit_use_double_quant": model_args.use_bnb_nested_quant,
            "lora_r": getattr(peft, "r", None), "lora_alpha": getattr(peft, "lora_alpha", None),
            "lora_dropout": getattr(peft, "lora_dropout", None),
            "lora_target_modules": sorted(getattr(peft, "target_modules", None) or [])}


def main(argv=None) -> int:
    args, out, started = script_args(argv)

    import torch
    from datasets import load_dataset
    from trl import DPOTrainer, get_peft_config, get_quantization_config
    from trl.scripts.dpo import make_parser

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    parser = make_parser()
    script, training_args, model_args, _ = parser.parse_args_and_config(
        [*DOCUMENTED, *bench_args(args.model, str(out / "dpo-output"), args.max_steps, cuda)],
        fail_with_unknown_args=True)
    training_args.include_num_input_tokens_seen = "non_padding"  # the parser reads this field as a bool only
    # --- trl/scripts/dpo.py's main from here (the dataset is the bench's local file) ---
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    if training_args.model_init_kwargs is not None:
        model_init_kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = model_init_kwargs
    dataset = load_dataset(script.dataset_name, data_files={"train": args.data})
    trainer = DPOTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=dataset[script.dataset_train_split],
        eval_dataset=None,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    events = out / "events.jsonl"
    with events.open("a", encoding="utf-8") as f:  # what the setup resolved to: bench/product.py's "settings"
        f.write(json.dumps({"time": round(time.time(), 3), "kind": "run", "config": settings(trainer, model_args)})
                + "\n")
    trainer.add_callback(step_callback(events, losses=True))
    output = trainer.train()
    # --- end (the script then saves the adapter: skipped, as in the chapter's script row) ---
    write_summary(out, trainer, output, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
