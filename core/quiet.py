"""A clean terminal: memtune's own lines, not the libraries' noise (training CLI, export, Try it, demo_bench, app).

Each silenced message says nothing about the user's settings:
- peft reads `is_gradient_checkpointing` (deprecated in transformers 5) on every model it wraps: a FutureWarning;
- bitsandbytes on a CPU with AVX512-BF16 tries to fetch a CPU kernel from the Hub's kernels-community at import (the
  `kernels` package, a dependency of transformers >= 5.25) and, offline or refused by kernels' publisher check, logs
  "Failed to load CPU gemm_4bit_forward ... Set trust_remote_code=True ...", then uses its own CPU kernel: the same
  4-bit results, and no remote code to turn on. `silence_loggers` runs before the libraries are imported;
- TRL 1.x warns that `use_liger_kernel` will go in v2 (memtune's fused-loss lever is that very setting), and liger
  logs an import error for each backend it does not find (on a CUDA machine, the others);
- TRL warns at each import of trl.experimental (ORPO lives there in TRL 1.x) that its APIs may change: TRL's own
  TRL_EXPERIMENTAL_SILENCE, set before that import;
- datasets' and transformers' progress bars (per map, per shard, per weight load): kilobytes of \\r in a log file.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

NOISY_LOGGERS = ("bitsandbytes.backends.cpu.ops", "liger_kernel", "liger_kernel.transformers")


def silence_loggers() -> None:
    """The loggers above at CRITICAL; before the libraries import, as some of them speak while importing."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def quiet_libraries(progress_bars: bool = False) -> None:
    """Silence the messages above; `progress_bars`: keep the libraries' bars (a user watching a terminal)."""
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*use_liger_kernel.*deprecated.*", category=FutureWarning)
    silence_loggers()
    if not progress_bars:
        import datasets
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as hf_logging

        datasets.disable_progress_bars()
        hf_logging.disable_progress_bar()
        disable_progress_bars()


def offline_if_unreachable(cfg, timeout_s: float = 3.0) -> bool:
    """A Hub model or dataset and no network: huggingface_hub retries each request with back-off (six "Retrying in
    Ns" lines over ~23 s) before memtune's one-line error. One quick connection first; when the Hub cannot be
    reached, this process works offline, so what is cached loads and what is not fails at once. True if so."""
    import socket
    from urllib.parse import urlparse

    from core.config.settings import DEMO_DATASET, DEMO_MODEL
    from core.data.read import is_local

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    if all(not x or x in (DEMO_MODEL, DEMO_DATASET) or is_local(x) for x in (cfg.model, cfg.dataset)):
        return False
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
        return False
    except OSError:
        pass
    print(f"[memtune] {host} cannot be reached from here: working offline (models and datasets already in the "
          "cache only)", file=sys.stderr, flush=True)
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True  # read at import; transformers asks huggingface_hub's constant
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True
    return True
