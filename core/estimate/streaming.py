"""What stream_layers costs in time: the copies of an optimizer step over the host link against its compute.

Copies (core/levers/stream_layers.py, steady state): each micro-batch's forward pass copies every layer but the
STREAM_SLOTS whose bytes the last backward pass left in the ring, and its backward pass (the recompute under
checkpointing runs with the layer bound, no copy of its own) copies them again, from the last: 2 x (layers - slots)
layers per micro-batch. Compute: the matrix products of the frozen linears and the head, 2 flop per parameter and
token forward, 2 more for the input's gradient (a frozen weight has none), 2 more for the recompute under
checkpointing. Copies run on a side stream beside compute, so a step takes about the longer of the two, and streaming
makes it `slowdown` times as long. The rates are this machine's (core/gpus/link.py, measured once and cached); the
product rate is a dense bf16 one, above what the 4-bit kernels reach, so the compute is a lower bound and the
slowdown an upper one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from core.config.slices import ModelSlice, TrainerSlice
from core.estimate.terms import GIB, STREAM_SLOTS, streamed_bytes
from core.gpus.link import Link, cached
from core.model.shapes import ModelShape


class _Streamed(ModelSlice, TrainerSlice, Protocol):
    """The streamed weights and the step that goes through them: checkpointing and the accumulation."""


@dataclass(frozen=True)
class StreamSpeed:
    copied_bytes: int  # per optimizer step
    flops: float  # per optimizer step: the matrix products
    link: Link | None  # this machine's measured rates; None where not measured

    @property
    def copy_s(self) -> float | None:
        return self.copied_bytes / self.link.h2d_bytes_per_s if self.link else None

    @property
    def compute_s(self) -> float | None:
        return self.flops / self.link.matmul_flops if self.link else None

    @property
    def slowdown(self) -> float | None:
        """How many times as long a step takes as without streaming (the longer of copies and compute, over
        compute); None where not measured."""
        if not self.link or not self.compute_s:
            return None
        return max(self.copy_s, self.compute_s) / self.compute_s


def copies_per_micro_batch(layers: int, slots: int = STREAM_SLOTS) -> int:
    """Layer copies a forward and backward pass make once the ring is warm (see the module docstring)."""
    return 2 * max(0, layers - slots)


def stream_speed(cfg: _Streamed, shape: ModelShape, tokens: int, link: Link | None = None) -> StreamSpeed | None:
    """stream_layers' copies and compute per optimizer step at `tokens` per micro-batch, with `link`'s rates
    (default: this machine's cached ones, None where never measured); None without stream_layers."""
    streamed = streamed_bytes(cfg, shape)
    if not streamed:
        return None
    layers = max(1, shape.num_hidden_layers)
    accumulation = max(1, cfg.gradient_accumulation_steps)
    copied = copies_per_micro_batch(layers) * -(-streamed // layers) * accumulation
    head = shape.head_params or shape.vocab_size * shape.hidden_size  # a tied head multiplies by the embedding
    per_token = (6 if cfg.gradient_checkpointing else 4) * (shape.linear_params + head)
    return StreamSpeed(copied, float(per_token) * tokens * accumulation, link if link is not None else cached())


def speed_note(speed: StreamSpeed) -> str:
    """The estimate's note (English, as its other notes): the bytes copied per step and, where measured, the time."""
    gib = speed.copied_bytes / GIB
    if speed.link is None:
        return (f"stream_layers copies {gib:.1f} GiB per optimizer step over the host link; the link is not measured "
                "on this machine yet (a stream_layers run on its GPU measures it once)")
    return (f"stream_layers copies {gib:.1f} GiB per optimizer step: {speed.copy_s:.2f} s at "
            f"{speed.link.h2d_bytes_per_s / 1e9:.1f} GB/s (measured here) against {speed.compute_s:.2f} s of matrix "
            f"products at {speed.link.matmul_flops / 1e12:.0f} TFLOP/s: steps up to {speed.slowdown:.1f}x as long as "
            "without streaming")
