"""The host -> GPU link, measured once per machine and cached: what stream_layers' copies cost against compute.

`measure()` times (CUDA events) copies of COPY_BYTES from pinned host memory to the GPU and a bf16 matrix product on
it; `measured()` gives this machine's cached figures, measuring them first where there are none (the training child,
where torch and CUDA are loaded anyway); `cached()` reads them without torch (the web server, the estimate). A machine
without CUDA measures nothing: None. The cache is one JSON file under memtune's folder, keyed by the host's name (a
home folder shared by several machines keeps each one's figures).
"""

from __future__ import annotations

import json
import socket
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from core.config.settings import cache_root
from core.files import atomic_write_text

COPY_BYTES = 256 * 2**20  # one copy: about a 14B layer in NF4, large enough that the link, not latency, sets the rate
MATMUL_N = 4096  # a bf16 [N, N] @ [N, N] product: a decoder layer's matrix work at a long micro-batch
REPEATS = 5  # timed copies and products after one warm-up each; the median is kept


@dataclass(frozen=True)
class Link:
    """One machine's measured figures: host -> GPU bytes per second from pinned memory, and bf16 matrix-product
    flop per second (an upper bound of what the training step's kernels reach)."""

    h2d_bytes_per_s: float
    matmul_flops: float
    gpu: str = ""


def cache_file() -> Path:
    return cache_root() / "link.json"


def host() -> str:
    return socket.gethostname()


def cached(path: Path | None = None) -> Link | None:
    """This machine's figures from the cache (no torch), or None where none were measured or the file is unreadable."""
    try:
        entry = json.loads((path or cache_file()).read_text()).get(host())
        return Link(float(entry["h2d_bytes_per_s"]), float(entry["matmul_flops"]), str(entry.get("gpu", "")))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def remember(link: Link, path: Path | None = None) -> None:
    """Write `link` as this machine's figures, keeping other machines' entries."""
    path = path or cache_file()
    try:
        table = json.loads(path.read_text())
        table = table if isinstance(table, dict) else {}
    except (OSError, ValueError):
        table = {}
    table[host()] = asdict(link)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(table, indent=1, sort_keys=True))


def measure(device: int | None = None) -> Link | None:
    """Time the link and the GPU's matrix product on `device` (default: the current one); None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    device = torch.cuda.current_device() if device is None else device
    with torch.cuda.device(device):
        pinned = torch.empty(COPY_BYTES, dtype=torch.uint8).pin_memory()
        target = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
        copy_s = _timed(lambda: target.copy_(pinned, non_blocking=True))
        del pinned, target
        empty_host = getattr(torch._C, "_host_emptyCache", None)
        if empty_host is not None:  # torch caches freed pinned blocks: these 256 MiB go back to the system
            torch.cuda.synchronize(device)
            empty_host()
        a = torch.randn(MATMUL_N, MATMUL_N, dtype=torch.bfloat16, device=device)
        b = torch.randn(MATMUL_N, MATMUL_N, dtype=torch.bfloat16, device=device)
        matmul_s = _timed(lambda: a @ b)
        del a, b
        torch.cuda.empty_cache()
        name = torch.cuda.get_device_name(device)
    return Link(COPY_BYTES / copy_s, 2 * MATMUL_N**3 / matmul_s, name)


def _timed(work) -> float:
    """Median seconds of `work` on the current stream, by CUDA events, after one warm-up."""
    import torch

    work()
    seconds = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1000.0)
    return statistics.median(seconds)


def measured() -> Link | None:
    """This machine's figures: cached, else measured now and cached (CUDA only); None without CUDA."""
    found = cached()
    if found is not None:
        return found
    link = measure()
    if link is not None:
        remember(link)
    return link
