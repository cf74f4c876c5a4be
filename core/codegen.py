"""The settings as code: the `python -m core.train` command, the YAML, and a short script that calls memtune's recipe.

Show code offers what trains exactly what the app trains:
- `cli_command(cfg, ...)`: the headless command, listing only the settings that differ from the base (a saved file,
  the demo, or the defaults), each as one `--set field=value`;
- `python_script(cfg)`: a short Python script that holds the settings as YAML (the file `--dump-config` writes) and
  runs them through memtune's own recipe (`core.train.recipe.run_training`), as the CLI does.

Why no standalone re-implementation of the recipe (memtune once generated one, with core/data's functions copied
in): a second copy cannot train what the engine trains. The engine trains its row plan (core.data.plan.plan_rows: the
`long_prompts` cuts of over-long prompts, answers cut at max_length, multi-turn rows), patches attention
(`attention: varlen`), resolves LoRA targets from the model's module tree, offloads embeddings, quantizes the
output head, and checks the whole config before any work. A generated copy trained TRL's own truncation of other
strings and lacked varlen attention; each new feature widened the gap. Calling the recipe keeps one sequence
(config -> data plan -> model -> LoRA -> SFTTrainer -> adapter) and the same first losses by construction
(tests/test_codegen.py checks it with over-long prompts and varlen attention). The library calls themselves are
core/config/arguments.py's dicts, readable there.

CLI:
    python -m core.codegen --config FILE.yaml [--set field=value ...]   # prints the script
    python -m core.codegen --demo --set max_steps=3 > train_demo.py
    python -m core.codegen --config FILE.yaml --cli                      # the python -m core.train command
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from core.config.settings import DEMO_DATASET, DEMO_MODEL, TrainConfig, demo_config
from core.messages import said_again


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
    from core.gpus.distributed import launch_command_text

    text = launch_command_text(cfg, str(config_path))
    if not text:
        return ""
    return "\n# memtune starts this for you (one process per GPU); the same by hand:\n# " + text.replace("\n", "\n# ")


# --- the Python script ------------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent  # memtune's folder: the script imports the recipe from there


def config_yaml(cfg: TrainConfig) -> str:
    """The settings as the YAML file `python -m core.train --config` reads."""
    return cfg.to_yaml()


def _triple_quoted(text: str) -> str:
    """`text` as a Python triple-quoted literal that reads like the YAML it holds."""
    return '"""\\\n' + text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') + '"""'


TRAINERS = {"sft": "SFTTrainer", "dpo": "DPOTrainer", "orpo": "ORPOTrainer", "kto": "KTOTrainer",
            "grpo": "GRPOTrainer"}  # by stage


def changes_note(changes: list[dict[str, Any]]) -> str:
    """The script's words for what the recipe changes from the settings (`changes`: a resolved run's, as
    core.model.resolve.ResolvedRun.as_dict() lists them), one line per reason; "" when nothing changes."""
    reasons: dict[str, list[str]] = {}
    for change in changes:
        why = str(said_again(change["key"], change["params"]))
        reasons.setdefault(why, []).append(f"{change['field']} {format_value(change['before'])} -> "
                                           f"{format_value(change['after'])}")
    if not reasons:
        return ""
    lines = "\n".join(f"- {', '.join(names)}: {why}" for why, names in reasons.items())
    lines = lines.replace("\\", "/").replace('"' * 3, "'" * 3)  # inside the script's docstring
    return f"\nWhat the recipe changes from these settings for this model, as the app's run does:\n{lines}\n"


def python_script(cfg: TrainConfig, changes: list[dict[str, Any]] = ()) -> str:
    """A short script that trains `cfg` with memtune's recipe: the same rows, tokens and losses as the app's run.
    `changes`: the resolved run's changes (core.model.resolve: ResolvedRun.as_dict()["changes"]), said in its
    docstring; the recipe decides them again from the model itself, so the script trains them either way."""
    command = "\n".join(f"#     {line}" for line in cli_command(cfg).splitlines())  # comments: any text is safe
    trainer = TRAINERS.get(cfg.stage, "SFTTrainer")
    return f'''"""QLoRA fine-tuning with memtune's recipe, generated by memtune from your settings.

SETTINGS below is the configuration as YAML (save it as memtune.yaml for `--config`). run_training is the recipe
the app and the CLI run: it checks the settings, plans every row (long_prompts cuts, max_length), loads the model
with its levers, trains with TRL's {trainer} and saves the adapter into a run folder under output_dir.
{changes_note(changes)}"""
# The same run, headless:
{command}

import signal
import sys
import threading

sys.path.insert(0, {str(ROOT)!r})  # memtune's folder

from core.gpus import distributed  # noqa: E402
from core.jobs import launcher
from core.config.settings import TrainConfig  # noqa: E402
from core.estimate.advice import oom_advice  # noqa: E402
from core.train.recipe import run_training  # noqa: E402
from core.train.cli import console_sink  # noqa: E402

SETTINGS = {_triple_quoted(config_yaml(cfg))}


def main() -> int:
    cfg = TrainConfig.from_yaml(SETTINGS)
    if distributed.plan(cfg).distributed:  # several processes: memtune's launcher starts them, as the CLI does
        return launcher.run_launcher(cfg)
    stop = threading.Event()  # Ctrl-C: finish the current step, save the adapter
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    result = run_training(cfg, console_sink(), stop=stop)
    print(oom_advice(cfg) if result.error_type == "oom" else result.message)  # out of memory: what would help
    if result.status == "failed":
        return 1
    print(f"first loss {{result.summary['first_loss']!r}}, last loss {{result.summary['final_loss']!r}}")
    print("run folder:", result.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


# --- command line -------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from core.config.settings import ConfigError, apply_overrides

    parser = argparse.ArgumentParser(prog="python -m core.codegen",
                                     description="Print the Python script that trains a configuration through "
                                                 "memtune's recipe (the app's Show code).")
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
