"""The process around one command-line run of the recipe (`python -m core.train`, whose `main` is in core/train.py):
what it prints on the console, quiet libraries, torch threads. Signals and a parent that died are the supervisor's
(core/supervise.py)."""

from __future__ import annotations

import os
import sys
from typing import Any


def console_sink(event: dict[str, Any]) -> None:
    """Phase messages and log lines on stderr; the Trainer's own progress bar shows steps, ETA and speed.

    Errors are not printed here: `main` prints the failure once, and the traceback stays in events.jsonl.
    """
    kind = event["kind"]
    if (kind == "phase" and event.get("phase") != "training") or kind == "log":
        print(f"[memtune] {event['message']}", file=sys.stderr, flush=True)


def quiet_libraries(console: bool) -> None:
    """A clean command line: memtune's own progress lines, not the libraries' noise.

    peft itself reads `is_gradient_checkpointing` (deprecated in transformers 5) on every run, so that FutureWarning
    says nothing about the user's settings; datasets' per-map progress bars are kilobytes of \r in a log file.
    """
    import warnings

    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    import logging

    # bitsandbytes on a CPU without its optional `kernels` package says so on every load; it falls back by itself.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    if not console:
        import datasets
        from transformers.utils import logging as hf_logging

        datasets.disable_progress_bars()
        hf_logging.disable_progress_bar()


def set_threads_from_env() -> None:
    """MEMTUNE_NUM_THREADS (the app sets it to cores - 1 for its child, leaving a core to the page); else all cores."""
    value = os.environ.get("MEMTUNE_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        import torch

        torch.set_num_threads(int(value))
