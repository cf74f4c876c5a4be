"""A product run on a GPU capped like a smaller card: `python -m core.train`'s own CLI in this process, after
torch.cuda.set_per_process_memory_fraction limits the caching allocator.

    python -m bench.capped --card-gib 24 -- --config F --preset P [--set ...]

A card of `--card-gib` GiB holds the CUDA context and libraries (core.estimate.terms.CUDA_CONTEXT) beside what
torch allocates, so the allocator gets the card less that: NVML then reads at most about the card, and an
allocation past it fails as it would on that card (torch.OutOfMemoryError).
"""

from __future__ import annotations

import argparse
import sys


def cap(card_gib: float) -> float:
    """Limit this process's CUDA allocator to what a `card_gib` card leaves it; returns the fraction set."""
    import torch

    from core.estimate.terms import CUDA_CONTEXT, GIB

    total = torch.cuda.get_device_properties(0).total_memory
    fraction = max(0.0, min(1.0, (card_gib * GIB - CUDA_CONTEXT) / total))
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return fraction


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(prog="python -m bench.capped")
    ap.add_argument("--card-gib", type=float, required=True)
    args = ap.parse_args(argv[:split])
    fraction = cap(args.card_gib)
    print(f"[bench.capped] CUDA allocator capped at {fraction:.4f} of the GPU (a {args.card_gib:g} GiB card)",
          flush=True)
    from core.train.cli import main as train

    return train(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main())
