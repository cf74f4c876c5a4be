"""Per-GPU memory of a run over several processes (one per GPU; core/gpus/distributed.py launches them): DDP and FSDP.

core.estimate.predict works out one process on one GPU (core/estimate/terms.py), then `apply` turns it into what each GPU
of the run holds. The settings are memtune's own (core/gpus/distributed.py's accelerate flags, core/config/arguments.py):

ddp   Every GPU holds the whole model, LoRA weights, grads and optimizer state, and sees its own micro-batches (the
      same activations as one GPU). On top: DDP's gradient buckets (torch's Reducer copies the trainable grads
      into flat buckets of 25 MB: one more copy of the LoRA grads), the parameter broadcast of DDP's construction
      (every parameter, frozen ones too, goes from rank 0 in flat 250 MiB buckets, two in flight; the caching
      allocator keeps those blocks) and NCCL's communicator buffers, outside PyTorch's allocator (NVML only).
fsdp  FSDP-QLoRA, FSDP1 through accelerate: FULL_SHARD, no offload, use_orig_params false, peft's wrap policy
      (each decoder layer one unit, each LoRA matrix a unit of its own), BACKWARD_PRE prefetch, at most two
      all-gathers in flight. Per GPU: 1/N of every flat parameter (the 4-bit weights are stored in the compute
      dtype so they flatten with the rest: the bytes are the same); bitsandbytes' quantization constants are no
      parameter, so every GPU keeps all of them; the LoRA units are upcast to fp32 by accelerate (mixed precision
      on FSDP) and sharded with their grads and optimizer state. While a layer computes (forward, or its
      recomputation and backward) its full weights are gathered: that one and the prefetched next. The root unit
      (embeddings, head, final norm: what no wrapped layer owns) is gathered at the start of forward and FSDP
      does not free the root's until backward ends. Activations per GPU are a one-GPU run's at the same
      micro-batch. Loading: a 4-bit model given no device_map lands whole on each process's GPU
      (transformers' bitsandbytes quantizer picks the current GPU; cpu_ram_efficient_loading spares only
      unquantized models), and FSDP then flattens each unit there (one unit twice for a moment) before sharding:
      the freed memory stays in PyTorch's cache.

Calibration (bench/RESULTS.md, section "Data-parallel (DDP)": 2x H200, Llama-3.1-8B shape; tests/test_estimate.py):
NVML per GPU grew by 0.68 GiB on `fastest` (+0.02 GiB allocated) and 1.66 GiB on `lowest_memory` (+0.57 allocated)
over one GPU. NCCL_BUFFERS + the kept broadcast blocks (1.09 GiB) sit between the two; what makes lowest_memory's
growth larger was not profiled (it is within 10% either way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from core.config.slices import Loading, LoraSlice, ModelSlice, PlaceSlice, TrainerSlice
from core.estimate.terms import (CUBLAS_WORKSPACE, GIB, Terms, expert_lora_matrices, optimizer_bytes,
                                  other_weight_bytes)
from core.model.shapes import ModelShape

NCCL_BUFFERS = int(0.6 * GIB)  # NCCL communicator + its kernels, per process, outside torch's allocator (NVML only)
BROADCAST_BUCKET = 250 * 2**20  # torch's _sync_module_states: parameters broadcast from rank 0 in flat buckets
BROADCAST_IN_FLIGHT = 2  # c10d broadcast_coalesced keeps at most two buckets in flight
AUTO_FIT_SHARE = 0.95  # `auto` picks ddp when one GPU's estimate is within this share of the smallest GPU (launcher)


class _Placed(ModelSlice, PlaceSlice, Protocol):
    """The processes and machines a run asks for, and the device the launcher plans them on."""


class _Sharded(ModelSlice, LoraSlice, TrainerSlice, Protocol):
    """What each GPU holds of the weights, the adapter and its optimizer state."""


@dataclass(frozen=True)
class Layout:
    world_size: int
    strategy: str  # single | ddp | fsdp
    reason: str


def machine_gpus() -> tuple[int, int | None]:
    """(visible GPUs, the smallest one's memory in bytes or None), from NVML: no CUDA initialised."""
    from core.gpus.distributed import nvml_gpu_count
    from core.gpus.vram import snapshot

    gpus = snapshot().gpus
    return nvml_gpu_count(), (min(g.total_bytes for g in gpus) if gpus else None)


def layout(cfg: _Placed, single_nvml: Callable[[], int], n_gpus: int | None = None,
           gpu_bytes: int | None = None) -> Layout:
    """How many processes `cfg` runs and with which strategy, resolved as core.gpus.distributed.plan() does for the
    launcher (`auto`: ddp when one GPU's estimate fits the smallest GPU, fsdp otherwise; ddp where that is unknown).
    `n_gpus` / `gpu_bytes` stand for this machine's GPU count and smallest GPU (default: NVML's)."""
    from core.gpus.distributed import plan

    wants_gpus = str(cfg.num_gpus).strip().lower() == "all" and n_gpus is None
    multi = str(cfg.num_gpus).strip() != "1" or cfg.num_machines > 1
    wants_memory = multi and cfg.distributed_strategy == "auto" and gpu_bytes is None
    if wants_gpus or wants_memory:
        found_gpus, found_bytes = machine_gpus()
        n_gpus = found_gpus if n_gpus is None else n_gpus
        gpu_bytes = found_bytes if gpu_bytes is None else gpu_bytes
    fits = None
    if multi and cfg.distributed_strategy == "auto" and gpu_bytes:
        fits = single_nvml() <= AUTO_FIT_SHARE * gpu_bytes
    p = plan(cfg.replace(device="cuda"), n_gpus=n_gpus or 0, fits_one_gpu=fits)
    return Layout(p.world_size, p.strategy, p.reason)


def _ddp(t: Terms, cfg: Loading, shape: ModelShape) -> None:
    grads = (2 if cfg.load_in_4bit else 4) * (shape.lora_params(cfg.lora_r, cfg.lora_target_modules)
                                              + sum(expert_lora_matrices(shape, cfg)))
    t.buckets = grads
    t.kept = min(BROADCAST_IN_FLIGHT * BROADCAST_BUCKET, t.quantized + t.unquantized)
    t.comm = NCCL_BUFFERS
    # DDP's construction: the model (and the LoRA params) on the GPU, plus the broadcast's buckets in flight
    t.load_alloc = max(t.load_alloc, t.quantized + t.unquantized + t.lora // 2 + t.kept + CUBLAS_WORKSPACE)
    t.notes.append(f"DDP adds per GPU: gradient buckets {grads / 2**20:.0f} MiB, the parameter broadcast's buffers "
                   f"{t.kept / GIB:.2f} GiB, NCCL buffers {NCCL_BUFFERS / GIB:.2f} GiB")


def _fsdp(t: Terms, cfg: _Sharded, shape: ModelShape, world: int) -> None:
    h, layers = shape.hidden_size, shape.num_hidden_layers
    other = other_weight_bytes(cfg) if cfg.load_in_4bit else (4 if cfg.precision == "fp32" else 2)
    if cfg.load_in_4bit:  # the packed 4-bit data is the flat parameter; the quantization constants are not
        layer_linear = sum((a * b + 1) // 2 for a, b in shape.module_dims().values())
        t.quantized = -(-layers * layer_linear // world) + t.quantized - layers * layer_linear
    else:  # a 16-bit model: its linears are among the unquantized weights
        layer_linear = other * shape.linear_params_per_layer
    # FSDP shards the embedding itself (validation refuses offload_embeddings with fsdp)
    t.unquantized, t.offloaded = -(-(t.unquantized + t.offloaded) // world), 0
    root = other * (shape.embed_params + shape.head_params + h)
    layer = layer_linear + other * (shape.small_params - h) // layers  # + one layer's norms and biases
    t.gathered = root + min(2, layers) * layer
    # LoRA: each matrix its own flat parameter, upcast to fp32 by accelerate, sharded with its grad and state
    n_lora = shape.lora_params(cfg.lora_r, cfg.lora_target_modules) + sum(expert_lora_matrices(shape, cfg))
    t.lora = 2 * 4 * -(-n_lora // world)
    t.optimizer, t.paged = optimizer_bytes(cfg, shape, 4, shards=world)
    t.kept = min(BROADCAST_IN_FLIGHT * BROADCAST_BUCKET, layer + root)  # sync_module_states' broadcast
    t.comm = t.load_comm = NCCL_BUFFERS
    if cfg.load_in_4bit:  # the whole 4-bit model on each GPU, then one unit flattened twice at once
        t.load_alloc += max(root, layer)
        t.load_reserved += max(root, layer)
        t.notes.append(f"while loading, each GPU holds the whole 4-bit model (transformers puts a quantized model "
                       f"on the current GPU) before FSDP shards it: {t.load_alloc / GIB:.1f} GiB allocated")
    else:  # rank 0 reads to CPU memory, the others start empty; each unit is flattened on the GPU, then sharded
        t.load_alloc = t.load_reserved = t.quantized + t.unquantized + 2 * max(root, layer) + t.kept
    t.notes.append(f"FSDP over {world} GPUs: 1/{world} of the weights per GPU, plus the full weights being "
                   f"computed: the root (embeddings + head, {root / GIB:.2f} GiB, gathered for the whole step) "
                   f"and two layers ({2 * layer / GIB:.2f} GiB)")


def apply(t: Terms, cfg: _Sharded, shape: ModelShape, lay: Layout) -> None:
    """Turn one process's terms (alone on one GPU) into what each GPU of `lay` holds (nothing for one process)."""
    if lay.strategy == "ddp":
        _ddp(t, cfg, shape)
    elif lay.strategy == "fsdp":
        _fsdp(t, cfg, shape, lay.world_size)
