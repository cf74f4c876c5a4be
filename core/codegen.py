"""The settings as code: a standalone Python script and the equivalent `python -m core.train` command.

`python_script(cfg)` writes the course chapter's script for the current settings, corrected for today's
libraries (no gradio here, so the CLI can reuse it):
- dolly-15k's real id is databricks/databricks-dolly-15k, and it has no `text` column: rows are formatted
  into prompt + completion (completion-only loss) instead of `dataset_text_field="text"`;
- `SFTConfig(max_length=...)` replaces SFTTrainer's removed `max_seq_length=`, `processing_class=` replaces
  `tokenizer=`; `dtype=` replaces `torch_dtype=`;
- the adapter is saved with the tokenizer.

`cli_command(cfg, ...)` lists only the settings that differ from the base (a saved file, the demo, or the
defaults), each as one `--set field=value`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import fields
from pathlib import Path
from typing import Any

from core.config import DEMO_DATASET, DEMO_MODEL, OPTIMIZERS, TrainConfig, demo_config

DOLLY_IDS = ("databricks/databricks-dolly-15k", "databricks/dolly-15k")
DATA_FILE_TYPES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


# --- the CLI ----------------------------------------------------------------------------------------------
def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def changed_fields(cfg: TrainConfig, base: TrainConfig) -> list[str]:
    return [f.name for f in fields(TrainConfig) if getattr(cfg, f.name) != getattr(base, f.name)]


def set_flags(cfg: TrainConfig, base: TrainConfig) -> list[str]:
    out = []
    for name in changed_fields(cfg, base):
        out += ["--set", f"{name}={format_value(getattr(cfg, name))}"]
    return out


def _join(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def is_demo(cfg: TrainConfig) -> bool:
    return cfg.model == DEMO_MODEL and cfg.dataset == DEMO_DATASET


def cli_command(cfg: TrainConfig, config_path: str | Path | None = None, base: TrainConfig | None = None) -> str:
    """The shell command that trains `cfg` headless.

    With `config_path` (a saved YAML whose content is `base`, default: the file as it is on disk), only fields
    differing from that file are added as --set. Without it, the demo is the base when the config trains the
    demo model on the demo data; otherwise the defaults, written to a file by --dump-config first.
    """
    head = ["python", "-m", "core.train"]
    if config_path is not None:
        if base is None:
            try:
                base = TrainConfig.load(config_path)
            except ValueError:
                base = TrainConfig()
        return _join(head + ["--config", str(config_path)] + set_flags(cfg, base))
    if is_demo(cfg):
        return _join(head + ["--demo"] + set_flags(cfg, demo_config()))
    flags = set_flags(cfg, TrainConfig())
    return (_join(head + ["--dump-config"] + flags) + " > memtune.yaml\n"
            + _join(head + ["--config", "memtune.yaml"]))


# --- the Python script ------------------------------------------------------------------------------------------
def _py(value: Any) -> str:
    """Python source for a value, with double-quoted strings (as people write them)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return repr(value)


def _data_source(cfg: TrainConfig) -> tuple[str, str]:
    """(code that loads the dataset, format name) for the script."""
    fmt = cfg.dataset_format
    if cfg.dataset == DEMO_DATASET:
        from core.demo import DEMO_DATA

        load = (f"# memtune's bundled demo data (dolly format)\n"
                f"dataset = load_dataset(\"json\", data_files={_py(str(DEMO_DATA))}, split={_py(cfg.dataset_split)})")
        return load, "dolly" if fmt == "auto" else fmt
    suffix = Path(cfg.dataset).suffix.lower()
    if suffix in DATA_FILE_TYPES:
        load = (f"dataset = load_dataset({_py(DATA_FILE_TYPES[suffix])}, data_files={_py(cfg.dataset)}, "
                f"split={_py(cfg.dataset_split)})")
        if suffix == ".txt" and fmt == "auto":
            fmt = "text"
    else:
        load = f"dataset = load_dataset({_py(cfg.dataset)}, split={_py(cfg.dataset_split)})"
    if fmt == "auto" and cfg.dataset in DOLLY_IDS:
        fmt = "dolly"
    return load, fmt


# Prompt template for datasets without a chat template: the Alpaca layout (instruction, optional input, response).
FORMATTERS = {
    "dolly": '''
def to_prompt_completion(row):
    """dolly rows (instruction, context, response) -> prompt + completion: the loss falls on the response only."""
    question = row["instruction"] + (f"\\n\\n{row['context']}" if row.get("context") else "")
    if tokenizer.chat_template:  # chat models: TRL renders these messages with the model's chat template
        return {"prompt": [{"role": "user", "content": question}],
                "completion": [{"role": "assistant", "content": row["response"]}]}
    prompt = f"### Instruction:\\n{row['instruction']}\\n\\n"
    if row.get("context"):
        prompt += f"### Input:\\n{row['context']}\\n\\n"
    return {"prompt": prompt + "### Response:\\n", "completion": row["response"]}

dataset = dataset.map(to_prompt_completion, remove_columns=dataset.column_names)
''',
    "alpaca": '''
def to_prompt_completion(row):
    """alpaca rows (instruction, input, output) -> prompt + completion: the loss falls on the output only."""
    question = row["instruction"] + (f"\\n\\n{row['input']}" if row.get("input") else "")
    if tokenizer.chat_template:  # chat models: TRL renders these messages with the model's chat template
        return {"prompt": [{"role": "user", "content": question}],
                "completion": [{"role": "assistant", "content": row["output"]}]}
    prompt = f"### Instruction:\\n{row['instruction']}\\n\\n"
    if row.get("input"):
        prompt += f"### Input:\\n{row['input']}\\n\\n"
    return {"prompt": prompt + "### Response:\\n", "completion": row["output"]}

dataset = dataset.map(to_prompt_completion, remove_columns=dataset.column_names)
''',
    "text": '''
# Plain text: the model learns every token of the `text` column.
dataset = dataset.select_columns(["text"])
''',
    "prompt_completion": '''
# prompt/completion rows train as they are: the loss falls on the completion only.
dataset = dataset.select_columns(["prompt", "completion"])
''',
    "messages": '''
# Chat rows: SFTTrainer applies the tokenizer's chat template to `messages`.
dataset = dataset.select_columns(["messages"])
''',
    "sharegpt": '''
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}

def to_messages(row):
    """ShareGPT rows (conversations: from/value) -> chat messages."""
    return {"messages": [{"role": ROLES.get(turn["from"], turn["from"]), "content": turn["value"]}
                         for turn in row["conversations"]]}

dataset = dataset.map(to_messages, remove_columns=dataset.column_names)
''',
    "auto": '''
def to_sft(row):
    """Whatever the columns: plain text, dolly, alpaca or prompt/completion -> prompt + completion (or text)."""
    if "prompt" in row and "completion" in row:
        return {"prompt": row["prompt"], "completion": row["completion"]}
    if "instruction" in row:
        extra = row.get("context") or row.get("input") or ""
        answer = row.get("response", row.get("output", ""))
        prompt = f"### Instruction:\\n{row['instruction']}\\n\\n"
        if extra:
            prompt += f"### Input:\\n{extra}\\n\\n"
        return {"prompt": prompt + "### Response:\\n", "completion": answer}
    if "text" in row:
        return {"prompt": "", "completion": row["text"]}
    raise ValueError(f"unknown columns {sorted(row)}: expected text, instruction/response or prompt/completion")

dataset = dataset.map(to_sft, remove_columns=dataset.column_names)
''',
}

# Fields the script reproduces; a non-default value of any other field is listed in a comment instead.
SCRIPTED = {
    "model", "trust_remote_code", "load_in_4bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "precision",
    "upcast_to_fp32", "offload_embeddings", "expandable_segments", "lora_r", "lora_alpha", "lora_dropout",
    "lora_target_modules", "dataset", "dataset_split", "dataset_format", "max_length", "per_device_train_batch_size",
    "gradient_accumulation_steps", "packing", "num_train_epochs", "max_steps", "learning_rate", "lr_scheduler_type",
    "warmup_steps", "weight_decay", "max_grad_norm", "optim", "gradient_checkpointing", "use_liger_kernel", "seed",
    "logging_steps", "save_strategy", "save_steps", "output_dir", "run_name", "device",
}

DTYPE = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}


def sft_kwargs(cfg: TrainConfig, output_dir: str) -> list[tuple[str, str]]:
    """SFTConfig arguments as (name, Python source) pairs, in the chapter's order, defaults left out."""
    kw: list[tuple[str, str]] = [("output_dir", _py(output_dir))]
    if cfg.max_steps > 0:
        kw.append(("max_steps", _py(cfg.max_steps)))
    else:
        kw.append(("num_train_epochs", _py(cfg.num_train_epochs)))
    kw += [
        ("per_device_train_batch_size", _py(cfg.per_device_train_batch_size)),
        ("gradient_accumulation_steps", _py(cfg.gradient_accumulation_steps)
         + f",  # effective batch = {cfg.per_device_train_batch_size} x {cfg.gradient_accumulation_steps}"
           f" = {cfg.effective_batch_size}"),
        ("learning_rate", _py(cfg.learning_rate)),
    ]
    if cfg.lr_scheduler_type != "linear":
        kw.append(("lr_scheduler_type", _py(cfg.lr_scheduler_type)))
    if cfg.warmup_steps:
        kw.append(("warmup_steps", _py(cfg.warmup_steps)))
    if cfg.weight_decay:
        kw.append(("weight_decay", _py(cfg.weight_decay)))
    if cfg.max_grad_norm != 1.0:
        kw.append(("max_grad_norm", _py(cfg.max_grad_norm)))
    if cfg.precision == "bf16":
        kw.append(("bf16", "True"))
    elif cfg.precision == "fp16":
        kw.append(("fp16", "True"))
    kw.append(("gradient_checkpointing", _py(cfg.gradient_checkpointing)))
    if cfg.gradient_checkpointing:
        kw.append(("gradient_checkpointing_kwargs", '{"use_reentrant": False}'))
    kw.append(("optim", _py(cfg.optim) + ("  # needs bitsandbytes" if OPTIMIZERS.get(cfg.optim, (False,))[0] else "")))
    kw.append(("max_length", _py(cfg.max_length) + ",  # was SFTTrainer(max_seq_length=...)"))
    if cfg.packing:
        kw += [("packing", "True"), ("packing_strategy", '"bfd"  # padding-free: per-row position ids')]
    if cfg.use_liger_kernel:
        kw.append(("use_liger_kernel", "True"))
    kw.append(("logging_steps", _py(cfg.logging_steps)))
    kw.append(("save_strategy", _py(cfg.save_strategy)))
    if cfg.save_strategy == "steps":
        kw.append(("save_steps", _py(cfg.save_steps)))
    if cfg.seed != 42:
        kw.append(("seed", _py(cfg.seed)))
    if cfg.device == "cpu":
        kw.append(("use_cpu", "True"))
    elif cfg.device == "auto":
        kw.append(("use_cpu", "not torch.cuda.is_available()"))
    kw.append(("report_to", '"none"'))
    return kw


def python_script(cfg: TrainConfig) -> str:
    """A standalone script (transformers 5, peft 0.21, trl 1.x) that trains what `cfg` describes."""
    out_root = Path(cfg.output_dir) / (cfg.run_name or "qlora-output")
    load_data, fmt = _data_source(cfg)
    lines: list[str] = []
    add = lines.append
    add(f'"""QLoRA fine-tuning, generated by memtune from your settings.\n\nSame run, headless:\n'
        + "\n".join(f"    {line}" for line in cli_command(cfg).splitlines()) + '\n"""\n')
    if cfg.expandable_segments:
        add("import os\n")
        add("# Let the CUDA allocator grow segments in place: less memory reserved but unused (set before torch loads)")
        add('os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")\n')
    add("import torch")
    add("from datasets import load_dataset")
    add("from peft import LoraConfig, get_peft_model" + (", prepare_model_for_kbit_training"
                                                         if cfg.load_in_4bit and cfg.upcast_to_fp32 else ""))
    add("from transformers import AutoModelForCausalLM, AutoTokenizer" + (", BitsAndBytesConfig" if cfg.load_in_4bit else ""))
    add("from trl import SFTConfig, SFTTrainer\n")
    if cfg.model == DEMO_MODEL:
        add("# memtune's offline demo model is built on this machine (run from the memtune folder).")
        add("from core.demo import ensure_demo_model\n")
        add("MODEL = str(ensure_demo_model())")
    else:
        add(f"MODEL = {_py(cfg.model)}")
    add(f"OUTPUT_DIR = {_py(str(out_root))}\n")

    if cfg.load_in_4bit:
        add("# Quantization: the frozen base weights in 4 bits (QLoRA)")
        add("bnb_config = BitsAndBytesConfig(")
        add("    load_in_4bit=True,")
        add(f"    bnb_4bit_quant_type={_py(cfg.bnb_4bit_quant_type)},")
        add(f"    bnb_4bit_compute_dtype={DTYPE[cfg.precision]},")
        add(f"    bnb_4bit_use_double_quant={_py(cfg.bnb_4bit_use_double_quant)},")
        add(")\n")
    device_map = '"cpu"' if cfg.device == "cpu" else '"auto"'
    add("# Load model")
    add("model = AutoModelForCausalLM.from_pretrained(")
    add("    MODEL,")
    if cfg.load_in_4bit:
        add("    quantization_config=bnb_config,")
    add(f"    dtype={DTYPE[cfg.precision]},  # was torch_dtype=")
    add(f"    device_map={device_map},")
    if cfg.trust_remote_code:
        add("    trust_remote_code=True,  # runs Python code shipped with the model")
    add(")")
    add("model.config.use_cache = False  # the KV cache is useless in training")
    add("tokenizer = AutoTokenizer.from_pretrained(MODEL" + (", trust_remote_code=True" if cfg.trust_remote_code else "") + ")")
    add("if tokenizer.pad_token is None:")
    add("    tokenizer.pad_token = tokenizer.eos_token\n")

    add("# Prepare for training")
    if cfg.load_in_4bit and cfg.upcast_to_fp32:
        add("model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)  # upcasts norms/embeddings to fp32")
    else:
        add("for param in model.parameters():  # freeze the base; it stays in its loaded dtype")
        add("    param.requires_grad_(False)")
    if cfg.offload_embeddings:
        add("# Keep the frozen input embedding in CPU memory; only looked-up rows go to the GPU (memtune's helper)")
        add("from core.model import offload_input_embeddings\n")
        add("offload_input_embeddings(model)")
    if cfg.gradient_checkpointing:
        add("model.enable_input_require_grads()  # checkpointed blocks need an input that requires grad")
    add("")
    add("# LoRA config")
    add("lora_config = LoraConfig(")
    add(f"    r={cfg.lora_r},")
    add(f"    lora_alpha={cfg.lora_alpha},")
    add(f"    target_modules={_py(list(cfg.lora_target_modules))},")
    add(f"    lora_dropout={_py(cfg.lora_dropout)},")
    add('    bias="none",')
    add('    task_type="CAUSAL_LM",')
    add(")")
    add("model = get_peft_model(model, lora_config)")
    add("model.print_trainable_parameters()\n")

    add("# Dataset")
    add(load_data + "\n")
    add(FORMATTERS.get(fmt, FORMATTERS["auto"]).strip("\n") + "\n")

    add("# Memory-efficient training arguments (TRL's SFTConfig extends TrainingArguments)")
    add("training_args = SFTConfig(")
    for name, src in sft_kwargs(cfg, str(Path(out_root) / "checkpoints")):
        if "  #" in src:
            value, comment = src.split("  #", 1)
            value = value.rstrip(",")
            add(f"    {name}={value},  #{comment}")
        else:
            add(f"    {name}={src},")
    add(")\n")
    add("# Train")
    add("trainer = SFTTrainer(")
    add("    model=model,")
    add("    args=training_args,")
    add("    train_dataset=dataset,")
    add("    processing_class=tokenizer,  # was tokenizer=")
    add(")")
    skipped = [f"{n}={format_value(getattr(cfg, n))}" for n in changed_fields(cfg, TrainConfig())
               if n not in SCRIPTED]
    if skipped:
        add("# Not reproduced by this script (memtune settings): " + ", ".join(skipped))
    add("trainer.train()")
    add('model.save_pretrained(f"{OUTPUT_DIR}/adapter")')
    add('tokenizer.save_pretrained(f"{OUTPUT_DIR}/adapter")')
    add('print("adapter saved to", f"{OUTPUT_DIR}/adapter")')
    return "\n".join(lines) + "\n"
