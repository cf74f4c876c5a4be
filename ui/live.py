"""What the page polls every second: the GPUs' memory and the job manager's current job."""

from __future__ import annotations

from typing import Any


def read_gpus() -> tuple[list[dict[str, Any]], str]:
    """([{index, name, used_gib, total_gib}], message). An empty list and a plain message when there is no GPU."""
    from core import vram

    try:
        return _from_vram(vram)
    except Exception as exc:  # the gauge is informational: never break the page
        return [], f"GPU monitor unavailable ({type(exc).__name__}: {exc})"


def _from_vram(vram: Any) -> tuple[list[dict[str, Any]], str]:
    snap = vram.snapshot()
    gpus = [{"index": g.index, "name": g.name, "used_gib": g.used_gib, "total_gib": g.total_gib}
            for g in snap.gpus]
    return gpus, (getattr(snap, "message", "") or ("" if gpus else "No NVIDIA GPU found"))

