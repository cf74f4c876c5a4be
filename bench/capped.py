"""The product's CLI run as on a smaller card: `python -m core.train` in a process whose CUDA allocator may hold no
more than the card less the CUDA context (torch.cuda.set_per_process_memory_fraction), so a row measured on an H100
says whether the run fits, say, a 6 GiB card: past the cap it fails with the out-of-memory error that card gives.

    python -m bench.capped --card-gib 6 -- --config F --preset P [--set ...]

The arguments after `--` are `python -m core.train`'s. The CUDA context (and paged optimizer state, in managed memory)
is outside the allocator, so the cap is the card less core.estimate.terms.CUDA_CONTEXT, what the estimate adds for it.
"""

from __future__ import annotations

import argparse
import sys


def allocator_fraction(card_bytes: int, total_bytes: int, context_bytes: int) -> float:
    """The share of this GPU the allocator may hold for the run to fit a card of `card_bytes` (NVML's figure)."""
    if card_bytes <= context_bytes:
        raise ValueError(f"a card of {card_bytes} bytes holds no more than the CUDA context ({context_bytes})")
    return min(1.0, (card_bytes - context_bytes) / total_bytes)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(prog="python -m bench.capped")
    ap.add_argument("--card-gib", type=float, required=True, help="the card's memory in GiB, as NVML counts it")
    args = ap.parse_args(ours)
    import torch

    from core.estimate.terms import CUDA_CONTEXT, GIB
    from core.train.cli import main as train_main  # the CLI itself: same config, preset, overrides and run

    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(allocator_fraction(int(args.card_gib * GIB), total, CUDA_CONTEXT), 0)
    return train_main(train_args)


if __name__ == "__main__":
    sys.exit(main())
