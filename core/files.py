"""Small helpers shared by the modules that write model folders or free model memory."""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path


def move_into_place(tmp: Path, final: Path) -> Path:
    """Replace `final` with the fully written folder `tmp` by renames, so readers never see half a folder."""
    tmp, final = Path(tmp), Path(final)
    if final.exists():
        old = final.parent / f".{final.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    return final


def free_memory() -> None:
    """Collect dropped models and hand cached CUDA blocks back, so the next model can use the memory."""
    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
