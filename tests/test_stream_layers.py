"""stream_layers: the frozen 4-bit decoder layers in host memory, each copied into a ring of device buffers just
before it runs (core/levers/stream_layers.py). On the CPU the ring is CPU memory, but every weight really goes
through it: the same losses and LoRA gradients as without streaming, and no layer holds its weights between uses.
The estimator's terms for it, the RAM refusal and the config's checks are here too."""

import pytest
import torch

from core.config.settings import Hardware, TrainConfig, config_problems, demo_config
from core.estimate.predict import GIB, FitError, estimate, fit_to_gpu
from core.estimate import terms
from core.estimate.terms import host_memory_problem, stream_ring_bytes
from core.levers.stream_layers import SLOTS, decoder_layers, streamer_of
from core.model.load import load_model, prepare_for_training, stream_layers, trainable_parameters
from core.model.shapes import SHAPES

CPU = Hardware(cuda=False, bf16=True, bitsandbytes=True)
L8B, L70B = SHAPES["meta-llama/Llama-3.1-8B"], SHAPES["meta-llama/Llama-3.1-70B"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 4-layer Llama with random bf16 weights (4 layers through 2 slots: each slot is reused, forward and back)."""
    from transformers import LlamaConfig

    from tests.helpers import tiny_model_folder

    config = LlamaConfig(vocab_size=9000, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
    return tiny_model_folder(config, tmp_path_factory.mktemp("stream") / "tiny")


def nf4(folder, **changes):
    cfg = demo_config(model=str(folder), load_in_4bit=True, device="cpu", precision="bf16", lora_dropout=0.1,
                      lora_init="gaussian", **changes)
    return cfg, prepare_for_training(load_model(cfg), cfg)


def step(model, seed=3):
    """One forward + backward on fixed tokens (dropout seeded): the loss and every LoRA gradient."""
    ids = torch.randint(0, 9000, (2, 24), generator=torch.Generator().manual_seed(seed))
    model.train()
    torch.manual_seed(seed)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("checkpointing", [False, True])
def test_streamed_layers_give_the_same_loss_and_every_lora_gradient(tiny, checkpointing):
    cfg, model = nf4(tiny, gradient_checkpointing=checkpointing)
    if checkpointing:  # as the Trainer turns it on (sft_kwargs: non-reentrant)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    counted = trainable_parameters(model)
    plain = [step(model, seed) for seed in (3, 4)]
    stream_layers(model, cfg.replace(stream_layers=True))  # what prepare_for_training does last with it on
    streamer = streamer_of(model)
    assert streamer is not None and len(streamer.layers) == 4 and len(streamer.slots) == SLOTS
    assert trainable_parameters(model) == counted  # the log's count sees the host copies
    for seed, (loss_a, grads_a) in zip((3, 4), plain):  # the second step starts from what the first left in the ring
        loss_b, grads_b = step(model, seed)
        assert torch.equal(loss_a, loss_b)
        assert grads_a.keys() == grads_b.keys() and len(grads_a) == 4 * 7 * 2  # A and B on every linear
        assert all(torch.equal(grads_a[k], grads_b[k]) for k in grads_a)
    # step 1: 4 layers forward, then layers 1 and 0 again for backward (3 and 2 are still in their slots); step 2:
    # layers 0 and 1 are still there, 2 and 3 come, and 1 and 0 again for backward
    assert streamer.stats.copies == 6 + 4
    assert not streamer.bound and not streamer.backward


def test_a_layer_holds_its_weights_only_while_it_runs(tiny):
    cfg, model = nf4(tiny, gradient_checkpointing=True, stream_layers=True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    streamer = streamer_of(model)
    layers = decoder_layers(model)
    pieces = [p for l in streamer.layers for p in l.pieces]
    assert any(type(p.tensor).__name__ == "Params4bit" for p in pieces)  # 4-bit data, absmax, norms
    assert sum(p.nbytes for p in pieces) <= streamer.host_bytes()
    slots = [(s.data_ptr(), s.data_ptr() + s.numel()) for s in streamer.slots]
    seen = []

    def inside_its_slot(index):
        def hook(module, args, output=None):
            lo, hi = slots[index % SLOTS]
            for p in streamer.layers[index].pieces:
                assert p.tensor.numel() == p.shape.numel() and lo <= p.tensor.data_ptr() < hi
            seen.append(index)
        return hook

    for i, layer in enumerate(layers):  # the attention's q_proj runs in forward and again in the recompute
        layer.self_attn.q_proj.base_layer.register_forward_hook(inside_its_slot(i))
    assert all(p.tensor.numel() == 0 for p in pieces)  # nothing usable before the first step
    step(model)
    assert seen == [0, 1, 2, 3, 3, 2, 1, 0]  # forward, then each layer recomputed in backward, from the last
    assert all(p.tensor.numel() == 0 for p in pieces)  # and nothing after it
    with torch.no_grad():  # a forward without gradients (an eval, Try it) streams too and lets go
        model(input_ids=torch.ones(1, 5, dtype=torch.long))
    assert all(p.tensor.numel() == 0 for p in pieces) and not streamer.bound


def test_the_config_checks_it():
    base = TrainConfig(stream_layers=True, dataset="memtune/demo")

    def keys(cfg):
        return {p.key for p in config_problems(cfg, CPU) if p.field == "stream_layers"}

    assert keys(base) == set()
    assert keys(base.replace(load_in_4bit=False)) == {"problem.stream_layers_4bit"}
    assert keys(base.replace(num_gpus="2")) == {"problem.stream_layers_gpus"}
    assert keys(base.replace(num_machines=2, main_process_ip="10.0.0.1")) == {"problem.stream_layers_gpus"}
    assert keys(base.replace(compile_layers="on")) == {"problem.stream_layers_compile"}
    assert TrainConfig.from_yaml(base.to_yaml()).stream_layers is True


def test_show_code_writes_it():
    from core.codegen import config_yaml

    assert "stream_layers: true" in config_yaml(TrainConfig(stream_layers=True))


def test_the_estimate_keeps_a_ring_on_the_gpu_and_the_frozen_layers_in_ram():
    low = TrainConfig(model="meta-llama/Llama-3.1-70B", upcast_to_fp32=False, max_length=2048, packing=True,
                      offload_embeddings=True, per_device_train_batch_size=1, gradient_accumulation_steps=8,
                      gradient_checkpointing=True, offload_activations=True)
    off, on = estimate(low, L70B), estimate(low.replace(stream_layers=True), L70B)
    ring = stream_ring_bytes(low.replace(stream_layers=True), L70B)
    assert stream_ring_bytes(low, L70B) == 0
    assert 2 * 0.3 * GIB < ring < 2 * 0.6 * GIB  # two layers of ~0.45 GiB in NF4
    assert on.cpu_offloaded - off.cpu_offloaded - ring > off.quantized_weights - on.quantized_weights  # + norms
    assert on.cpu_activations == off.cpu_activations > 0  # offload_activations' layer inputs, in CPU memory too
    assert on.cpu_offloaded > 30 * GIB and on.quantized_weights < 2 * GIB
    assert on.nvml_peak < 22 * GIB < off.nvml_peak  # the 70B on a 24 GB card: only with streaming
    assert any("stream_layers" in n for n in on.notes)


def test_too_little_ram_is_refused_by_name_before_loading():
    cfg = TrainConfig(model="meta-llama/Llama-3.1-70B", stream_layers=True, offload_embeddings=True)
    need = estimate(cfg, L70B).cpu_offloaded
    problem = host_memory_problem(cfg, L70B, available=need // 2, name=cfg.model)
    assert problem is not None and problem.field == "stream_layers" and problem.key == "problem.stream_layers_ram"
    assert "Llama-3.1-70B" in problem.message
    assert host_memory_problem(cfg, L70B, available=need * 2) is None
    assert host_memory_problem(cfg.replace(stream_layers=False), L70B, available=0) is None


def test_fit_streams_only_when_nothing_else_fits_and_says_it_costs_speed(monkeypatch):
    monkeypatch.setattr(terms, "available_ram", lambda: 256 * GIB)  # a machine with the RAM for the 70B's layers
    cfg = TrainConfig(model="meta-llama/Llama-3.1-70B", upcast_to_fp32=False, max_length=2048)
    fitted, est = fit_to_gpu(cfg, 80 * GIB, shape=L70B)  # an 80 GB card holds the 70B: no streaming
    assert not fitted.stream_layers
    fitted, est = fit_to_gpu(cfg, 24 * GIB, shape=L70B)
    assert fitted.stream_layers and est.nvml_peak <= 24 * GIB
    assert any("slower" in n for n in est.notes)
    small = TrainConfig(model="meta-llama/Llama-3.1-8B", upcast_to_fp32=False)
    assert not fit_to_gpu(small, 12 * GIB, shape=L8B)[0].stream_layers
    with pytest.raises(FitError):  # a 16-bit base is never streamed
        fit_to_gpu(cfg.replace(load_in_4bit=False), 24 * GIB, shape=L70B)
    monkeypatch.setattr(terms, "available_ram", lambda: 16 * GIB)  # nor where the RAM cannot hold the layers
    with pytest.raises(FitError):
        fit_to_gpu(cfg, 24 * GIB, shape=L70B)


def test_a_run_streams_its_layers_and_its_summary_says_what_the_copies_cost(tmp_path, monkeypatch):
    import json
    import socket

    from core.gpus import link
    from core.train.recipe import run_training

    rates = tmp_path / "link.json"  # the link as this machine's GPU would have measured it (none here)
    rates.write_text(json.dumps({socket.gethostname(): {"h2d_bytes_per_s": 24.5e9, "matmul_flops": 7e14}}))
    monkeypatch.setattr(link, "cache_file", lambda: rates)
    result = run_training(demo_config(output_dir=str(tmp_path), run_name="s", max_steps=2, stream_layers=True,
                                      validation_share=0.0, heldout_scorer="off"))
    assert result.status == "completed", result.message
    part = __import__("json").loads((tmp_path / "s" / "summary.json").read_text())["stream_layers"]
    # the demo's 2 layers fill the 2 slots: each is copied once and stays (tests above reuse slots)
    assert part["layers"] == 2 and part["slots"] == SLOTS and part["copies"] == 2
    assert part["host_gib"] >= 0 and 0 <= part["wait_share"] < 1  # a tiny model: ~0 GiB
    assert part["link_gb_s"] == 24.5 and part["matmul_tflops"] == 700.0  # the rates the estimate's note used


def test_a_run_is_refused_by_name_before_loading_when_the_ram_cannot_hold_it(tmp_path, monkeypatch):
    from core.train.recipe import run_training

    monkeypatch.setattr(terms, "available_ram", lambda: 2**20)  # 1 MiB free
    result = run_training(demo_config(output_dir=str(tmp_path), run_name="r", max_steps=2, stream_layers=True))
    assert result.status == "failed" and "stream_layers" in result.message and "GiB available" in result.message
    events = tmp_path / "r" / "events.jsonl"  # refused by validation (core.checks), before the run's folder
    assert not events.exists() or "loading_model" not in events.read_text()


def test_compile_auto_stays_off_when_the_layers_stream():
    from core.model.compile import decide

    cfg = TrainConfig(gradient_checkpointing=False, compile_layers="auto")
    on, _ = decide(cfg, cuda=True, steps=10**6, layers=32, known=1, seconds={})
    off, said = decide(cfg.replace(stream_layers=True), cuda=True, steps=10**6, layers=32, known=1, seconds={})
    assert on and not off and said.key == "log.compile.auto_stream"
