"""A torch.profiler window over a few steady optimizer steps of a product run, summed up small.

`torch_profile_callback(out, first, last)` is a TrainerCallback (bench/stepprof.py passes it to the CLI) that starts
torch.profiler at the beginning of optimizer step `first` and stops it at the end of step `last`. It writes
`out` (JSON: the summary below) and `out.with_suffix(".txt")` (key_averages tables); the full trace is read once
and deleted (tens of MB).

Summary, over the window's wall time (from the first step's begin to the last step's end):
- gpu_busy_pct: the union of all kernel and memcpy intervals on the GPU over the wall time;
- kernels_per_step, by family (matrix products, bitsandbytes dequantization, Triton, elementwise/other);
- host syncs: CUDA runtime calls that block the CPU until the GPU catches up (stream/device/event synchronize,
  synchronous memcpy), their count per step and the CPU time spent in them;
- matrix-product gaps: for each pair of consecutive matrix-product kernels, the time from the end of one to the
  start of the next and how many other kernels ran in between; "idle" is the part of those gaps with no kernel at
  all (launch-bound time), "busy" the part spent in other kernels (norms, activations, dequantization...).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

GEMM = re.compile(r"gemm|nvjet|xmma|cutlass|wgmma|matmul|gemv", re.I)
DEQUANT = re.compile(r"dequant|kQuantize|kDequant|kgemm_4bit|optimizer", re.I)
TRITON = re.compile(r"^triton_|_kernel$|liger", re.I)
# Runtime calls that block the host until the GPU catches up (a plain cudaMemcpy is synchronous)
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def family(name: str) -> str:
    if GEMM.search(name):
        return "matmul"
    if DEQUANT.search(name):
        return "bitsandbytes"
    if TRITON.search(name):
        return "triton"
    return "other"


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def summarize_trace(trace: dict, steps: int, wall_s: float) -> dict:
    """The summary of a chrome trace (torch.profiler's export) over `steps` steps that took `wall_s`."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    kernels = [e for e in gpu if e.get("cat") == "kernel"]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    busy = union_us([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    fam: dict[str, list[float]] = {}
    for k in kernels:
        fam.setdefault(family(k["name"]), []).append(k["dur"])
    syncs = [e for e in runtime if e["name"] in SYNCS]
    sync_count: dict[str, int] = {}
    for e in syncs:
        sync_count[e["name"]] = sync_count.get(e["name"], 0) + 1
    # gaps between consecutive matrix products
    gaps, idle, between = [], [], []
    mm_idx = [i for i, k in enumerate(kernels) if family(k["name"]) == "matmul"]
    for a, b in zip(mm_idx, mm_idx[1:]):
        end_a, start_b = kernels[a]["ts"] + kernels[a]["dur"], kernels[b]["ts"]
        gap = max(0.0, start_b - end_a)
        inside = [(max(end_a, k["ts"]), min(start_b, k["ts"] + k["dur"])) for k in kernels[a + 1:b]]
        covered = union_us([iv for iv in inside if iv[1] > iv[0]])
        gaps.append(gap)
        idle.append(max(0.0, gap - covered))
        between.append(b - a - 1)
    wall_us = wall_s * 1e6
    per = max(steps, 1)
    out = {
        "steps": steps, "wall_s": round(wall_s, 4), "step_s": round(wall_s / per, 4),
        "gpu_busy_pct": round(100 * busy / wall_us, 1) if wall_us else None,
        "kernels_per_step": round(len(kernels) / per),
        "kernel_ms_per_step": {f: {"count": round(len(d) / per), "ms": round(sum(d) / 1e3 / per, 2)}
                               for f, d in sorted(fam.items())},
        "host_syncs_per_step": {k: round(v / per, 1) for k, v in sorted(sync_count.items())},
        "host_sync_ms_per_step": round(sum(e["dur"] for e in syncs) / 1e3 / per, 2),
        "cuda_launches_per_step": round(sum(1 for e in runtime if "Launch" in e["name"]) / per),
    }
    if gaps:
        out["matmul_gaps"] = {
            "count_per_step": round(len(gaps) / per),
            "median_us": round(statistics.median(gaps), 1),
            "p90_us": round(sorted(gaps)[int(0.9 * (len(gaps) - 1))], 1),
            "total_ms_per_step": round(sum(gaps) / 1e3 / per, 2),
            "idle_ms_per_step": round(sum(idle) / 1e3 / per, 2),
            "median_kernels_between": statistics.median(between),
        }
    return out


def torch_profile_callback(out: Path, first: int, last: int):
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    class TorchProfile(TrainerCallback):
        prof = None
        t0 = 0.0

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step + 1 == first:
                if cuda:
                    torch.cuda.synchronize()
                self.prof = profile(activities=acts, record_shapes=False, with_stack=False)
                self.prof.__enter__()
                self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if self.prof is None or state.global_step != last:
                return
            if cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - self.t0
            self.prof.__exit__(None, None, None)
            prof, self.prof = self.prof, None
            trace_path = out.with_suffix(".trace.json")
            prof.export_chrome_trace(str(trace_path))
            summary = summarize_trace(json.loads(trace_path.read_text()), last - first + 1, wall)
            trace_path.unlink()
            summary["window"] = f"steps {first}-{last}"
            out.write_text(json.dumps(summary, indent=1), encoding="utf-8")
            ka = prof.key_averages()
            sort = "cuda_time_total" if cuda else "cpu_time_total"
            text = f"# {out.stem}: steps {first}-{last}, {wall:.3f} s\n## by {sort}\n"
            text += ka.table(sort_by=sort, row_limit=25, max_name_column_width=60) + "\n"
            text += "## by self CPU time\n" + ka.table(sort_by="self_cpu_time_total", row_limit=15,
                                                         max_name_column_width=60) + "\n"
            out.with_suffix(".txt").write_text(text, encoding="utf-8")

    return TorchProfile()
