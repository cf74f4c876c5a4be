"""Named sets of TrainConfig overrides: the chapter's recipe, memtune's lowest-memory and fastest settings.

A preset touches only the memory/speed levers and the batch shape; model, data, learning rate, epochs and
max_length stay the user's. Each lever was measured on an H200 with a Llama-3.1-8B-shaped model (bench/RESULTS.md,
`python -m bench.product`): what each one saves and costs is written next to it.

With packing on, a micro-batch is `per_device_train_batch_size` packs of rows, each pack holding up to
`max_length` tokens (rows are never split; longer rows are truncated as without packing). On dolly-like data a
512-token pack holds ~3 rows, so 6 packs per optimizer step see about as many tokens as the chapter's 16 rows.
"""

from __future__ import annotations

from typing import Any, TypeVar

from core.config.levers import chapter_values, cuda_only
from core.config.settings import PACKING_STAGES, Hardware
from core.config.slices import Training

C = TypeVar("C", bound=Training)  # a preset's levers are fields of the training slices, never where the run lives

# Every lever a preset may set, at the chapter's value (the registry's, core/config/levers.py): applying a preset
# first resets these, so presets do not leak into each other when the user switches between them.
CHAPTER: dict[str, Any] = chapter_values()

PRESETS: dict[str, dict[str, Any]] = {
    "chapter": {
        "label": "Chapter recipe (as written)",
        "description": "The course chapter's QLoRA recipe exactly: fp32 upcast, batch 1 x 16, checkpointing, paged"
                       " 8-bit AdamW. For comparison.",
        "overrides": dict(CHAPTER),
    },
    "lowest_memory": {
        "label": "Lowest memory",
        "description": "Smallest GPU footprint: no fp32 upcast, embedding in CPU memory, four 512-token packs per "
                       "micro-step with checkpointing, the layers' inputs offloaded to CPU memory, fused "
                       "cross-entropy.",
        "overrides": {
            **CHAPTER,
            "upcast_to_fp32": False,  # -2.5 GiB peak on 8B: embeddings, norms and head stay bf16
            "offload_embeddings": True,  # -1.0 GiB on 8B: the 128k x 4096 input embedding lives in CPU RAM
            "expandable_segments": True,  # reserved stays within ~0.1 GiB of allocated
            "lora_dropout": 0.0,  # no dropout copy of every adapted input, fewer kernels
            "packing": True,  # ~3 rows per 512-token pack, no padding
            # ~2,000 tokens per micro-step: 4 packs cost 0.16 GiB more than 2 on 8B and run 2x the tokens/s (fewer,
            # larger launches: the lean path is host-bound); bench/RESULTS.md, run 18
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 2,  # 8 packs (~24 rows) per optimizer step
            "attention": "varlen",  # FlashAttention per packed row on CUDA (SDPA with a row mask elsewhere)
            "gradient_checkpointing": True,
            # checkpointed layer inputs in CPU memory (measured: bench/RESULTS.md, section "Activation offloading")
            "offload_activations": True,
            "use_liger_kernel": True,  # fused linear cross-entropy: the 128k-wide logits never exist
            "optim": "paged_adamw_8bit",
        },
    },
    "fastest": {
        "label": "Fastest within 24 GB",
        "description": "Most tokens per second within 24 GB: 8 packs (~4k tokens) per step, no checkpointing, "
                       "fused kernels, FlashAttention per packed row, the layers compiled when the run is long "
                       "enough to repay it.",
        "overrides": {
            **CHAPTER,
            "upcast_to_fp32": False,
            "lora_dropout": 0.0,
            "packing": True,
            "use_liger_kernel": True,  # fused RMSNorm/SwiGLU/RoPE: fewer kernels and less activation memory
            "per_device_train_batch_size": 8,  # ~4,000 tokens per micro-step (never more than 8 x max_length)
            "gradient_accumulation_steps": 1,  # 8 packs ~ 22 dolly rows per optimizer step
            "gradient_checkpointing": False,  # no recompute; activations ~3.8 MiB per token on 8B with liger
            # per packed row, no [tokens x tokens] mask: faster and smaller (bench/RESULTS.md, section "Product path")
            "attention": "varlen",
            # the decoder layers compiled when this run's steps repay the compile (each step 1.08x faster, median
            # of 96 paired steps, after 23 s, or 7 s from the compile cache: one H100, bench/RESULTS.md run 24);
            # the log says which
            "compile_layers": "auto",
            # Two levers that remove launches, kept after three alternated pairs of processes in one call (8B, one
            # H100, bench/RESULTS.md run 23): 12,216 tok/s against 10,759 on the same batches, every step 1.125x
            # faster (median of 216 paired steps), for +0.36 GiB. Without double quantization each frozen weight's
            # dequantize is one kernel, not three (fp32 absmax: +0.34 GiB on 8B); torch's fused AdamW is one
            # multi-tensor kernel where bitsandbytes' 8-bit AdamW synchronizes the GPU once per parameter (its fp32
            # states are ~0.1 GiB for the LoRA weights).
            "bnb_4bit_use_double_quant": False,
            "optim": "adamw_torch_fused",
        },
    },
    "six_gb": {
        "label": "6 GB card",
        "description": "Lowest memory with the frozen output head in 4-bit, two 512-token packs per micro-step with "
                       "their inputs offloaded and small cuBLAS workspaces: sized for a 6 GB GPU (RTX "
                       "2060/3050/4050 class). The logits change slightly.",
        "overrides": {
            **CHAPTER,
            "upcast_to_fp32": False,
            "offload_embeddings": True,
            "quantize_output_head": True,  # -0.7 GiB on 8B: the 128k x 4096 head in NF4, read in 8k-row chunks
            "expandable_segments": True,
            "lora_dropout": 0.0,
            "packing": True,
            # 2 packs per micro-step with per-row FlashAttention, offloaded layer inputs and small workspaces ran
            # 1,266 tok/s at 5.20 GiB where 1 pack x 6 ran 675 at 5.35 (8B, one H100, one call: bench/RESULTS.md run
            # 21): the second pack's activations are paid by the offloading and the workspaces
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 3,  # 6 packs per optimizer step
            "attention": "varlen",
            "gradient_checkpointing": True,
            "offload_activations": True,
            "small_cublas_workspace": True,
            "use_liger_kernel": True,
            "optim": "paged_adamw_8bit",
        },
    },
}

CUDA_ONLY = cuda_only()  # levers that need a CUDA GPU (and a package), dropped where there is none


def names() -> list[str]:
    return list(PRESETS)


def overrides(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return dict(PRESETS[name]["overrides"])


def for_stage(name: str, stage: str) -> dict[str, Any]:
    """The preset's overrides for a training stage: a preference stage's pairs are padded by TRL, never packed, so
    a preset's packing applies to SFT only (its other levers hold for every stage: bench/RESULTS.md, run 19)."""
    changes = overrides(name)
    if stage not in PACKING_STAGES and changes.get("packing"):
        changes["packing"] = False
    return changes


def apply_preset(cfg: C, name: str, hw: Hardware | None = None, stage: str | None = None) -> C:
    """`cfg` with the preset's levers set, for `stage` (default: cfg's). With `hw`, CUDA-only levers are left off
    where the machine lacks them."""
    changes = for_stage(name, stage or cfg.stage)
    if hw is not None and not (hw.cuda and hw.liger):
        changes = {k: (False if k in CUDA_ONLY else v) for k, v in changes.items()}
    return cfg.replace(**changes)


def matching(cfg: Training) -> str | None:
    """The preset whose levers `cfg` has exactly, for its stage, or None (a custom mix)."""
    for name in PRESETS:
        if all(getattr(cfg, k) == v for k, v in for_stage(name, cfg.stage).items()):
            return name
    return None
