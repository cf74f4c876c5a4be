"""What the benchmark measures: NVML peak (sampled in a thread), step times and trained tokens, one-step
profiles, and a breakdown of where the GPU memory goes."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import torch
from transformers import TrainerCallback

GIB = 2**30


# --- NVML -------------------------------------------------------------------------------------------------------
class NvmlPeak:
    """Samples the device's used memory (what nvidia-smi shows) every `interval` seconds in a thread."""

    def __init__(self, index: int = 0, interval: float = 0.005):
        self.interval, self.peak, self.floor = interval, 0, None
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001 - no driver (CPU dry run)
            self._nv = None

    def used(self) -> int:
        return int(self._nv.nvmlDeviceGetMemoryInfo(self._handle).used) if self._nv else 0

    def start(self) -> "NvmlPeak":
        self.floor = self.peak = self.used()
        self._stop.clear()
        if self._nv:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.used())
            time.sleep(self.interval)

    def stop(self) -> int:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.peak = max(self.peak, self.used())
        return self.peak


# --- tokens and step times ----------------------------------------------------------------------------------------
class TokenCounter:
    """Counts non-padding input tokens of every forward of the decoder stack, on the GPU (no sync per call)."""

    def __init__(self, decoder: torch.nn.Module, device):
        self.total = torch.zeros((), dtype=torch.int64, device=device)
        self.largest = torch.zeros((), dtype=torch.int64, device=device)  # tokens of the largest micro-batch
        self.handle = decoder.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        # The decoder stack runs once per micro-step: checkpointing recomputes layers, never the stack itself.
        mask = kwargs.get("attention_mask")
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        n = mask.sum() if (mask is not None and mask.dim() == 2) else torch.tensor(
            ids.shape[0] * ids.shape[1], device=self.total.device)
        n = n.to(self.total.device)
        self.total += n
        torch.maximum(self.largest, n, out=self.largest)

    def remove(self):
        self.handle.remove()


class StepMeter(TrainerCallback):
    """Wall time, tokens and loss of every optimizer step (synchronised at the step's end). At the start of
    training it records the peaks of the set-up phase (loading, preparation, trainer construction) and resets
    them, so the training phase's own peaks can be told apart."""

    def __init__(self, counter: TokenCounter, cuda: bool, nvml: "NvmlPeak | None" = None):
        self.counter, self.cuda, self.nvml = counter, cuda, nvml
        self.steps: list[dict] = []
        self.losses: dict[int, float] = {}
        self.logs: list[dict] = []
        self.setup_peaks: dict = {}
        self._t0 = None
        self._tok0 = 0

    def on_train_begin(self, args, state, control, **kw):
        if self.cuda:
            torch.cuda.synchronize()
            self.setup_peaks = {"allocated": torch.cuda.max_memory_allocated(),
                                "reserved": torch.cuda.max_memory_reserved(),
                                "nvml": self.nvml.peak if self.nvml else None,
                                "allocated_at_train_start": torch.cuda.memory_allocated()}
            torch.cuda.reset_peak_memory_stats()
            if self.nvml:
                self.nvml.peak = self.nvml.used()

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def on_step_begin(self, args, state, control, **kw):
        self._sync()
        self._t0 = time.perf_counter()
        self._tok0 = int(self.counter.total.item())

    def on_step_end(self, args, state, control, **kw):
        self._sync()
        dt = time.perf_counter() - self._t0
        tokens = int(self.counter.total.item()) - self._tok0
        self.steps.append({"step": state.global_step, "seconds": dt, "tokens": tokens,
                           "peak_allocated": torch.cuda.max_memory_allocated() if self.cuda else 0})

    def on_log(self, args, state, control, logs=None, **kw):
        logs = dict(logs or {})
        self.logs.append({"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})
        if "loss" in logs:
            self.losses[state.global_step] = float(logs["loss"])

    def steady(self, skip: int = 1) -> dict:
        """Tokens/s and s/step over the steps after the first `skip` (warm-up: kernel loading, Triton compiles)."""
        rows = self.steps[skip:] if len(self.steps) > skip else self.steps
        seconds = sum(r["seconds"] for r in rows)
        tokens = sum(r["tokens"] for r in rows)
        return {"steps": len(rows), "seconds": seconds, "tokens": tokens,
                "tokens_per_s": tokens / seconds if seconds else None,
                "s_per_step": seconds / len(rows) if rows else None}


# --- profile ------------------------------------------------------------------------------------------------------
class ProfileStep(TrainerCallback):
    """torch.profiler over the first `micro_steps` micro-steps of optimizer step `at_step` (1-based)."""

    def __init__(self, at_step: int, micro_steps: int = 2, cuda: bool = True):
        self.at_step, self.micro_steps, self.cuda = at_step, micro_steps, cuda
        self.prof = None
        self.done = 0
        self.wall = None
        self.summary: dict = {}

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step + 1 != self.at_step or self.prof is not None:
            return
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        if self.cuda:
            torch.cuda.synchronize()
        self.prof = profile(activities=acts, record_shapes=False, with_stack=False)
        self.prof.__enter__()
        self.t0 = time.perf_counter()
        self.done = 0

    def _micro_done(self):
        if self.prof is None or self.summary or self.wall is not None:
            return
        self.done += 1
        if self.done >= self.micro_steps:
            if self.cuda:
                torch.cuda.synchronize()
            self.wall = time.perf_counter() - self.t0
            self.prof.__exit__(None, None, None)
            self.summary = summarize(self.prof, self.wall, self.done)

    def on_substep_end(self, args, state, control, **kw):
        self._micro_done()

    def on_step_end(self, args, state, control, **kw):
        if self.prof is not None and self.wall is None:
            self.done = self.micro_steps - 1
            self._micro_done()


def summarize(prof, wall: float, micro_steps: int) -> dict:
    """Totals and the top operators by GPU and by CPU time of a profile."""
    events = prof.key_averages()

    def dev_self(e):
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0

    kernels = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
    gpu_us = sum(e.time_range.elapsed_us() for e in kernels)
    cpu_top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
    gpu_top = sorted(events, key=dev_self, reverse=True)[:15]
    by_kind: dict[str, float] = defaultdict(float)
    for e in kernels:
        by_kind[kernel_kind(e.name)] += e.time_range.elapsed_us()
    calls = {name: sum(e.count for e in events if e.key == name)
             for name in ("aten::to", "aten::_to_copy", "aten::item", "aten::_local_scalar_dense",
                          "cudaLaunchKernel", "cudaStreamSynchronize", "cudaDeviceSynchronize")}
    return {
        "micro_steps": micro_steps,
        "wall_s": wall,
        "cpu_self_s": sum(e.self_cpu_time_total for e in events) / 1e6,
        "gpu_kernel_s": gpu_us / 1e6,
        "gpu_busy_fraction": (gpu_us / 1e6) / wall if wall else None,
        "kernel_launches": len(kernels),
        "calls": calls,
        "gpu_by_kind_s": {k: round(v / 1e6, 4) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_gpu": [(e.key[:80], round(dev_self(e) / 1e3, 2), e.count) for e in gpu_top],
        "top_cpu": [(e.key[:80], round(e.self_cpu_time_total / 1e3, 2), e.count) for e in cpu_top],
    }


def kernel_kind(name: str) -> str:
    n = name.lower()
    if "dequant" in n or "kdequantize" in n or "kquantize" in n:
        return "nf4 dequantize"
    if "gemm" in n or "gemv" in n or "cutlass" in n or "sm90_xmma" in n or "nvjet" in n or "matmul" in n:
        return "matmul"
    if "flash" in n or "fmha" in n or "attention" in n or "efficient_attention" in n:
        return "attention"
    if "_forward_kernel" in n or "_backward_kernel" in n or "logprob" in n:
        return "lm-head log-prob (TRL)"
    if "memcpy" in n or "memset" in n or "copy" in n:
        return "copies"
    if "optimizer" in n or "adam" in n:
        return "optimizer"
    return "elementwise/other"


# --- memory breakdown ---------------------------------------------------------------------------------------------
def tensor_bytes(t) -> int:
    return t.numel() * t.element_size() if t is not None else 0


def quant_state_bytes(qs) -> int:
    if qs is None:
        return 0
    total = tensor_bytes(getattr(qs, "absmax", None)) + tensor_bytes(getattr(qs, "code", None))
    nested = getattr(qs, "state2", None)
    if nested is not None:
        total += tensor_bytes(getattr(nested, "absmax", None)) + tensor_bytes(getattr(nested, "code", None))
    return total


def static_breakdown(model, optimizer=None) -> dict:
    """Bytes on the GPU by kind: 4-bit weights (+ quant constants), other frozen weights by dtype, LoRA weights,
    their gradients, optimizer state. Parameters in CPU memory are listed apart."""
    out: dict[str, int] = defaultdict(int)
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        where = "gpu" if p.device.type == "cuda" else "cpu"
        if type(p).__name__ == "Params4bit":
            out[f"{where}: 4-bit weights"] += tensor_bytes(p)
            out[f"{where}: 4-bit quant constants"] += quant_state_bytes(getattr(p, "quant_state", None))
        elif p.requires_grad:
            out[f"{where}: LoRA weights ({str(p.dtype).replace('torch.', '')})"] += tensor_bytes(p)
            if p.grad is not None:
                out[f"{where}: LoRA gradients"] += tensor_bytes(p.grad)
        else:
            kind = "embed/head" if ("embed" in name or "lm_head" in name) else "norms/biases"
            out[f"{where}: frozen {kind} ({str(p.dtype).replace('torch.', '')})"] += tensor_bytes(p)
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    cpu_emb = getattr(emb, "cpu_embedding", None)
    if cpu_emb is not None:
        out["cpu: input embedding (offloaded)"] += tensor_bytes(cpu_emb.weight)
    if optimizer is not None:
        for state in getattr(optimizer, "state", {}).values():
            for v in state.values():
                if torch.is_tensor(v):
                    where = "gpu" if v.device.type == "cuda" else "cpu"
                    paged = getattr(v, "is_paged", False)
                    out[f"{where}: optimizer state{' (paged)' if paged else ''}"] += tensor_bytes(v)
    return {k: round(v / GIB, 4) for k, v in sorted(out.items())}
