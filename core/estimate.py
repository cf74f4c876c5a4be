"""Will it fit? A GPU-memory estimate of a TrainConfig, from the model's shape alone (no weights, no GPU).

    python -m core.estimate                                   # the chapter's recipe (the defaults)
    python -m core.estimate --config my.yaml --set max_length=1024 --json
    python -m core.estimate --set model=Qwen/Qwen2.5-7B --fit 24  # shrink batch/length to fit a 24 GiB card
    python -m core.estimate --config my.yaml --preset lowest_memory --data  # sized for the dataset's real rows

The model of memory, for the stack memtune runs (transformers 5 + peft + TRL's SFTTrainer + bitsandbytes). Every
term is a tensor that exists on the GPU; `bench/validate_estimate.py` checks the sum against every measured run of
bench/grid_measured.json (H200, torch 2.11) and bench/RESULTS.md shows the table.

  weights      NF4/FP4 decoder linears: 0.5 byte/param + absmax (fp32 per 64-block; with double quant 1 byte per
               block + fp32 per 256 blocks), as bitsandbytes' quantize_4bit stores them. Embeddings, lm_head, norms
               and biases stay unquantized: bf16, or fp32 after the recipe's upcast (prepare_model_for_kbit_training).
               `offload_embeddings` keeps the input embedding in CPU memory (not when tied to the head).
  load spike   The upcast converts one matrix at a time, so for a moment the last one exists in bf16 and fp32:
               on an 8B Llama-3 this, not training, is the recipe's peak (measured 8.22-8.31 GiB allocated). The
               offloaded embedding is loaded to the GPU first, so loading is lowest_memory's peak too.
  LoRA         params + grads (bf16 on a 4-bit base, as TRL casts them; fp32 otherwise, as peft keeps them).
  optimizer    Adam's two moments: 8-bit = 2 bytes/param, 32-bit = 8; torch AdamW keeps the params' dtype.
               bitsandbytes pages (CUDA managed memory: NVML counts it, torch's allocator does not) only state
               tensors of >= 1e5 elements: LoRA matrices of a 70B model, none of an 8B one at r=16.
  activations  What autograd keeps per token and layer (`layer_bytes_per_token`): the RMSNorms' inputs, the
               LoRA inputs, attention's q/k/v/output (k and v repeated to all heads when a mask is passed), the
               MLP's gate/up (and act(gate) without liger's fused SwiGLU). 4-bit and frozen 16-bit linears keep
               nothing. With checkpointing only each layer's input is kept, plus one layer recomputed in backward.
  masks        With packing, transformers' SDPA path builds a block-diagonal [T, T] mask (T = tokens per
               micro-batch) and SDPA turns it into a [T, T] compute-dtype bias that every layer keeps for its
               backward: 2 T^2 bytes per layer (1.0 GiB at 4,096 tokens on 32 layers). Padded batches likewise
               (batch x length^2). Per-row (varlen) attention has none.
  logits       TRL 1.16's SFTTrainer computes the loss with a chunked LM head (trl.kernels.chunked_logprob): only
               a 4096 x 32768 tile of logits exists, never batch x length x vocab. A plain `model(labels=...)` loss
               (full_logits=True) keeps the bf16 logits, their fp32 copy, log-softmax and its gradient.
  allocator    Cached free blocks (reserved - allocated) grow with the working set; less with expandable
               segments. The CUDA context + cuBLAS/cuDNN (NVML - reserved) is 1.37 GiB on an H200 with torch 2.11.

Tokens per micro-batch = batch x max_length (rows pad to the longest in the batch; with packing a micro-batch is
`batch` packs of up to max_length tokens), unless every row is shorter (`max_row_tokens`).

The liger-kernel switch (`use_liger_kernel`) means its RMSNorm, SwiGLU and RoPE in the layers and its fused loss.
`liger_layers=` overrides the first part: liger patches transformers' Llama module for the whole process, so a
Llama model built after a liger run in the same process has liger's layers whatever its own setting.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field

from core.config import OPTIMIZERS, ConfigError, Hardware, TrainConfig, apply_overrides
from core.datafiles import DataError
from core.presets import PRESETS, apply_preset
from core.shapes import ModelShape, ShapeError, get_shape

GIB = 2**30

# --- calibration constants (H200, torch 2.11 + CUDA 13; bench/RESULTS.md, shared/gpu/BASELINE.md) -------------------
CUDA_CONTEXT = int(1.37 * GIB)  # NVML used - torch reserved - paged optimizer state: 1.36-1.39 in every clean run
CUBLAS_WORKSPACE = 64 * 2**20  # cuBLAS + cuBLASLt workspaces (32 MiB each on Hopper), allocated on the first matmul
LOAD_CACHE = int(0.26 * GIB)  # blocks the loader leaves cached: reserved - allocated right after from_pretrained
LOAD_CACHE_FRACTION = 0.05  # ... at most this share of what was loaded (8B: 0.26 of 5.3 GiB; a tiny model: ~0)
CACHE_BASE = int(0.06 * GIB)  # reserved - allocated during training: a base ...
CACHE_FRACTION = 0.075  # ... plus this share of the working set (activations, logits, temporaries)
CACHE_FRACTION_EXPANDABLE = 0.04  # with expandable_segments (measured 0.04 on `fastest`, 0.05 on 70B)
LM_HEAD_VOCAB_CHUNK = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE
LM_HEAD_TOKEN_CHUNK = 4096  # trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE
PAGED_MIN_NUMEL = 100_000  # bitsandbytes Optimizer8bit.get_state_buffer pages only tensors at least this large
ATTENTIONS = ("sdpa", "varlen")


@dataclass
class Estimate:
    """Predicted GPU memory at the peak, in bytes. The components sum to `nvml_peak` (= `total_gib`).

    Everything up to `cuda_context` is the training peak (= `nvml_training`); `load_spike` is what loading needs
    beyond it. `peak_allocated` / `peak_reserved` are what torch.cuda.max_memory_* report over the whole run.
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
    cpu_offloaded: int = 0  # bytes kept in CPU memory instead (offload_embeddings)
    notes: list[str] = field(default_factory=list)

    COMPONENTS = ("quantized_weights", "unquantized_weights", "lora", "optimizer", "activations", "logits",
                  "temporaries", "allocator_cache", "cuda_context", "load_spike")

    @property
    def total(self) -> int:
        return self.nvml_peak

    @property
    def total_gib(self) -> float:
        return self.nvml_peak / GIB

    @property
    def peak_allocated_gib(self) -> float:
        return self.peak_allocated / GIB

    @property
    def peak_reserved_gib(self) -> float:
        return self.peak_reserved / GIB

    def components(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.COMPONENTS}

    def to_json(self) -> dict:
        out = {"total_gib": round(self.total_gib, 3)}
        out.update({f"{k}_gib": round(v / GIB, 3) for k, v in self.components().items()})
        out.update(peak_allocated_gib=round(self.peak_allocated_gib, 3),
                   peak_reserved_gib=round(self.peak_reserved_gib, 3), nvml_peak_gib=round(self.total_gib, 3),
                   nvml_training_gib=round(self.nvml_training / GIB, 3), tokens_per_micro_batch=self.tokens,
                   cpu_offloaded_gib=round(self.cpu_offloaded / GIB, 3), peak_phase=self.peak_phase,
                   notes=list(self.notes))
        return out

    def table(self) -> str:
        labels = {
            "quantized_weights": "4-bit weights (decoder linears)",
            "unquantized_weights": "other weights (embeddings, head, norms)",
            "lora": "LoRA params + grads",
            "optimizer": "optimizer state",
            "activations": "activations kept for backward",
            "logits": "LM head + loss",
            "temporaries": "backward temporaries, cuBLAS workspace",
            "load_spike": "extra while loading",
            "allocator_cache": "PyTorch cache (reserved - allocated)",
            "cuda_context": "CUDA context + libraries",
        }
        lines = [f"  {labels[k]:<42} {v / GIB:7.2f} GiB" for k, v in self.components().items()
                 if k != "load_spike" and (v or k in ("unquantized_weights", "activations"))]
        if self.load_spike:
            lines.append(f"  {'= training peak':<42} {self.nvml_training / GIB:7.2f} GiB")
            lines.append(f"  {labels['load_spike']:<42} {self.load_spike / GIB:7.2f} GiB")
        lines.append(f"  {'total (GPU memory used, NVML peak)':<42} {self.total_gib:7.2f} GiB")
        lines.append(f"  peak allocated {self.peak_allocated_gib:.2f} GiB, peak reserved {self.peak_reserved_gib:.2f} "
                     f"GiB (peak while {self.peak_phase}); {self.tokens} tokens per micro-batch")
        if self.cpu_offloaded:
            lines.append(f"  in CPU memory instead: {self.cpu_offloaded / GIB:.2f} GiB (input embedding)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


# --- the arithmetic -------------------------------------------------------------------------------------------------
def nf4_bytes(n: int, double_quant: bool, blocksize: int = 64) -> int:
    """Bytes bitsandbytes stores for one n-element 4-bit weight (packed data + quantization constants)."""
    blocks = -(-n // blocksize)
    packed = (n + 1) // 2
    if double_quant:  # absmax quantized to 8 bits in blocks of 256, + fp32 absmax per block, code table, offset
        return packed + blocks + 4 * -(-blocks // 256) + 4 * 256 + 4 + 64
    return packed + 4 * blocks + 64


def _bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def _upcast(cfg: TrainConfig) -> bool:
    """memtune's engine upcasts (prepare_model_for_kbit_training) only a 4-bit model, and only when asked."""
    return cfg.load_in_4bit and cfg.upcast_to_fp32 and cfg.precision != "fp32"


def _lora_matrices(shape: ModelShape, cfg: TrainConfig) -> list[int]:
    """Element counts of one layer's LoRA matrices (A: r x in, B: out x r) for the targeted modules."""
    dims = shape.module_dims()
    return [n for t in cfg.lora_target_modules if t in dims for n in (cfg.lora_r * dims[t][0], cfg.lora_r * dims[t][1])]


def _optimizer_bytes(cfg: TrainConfig, shape: ModelShape, param_bytes: int) -> tuple[int, int]:
    """(bytes of optimizer state for the LoRA params, how many of them bitsandbytes pages)."""
    _, eight_bit, paged = OPTIMIZERS.get(cfg.optim, (False, False, False))
    matrices = _lora_matrices(shape, cfg)
    n = shape.num_hidden_layers * sum(matrices)
    if cfg.optim == "sgd":
        return 0, 0
    if cfg.optim == "adafactor":
        return n // 4, 0  # factored second moment: rows + columns, a small fraction of n
    if eight_bit:
        def per(m: int) -> int:
            return 2 * m + 2 * 4 * -(-m // 256)  # two uint8 moments + fp32 absmax per 256-block each
    elif paged:  # paged_adamw_32bit: bitsandbytes keeps fp32 moments
        def per(m: int) -> int:
            return 8 * m
    else:  # torch AdamW: moments in the params' dtype
        return 2 * param_bytes * n, 0
    total = shape.num_hidden_layers * sum(per(m) for m in matrices)
    paged_bytes = shape.num_hidden_layers * sum(per(m) for m in matrices if m >= PAGED_MIN_NUMEL) if paged else 0
    return total, paged_bytes


@dataclass(frozen=True)
class _Dtypes:
    c: int  # compute dtype (autocast): what attention, LoRA and the logits tile use
    s: int  # residual stream: fp32 after the upcast (the embedding output is fp32), else the compute dtype
    o: int  # output of a decoder linear: bitsandbytes returns its input's dtype (so s); a 16-bit one, c


def _dtypes(cfg: TrainConfig) -> _Dtypes:
    c = _bytes(cfg.precision)
    s = 4 if (_upcast(cfg) or cfg.precision == "fp32") else c
    return _Dtypes(c=c, s=s, o=s if cfg.load_in_4bit else c)


def _masked(cfg: TrainConfig, attention: str, batch: int, equal_length_rows: bool) -> bool:
    """Whether attention gets an explicit mask (a packed or padded micro-batch under SDPA)."""
    if attention == "varlen":
        return False
    return cfg.packing or (batch > 1 and not equal_length_rows)


def layer_bytes_per_token(cfg: TrainConfig, shape: ModelShape, *, liger_layers: bool | None = None,
                          kv_repeated: bool = False) -> tuple[int, int]:
    """(bytes one decoder layer keeps for backward per token, extra bytes its backward needs per token).

    `kv_repeated`: attention is called with a mask, so transformers repeats the key/value heads to all query
    heads before SDPA (no native GQA) and k, v are kept at the query width (also what varlen ran with here).
    """
    liger = cfg.use_liger_kernel if liger_layers is None else liger_layers
    d = _dtypes(cfg)
    h, inter, q, kv = shape.hidden_size, shape.intermediate_size, shape.q_dim, shape.kv_dim
    # RMSNorm: the eager one keeps an fp32 copy of its input (+ 1/rms); liger's keeps the input as it is.
    norm = (d.s * h if liger else 4 * h) + 4
    norms = shape.norms_per_layer * norm
    # Attention (SDPA / FlashAttention) keeps q, k, v, its output (compute dtype) and fp32 log-sum-exp per head.
    k_width = q if kv_repeated else kv
    attn = d.c * (2 * q + 2 * k_width) + 4 * shape.num_attention_heads
    # SwiGLU keeps gate and up (liger's fused kernel recomputes act(gate) in backward), the eager MLP act(gate) too.
    mlp = (2 if liger else 3) * d.o * inter
    # LoRA keeps its input: with dropout, each adapted layer its own dropout output (compute dtype) + 1-byte mask;
    # without, the modules reading one tensor share it (q,k,v read the norm output; gate,up the second norm's) when
    # it is already in the compute dtype, else each keeps its own autocast copy. o_proj's input is attention's
    # output, which attention keeps anyway. Plus the r-wide LoRA intermediate of each adapted layer.
    dims = shape.module_dims()
    targets = [t for t in cfg.lora_target_modules if t in dims]
    lora = 0
    if cfg.lora_dropout > 0:
        lora = sum((d.c + 1) * dims[t][0] for t in targets)
    else:
        groups = {"attn_in": ("q_proj", "k_proj", "v_proj"), "mlp_in": ("gate_proj", "up_proj")}
        for members in groups.values():
            n = sum(t in targets for t in members)
            if n:
                lora += d.c * h * (1 if d.s == d.c else n)
        if "down_proj" in targets:
            lora += d.c * inter
    lora += sum(d.c * cfg.lora_r for _ in targets)
    saved = norms + attn + mlp + lora
    # Backward of the MLP holds the gradient of the gate*up product (and, unfused, the second gradient of the
    # multiply at the same time) and the residual stream's gradient (two copies).
    backward = (1 if liger else 2) * d.o * inter + 2 * d.s * h
    return saved, backward


def _resolve_shape(cfg: TrainConfig, shape: ModelShape | None) -> ModelShape:
    return shape if shape is not None else get_shape(cfg.model)


def estimate(cfg: TrainConfig, shape: ModelShape | None = None, *, max_row_tokens: int | None = None,
             full_logits: bool = False, liger_layers: bool | None = None, attention: str | None = None,
             equal_length_rows: bool = False) -> Estimate:
    """Predict the GPU memory of training `cfg` (peak allocated, peak reserved and NVML peak).

    `max_row_tokens`: the longest row of the dataset in tokens, when known (default: rows reach max_length).
    `full_logits`: the loss materialises batch x length x vocab logits (a plain loss; not TRL's SFTTrainer).
    `liger_layers`: liger's RMSNorm/SwiGLU/RoPE are in the model (default: `cfg.use_liger_kernel`).
    `attention`: "sdpa" (default; or the config's `attention` field where it has one) or "varlen" (per packed row).
    `equal_length_rows`: every row of a micro-batch has the same length, so an unpacked batch needs no padding mask.
    """
    shape = _resolve_shape(cfg, shape)
    attention = attention or getattr(cfg, "attention", None) or "sdpa"
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, not {attention!r}")
    liger = cfg.use_liger_kernel if liger_layers is None else liger_layers
    notes: list[str] = []
    q4 = cfg.load_in_4bit
    d = _dtypes(cfg)
    upcast = _upcast(cfg)
    row = cfg.max_length if not max_row_tokens else max(1, min(cfg.max_length, max_row_tokens))
    batch = cfg.per_device_train_batch_size
    tokens = batch * row
    if max_row_tokens:
        cut = ", cut to max_length" if max_row_tokens > cfg.max_length else ""
        notes.append(f"sized for the dataset's real rows: micro-batches of {batch} x {row} tokens (its longest "
                     f"row is {max_row_tokens:,} tokens{cut})")
    else:
        notes.append(f"assumes every micro-batch is {batch} x max_length {cfg.max_length} tokens (the dataset's "
                     "lengths are unknown; shorter rows need less)")
    h, layers, vocab = shape.hidden_size, shape.num_hidden_layers, shape.vocab_size

    # Weights
    dims = shape.module_dims()
    other_dtype = 4 if (upcast or cfg.precision == "fp32") else d.c
    if q4:
        quantized = layers * sum(nf4_bytes(a * b, cfg.bnb_4bit_use_double_quant) for a, b in dims.values())
        unquantized = other_dtype * shape.unquantized_params
    else:
        quantized = 0
        unquantized = d.c * shape.total_params
    # offload_embeddings: the frozen input embedding stays in CPU memory (core.model.CpuEmbedding), not when tied.
    offloaded = other_dtype * shape.embed_params if (cfg.offload_embeddings and shape.head_params) else 0
    if offloaded:
        notes.append(f"the input embedding ({offloaded / GIB:.2f} GiB) is kept in CPU memory; it is on the GPU "
                     "while loading")

    # LoRA: TRL casts the adapters of a quantized model to bf16; peft keeps them fp32 on a 16-bit base.
    n_lora = shape.lora_params(cfg.lora_r, cfg.lora_target_modules)
    lora_dtype = 2 if q4 else 4
    lora = 2 * lora_dtype * n_lora
    if not q4 and d.c == 2:
        lora += 2 * n_lora  # autocast caches bf16 copies of the fp32 adapter weights during the step
    optimizer, paged_bytes = _optimizer_bytes(cfg, shape, lora_dtype)

    # Activations
    masked = _masked(cfg, attention, batch, equal_length_rows)
    saved, backward = layer_bytes_per_token(cfg, shape, liger_layers=liger, kv_repeated=masked or attention == "varlen")
    dequant = d.c * shape.largest_linear if q4 else 0  # bitsandbytes dequantizes a whole weight per matmul
    # An explicit mask: a bool [T, T] (packed; batch x [L, L] padded) shared by the layers, and the compute-dtype
    # bias SDPA makes of it, kept by every layer that has run forward (one layer with checkpointing).
    mask_elems = (tokens * tokens if cfg.packing else batch * row * row) if masked else 0
    mask_kept = mask_elems + d.c * mask_elems * (1 if cfg.gradient_checkpointing else layers)
    if cfg.gradient_checkpointing:
        activations = layers * d.s * h * tokens + mask_kept
        layer_phase = (saved + backward) * tokens + dequant
    else:
        activations = layers * saved * tokens + mask_kept
        layer_phase = backward * tokens + dequant

    # LM head + loss: the final norm's kept input, its output, TRL's compact copy of the labelled positions and the
    # fp32 gradient of it (+ its cast back), a logits tile, and the head cast to the compute dtype per vocab chunk.
    final_norm = (d.s * h if liger else 4 * h) + 4
    if full_logits and not cfg.use_liger_kernel:
        logits = tokens * vocab * (d.c + 12) + tokens * (final_norm + (d.s + 4) * h)
        notes.append("full logits: the loss keeps batch x length x vocab logits in fp32")
    else:
        tile = min(tokens, LM_HEAD_TOKEN_CHUNK) * min(vocab, LM_HEAD_VOCAB_CHUNK) * d.c
        weight_cast = min(vocab, LM_HEAD_VOCAB_CHUNK) * h * d.c if other_dtype != d.c else 0
        logits = tile + weight_cast + tokens * (final_norm + 3 * d.s * h + 4 * h)
    temporaries = max(0, layer_phase - logits) + CUBLAS_WORKSPACE

    optimizer_torch = optimizer - paged_bytes
    static = quantized + unquantized - offloaded + lora + optimizer_torch
    working = activations + logits + temporaries - CUBLAS_WORKSPACE
    train_alloc = static + working + CUBLAS_WORKSPACE
    fraction = CACHE_FRACTION_EXPANDABLE if cfg.expandable_segments else CACHE_FRACTION
    train_reserved = train_alloc + CACHE_BASE + int(fraction * working)

    # Loading: the fp32 upcast converts one matrix at a time; the bf16 copy of the first is freed but stays cached.
    # An offloaded embedding is loaded to the GPU first and moved afterwards.
    base = quantized + unquantized + CUBLAS_WORKSPACE  # the workspace stays from an earlier run of the process
    load_cache = min(LOAD_CACHE, int(LOAD_CACHE_FRACTION * (quantized + unquantized)))
    if upcast:
        big = [shape.embed_params] + ([shape.head_params] if shape.head_params else [])
        load_alloc = base + 2 * big[-1]
        load_reserved = load_alloc + (2 * big[0] if len(big) > 1 else 0) + load_cache
    else:
        load_alloc = base
        load_reserved = load_alloc + load_cache
    peak_allocated = max(train_alloc, load_alloc)
    peak_reserved = max(train_reserved, load_reserved)
    nvml_training = train_reserved + CUDA_CONTEXT + paged_bytes  # paged state: created with the optimizer
    nvml = max(nvml_training, load_reserved + CUDA_CONTEXT)
    phase = "loading" if nvml > nvml_training else "training"
    if phase == "loading":
        if upcast:
            notes.append("the peak is the fp32 upcast while loading, not training: upcast_to_fp32=false avoids it")
        else:
            notes.append("the peak is while loading the model, not training")
    if paged_bytes:
        notes.append("paged optimizer state lives in CUDA managed memory: it can spill to CPU RAM under pressure")
    if masked and cfg.packing and not cfg.gradient_checkpointing and mask_elems:
        notes.append(f"SDPA keeps a {tokens} x {tokens} mask per layer over a packed micro-batch "
                     f"({d.c * mask_elems * layers / GIB:.2f} GiB here)")
    return Estimate(
        quantized_weights=quantized, unquantized_weights=unquantized - offloaded, lora=lora, optimizer=optimizer,
        activations=activations, logits=logits, temporaries=temporaries, load_spike=nvml - nvml_training,
        allocator_cache=train_reserved - train_alloc, cuda_context=CUDA_CONTEXT, peak_allocated=peak_allocated,
        peak_reserved=peak_reserved, nvml_peak=nvml, tokens=tokens, peak_phase=phase, notes=notes,
        nvml_training=nvml_training, cpu_offloaded=offloaded)


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
        if self.saved_gib < 0.05:
            return "saves nothing here"
        return f"saves {self.saved_gib:.1f} GiB here"


def savings(cfg: TrainConfig, shape: ModelShape | None = None, **kw) -> list[ItemSaving]:
    """For each of the chapter's seven checklist items, the GiB it saves at the current settings (on vs off)."""
    from core.checklist import ITEMS, toggle

    shape = _resolve_shape(cfg, shape)
    out = []
    for item in ITEMS:
        on_total = estimate(toggle(cfg, item.key, True), shape, **kw).nvml_peak
        off_total = estimate(toggle(cfg, item.key, False), shape, **kw).nvml_peak
        out.append(ItemSaving(item.key, item.label, bool(item.is_on(cfg)), off_total - on_total))
    return out


# --- fit to a budget ------------------------------------------------------------------------------------------------
class FitError(ValueError):
    """Nothing memtune may change fits the budget; the message gives the smallest need found."""


def _lengths(max_length: int, floor: int = 64) -> list[int]:
    out, length = [], max_length
    while True:
        out.append(length)
        if length <= floor:
            return out
        length = max(floor, length // 2)


def fit_to_gpu(cfg: TrainConfig, budget_bytes: int, margin: float = 0.1, shape: ModelShape | None = None,
               **kw) -> tuple[TrainConfig, Estimate]:
    """The config closest to `cfg` whose predicted NVML peak fits `budget_bytes` with `margin` to spare.

    Changes only the micro-batch (keeping batch x accumulation via accumulation), max_length (never above the
    user's; shortened last, since it truncates rows), gradient checkpointing and the optimizer (8-bit paged).
    """
    shape = _resolve_shape(cfg, shape)
    limit = budget_bytes * (1.0 - margin)
    effective = cfg.effective_batch_size
    optims = [cfg.optim] + ([] if OPTIMIZERS.get(cfg.optim, (0, 0, 0))[1] else ["paged_adamw_8bit"])
    ckpts = [cfg.gradient_checkpointing] + ([] if cfg.gradient_checkpointing else [True])
    variants = [(g, o) for g in ckpts for o in optims]
    variants.sort(key=lambda v: (v[0] != cfg.gradient_checkpointing, v[1] != cfg.optim))
    last: tuple[TrainConfig, Estimate] | None = None
    for length in _lengths(cfg.max_length):
        batches, b = [], cfg.per_device_train_batch_size
        while b >= 1:
            batches.append(b)
            b //= 2
        for b in batches:
            for ckpt, optim in variants:
                cand = cfg.replace(max_length=length, per_device_train_batch_size=b,
                                   gradient_accumulation_steps=max(1, -(-effective // b)),
                                   gradient_checkpointing=ckpt, optim=optim)
                est = estimate(cand, shape, **kw)
                if est.nvml_peak <= limit:
                    return cand, est
                last = (cand, est)
    cand, est = last  # the smallest setting: batch 1, the shortest length, checkpointing, 8-bit optimizer
    need = est.nvml_peak / (1.0 - margin)
    if cfg.load_in_4bit and cfg.upcast_to_fp32 and est.peak_phase == "loading":
        advice = "The peak is the fp32 upcast while loading: turn upcast_to_fp32 off, or pick a smaller model."
    elif not cfg.load_in_4bit:
        advice = "Turn on load_in_4bit (QLoRA), or pick a smaller model."
    else:
        advice = "Pick a smaller model."
    raise FitError(
        f"Nothing fits in {budget_bytes / GIB:.1f} GiB with a {margin:.0%} margin. The smallest setting tried "
        f"(batch 1, max_length {cand.max_length}, gradient checkpointing "
        f"{'on' if cand.gradient_checkpointing else 'off'}, {cand.optim}) needs {est.total_gib:.1f} GiB, so a GPU with at least {need / GIB:.1f} GiB. {advice}")


# --- the dataset's real lengths -------------------------------------------------------------------------------------
def measured_row_tokens(cfg: TrainConfig) -> int | None:
    """The longest row of cfg's dataset in tokens (read and tokenized as training will), for `max_row_tokens`;
    None with packing, where a micro-batch is packs of up to max_length whatever the rows."""
    if cfg.packing:
        return None
    from core import data
    from core.model import load_tokenizer

    raw, fmt = data.check_data(cfg)
    try:
        tokenizer = load_tokenizer(cfg)
    except Exception as exc:  # noqa: BLE001 - an uncached or gated model: the estimate itself needs no tokenizer
        raise DataError(f"Measuring {cfg.dataset} needs the tokenizer of {cfg.model}, which could not be loaded "
                        f"({type(exc).__name__}: {exc}). Leave out --data, or give --max-row-tokens.") from None
    return data.plan_rows(cfg, tokenizer, raw, fmt, n_examples=0).longest_row or None


# --- CLI ------------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.estimate",
                                     description="Estimate the GPU memory a memtune training config needs.")
    parser.add_argument("--config", help="YAML config (default: the chapter's recipe)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a setting")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--fit", type=float, metavar="GIB", help="shrink batch/length/... to fit this many GiB")
    parser.add_argument("--preset", choices=list(PRESETS), help="apply a preset's memory/speed levers first "
                        "(chapter, lowest_memory, fastest), then --set; as python -m core.train does")
    parser.add_argument("--max-row-tokens", type=int, help="the dataset's longest row in tokens, if known")
    parser.add_argument("--data", action="store_true", help="measure the config's dataset (reads it and the "
                        "model's tokenizer) and size micro-batches for its longest row instead of max_length")
    args = parser.parse_args(argv)
    try:
        cfg = TrainConfig.load(args.config) if args.config else TrainConfig()
        if args.preset:
            cfg = apply_preset(cfg, args.preset, Hardware.detect())
        cfg = apply_overrides(cfg, args.set)
        shape = get_shape(cfg.model)
        kw = {"max_row_tokens": args.max_row_tokens or (measured_row_tokens(cfg) if args.data else None)}
        if args.fit is not None:
            cfg, est = fit_to_gpu(cfg, int(args.fit * GIB), shape=shape, **kw)
        else:
            est = estimate(cfg, shape, **kw)
    except (ConfigError, ShapeError, FitError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = est.to_json()
        if args.fit is not None:
            out["config"] = {k: getattr(cfg, k) for k in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                                          "max_length", "gradient_checkpointing", "optim")}
        print(json.dumps(out))
        return 0
    what = "4-bit " + cfg.bnb_4bit_quant_type if cfg.load_in_4bit else cfg.precision
    print(f"{cfg.model} ({what}, LoRA r={cfg.lora_r}), batch {cfg.per_device_train_batch_size} x max_length "
          f"{cfg.max_length}{' packed' if cfg.packing else ''}, optim {cfg.optim}, "
          f"checkpointing {'on' if cfg.gradient_checkpointing else 'off'}:")
    print(est.table())
    if args.fit is not None:
        print(f"  fits {args.fit:g} GiB with: batch {cfg.per_device_train_batch_size} x accumulation "
              f"{cfg.gradient_accumulation_steps}, max_length {cfg.max_length}, checkpointing "
              f"{cfg.gradient_checkpointing}, optim {cfg.optim}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
