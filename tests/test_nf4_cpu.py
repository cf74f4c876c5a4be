"""core/model/nf4_cpu.py: 4-bit weights dequantize to what was quantized on this machine's CPU, whatever its width,
and an eval forward leaves a Linear4bit's weight in bitsandbytes' standard layout."""

from __future__ import annotations

import pytest
import torch

bnbf = pytest.importorskip("bitsandbytes.functional")


@pytest.mark.parametrize("shape", [(256, 128), (96, 32), (64, 48), (40, 24)])
def test_a_4bit_weight_dequantizes_to_its_values_whatever_its_row_width(shape):
    from core.model.nf4_cpu import correct_cpu_dequantize

    correct_cpu_dequantize()
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True,
                                       quant_storage=torch.uint8)
    back = bnbf.dequantize_4bit(packed, state).float()
    blocks = w.float().reshape(-1, 64)  # the quantizer's blocks run over the flattened weight
    # NF4's widest gap between neighbouring levels is 0.28 of the block's absmax: no value moves by more than half
    # of it (plus the 8-bit absmax's own rounding). Rows read as whole blocks miss this by 3-5x on a 32-wide weight.
    bound = 0.16 * blocks.abs().amax(dim=1, keepdim=True)
    assert ((back.reshape(-1, 64) - blocks).abs() <= bound).all()


def test_an_eval_forward_on_the_cpu_keeps_the_weight_layout():
    import bitsandbytes as bnb

    from core.model.nf4_cpu import keep_4bit_layout

    torch.manual_seed(0)
    model = torch.nn.Sequential(bnb.nn.Linear4bit(64, 40, bias=False, compute_dtype=torch.bfloat16,
                                                  quant_type="nf4"))
    model[0].weight = bnb.nn.Params4bit(torch.randn(40, 64).to(torch.bfloat16), requires_grad=False,
                                        quant_type="nf4")._quantize("cpu")
    before = model[0].weight.data.clone()
    keep_4bit_layout(model)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(3, 64, dtype=torch.bfloat16))
    assert out.shape == (3, 40)  # 40 rows: bitsandbytes' own repacking needs multiples of 32
    assert torch.equal(model[0].weight.data, before)
    assert not getattr(model[0].weight.quant_state, "packing_format_for_cpu", False)
