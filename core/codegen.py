"""The settings as code: a standalone Python script and the equivalent `python -m core.train` command.

`python_script(cfg)` writes the course chapter's script for the current settings, corrected for today's
libraries. It is rendered from the engine's own mapping, so the two train the same thing (same first loss):
- every library argument (BitsAndBytesConfig, from_pretrained, prepare_model_for_kbit_training, LoraConfig,
  SFTConfig) is core/recipe.py's dict, written out keyword by keyword; `installed_names` (copied in) renames
  gradient_checkpointing for the installed transformers at run time, as the engine does;
- rows are formatted by core/data's functions (`to_sft`, `detect_format` and what they use), copied verbatim
  into the script, so there is no second set of prompt templates;
- the chapter's fixes stay visible: dolly-15k is formatted into prompt + completion (completion-only loss), not
  `dataset_text_field="text"`; `max_length=` replaces `max_seq_length=`, `processing_class=` replaces
  `tokenizer=`, `dtype=` replaces `torch_dtype=`; the adapter is saved with the tokenizer.

`cli_command(cfg, ...)` lists only the settings that differ from the base (a saved file, the demo, or the
defaults), each as one `--set field=value`.

CLI:
    python -m core.codegen --config FILE.yaml [--set field=value ...]   # prints the script
    python -m core.codegen --demo --set max_steps=3 > train_demo.py
    python -m core.codegen --config FILE.yaml --cli                      # the python -m core.train command
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from core import recipe
from core.config import DEMO_DATA, DEMO_DATASET, DEMO_MODEL, OPTIMIZERS, TrainConfig, demo_config
from core.verbatim import helper_source


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
        return _join(head + ["--config", str(config_path)] + set_flags(cfg, base)) + accelerate_note(cfg, config_path)
    if is_demo(cfg):
        return _join(head + ["--demo"] + set_flags(cfg, demo_config())) + accelerate_note(cfg)
    flags = set_flags(cfg, TrainConfig())
    return (_join(head + ["--dump-config"] + flags) + " > memtune.yaml\n"
            + _join(head + ["--config", "memtune.yaml"]) + accelerate_note(cfg))


def accelerate_note(cfg: TrainConfig, config_path: str | Path = "memtune.yaml") -> str:
    """With several GPUs or machines: the `accelerate launch` line memtune runs for you, for those who keep one."""
    from core.distributed import launch_command_text

    text = launch_command_text(cfg, str(config_path))
    if not text:
        return ""
    return "\n# memtune starts this for you (one process per GPU); the same by hand:\n# " + text.replace("\n", "\n# ")


# --- the Python script ------------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent  # memtune's folder: the demo model and offload helper live there
DATA_ENTRY_POINTS = ("to_sft", "detect_format")  # what the script calls in core/data, as the engine does


def _py(value: Any) -> str:
    """Python source for a value, with double-quoted strings (as people write them)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _either(on_gpu: Any, on_cpu: Any) -> str:
    """Source for a value that depends on whether CUDA is there when the script runs (device auto)."""
    if on_gpu == on_cpu:
        return _py(on_gpu)
    if (on_gpu, on_cpu) == (False, True):
        return "not CUDA"
    return f"{_py(on_gpu)} if CUDA else {_py(on_cpu)}"


def _lora_modules(cfg: TrainConfig) -> list[str] | None:
    """The layer names the engine resolves cfg.lora_target_modules to (Phi-3: qkv_proj for q_proj; groups
    expanded), for a model on this machine; None (the names as written) for a Hub id, which is never downloaded
    for Show code."""
    from pathlib import Path

    from core.config import DEMO_MODEL

    if cfg.model != DEMO_MODEL and not Path(cfg.model).expanduser().is_dir():
        return None
    try:
        from core.model import lora_targets

        return lora_targets(cfg).modules
    except Exception:  # noqa: BLE001 - the engine reports it with the run; the script keeps the names as written
        return None


def _call(head: str, pair: tuple[dict[str, Any], dict[str, Any]], notes: dict[str, str],
          first: tuple[str, ...] = (), indent: str = "    ") -> list[str]:
    """`head(` + one `name=value,` line per keyword (from the engine's dicts for GPU and CPU) + `)`."""
    gpu, cpu = pair
    lines = [f"{indent}{head}("] + [f"{indent}    {arg}," for arg in first]
    for name in gpu:
        note = f"  # {notes[name]}" if notes.get(name) else ""
        lines.append(f"{indent}    {name}={_either(gpu[name], cpu[name])},{note}")
    return lines + [f"{indent})"]


def _data_loading(cfg: TrainConfig) -> tuple[str, tuple[str, ...]]:
    """(the script's load_dataset line, core/data definitions it needs besides DATA_ENTRY_POINTS)."""
    from core.data import LOADERS, is_local

    split = _py(cfg.dataset_split)
    if cfg.dataset == DEMO_DATASET:
        return f"load_dataset(\"json\", data_files={_py(str(DEMO_DATA))}, split={split})  # memtune's demo data", ()
    path = Path(cfg.dataset).expanduser()
    if not is_local(cfg.dataset):
        return f"load_dataset({_py(cfg.dataset)}, split={split})", ()
    if path.is_dir():
        return f"load_dataset({_py(str(path))}, split={split})", ()
    builder = LOADERS.get(path.suffix.lower(), "json")
    if builder == "csv":  # read exactly as the engine reads CSV (core.datafiles.read_csv: every field is text)
        return (f"_sliced(Dataset.from_dict(read_csv(Path({_py(str(path))}))), {split})", ("read_csv", "_sliced"))
    return f"load_dataset({_py(builder)}, data_files={_py(str(path))}, split={split})", ()


def _pairs(cfg: TrainConfig, build) -> tuple[Any, Any]:
    """`build(cuda)` for the GPU and the CPU case; with a fixed device both are that device's."""
    options = {"cuda": (True, True), "cpu": (False, False)}.get(cfg.device, (True, False))
    return build(options[0]), build(options[1])


def python_script(cfg: TrainConfig) -> str:
    """A standalone script (transformers 5, peft 0.21, trl 1.x) that trains what `cfg` describes.

    Every library argument comes from core/recipe.py's dicts, and the data is formatted by core/data's own
    functions (copied in), so the script trains what the engine trains: same first loss for the same seed.
    """
    out_root = Path(cfg.resume_from) if cfg.resume_from else Path(cfg.output_dir) / (cfg.run_name or "qlora-output")
    load_data, extra_roots = _data_loading(cfg)
    data_imports, data_source = helper_source("core.data", DATA_ENTRY_POINTS + extra_roots)
    recipe_imports, recipe_source = helper_source("core.recipe", ("installed_names",))
    needs_memtune = cfg.model == DEMO_MODEL or cfg.offload_embeddings or (cfg.quantize_output_head and cfg.load_in_4bit)
    bnb, kbit = recipe.bnb_kwargs(cfg), recipe.kbit_kwargs(cfg)

    lines: list[str] = []
    add = lines.append
    add('"""QLoRA fine-tuning, generated by memtune from your settings.\n\nSame run, headless:\n'
        + "\n".join(f"    {line}" for line in cli_command(cfg).splitlines()) + '\n"""\n')
    add("from __future__ import annotations  # the copied helpers' type hints stay unevaluated\n")
    if cfg.expandable_segments:
        add("import os\n")
        add("# Let the CUDA allocator grow segments in place: less memory reserved but unused (set before torch loads)")
        add('os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")\n')
    imports = sorted(set(data_imports + recipe_imports + (("import sys",) if needs_memtune else ())
                         + (("from pathlib import Path", "from datasets import Dataset")
                            if "read_csv" in extra_roots else ())
                         + (("import torch",) if cfg.device == "auto" else ())),
                     key=lambda line: (line.startswith("from"), line))
    lines += imports
    add("")
    add("from datasets import load_dataset")
    add("from peft import LoraConfig, get_peft_model" + (", prepare_model_for_kbit_training" if kbit else ""))
    add("from transformers import AutoModelForCausalLM, AutoTokenizer" + (", BitsAndBytesConfig" if bnb else "")
        + ", set_seed")
    add("from trl import SFTConfig, SFTTrainer\n")
    if needs_memtune:
        add(f"sys.path.insert(0, {_py(str(ROOT))})  # memtune's folder: its helpers below come from there")
    if cfg.model == DEMO_MODEL:
        add("from core.demo import ensure_demo_model  # memtune's offline demo model, built on this machine\n")
        add("MODEL = str(ensure_demo_model())")
    else:
        add(f"MODEL = {_py(cfg.model)}")
    add(f"OUTPUT_DIR = {_py(str(out_root))}")
    if cfg.device == "auto":
        add("CUDA = torch.cuda.is_available()")
    add("\n")
    add("def main():")
    if bnb:
        add("    # Quantization: the frozen base weights in 4 bits (QLoRA)")
        lines += _call("bnb_config = BitsAndBytesConfig", (bnb, bnb), {})
    add("    # Load model")
    load = _pairs(cfg, lambda cuda: recipe.load_kwargs(cfg, 0 if cuda else None))
    lines += _call("model = AutoModelForCausalLM.from_pretrained", load,
                   {"dtype": "was torch_dtype=",
                    "trust_remote_code": "runs Python code shipped with the model" if cfg.trust_remote_code else ""},
                   first=("MODEL",) + (("quantization_config=bnb_config",) if bnb else ()))
    add("    model.config.use_cache = False  # the KV cache is useless in training")
    add(f"    tokenizer = AutoTokenizer.from_pretrained(MODEL, trust_remote_code={cfg.trust_remote_code!r})")
    add("    if tokenizer.pad_token is None:")
    add("        tokenizer.pad_token = tokenizer.eos_token  # padded positions carry no loss\n")

    add("    # Prepare for training")
    if kbit:
        add(f"    model = prepare_model_for_kbit_training(model, {', '.join(f'{k}={_py(v)}' for k, v in kbit.items())})"
            "  # upcasts norms/embeddings to fp32")
    else:
        add("    for param in model.parameters():  # freeze the base; it stays in its loaded dtype")
        add("        param.requires_grad_(False)")
    if cfg.offload_embeddings:
        add("    # Keep the frozen input embedding in CPU memory; only looked-up rows go to the GPU (memtune's helper)")
        add("    from core.model import offload_input_embeddings\n")
        add("    offload_input_embeddings(model)")
    if cfg.quantize_output_head and cfg.load_in_4bit:
        add("    # The frozen output head in 4-bit NF4, read by TRL's fused loss in vocabulary chunks (memtune's helper)")
        add("    from core.model import quantize_output_head\n")
        add("    quantize_output_head(model, None)  # on the device the head was loaded to")
    if cfg.gradient_checkpointing:
        add("    model.enable_input_require_grads()  # checkpointed blocks need an input that requires grad")
    add(f"    set_seed({cfg.seed!r})  # LoRA's A matrices start random: seeded, a run repeats exactly")
    lines += _call("lora_config = LoraConfig", (recipe.lora_kwargs(cfg, _lora_modules(cfg)),) * 2, {})
    add("    model = get_peft_model(model, lora_config)")
    add("    model.print_trainable_parameters()\n")

    add("    # Dataset: rows -> prompt + completion (loss on the completion only) or text, by the functions at the end")
    add("    # of this file: memtune's own (core/data.py), so the rows are exactly those the app trains on")
    add(f"    dataset = {load_data}")
    fmt = "detect_format(dataset)" if cfg.dataset_format == "auto" else _py(cfg.dataset_format)
    add(f"    dataset = to_sft(dataset, {fmt}, tokenizer)\n")

    add("    # Memory-efficient training arguments (TRL's SFTConfig extends TrainingArguments)")
    notes = {
        "gradient_accumulation_steps": f"effective batch = {cfg.per_device_train_batch_size} x "
                                       f"{cfg.gradient_accumulation_steps} = {cfg.effective_batch_size}",
        "optim": "needs bitsandbytes" if OPTIMIZERS.get(cfg.optim, (False,))[0] else "",
        "gradient_checkpointing": "activation_checkpointing since transformers 5.2x: installed_names renames it",
        "max_length": "was SFTTrainer(max_seq_length=...)",
        "packing_strategy": "padding-free: per-row position ids",
        "save_only_model": "optimizer state too: resumable",
    }
    lines += _call("sft_args = dict", _pairs(cfg, lambda cuda: recipe.sft_kwargs(
        cfg, f"{out_root}/checkpoints", cuda)), notes)
    add("    training_args = SFTConfig(**installed_names(sft_args, SFTConfig))\n")
    add("    # Train")
    add("    trainer = SFTTrainer(")
    add("        model=model,")
    add("        args=training_args,")
    add("        train_dataset=dataset,")
    add("        processing_class=tokenizer,  # was tokenizer=")
    add("    )")
    if cfg.resume_from:
        add(f"    trainer.train(resume_from_checkpoint=True)  # continues from the last checkpoint in {cfg.resume_from}")
    else:
        add("    trainer.train()")
    add('    model.save_pretrained(f"{OUTPUT_DIR}/adapter")')
    add('    tokenizer.save_pretrained(f"{OUTPUT_DIR}/adapter")')
    add('    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]')
    add("    if losses:")
    add('        print(f"first loss {losses[0]!r}, last loss {losses[-1]!r}")')
    add('    print("adapter saved to", f"{OUTPUT_DIR}/adapter")\n\n')
    add("# --- Helpers: memtune's own definitions (core/recipe.py, core/data.py), copied so this file runs alone ---")
    add(recipe_source + "\n\n")
    add(data_source + "\n\n")
    add('if __name__ == "__main__":')
    add("    main()")
    return "\n".join(lines) + "\n"


# --- command line -------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from core.config import ConfigError, apply_overrides

    parser = argparse.ArgumentParser(prog="python -m core.codegen",
                                     description="Print the standalone Python script that trains a configuration "
                                                 "(the app's Show code).")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="YAML file of settings (python -m core.train --dump-config writes one)")
    src.add_argument("--demo", action="store_true", help="the offline demo's settings")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override one setting; repeatable")
    parser.add_argument("--cli", action="store_true", help="print the equivalent python -m core.train command instead")
    args = parser.parse_args(argv)
    try:
        cfg = apply_overrides(demo_config() if args.demo else TrainConfig.load(args.config), args.overrides)
    except ConfigError as exc:
        print(f"memtune: {exc}", file=sys.stderr)
        return 2
    print(cli_command(cfg, config_path=args.config) + "\n" if args.cli else python_script(cfg), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
