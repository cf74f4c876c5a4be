"""bitsandbytes' 4-bit weights on a CPU with AVX512-BF16: Linear4bit repacks its weight in place for its own
inference kernel at the first eval forward without grad (bitsandbytes >= 0.48). Merging, DoRA's magnitudes, the GGUF
export and the saved adapter's base then read a layout they do not know, and widths not divisible by 32 fail outright
("N must be divisible by block_n"). `keep_4bit_layout` turns that repacking off per module.

Not corrected here: the same release's AVX512 `dequantize_4bit` CPU kernel reads a weight's absmax as if every row
held whole 64-value blocks, so a weight whose rows are narrower than that dequantizes to wrong values. Every real
model's widths are whole blocks; replacing the kernel with bitsandbytes' generic one made compiled layers trace it
per weight shape.
"""

from __future__ import annotations


def keep_4bit_layout(model) -> None:
    """Every Linear4bit of `model` keeps bitsandbytes' standard layout on the CPU."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
