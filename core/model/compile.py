"""Regional compilation (TrainConfig.compile_layers): torch.compile of each repeated decoder layer.

PyTorch's "regional compilation" recipe: compile the decoder layer, not the whole model. Every layer runs the same
code (nn.Module._call_impl -> the layer class's forward), and dynamo treats the parameters of an inlined module as
graph inputs, so the graph compiled for the first layer is reused by the others (compile time ~ one layer, not
N). What it buys on a GPU is fewer, fused kernels between the matrix products: LoRA's dropout/scale/add, RMSNorm,
RoPE, SiLU x mul, with less Python per step (bench/RESULTS.md measures it).

How it nests with what memtune installs (the GPU machine has torch 2.11 / transformers 5.17, here 2.13 / 5.2x):
- peft's LoRA layers and bitsandbytes' Linear4bit are inside the layer, so they are compiled with it; bitsandbytes
  0.50 registers its 4-bit kernels as torch custom ops (with fake kernels), which dynamo keeps as single calls.
- gradient checkpointing: transformers 5 decoder layers are GradientCheckpointingLayer; depending on the version its
  checkpoint wraps the compiled call from outside (`__call__`) or is traced inside the compiled region (`forward`),
  where dynamo turns torch.utils.checkpoint (non-reentrant, as memtune sets it) into its checkpoint operator. Both
  recompute exactly what eager does.
- memtune's varlen attention (core/model/attention.py, FlashAttention per packed row, and Gemma-2's eager attention
  per packed row) runs between the compiled graphs (torch.compiler.disable): it reads the pack's row boundaries to
  the host and keeps Python counters that dynamo would guard on. Each layer is then two graphs (before and after
  attention), still shared by all layers. transformers' own sdpa stays inside the graph. The log counts graph breaks.
- packing gives a new total length every micro-batch: layers are compiled with dynamic shapes (one graph for all
  lengths) and a bounded recompile limit, past which dynamo runs the layer eagerly instead of compiling again.
  Without checkpointing the first layer's input would need no gradient (frozen embedding) and the others' would:
  one recompile of every layer graph ("requires_grad mismatch"); compile_layers asks for the embedding output's
  gradient (enable_input_require_grads, as checkpointing does), so every layer shares one graph either way.
- the CPU embedding offload and the 4-bit output head sit outside the decoder layers: untouched.

Memory: the estimator has no term for it (core/estimate/ predicts the same peak with it on or off) until the GPU
call measures one. AOT autograd's partitioner saves at most what eager saves for the backward (it recomputes cheap
elementwise results instead), and the default mode uses no CUDA graphs (no static pools), so the eager estimate is
expected to stay an upper bound within its 10%; plan "compile" in bench/product_plans.py measures both presets.

The backend is inductor (the default of torch.compile); MEMTUNE_COMPILE_BACKEND picks another one of
torch._dynamo.list_backends() (tests use "aot_eager": the same dynamo capture and autograd split, without
inductor's code generation, which takes tens of seconds on a CPU). TORCH_LOGS=recompiles,graph_breaks prints dynamo's
reasons; the run log counts compiles and graph breaks after the first step and at the end either way (`stats`).

The compile cache (`open_cache`, below): inductor's generated code is kept in the user's own folder, one per model
shape and settings, so a second run of the same shape (a new process, as the app runs every training) loads it
instead of generating it again, and AOT autograd's cache keeps the forward/backward split, so its joint graph is not
traced again; the compiling phase says which, and summary.json's compile.cache counts it (and `phases`, dynamo's
timers, where the seconds went). Dynamo's capture still runs every time, once since floats are constants
(specialize_float): before, it traced every layer graph twice (a restarted analysis), 22 of a cached run's 27 s on
the CPU demo; from the cache that run now compiles in ~8 s. The demo's warm-up on 2 busy CPU cores: ~45-55 s cold, 20 s with inductor's cache alone (AOT
autograd's refuses a layer with a custom autograd.Function unless allowed, as open_cache does), 10 s with both.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.files import RefusedError, atomic_write_text, target
from core.levers.experts import experts_modules
from core.messages import Said, keyed, said_again

BACKEND_ENV = "MEMTUNE_COMPILE_BACKEND"
RECOMPILE_LIMIT = 16  # per code object: train/eval mode, grad on/off, per-layer constants (Gemma's sliding window)
SIDE_EFFECTS_FLAG = "skip_fwd_side_effects_in_bwd_under_checkpoint"  # dynamo config; older torch lacks it
SPECIALIZE_FLOAT = "specialize_float"  # dynamo config: Python floats as constants, not symbols


def backend() -> str:
    return os.environ.get(BACKEND_ENV, "").strip() or "inductor"


def decoder_layers(model) -> list[torch.nn.Module]:
    """The model's repeated decoder layers: transformers 5's GradientCheckpointingLayer instances, outermost only."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    found: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer) and not any(_contains(f, module) for f in found):
            found.append(module)
    return found


def _contains(outer: torch.nn.Module, inner: torch.nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def compile_layers(model) -> Said:
    """Compile each decoder layer of `model` in place (lazily: the first forward compiles). Returns the log line."""
    import torch._dynamo.config as dynamo_config

    layers = decoder_layers(model)
    if not layers:
        return Said("log.compile_skipped")
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # renamed in 2.7
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), RECOMPILE_LIMIT))
    if hasattr(dynamo_config, SPECIALIZE_FLOAT):
        # With dynamic=True a Python float in the layer (LoRA's scale, the norm's eps, attention's scaling: constants)
        # is first traced as a symbol; one that cannot become a tensor makes dynamo restart the whole analysis with
        # it constant, and the first attempt (its tracing and AOT autograd's joint graph) is thrown away: on the CPU
        # demo 22 of a cached run's 27 s of compiling (`phases`: compile_attempt_0). Constant from the start, the
        # same graph is traced once; a float that did change between calls would recompile (the log counts them).
        setattr(dynamo_config, SPECIALIZE_FLOAT, True)
    if hasattr(dynamo_config, SIDE_EFFECTS_FLAG):
        # transformers >= 5.25 wraps attention in `kernels`' use_kernelized_func, which sets and resets a
        # context variable around each forward. Under checkpointing dynamo refuses that mutation (a graph break:
        # "HOP: Unsafe side effect") unless told not to replay it in the recompute; it routes which Python function
        # is traced and is restored on exit, so the traced graph is the same either way.
        setattr(dynamo_config, SIDE_EFFECTS_FLAG, True)
    # A layer the compiler fails on (a family's code dynamo or inductor cannot take) runs as it is, with the same
    # results, instead of ending the run at its first step; the log then says no graph was captured (`stats`).
    dynamo_config.suppress_errors = True
    _one_graph_for_every_layer(model)
    varlen = _attention_outside(model)
    chosen = backend()
    for layer in layers:
        # dynamic=True: one graph for every packed length (automatic dynamic would compile a static graph first and
        # a dynamic one at the second length). Parameters keep static shapes (force_parameter_static_shapes).
        layer.compile(backend=chosen, dynamic=True)
    kinds = sorted({type(layer).__name__ for layer in layers})
    return Said("log.compile_varlen" if varlen else "log.compile", n=len(layers), kinds=", ".join(kinds), backend=chosen)


def _one_graph_for_every_layer(model) -> None:
    """The first layer's input requires grad like the others' (transformers' own enable_input_require_grads, which
    checkpointing already asks for): without it the first layer is traced for an input that needs no gradient (the
    frozen embedding's output) and the others for one that does, so dynamo compiles every layer graph twice
    ("requires_grad mismatch"), and a second run loads both from the cache. With it, one graph per layer piece;
    the backward pass then also computes the embedding output's gradient (tokens x hidden: one more small kernel)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "enable_input_require_grads") and not (getattr(base, "_require_grads_hooks", None)
                                                            or getattr(base, "_require_grads_hook", None)):
        base.enable_input_require_grads()


def _attention_outside(model) -> bool:
    """memtune's varlen attention runs outside the compiled graphs (a graph break in each layer): it reads the
    pack's row boundaries to the host, counts its paths in a module-level dict and inspects the kernel's signature,
    and dynamo would guard on those Python values (a recompile at every step). The kernel is one call anyway; the
    projections, LoRA, norms and MLP around it are what compiling fuses. True when that applies (the log says it)."""
    from core.model import attention

    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != attention.VARLEN_ATTENTION:
        return False
    from transformers import AttentionInterface

    AttentionInterface.register(attention.VARLEN_ATTENTION, _eager_varlen())
    return True


@functools.lru_cache(maxsize=1)
def _eager_varlen():
    from core.model import attention

    return torch.compiler.disable(attention.varlen_attention_forward)


def stats() -> dict[str, int]:
    """dynamo's counts in this process: `graphs` compiled, `compiles` (frames compiled: the first compile of each
    frame, every recompile, and the pieces after a graph break), `graph_breaks`."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "compiles": int(counters["frames"].get("ok", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def describe(s: dict[str, int]) -> Said:
    return Said("log.compile_counts", graphs=s["graphs"], compiles=s["compiles"], breaks=s["graph_breaks"])


def callback(emit, cache: CompileCache | None = None):
    """A TrainerCallback that makes the compile visible: a `compiling` phase over the first step (when dynamo
    compiles), then its time and dynamo's counts, and the counts again at the end. With a warm-up (kernel_warmup)
    the compile happens there: the warm-up's phase says `words()` and calls `compiled()` after it. `cache`: the
    run's compile cache (open_cache), whose words the phase says and whose hits the log and summary count."""
    from transformers import TrainerCallback

    from core.runs.events import make_event

    cache = cache or CompileCache(why=Said("log.compile.why_unopened"))

    class CompileCallback(TrainerCallback):
        started: float | None = None  # the first step's start
        announced = False  # the compiling phase said (by the warm-up, or at the first step)
        told = False

        def words(self) -> dict:
            """The compiling phase's keyed words (cached: N graphs, or first time for this shape); starts the count."""
            if not self.announced:
                self.announced = True
                cache.begin()
            return cache.words()

        def compiled(self) -> None:
            """The compile is over (the warm-up's or the first step's): its seconds and the cache's hits, said."""
            cache.end()
            emit(make_event("log", level="info", **cache.result_words()))

        def on_step_begin(self, args, state, control, **kwargs):
            if self.started is None:
                self.started = time.monotonic()
                if not self.announced:  # no warm-up compiled: the first step does
                    emit(make_event("phase", phase="compiling", progress=None, **self.words()))

        def on_step_end(self, args, state, control, **kwargs):
            if self.started is not None and not self.told:
                self.told = True
                if cache.seconds is None:  # no warm-up compiled before: the first step did
                    self.compiled()
                now = stats()
                emit(make_event("log", level="info", **keyed("log.compile_first", seconds=time.monotonic() - self.started,
                                                             counts=describe(now))))
                if not now["graphs"]:
                    # e.g. transformers' checkpoint traced inside the compiled layer, with a graph break in it
                    # (varlen attention): dynamo then runs the whole layer as it is, uncompiled
                    emit(make_event("log", level="warning", **keyed("log.compile_no_graph")))
                emit(make_event("phase", phase="training", progress=None, **keyed("log.phase.compiled")))

        def on_train_end(self, args, state, control, **kwargs):
            emit(make_event("log", level="info", **keyed("log.compile_end", counts=describe(stats()))))

    return CompileCallback()


# --- the compile cache: what one run compiled, the next loads --------------------------------------------------
# inductor's FX graph cache (the generated code) and AOT autograd's cache (the forward/backward split around it) keep
# their artefacts on disk under TORCHINDUCTOR_CACHE_DIR (Triton's kernels under TRITON_CACHE_DIR). Their own keys
# hash the graph, torch's version and inductor's settings, so a stale entry is never used; memtune only chooses the
# folder: its own (not /tmp/torchinductor_USER, which anyone on the machine could have made first), one per shape
# and settings, so that the page can say before compiling whether this shape was compiled before. Only inductor
# caches: "eager"/"aot_eager" (tests) generate no code, and AOT autograd's cache skips them.
CACHE_ENV = "MEMTUNE_COMPILE_CACHE"  # the folder of the compile caches instead of MEMTUNE_HOME/compile-cache
CACHED_BACKENDS = ("inductor",)
MANIFEST = "memtune-compile.json"
CUSTOM_FUNCTIONS_FLAG = "autograd_cache_allow_custom_autograd_functions"  # functorch config; older torch lacks it
CUSTOM_FUNCTIONS_ENV = "TORCHINDUCTOR_AUTOGRAD_CACHE_ALLOW_CUSTOM_AUTOGRAD"
# model config fields that never reach a decoder layer's graph (names, token ids, the vocabulary's size)
_NOT_SHAPE = {"_name_or_path", "name_or_path", "transformers_version", "architectures", "bos_token_id", "eos_token_id",
              "pad_token_id", "vocab_size", "tie_word_embeddings", "dtype", "torch_dtype", "use_cache",
              "quantization_config", "_commit_hash", "id2label", "label2id"}
# settings that change what is traced in a layer: dtype, 4-bit kernels, checkpointing, attention path, LoRA's
# modules/rank/scale/dropout, packing (dynamic lengths) and batch size (dynamo specializes 1 apart), offload hooks
_COMPILE_SETTINGS = ("precision", "load_in_4bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
                     "gradient_checkpointing", "attention", "packing", "per_device_train_batch_size", "lora_r",
                     "lora_alpha", "lora_dropout", "lora_target_modules", "offload_activations", "device")


def cache_key(cfg, model) -> dict:
    """What makes the compiled graphs differ: torch's version, the backend, the model's architecture fields and the
    compile-relevant settings. Two runs with equal keys compile the same graphs."""
    import peft
    import transformers

    config = getattr(model, "config", None)
    fields = config.to_dict() if hasattr(config, "to_dict") else {}
    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "backend": backend(), "cuda": torch.cuda.is_available() and getattr(cfg, "device", "") != "cpu",
            "layer": sorted({type(layer).__name__ for layer in decoder_layers(model)}),
            "model": {k: v for k, v in sorted(fields.items()) if k not in _NOT_SHAPE},
            "settings": {name: getattr(cfg, name, None) for name in _COMPILE_SETTINGS}}


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _own_folder(path: Path) -> None:
    """`path` made (0700) or checked as this user's own folder, without following a link at `path` itself: a link or
    a folder of another user there could hand our compiled code to someone else, or theirs to us (it is executed)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise RefusedError(Said("files.refused.cache_link", path=str(path)))
    if not stat.S_ISDIR(st.st_mode):
        raise RefusedError(Said("files.refused.cache_not_folder", path=str(path)))
    if st.st_uid != os.getuid():
        raise RefusedError(Said("files.refused.cache_other_user", path=str(path), uid=st.st_uid))
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours, made looser by hand or an old umask: others must not write code into it


@dataclass
class CompileCache:
    """Where this run's compile cache is, and what it knew before compiling. `folder` None: compiling without one
    (`why` says why: a backend that keeps none, or a refused folder)."""

    folder: Path | None = None
    key: dict = field(default_factory=dict)
    known: int = 0  # graphs an earlier run of the same key compiled (0: first time for this shape)
    why: str = ""
    refused: bool = False
    seconds: float | None = None
    loaded: int = 0
    compiled: int = 0
    started: float | None = None
    phases: dict = field(default_factory=dict)  # seconds per compile phase of dynamo's timers: where the time went
    _before: dict = field(default_factory=dict)
    _timers_before: dict = field(default_factory=dict)

    def words(self) -> dict:
        """The compiling phase's keyed words: cached, first time for this shape, or no cache and why."""
        from core.messages import keyed

        if self.folder is None:
            return keyed("log.compile.no_cache", why=self.why)
        if self.known:
            return keyed("log.compile.cached", n=self.known)
        return keyed("log.compile.first", shape=shape_words(self.key))

    def begin(self) -> None:
        self._before = _cache_counts()
        self._timers_before = _timers()
        self.started = time.monotonic()

    def end(self) -> dict:
        """After the first compiled step: the seconds, the graphs loaded and compiled; the manifest written for the
        next run. Returns summary.json's `cache` entry."""
        now = _cache_counts()
        diff = {k: now[k] - self._before.get(k, 0) for k in now}
        self.seconds = round(time.monotonic() - (self.started or time.monotonic()), 3)
        self.phases = _phases(self._timers_before, _timers())
        # Counted in dynamo's graphs where AOT autograd's cache took them: loaded = its hits (forward and backward
        # at once), compiled = what it saved (a graph of an analysis dynamo restarted is compiled, thrown away and
        # never saved, so a miss is no measure). Where it bypassed them all, inductor's forward and backward graphs.
        if self.folder is None:  # no cache read or written: every graph dynamo captured was compiled
            self.loaded, self.compiled = 0, diff["graphs"]
        elif diff["autograd_hit"] or diff["autograd_saved"]:
            self.loaded, self.compiled = diff["autograd_hit"], diff["autograd_saved"]
        else:
            self.loaded, self.compiled = diff["fx_hit"], diff["fx_miss"]
        if self.folder is not None and (self.loaded or self.compiled):
            # the seconds too, first or from the cache: compile_layers auto weighs the next run's compile by them
            seconds = _recorded(_manifest(self.folder))
            seconds["cached" if self.loaded and not self.compiled else "first"] = self.seconds
            with contextlib.suppress(OSError):  # a full disk costs the next run its head start, not this run
                atomic_write_text(self.folder / MANIFEST, json.dumps(
                    {"graphs": max(self.known, self.loaded + self.compiled), "key": self.key, "seconds": seconds},
                    indent=1, default=str))
        return self.summary()

    def summary(self) -> dict:
        return {"folder": str(self.folder) if self.folder else None, "hit": bool(self.loaded and not self.compiled),
                "loaded": self.loaded, "compiled": self.compiled, "seconds": self.seconds,
                "known_before": self.known, "why_not": self.why or None, "phases": self.phases}

    def result_words(self) -> dict:
        from core.messages import keyed

        if self.folder is None:
            return keyed("log.compile.result_uncached", seconds=self.seconds or 0.0, why=self.why)
        return keyed("log.compile.result", seconds=self.seconds or 0.0, loaded=self.loaded, compiled=self.compiled,
                     folder=self.folder)


def shape_words(key: dict) -> str:
    """A key's few words for the page: the layer, its width and depth, the dtype, checkpointing, attention."""
    model, settings = key.get("model", {}), key.get("settings", {})
    parts = [", ".join(key.get("layer", [])) or "?", f"hidden {model.get('hidden_size', '?')}",
             f"{model.get('num_hidden_layers', '?')} layers", str(settings.get("precision", "")),
             "checkpointing" if settings.get("gradient_checkpointing") else "no checkpointing",
             f"attention {settings.get('attention', '')}"]
    if settings.get("packing"):
        parts.append("packing")
    return ", ".join(p for p in parts if p)


def _cache_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "fx_hit": int(counters["inductor"].get("fxgraph_cache_hit", 0)),
            "fx_miss": int(counters["inductor"].get("fxgraph_cache_miss", 0)),
            "autograd_hit": int(counters["aot_autograd"].get("autograd_cache_hit", 0)),
            "autograd_saved": int(counters["aot_autograd"].get("autograd_cache_saved", 0))}


def _timers() -> dict[str, list[float]]:
    """dynamo's own compile timers in this process (what torch._dynamo.utils.compile_times prints): seconds per call
    of each timed phase (dynamo's capture `_compile.compile_inner`, the backend `OutputGraph.call_user_compiler`,
    AOT autograd, inductor's code generation or its cache load, ...), copied."""
    from torch._dynamo.utils import compilation_time_metrics

    return {k: list(v) for k, v in compilation_time_metrics.items()}


def _phases(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, float]:
    """The seconds each phase took between two `_timers()` readings, the longest first. Phases nest (the capture
    includes the backend, the backend AOT autograd...): they are not to be summed. With the capture's and the
    backend's totals, a second run's compile splits into dynamo tracing the layers again (capture less backend)
    and loading what the caches kept (the backend)."""
    spent = {k: round(sum(v[len(before.get(k, [])):]), 3) for k, v in after.items()}
    return {k: t for k, t in sorted(spent.items(), key=lambda kv: -kv[1]) if t > 0}


def cache_home() -> Path:
    from core.config.settings import cache_root

    return Path(os.environ.get(CACHE_ENV, "").strip() or cache_root() / "compile-cache")


def open_cache(cfg, model, emit=None) -> CompileCache:
    """This run's compile cache, its folder made (the user's own, 0700) and torch pointed at it before the first
    compile; a backend without one, or a refused folder, compiles without it (and inductor's caches are off, so
    nothing is read from or written to a folder memtune did not check). A refusal is a keyed warning to `emit`."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    key = cache_key(cfg, model)
    if key["backend"] not in CACHED_BACKENDS:
        return CompileCache(key=key, why=Said("log.compile.why_backend", backend=key["backend"]))
    home = cache_home()
    folder = None
    try:
        # the folders above the cache home are resolved (a link the user made there is theirs); the home and the
        # key's folder are made or checked without following a link
        parent = target(home.parent, "keep the compile cache in")
        parent.mkdir(parents=True, exist_ok=True)
        _own_folder(parent / home.name)
        folder = parent / home.name / _digest(key)
        _own_folder(folder)
    except (RefusedError, OSError) as exc:
        keyed_refusal = isinstance(exc, RefusedError) and exc.key
        why = said_again(exc.key, exc.params) if keyed_refusal else Said("msg.text", text=str(exc))
        inductor_config.fx_graph_cache = False
        functorch_config.enable_autograd_cache = False
        if emit is not None:
            from core.messages import keyed
            from core.runs.events import make_event

            emit(make_event("log", level="warning", **keyed("log.compile.refused", why=why)))
        return CompileCache(key=key, why=why, refused=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)  # read at every cache access (runtime_utils.cache_dir)
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    if hasattr(functorch_config, CUSTOM_FUNCTIONS_FLAG) and CUSTOM_FUNCTIONS_ENV not in os.environ:
        # The layers trace a custom torch.autograd.Function (autograd_function_apply), which AOT autograd's cache
        # refuses by default: every run would trace the joint graph again (the demo's warm-up from the cache: 20 s
        # without, 10 s with it). Its traced forward and backward are part of the hashed graph, and PyTorch checked
        # the operator pure in its inputs (pytorch#149751) before offering the flag; the user's env var wins.
        setattr(functorch_config, CUSTOM_FUNCTIONS_FLAG, True)
    return CompileCache(folder=folder, key=key, known=_known(_manifest(folder)))


def _manifest(folder: Path) -> dict:
    """What an earlier run of this key wrote in `folder` ({} when nothing readable)."""
    try:
        found = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _recorded(manifest: dict) -> dict:
    """The compile seconds an earlier run of this key recorded in its manifest: {"first": s, "cached": s}, as known."""
    seconds = manifest.get("seconds")
    return {k: v for k, v in seconds.items() if k in ("first", "cached") and isinstance(v, (int, float))
            and not isinstance(v, bool) and v > 0} if isinstance(seconds, dict) else {}


def _known(manifest: dict) -> int:
    """Graphs an earlier run of this key left (its manifest), 0 when none."""
    try:
        return int(manifest.get("graphs", 0))
    except (ValueError, TypeError):
        return 0


# --- compile_layers auto: compile when it pays for this run ------------------------------------------------------
# What compiling costs and saves, measured on the product path with today's `fastest` (bench/RESULTS.md run 24: one
# H100, Llama-3.1-8B, 8 packs x 1, one process per row, eager and compiled-from-the-cache rows alternated twice in one
# call, 28 steps each on the same batches): 22.6 s to compile with an empty cache, 6.3-7.1 s from the cache (median
# 6.8); each compiled micro-step 0.0295 s shorter than the eager one it pairs with (median of 96 pairs, 1.08x;
# RESULTS.md run 21 with the older levers: 0.03 s). What compiling removes is per-layer host work (LoRA's scale and
# add, norms, activations issued as fewer kernels: 3,263 launches per step against 3,644), so the saving is counted
# per decoder layer and micro-step: 0.0295 s over 32 layers. With checkpointing it lost (RESULTS.md run 21,
# `lowest_memory`: 2,682 and 3,119 compiled against 3,585 eager tok/s): auto leaves it off there. This machine's own
# compile seconds for the shape (the cache's manifest) replace the measured ones once a run has compiled it.
FIRST_S, CACHED_S = 22.6, 6.8
SAVED_PER_LAYER_S = 0.0295 / 32


def compiles(cfg) -> bool:
    """Whether the layers compile: compile_layers on (auto is settled by `settle` before loading; elsewhere off)."""
    return cfg.compile_layers == "on"


def micro_steps(cfg, plan, processes: int = 1) -> int:
    """The micro-steps (forward + backward) one process runs in this training, from the data plan."""
    if cfg.max_steps > 0:
        return cfg.max_steps * cfg.gradient_accumulation_steps
    # packs where this run packs them (the plan counted them as asked; a model that trains unpacked, its rows)
    sequences = plan.n_packs if cfg.packing and plan.packing and plan.n_packs else plan.n_train
    per_epoch = -(-sequences // max(1, cfg.per_device_train_batch_size * processes))
    return max(1, round(per_epoch * cfg.num_train_epochs))


def decide(cfg, *, cuda: bool, steps: int, layers: int, known: int, seconds: dict) -> tuple[bool, Said]:
    """compile_layers auto for one run: on when the host time compiling saves over its `steps` micro-steps of
    `layers` decoder layers exceeds the compile's own (from the cache: `known` graphs; `seconds`: this machine's
    earlier compile seconds of the shape, else the measured ones), and the log line that says why, with the figures."""
    if not cuda:
        return False, Said("log.compile.auto_cpu")
    if cfg.gradient_checkpointing:
        return False, Said("log.compile.auto_checkpointing")
    if cfg.stream_layers:  # the layers' weights move between ring buffers: a graph would hold one layer's
        return False, Said("log.compile.auto_stream")
    if not layers:
        return False, Said("log.compile.auto_no_layers")
    kind = "cached" if known else "first"
    here = kind in seconds
    cost = float(seconds[kind]) if here else (CACHED_S if known else FIRST_S)
    saved = steps * layers * SAVED_PER_LAYER_S
    source = Said("log.compile.source_here") if here else Said("log.compile.source_measured")
    said = Said("log.compile.auto_on" if saved > cost else "log.compile.auto_off", saved=saved, steps=steps,
                layers=layers, cost=cost, source=source,
                cache=Said("log.compile.cache_warm", n=known) if known else Said("log.compile.cache_cold"))
    return saved > cost, said


def unmeasured(cfg, tree, adapted: list, processes: int = 1) -> Said | None:
    """What sets this run apart from those compiling was measured on (SFT of a dense decoder trained as it is), from
    the user's own model: a preference stage (its reference pass runs the same layers with the adapter off), experts
    (transformers' experts interface), or a model families.adapt changed (`adapted`: preflight's list; stateful
    mixers, alibi, sinks, a logit transform), or several processes. None when nothing does."""
    if cfg.stage != "sft":
        return Said("log.compile.auto_stage", stage=cfg.stage)
    if processes > 1:  # DDP/FSDP wrap the layers and synchronize between them: not measured compiled
        return Said("log.compile.auto_gpus", n=processes)
    if experts_modules(tree):
        return Said("log.compile.auto_experts")
    if adapted:
        return Said("log.compile.auto_adapted")
    return None


def settle(cfg, tree, plan, cuda: bool, processes: int = 1, adapted: list = (),
           done: int = 0) -> tuple[Any, Said | None]:
    """`cfg` with compile_layers auto settled to on or off for this run (`tree`: the model on the meta device, whose
    decoder layers and compile key are the loaded model's; `adapted`: what preflight changed for it; `done`: the
    optimizer steps a resumed run has behind it), and the line that says why; as is, with None, when the user chose
    on or off, or when only the data plan's steps can decide (`plan` None: a run of epochs on a GPU)."""
    if cfg.compile_layers != "auto":
        return cfg, None
    if cuda and (why := unmeasured(cfg, tree, list(adapted), processes)):
        return cfg.replace(compile_layers="off"), why
    counted = plan is not None or cfg.max_steps > 0
    if not counted and cuda and not cfg.gradient_checkpointing and decoder_layers(tree):
        return cfg, None
    key = cache_key(cfg, tree)
    manifest = _manifest(cache_home() / _digest(key)) if key["backend"] in CACHED_BACKENDS else {}
    known = _known(manifest)
    # uncounted, the decision is made before the steps matter (the CPU, checkpointing, no decoder layers)
    left = max(0, micro_steps(cfg, plan, processes) - done * cfg.gradient_accumulation_steps) if counted else 0
    on, said = decide(cfg, cuda=cuda, steps=left, layers=len(decoder_layers(tree)),
                      known=known, seconds=_recorded(manifest) if known else {})
    return cfg.replace(compile_layers="on" if on else "off"), said
