"""core/model/nf4_cpu.py: an eval forward on the CPU leaves a Linear4bit's weight in bitsandbytes' standard layout."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("bitsandbytes")


def test_an_eval_forward_on_the_cpu_keeps_the_weight_layout():
    import bitsandbytes as bnb

    from core.model.nf4_cpu import keep_4bit_layout

    torch.manual_seed(0)
    model = torch.nn.Sequential(bnb.nn.Linear4bit(64, 40, bias=False, compute_dtype=torch.bfloat16,
                                                  quant_type="nf4"))
    model[0].weight = bnb.nn.Params4bit(torch.randn(40, 64).to(torch.bfloat16), requires_grad=False,
                                        quant_type="nf4").to("cpu")  # quantized as it moves
    before = model[0].weight.data.clone()
    keep_4bit_layout(model)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(3, 64, dtype=torch.bfloat16))
    assert out.shape == (3, 40)  # 40 rows: bitsandbytes' own repacking needs multiples of 32
    assert torch.equal(model[0].weight.data, before)
    assert not getattr(model[0].weight.quant_state, "packing_format_for_cpu", False)
