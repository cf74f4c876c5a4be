"""compile_layers: regional compilation of the decoder layers (core/model/compile.py), on the CPU with the demo model.

The backend is "eager" (MEMTUNE_COMPILE_BACKEND, the module's documented switch): dynamo captures each layer whole
(peft's LoRA, bitsandbytes' 4-bit custom ops, transformers' checkpointing inside) and guards it, with dynamic
shapes, exactly as for inductor, then runs the captured graph as it is. Measured on 2 busy shared cores: the first
step's compile takes ~6 s with "eager", ~35 s with "aot_eager" (AOT autograd's joint graph, plus one restart of
the analysis for a traced float), minutes with inductor's C++ code generation. Inductor's numerics and speed are
the GPU call's to measure (bench/product_plans.py, plan "compile").
"""

import pytest
import torch

from core.config.settings import Hardware, demo_config
from core.model import compile as regional
from core.train.recipe import run_training

CPU = Hardware(cuda=False, bf16=True, bitsandbytes=True)


@pytest.fixture
def eager_backend(monkeypatch):
    import torch._dynamo
    from torch._dynamo.utils import counters

    monkeypatch.setenv(regional.BACKEND_ENV, "eager")
    torch._dynamo.reset()  # caches and counts of this test only
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


def _train(tmp_path, name, **changes):
    cfg = demo_config(output_dir=str(tmp_path), run_name=name, device="cpu", max_steps=2, logging_steps=1,
                      validation_share=0.0, **changes)
    events = []
    result = run_training(cfg, events.append)
    assert result.status == "completed", result.message
    assert ("compile" in result.summary) == cfg.compile_layers
    return [e["loss"] for e in events if e["kind"] == "metrics" and "loss" in e], events


def test_compiled_layers_train_with_the_same_losses(tmp_path, eager_backend):
    from torch._dynamo.utils import counters

    # the demo in 4-bit NF4 + LoRA on attention and MLP, checkpointed; packing: a new total length every micro-batch
    common = dict(packing=True, per_device_train_batch_size=4, gradient_checkpointing=True)
    off, _ = _train(tmp_path, "off", **common)
    assert not counters["stats"].get("unique_graphs")
    on, events = _train(tmp_path, "on", compile_layers=True, **common)
    assert len(on) == len(off) == 2
    for a, b in zip(on, off):
        assert abs(a - b) <= 1e-4 * abs(b), (on, off)
    # the layers really went through dynamo: graphs compiled, and the log said so
    stats = regional.stats()
    # one graph for both layers and every packed length: no recompile, no graph break
    assert stats == {"graphs": 1, "compiles": 1, "graph_breaks": 0}, dict(counters)
    logs = [e["message"] for e in events if e["kind"] == "log"]
    assert any(m.startswith("Regional compile: 2 decoder layers") and "with eager" in m for m in logs), logs
    assert any(m.startswith("Regional compile: first step (compiling included") for m in logs), logs
    assert any(e["kind"] == "phase" and e["phase"] == "compiling" for e in events)


def test_layers_found_and_compiled_once_per_layer(demo_model_path, eager_backend):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32)
    layers = regional.decoder_layers(model)
    assert len(layers) == model.config.num_hidden_layers == 2
    assert regional.compile_layers(model).startswith("Regional compile: 2 decoder layers")
    assert all(layer._compiled_call_impl is not None for layer in layers)
    assert regional.compile_layers(torch.nn.Linear(2, 2)).startswith("Regional compile skipped")




def test_compiled_layers_do_not_ask_for_ligers_kernels():
    """liger's in-layer kernels are Triton autograd functions dynamo cannot trace (torch 2.11 on the H200: an
    AssertionError at the first RMSNorm, bench/RESULTS.md run 10), and TRL refuses liger's fused cross-entropy (it
    applies its own fused LM head in every run): with compile_layers the Trainer is not asked for liger at all."""
    from core.config.arguments import sft_kwargs
    from core.config.settings import TrainConfig

    assert sft_kwargs(TrainConfig(use_liger_kernel=True, compile_layers=True), "out", cuda=True)["use_liger_kernel"] is False
    assert sft_kwargs(TrainConfig(use_liger_kernel=True), "out", cuda=True)["use_liger_kernel"] is True
    assert "liger_kernel_config" not in sft_kwargs(TrainConfig(use_liger_kernel=True, compile_layers=True), "out", True)
