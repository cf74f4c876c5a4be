"""stream_layers: the frozen weights of the decoder layers live in host memory (pinned with CUDA), and each layer's are
copied into a small ring of device buffers just before the layer runs, then let go.

A step touches one decoder layer at a time: a 70B in NF4 is ~35 GiB of frozen weights, one of its layers ~0.45 GiB.
`attach` (core.model.load.prepare_for_training, after LoRA wraps the model) takes every frozen tensor of each decoder
layer (bitsandbytes' 4-bit data and its quantization constants, the 16-bit norms and biases) into one flat host
buffer per layer, and points the tensors at nothing (0 elements). Module hooks then move them through the ring:

- forward: the layer's pre-hook copies its bytes into ring slot `index % slots` (on a side stream on CUDA, already
  under way when the layer before it started: a lookahead of slots - 1 layers), points its tensors at views of the
  slot, and its post-hook points them at nothing again;
- backward: an identity autograd function at the layer's output binds the layer again before any of its backward
  nodes runs (under gradient checkpointing, the recompute of transformers' checkpointed `forward` runs inside it) and
  starts the copy of the layer below; one at the layer's input lets it go once its input's gradient is complete. A
  layer whose input has no gradient (the first, without checkpointing) is let go when the backward pass ends.

Each layer always uses the same slot: what autograd saved of a 4-bit weight in the forward pass (bitsandbytes keeps a
view of its data) points into that slot, and holds that layer's bytes again whenever the layer's backward runs. The
LoRA weights, their optimizer state, the embeddings, the head and everything else outside the decoder layers stay on
the device. Same losses and gradients as without it (tests/test_stream_layers.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time
from dataclasses import dataclass, field
from typing import Any

import torch

SLOTS = 2  # ring buffers: the layer that runs and the one being copied
PENDING_MAX = 4096  # CUDA event pairs kept before the finished ones are read
ALIGN = 256  # byte alignment of each tensor inside a slot (any dtype's view, vectorized kernels)


@dataclass
class _Piece:
    tensor: torch.Tensor  # the object modules and autograd hold: its .data moves, the object stays
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: torch.Size


@dataclass
class _Layer:
    index: int
    pieces: list[_Piece]
    nbytes: int
    host: torch.Tensor  # uint8, pinned with CUDA


@dataclass
class Stats:
    """What streaming did: bytes and copies, and how long compute waited for copies (CUDA: GPU time the compute stream
    stood at a copy's event; CPU: the copy itself, which is synchronous there)."""

    copies: int = 0
    bytes: int = 0
    wait_s: float = 0.0
    pending: list[tuple[Any, Any]] = field(default_factory=list)  # CUDA event pairs not yet read


def frozen_tensors(layer: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors of `layer` that streaming moves: every parameter that does not train, and for a bitsandbytes 4-bit
    weight its absmax (and nested absmax). The quantization code tables and offsets stay: a few bytes each, and a
    code table may be shared (bitsandbytes caches the dynamic map on the CPU)."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    for module in layer.modules():
        for param in module.parameters(recurse=False):
            if param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            out.append(param)
            state = getattr(param, "quant_state", None)
            if state is not None:
                out.append(state.absmax)
                if getattr(state, "nested", False) and state.state2 is not None:
                    out.append(state.state2.absmax)
    return out


def decoder_layers(model) -> torch.nn.ModuleList:
    """The model's decoder layers: the longest ModuleList of modules of one class (model.model.layers for Llama)."""
    best: torch.nn.ModuleList | None = None
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) and len({type(m) for m in module}) == 1:
            if best is None or len(module) > len(best):
                best = module
    if best is None:
        raise ValueError("no decoder layers found to stream")
    return best


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """A host buffer of exactly `nbytes`, page-locked in place when `pin` (cudaHostRegister, as torch's distributed
    checkpoint stager does): torch's pinned allocator rounds each buffer up to a power of two, 0.45 GiB to 0.5 GiB per
    70B layer, 4 GiB more host memory over 80 layers."""
    host = torch.empty(nbytes, dtype=torch.uint8)
    if pin:
        try:
            from torch.cuda import _pin_memory_utils

            _pin_memory_utils.pin_memory(host.data_ptr(), nbytes)
        except (ImportError, AttributeError, RuntimeError):  # an older torch, or registering refused: its allocator
            host = host.pin_memory()
    return host


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim, or None (another C library, another system)."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def give_back_freed() -> None:
    """The C allocator's free memory back to the system (glibc's malloc_trim). A layer's loaded tensors, freed once
    its host copy exists, are large blocks glibc keeps in its heap: without this the resident memory holds the
    model's streamed weights twice (measured: +160 MiB of 167 MiB streamed on a 0.45B model, none after a trim)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _pack(index: int, tensors: list[torch.Tensor], pin: bool) -> _Layer:
    pieces, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        pieces.append(_Piece(t, offset, nbytes, t.dtype, t.shape))
        offset = _aligned(offset + nbytes)
    host = _host_buffer(max(offset, 1), pin)
    for p in pieces:
        if p.nbytes:
            host[p.offset:p.offset + p.nbytes].copy_(p.tensor.detach().reshape(-1).view(torch.uint8))
    return _Layer(index, pieces, offset, host)


class _OnBackward(torch.autograd.Function):
    """Identity whose backward first calls `then()`: at a layer's output it runs before any backward node of the
    layer (load it), at its input once the layer's backward has produced its input's gradient (let it go)."""

    @staticmethod
    def forward(ctx, x, then):
        ctx.then = then
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.then()
        return grad, None


class Streamer:
    """The host copies, the ring of device slots and the hooks of one model's decoder layers (see the module
    docstring). `device`: where the layers compute."""

    def __init__(self, layers: torch.nn.ModuleList, device: torch.device, slots: int = SLOTS):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.modules = list(layers)
        self._empty: dict[torch.dtype, torch.Tensor] = {}
        self.layers: list[_Layer] = []
        self.bound: set[int] = set()  # layers whose tensors point into their slot now
        for i, m in enumerate(self.modules):  # each layer's own copy goes as soon as its host copy exists
            self.layers.append(_pack(i, frozen_tensors(m), pin=self.cuda))
            self._unbind(i)
            give_back_freed()  # so the process holds the model once, plus one layer, while it packs
        self.slots = [torch.empty(max(l.nbytes for l in self.layers), dtype=torch.uint8, device=self.device)
                      for _ in range(max(1, min(slots, len(self.layers))))]
        self.owner = [-1] * len(self.slots)  # whose bytes each slot holds
        self.ready: list[Any] = [None] * len(self.slots)  # CUDA: the copy into the slot is done
        self.freed: list[Any] = [None] * len(self.slots)  # CUDA: compute reading the slot is done
        self.backward: set[int] = set()  # layers between their backward's start and end
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.stats = Stats()
        self._end_queued = False
        for i, module in enumerate(self.modules):
            module.register_forward_pre_hook(self._pre_hook(i), with_kwargs=True)
            module.register_forward_hook(self._post_hook(i))

    # --- the ring ------------------------------------------------------------------------------------------------
    def slot_of(self, index: int) -> int:
        return index % len(self.slots)

    def host_bytes(self) -> int:
        return sum(l.host.numel() for l in self.layers)

    def device_bytes(self) -> int:
        return sum(s.numel() for s in self.slots)

    def fetch(self, index: int) -> None:
        """Start copying layer `index` into its slot unless the slot holds it already; a slot bound to another layer
        is never overwritten (that copy waits for the bind)."""
        if not 0 <= index < len(self.layers):
            return
        s = self.slot_of(index)
        if self.owner[s] == index:
            return
        if any(self.slot_of(b) == s for b in self.bound):
            return
        layer, slot = self.layers[index], self.slots[s]
        if self.cuda:
            with torch.cuda.stream(self.stream):
                if self.freed[s] is not None:
                    self.stream.wait_event(self.freed[s])
                slot[:layer.nbytes].copy_(layer.host[:layer.nbytes], non_blocking=True)
                self.ready[s] = self.stream.record_event()
        else:
            start = time.perf_counter()
            slot[:layer.nbytes].copy_(layer.host[:layer.nbytes])
            self.stats.wait_s += time.perf_counter() - start
        self.owner[s] = index
        self.stats.copies += 1
        self.stats.bytes += layer.nbytes

    def bind(self, index: int) -> None:
        """Layer `index`'s tensors point at its slot, its bytes there (copied now if they were not), and the copy of
        the layers after it (`ahead`) under way."""
        if index in self.bound:
            return
        s = self.slot_of(index)
        holder = [b for b in self.bound if self.slot_of(b) == s]
        if holder:
            raise RuntimeError(f"stream_layers: layer {index}'s ring slot is still bound to layer {holder[0]}")
        self.fetch(index)
        if self.cuda and self.ready[s] is not None:
            compute = torch.cuda.current_stream(self.device)
            before = compute.record_event(torch.cuda.Event(enable_timing=True))
            compute.wait_event(self.ready[s])
            after = compute.record_event(torch.cuda.Event(enable_timing=True))
            self.stats.pending.append((before, after))
            if len(self.stats.pending) > PENDING_MAX:  # a long run: read the finished pairs, without waiting
                self._drain(block=False)
        slot = self.slots[s]
        for p in self.layers[index].pieces:
            p.tensor.data = slot[p.offset:p.offset + p.nbytes].view(p.dtype).view(p.shape)
        self.bound.add(index)

    def ahead(self, index: int, step: int) -> None:
        """Start the copies of the next slots - 1 layers in the direction of `step` (+1 forward, -1 backward)."""
        for k in range(1, len(self.slots)):
            self.fetch(index + step * k)

    def _unbind(self, index: int) -> None:
        for p in self.layers[index].pieces:
            empty = self._empty.get(p.dtype)
            if empty is None:
                empty = self._empty[p.dtype] = torch.empty(0, dtype=p.dtype, device=self.device)
            p.tensor.data = empty
        self.bound.discard(index)

    def release(self, index: int) -> None:
        """Layer `index`'s tensors point at nothing; its slot may be overwritten once the compute queued so far
        (which may read it) is done."""
        if index not in self.bound:
            return
        self._unbind(index)
        if self.cuda:
            self.freed[self.slot_of(index)] = torch.cuda.current_stream(self.device).record_event()

    # --- hooks ---------------------------------------------------------------------------------------------------
    def _pre_hook(self, index: int):
        done = functools.partial(self.backward_done, index)

        def hook(module, args, kwargs):
            if index not in self.backward:  # a new forward pass: what a finished backward left bound goes
                for stale in sorted(self.backward):
                    self.backward.discard(stale)
                    self.release(stale)
            self.bind(index)
            self.ahead(index, +1)
            if not torch.is_grad_enabled():
                return None
            if args and isinstance(args[0], torch.Tensor) and args[0].requires_grad:
                return (_OnBackward.apply(args[0], done), *args[1:]), kwargs
            if isinstance(kwargs.get("hidden_states"), torch.Tensor) and kwargs["hidden_states"].requires_grad:
                return args, {**kwargs, "hidden_states": _OnBackward.apply(kwargs["hidden_states"], done)}
            return None
        return hook

    def _post_hook(self, index: int):
        start = functools.partial(self.backward_start, index)

        def hook(module, args, output):
            if index in self.backward:  # a recompute inside the backward pass: the backward still needs it
                return None
            self.release(index)
            if not torch.is_grad_enabled():
                return None
            if isinstance(output, torch.Tensor) and output.requires_grad:
                return _OnBackward.apply(output, start)
            if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor) and output[0].requires_grad:
                return (_OnBackward.apply(output[0], start), *output[1:])
            return None
        return hook

    def backward_start(self, index: int) -> None:
        self.backward.add(index)
        if not self._end_queued:  # whatever is still bound when this backward pass ends goes then
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
            self._end_queued = True
        self.bind(index)
        self.ahead(index, -1)

    def backward_done(self, index: int) -> None:
        self.backward.discard(index)
        self.release(index)

    def _backward_end(self) -> None:
        self._end_queued = False
        for index in sorted(self.backward):
            self.release(index)
        self.backward.clear()

    # --- what it cost ----------------------------------------------------------------------------------------------
    def wait_seconds(self) -> float:
        """Seconds compute waited for copies so far (CUDA: reads the event pairs, waiting for those not done)."""
        self._drain(block=True)
        return self.stats.wait_s

    def _drain(self, block: bool) -> None:
        left = []
        for before, after in self.stats.pending:
            if block:
                after.synchronize()
            elif not after.query():
                left.append((before, after))
                continue
            self.stats.wait_s += before.elapsed_time(after) / 1000.0
        self.stats.pending = left


def attach(model, device: torch.device | str | None = None, slots: int = SLOTS) -> Streamer:
    """stream_layers on `model` (loaded, LoRA attached): its decoder layers' frozen tensors go to host memory and
    through a ring of `slots` device buffers; everything else goes to (stays on) `device` (default: where the first
    decoder layer's trainable weights are). The streamer is kept as `model.memtune_streamer`."""
    layers = decoder_layers(model)
    if device is None:
        device = next((p.device for p in layers.parameters() if p.requires_grad), torch.device("cpu"))
    device = torch.device(device)
    streamer = Streamer(layers, device, slots)
    if device.type == "cuda":
        moved = {id(p.tensor) for l in streamer.layers for p in l.pieces}
        for layer in layers:  # the small quantization constants that stay resident (code tables, offsets)
            for param in layer.parameters():
                _constants_to(getattr(param, "quant_state", None), device)
        for param in model.parameters():  # what stays resident computes on the device (a model loaded to the CPU)
            if id(param) not in moved and param.device != device:
                param.data = param.data.to(device)
        for module in model.modules():
            for name, buf in module.named_buffers(recurse=False):
                if buf is not None and buf.device != device:
                    setattr(module, name, buf.to(device))
        torch.cuda.empty_cache()  # the frozen layers' device copies go back at once
    object.__setattr__(model, "memtune_streamer", streamer)
    return streamer


def _constants_to(state, device: torch.device) -> None:
    """A 4-bit weight's code tables and offset on `device`, its absmax left as it is (streamed: the tensor objects
    that move through the ring must stay the same objects)."""
    if state is None:
        return
    for holder, name in ((state, "code"), (state, "offset"), (getattr(state, "state2", None), "code")):
        value = getattr(holder, name, None) if holder is not None else None
        if isinstance(value, torch.Tensor) and value.device != device:
            setattr(holder, name, value.to(device))


def streamed_parameters(model) -> int:
    """Elements of the parameters the model's streamer holds in host memory (they count 0 where they point now)."""
    streamer = streamer_of(model)
    if streamer is None:
        return 0
    return sum(p.shape.numel() for l in streamer.layers for p in l.pieces if isinstance(p.tensor, torch.nn.Parameter))


def streamer_of(model) -> Streamer | None:
    """The model's streamer (through peft's wrapper too), or None when its layers are not streamed."""
    for m in (model, getattr(model, "base_model", None), getattr(getattr(model, "base_model", None), "model", None)):
        found = getattr(m, "memtune_streamer", None) if m is not None else None
        if found is not None:
            return found
    return None


def summary_part(model, runtime_s: float | None) -> dict[str, Any]:
    """summary.json's `stream_layers`: what streamed (host and ring bytes, copies, bytes copied) and the seconds and
    share of the training time compute stood waiting for copies; {} when the layers were not streamed."""
    streamer = streamer_of(model)
    if streamer is None:
        return {}
    wait = streamer.wait_seconds()
    return {"stream_layers": {
        "layers": len(streamer.layers), "slots": len(streamer.slots),
        "host_gib": round(streamer.host_bytes() / 2**30, 3), "ring_gib": round(streamer.device_bytes() / 2**30, 3),
        "copies": streamer.stats.copies, "copied_gib": round(streamer.stats.bytes / 2**30, 3),
        "wait_s": round(wait, 3), "wait_share": round(wait / runtime_s, 4) if runtime_s else None}}
