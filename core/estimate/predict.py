"""Will it fit? A GPU-memory estimate of a TrainConfig, from the model's shape alone (no weights, no GPU).

    python -m core.estimate                                   # the chapter's recipe (the defaults)
    python -m core.estimate --config my.yaml --set max_length=1024 --json
    python -m core.estimate --set model=Qwen/Qwen2.5-7B --fit 24  # shrink batch/length to fit a 24 GiB card
    python -m core.estimate --config my.yaml --preset lowest_memory --data  # sized for the dataset's real rows
    python -m core.estimate --set num_gpus=2 --set distributed_strategy=fsdp  # per GPU of a 2-GPU FSDP run

The figure is per GPU: a config with several GPUs (num_gpus, num_machines) is resolved as the launcher resolves it
(core/gpus/distributed.py's plan(): ddp, fsdp, or auto), and each GPU's share is estimated (core/estimate/multi.py).
What each term is and why: core/estimate/terms.py. `bench/validate_estimate.py` compares with every measured run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Protocol, TypeVar

from core.estimate import multi as estimate_multi
from core.estimate import stages as stage_terms  # a preference stage's sequences per row
from core.estimate import vision as vision_terms  # an image-text model's vision side and image tokens
from core.estimate import streaming
from core.config.settings import OPTIMIZERS, ConfigError, Hardware, TrainConfig, parse_overrides
from core.data.read import DataError
from core.estimate.known import shape_of
from core.estimate.terms import (ATTENTIONS, CUDA_CONTEXT, GIB, HOST_BASE, dora_terms, host_memory_problem,
                                 single_gpu_terms)
from core.config.levers import fit_fields
from core.config.slices import DataSlice, ModelSlice, PlaceSlice, StageSlice, TrainerSlice, Training
from core.config.presets import PRESETS, apply_preset
from core.model.shapes import ModelShape, ShapeError, get_shape
from core.model.vision import ImageBudgetError


class _Run(Training, PlaceSlice, Protocol):
    """What the estimate reads: the step's work and memory (Training) and the processes it is spread over."""


class _Rows(ModelSlice, DataSlice, StageSlice, Protocol):
    """The dataset's rows as the stage reads them, tokenized by the model's tokenizer."""


class _Grown(DataSlice, TrainerSlice, Protocol):
    """The micro-batch, its accumulation and the length of its rows."""


R = TypeVar("R", bound=_Run)
T = TypeVar("T", bound=TrainerSlice)
G = TypeVar("G", bound=_Grown)


def _gib(name: str) -> property:
    return property(lambda self: getattr(self, name) / GIB, doc=f"{name} in GiB")


@dataclass
class Estimate:
    """Predicted memory of one GPU at its peak, in bytes. The components sum to `nvml_peak` (= `total_gib`).

    Everything up to `cuda_context` is the training peak (= `nvml_training`); `load_spike` is what loading needs
    beyond it. `peak_allocated` / `peak_reserved` are what torch.cuda.max_memory_* report over the whole run.
    With several GPUs (`world_size` > 1) every figure is one GPU's (`strategy` ddp or fsdp).
    """

    quantized_weights: int
    unquantized_weights: int  # on the GPU (an offloaded input embedding is not)
    lora: int  # adapter params + grads
    optimizer: int  # all optimizer state (paged state counts in NVML only)
    activations: int  # kept for the backward pass: layer inputs (checkpointing) or every layer's tensors + masks
    logits: int  # LM head + loss working memory
    temporaries: int  # beyond `logits`: a recomputed layer, its gradients, a dequantized 4-bit weight, cuBLAS
    load_spike: int  # how far the GPU memory used while loading exceeds training's; 0 when training is the peak
    allocator_cache: int  # torch reserved - allocated during training (cached free blocks)
    cuda_context: int  # NVML used - torch reserved (CUDA context, cuBLAS workspaces, ...)
    peak_allocated: int
    peak_reserved: int
    nvml_peak: int
    tokens: int  # per micro-batch
    peak_phase: str  # "training" or "loading"
    nvml_training: int = 0  # NVML peak of the training steps alone (what a sampler started after loading sees)
    cpu_offloaded: int = 0  # weights kept in CPU memory instead (offload_embeddings, stream_layers)
    cpu_activations: int = 0  # offload_activations: saved activations waiting in CPU memory
    notes: list[str] = field(default_factory=list)
    communication: int = 0  # several GPUs: DDP's gradient buckets, broadcast buffers, NCCL's buffers
    gathered_weights: int = 0  # FSDP: the unsharded weights of the units being computed
    world_size: int = 1  # processes (GPUs) of the run; the figures are per GPU
    strategy: str = "single"  # single | ddp | fsdp
    strategy_reason: str = ""

    COMPONENTS = ("quantized_weights", "unquantized_weights", "lora", "optimizer", "activations", "logits",
                  "temporaries", "gathered_weights", "communication", "allocator_cache", "cuda_context", "load_spike")
    LABELS = {
        "quantized_weights": "4-bit weights (decoder linears, MoE experts)",
        "unquantized_weights": "other weights (embeddings, norms, ...)",
        "lora": "LoRA params + grads",
        "optimizer": "optimizer state",
        "activations": "activations kept for backward",
        "logits": "LM head + loss",
        "temporaries": "backward temporaries, cuBLAS workspace",
        "gathered_weights": "FSDP: full weights being computed",
        "communication": "DDP buckets, broadcast + NCCL buffers",
        "load_spike": "extra while loading",
        "allocator_cache": "PyTorch cache (reserved - allocated)",
        "cuda_context": "CUDA context + libraries",
    }

    total_gib = _gib("nvml_peak")
    peak_allocated_gib = _gib("peak_allocated")
    peak_reserved_gib = _gib("peak_reserved")

    @property
    def total(self) -> int:
        return self.nvml_peak

    @property
    def cpu_needed(self) -> int:
        """CPU memory the run needs where weights or activations are kept there (terms.host_bytes: what is kept
        and the process itself); 0 where nothing is."""
        kept = self.cpu_offloaded + self.cpu_activations
        return kept + HOST_BASE if kept else 0

    def components(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.COMPONENTS}

    def to_json(self) -> dict:
        out = {"total_gib": round(self.total_gib, 3)}
        out.update({f"{k}_gib": round(v / GIB, 3) for k, v in self.components().items()})
        out.update(peak_allocated_gib=round(self.peak_allocated_gib, 3),
                   peak_reserved_gib=round(self.peak_reserved_gib, 3), nvml_peak_gib=round(self.total_gib, 3),
                   nvml_training_gib=round(self.nvml_training / GIB, 3), tokens_per_micro_batch=self.tokens,
                   cpu_offloaded_gib=round(self.cpu_offloaded / GIB, 3),
                   cpu_activations_gib=round(self.cpu_activations / GIB, 3),
                   cpu_needed_gib=round(self.cpu_needed / GIB, 3), peak_phase=self.peak_phase,
                   world_size=self.world_size, strategy=self.strategy, notes=list(self.notes))
        return out

    def table(self) -> str:
        lines = [f"  {self.LABELS[k]:<42} {v / GIB:7.2f} GiB" for k, v in self.components().items()
                 if k != "load_spike" and (v or k in ("unquantized_weights", "activations"))]
        if self.load_spike:
            lines.append(f"  {'= training peak':<42} {self.nvml_training / GIB:7.2f} GiB")
            lines.append(f"  {self.LABELS['load_spike']:<42} {self.load_spike / GIB:7.2f} GiB")
        what = "total (GPU memory used, NVML peak)" if self.world_size == 1 else "total per GPU (NVML peak)"
        lines.append(f"  {what:<42} {self.total_gib:7.2f} GiB")
        lines.append(f"  peak allocated {self.peak_allocated_gib:.2f} GiB, peak reserved {self.peak_reserved_gib:.2f} "
                     f"GiB (peak while {self.peak_phase}); {self.tokens} tokens per micro-batch")
        if self.cpu_offloaded:
            lines.append(f"  weights in CPU memory instead: {self.cpu_offloaded / GIB:.2f} GiB")
        if self.cpu_activations:
            lines.append(f"  activations waiting in CPU memory: {self.cpu_activations / GIB:.2f} GiB")
        if self.cpu_needed:
            lines.append(f"  CPU memory the run needs (with the process itself): {self.cpu_needed / GIB:.2f} GiB")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _resolve_shape(cfg: ModelSlice, shape: ModelShape | None) -> ModelShape:
    return shape if shape is not None else shape_of(cfg.model)  # the web server: without building the model


def estimate(cfg: _Run, shape: ModelShape | None = None, *, max_row_tokens: int | None = None,
             full_logits: bool = False, liger_layers: bool | None = None, attention: str | None = None,
             equal_length_rows: bool = False, n_gpus: int | None = None, gpu_bytes: int | None = None,
             embedding_via_gpu: bool = False, image_tokens: int | None = None, images_per_row: int = 1) -> Estimate:
    """Predict one GPU's memory while training `cfg` (peak allocated, peak reserved and NVML peak).

    `max_row_tokens`: the longest row of the dataset in tokens, when known (default: rows reach max_length).
    `full_logits`: the loss materialises batch x length x vocab logits (a plain loss; not TRL's SFTTrainer).
    `liger_layers`: liger's RMSNorm/SwiGLU/RoPE are in the model (default: `cfg.use_liger_kernel`).
    `attention`: "sdpa" (default; or the config's `attention` field where it has one) or "varlen" (per packed row).
    `equal_length_rows`: every row of a micro-batch has the same length, so an unpacked batch needs no padding mask.
    `n_gpus`, `gpu_bytes`: this machine's GPU count and smallest GPU, for num_gpus "all" and strategy auto
    (default: what NVML sees here).
    `image_tokens`, `images_per_row`: an image dataset's most image tokens and images in a row, counted by the
    processor (default: one image at the image budget; core/estimate/vision.py).
    """
    shape = _resolve_shape(cfg, shape)
    # vision hook: the micro-batch's image tokens and patches; a lowered image budget shortens the counted rows
    seen = vision_terms.images(cfg, shape, max_row_tokens, image_tokens, images_per_row)
    if seen is not None:
        max_row_tokens = seen.row_tokens
    attention = attention or getattr(cfg, "attention", None) or "sdpa"
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, not {attention!r}")
    # stages hook: a preference stage's terms are SFT's on its sequences per row
    t = single_gpu_terms(stage_terms.as_sft(cfg), shape, max_row_tokens=max_row_tokens, full_logits=full_logits,
                         liger_layers=liger_layers, attention=attention, equal_length_rows=equal_length_rows,
                         embedding_via_gpu=embedding_via_gpu)  # rows measured with a loader that went through the GPU
    stage_terms.logits_terms(t, cfg, shape)  # stages hook: ORPO's loss holds the whole logits
    stage_terms.generation_terms(t, cfg, shape)  # stages hook: GRPO's sampling (KV cache, a decoding step's logits)
    dora_terms(t, cfg, shape)  # use_dora's magnitudes, kept outputs and norm transient (none when off)
    vision_terms.vision_terms(t, cfg, shape, seen)  # vision hook: its 16-bit weights and the tower's activations
    lay = estimate_multi.layout(cfg, lambda: max(t.nvml_training, t.nvml_setup), n_gpus, gpu_bytes)
    estimate_multi.apply(t, cfg, shape, lay)
    notes = ([f"per GPU: {lay.world_size} processes, {lay.strategy} ({lay.reason})"] if lay.world_size > 1 else [])
    notes += t.notes + stage_terms.notes(cfg)  # stages hook: dpo/orpo's two sequences per row, the reference pass
    notes += stream_notes(cfg, shape, t.tokens)  # stream_layers: its copies per step against compute
    nvml = max(t.nvml_training, t.nvml_setup)
    phase = "loading" if nvml > t.nvml_training else "training"
    if phase == "loading":
        if cfg.load_in_4bit and cfg.upcast_to_fp32 and cfg.precision != "fp32":
            notes.append("the peak is the fp32 upcast while loading, not training: upcast_to_fp32=false avoids it")
        else:
            notes.append("the peak is while loading the model, not training")
    if t.paged:
        notes.append("paged optimizer state lives in CUDA managed memory: it can spill to CPU RAM under pressure")
    return Estimate(
        quantized_weights=t.quantized, unquantized_weights=t.unquantized, lora=t.lora, optimizer=t.optimizer,
        activations=t.activations, logits=t.logits, temporaries=t.temporaries, load_spike=nvml - t.nvml_training,
        allocator_cache=t.train_reserved - t.train_alloc - t.kept, cuda_context=CUDA_CONTEXT,
        peak_allocated=max(t.train_alloc, t.load_alloc),
        peak_reserved=max(t.train_reserved, t.load_reserved, t.load_transient),
        nvml_peak=nvml, tokens=t.tokens, peak_phase=phase, notes=notes + t.last_notes,
        nvml_training=t.nvml_training, cpu_offloaded=t.offloaded, cpu_activations=t.host_activations,
        communication=t.buckets + t.kept + t.comm,
        gathered_weights=t.gathered, world_size=lay.world_size, strategy=lay.strategy, strategy_reason=lay.reason)


# --- what each checklist item saves ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ItemSaving:
    key: str
    label: str
    on: bool  # whether the config has it on now
    saved_bytes: int  # predicted NVML peak with the item off minus with it on (at the other current settings)

    @property
    def saved_gib(self) -> float:
        return self.saved_bytes / GIB

    @property
    def text(self) -> str:
        if self.saved_gib <= -0.05:  # the item raises the peak at these settings
            return f"costs {-self.saved_gib:.1f} GiB more here"
        if self.saved_gib < 0.05:
            return "saves nothing here"
        return f"saves {self.saved_gib:.1f} GiB here"


def savings(cfg: _Run, shape: ModelShape | None = None, switch=None, **kw) -> list[ItemSaving]:
    """For each of the chapter's seven checklist items, the GiB it saves at the current settings (on vs off).

    `switch(cfg, key, on)` is what ticking or unticking the item does (default core.config.checklist.toggle; the page passes
    its own, which can give back the values from before the last tick), so the saving is what a click changes."""
    from core.config.checklist import ITEMS, toggle

    switch = switch or toggle
    shape = _resolve_shape(cfg, shape)
    out = []
    for item in ITEMS:
        on_total = estimate(switch(cfg, item.key, True), shape, **kw).nvml_peak
        off_total = estimate(switch(cfg, item.key, False), shape, **kw).nvml_peak
        out.append(ItemSaving(item.key, item.label, bool(item.is_on(cfg)), off_total - on_total))
    return out


# --- fit to a budget ------------------------------------------------------------------------------------------------
class FitError(ValueError):
    """Nothing memtune may change fits the budget; the message gives the smallest need found. For a page that words
    it itself: `smallest` (the smallest setting tried), `need_gib` (a GPU that fits it) and `advice` (a code:
    fsdp_loading, ddp, upcast, no_4bit, smaller_model)."""

    def __init__(self, message: str, smallest: _Run | None = None, smallest_gib: float | None = None,
                 need_gib: float | None = None, advice: str = "smaller_model") -> None:
        super().__init__(message)
        self.smallest, self.smallest_gib, self.need_gib, self.advice = smallest, smallest_gib, need_gib, advice


def _lengths(max_length: int, floor: int = 64) -> list[int]:
    out, length = [], max_length
    while True:
        out.append(length)
        if length <= floor:
            return out
        length = max(floor, length // 2)


FIT_MARGIN = 0.1  # what fit_to_gpu keeps spare of the budget
# GRPO's sampling, which Fit may lower once the micro-batch, checkpointing and optimizer are not enough: the generation
# batch's KV cache grows with answers per prompt x answer length (core/estimate/stages.py)
GENERATION_FIELDS = ("num_generations", "max_completion_length")
IMAGE_FIELDS = ("image_max_pixels",)  # an image-text model's image budget, which Fit may lower (vision hook)
COMPLETION_FLOOR = 64  # the shortest answer Fit cuts GRPO's to (never below the user's own)


def generations(cfg: StageSlice) -> list[tuple[int, int]]:
    """(num_generations, max_completion_length) Fit may try, the user's first: answers per prompt halved down to 2
    and their length halved down to COMPLETION_FLOOR, the most sampled tokens per prompt first, and at equal tokens
    the longer answers (a cut answer scores as a wrong one). Only the user's for a stage that samples nothing."""
    if cfg.stage != "grpo":
        return [(cfg.num_generations, cfg.max_completion_length)]
    counts = _lengths(cfg.num_generations, 2)
    lengths = _lengths(cfg.max_completion_length, min(COMPLETION_FLOOR, cfg.max_completion_length))
    return sorted(((g, n) for g in counts for n in lengths), key=lambda c: (-c[0] * c[1], -c[1]))


def sampled(cfg: R, answers: int, length: int) -> tuple[R, int]:
    """cfg sampling `answers` answers of up to `length` tokens to the same prompts per generation batch, and that
    batch's rows (what batch x accumulation must make): the effective batch itself for a stage that samples
    nothing."""
    effective = cfg.effective_batch_size
    if cfg.stage != "grpo":
        return cfg, effective
    prompts = max(1, -(-effective // max(1, cfg.num_generations)))
    return cfg.replace(num_generations=answers, max_completion_length=length), prompts * answers


def image_steps(cfg: DataSlice, shape: ModelShape) -> list[tuple[int, int]]:
    """(image_max_pixels, max_length) pairs fit_to_gpu tries in order: an image-text model's lower image budgets
    first (core/estimate/vision.py budgets: an image row past max_length is dropped whole, so a smaller image
    comes before a shorter length), then the shorter lengths at the lowest budget; a text model's lengths alone."""
    pixels = vision_terms.budgets(cfg, shape)
    lengths = _lengths(cfg.max_length)
    return [(p, lengths[0]) for p in pixels] + [(pixels[-1], n) for n in lengths[1:]]


def fit_floor(cfg: _Run, shape: ModelShape | None = None, **kw) -> Estimate:
    """The estimate of the smallest setting fit_to_gpu may choose for cfg (batch 1, its shortest length, gradient
    checkpointing, a paged 8-bit optimizer; GRPO's fewest and shortest answers): when even this does not fit a
    budget, Fit cannot help."""
    shape = _resolve_shape(cfg, shape)
    small, effective = sampled(cfg, *generations(cfg)[-1])
    optim = cfg.optim if OPTIMIZERS.get(cfg.optim, (0, 0, 0))[1] else "paged_adamw_8bit"
    return estimate(small.replace(max_length=_lengths(cfg.max_length)[-1], per_device_train_batch_size=1,
                                  image_max_pixels=vision_terms.budgets(cfg, shape)[-1],
                                  gradient_accumulation_steps=max(1, effective), gradient_checkpointing=True,
                                  optim=optim), shape, **kw)


def fit_to_gpu(cfg: R, budget_bytes: int, margin: float = FIT_MARGIN, shape: ModelShape | None = None,
               **kw) -> tuple[R, Estimate]:
    """The config closest to `cfg` whose predicted NVML peak fits `budget_bytes` with `margin` to spare.

    Changes only the micro-batch (keeping batch x accumulation via accumulation), max_length (never above the
    user's; shortened last, since it truncates rows), gradient checkpointing and the optimizer (8-bit paged). GRPO:
    then its sampling (`generations`: fewer or shorter answers to the same prompts per generation batch) before
    max_length, with a micro-batch that divides the generation batch (its groups stay whole).
    """
    shape = _resolve_shape(cfg, shape)
    limit = budget_bytes * (1.0 - margin)
    optims = [cfg.optim] + ([] if OPTIMIZERS.get(cfg.optim, (0, 0, 0))[1] else ["paged_adamw_8bit"])
    ckpts = [cfg.gradient_checkpointing] + ([] if cfg.gradient_checkpointing else [True])
    variants = [(g, o) for g in ckpts for o in optims]
    variants.sort(key=lambda v: (v[0] != cfg.gradient_checkpointing, v[1] != cfg.optim))
    last: tuple[R, Estimate] | None = None
    for pixels, length in image_steps(cfg, shape):
        for answers, answer_length in generations(cfg):
            start, effective = sampled(cfg, answers, answer_length)
            batches, b = [], cfg.per_device_train_batch_size
            while b >= 1:
                if cfg.stage != "grpo" or effective % b == 0:
                    batches.append(b)
                b //= 2
            for b in batches:
                for ckpt, optim in variants:
                    cand = start.replace(max_length=length, image_max_pixels=pixels, per_device_train_batch_size=b,
                                         gradient_accumulation_steps=max(1, -(-effective // b)),
                                         gradient_checkpointing=ckpt, optim=optim)
                    est = estimate(cand, shape, **kw)
                    if est.nvml_peak <= limit:
                        if pixels != cfg.image_max_pixels:  # say so: the images are resized smaller
                            est.notes.insert(0, f"Fit lowered image_max_pixels to {pixels:,}: each image is "
                                                "resized smaller, with fewer image tokens and less detail")
                        return cand, est
                    last = (cand, est)
    cand, est = last  # the smallest setting: batch 1, the shortest length, checkpointing, 8-bit optimizer
    streamed = _streamed_fit(cfg, budget_bytes, margin, shape, est, **kw)
    if streamed is not None:
        return streamed
    need = est.nvml_peak / (1.0 - margin)
    if est.strategy == "fsdp" and est.peak_phase == "loading":
        code, advice = "fsdp_loading", "The peak is loading: each GPU holds the whole 4-bit model before FSDP shards it."
    elif est.strategy == "ddp":
        code, advice = "ddp", "Every GPU holds the whole model under ddp: distributed_strategy fsdp shards it across the GPUs."
    elif cfg.load_in_4bit and cfg.upcast_to_fp32 and est.peak_phase == "loading":
        code, advice = "upcast", "The peak is the fp32 upcast while loading: turn upcast_to_fp32 off, or pick a smaller model."
    elif not cfg.load_in_4bit:
        code, advice = "no_4bit", "Turn on load_in_4bit (QLoRA), or pick a smaller model."
    else:
        code, advice = "smaller_model", "Pick a smaller model."
    raise FitError(
        f"Nothing fits in {budget_bytes / GIB:.1f} GiB with a {margin:.0%} margin. The smallest setting tried "
        f"(batch 1, max_length {cand.max_length}, gradient checkpointing "
        f"{'on' if cand.gradient_checkpointing else 'off'}, {cand.optim}"
        f"{sampling_words(cand)}) needs {est.total_gib:.1f} GiB{' per GPU' if est.world_size > 1 else ''}, so a GPU with at "
        f"least {need / GIB:.1f} GiB. {advice}", smallest=cand, smallest_gib=est.total_gib, need_gib=need / GIB,
        advice=code)


def _streamed_fit(cfg: R, budget_bytes: int, margin: float, shape: ModelShape, smallest: Estimate,
                  **kw) -> tuple[R, Estimate] | None:
    """The last resort of fit_to_gpu: the same search with the frozen layers streamed from CPU memory
    (stream_layers), where nothing else fits one GPU, the base is 4-bit and this machine's RAM holds them; its
    estimate says that it costs speed. None where it does not apply or does not fit either."""
    if cfg.stream_layers or not cfg.load_in_4bit or smallest.world_size > 1:
        return None
    streamed = cfg.replace(stream_layers=True)
    if host_memory_problem(streamed, shape) is not None:
        return None
    try:
        fitted, est = fit_to_gpu(streamed, budget_bytes, margin, shape, **kw)
    except FitError:
        return None
    speed = streaming.stream_speed(fitted, shape, est.tokens)
    cost = (f"slower: steps up to {speed.slowdown:.1f}x as long (the link measured here)"
            if speed and speed.slowdown else "several times slower")
    est.notes.insert(0, f"nothing else fits {budget_bytes / GIB:.1f} GiB: stream_layers streams the frozen layers "
                        f"from CPU memory; each step copies every layer over the link, {cost}")
    return fitted, est


def stream_notes(cfg: _Run, shape: ModelShape, tokens: int) -> list[str]:
    """stream_layers' speed note (core/estimate/streaming.py): [] without it."""
    speed = streaming.stream_speed(cfg, shape, tokens)
    return [streaming.speed_note(speed)] if speed is not None else []


def sampling_words(cfg: StageSlice) -> str:
    """GRPO's sampling in FitError's English ("" for a stage that samples nothing)."""
    if cfg.stage != "grpo":
        return ""
    return f", {cfg.num_generations} answers of up to {cfg.max_completion_length} tokens per prompt"


# --- the dataset's real lengths -------------------------------------------------------------------------------------
def measured_row_tokens(cfg: _Rows) -> int | None:
    """The longest row of cfg's dataset in tokens (read and tokenized as training will), for `max_row_tokens`;
    None with packing, where a micro-batch is packs of up to max_length whatever the rows."""
    if cfg.packing:
        return None
    from core.data import plan as data
    from core.model.load import load_tokenizer

    from core.quiet import offline_if_unreachable

    offline_if_unreachable(cfg)  # one quick check, not six "Retrying in Ns" lines before the error
    from core.data import pairs  # a preference stage's rows: each pair's longest sequence, as the stage plans them

    if cfg.stage == "grpo":  # a sampled answer's length is max_completion_length's, whatever the rows' answers
        return None
    raw, fmt = data.check_data(cfg) if cfg.stage == "sft" else pairs.check_pairs(cfg)
    try:
        tokenizer = load_tokenizer(cfg)
    except Exception as exc:  # noqa: BLE001 - an uncached or gated model: the estimate itself needs no tokenizer
        raise DataError("data.err.measure_tokenizer", dataset=cfg.dataset, model=cfg.model,
                        error=f"{type(exc).__name__}: {exc}") from None
    if cfg.stage != "sft":
        return pairs.plan_pairs(cfg, tokenizer, raw, fmt).longest_row or None
    return data.plan_rows(cfg, tokenizer, raw, fmt, n_examples=0).longest_row or None


# --- CLI ------------------------------------------------------------------------------------------------------------

# --- presets that keep their promise for the model in hand -------------------------------------------------
# Presets that keep their promise for the model in hand: "Fastest within 24 GB" stays within 24 GB.
# 
# A preset is a fixed set of levers measured on Llama-3.1-8B (core/config/presets.py). On another model the same levers can
# need more: Gemma-2-9B's 256k vocabulary and 42 layers take 29.0 GiB with `fastest` (bench/RESULTS.md). `apply` sets the
# preset's levers, then, for a preset with a memory promise, asks the estimator (core/estimate/predict.py) for this model and
# takes the fastest micro-batch / checkpointing that keeps the promise: fewer packs per micro-step first (with the
# accumulation raised to keep ~the same packs per optimizer step), then checkpointing. It says what it changed, or,
# when even the smallest setting does not fit, what the preset gives for this model.
# A model far inside the promise on a GPU (Llama-3.2-3B: 12.6 of 24 GiB) is launch-bound at the preset's micro-batch
# (its GPU about a quarter busy, and faster with twice the packs: bench/RESULTS.md, section "`fastest` sized per
# model"), so the micro-batch grows too: doubled while the prediction keeps the promise, up to GROW_MAX_TOKENS per
# micro-step. Where the accumulation is above 1 it is divided to keep the packs per optimizer step; at 1 (the
# preset's), each optimizer step then sees more packs, and the note says so. Not without CUDA: a CPU is not launch-bound.
#
PRESET_BUDGETS_GIB = {"fastest": 24.0}  # the preset's promise: NVML peak on one GPU (a "24 GB" card holds 24 GiB)
PRESET_MARGIN = 0.97  # the estimator's error on the GPU rows is within 3% (bench/RESULTS.md): aim below the promise by that
# 4x the preset's 8 x 512 tokens: with the 3B's GPU a quarter busy, that is where the matrix work would fill it;
# beyond it a bigger micro-step only adds memory. At max_length 2048 the preset's 8 packs are there already.
GROW_MAX_TOKENS = 16384


@dataclass
class PresetFit(Generic[R]):
    cfg: R
    preset: str = ""
    key: str | None = None  # core/locales key of the note (preset.fit.*), None when there is nothing to say
    values: dict[str, Any] = field(default_factory=dict)  # the note's placeholders
    predicted_gib: float | None = None
    changes: dict[str, Any] = field(default_factory=dict)  # field -> its new value: the note's {changes}

    def note(self, lang: str = "en", word: Callable[[str, Any], str] | None = None) -> str:
        """The note in `lang`. `word(field, value)` names one change: by default `field=value`, as `--set` takes it
        (the CLI's words); the page passes its widgets' labels, which core/ does not know."""
        if not self.key:
            return ""
        from core.i18n import decimal, t

        label = t(f"preset.{self.preset}.label", lang)
        # 23,0 GiB where the language writes a decimal comma, as the rest of the page does
        values = {k: decimal(v, 1, lang) if isinstance(v, float) else v for k, v in self.values.items()}
        if self.changes:
            word = word or (lambda name, value: f"{name}={str(value).lower() if isinstance(value, bool) else value}")
            values["changes"] = ", ".join(word(name, value) for name, value in self.changes.items())
        return t(self.key, lang, **{**values, "preset": label if label != f"preset.{self.preset}.label"
                                    else PRESETS[self.preset]["label"]})


def _predict(cfg: _Run) -> float | None:
    from core.data.plan import known_longest_row

    try:
        return estimate(cfg, max_row_tokens=known_longest_row(cfg)).total_gib
    except Exception:  # noqa: BLE001 - a model the estimator cannot read: the preset stays as written
        return None


def preset_candidates(cfg: T) -> list[T]:
    """The preset's own setting first, then fewer packs per micro-step, then the same with checkpointing."""
    packs = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps  # per optimizer step
    out = []
    for ckpt in (cfg.gradient_checkpointing, True):
        for batch in (8, 6, 4, 3, 2, 1):
            if batch <= cfg.per_device_train_batch_size:
                out.append(cfg.replace(per_device_train_batch_size=batch, gradient_checkpointing=ckpt,
                                       gradient_accumulation_steps=max(1, -(-packs // batch))))
    return _unique(out)


def grown_candidates(cfg: G) -> list[G]:
    """Twice, four times ... the preset's packs per micro-step, up to GROW_MAX_TOKENS tokens, largest first; the
    accumulation divided where it can be (the same packs per optimizer step), else left at 1."""
    packs = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    out, batch = [], cfg.per_device_train_batch_size * 2
    while batch * cfg.max_length <= GROW_MAX_TOKENS:
        out.append(cfg.replace(per_device_train_batch_size=batch,
                               gradient_accumulation_steps=max(1, packs // batch)))
        batch *= 2
    return out[::-1]


def _unique(items: list[T]) -> list[T]:
    seen, out = set(), []
    for c in items:
        key = (c.per_device_train_batch_size, c.gradient_checkpointing)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def fit_preset(cfg: R, name: str, hw: Hardware | None = None,
               fixed: Mapping[str, Any] | None = None) -> PresetFit[R]:
    """`cfg` with preset `name` applied for this model (see the module docstring), and the note saying what changed.
    `fixed`: settings the user gave beside the preset (the CLIs' --set): they win over the preset's levers, and the
    fit sizes the rest around them (it never changes one of them)."""
    fixed = dict(fixed or {})
    base = apply_preset(cfg, name, hw, stage=fixed.get("stage")).replace(**fixed)

    def keeps(option: R) -> bool:
        return all(getattr(option, k) == v for k, v in fixed.items())

    budget = PRESET_BUDGETS_GIB.get(name)
    if budget is None:
        return PresetFit(base)
    first = _predict(base)
    if first is None:
        return PresetFit(base)
    label = PRESETS[name]["label"]  # in the note's language when it is shown (Fit.note)
    if first <= budget * PRESET_MARGIN:
        for option in grown_candidates(base) if hw is None or hw.cuda else []:
            if not keeps(option):
                continue
            gib = _predict(option)
            if gib is not None and gib <= budget * PRESET_MARGIN:
                changes = {"per_device_train_batch_size": option.per_device_train_batch_size}
                if option.gradient_accumulation_steps != base.gradient_accumulation_steps:
                    changes["gradient_accumulation_steps"] = option.gradient_accumulation_steps
                step = option.per_device_train_batch_size * option.gradient_accumulation_steps
                before = base.per_device_train_batch_size * base.gradient_accumulation_steps
                return PresetFit(option, name, "preset.fit.grown" if step > before else "preset.fit.grown_same",
                                 {"gib": gib, "budget": f"{budget:g}", "before": first, "preset": label,
                                  "packs": step, "before_packs": before}, gib, changes)
        return PresetFit(base, name, "preset.fit.holds", {"gib": first, "budget": f"{budget:g}"}, first)
    options = [o for o in preset_candidates(base) if keeps(o)]
    for option in options[1:]:
        gib = _predict(option)
        if gib is not None and gib <= budget * PRESET_MARGIN:
            changes = {"per_device_train_batch_size": option.per_device_train_batch_size,
                       "gradient_accumulation_steps": option.gradient_accumulation_steps}
            if option.gradient_checkpointing != base.gradient_checkpointing:
                changes["gradient_checkpointing"] = option.gradient_checkpointing
            return PresetFit(option, name, "preset.fit.changed",
                             {"gib": gib, "budget": f"{budget:g}", "before": first, "preset": label}, gib, changes)
    smallest = options[-1] if options else base
    gib = _predict(smallest)
    return PresetFit(smallest, name, "preset.fit.cannot", {"gib": gib if gib is not None else first,
                                               "budget": f"{budget:g}", "preset": label}, gib)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.estimate",
                                     description="Estimate the GPU memory a memtune training config needs.")
    parser.add_argument("--config", help="YAML config (default: the chapter's recipe)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a setting")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--fit", type=float, metavar="GIB", help="shrink batch/length/... to fit this many GiB")
    parser.add_argument("--preset", choices=list(PRESETS), help="apply a preset's memory/speed levers first "
                        f"({', '.join(PRESETS)}), then --set; as python -m core.train does")  # the registry's names
    parser.add_argument("--max-row-tokens", type=int, help="the dataset's longest row in tokens, if known")
    parser.add_argument("--data", action="store_true", help="measure the config's dataset (reads it and the "
                        "model's tokenizer) and size micro-batches for its longest row instead of max_length")
    args = parser.parse_args(argv)
    try:
        cfg = TrainConfig.load(args.config) if args.config else TrainConfig()
        changes = parse_overrides(args.set)
        if args.preset:  # fitted for the final settings, as `python -m core.train` does
            fit = fit_preset(cfg, args.preset, Hardware.detect(), fixed=changes)
            cfg = fit.cfg
            if fit.key:
                print(f"preset {args.preset}: {fit.note()}", file=sys.stderr)
        cfg = cfg.replace(**changes)
        shape = get_shape(cfg.model)
        # vision hook: an image dataset's rows and image tokens, counted by the model's processor
        kw = (vision_terms.measured_images(cfg) if args.data and not args.max_row_tokens else None) or \
            {"max_row_tokens": args.max_row_tokens or (measured_row_tokens(cfg) if args.data else None)}
        if args.fit is not None:
            cfg, est = fit_to_gpu(cfg, int(args.fit * GIB), shape=shape, **kw)
        else:
            est = estimate(cfg, shape, **kw)
    except (ConfigError, ShapeError, FitError, DataError, ImageBudgetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = est.to_json()
        if args.fit is not None:
            out["config"] = {k: getattr(cfg, k) for k in fit_fields() + GENERATION_FIELDS + IMAGE_FIELDS}  # what fit_to_gpu may change
        print(json.dumps(out))
        return 0
    what = "4-bit " + cfg.bnb_4bit_quant_type if cfg.load_in_4bit else cfg.precision
    gpus = f", per GPU of {est.world_size} ({est.strategy})" if est.world_size > 1 else ""
    print(f"{cfg.model} ({what}, LoRA r={cfg.lora_r}), batch {cfg.per_device_train_batch_size} x max_length "
          f"{cfg.max_length}{' packed' if cfg.packing else ''}, optim {cfg.optim}, "
          f"checkpointing {'on' if cfg.gradient_checkpointing else 'off'}{gpus}:")
    print(est.table())
    if args.fit is not None:
        print(f"  fits {args.fit:g} GiB with: batch {cfg.per_device_train_batch_size} x accumulation "
              f"{cfg.gradient_accumulation_steps}, max_length {cfg.max_length}, checkpointing "
              f"{cfg.gradient_checkpointing}, optim {cfg.optim}{sampling_words(cfg)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
