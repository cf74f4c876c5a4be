"""The libraries every run imports, in one go: the job manager's fork server imports them once for all its runs
(core/train/preload.py), a run in a new interpreter at its start (core/train/cli.py), both inside
core.files.long_lived, so that gc neither walks them again and again while they load nor in every later collection."""

import torch  # noqa: F401
import transformers  # noqa: F401
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401 - lazy attributes: import them now
from trl import SFTConfig, SFTTrainer  # noqa: F401

import core.train.recipe  # noqa: F401
from core.data import plan  # noqa: F401
from core.model import load  # noqa: F401

try:  # peft imports it where it is installed; import it here for certain (3 s: its torch.compile set-up)
    import bitsandbytes  # noqa: F401
except ImportError:  # pragma: no cover - memtune runs without 4-bit
    pass
