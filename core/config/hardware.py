"""What this machine offers a run, as validation asks it: CUDA GPUs, bf16, bitsandbytes, liger-kernel, and a folder
runs can be written to. Split from core/config/settings.py (which uses Hardware and output_problem) to keep that file
to the schema."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from core.messages import Said


@dataclass(frozen=True)
class Hardware:
    """What the machine can do, as far as validation cares. `detect()` reads it; tests build it by hand."""

    cuda: bool
    bf16: bool
    bitsandbytes: bool
    bnb_4bit_on_cpu: bool = True  # bitsandbytes >= 0.45 runs NF4 on the CPU
    liger: bool = False
    gpus: int = 0  # visible CUDA devices; 0 with cuda=True means "one, count not read" (tests build it by hand)
    unified_memory: bool = False  # the GPU's memory is the host's (an integrated GPU: Jetson, GB10)

    @property
    def n_gpus(self) -> int:
        return self.gpus or (1 if self.cuda else 0)

    @classmethod
    def detect(cls) -> "Hardware":
        """This machine, read without importing torch (the web server never does): the GPUs from NVML
        (core.nvml.cards); where torch is loaded already (the training child), torch's own answer."""
        import importlib.util

        gpus, bf16 = torch_gpus() if "torch" in sys.modules else nvml_gpus()
        return cls(
            cuda=gpus > 0,
            bf16=bf16 if gpus else True,  # CPUs emulate bf16 via autocast
            bitsandbytes=importlib.util.find_spec("bitsandbytes") is not None,
            liger=importlib.util.find_spec("liger_kernel") is not None,
            gpus=gpus,
            unified_memory=bool(gpus) and "torch" in sys.modules and torch_unified(),
        )


def nvml_gpus() -> tuple[int, bool]:
    """(GPUs a CUDA process here would see, whether the first computes bfloat16 natively), from NVML."""
    from core.nvml import cards

    found = [] if no_gpu_driver() else cards()
    return len(found), bool(found) and found[0].bf16


def torch_gpus() -> tuple[int, bool]:
    """The same, as torch sees it (torch's current device is the first)."""
    import torch

    try:
        if not torch.cuda.is_available():
            return 0, False
        return torch.cuda.device_count(), torch.cuda.is_bf16_supported(including_emulation=False)
    except Exception:  # noqa: BLE001 - a broken driver counts as no GPU; validation then says so
        return 0, False


def torch_unified() -> bool:
    """Whether torch's first GPU shares the host's memory (an integrated GPU: CUDA's `integrated` property). NVML
    does not say so, so the web server assumes not; the training child, which has torch, knows."""
    import torch

    try:
        return bool(torch.cuda.get_device_properties(0).is_integrated)
    except Exception:  # noqa: BLE001 - no CUDA, or a property this torch lacks: a discrete GPU
        return False


def no_gpu_driver() -> bool:
    """True when this machine surely has no GPU torch could use: Linux without the NVIDIA driver (/proc/driver/nvidia,
    /dev/nvidia*), ROCm (/dev/kfd) or WSL's GPU bridge (/dev/dxg), or a Mac (no CUDA). Elsewhere, ask NVML or torch."""
    if "torch" in sys.modules:  # already paid for: torch's own answer is the authority
        return False
    if sys.platform == "darwin":
        return True
    if sys.platform.startswith("linux"):
        dev = Path("/dev")
        return not (Path("/proc/driver/nvidia").exists() or (dev / "kfd").exists() or (dev / "dxg").exists()
                    or any(dev.glob("nvidia*")))
    return False


def output_problem(folder: str) -> str | None:
    """Why runs cannot be written under `folder` (checked without creating anything), or None."""
    from core.files import real

    path = real(folder)
    if path.exists() and not path.is_dir():
        return Said("output.is_file", path=path)
    if path.parts[:2] in (("/", "proc"), ("/", "sys"), ("/", "dev")):
        return Said("output.system", path=path, folder="/".join(path.parts[:2])[1:])
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return Said("output.parent_file", path=path, existing=existing)
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return Said("output.read_only", path=path)
    if not os.access(existing, os.W_OK | os.X_OK):
        return Said("output.no_permission", path=path, existing=existing)
    return None


def available_ram() -> int | None:
    """Bytes of memory this machine can give a new process without swapping (Linux's MemAvailable), or None where
    it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no psutil, or a platform it cannot read
        return None
