"""The command line of the training recipe: `python -m core.train` (usage in core/train/recipe.py's docstring)
runs `run()`.

Argument parsing, the process around one run (torch threads, by the rule the app's child follows, said in the run's
first line; quiet libraries; signals and a parent that died are core/jobs/supervise.py's) and, when the config asks
for several processes, the hand-off to accelerate's launcher (core/jobs/launcher.py). The recipe itself,
`run_training`, is core/train/ (imported when a run starts); `python -m core.train` is core/train/__main__.py, which
runs `run()` here.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from core.config.settings import (ConfigError, Hardware, TrainConfig, demo_config, demo_vision_config,
                                  parse_overrides)
from core.config.slices import TrainerSlice
from core.config.presets import PRESETS
from core.i18n import environment_language, formatted, record_words, t, words
from core.jobs.supervise import Threads, stop_on_signals, stop_when_orphaned, torch_threads


def console_language() -> str:
    """The terminal's language: LC_ALL, LC_MESSAGES, LANG (core.i18n.environment_language), English by default."""
    return environment_language(os.environ)


def console_sink(lang: str | None = None) -> Callable[[dict[str, Any]], None]:
    """A sink printing phase messages and log lines on stderr in `lang` (default: the terminal's, read once, here);
    the Trainer's own progress bar shows steps, ETA and speed.

    Errors are not printed here: `main` prints the failure once, and the traceback stays in events.jsonl.
    """
    lang = lang or console_language()

    def sink(event: dict[str, Any]) -> None:
        kind = event["kind"]
        if (kind == "phase" and event.get("phase") != "training") or kind == "log":
            print(f"[memtune] {words(event, lang)}", file=sys.stderr, flush=True)

    return sink


def console_keeping(errors: list[dict[str, Any]], lang: str | None = None):
    """console_sink, keeping the run's error events: their key and values say the failure in the terminal's language."""
    printed = console_sink(lang)

    def sink(event: dict[str, Any]) -> None:
        if event["kind"] == "error":
            errors.append(event)
        printed(event)

    return sink


def said(text: Any, lang: str) -> str:
    """A message that may carry its key (a core.messages.Said) in `lang`; any other text as it is."""
    return words({"key": getattr(text, "key", None), "params": getattr(text, "params", None), "message": text}, lang)


def quiet_libraries(console: bool) -> None:
    """The libraries' noise silenced (core/quiet.py); their progress bars only on an interactive terminal."""
    from core.quiet import quiet_libraries as quiet

    quiet(progress_bars=console)


def set_threads(threads: Threads) -> None:
    """torch's intra-op threads as core.jobs.supervise.torch_threads chose them (the app's child by the same rule)."""
    import torch

    torch.set_num_threads(threads.n)


def main(argv: list[str] | None = None, callbacks=()) -> int:
    """`python -m core.train ARGS`; `callbacks`: extra TrainerCallbacks (bench/stepprof.py times the steps)."""
    parser = argparse.ArgumentParser(prog="python -m core.train", description="Fine-tune with LoRA/QLoRA, headless.")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--config", help="YAML file of settings (start from --dump-config)")
    src.add_argument("--demo", action="store_true", help="train the offline demo (tiny model, shipped data)")
    src.add_argument("--demo-vision", action="store_true", help="train the offline vision demo (tiny image-text "
                     "model, shipped images of shapes and colours)")
    # Not exclusive with them: `--demo --dump-config` writes the demo's settings, `--config F --dump-config` F's.
    parser.add_argument("--dump-config", action="store_true", help="print the configuration as YAML instead of "
                        "training: the defaults, or those of --demo / --config, after --preset and --set")
    parser.add_argument("--preset", choices=list(PRESETS), help="apply a preset's memory/speed levers first "
                        "(chapter: the recipe as written; lowest_memory; fastest), then --set")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override one setting; repeatable")
    # Internal (the app's job manager): train into exactly this folder, which it made and wrote config.yaml into.
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not (args.config or args.demo or args.demo_vision or args.dump_config):
        parser.error("one of the arguments --config --demo --demo-vision --dump-config is required")
    try:
        cfg = (demo_config() if args.demo else demo_vision_config() if args.demo_vision else
               TrainConfig.load(args.config) if args.config else TrainConfig())
        changes = parse_overrides(args.overrides)
        if args.preset:
            # A dumped file may be meant for another machine; a run here keeps CUDA-only levers off without CUDA.
            from core.estimate.predict import fit_preset

            # For the final settings (--set's model, length ... included): a preset with a memory promise picks the
            # micro-batch/checkpointing that keeps it, around what --set fixed.
            fit = fit_preset(cfg, args.preset, None if args.dump_config else Hardware.detect(), fixed=changes)
            cfg = fit.cfg
            if fit.key:
                print(f"[memtune] preset {args.preset}: {fit.note(console_language())}", file=sys.stderr, flush=True)
        cfg = cfg.replace(**changes)
    except ConfigError as exc:
        print(f"memtune: {exc}", file=sys.stderr)
        return 2
    if args.dump_config:
        from core.codegen import accelerate_note

        print(f"# memtune configuration: python -m core.train --config this.yaml{accelerate_note(cfg, 'this.yaml')}"
              f"\n{cfg.to_yaml()}", end="")
        return 0
    from core.files import long_lived

    lang = console_language()
    with long_lived():  # what a run imports lives as long as its process
        from core.gpus import distributed
        from core.jobs import launcher

        if distributed.pin_one_gpu(cfg):  # one process, several GPUs visible: use GPU 0, not nn.DataParallel
            print(f"[memtune] {t('cli.one_gpu', lang)}", file=sys.stderr, flush=True)
        launches = distributed.plan(cfg).distributed and not distributed.in_worker()
        threads = torch_threads()  # said first by the process that trains (a launcher's workers each say theirs)
        if not launches:
            print(f"[memtune] {said(threads.said(), lang)}", file=sys.stderr, flush=True)
        if not launches and "core.train.libraries" not in sys.modules:  # (accelerate's launcher only waits)
            print(f"[memtune] {t('cli.loading', lang)}", file=sys.stderr, flush=True)
            import core.train.libraries  # noqa: F401 - all of them now, not one by one as the run reaches them
        if not launches:
            from core.estimate.advice import oom_advice
            from core.train.recipe import run_training  # it imports the libraries: after the line above; a launcher never needs them
    if launches:
        return launcher.run_launcher(cfg, args.run_dir)  # accelerate launch: this machine's workers
    set_threads(threads)
    quiet_libraries(console=sys.stderr.isatty())
    from core.quiet import offline_if_unreachable

    offline_if_unreachable(cfg)
    stop = threading.Event()
    stop_on_signals(stop, args.run_dir)
    stop_when_orphaned(stop)
    errors: list[dict[str, Any]] = []
    try:
        # A progress bar only on a terminal: in a log file (the app's RUN/train.log, a pipe) it is kilobytes of \r.
        result = run_training(cfg, console_keeping(errors, lang), stop=stop, callbacks=callbacks, console=sys.stderr.isatty(),
                              run_dir=args.run_dir)
    except OSError as exc:  # e.g. an output folder that cannot be created: the user's to fix, not a bug report
        what = f"{exc.strerror}: {exc.filename}" if exc.filename and exc.strerror else str(exc)
        print(f"memtune: {t('cli.unwritable', lang, what=what)}", file=sys.stderr)
        return 1
    if result.status == "failed":
        # what would help, at cfg; else the failure in the terminal's language, by the key its record carries
        message = (said(oom_advice(cfg), lang) if result.error_type == "oom"
                   else record_words(result.summary or (errors[-1] if errors else {}), str(result.message), lang))
        if result.error_type == "other" and result.run_dir:
            message += " " + t("cli.details", lang, path=Path(result.run_dir) / "events.jsonl")
        kind = t(f"log.error_type.{result.error_type}", lang) if result.error_type else ""
        failed = (t("cli.failed_kind", lang, kind=kind, message=message) if kind
                  else t("cli.failed", lang, message=message))
        print(f"memtune: {failed}", file=sys.stderr)
        return 1
    s = result.summary
    tokens = s.get("train_tokens")
    tokens = formatted(tokens, ",", lang) if isinstance(tokens, int) else "-"
    runtime = s.get("train_runtime_s")
    runtime = formatted(runtime, ".1f", lang) if isinstance(runtime, (int, float)) else "-"
    counts = t("cli.tokens", lang, losses=loss_line(s, cfg, lang), tokens=tokens, seconds=runtime)
    print(f"{said(result.message, lang)}\n{counts}")
    if isinstance(s.get("heldout"), dict):  # did it help? the verdict, last words before the adapter's path
        print(words(s["heldout"]["verdict"], lang))
    print(result.adapter_dir)
    return 0


def loss_line(summary: dict, cfg: TrainerSlice, lang: str = "en") -> str:
    """"first loss 2.31, last loss 1.02", or why there is none (never "first loss None")."""
    first, last = summary.get("first_loss"), summary.get("final_loss")
    if first is not None and last is not None:  # "0.0141", not 0.014143562316894532
        return t("cli.losses", lang, first=formatted(first, ".4f", lang), last=formatted(last, ".4f", lang))
    steps = summary.get("steps")
    return t("cli.no_loss", lang, steps=steps if steps is not None else 0, every=cfg.logging_steps)


def run() -> None:
    """`python -m core.train`: main(), then end the process at once.

    Everything is written and closed by then. Skipping the interpreter's teardown (seconds, once torch is loaded)
    ends the process at once, so the app can take the next Start (and the GPU is free) as soon as "done" shows."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
