"""Shared test set-up: everything offline, the demo model cached once per session in a temporary folder."""

import os
import tempfile
from pathlib import Path

import pytest

# Set before any test imports transformers/datasets/huggingface_hub: no test may reach the network.
_HOME = Path(tempfile.mkdtemp(prefix="memtune-test-home-"))
os.environ.setdefault("MEMTUNE_HOME", str(_HOME))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HOME"] = str(_HOME / "hf")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"


@pytest.fixture(scope="session")
def demo_model_path() -> Path:
    from core.demo import ensure_demo_model

    return ensure_demo_model()


@pytest.fixture(scope="session")
def demo_tokenizer(demo_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model_path)
