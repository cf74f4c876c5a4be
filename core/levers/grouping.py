"""How 4-bit MoE experts compute (core/levers/experts.py), in words the estimate reads without torch: the two experts
forwards' names, the environment switch, and the grouped path's chunks of experts and memory budget.

`MEMTUNE_EXPERTS=loop` computes one expert at a time (the reference, bitsandbytes' matmul_4bit per expert);
`grouped` or unset: grouped matrix products (experts.py also falls back to the loop where transformers has no grouped
product, which every supported transformers has).
"""

from __future__ import annotations

import os

# our experts forwards' names in transformers' ExpertsInterface: one expert at a time, or grouped products
LOOP, GROUPED = "memtune_nf4", "memtune_nf4_grouped"
CHOICE = "MEMTUNE_EXPERTS"  # environment: "loop" or "grouped" (unset: grouped)
# The most compute-dtype bytes of one experts weight dequantized at once by the grouped path (a chunk of consecutive
# experts per bitsandbytes call and grouped product); the estimate counts this transient (`group_bytes`).
GROUP_BYTES = 512 * 2**20


def requested() -> str:
    """The experts forward the environment asks for: LOOP where MEMTUNE_EXPERTS says loop, else GROUPED."""
    return LOOP if os.environ.get(CHOICE, "").strip().lower() == "loop" else GROUPED


def chunks(experts: int, expert_bytes: int, budget: int = GROUP_BYTES) -> list[tuple[int, int]]:
    """The grouped path's fixed plan for one experts weight: consecutive experts [start, stop) dequantized and
    multiplied together, as many as fit `budget` bytes of dequantized weight (`expert_bytes` each), one at least.
    Fixed by the shapes alone, never by the routing, so planning reads nothing back from the GPU."""
    size = max(1, budget // max(1, expert_bytes))
    return [(start, min(start + size, experts)) for start in range(0, experts, size)]


def group_bytes(experts: int, expert_params: int, element_size: int, budget: int = GROUP_BYTES) -> int:
    """The largest dequantized buffer the grouped path holds for one experts weight (`expert_params` weights per
    expert, `element_size` bytes each): what the estimate counts as the transient of a 4-bit experts layer."""
    one = expert_params * element_size
    return min(experts, max(1, budget // max(1, one))) * one
