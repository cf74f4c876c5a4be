"""GPU memory as the driver and PyTorch see it: a snapshot per GPU, a background NVML peak sampler, torch peaks.

`PeakTracker` is memtune's one NVML sampler: the run (summary.json's nvml_peak_gib), the app and every benchmark
(bench/product.py, bench/multigpu.py, bench/app_gpu.py) read the card through this module, not pynvml directly.

No gradio here. NVML (the `nvidia-ml-py` package, imported as `pynvml`) is initialised once per process, under a
lock (core/nvml.py, which also says which GPUs a CUDA process of this environment sees); where there is no NVIDIA driver (a laptop, CI, this machine) every function answers "no NVIDIA GPU found"
instead of raising, so the UI can show that as a plain message.

Three numbers people confuse, and which one this module gives:
- NVML "used": everything on the card (CUDA context, PyTorch's cache, other processes). What the UI gauge shows
  and what decides an out-of-memory error. `snapshot()`, `PeakTracker`.
- torch reserved: what PyTorch's caching allocator holds (allocated + cached free blocks). `torch_peaks()`.
- torch allocated: live tensors only. `torch_peaks()`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from core.messages import Said
from core.nvml import error as nvml_error
from core.nvml import nvml as _nvml

GIB = 2**30
NO_GPU = Said("gpu.none")  # "no NVIDIA GPU found", keyed: the gauge says it in the page's language


def nvml_available() -> bool:
    return _nvml() is not None


# --- snapshot ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    used_bytes: int
    total_bytes: int

    @property
    def used_gib(self) -> float:
        return self.used_bytes / GIB

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    @property
    def label(self) -> str:
        """e.g. 'GPU 0 NVIDIA H200: 10.9 / 139.8 GiB (8%)'."""
        return f"GPU {self.index} {self.name}: {format_usage(self.used_bytes, self.total_bytes)}"


@dataclass(frozen=True)
class GpuSnapshot:
    gpus: list[GpuInfo] = field(default_factory=list)
    message: str = ""  # empty when GPUs were read; otherwise why not, keyed (a Said: "no NVIDIA GPU found")

    @property
    def ok(self) -> bool:
        return bool(self.gpus)


def snapshot() -> GpuSnapshot:
    """Every visible NVIDIA GPU's name and memory now. Never raises."""
    nv = _nvml()
    if nv is None:
        return GpuSnapshot([], NO_GPU)
    try:
        count = nv.nvmlDeviceGetCount()
    except Exception as exc:
        return GpuSnapshot([], Said("gpu.none_why", why=type(exc).__name__))
    gpus = []
    for i in range(count):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(GpuInfo(i, name, int(mem.used), int(mem.total)))
        except Exception:  # a GPU that cannot be read (lost, MIG without access) is left out
            continue
    return GpuSnapshot(gpus, "" if gpus else NO_GPU)


def _device_read(index: int, read):
    """`read(pynvml, handle)` for GPU `index`; None without NVML or when the GPU cannot be read."""
    nv = _nvml()
    if nv is None:
        return None
    try:
        return read(nv, nv.nvmlDeviceGetHandleByIndex(index))
    except Exception:
        return None


def device_used_bytes(index: int = 0) -> int | None:
    return _device_read(index, lambda nv, h: int(nv.nvmlDeviceGetMemoryInfo(h).used))


def device_utilization(index: int = 0) -> int | None:
    """GPU utilisation (%) over the driver's last sample period; None without NVML."""
    return _device_read(index, lambda nv, h: int(nv.nvmlDeviceGetUtilizationRates(h).gpu))


def process_used_bytes(pid: int, index: int = 0) -> int | None:
    """GPU memory NVML attributes to process `pid` (0 when it has no CUDA context); None without NVML."""
    return _device_read(index, lambda nv, h: sum(int(p.usedGpuMemory or 0)
                                                 for p in nv.nvmlDeviceGetComputeRunningProcesses(h) if p.pid == pid))


def driver_version() -> str | None:
    nv = _nvml()
    try:
        version = nv.nvmlSystemGetDriverVersion() if nv is not None else None
    except Exception:
        return None
    return version.decode() if isinstance(version, bytes) else version


def device_count() -> int:
    """GPUs NVML sees (0 without NVML)."""
    nv = _nvml()
    try:
        return int(nv.nvmlDeviceGetCount()) if nv is not None else 0
    except Exception:
        return 0


def unavailable_reason() -> str:
    """"" when NVML works; otherwise "no NVIDIA GPU found (why)" (a Said)."""
    if _nvml() is not None:
        return ""
    return Said("gpu.none_why", why=nvml_error()) if nvml_error() else NO_GPU


# --- formatting (the UI gauge) ----------------------------------------------------------------------------------
def format_usage(used_bytes: int | float, total_bytes: int | float) -> str:
    """'used / total GiB (pct)', e.g. '10.9 / 139.8 GiB (8%)'."""
    pct = 100.0 * used_bytes / total_bytes if total_bytes else 0.0
    return f"{used_bytes / GIB:.1f} / {total_bytes / GIB:.1f} GiB ({pct:.0f}%)"


def band(fraction: float) -> str:
    """Colour band of a gauge at `fraction` (0-1) full: green below 70%, amber below 90%, red from 90%."""
    if fraction < 0.70:
        return "green"
    if fraction < 0.90:
        return "amber"
    return "red"


# --- peaks ------------------------------------------------------------------------------------------------------
class PeakTracker:
    """Samples NVML 'used' memory of one GPU every `interval` seconds in a background thread and keeps the peak.

    NVML sees what PyTorch does not (CUDA context, paged optimizer state, other libraries), so this is the number
    to compare with the card's size. Sampling misses spikes shorter than `interval`; PyTorch's own peaks
    (`torch_peaks`) do not, so report both. `series=True` also keeps every sample as (time.time(), used bytes,
    utilisation %), the utilisation read every `util_every` samples (-1 where not read yet): the benchmarks' traces.
    Without NVML (no package, no driver) nothing is sampled: `available` is False, `peak_bytes` stays None and
    `message` says why ("no NVIDIA GPU found (...)").
    """

    def __init__(self, device: int = 0, interval: float = 0.2, series: bool = False, util_every: int = 0):
        self.device = device
        self.interval = interval
        self.keep_series, self.util_every = series, util_every
        self.peak_bytes: int | None = None
        self.samples = 0
        self.series: list[tuple[float, int, int]] = []
        self.available = False
        self.message = ""
        self._util = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> int | None:
        used = device_used_bytes(self.device)
        if used is not None:
            if self.keep_series:
                if self.util_every and self.samples % self.util_every == 0:
                    util = device_utilization(self.device)
                    self._util = -1 if util is None else util
                self.series.append((time.time(), used, self._util))
            self.samples += 1
            self.peak_bytes = used if self.peak_bytes is None else max(self.peak_bytes, used)
        return used

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> "PeakTracker":
        """Start sampling afresh (a tracker can be started again after stop(): peak and series restart)."""
        if self._thread is not None:
            return self
        self.message = unavailable_reason()
        self.available = not self.message
        if not self.available:
            return self
        self.peak_bytes, self.samples, self.series, self._util = None, 0, [], -1
        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="memtune-nvml-peak", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int | None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=max(1.0, 5 * self.interval))
            self._thread = None
            self.sample()  # one last reading at the end
        return self.peak_bytes

    @property
    def peak_gib(self) -> float | None:
        return None if self.peak_bytes is None else round(self.peak_bytes / GIB, 3)

    def __enter__(self) -> "PeakTracker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def torch_peaks(device: int | None = None) -> dict[str, float] | None:
    """PyTorch's CUDA memory now and at its peak, in GiB; None without CUDA.

    Keys: allocated_gib, reserved_gib, peak_allocated_gib, peak_reserved_gib.
    """
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dev = torch.cuda.current_device() if device is None else device
    return {
        "allocated_gib": round(torch.cuda.memory_allocated(dev) / GIB, 3),
        "reserved_gib": round(torch.cuda.memory_reserved(dev) / GIB, 3),
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated(dev) / GIB, 3),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved(dev) / GIB, 3),
    }


if __name__ == "__main__":
    snap = snapshot()
    print("\n".join(g.label for g in snap.gpus) if snap.ok else snap.message)
