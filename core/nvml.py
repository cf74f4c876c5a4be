"""NVML (the `nvidia-ml-py` package, imported as `pynvml`), initialised once per process: how memtune reads NVIDIA
GPUs without CUDA, so the web server learns the machine's GPUs without importing torch.

`cards()` are the GPUs a CUDA process started in this environment would see, in its order: CUDA_VISIBLE_DEVICES
applied as CUDA parses it (`visible`, a pure function of what NVML read), with each card's name, memory and compute
capability. core.gpus.vram's snapshots and sampler use the same initialised module. Without an NVIDIA driver (a
laptop, CI) every answer is empty or None, never an exception. A leaf: it imports nothing of memtune, so
core.config.hardware can use it.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Sequence

_lock = threading.Lock()
_state: dict[str, Any] = {"tried": False, "ok": False, "error": ""}


def nvml():
    """The initialised pynvml module, or None (with the reason in _state['error']). Initialises once."""
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            try:
                import pynvml

                pynvml.nvmlInit()
                _state["ok"] = True
            except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
                _state["ok"] = False
                _state["error"] = f"{type(exc).__name__}: {exc}"
        if not _state["ok"]:
            return None
    import pynvml

    return pynvml


def error() -> str:
    """Why NVML could not be initialised ("" when it was, or was not tried yet)."""
    return _state["error"]


@dataclass(frozen=True)
class Card:
    """One GPU (or MIG instance) as NVML describes it."""

    uuid: str  # "GPU-..." (a MIG instance: "MIG-...")
    name: str
    total_bytes: int
    capability: tuple[int, int] = (0, 0)  # CUDA compute capability; (0, 0): not read

    @property
    def bf16(self) -> bool:
        """Native bfloat16 (Ampere, compute capability 8.0, and later)."""
        return self.capability >= (8, 0)


def _ordinal(text: str) -> int:
    """An entry of an ordinal list as CUDA reads it (strtoul: the leading digits, so "1gpu" is 1); -1 when none."""
    found = re.match(r"[+-]?\d+", text.strip())
    return int(found.group()) if found else -1


def visible(cards: Sequence[Card], cuda_visible: str | None, migs: Sequence[Card] = ()) -> list[Card]:
    """The cards a CUDA process sees, in its order, given NVML's `cards` (its index order), the MIG instances
    `migs`, and CUDA_VISIBLE_DEVICES' value (None: unset, every card). As CUDA (and torch's
    _parse_visible_devices) read it: ordinals, or UUIDs (or a unique prefix) starting with GPU- or MIG-; the list
    ends at the first entry that names no card (-1, an unknown ordinal or UUID), and a card named twice hides all.
    Ordinals are taken in NVML's order (the PCI bus's), which is CUDA's on a machine of one kind of GPU."""
    if cuda_visible is None:
        return list(cards)
    entries = cuda_visible.split(",")
    by_uuid = entries[0].strip().startswith(("GPU-", "MIG-"))
    pool = migs if entries[0].strip().startswith("MIG-") else cards
    out: list[Card] = []
    for entry in entries:
        entry = entry.strip()
        if by_uuid:
            found = [c for c in pool if entry and c.uuid.startswith(entry)]
            card = found[0] if len(found) == 1 else None
        else:
            n = _ordinal(entry)
            card = pool[n] if 0 <= n < len(pool) else None
        if card is None:
            break
        if card in out:
            return []
        out.append(card)
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _card(nv: Any, handle: Any, capability: tuple[int, int] | None = None) -> Card:
    if capability is None:
        try:
            capability = tuple(nv.nvmlDeviceGetCudaComputeCapability(handle))
        except Exception:  # an old driver: unknown
            capability = (0, 0)
    return Card(_text(nv.nvmlDeviceGetUUID(handle)), _text(nv.nvmlDeviceGetName(handle)),
                int(nv.nvmlDeviceGetMemoryInfo(handle).total), capability)


def _migs(nv: Any, handle: Any, capability: tuple[int, int]) -> list[Card]:
    """The MIG instances of a card in MIG mode ([] otherwise, or when they cannot be read)."""
    try:
        if nv.nvmlDeviceGetMigMode(handle)[0] != nv.NVML_DEVICE_MIG_ENABLE:
            return []
        out = []
        for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                out.append(_card(nv, nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i), capability))
            except Exception:  # an empty slot
                continue
        return out
    except Exception:  # a card without MIG
        return []


def physical() -> tuple[list[Card], list[Card]]:
    """(every card NVML sees, in its index order; their MIG instances); ([], []) without NVML. A card that cannot be
    read ends the list: CUDA's ordinals past it could not be matched to NVML's."""
    nv = nvml()
    if nv is None:
        return [], []
    cards: list[Card] = []
    migs: list[Card] = []
    try:
        for i in range(int(nv.nvmlDeviceGetCount())):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            cards.append(_card(nv, handle))
            migs += _migs(nv, handle, cards[-1].capability)
    except Exception:  # a lost card, or a driver that answers nothing
        pass
    return cards, migs


def cards() -> list[Card]:
    """The GPUs a CUDA process of this environment would see (CUDA_VISIBLE_DEVICES applied); [] without NVML."""
    found, migs = physical()
    return visible(found, os.environ.get("CUDA_VISIBLE_DEVICES"), migs)
