"""What autograd keeps for one decoder layer, measured at the model's real widths, instead of a per-family
formula.

The model of config.json is built with ONE decoder layer and a 256-token vocabulary on the CPU (transformers' own
classes, `no_init_weights`: the weights' values do not change what is saved), LoRA wrapped by peft on the targets
memtune resolves for it (core.model.lora_targets), and TOKENS tokens run through it (one row: no mask) under
`torch.autograd.graph.saved_tensors_hooks`: the distinct storages saved while the decoder layer runs, parameters
excluded (a view keeps its whole storage: Phi-3's fused qkv output), divided by the tokens. tests/test_estimate_phi.py
did this for Phi-3 in a test; this is now the estimator's own activation term.

Why the CPU and not the meta device: MoE routing is data-dependent (one_hot, nonzero, a loop over the experts a batch
hits), which the meta device cannot run. A real CPU layer with a few tokens routes them as on the GPU; every token
goes to its top-k experts whichever they are, so the saved bytes per token do not depend on the weights' values. The
MoE layer's 3-D experts weights are stride-0 views of one expert (memory of one expert, shapes and counts real).

Stood in for, because the GPU kernels do not run here:
- attention: FlashAttention / SDPA's memory-efficient kernel save q, k, v (as passed), the output and an fp32
  log-sum-exp per head; a stand-in registered in transformers' AttentionInterface saves exactly those (k and v
  repeated to the query heads when memtune's path repeats them: `kv_repeated`). The explicit mask, eager scores of
  soft-capped rows and the backward's extras stay analytic in core.estimate.terms. A family whose attention does not
  go through the interface is measured with its own CPU attention at TOKENS tokens (flagged: `own_attention`).
- 4-bit MoE experts (`experts_loop`): memtune's loop over the routed experts, one bitsandbytes matmul each,
  measured as transformers' "eager" experts implementation (the same loop on 16-bit frozen weights). Llama-4's
  experts class, handed every token's copy for every expert, computes only the routed (non-zero) copies in memtune's
  4-bit forward: stood in by the same on frozen 16-bit weights (`ROUTED_ROWS`), the layer's other weights 0.01 so
  the routed copies are non-zero.
- bitsandbytes' 4-bit matmul keeps only its weight (`ctx.tensors = (None, B)`) and returns its input's dtype: a
  frozen 16-bit Linear keeps the same (autograd does not save an input only a frozen weight's gradient would need).
- CUDA autocast's fp32 LayerNorm / GroupNorm and bitsandbytes' 4-bit linear returning its input's dtype
  (`_CudaAutocastStandIn`): a LayerNorm family's stream on a 4-bit base stays fp32 (StarCoder2-3B: 117,488 bytes per
  token and layer instead of 68,328 measured without; bench/RESULTS.md run 17's `fastest`, with SDPA's [T, T]
  mask as it ran then: -42.7% -> +2.5%), and q/k/v reach
  attention in fp32 (`fp32_attention`), where the stand-in casts them to the compute dtype as
  FlashAttention's callers do (transformers' get_target_dtype; memtune's varlen attention likewise, so no [T, T]
  mask: core/model/attention.py `_target_dtype`).
- liger's kernels (Triton, CUDA only): measured without them; core.estimate.terms takes off what its RMSNorm and
  SwiGLU do not keep, only on families liger patches.

Not measured (terms keep the formula there): the chapter's fp32 upcast (bitsandbytes returns fp32 from an fp32
stream while autocast computes attention in bf16: no CPU stand-in reproduces that mix), remote-code models, and any
config this transformers cannot build.

Cost (this team's shared 2-core CPU, bf16 matmuls without CPU bf16 support): a cold measurement builds one layer and
runs TOKENS tokens: 2-5 s for a 3B-8B dense layer or Qwen3-30B-A3B's MoE layer, about 30 s for gpt-oss-20b's (its 32
experts' 2880 x 5760 matmuls); a LayerNorm family adds ~0.5 s (StarCoder2-3B: 1.2 s after the imports); results are cached in this process and on disk (MEMTUNE_CACHE or ~/.cache/memtune/layer_saved.json), keyed by
the config text, the settings and the torch/transformers versions (read from their metadata), so a warm estimate
costs a dictionary lookup.

The web server never measures (`measuring_here(False)`: it never imports torch): its estimates read this cache or keep
the formula, and what they lacked (`collecting`) is measured by an inspect child (core/jobs/act.py,
core/estimate/inspect.py), which writes it here. A measurement that raised is kept as failed and named to the page.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

MODEL_VERSION = 3  # 2: CUDA autocast's fp32 norms and bitsandbytes' dtype contract; 3: Llama-4's routed rows
# (the cache key changes with it)
TOKENS = 16  # per-token bytes equal at 16 and 64 tokens (Llama-3.2-3B, Qwen3-30B-A3B, gpt-oss); 4x less CPU
STAND_IN = "memtune_measure"
_DISK: dict[str, dict] | None = None
_DISK_STAMP: tuple[int, int] | None = None  # the cache file's (mtime, size) when read: another process may add to it
_MEMO: dict[str, dict] = {}  # this process's measurements (a read-only home keeps them here only)
_HERE = True  # whether this process may build a model to measure it (the web server: never; see `measuring_here`)


# --- where a measurement may run, and what an estimate lacked -------------------------------------------------------
@dataclass
class Wants:
    """What the estimates made inside `collecting()` found neither measured nor measurable here: `missing` (cache key ->
    what to measure, for the inspect child: core/jobs/act.py) and `failed` (cache key -> the measurement's error)."""

    missing: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


_WANTS: contextvars.ContextVar[Wants | None] = contextvars.ContextVar("memtune_wants", default=None)


def measuring_here(on: bool) -> None:
    """The web server calls this with False: its estimates read measurements from the disk cache or keep the formula,
    and never import torch; what they lacked is collected (`collecting`) for a child process to measure."""
    global _HERE
    _HERE = bool(on)


def measures_here() -> bool:
    return _HERE


@contextlib.contextmanager
def collecting() -> Iterator[Wants]:
    """The measurements the estimates inside this block lacked (this thread's, this context's)."""
    wants = Wants()
    token = _WANTS.set(wants)
    try:
        yield wants
    finally:
        _WANTS.reset(token)


def note_missing(key: str, spec: dict[str, Any]) -> None:
    wants = _WANTS.get()
    if wants is not None:
        wants.missing.setdefault(key, spec)


def _failed_here(key: str, error: str) -> None:
    wants = _WANTS.get()
    if wants is not None:
        wants.failed.setdefault(key, error)


def versions(*packages: str) -> list[str]:
    """The installed versions, read from the packages' metadata: the key is the same without importing them."""
    out = []
    for name in packages:
        try:
            out.append(metadata.version(name))
        except metadata.PackageNotFoundError:
            out.append("")
    return out


# --- the disk cache -------------------------------------------------------------------------------------------------
def _cache_file() -> Path:
    base = os.environ.get("MEMTUNE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "memtune")
    return Path(base) / "layer_saved.json"


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _read(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _disk() -> dict[str, dict]:
    """The cache file's entries, read again when the file changed (an inspect child wrote to it)."""
    global _DISK, _DISK_STAMP
    path = _cache_file()
    stamp = _stamp(path)
    if _DISK is None or stamp != _DISK_STAMP:
        _DISK, _DISK_STAMP = _read(path), stamp
    return _DISK


def cached(key: str) -> dict | None:
    return _MEMO.get(key) or _disk().get(key)


def remember(key: str, value: dict) -> None:
    """Add one entry, merged into the file under a lock: several children may measure at once."""
    global _DISK, _DISK_STAMP
    _MEMO[key] = value
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = {**_read(path), key: value}
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data), encoding="utf-8")
            tmp.replace(path)
        _DISK, _DISK_STAMP = data, _stamp(path)
    except OSError:  # a read-only home: this process's memo still holds it
        pass


def lookup(key: str, spec: dict[str, Any], measure) -> dict | None:
    """The cache entry `key`, measured by `measure()` when this process may (`measuring_here`), else noted as missing
    (None: the estimate keeps its formula meanwhile). A measurement that raised is remembered as failed (the entry
    {"failed": "Type: message"}) and named to the collector, never silently taken for the formula."""
    found = cached(key)
    if found is None and _HERE:
        try:
            found = measure()
        except Exception as exc:  # noqa: BLE001 - a family this path cannot build or run: named, the formula kept
            found = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
        remember(key, found)
    if found is None:
        note_missing(key, spec)
        return None
    if "failed" in found:
        _failed_here(key, str(found["failed"]))
        return None
    return found


def layer_key(config_text: str, precision: str, targets, rank: int, dropout: bool, kv_repeated: bool,
              experts_loop: bool = False, four_bit: bool = True) -> str:
    torch_version, transformers_version = versions("torch", "transformers")
    return hashlib.sha256(json.dumps([config_text, precision, sorted(targets), rank, dropout, kv_repeated,
                                      experts_loop, four_bit, MODEL_VERSION, torch_version, transformers_version,
                                      TOKENS]).encode()).hexdigest()


def layer_saved(config_text: str, precision: str, targets: tuple[str, ...], rank: int, dropout: bool,
                kv_repeated: bool, experts_loop: bool = False, four_bit: bool = True) -> dict | None:
    """{"saved": bytes per token one decoder layer keeps for backward, "moe": whether the measured layer routes to
    experts, "own_attention": whether the family's attention bypassed the stand-in, "fp32_attention": whether q, k,
    v reach attention in fp32 (a LayerNorm family on a 4-bit base: memtune's varlen attention casts them to the
    compute dtype for FlashAttention, core/model/attention.py `_target_dtype`)}, or None where it is not measured
    (see the module docstring; in the web server, until a child has measured it: `lookup`)."""
    args = dict(config_text=config_text, precision=precision, targets=sorted(targets), rank=rank, dropout=dropout,
                kv_repeated=kv_repeated, experts_loop=experts_loop, four_bit=four_bit)
    key = layer_key(**args)
    return lookup(key, {"kind": "layer", **args}, lambda: _measure(
        config_text, precision, tuple(targets), rank, dropout, kv_repeated, experts_loop, four_bit))


def _stand_in_attention():
    import torch

    class _Saving(torch.autograd.Function):
        """What FlashAttention / SDPA's efficient kernel keep: q, k, v as passed, the output, fp32 log-sum-exp."""

        @staticmethod
        def forward(ctx, q, k, v):  # [batch, heads, tokens, dim]
            out = torch.zeros(q.shape[0], q.shape[2], q.shape[1], v.shape[-1], dtype=q.dtype)  # [b, T, H, D]: no NaN
            lse = torch.empty(q.shape[0], q.shape[1], q.shape[2], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):  # pragma: no cover - only the forward's saved tensors are measured
            raise NotImplementedError

    calls, fp32 = [0], [False]

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                  kv_repeated=False, dtype=None, **kwargs):
        calls[0] += 1
        fp32[0] = fp32[0] or query.dtype == torch.float32 != dtype
        if dtype is not None and query.dtype == torch.float32 != dtype:
            # fp32 q/k/v (after an fp32 LayerNorm): FlashAttention's wrapper (transformers' get_target_dtype) and
            # SDPA under autocast compute in the autocast dtype, on new copies
            query, key, value = (t.to(dtype) for t in (query, key, value))
        if kv_repeated and key.shape[1] != query.shape[1]:  # transformers' repeat_kv: new tensors
            n = query.shape[1] // key.shape[1]
            key, value = (t.repeat_interleave(n, dim=1) for t in (key, value))
        return _Saving.apply(query, key, value), None

    return attention, calls, fp32


def _one_layer_config(config_text: str):
    from transformers import AutoConfig

    data = json.loads(config_text)
    values = {k: v for k, v in data.items() if k not in ("model_type", "architectures", "auto_map")}
    config = AutoConfig.for_model(data["model_type"], **values)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    # one decoder layer: the first MoE one where the family mixes dense and MoE layers
    for name, value in (("num_hidden_layers", 1), ("first_k_dense_replace", 0), ("mlp_only_layers", []),
                        ("decoder_sparse_step", 1), ("vocab_size", 256)):
        if hasattr(text, name) or name == "num_hidden_layers":
            setattr(text, name, value)
    if isinstance(getattr(text, "layer_types", None), list):
        text.layer_types = text.layer_types[:1]
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(text, name, None) is not None:
            setattr(text, name, 0)
    text.tie_word_embeddings = False
    return config


class _CudaAutocastStandIn:
    """What CUDA autocast and bitsandbytes do to dtypes that the CPU does not, for the forward being measured.

    - CUDA autocast runs layer_norm / group_norm in fp32 (its fp32 op list; CPU autocast keeps them in bf16): a
      LayerNorm family's norm keeps an fp32 input and returns fp32, so the tensors after it are fp32 until a matmul.
      RMSNorm families cast back to their input dtype themselves: nothing changes for them.
    - a frozen linear computes in the compute dtype; a 4-bit one (bitsandbytes' Linear4bit.forward: `x.to(
      compute_dtype)`, `.to(inp_dtype)` on the way out) returns its INPUT's dtype, so an fp32 stream stays fp32
      (StarCoder2's GELU then keeps its 12,288-wide input in fp32); a 16-bit one under autocast returns the compute dtype.
    The fp32 copies of the frozen norm weights are per layer, not per token: `casts` holds them so they are not counted.
    """

    def __init__(self, model, dtype, four_bit: bool):
        self.model, self.dtype, self.four_bit, self.casts, self._undo = model, dtype, four_bit, {}, []

    def _fp32(self, t):
        if not t.is_floating_point() or t.element_size() >= 4:
            return t
        if id(t) not in self.casts:
            self.casts[id(t)] = t.float()
        return self.casts[id(t)]

    def storages(self) -> set[int]:
        return {t.untyped_storage().data_ptr() for t in self.casts.values()}

    def __enter__(self):
        import torch
        import torch.nn.functional as F

        if self.dtype == torch.float32:
            return self
        for name in ("layer_norm", "group_norm"):
            orig = getattr(F, name)

            def upcast(input, *args, _orig=orig, _name=name, **kwargs):
                args = list(args)
                # layer_norm(input, shape, weight, bias, eps) / group_norm(input, groups, weight, bias, eps)
                for i in (1, 2):
                    if i < len(args) and isinstance(args[i], torch.Tensor):
                        args[i] = self._fp32(args[i])
                for k in ("weight", "bias"):
                    if isinstance(kwargs.get(k), torch.Tensor):
                        kwargs[k] = self._fp32(kwargs[k])
                return _orig(input.float(), *args, **kwargs)

            setattr(F, name, upcast)
            self._undo.append((F, name, orig))
        from transformers.pytorch_utils import Conv1D  # GPT-2's linears: bitsandbytes replaces them too

        for module in self.model.modules():
            if isinstance(module, (torch.nn.Linear, Conv1D)) and not module.weight.requires_grad:
                module.forward = self._frozen_linear(module.forward)
                self._undo.append((module, "forward", None))
        return self

    def _frozen_linear(self, own):
        import torch

        def forward(x, *args, **kwargs):
            out = own(x.to(self.dtype), *args, **kwargs)
            # a linear subclass may return more than its product (Llama-4's router: scores and logits)
            return out.to(x.dtype) if self.four_bit and isinstance(out, torch.Tensor) else out

        return forward

    def __exit__(self, *exc):
        for owner, name, orig in reversed(self._undo):
            if orig is None:
                del owner.forward
            else:
                setattr(owner, name, orig)
        return False


def _llama4_routed_rows(self, hidden_states):
    """Llama4TextExperts as memtune computes it with 4-bit experts (core/levers/family_experts.py): only each
    expert's routed (non-zero) rows, through frozen weights (which save no input), written back among zeros."""
    import torch

    rows = hidden_states.view(self.num_experts, -1, self.hidden_size)
    parts = []
    for e in range(self.num_experts):
        with torch.no_grad():
            hit = (rows[e] != 0).any(dim=-1).nonzero().flatten()
        gate, up = (rows[e][hit] @ self.gate_up_proj[e]).chunk(2, dim=-1)
        y = (up * self.act_fn(gate)) @ self.down_proj[e]
        parts.append(torch.zeros_like(rows[e]).index_copy(0, hit, y.to(rows.dtype)))
    return torch.stack(parts).view(-1, self.hidden_size)


# experts classes whose 4-bit forward computes fewer rows than their own (every expert, every token): its stand-in
ROUTED_ROWS = {"Llama4TextExperts": _llama4_routed_rows}


def _measure(config_text, precision, targets, rank, dropout, kv_repeated, experts_loop=False, four_bit=True) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from core.model.lora_targets import linear_layers, resolve

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    config = _one_layer_config(config_text)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # MoE experts: stride-0 views of one expert (the real shapes and counts, one expert's memory)
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and p.dim() == 3 and p.shape[0] > 1:
                one = torch.zeros((1, *p.shape[1:]), dtype=p.dtype).expand(p.shape)
                module._parameters[name] = torch.nn.Parameter(one, requires_grad=False)
            elif p is not None and p.is_floating_point():
                p.data.zero_()  # uninitialized memory may hold NaN; zeros route and compute alike
    attention, calls, fp32 = _stand_in_attention()
    AttentionInterface.register(STAND_IN, functools.partial(attention, kv_repeated=kv_repeated, dtype=dtype))
    try:
        model.set_attn_implementation(STAND_IN)
    except Exception:  # noqa: BLE001 - a family without the interface: its own attention, flagged below
        pass
    routed = [m for m in model.modules() if type(m).__name__ in ROUTED_ROWS]
    if experts_loop and routed:
        # memtune's 4-bit forward of a family that hands every expert every token (core/levers/family_experts.py)
        # computes only the rows routed to it, found by their values: the layer's other weights are made non-zero
        # so its rows are (a constant: every token routes alike, the experts' stride-0 weights stay zero)
        for module in routed:
            module.forward = functools.partial(ROUTED_ROWS[type(module).__name__], module)
        with torch.no_grad():
            for p in model.parameters():
                if p.is_floating_point() and p.stride()[0] != 0:
                    p.fill_(0.01)
    if experts_loop and any(p.dim() == 3 for p in model.parameters()) and not routed:
        # 4-bit experts compute in memtune's loop over the routed experts (core/levers/experts.py), which keeps
        # what transformers' eager loop keeps (a frozen weight's matmul saves no input); the default grouped_mm
        # keeps other tensors (and is slow on the CPU)
        model.set_experts_implementation("eager")
    model.enable_input_require_grads()  # the layer's input carries a gradient, as every layer after the first does
    names = resolve(list(targets), linear_layers(model), rank).modules
    model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.1 if dropout else 0.0,
                                             target_modules=names))
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.to(dtype)  # TRL casts LoRA to the compute dtype on a 4-bit base
    layers = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == 1]
    layer = layers[0][0]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    inside, kept = [False], {}
    layer.register_forward_pre_hook(lambda *a: inside.__setitem__(0, True))
    layer.register_forward_hook(lambda *a: inside.__setitem__(0, False))

    stand_in = _CudaAutocastStandIn(model, dtype, four_bit)

    def pack(t):
        storage = t.untyped_storage()
        if inside[0] and storage.data_ptr() not in params and storage.nbytes():
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.arange(1, TOKENS + 1)[None] % 255 + 1
    model.train()
    with stand_in, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, use_cache=False)
    for ptr in stand_in.storages():  # frozen norm weights' fp32 copies: per layer, not per token
        kept.pop(ptr, None)
    moe = any(p.dim() == 3 for p in layer.parameters())
    return {"saved": int(round(sum(kept.values()) / TOKENS)), "moe": moe, "own_attention": calls[0] == 0,
            "fp32_attention": fp32[0]}
