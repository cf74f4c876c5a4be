"""compile_layers: regional compilation of the decoder layers (core/model/compile.py), on the CPU with the demo model.

The backend is aot_eager (MEMTUNE_COMPILE_BACKEND, the module's documented switch): dynamo captures each layer and
AOT autograd splits forward and backward exactly as with inductor, but without inductor's C++/Triton code
generation, which costs tens of seconds per graph on 2 CPU cores. Inductor's numerics are the GPU call's to measure.
"""

import pytest
import torch

from core.config.presets import apply_preset
from core.config.settings import Hardware, demo_config
from core.model import compile as regional
from core.train.recipe import run_training

CPU = Hardware(cuda=False, bf16=True, bitsandbytes=True)


@pytest.fixture
def aot_eager(monkeypatch):
    import torch._dynamo
    from torch._dynamo.utils import counters

    monkeypatch.setenv(regional.BACKEND_ENV, "aot_eager")
    torch._dynamo.reset()  # caches and counts of this test only
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


def _train(tmp_path, name, **changes):
    cfg = demo_config(output_dir=str(tmp_path), run_name=name, device="cpu", max_steps=3, logging_steps=1,
                      validation_share=0.0, **changes)
    events = []
    result = run_training(cfg, events.append)
    assert result.status == "completed", result.message
    return [e["loss"] for e in events if e["kind"] == "metrics" and "loss" in e], events


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_layers_train_with_the_same_losses(tmp_path, aot_eager, checkpointing):
    from torch._dynamo.utils import counters

    # the demo in 4-bit NF4 + LoRA on attention and MLP; packing: a new total length every micro-batch
    common = dict(packing=True, per_device_train_batch_size=4, gradient_checkpointing=checkpointing)
    off, _ = _train(tmp_path, "off", **common)
    assert not counters["stats"].get("unique_graphs")
    on, events = _train(tmp_path, "on", compile_layers=True, **common)
    assert len(on) == len(off) == 3
    for a, b in zip(on, off):
        assert abs(a - b) <= 1e-4 * abs(b), (on, off)
    # the layers really went through dynamo: graphs compiled, and the log said so
    stats = regional.stats()
    assert stats["graphs"] >= 1 and counters["frames"]["ok"] >= 1, dict(counters)
    logs = [e["message"] for e in events if e["kind"] == "log"]
    assert any(m.startswith("Regional compile: 2 decoder layers") and "aot_eager" in m for m in logs), logs
    assert any("first step (compiling included) took" in m for m in logs), logs
    assert any(e["kind"] == "phase" and e["phase"] == "compiling" for e in events)
    # packed lengths vary per micro-batch: dynamic shapes, so no recompile per batch
    assert stats["recompiles"] <= 2, dict(counters["recompiles"])


def test_layers_found_and_compiled_once_per_layer(demo_model_path, aot_eager):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32)
    layers = regional.decoder_layers(model)
    assert len(layers) == model.config.num_hidden_layers == 2
    assert regional.compile_layers(model).startswith("Regional compile: 2 decoder layers")
    assert all(layer._compiled_call_impl is not None for layer in layers)
    assert regional.compile_layers(torch.nn.Linear(2, 2)).startswith("Regional compile skipped")
