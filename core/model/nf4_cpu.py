"""bitsandbytes' 4-bit weights on a CPU with AVX512: two behaviours memtune corrects, each checked, not assumed.

- Its AVX512 `dequantize_4bit` CPU kernel (bitsandbytes 0.49-0.50) reads a weight's absmax as if every row held whole
  64-value blocks. Quantization blocks run over the flattened weight, so a weight whose rows are not a multiple of
  the block dequantizes to wrong values (a 96 x 32 weight: max error 0.048 against 0.010 for 256 x 128, of values up
  to 0.09). `correct_cpu_dequantize` asks the kernel on such a shape once; where it disagrees with bitsandbytes' own
  generic implementation, that implementation becomes the CPU kernel for every shape.
- Linear4bit repacks its weight in place for its AVX512-BF16 inference kernel at the first eval forward without
  grad: merging, DoRA's magnitudes and the GGUF export then read a layout they do not know, and widths not divisible
  by 32 fail outright ("N must be divisible by block_n"). `keep_4bit_layout` turns that off per module.
"""

from __future__ import annotations

import functools
import warnings

import torch


def keep_4bit_layout(model) -> None:
    """Every Linear4bit of `model` keeps bitsandbytes' standard layout on the CPU."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


@functools.cache
def correct_cpu_dequantize() -> bool:
    """Route CPU dequantization to bitsandbytes' generic implementation where its registered CPU kernel gets a
    blocks-across-rows weight wrong (once per process). True when it did."""
    try:
        import bitsandbytes.functional as bnbf
        from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
        from bitsandbytes.backends.utils import _get_4bit_code
    except ImportError:  # no bitsandbytes, or a release without these: nothing to compare against
        return False

    def generic(A, absmax, blocksize, quant_type, shape, dtype):
        if A.dtype != torch.uint8:
            A = A.view(torch.uint8)
        return _dequantize_4bit_compute(A.reshape(-1), absmax.float(), _get_4bit_code(quant_type, A.device),
                                        blocksize, shape, dtype)

    generator = torch.Generator().manual_seed(0)
    w = torch.randn(96, 32, generator=generator).to(torch.bfloat16)  # 32 wide: 64-value blocks span two rows
    packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", quant_storage=torch.uint8)
    registered = bnbf.dequantize_4bit(packed, state)
    if torch.equal(registered, generic(packed, state.absmax, 64, "nf4", state.shape, state.dtype)):
        return False
    with warnings.catch_warnings():  # torch says it overrides a registered kernel: that is the point
        warnings.simplefilter("ignore")
        torch.library.register_kernel("bitsandbytes::dequantize_4bit", "cpu")(generic)
    return True
