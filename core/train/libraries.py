"""The libraries every run imports, in one go: the job manager's fork server imports them once for all its runs
(core/train/preload.py), a run in a new interpreter at its start (core/train/cli.py), both inside
core.files.long_lived, so that gc neither walks them again and again while they load nor in every later collection."""

from core.quiet import silence_loggers

silence_loggers()  # bitsandbytes speaks while importing (core/quiet.py)

import torch  # noqa: E402,F401
import transformers  # noqa: E402,F401
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402,F401 - lazy attributes: import them now
from trl import SFTConfig, SFTTrainer  # noqa: E402,F401

import core.train.recipe  # noqa: E402,F401
from core.data import plan  # noqa: E402,F401
from core.model import load  # noqa: E402,F401

try:  # peft imports it where it is installed; import it here for certain (3 s: its torch.compile set-up)
    import bitsandbytes  # noqa: F401
except ImportError:  # pragma: no cover - memtune runs without 4-bit
    pass
