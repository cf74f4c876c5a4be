"""The arithmetic behind core.estimate.predict: what one training process keeps on its GPU, term by term.

The model of memory, for the stack memtune runs (transformers 5 + peft + TRL's SFTTrainer + bitsandbytes). Every
term is a tensor that exists on the GPU; `bench/validate_estimate.py` checks the sum against every measured run of
bench/grid_measured.json (H200, torch 2.11) and bench/RESULTS.md shows the table.

  weights      NF4/FP4 decoder linears: 0.5 byte/param + absmax (fp32 per 64-block; with double quant 1 byte per
               block + fp32 per 256 blocks), as bitsandbytes' quantize_4bit stores them. Embeddings, lm_head, norms
               and biases stay unquantized: bf16, or fp32 after the recipe's upcast (prepare_model_for_kbit_training).
               `offload_embeddings` keeps the input embedding in CPU memory (not when tied to the head).
               `quantize_output_head` stores the untied head in NF4 too, in blocks of QUANTIZED_HEAD_ROWS rows,
               and TRL's fused head then dequantizes one such block per vocabulary chunk.
  load spike   The upcast converts one matrix at a time, so for a moment the last one exists in bf16 and fp32:
               on an 8B Llama-3 this, not training, is the recipe's peak (measured 8.22-8.31 GiB allocated). An
               offloaded embedding is loaded straight into CPU memory (never on the GPU). peft's upcast ends with
               torch.cuda.empty_cache(): a MoE model's cached expert-stacking segments then go back to the driver,
               except those holding live 4-bit experts (MOE_STACK_PINNED); max_memory_reserved still sees them
               for that moment (`load_transient`), NVML's samples do not.
  LoRA         params + grads (bf16 on a 4-bit base, as TRL casts them; fp32 otherwise, as peft keeps them).
  optimizer    Adam's two moments: 8-bit = 2 bytes/param, 32-bit = 8; torch AdamW keeps the params' dtype.
               bitsandbytes pages (CUDA managed memory: NVML counts it, torch's allocator does not) only state
               tensors of >= 1e5 elements: LoRA matrices of a 70B model, none of an 8B one at r=16.
  MoE experts  Fused 3-D parameters (experts.gate_up_proj, experts.down_proj), not nn.Linear, counted from the
               meta-device model (core/model/shapes.py). Under load_in_4bit core/levers/experts.py stores each
               expert as its own 4-bit weight (nf4_bytes per expert), for exactly the weights that
               core/levers/expert_store.py's rule routes (the loader's own); bitsandbytes dequantizes one expert's
               weight at a time (a group on the grouped path, which families with their own experts class lack).
               Without 4 bits they stay 16-bit (fp32 after the upcast). Their activations:
               `moe_routed_bytes_per_token` (top-k copies per token). `lora_experts` on 16-bit experts: peft's
               target_parameters adds its update to each experts weight whole, a 16-bit copy of one layer's experts
               per forward (kept for backward) and its gradient; on 4-bit experts: per-expert A/B on each routed
               row (`expert_lora_bytes_per_token`), the parameters, grads and optimizer state as any LoRA's.
  activations  What autograd keeps per token and layer (`layer_bytes_per_token`): measured on one decoder layer of
               the model's config.json at its real widths (core/estimate/measure.py, `measured_saved`) wherever the
               shape carries its config and the settings have a CPU stand-in; the formula below where not (the
               hand-table shapes, the chapter's fp32 upcast, a config transformers cannot build). The formula: the RMSNorms' inputs, the
               LoRA inputs, attention's q/k/v/output (k and v repeated to all heads when a mask is passed; a fused
               qkv output whole, as v is a view of it), the MLP's gate/up (and act(gate) without liger's fused
               SwiGLU). 4-bit and frozen 16-bit linears keep
               nothing. With checkpointing only each layer's input is kept, plus one layer recomputed in backward.
  masks        With packing, transformers' SDPA path builds a block-diagonal [T, T] mask (T = tokens per
               micro-batch) and SDPA turns it into a [T, T] compute-dtype bias that every layer keeps for its
               backward: 2 T^2 bytes per layer (1.0 GiB at 4,096 tokens on 32 layers). Padded batches likewise
               (batch x length^2). Per-row (varlen) attention has none.
  logits       TRL 1.16's SFTTrainer computes the loss with a chunked LM head (trl.kernels.chunked_logprob): only
               a 4096 x 32768 tile of logits exists, never batch x length x vocab. A plain `model(labels=...)` loss
               (full_logits=True) keeps the bf16 logits, their fp32 copy, log-softmax and its gradient.
  streaming    `stream_layers` keeps each decoder layer's frozen weights (4-bit linears, norms, biases) in host
               memory and copies them into STREAM_SLOTS layer-sized device buffers as the layers run
               (core/levers/stream_layers.py): on the GPU only the ring, the rest of the weights (embeddings, head,
               final norm) and the step's working memory. The model loads into CPU memory, so loading has no GPU
               spike. In CPU memory: the layers (pinned), the offloaded embedding and activations, and the process
               itself (HOST_BASE); `host_memory_problem` refuses a machine whose available RAM cannot hold them.
  allocator    Cached free blocks (reserved - allocated) grow with the working set; less with expandable
               segments. The CUDA context + cuBLAS/cuDNN (NVML - reserved) is 1.37 GiB on an H200 with torch 2.11.

Tokens per micro-batch = batch x max_length (rows pad to the longest in the batch; with packing a micro-batch is
`batch` packs of up to max_length tokens), unless every row is shorter (`max_row_tokens`).

The liger-kernel switch (`use_liger_kernel`) means its RMSNorm, SwiGLU and RoPE in the layers and its fused loss.
`liger_layers=` overrides the first part: liger patches transformers' Llama module for the whole process, so a
Llama model built after a liger run in the same process has liger's layers whatever its own setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from core.config.hardware import available_ram
from core.config.settings import OPTIMIZERS, Problem
from core.config.slices import DataSlice, Loading, LoraSlice, ModelSlice, TrainerSlice
from core.estimate.measure import layer_saved
from core.levers import grouping
from core.model.shapes import ModelShape

GIB = 2**30

# --- calibration constants (H200, torch 2.11 + CUDA 13; bench/RESULTS.md, bench/BASELINE.md) -------------------
CUDA_CONTEXT = int(1.37 * GIB)  # NVML used - torch reserved - paged optimizer state: 1.36-1.39 in every clean run
CUBLAS_WORKSPACE = 64 * 2**20  # cuBLAS + cuBLASLt workspaces (32 MiB each on Hopper), allocated on the first matmul
SMALL_CUBLAS_WORKSPACE = 5 * 2**20  # small_cublas_workspace: 4 MiB + 1 MiB (core.model.load.SMALL_CUBLAS_WORKSPACE)
LOAD_CACHE = int(0.26 * GIB)  # blocks the loader leaves cached: reserved - allocated right after from_pretrained
LOAD_CACHE_FRACTION = 0.05  # ... at most this share of what was loaded (8B: 0.26 of 5.3 GiB; a tiny model: ~0)
CACHE_BASE = int(0.06 * GIB)  # reserved - allocated during training: a base ...
CACHE_FRACTION = 0.075  # ... plus this share of the working set (activations, logits, temporaries)
CACHE_FRACTION_EXPANDABLE = 0.04  # with expandable_segments (measured 0.04 on `fastest`, 0.05 on 70B)
LM_HEAD_VOCAB_CHUNK = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE
LM_HEAD_TOKEN_CHUNK = 4096  # trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE
QUANTIZED_HEAD_ROWS = 8192  # core.levers.output_head.HEAD_ROWS: rows per NF4 block of the head, TRL's chunk then
OFFLOAD_STASH = 5  # trl's get_act_offloading_ctx_manager max_fwd_stash_size: saved tensors kept on the GPU while
# their copy to the CPU runs (offload_activations); the backward pass brings each back just before its layer
# MoE checkpoints hold each expert apart; transformers' loader stacks them into the fused 3-D parameters on the GPU.
# Loading a 12-layer Qwen3-30B-A3B shape in bf16 (H200, transformers 5.17, torch 2.11): peak allocated = loaded + 1.0,
# reserved - allocated after loading = 2.99 times its largest fused tensor (gate_up_proj, 0.75 GiB).
MOE_STACK_PEAK = 1.0
MOE_STACK_CACHED = 3.0
# The chapter's fp32 upcast is peft's prepare_model_for_kbit_training, which ends with torch.cuda.empty_cache()
# (auto_clear_cache, peft 0.21): the stacking segments no live block holds go back to the driver; those the allocator
# filled (best fit) with later layers' 4-bit experts stay. Measured (H200, the 12-layer Qwen3-30B-A3B shape, `chapter`,
# bench/RESULTS.md run 19): NVML 9.63 GiB after loading and through training = fp32 weights + the freed bf16 embedding
# and head + 1.1 GiB of stacking segments (1.5 times gate_up_proj) + the context; the bf16 load above keeps 3.0.
MOE_STACK_PINNED = 1.5
STREAM_SLOTS = 2  # core.levers.stream_layers.SLOTS: the ring's layer-sized buffers
# What a training process holds in CPU memory beside the weights and activations it keeps there: torch, CUDA's host
# side and the libraries (~3 GiB RSS of an idle CUDA process with transformers imported), the loader's read buffers
HOST_BASE = 5 * GIB
PAGED_MIN_NUMEL = 100_000  # bitsandbytes Optimizer8bit.get_state_buffer pages only tensors at least this large
ATTENTIONS = ("sdpa", "varlen")


class _Optimizer(LoraSlice, TrainerSlice, Protocol):
    """The adapter's matrices and the optimizer that keeps state for them."""


class _Layer(ModelSlice, LoraSlice, TrainerSlice, Protocol):
    """One decoder layer's step: the base's dtypes, the adapter on it and the step's kernels and optimizer."""


class _Step(ModelSlice, LoraSlice, DataSlice, TrainerSlice, Protocol):
    """One process's training step: the model, its adapter, the rows' length and packing, and the loop's levers."""


def nf4_bytes(n: int, double_quant: bool, blocksize: int = 64) -> int:
    """Bytes bitsandbytes stores for one n-element 4-bit weight (packed data + quantization constants)."""
    blocks = -(-n // blocksize)
    packed = (n + 1) // 2
    if double_quant:  # absmax quantized to 8 bits in blocks of 256, + fp32 absmax per block, code table, offset
        return packed + blocks + 4 * -(-blocks // 256) + 4 * 256 + 4 + 64
    return packed + 4 * blocks + 64


def precision_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def upcast(cfg: ModelSlice) -> bool:
    """memtune's engine upcasts (prepare_model_for_kbit_training) only a 4-bit model, and only when asked."""
    return cfg.load_in_4bit and cfg.upcast_to_fp32 and cfg.precision != "fp32"


def other_weight_bytes(cfg: ModelSlice) -> int:
    """Bytes per parameter of the unquantized weights (embeddings, head, norms): fp32 after the upcast."""
    return 4 if (upcast(cfg) or cfg.precision == "fp32") else precision_bytes(cfg.precision)


def lora_matrices(shape: ModelShape, cfg: LoraSlice) -> list[int]:
    """Element counts of one layer's LoRA matrices (A: r x in, B: out x r) for the targeted modules."""
    return [n for a, b in shape.lora_dims(cfg.lora_target_modules) for n in (cfg.lora_r * a, cfg.lora_r * b)]


def expert_lora_matrices(shape: ModelShape, cfg: LoraSlice) -> list[int]:
    """Element counts of the whole model's LoRA matrices on experts weights (lora_experts; A: r x experts x one side,
    B: the other side x r x experts, per 3-D weight)."""
    if not cfg.lora_experts:
        return []
    return [n for e, a, b in shape.expert_weights() for n in (cfg.lora_r * e * a, cfg.lora_r * e * b)]


def experts_transient(cfg: ModelSlice, shape: ModelShape, element_size: int) -> int:
    """Bytes of 4-bit experts dequantized at once (core/levers/experts.py): on the grouped path a group of a layer's
    routed experts within its budget (core/levers/grouping.py), one expert at a time its largest weight. 0 without
    them."""
    if not quantized_experts(cfg, shape):
        return 0
    if grouping.requested() == grouping.GROUPED and shape.experts_grouped:
        return max(grouping.group_bytes(e, a * b, element_size) for e, a, b in shape.expert_weights())
    return element_size * shape.largest_expert_weight


def grouped_rows_transient(cfg: ModelSlice, shape: ModelShape, tokens: int) -> int:
    """Bytes the grouped path (core/levers/experts.py `nf4_grouped_experts_forward`) holds at once in one MoE layer
    beyond what autograd keeps (the same tensors as the loop's): its rows are the tokens' k copies sorted by expert,
    so every per-row tensor is tokens x k rows at once, where the loop holds one expert's rows. The larger of
    backward through one experts weight (a group dequantized, the gradient of its output and of its input: rows x
    (out + in) in the compute dtype) and the forward's end (the weighted copy, the zeroed output and index_copy's
    result: rows x hidden, the last two in the stream's dtype). 0 on the loop or without 4-bit experts."""
    if not quantized_experts(cfg, shape) or grouping.requested() != grouping.GROUPED or not shape.experts_grouped:
        return 0
    d = dtypes(cfg)
    rows = tokens * (shape.num_experts_per_tok or 1)
    # a weight split into several chunks also holds one chunk's gathered rows and product beside the whole output
    through = max(grouping.group_bytes(e, a * b, d.c)
                  + rows * d.c * (a + b) * (2 if len(grouping.chunks(e, a * b * d.c)) > 1 else 1)
                  for e, a, b in shape.expert_weights())
    return max(through, rows * shape.hidden_size * (d.c + 2 * d.s))


def quantized_experts(cfg: ModelSlice, shape: ModelShape) -> bool:
    """Whether MoE experts are stored in 4 bits: the loader does it whenever the model loads in 4, for the weights
    core/levers/expert_store.py routes (shape.expert_weights: the same rule)."""
    return bool(cfg.load_in_4bit and shape.expert_weights())


def optimizer_bytes(cfg: _Optimizer, shape: ModelShape, param_bytes: int, shards: int = 1) -> tuple[int, int]:
    """(bytes of optimizer state for the LoRA params, how many of them bitsandbytes pages); with `shards` > 1 each
    LoRA matrix is one flat FSDP shard of 1/shards of it (what the optimizer then sees)."""
    _, eight_bit, paged = OPTIMIZERS.get(cfg.optim, (False, False, False))
    matrices = [-(-m // shards) for m in lora_matrices(shape, cfg)] * shape.num_hidden_layers
    matrices += [-(-m // shards) for m in expert_lora_matrices(shape, cfg)]
    n = sum(matrices)
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
    total = sum(per(m) for m in matrices)
    paged_bytes = sum(per(m) for m in matrices if m >= PAGED_MIN_NUMEL) if paged else 0
    return total, paged_bytes


@dataclass(frozen=True)
class Dtypes:
    c: int  # compute dtype (autocast): what attention, LoRA and the logits tile use
    s: int  # residual stream: fp32 after the upcast (the embedding output is fp32), else the compute dtype
    o: int  # output of a decoder linear: bitsandbytes returns its input's dtype (so s); a 16-bit one, c


def dtypes(cfg: ModelSlice) -> Dtypes:
    c = precision_bytes(cfg.precision)
    s = 4 if (upcast(cfg) or cfg.precision == "fp32") else c
    return Dtypes(c=c, s=s, o=s if cfg.load_in_4bit else c)


def masked(cfg: DataSlice, attention: str, batch: int, equal_length_rows: bool) -> bool:
    """Whether attention gets an explicit mask (a packed or padded micro-batch under SDPA)."""
    if attention == "varlen":
        return False
    return cfg.packing or (batch > 1 and not equal_length_rows)


def moe_routed_bytes_per_token(cfg: ModelSlice, shape: ModelShape) -> int:
    """What one MoE layer keeps for backward per token, averaged over the layers: each token goes to its top-k
    experts, which compute in the compute dtype (4-bit ones through bitsandbytes' matmul), and each of the k copies
    keeps the expert MLP's input, gate/up output (2 x width) and act(gate) (width), plus the router's logits and
    their fp32 softmax over all experts. 0 for a dense model."""
    if not shape.num_experts or not shape.num_hidden_layers:
        return 0
    c = precision_bytes(cfg.precision)
    k, width, h = shape.num_experts_per_tok or 1, shape.expert_intermediate_size or shape.intermediate_size, shape.hidden_size
    routed = k * c * (h + 3 * width)
    router = (c + 4) * shape.num_experts
    return (routed + router) * shape.moe_layers // shape.num_hidden_layers


def expert_lora_bytes_per_token(cfg: _Layer, shape: ModelShape) -> int:
    """lora_experts on 4-bit experts (core/levers/expert_lora.py), per token averaged over the layers: each of the
    token's k expert copies keeps, per experts weight, its LoRA's r-wide intermediate (compute dtype), and with
    dropout its dropped input (compute dtype + a 1-byte mask). 0 otherwise (16-bit experts: `moe_lora`)."""
    if not (cfg.lora_experts and quantized_experts(cfg, shape)) or not shape.num_hidden_layers:
        return 0
    c, k = precision_bytes(cfg.precision), shape.num_experts_per_tok or 1
    weights = len(shape.expert_weights()) // max(1, shape.moe_layers)  # per layer: gate_up (or up) and down
    # the dropped inputs: the hidden state (gate_up's) and the expert's gated activation (down's)
    inputs = shape.hidden_size + (shape.expert_intermediate_size or shape.intermediate_size)
    per_layer = c * cfg.lora_r * weights + ((c + 1) * inputs if cfg.lora_dropout > 0 else 0)
    return k * per_layer * shape.moe_layers // shape.num_hidden_layers


def layer_bytes_per_token(cfg: _Layer, shape: ModelShape, *, liger_layers: bool | None = None,
                          kv_repeated: bool = False) -> tuple[int, int]:
    """(bytes one decoder layer keeps for backward per token, extra bytes its backward needs per token).

    `kv_repeated`: attention is called with a mask, so transformers repeats the key/value heads to all query
    heads before SDPA (no native GQA) and k, v are kept at the query width (also what varlen ran with here).
    """
    liger = cfg.use_liger_kernel if liger_layers is None else liger_layers
    liger = liger and shape.model_type in LIGER_FAMILIES  # liger patches no other family's norms / MLP
    d = dtypes(cfg)
    h, inter, q, kv = shape.hidden_size, shape.intermediate_size, shape.q_dim, shape.kv_dim
    # RMSNorm: the eager one keeps an fp32 copy of its input (+ 1/rms); liger's keeps the input as it is.
    norm = (d.s * h if liger else 4 * h) + 4
    norms = shape.norms_per_layer * norm
    # Attention (SDPA / FlashAttention) keeps q, k, v, its output (compute dtype) and fp32 log-sum-exp per head.
    # Repeating key/value heads makes new tensors, only where there are fewer key/value heads than query heads.
    repeated = kv_repeated and kv < q
    k_width = q if repeated else kv
    # A fused qkv_proj (Phi-3): RoPE makes new q and k, but v reaches the kernel as a view of the fused output, so
    # the kernel's saved v keeps all q + 2 kv columns alive (Phi-3-mini: 9,216 instead of 3,072 per token;
    # tests/test_estimate_phi.py measures it). A repeat copies v, and then the fused output is freed.
    v_kept = d.o * (q + 2 * kv) if shape.fused and not repeated else d.c * k_width
    attn = d.c * (2 * q + k_width) + v_kept + 4 * shape.num_attention_heads
    # SwiGLU keeps gate and up (liger's fused kernel recomputes act(gate) in backward), the eager MLP act(gate) too.
    mlp = (2 if liger else 3) * d.o * inter if shape.dense_mlp else 0
    mlp += moe_routed_bytes_per_token(cfg, shape)
    # LoRA keeps its input: with dropout, each adapted layer its own dropout output (compute dtype) + 1-byte mask;
    # without, the modules reading one tensor share it (q,k,v read the norm output; gate,up the second norm's) when
    # it is already in the compute dtype, else each keeps its own autocast copy. o_proj's input is attention's
    # output, which attention keeps anyway. Plus the r-wide LoRA intermediate of each adapted layer.
    # A fused layer (Phi-3's qkv_proj, gate_up_proj) is one adapter: one dropout output, one r-wide intermediate.
    targets = shape.lora_names(cfg.lora_target_modules)
    adapters = shape.lora_dims(cfg.lora_target_modules)
    lora = 0
    if cfg.lora_dropout > 0:
        lora = sum((d.c + 1) * a for a, _ in adapters)
    else:
        groups = {"attn_in": ("q_proj", "k_proj", "v_proj"), "mlp_in": ("gate_proj", "up_proj")}
        for members in groups.values():
            n = sum(t in targets for t in members)
            if n:
                lora += d.c * h * (1 if d.s == d.c or shape.fused else n)
        if "down_proj" in targets:
            lora += d.c * inter
    lora += d.c * cfg.lora_r * len(adapters)
    saved = norms + attn + mlp + lora
    measured = measured_saved(cfg, shape, kv_repeated)
    if measured is not None:  # what autograd really keeps at these widths (core/estimate/measure.py)
        saved = measured
        if liger and shape.model_type in LIGER_FAMILIES:  # measured without liger's kernels (CUDA only)
            saved -= shape.norms_per_layer * (4 - d.s) * h + (d.o * inter if shape.dense_mlp else 0)
    saved += expert_lora_bytes_per_token(cfg, shape)
    # Backward of the MLP holds the gradient of the gate*up product (and, unfused, the second gradient of the
    # multiply at the same time) and the residual stream's gradient (two copies).
    backward = (1 if liger else 2) * d.o * inter + 2 * d.s * h
    return saved, backward


# liger_kernel.transformers.monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN (liger-kernel 0.8.5): the families whose RMSNorm
# and SwiGLU liger replaces (read from liger itself where it is installed)
LIGER_FAMILIES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "glm4", "granite", "llama", "mistral",
                            "mixtral", "olmo2", "phi3", "qwen2", "qwen3", "qwen3_moe", "smollm3", "llama4"})
try:
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    LIGER_FAMILIES = frozenset(MODEL_TYPE_TO_APPLY_LIGER_FN)
except Exception:  # noqa: BLE001 - not installed (a CPU machine): the list above
    pass


def measured_layer(cfg: Loading, shape: ModelShape, kv_repeated: bool) -> dict | None:
    """core/estimate/measure.py's measurement of one decoder layer for these settings, or None (no config.json,
    the chapter's fp32 upcast, a config this transformers cannot build)."""
    if not shape.config_text or upcast(cfg):
        return None
    return layer_saved(shape.config_text, cfg.precision, tuple(cfg.lora_target_modules), cfg.lora_r,
                       cfg.lora_dropout > 0, kv_repeated, experts_loop=quantized_experts(cfg, shape),
                       four_bit=cfg.load_in_4bit)


def measured_saved(cfg: Loading, shape: ModelShape, kv_repeated: bool) -> int | None:
    """Bytes per token one decoder layer keeps, measured (core/estimate/measure.py) where the shape carries its
    config.json and the settings have a CPU stand-in; None: the formula of layer_bytes_per_token."""
    found = measured_layer(cfg, shape, kv_repeated)
    return None if found is None else int(found["saved"])


def varlen_casts(cfg: Loading, shape: ModelShape) -> bool:
    """Whether q/k/v reach memtune's varlen attention in fp32: a LayerNorm family on a 4-bit base (CUDA autocast's
    fp32 LayerNorm, bitsandbytes returning its input's dtype). core/model/attention.py casts them to the compute
    dtype for FlashAttention, as transformers' wrapper does, so no [T, T] mask is built (before that fix it took
    SDPA with one: StarCoder2-3B `fastest`, bench/RESULTS.md run 17, 35.95 GiB). The measured layer already counts the 16-bit
    copies the kernel keeps (core/estimate/measure.py's stand-in casts as the kernel's caller does)."""
    found = measured_layer(cfg, shape, True)
    return bool(found and found.get("fp32_attention"))


def streamed_bytes(cfg: ModelSlice, shape: ModelShape) -> int:
    """Bytes of frozen decoder-layer weights stream_layers keeps in host memory: the 4-bit linears with their
    constants and the layers' norms and biases (the final norm stays on the GPU). 0 without it."""
    if not (cfg.stream_layers and cfg.load_in_4bit):
        return 0
    quantized = sum(nf4_bytes(a * b, cfg.bnb_4bit_use_double_quant) for a, b in shape.quantized_weights())
    return quantized + other_weight_bytes(cfg) * max(0, shape.small_params - shape.hidden_size)


def stream_ring_bytes(cfg: ModelSlice, shape: ModelShape) -> int:
    """The ring of device buffers: STREAM_SLOTS times one decoder layer's frozen bytes (stream_layers); 0 without."""
    layers = max(1, shape.num_hidden_layers)
    if not (cfg.stream_layers and cfg.load_in_4bit):
        return 0
    return min(layers, STREAM_SLOTS) * -(-streamed_bytes(cfg, shape) // layers)


def host_memory_problem(cfg: _Step, shape: ModelShape, available: int | None = None,
                        name: str = "") -> Problem | None:
    """stream_layers refused by name when this machine's available RAM (`available`, default: read now) cannot hold
    what the run keeps there (host_bytes); None when it can, cannot be read, or nothing streams. `name`: the model
    as the user named it (default: the shape's)."""
    if not cfg.stream_layers:
        return None
    available = available_ram() if available is None else available
    need = host_bytes(cfg, shape)
    if available is None or need <= available:
        return None
    return Problem.of("stream_layers", "problem.stream_layers_ram", model=name or shape.name, need=f"{need / GIB:.1f}",
                      available=f"{available / GIB:.1f}")


def host_bytes(cfg: _Step, shape: ModelShape) -> int:
    """CPU memory a stream_layers run holds: the streamed layers, what else is offloaded, and the process itself."""
    t = single_gpu_terms(cfg, shape)
    return t.offloaded + t.host_activations + HOST_BASE


@dataclass
class Terms:
    """One process's GPU memory before it is summed into peaks, in bytes (core.estimate.predict sums it; core.estimate.multi
    changes it for a run over several processes)."""

    quantized: int  # 4-bit linears: packed data + quantization constants
    unquantized: int  # on the GPU during training (an offloaded input embedding is not)
    offloaded: int  # in CPU memory instead
    lora: int  # params + grads
    optimizer: int  # all optimizer state, paged included
    paged: int  # of which bitsandbytes pages (CUDA managed memory: NVML only)
    activations: int
    logits: int
    temporaries: int  # includes the cuBLAS workspace
    load_alloc: int  # setup (loading, wrapping): peak allocated ...
    load_reserved: int  # ... and reserved
    cache_fraction: float
    tokens: int
    notes: list[str] = field(default_factory=list)
    last_notes: list[str] = field(default_factory=list)  # said after the peak's phase
    workspace: int = CUBLAS_WORKSPACE  # of `temporaries`: cuBLAS' (small_cublas_workspace: SMALL_CUBLAS_WORKSPACE)
    # several processes (core/estimate/multi.py); all 0 for one
    gathered: int = 0  # FSDP: full (unsharded) weights of the units being computed
    buckets: int = 0  # DDP: the gradient buckets (allocated)
    kept: int = 0  # broadcast buffers the caching allocator keeps (reserved)
    comm: int = 0  # NCCL's buffers (NVML only), during training ...
    load_comm: int = 0  # ... and during setup
    # reserved for a moment only, before a library empties the cache (the upcast of a MoE model: its stacking
    # segments): torch's max_memory_reserved counts it; NVML's samples miss it, and a cudaMalloc that fails makes the
    # allocator hand cached blocks back and retry, so it needs no room on the GPU
    load_transient: int = 0
    host_activations: int = 0  # offload_activations: what waits in CPU memory for the backward pass

    @property
    def static(self) -> int:
        return self.quantized + self.unquantized + self.lora + self.optimizer - self.paged + self.buckets

    @property
    def working(self) -> int:
        return self.activations + self.logits + self.temporaries - self.workspace + self.gathered

    @property
    def train_alloc(self) -> int:
        return self.static + self.working + self.workspace

    @property
    def train_reserved(self) -> int:
        return self.train_alloc + CACHE_BASE + int(self.cache_fraction * self.working) + self.kept

    @property
    def nvml_training(self) -> int:
        return self.train_reserved + CUDA_CONTEXT + self.paged + self.comm  # paged state: created with the optimizer

    @property
    def nvml_setup(self) -> int:
        return self.load_reserved + CUDA_CONTEXT + self.load_comm


def single_gpu_terms(cfg: _Step, shape: ModelShape, *, max_row_tokens: int | None = None,
                     full_logits: bool = False, liger_layers: bool | None = None, attention: str = "sdpa",
                     equal_length_rows: bool = False, embedding_via_gpu: bool = False) -> Terms:
    """Every term of one process training `cfg` alone on one GPU (see the module docstring). `embedding_via_gpu`:
    rows measured with an older loader that put an offloaded embedding on the GPU first (bench/grid_measured.json)."""
    liger = cfg.use_liger_kernel if liger_layers is None else liger_layers
    liger = liger and shape.model_type in LIGER_FAMILIES  # liger patches no other family's norms / MLP
    notes: list[str] = []
    q4 = cfg.load_in_4bit
    d = dtypes(cfg)
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
    workspace = SMALL_CUBLAS_WORKSPACE if cfg.small_cublas_workspace else CUBLAS_WORKSPACE

    # Weights
    other_dtype = other_weight_bytes(cfg)
    if q4:
        quantized = sum(nf4_bytes(a * b, cfg.bnb_4bit_use_double_quant) for a, b in shape.quantized_weights())
        unquantized = other_dtype * shape.unquantized_params
        if quantized_experts(cfg, shape):  # every expert its own 4-bit weight (core/levers/experts.py)
            quantized += sum(e * nf4_bytes(a * b, cfg.bnb_4bit_use_double_quant) for e, a, b in shape.expert_weights())
            unquantized -= other_dtype * shape.expert_weight_params
            notes.append(f"MoE experts stored in 4 bits, one expert at a time ({len(shape.expert_weights())} fused "
                         f"weights of {shape.num_experts} experts)")
    else:
        quantized = 0
        unquantized = d.c * shape.total_params
    # quantize_output_head: the untied head in NF4 blocks (core.levers.output_head.QuantizedHead) instead of its dtype.
    q_head = bool(q4 and cfg.quantize_output_head and shape.head_params)
    if q_head:
        rows = max(1, shape.head_params // h)
        quantized += sum(nf4_bytes(min(QUANTIZED_HEAD_ROWS, rows - a) * h, cfg.bnb_4bit_use_double_quant)
                         for a in range(0, rows, QUANTIZED_HEAD_ROWS))
        unquantized -= other_dtype * shape.head_params
    # offload_embeddings: the frozen input embedding stays in CPU memory (core/levers/embedding.py), not when tied.
    offloaded = other_dtype * shape.embed_params if (cfg.offload_embeddings and shape.head_params) else 0
    if offloaded:
        notes.append(f"the input embedding ({offloaded / GIB:.2f} GiB) is kept in CPU memory (loaded straight "
                     "there)")
    # stream_layers: the decoder layers' frozen weights in CPU memory, a ring of two of them on the GPU
    streamed, ring = streamed_bytes(cfg, shape), stream_ring_bytes(cfg, shape)
    if streamed:
        layer_small = other_dtype * max(0, shape.small_params - shape.hidden_size)  # the layers' norms, biases
        quantized += ring - (streamed - layer_small)
        unquantized -= layer_small
        notes.append(f"stream_layers: {streamed / GIB:.2f} GiB of frozen layers in CPU memory, a ring of "
                     f"{ring / GIB:.2f} GiB on the GPU; every step copies each layer over the link two or three "
                     "times, so steps are slower")

    # LoRA: TRL casts the adapters of a quantized model to bf16; peft keeps them fp32 on a 16-bit base.
    n_lora = shape.lora_params(cfg.lora_r, cfg.lora_target_modules) + sum(expert_lora_matrices(shape, cfg))
    lora_dtype = 2 if q4 else 4
    lora = 2 * lora_dtype * n_lora
    if not q4 and d.c == 2:
        lora += 2 * n_lora  # autocast caches bf16 copies of the fp32 adapter weights during the step
    optimizer, paged_bytes = optimizer_bytes(cfg, shape, lora_dtype)

    # Activations
    is_masked = masked(cfg, attention, batch, equal_length_rows)
    if attention == "varlen" and (cfg.packing or batch > 1) and varlen_casts(cfg, shape):
        notes.append(f"q, k and v reach attention in fp32 (an fp32 LayerNorm on a 4-bit base): varlen attention "
                     f"casts them to {cfg.precision} for FlashAttention per packed row (no [T, T] mask)")
    saved, backward = layer_bytes_per_token(cfg, shape, liger_layers=liger,
                                            kv_repeated=is_masked or attention == "varlen")
    # bitsandbytes dequantizes a whole weight per matmul (4-bit experts: a group of them, `experts_transient`; on
    # the grouped path with the layer's routed rows around it, `grouped_rows_transient`)
    dequant = max(d.c * shape.largest_linear, experts_transient(cfg, shape, d.c),
                  grouped_rows_transient(cfg, shape, tokens)) if q4 else 0
    # lora_experts: peft's parametrization makes W + BA of a layer's experts weights whole (16-bit), kept for
    # backward while the layer's graph lives, and backward makes its gradient (same size).
    # On 4-bit experts memtune's own LoRA never makes W + BA (expert_lora_bytes_per_token counts what it keeps).
    moe_lora = (d.c * shape.expert_weight_params // max(1, shape.moe_layers)
                if expert_lora_matrices(shape, cfg) and not quantized_experts(cfg, shape) else 0)
    # An explicit mask: a bool [T, T] (packed; batch x [L, L] padded) shared by the layers, and the compute-dtype
    # bias SDPA makes of it, kept by every layer that has run forward (one layer with checkpointing).
    mask_elems = (tokens * tokens if cfg.packing else batch * row * row) if is_masked else 0
    mask_kept = mask_elems + d.c * mask_elems * (1 if cfg.gradient_checkpointing else layers)
    # A soft-capped model (Gemma-2) under attention: varlen runs eager attention per packed row (core/model/attention.py):
    # each layer keeps its rows' scores: tanh output (c), fp32 softmax (4) and its compute-dtype cast (c) per head
    # and pair of tokens of one row. Rows assumed `row` tokens long (a pack of them: tokens x row pairs).
    row_scores = ((2 * d.c + 4) * shape.num_attention_heads * tokens * row
                  if attention == "varlen" and shape.attn_softcap else 0)
    if row_scores:
        notes.append(f"soft-capped attention runs eager per packed row: {row_scores / GIB:.2f} GiB of scores per "
                     "layer")
    # offload_activations: what the layers keep goes to CPU memory as the forward pass runs, OFFLOAD_STASH saved
    # tensors at a time on the GPU (with checkpointing one per layer: its input; without, about a layer's worth).
    if cfg.gradient_checkpointing:
        kept = min(layers, OFFLOAD_STASH) if cfg.offload_activations else layers
        activations = kept * d.s * h * tokens + mask_kept
        layer_phase = (saved + backward) * tokens + dequant + row_scores + 2 * moe_lora
    else:
        kept = min(layers, 1) if cfg.offload_activations else layers
        activations = kept * (saved * tokens + row_scores) + mask_kept + min(kept, shape.moe_layers) * moe_lora
        layer_phase = backward * tokens + dequant + moe_lora
    host_activations = 0
    if cfg.offload_activations:
        notes.append(f"offload_activations: {layers - kept} layers' saved activations wait in CPU memory")
        host_activations = ((layers - kept) * d.s * h * tokens if cfg.gradient_checkpointing else
                            (layers - kept) * (saved * tokens + row_scores))

    # LM head + loss: the final norm's kept input, its output, TRL's compact copy of the labelled positions and the
    # fp32 gradient of it (+ its cast back), a logits tile, and the head cast to the compute dtype per vocab chunk.
    final_norm = (d.s * h if liger else 4 * h) + 4
    if full_logits and not cfg.use_liger_kernel:
        logits = tokens * vocab * (d.c + 12) + tokens * (final_norm + (d.s + 4) * h)
        notes.append("full logits: the loss keeps batch x length x vocab logits in fp32")
    elif q_head:  # TRL reads QUANTIZED_HEAD_ROWS rows per chunk, each dequantized to the compute dtype
        tile = min(tokens, LM_HEAD_TOKEN_CHUNK) * min(vocab, QUANTIZED_HEAD_ROWS) * d.c
        weight_cast = min(vocab, QUANTIZED_HEAD_ROWS) * h * d.c
        logits = tile + weight_cast + tokens * (final_norm + 3 * d.s * h + 4 * h)
    else:
        tile = min(tokens, LM_HEAD_TOKEN_CHUNK) * min(vocab, LM_HEAD_VOCAB_CHUNK) * d.c
        weight_cast = min(vocab, LM_HEAD_VOCAB_CHUNK) * h * d.c if other_dtype != d.c else 0
        logits = tile + weight_cast + tokens * (final_norm + 3 * d.s * h + 4 * h)
    temporaries = max(0, layer_phase - logits) + workspace

    # Loading: the fp32 upcast converts one matrix at a time; the bf16 copy of the first is freed but stays cached.
    # An offloaded embedding is loaded straight into CPU memory (core.levers.embedding.load_embedding_on_cpu) and upcast
    # there: it never is on the GPU. (Counting it at load would make lowest_memory's estimate +9% on Llama-3.1-8B and
    # +12% on Qwen3-8B: the loading peak it would predict does not exist.)
    if embedding_via_gpu:
        offloaded_at_load = 0
    else:
        offloaded_at_load = offloaded
    loaded = quantized + unquantized - offloaded_at_load
    base = loaded + workspace  # the workspace stays from an earlier run of the process
    if q_head and not cfg.offload_embeddings and not streamed:  # loaded to the GPU in its dtype, then quantized
        base += d.c * shape.head_params
    load_cache = min(LOAD_CACHE, int(LOAD_CACHE_FRACTION * loaded))
    # Stacking the experts (MOE_STACK_*): a transient while loading, its freed blocks cached for the rest of the run;
    # after the upcast (peft empties the cache) only the segments live 4-bit experts were placed in stay.
    stack = d.c * shape.largest_expert_params
    stack_cache = max(load_cache, int(MOE_STACK_CACHED * stack))
    stack_peak = int(MOE_STACK_PEAK * stack)
    big = ([] if offloaded_at_load else [shape.embed_params]) + ([shape.head_params] if shape.head_params else [])
    load_transient = 0
    if streamed:  # loaded and upcast in CPU memory (core.model.load.load_model): the GPU gets the finished weights
        load_alloc, load_reserved = base, base + load_cache
    elif upcast(cfg) and big:
        load_cache = max(load_cache, int(MOE_STACK_PINNED * stack))
        load_alloc = base + max(2 * big[-1], stack_peak)
        # before the upcast: the unquantized weights still 16-bit, every stacking segment cached
        loaded_16 = base - (unquantized - offloaded_at_load) * (other_dtype - d.c) // other_dtype
        holes = 2 * big[-1] + (2 * big[0] if len(big) > 1 else 0)
        load_reserved = max(loaded_16 + stack_cache, base + holes + load_cache)
        load_transient = base + holes + stack_cache  # upcast done, the cache not yet emptied
    else:
        load_cache = stack_cache
        load_alloc = base + stack_peak
        load_reserved = base + load_cache
    if stack:
        after = " after the fp32 upcast empties the cache" if upcast(cfg) and big else ""
        notes.append(f"loading stacks each layer's experts on the GPU: {load_cache / GIB:.2f} GiB stay cached{after}")
    last_notes = []
    if is_masked and cfg.packing and not cfg.gradient_checkpointing and mask_elems:
        last_notes.append(f"SDPA keeps a {tokens} x {tokens} mask per layer over a packed micro-batch "
                     f"({d.c * mask_elems * layers / GIB:.2f} GiB here)")
    return Terms(quantized=quantized, unquantized=unquantized - offloaded, offloaded=offloaded + streamed, lora=lora,
                 optimizer=optimizer, paged=paged_bytes, activations=activations, logits=logits,
                 temporaries=temporaries, load_alloc=load_alloc, load_reserved=load_reserved,
                 load_transient=load_transient,
                 cache_fraction=CACHE_FRACTION_EXPANDABLE if cfg.expandable_segments else CACHE_FRACTION,
                 tokens=tokens, notes=notes, last_notes=last_notes, workspace=workspace,
                 host_activations=host_activations)


# --- LoRA variants (core/config/settings.py: use_dora, use_rslora, lora_init, loraplus_lr_ratio) ------------------
# rsLoRA changes the scale, PiSSA/OLoRA the adapter's starting values and LoRA+ the learning rate of lora_B: the same
# tensors, so no term. DoRA (peft's tuners/lora/dora.py DoraLinearLayer) adds tensors:
BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes' optimizers keep 32-bit state for tensors smaller than this (min_8bit_size)


def dora_terms(t: Terms, cfg: _Layer, shape: ModelShape) -> None:
    """DoRA's memory, added to `t` (core.estimate.predict calls it after single_gpu_terms):

    - a trainable magnitude vector per adapted layer (its output width), with its gradient and optimizer state;
    - what autograd keeps per token and adapted layer: the base layer's output and the LoRA branch's output (both
      multiplied by the magnitude scale); measured with saved_tensors_hooks on peft 0.21
      (tests/test_lora_variants.py);
    - a transient per forward of an adapted layer: peft builds the LoRA weight B A through an in x in identity
      (kept while the forward's graph of it lives), the dequantized base weight and W + s B A for its norm.
    """
    if not cfg.use_dora:
        return
    d = dtypes(cfg)
    adapters = shape.lora_dims(cfg.lora_target_modules)
    lora_dtype = 2 if cfg.load_in_4bit else 4  # as the LoRA matrices (single_gpu_terms)
    widths = [b for _, b in adapters] * shape.num_hidden_layers
    n = sum(widths)
    t.lora += 2 * lora_dtype * n
    _, eight_bit, paged = OPTIMIZERS.get(cfg.optim, (False, False, False))
    if cfg.optim == "sgd":
        state = 0
    elif cfg.optim == "adafactor":
        state = 4 * n  # a vector: adafactor keeps its full second moment
    elif eight_bit:
        state = sum(2 * m + 8 * -(-m // 256) if m >= BNB_MIN_8BIT_SIZE else 8 * m for m in widths)
    else:
        state = (8 if paged else 2 * lora_dtype) * n
    t.optimizer += state
    kept = sum((d.o + d.c) * b for _, b in adapters)  # per token, one layer
    t.activations += (0 if cfg.gradient_checkpointing else shape.num_hidden_layers) * kept * t.tokens
    dequant = d.c if cfg.load_in_4bit else 0
    transient = max((lora_dtype * a * a + (lora_dtype + d.c + dequant + 2 * d.c) * a * b for a, b in adapters),
                    default=0)
    # With checkpointing the layer recomputed in backward keeps its outputs again, beside the transient.
    t.temporaries += transient + (kept * t.tokens if cfg.gradient_checkpointing else 0)
    t.notes.append(f"DoRA: {2 * lora_dtype * n / 2**20:.1f} MiB of magnitudes + grads, {kept * t.tokens / GIB:.2f} "
                   f"GiB kept per layer per micro-batch, {transient / GIB:.2f} GiB while a layer computes its norm")
