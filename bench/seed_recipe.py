"""The course chapter's "complete memory-efficient training script", as written, with today's API names.

Only three things differ from the chapter (shared/seeds): the model comes from `bench.synth.build_model` (random
weights, same modules as `from_pretrained(..., quantization_config=bnb_config, device_map="auto")` gives on one
GPU), the data is the benchmark's synthetic `text` dataset, and the run is cut to `max_steps` without saving.
API renames: `SFTTrainer(tokenizer=)` -> `processing_class=`, `max_seq_length=` -> `SFTConfig(max_length=)`,
`TrainingArguments` -> `SFTConfig` (where TRL now takes max_length and dataset_text_field).
"""

from __future__ import annotations

import dataclasses

import torch


def prepare(model, tokenizer, lora_seed: int = 42):
    """The chapter's model preparation: k-bit preparation (fp32 upcast) and LoRA r16/alpha32 on q,k,v,o."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    tokenizer.pad_token = tokenizer.eos_token
    model = prepare_model_for_kbit_training(model)
    lora_config = LoraConfig(
        r=16,
        lora_alpha=32,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        lora_dropout=0.05,
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(lora_seed)  # LoRA A init draws from the global RNG: same draw as the engine path
    return get_peft_model(model, lora_config)


def training_args(output_dir: str, max_steps: int, logging_steps: int = 1, **changes):
    """The chapter's TrainingArguments (+ SFTTrainer's max_seq_length / dataset_text_field), as an SFTConfig."""
    from trl import SFTConfig

    known = {f.name for f in dataclasses.fields(SFTConfig)}
    ckpt = "activation_checkpointing" if "activation_checkpointing" in known else "gradient_checkpointing"
    kwargs = dict(
        output_dir=output_dir,
        num_train_epochs=1,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=16,
        learning_rate=2e-4,
        bf16=True,
        optim="paged_adamw_8bit",
        logging_steps=10,
        save_strategy="epoch",
        max_length=512,  # was SFTTrainer(max_seq_length=512)
        dataset_text_field="text",
        **{ckpt: True},
    )
    # Benchmark-only: a few steps, a loss every step, nothing saved, no reporting integrations.
    kwargs.update(max_steps=max_steps, logging_steps=logging_steps, save_strategy="no", report_to="none",
                  disable_tqdm=True)
    kwargs.update(changes)  # grid rows vary batch, length, checkpointing, optimizer
    if "gradient_checkpointing" in changes and ckpt != "gradient_checkpointing":
        kwargs[ckpt] = kwargs.pop("gradient_checkpointing")
    return SFTConfig(**kwargs)


def trainer(model, tokenizer, dataset, args, callbacks=()):
    from trl import SFTTrainer

    return SFTTrainer(
        model=model,
        train_dataset=dataset,
        args=args,
        processing_class=tokenizer,  # was tokenizer=tokenizer
        callbacks=list(callbacks),
    )
