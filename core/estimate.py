"""Will it fit? A GPU-memory estimate of a TrainConfig, from the model's shape alone (no weights, no GPU).

    python -m core.estimate                                   # the chapter's recipe (the defaults)
    python -m core.estimate --config my.yaml --set max_length=1024 --json
    python -m core.estimate --set model=Qwen/Qwen2.5-7B --fit 24  # shrink batch/length to fit a 24 GiB card

The model of memory, for the stack memtune runs (transformers 5 + peft + TRL's SFTTrainer + bitsandbytes):

  weights      NF4/FP4 decoder linears: 0.5 byte/param + absmax (fp32 per 64-block; with double quant 1 byte per
               block + fp32 per 256 blocks), as bitsandbytes' quantize_4bit stores them. Embeddings, lm_head, norms
               and biases stay unquantized: bf16, or fp32 after the recipe's upcast (prepare_model_for_kbit_training).
  load spike   That upcast converts one matrix at a time, so for a moment the last one exists in bf16 and fp32:
               on an 8B Llama-3 this, not training, is the recipe's peak (measured 8.22 GiB allocated).
  LoRA         params + grads (bf16 on a 4-bit base, as TRL casts them; fp32 otherwise, as peft keeps them).
  optimizer    Adam's two moments: 8-bit = 2 bytes/param, 32-bit = 8; torch AdamW keeps the params' dtype.
               Paged states live in CUDA managed memory: NVML counts them, torch's allocator does not.
  activations  Per token per layer, from the tensors autograd keeps (see `layer_bytes_per_token`). With
               checkpointing only each layer's input is kept, plus one layer recomputed during backward.
  logits       TRL 1.16's SFTTrainer computes the loss with a chunked LM head (trl.kernels.chunked_logprob): only
               a 4096 x 32768 tile of logits exists, never batch x length x vocab. A plain `model(labels=...)` loss (full_logits=True)
               keeps the bf16 logits, their fp32 copy, log-softmax and its gradient: ~(2 + 12) bytes x vocab/token.
  allocator    Cached free blocks (reserved - allocated) and the CUDA context (NVML - reserved) are calibrated on
               the measurements in shared/gpu/BASELINE.md (H200, torch 2.11): context ~1.37 GiB.

Tokens per micro-batch = batch x longest row (rows pad to the longest in the batch; packing fills bins of
max_length), so the peak is driven by max_length unless every row is shorter (`max_row_tokens`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field

from core.config import OPTIMIZERS, ConfigError, TrainConfig, apply_overrides
from core.shapes import ModelShape, ShapeError, get_shape

GIB = 2**30

# --- calibration constants (shared/gpu/BASELINE.md, one H200, torch 2.11 + CUDA 13) ---------------------------------
CUDA_CONTEXT = int(1.37 * GIB)  # NVML used - torch reserved, the same (+-0.02) in all eight measured runs
LOAD_CACHE = int(0.26 * GIB)  # blocks the loader leaves cached: reserved - allocated right after from_pretrained
CACHE_BASE = int(0.12 * GIB)  # reserved - allocated during training: a base ...
CACHE_FRACTION = 0.14  # ... plus this share of the activation working set (measured 0.25-1.36 GiB)
LM_HEAD_VOCAB_CHUNK = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE
LM_HEAD_TOKEN_CHUNK = 4096  # trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE


@dataclass
class Estimate:
    """Predicted GPU memory at the peak, in bytes. The components sum to `nvml_peak` (= `total_gib`).

    Everything up to `cuda_context` is the training peak (= `nvml_training`); `load_spike` is what loading needs
    beyond it. `peak_allocated` / `peak_reserved` are what torch.cuda.max_memory_* report over the whole run.
    """

    quantized_weights: int
    unquantized_weights: int
    lora: int  # adapter params + grads
    optimizer: int  # all optimizer state (paged state counts in NVML only)
    activations: int  # kept for the backward pass: layer inputs (checkpointing) or every layer's tensors
    logits: int  # LM head + loss working memory
    temporaries: int  # beyond `logits`: a recomputed layer, its gradients, a dequantized 4-bit weight
    load_spike: int  # how far the GPU memory used while loading (fp32 upcast) exceeds training's; usually 0
    allocator_cache: int  # torch reserved - allocated during training (cached free blocks)
    cuda_context: int  # NVML used - torch reserved (CUDA context, cuBLAS workspaces, ...)
    peak_allocated: int
    peak_reserved: int
    nvml_peak: int
    tokens: int  # per micro-batch
    peak_phase: str  # "training" or "loading"
    nvml_training: int = 0  # NVML peak of the training steps alone (what a sampler started after loading sees)
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
                   peak_phase=self.peak_phase, notes=list(self.notes))
        return out

    def table(self) -> str:
        labels = {
            "quantized_weights": "4-bit weights (decoder linears)",
            "unquantized_weights": "other weights (embeddings, head, norms)",
            "lora": "LoRA params + grads",
            "optimizer": "optimizer state",
            "activations": "activations kept for backward",
            "logits": "LM head + loss",
            "temporaries": "backward temporaries",
            "load_spike": "extra while loading (fp32 upcast)",
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


def _optimizer_bytes(cfg: TrainConfig, n: int, param_bytes: int) -> tuple[int, bool]:
    """(bytes of optimizer state for n trainable params, whether it is paged)."""
    _, eight_bit, paged = OPTIMIZERS.get(cfg.optim, (False, False, False))
    if cfg.optim == "sgd":
        return 0, False
    if cfg.optim == "adafactor":
        return n // 4, False  # factored second moment: rows + columns, a small fraction of n
    if eight_bit:
        return 2 * n + 2 * 4 * -(-n // 256), paged  # two uint8 moments + fp32 absmax per 256-block each
    if paged:  # paged_adamw_32bit: bitsandbytes keeps fp32 moments
        return 8 * n, True
    return 2 * param_bytes * n, False  # torch AdamW: moments in the params' dtype


def layer_bytes_per_token(cfg: TrainConfig, shape: ModelShape) -> tuple[int, int]:
    """(bytes one decoder layer keeps for backward per token, extra bytes its backward needs per token).

    s = residual-stream dtype (fp32 after the upcast: the embedding output is fp32), c = compute dtype (autocast),
    o = dtype of a 4-bit linear's output (bitsandbytes returns its input's dtype, so fp32 after the upcast).
    """
    h, inter, q, kv = shape.hidden_size, shape.intermediate_size, shape.q_dim, shape.kv_dim
    q4 = cfg.load_in_4bit
    c = _bytes(cfg.precision)
    s = 4 if (_upcast(cfg) or cfg.precision == "fp32") else 2
    o = s if q4 else c
    # RMSNorm keeps its fp32 input (a copy if the stream is 16-bit); a 16-bit nn.Linear also keeps its own input
    # (the norm output), a 4-bit one does not (bitsandbytes' MatMul4Bit saves only the weight).
    norm = 4 * h + (0 if q4 else c * h)
    norms = 2 * norm + max(0, shape.norms_per_layer - 2) * 4 * h
    # SDPA / flash attention keeps q, k, v, its output (and the reshaped copy a 16-bit o_proj keeps).
    attn = c * (2 * q + 2 * kv) + (0 if q4 else c * q)
    # SwiGLU keeps gate, act(gate), up; a 16-bit down_proj also keeps their product. Liger's fused SwiGLU
    # recomputes act(gate) in the backward pass.
    mlp = (2 if cfg.use_liger_kernel else 3) * o * inter + (0 if q4 else c * inter)
    # LoRA keeps its dropout output (compute dtype) and the dropout mask (1 byte) for each adapted layer.
    dims = shape.module_dims()
    per_in = c + (1 if cfg.lora_dropout > 0 else 0)
    lora = sum(per_in * dims[t][0] for t in cfg.lora_target_modules if t in dims)
    saved = norms + attn + mlp + lora
    # Backward of the MLP holds the gradients of the product, act(gate) and up at once (+ a compute-dtype copy),
    # and the residual stream's gradient (two copies).
    backward = (1 if cfg.use_liger_kernel else 2) * o * inter + c * inter + 2 * s * h
    return saved, backward


def _resolve_shape(cfg: TrainConfig, shape: ModelShape | None) -> ModelShape:
    return shape if shape is not None else get_shape(cfg.model)


def estimate(cfg: TrainConfig, shape: ModelShape | None = None, *, max_row_tokens: int | None = None,
             full_logits: bool = False) -> Estimate:
    """Predict the GPU memory of training `cfg` (peak allocated, peak reserved and NVML peak).

    `max_row_tokens`: the longest row of the dataset in tokens, when known (default: rows reach max_length).
    `full_logits`: the loss materialises batch x length x vocab logits (a plain loss; not TRL's SFTTrainer).
    """
    shape = _resolve_shape(cfg, shape)
    notes: list[str] = []
    q4 = cfg.load_in_4bit
    c = _bytes(cfg.precision)
    upcast = _upcast(cfg)
    row = cfg.max_length if not max_row_tokens else max(1, min(cfg.max_length, max_row_tokens))
    batch = cfg.per_device_train_batch_size
    tokens = batch * row
    h, layers, vocab = shape.hidden_size, shape.num_hidden_layers, shape.vocab_size

    # Weights
    dims = shape.module_dims()
    if q4:
        quantized = layers * sum(nf4_bytes(a * b, cfg.bnb_4bit_use_double_quant) for a, b in dims.values())
        other_dtype = 4 if (upcast or cfg.precision == "fp32") else 2
        unquantized = other_dtype * shape.unquantized_params
    else:
        quantized = 0
        unquantized = c * shape.total_params
        other_dtype = c

    # LoRA: TRL casts the adapters of a quantized model to bf16; peft keeps them fp32 on a 16-bit base.
    n_lora = shape.lora_params(cfg.lora_r, cfg.lora_target_modules)
    lora_dtype = 2 if q4 else 4
    lora = 2 * lora_dtype * n_lora
    if not q4 and c == 2:
        lora += 2 * n_lora  # autocast caches bf16 copies of the fp32 adapter weights during the step
    optimizer, paged = _optimizer_bytes(cfg, n_lora, lora_dtype)

    # Activations
    saved, backward = layer_bytes_per_token(cfg, shape)
    s = 4 if (upcast or cfg.precision == "fp32") else 2
    dequant = c * shape.largest_linear if q4 else 0  # bitsandbytes dequantizes a whole weight per matmul
    mask = batch * row * row if (batch > 1 and not cfg.packing) else 0  # padded batches carry a 4-D bool mask
    if cfg.gradient_checkpointing:
        activations = layers * s * h * tokens + mask
        layer_phase = (saved + backward) * tokens + dequant
    else:
        activations = layers * saved * tokens + mask
        layer_phase = backward * tokens + dequant

    # LM head + loss
    if full_logits and not cfg.use_liger_kernel:
        logits = tokens * vocab * (c + 12) + tokens * (s + 4) * h
        notes.append("full logits: the loss keeps batch x length x vocab logits in fp32")
    else:
        tile = min(tokens, LM_HEAD_TOKEN_CHUNK) * min(vocab, LM_HEAD_VOCAB_CHUNK) * c
        weight_cast = min(vocab, LM_HEAD_VOCAB_CHUNK) * h * c if other_dtype != c else 0
        logits = tile + weight_cast + tokens * (s + 4) * h  # + the kept hidden states and their fp32 gradient
    temporaries = max(0, layer_phase - logits)

    optimizer_torch = 0 if paged else optimizer
    static = quantized + unquantized + lora + optimizer_torch
    working = activations + logits + temporaries
    train_alloc = static + working
    train_reserved = train_alloc + CACHE_BASE + int(CACHE_FRACTION * working)

    # Loading: the fp32 upcast converts one matrix at a time; the bf16 copy of the first is freed but stays cached.
    if upcast:
        big = [shape.embed_params] + ([shape.head_params] if shape.head_params else [])
        load_alloc = quantized + unquantized + 2 * big[-1]
        load_reserved = load_alloc + (2 * big[0] if len(big) > 1 else 0) + LOAD_CACHE
    else:
        load_alloc = quantized + unquantized
        load_reserved = load_alloc + LOAD_CACHE
    peak_allocated = max(train_alloc, load_alloc)
    peak_reserved = max(train_reserved, load_reserved)
    paged_bytes = optimizer - optimizer_torch  # created with the optimizer: absent while loading
    nvml_training = train_reserved + CUDA_CONTEXT + paged_bytes
    nvml = max(nvml_training, load_reserved + CUDA_CONTEXT)
    phase = "loading" if nvml > nvml_training else "training"
    if phase == "loading":
        notes.append("the peak is the fp32 upcast while loading, not training: upcast_to_fp32=false avoids it")
    if paged_bytes:
        notes.append("paged optimizer state lives in CUDA managed memory: it can spill to CPU RAM under pressure")
    return Estimate(
        quantized_weights=quantized, unquantized_weights=unquantized, lora=lora, optimizer=optimizer,
        activations=activations, logits=logits, temporaries=temporaries, load_spike=nvml - nvml_training,
        allocator_cache=train_reserved - train_alloc, cuda_context=CUDA_CONTEXT, peak_allocated=peak_allocated,
        peak_reserved=peak_reserved, nvml_peak=nvml, tokens=tokens, peak_phase=phase, notes=notes,
        nvml_training=nvml_training)


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


# --- CLI ------------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.estimate",
                                     description="Estimate the GPU memory a memtune training config needs.")
    parser.add_argument("--config", help="YAML config (default: the chapter's recipe)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a setting")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--fit", type=float, metavar="GIB", help="shrink batch/length/... to fit this many GiB")
    parser.add_argument("--max-row-tokens", type=int, help="the dataset's longest row in tokens, if known")
    args = parser.parse_args(argv)
    try:
        cfg = TrainConfig.load(args.config) if args.config else TrainConfig()
        cfg = apply_overrides(cfg, args.set)
        shape = get_shape(cfg.model)
        kw = {"max_row_tokens": args.max_row_tokens}
        if args.fit is not None:
            cfg, est = fit_to_gpu(cfg, int(args.fit * GIB), shape=shape, **kw)
        else:
            est = estimate(cfg, shape, **kw)
    except (ConfigError, ShapeError, FitError) as exc:
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
