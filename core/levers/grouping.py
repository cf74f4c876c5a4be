"""How 4-bit MoE experts compute (core/levers/experts.py), in words the estimate reads without torch: the two experts
forwards' names, the environment switch, and the grouped path's plan and memory budget.

`MEMTUNE_EXPERTS=loop` computes one expert at a time (the reference, bitsandbytes' matmul_4bit per expert);
`grouped` or unset: grouped matrix products (experts.py also falls back to the loop where transformers has no grouped
product, which every supported transformers has).
"""

from __future__ import annotations

import os
from typing import NamedTuple

# our experts forwards' names in transformers' ExpertsInterface: one expert at a time, or grouped products
LOOP, GROUPED = "memtune_nf4", "memtune_nf4_grouped"
CHOICE = "MEMTUNE_EXPERTS"  # environment: "loop" or "grouped" (unset: grouped)
# The most compute-dtype bytes of one experts weight dequantized at once by the grouped path (a group of experts per
# bitsandbytes call and grouped product); the estimate counts this transient (`group_bytes`).
GROUP_BYTES = 512 * 2**20


def requested() -> str:
    """The experts forward the environment asks for: LOOP where MEMTUNE_EXPERTS says loop, else GROUPED."""
    return LOOP if os.environ.get(CHOICE, "").strip().lower() == "loop" else GROUPED


class Group(NamedTuple):
    """Consecutive routed experts computed by one grouped product: their ids, their rows [start, end) of the
    expert-sorted tokens, and each one's end within those rows (the grouped product's offsets)."""

    experts: list[int]
    start: int
    end: int
    offsets: list[int]


def groups(ends: list[int], expert_bytes: int, budget: int = GROUP_BYTES) -> list[Group]:
    """The grouped path's plan from `ends` (expert e's rows end at ends[e] in the expert-sorted order): experts that
    received no row are left out; each group holds as many routed experts as fit `budget` bytes of dequantized
    weight (`expert_bytes` each), one at least."""
    size = max(1, budget // max(1, expert_bytes))
    out, current = [], None
    for e, end in enumerate(ends):
        begin = ends[e - 1] if e else 0
        if end == begin:
            continue
        if current is None or len(current.experts) == size:
            current = Group([], begin, begin, [])
            out.append(current)
        current.experts.append(e)
        current.offsets.append(end - current.start)
    return [g._replace(end=g.start + g.offsets[-1]) for g in out]


def group_bytes(experts: int, expert_params: int, element_size: int, budget: int = GROUP_BYTES) -> int:
    """The largest dequantized buffer the grouped path holds for one experts weight (`expert_params` weights per
    expert, `element_size` bytes each): what the estimate counts as the transient of a 4-bit experts layer."""
    one = expert_params * element_size
    return min(experts, max(1, budget // max(1, one))) * one
