"""What stream_layers asks of the machine, said before Start: the RAM it needs (refused by name in validation, shown
beside the GPU figure on the page), the time its copies take over this machine's measured link (a cached file), and
a GPU whose memory is the host's refused as pointless."""

import json
import socket

import pytest
import torch

from core.checks import validate
from core.config.settings import Hardware, TrainConfig, config_problems
from core.estimate import terms
from core.estimate.predict import GIB, estimate
from core.estimate.streaming import copies_per_micro_batch, stream_speed
from core.gpus import link
from core.model.shapes import SHAPES

CPU = Hardware(cuda=False, bf16=True, bitsandbytes=True)
L70B = SHAPES["meta-llama/Llama-3.1-70B"]
STREAMED = TrainConfig(model="meta-llama/Llama-3.1-70B", stream_layers=True, upcast_to_fp32=False, max_length=2048,
                       gradient_checkpointing=True, gradient_accumulation_steps=4, offload_embeddings=True)


def ram_problems(cfg):
    return [p for p in validate(cfg, CPU) if p.key == "problem.stream_layers_ram"]


def test_validation_refuses_too_little_ram_before_start_naming_the_gib(monkeypatch):
    need = terms.host_bytes(STREAMED, L70B)
    monkeypatch.setattr(terms, "available_ram", lambda: 16 * GIB)
    [problem] = ram_problems(STREAMED)
    assert problem.field == "stream_layers"
    assert f"{need / GIB:.1f} GiB" in problem.message and "16.0 GiB available" in problem.message
    monkeypatch.setattr(terms, "available_ram", lambda: need + GIB)
    assert ram_problems(STREAMED) == []
    monkeypatch.setattr(terms, "available_ram", lambda: 0)
    assert ram_problems(STREAMED.replace(stream_layers=False)) == []  # nothing kept in RAM: nothing to refuse


def test_the_page_shows_the_cpu_memory_beside_the_gpu_figure():
    from ui import render
    from ui.derive import prediction

    est = estimate(STREAMED, L70B)
    assert est.cpu_needed == terms.host_bytes(STREAMED, L70B) > 30 * GIB  # the figure the refusal compares
    assert estimate(STREAMED.replace(stream_layers=False, offload_embeddings=False), L70B).cpu_needed == 0
    pred = prediction(STREAMED)
    assert pred.cpu_gib == pytest.approx(est.cpu_needed / GIB)
    html = render.summary_html(STREAMED, [], predicted_gib=pred.gib, cpu_gib=pred.cpu_gib)
    assert f"CPU memory ≈ {pred.cpu_gib:.1f} GiB" in html and 'data-key="cpu-memory"' in html
    plain = TrainConfig(model="meta-llama/Llama-3.1-70B")
    assert prediction(plain).cpu_gib is None
    assert 'data-key="cpu-memory"' not in render.summary_html(plain, [], predicted_gib=40.0)


@pytest.fixture
def measured_link(tmp_path, monkeypatch):
    """This machine's link as a GPU run would have cached it: 25 GB/s, 400 TFLOP/s."""
    monkeypatch.setenv("MEMTUNE_HOME", str(tmp_path))
    (tmp_path / "link.json").write_text(json.dumps({socket.gethostname(): {
        "h2d_bytes_per_s": 25e9, "matmul_flops": 400e12, "gpu": "a card"}}))
    return link.cached()


def test_copy_seconds_per_step_come_from_the_cached_link(measured_link):
    assert measured_link == link.Link(25e9, 400e12, "a card")
    tokens = 2048
    speed = stream_speed(STREAMED, L70B, tokens)
    layer = -(-terms.streamed_bytes(STREAMED, L70B) // 80)
    assert copies_per_micro_batch(80) == 2 * 78  # the last two layers stay in the ring from backward to forward
    assert speed.copied_bytes == 2 * 78 * layer * 4  # 4 micro-batches per optimizer step
    assert speed.copy_s == pytest.approx(speed.copied_bytes / 25e9)
    flops = 6 * (L70B.linear_params + L70B.head_params) * tokens * 4  # forward, input gradient, recompute
    assert speed.compute_s == pytest.approx(flops / 400e12)
    assert speed.slowdown == pytest.approx(max(speed.copy_s, speed.compute_s) / speed.compute_s)
    assert speed.slowdown > 1  # 70B at 2048 tokens: ~5.4 s of copies against ~2.2 s of products
    note = next(n for n in estimate(STREAMED, L70B).notes if "per optimizer step" in n)
    assert "25.0 GB/s (measured here)" in note and f"up to {speed.slowdown:.1f}x" in note
    longer = stream_speed(STREAMED.replace(max_length=16384), L70B, 16384)
    assert longer.slowdown == pytest.approx(1.0)  # compute hides the copies


def test_the_fit_note_says_the_slowdown_where_the_link_was_measured(measured_link, tmp_path, monkeypatch):
    from ui.handlers import stream_cost

    said = stream_cost(STREAMED, 2048, "en")
    speed = stream_speed(STREAMED, L70B, 2048)
    assert "25.0 GB/s" in said and f"up to {speed.slowdown:.1f}×" in said
    monkeypatch.setenv("MEMTUNE_HOME", str(tmp_path / "elsewhere"))
    assert stream_cost(STREAMED, 2048, "en") == ""  # never measured here: Fit says only that it is slower


def test_an_unmeasured_or_other_machine_has_no_link(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMTUNE_HOME", str(tmp_path))
    assert link.cached() is None and stream_speed(STREAMED, L70B, 2048).slowdown is None
    assert any("not measured" in n for n in estimate(STREAMED, L70B).notes)
    link.remember(link.Link(1e9, 1e12))
    table = json.loads((tmp_path / "link.json").read_text())
    table["another-host"] = table.pop(socket.gethostname())
    (tmp_path / "link.json").write_text(json.dumps(table))
    assert link.cached() is None  # a home folder shared with another machine: its figures are not ours
    assert link.measured() is None  # no CUDA here: nothing measured, nothing written
    assert set(json.loads((tmp_path / "link.json").read_text())) == {"another-host"}


def test_a_gpu_sharing_the_hosts_memory_refuses_streaming_by_name():
    unified = Hardware(cuda=True, bf16=True, bitsandbytes=True, unified_memory=True)
    discrete = Hardware(cuda=True, bf16=True, bitsandbytes=True)
    cfg = TrainConfig(stream_layers=True)

    def keys(c, hw):
        return {p.key for p in config_problems(c, hw) if p.field == "stream_layers"}

    assert keys(cfg, unified) == {"problem.stream_layers_unified"}
    assert keys(cfg, discrete) == set() and keys(cfg.replace(stream_layers=False), unified) == set()
    assert Hardware.detect().unified_memory is False  # this machine: no GPU



# Run in a fresh interpreter: what glibc keeps of freed blocks depends on everything the process allocated before
# (a test worker's earlier tests), so only a new process makes the "freed, yet still resident" start reproducible.
PACKING = r"""
import json, sys
import torch
from transformers import LlamaConfig
from core.config.settings import demo_config
from core.levers.stream_layers import give_back_freed
from core.model.load import load_model, prepare_for_training, stream_layers
from tests.helpers import tiny_model_folder

def anon_rss():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

folder = tiny_model_folder(LlamaConfig(vocab_size=9000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       tie_word_embeddings=False), __import__("pathlib").Path(sys.argv[1]))
cfg = demo_config(model=str(folder), load_in_4bit=True, device="cpu", precision="bf16")
model = prepare_for_training(load_model(cfg), cfg)
give_back_freed()  # what loading freed: the blocks below take fresh pages
start = anon_rss()
freed, live = [], []
for _ in range(2000):
    freed.append(torch.ones(16 * 1024))
    live.append(torch.ones(16))
grown = anon_rss() - start
del freed
held = anon_rss()
stream_layers(model, cfg.replace(stream_layers=True))
print(json.dumps({"start": start, "grown": grown, "held": held, "after": anon_rss()}))
"""


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status") or
                    not __import__("ctypes.util").util.find_library("c"), reason="Linux's /proc and a C library")
def test_packing_the_layers_gives_the_freed_loaded_copies_back(tmp_path):
    """Each layer's loaded tensors are freed once its host copy exists; glibc keeps freed heap blocks, so the
    process would hold the streamed weights twice. Freed blocks stand in for a big model's loaded layers here
    (64 KiB each, fragmented by small live ones so the heap cannot simply shrink): packing gives them back."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", PACKING, str(tmp_path / "m")], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    grown, held = got["grown"], got["held"]
    assert grown > 64 * 2**20 and held - got["start"] > 0.8 * grown, got  # freed, yet still resident
    assert held - got["after"] > 0.8 * grown, got
