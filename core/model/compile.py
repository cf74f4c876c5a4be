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
  Without checkpointing the first layer's input needs no gradient (frozen embedding) and the others' do: one
  recompile, once (TORCH_LOGS shows "requires_grad mismatch"); with it, enable_input_require_grads makes them one.
- the CPU embedding offload and the 4-bit output head sit outside the decoder layers: untouched.

Memory: the estimator has no term for it (core/estimate/ predicts the same peak with it on or off) until the GPU
call measures one. AOT autograd's partitioner saves at most what eager saves for the backward (it recomputes cheap
elementwise results instead), and the default mode uses no CUDA graphs (no static pools), so the eager estimate is
expected to stay an upper bound within its 10%; plan "compile" in bench/product_plans.py measures both presets.

The backend is inductor (the default of torch.compile); MEMTUNE_COMPILE_BACKEND picks another one of
torch._dynamo.list_backends() (tests use "aot_eager": the same dynamo capture and autograd split, without
inductor's code generation, which takes tens of seconds on a CPU). TORCH_LOGS=recompiles,graph_breaks prints dynamo's
reasons; the run log counts compiles and graph breaks after the first step and at the end either way (`stats`).
"""

from __future__ import annotations

import functools
import os
import time

import torch

from core.messages import Said, keyed

BACKEND_ENV = "MEMTUNE_COMPILE_BACKEND"
RECOMPILE_LIMIT = 16  # per code object: train/eval mode, grad on/off, per-layer constants (Gemma's sliding window)
SIDE_EFFECTS_FLAG = "skip_fwd_side_effects_in_bwd_under_checkpoint"  # dynamo config; older torch lacks it


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
    if hasattr(dynamo_config, SIDE_EFFECTS_FLAG):
        # transformers >= 5.25 wraps attention in `kernels`' use_kernelized_func, which sets and resets a
        # context variable around each forward. Under checkpointing dynamo refuses that mutation (a graph break:
        # "HOP: Unsafe side effect") unless told not to replay it in the recompute; it routes which Python function
        # is traced and is restored on exit, so the traced graph is the same either way.
        setattr(dynamo_config, SIDE_EFFECTS_FLAG, True)
    varlen = _attention_outside(model)
    chosen = backend()
    for layer in layers:
        # dynamic=True: one graph for every packed length (automatic dynamic would compile a static graph first and
        # a dynamic one at the second length). Parameters keep static shapes (force_parameter_static_shapes).
        layer.compile(backend=chosen, dynamic=True)
    kinds = sorted({type(layer).__name__ for layer in layers})
    return Said("log.compile_varlen" if varlen else "log.compile", n=len(layers), kinds=", ".join(kinds), backend=chosen)


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


def callback(emit):
    """A TrainerCallback that makes the compile visible: a `compiling` phase over the first step (when dynamo
    compiles), then its time and dynamo's counts, and the counts again at the end."""
    from transformers import TrainerCallback

    from core.runs.events import make_event

    class CompileCallback(TrainerCallback):
        started: float | None = None
        told = False

        def on_step_begin(self, args, state, control, **kwargs):
            if self.started is None:
                self.started = time.monotonic()
                emit(make_event("phase", phase="compiling", progress=None, **keyed("log.phase.compiling")))

        def on_step_end(self, args, state, control, **kwargs):
            if self.started is not None and not self.told:
                self.told = True
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
