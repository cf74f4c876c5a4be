"""What the page polls every second: the GPUs' memory and the job manager's current job."""

from __future__ import annotations

from typing import Any


def read_gpus() -> tuple[list[dict[str, Any]], str]:
    """([{index, name, used_gib, total_gib}], message). An empty list and a plain message when there is no GPU."""
    try:
        from core import vram
    except ImportError:
        vram = None
    if vram is not None:
        try:
            return _from_vram(vram)
        except Exception as exc:  # the gauge is informational: never break the page
            return [], f"GPU monitor unavailable ({type(exc).__name__}: {exc})"
    return _from_pynvml()


def _from_vram(vram: Any) -> tuple[list[dict[str, Any]], str]:
    snap = vram.snapshot()
    gpus = [{"index": g.index, "name": g.name, "used_gib": g.used_gib, "total_gib": g.total_gib}
            for g in snap.gpus]
    return gpus, (getattr(snap, "message", "") or ("" if gpus else "No NVIDIA GPU found"))


def _from_pynvml() -> tuple[list[dict[str, Any]], str]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return [], "No NVIDIA GPU found"
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        name = pynvml.nvmlDeviceGetName(h)
        out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                    "used_gib": mem.used / 2**30, "total_gib": mem.total / 2**30})
    return out, ""
