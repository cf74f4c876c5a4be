"""The Hugging Face token, from the environment only: never logged, never written to a config or run folder. A module
of its own, without torch: the web server names whether one is set (Export's push), and the loader passes it on."""

from __future__ import annotations

import os


def hf_token() -> str | None:
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None
