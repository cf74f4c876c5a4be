"""Issue 44's LoRA variants on the GPU: each against plain LoRA on the Llama-3.1-8B shape with `lowest_memory`
(NVML peak, steady tokens/s, the first losses, and the estimate of each row beside its NVML peak).

Rows by priority (bench/product.py's --budget-s skips those that would end past it): plain LoRA, DoRA (the variant
with a memory and speed cost: magnitudes, two more outputs kept per adapted layer, the weight norm per forward),
LoRA+ (ratio 16: same memory, other losses), rsLoRA (same memory and speed, other scale), then the 16-bit base the
initialisations need (PiSSA/OLoRA are refused on 4 bits): plain and pissa_niter_4 (peft's fast randomized SVD).

    python -m bench.variants_plan --out "$OUT/variants" --budget-s 280
    python -m bench.variants_plan --out /tmp/variants-smoke --smoke    # the CPU check of the rows' commands

runs bench/product.py's call with this plan (its model folder, data, sampler and table), without an entry in
bench/product_plans.py (another plan file's owner): `plan("variants")` is answered here, every other name as before.
"""

from __future__ import annotations

import sys

from bench import product
from bench.product_plans import Variant

LOGGED = ["logging_steps=1", "validation_share=0"]  # a loss every step: the first losses compared row by row
SIXTEEN = ["load_in_4bit=false"]  # the 16-bit base PiSSA/OLoRA need (bf16, 16 GB on the 8B shape)


def rows(smoke: bool = False) -> list[Variant]:
    def row(name: str, sets: list[str], **kw) -> Variant:
        steps, timeout = kw.pop("steps", 10), kw.pop("timeout_s", 75)
        return Variant(name, "lowest_memory", [*LOGGED, *sets], steps=2 if smoke else steps, warm=1 if smoke else 3,
                       timeout_s=300 if smoke else timeout, **kw)

    return [row("lowest_memory-lora", []),
            row("lowest_memory-dora", ["use_dora=true"], timeout_s=90),
            row("lowest_memory-loraplus16", ["loraplus_lr_ratio=16"]),
            row("lowest_memory-rslora", ["use_rslora=true"]),
            row("lowest_memory-16bit-lora", SIXTEEN, steps=8),
            row("lowest_memory-16bit-pissa", [*SIXTEEN, "lora_init=pissa_niter_4"], steps=8, timeout_s=90)]


def main(argv: list[str] | None = None) -> int:
    """`--smoke`: the same rows for 2 steps on bench/product.py's tiny Llama on the CPU (its plan "...smoke")."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = "variants-smoke" if "--smoke" in argv else "variants"
    argv = [a for a in argv if a != "--smoke"]
    before = product.plan
    product.plan = lambda asked: rows(asked.endswith("smoke")) if asked.startswith("variants") else before(asked)
    try:
        return product.main(["--plan", name, *argv])
    finally:
        product.plan = before


if __name__ == "__main__":
    sys.exit(main())
