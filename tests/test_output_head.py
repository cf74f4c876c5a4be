"""quantize_output_head: the frozen output head in 4-bit NF4 (core/levers/output_head.py), read by TRL's fused loss.

The real bitsandbytes NF4 path runs here (its CPU backend); only the CUDA part (loading the head straight into CPU
memory, then quantizing it onto the GPU block by block) needs a GPU and is not exercised.
"""

import pytest
import torch

from core.config.settings import Hardware, TrainConfig, demo_config
from core.estimate.predict import GIB, estimate
from core.estimate.terms import QUANTIZED_HEAD_ROWS
from core.levers.output_head import HEAD_ROWS, QuantizedHead, quantize_output_head
from core.config.presets import apply_preset
from core.model.shapes import SHAPES

CPU = Hardware(cuda=False, bf16=True, bitsandbytes=True)
L8B = SHAPES["meta-llama/Llama-3.1-8B"]


def head_weight(rows=20000, hidden=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, hidden, generator=g) * 0.02).to(torch.bfloat16)


def test_the_estimator_and_the_model_use_the_same_block_size():
    assert HEAD_ROWS == QUANTIZED_HEAD_ROWS


def test_quantized_head_rows_are_nf4_of_the_weight_and_whole_use_is_refused():
    import bitsandbytes.functional as bnbf

    w = head_weight()
    head = QuantizedHead(w, None)
    assert head.weight.shape == w.shape and head.weight.dtype == torch.bfloat16 and not head.weight.requires_grad
    assert sum(p.numel() for p in head.parameters()) == 0  # nothing for an optimizer or .to() to touch
    # rows across a block boundary are the NF4 round trip of those rows, block by block
    a, b = HEAD_ROWS - 5, HEAD_ROWS + 7
    packed, state = bnbf.quantize_4bit(w[HEAD_ROWS:2 * HEAD_ROWS], quant_type="nf4", compress_statistics=True)
    assert torch.equal(head.weight[a:b][5:], bnbf.dequantize_4bit(packed, state)[:7])
    err = (head.weight[0:w.shape[0]].float() - w.float()).abs().max()
    assert 0 < err < 0.02  # quantized, not copied; NF4's error at this scale
    with pytest.raises(TypeError):
        torch.nn.functional.linear(torch.ones(2, 64, dtype=torch.bfloat16), head.weight)
    with pytest.raises(TypeError):
        head.weight[3]
    # a direct call (generation) computes the same logits block by block
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert torch.allclose(head(x).float(), (x @ head.weight[0:w.shape[0]].t()).float())


def test_trls_fused_loss_reads_the_quantized_head_like_its_dequantized_weight():
    """TRL's chunked log-prob kernel (what SFTTrainer computes the loss with) gets the same log-probs and input
    gradients from the 4-bit head as from the dense matrix it stands for."""
    from trl.trainer.utils import _ChunkedLogProbFunction

    w = head_weight()
    head = QuantizedHead(w, None)
    dense = head.weight[0:w.shape[0]].clone()
    torch.manual_seed(1)
    hidden = torch.randn(40, 64, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, w.shape[0], (40,))
    outs = ("log_probs", "entropy", "is_top1")
    got = _ChunkedLogProbFunction.apply(hidden, head.weight, None, targets, 1.0, HEAD_ROWS, None, 1.0, outs)
    got[0].sum().backward()
    grad, hidden.grad = hidden.grad.clone(), None
    ref = _ChunkedLogProbFunction.apply(hidden, dense, None, targets, 1.0, HEAD_ROWS, None, 1.0, outs)
    ref[0].sum().backward()
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]) and torch.equal(got[4], ref[4])
    assert torch.equal(grad, hidden.grad)


def test_tied_heads_are_left_alone():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    assert quantize_output_head(model, None) is False
    assert isinstance(model.get_output_embeddings(), torch.nn.Linear)


def test_six_gb_trains_the_demo_model_with_a_4bit_head_within_half_a_percent_of_the_dense_head(tmp_path,
                                                                                               demo_model_path):
    """The preset on the CPU (liger dropped): 4-bit base + LoRA + a 4-bit head through TRL's fused loss. The same
    run with the head left in bf16 sees the same batches; its first losses differ by the head's quantization only."""
    from transformers import TrainerCallback

    from core.train.recipe import run_training

    heads = {}

    class SeeHead(TrainerCallback):
        def __init__(self, name):
            self.name = name

        def on_train_begin(self, args, state, control, model=None, **kw):
            heads[self.name] = type(model.get_output_embeddings()).__name__

    losses = {}
    for name, quantized in (("q", True), ("dense", False)):
        cfg = apply_preset(demo_config(output_dir=str(tmp_path), run_name=name, device="cpu"), "six_gb", CPU)
        cfg = cfg.replace(max_steps=2, logging_steps=1, quantize_output_head=quantized)
        events = []
        result = run_training(cfg, events.append, callbacks=[SeeHead(name)])
        assert result.status == "completed", result.message
        losses[name] = [e["loss"] for e in events if e["kind"] == "metrics"]
    assert heads == {"q": "QuantizedHead", "dense": "Linear"}
    assert len(losses["q"]) == 2 and losses["q"] != losses["dense"]  # the head really changed
    for q, d in zip(losses["q"], losses["dense"]):
        assert abs(q - d) / d < 0.005, (losses["q"], losses["dense"])


def test_estimate_counts_the_head_in_4bit_and_one_dequantized_chunk():
    low = apply_preset(TrainConfig(model="meta-llama/Llama-3.1-8B"), "lowest_memory")
    on, off = estimate(low.replace(quantize_output_head=True), L8B), estimate(low, L8B)
    head_bf16 = 2 * L8B.head_params  # 0.98 GiB
    saved = off.nvml_training - on.nvml_training
    assert 0.6 * GIB < saved < head_bf16 - 0.2 * GIB, saved / GIB  # NF4 is ~0.27 of bf16, plus one 8k-row chunk
    assert on.unquantized_weights < off.unquantized_weights and on.quantized_weights > off.quantized_weights
    # no effect without 4-bit, or on a tied head (Llama-3.2-1B)
    full = low.replace(load_in_4bit=False)
    assert estimate(full.replace(quantize_output_head=True), L8B).nvml_peak == estimate(full, L8B).nvml_peak
    tied = SHAPES["meta-llama/Llama-3.2-1B"]
    assert estimate(low.replace(quantize_output_head=True), tied).nvml_peak == estimate(low, tied).nvml_peak


def test_show_code_quantizes_the_head_with_memtunes_helper():
    from core.codegen import python_script

    script = python_script(apply_preset(TrainConfig(), "six_gb"))
    assert "quantize_output_head: true" in script and "from core.train.recipe import run_training" in script
    assert "quantize_output_head: false" in python_script(apply_preset(TrainConfig(), "lowest_memory"))


def test_without_the_cpu_load_the_head_is_on_the_gpu_in_bf16_while_loading():
    """Only the offload_embeddings load puts the head in CPU memory first; otherwise loading holds it in bf16."""
    low = apply_preset(TrainConfig(model="meta-llama/Llama-3.1-8B"), "six_gb")
    direct = estimate(low, L8B)
    on_gpu = estimate(low.replace(offload_embeddings=False), L8B)
    assert on_gpu.load_spike + on_gpu.nvml_training > direct.load_spike + direct.nvml_training
    assert on_gpu.nvml_peak - direct.nvml_peak >= 2 * L8B.head_params - 0.3 * GIB

