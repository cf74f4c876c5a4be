"""compile_layers: regional compilation of the decoder layers (core/model/compile.py), on the CPU with the demo model.

The backend is "eager" (MEMTUNE_COMPILE_BACKEND, the module's documented switch): dynamo captures each layer whole
(peft's LoRA, bitsandbytes' 4-bit custom ops, transformers' checkpointing inside) and guards it, with dynamic
shapes, exactly as for inductor, then runs the captured graph as it is. Measured on 2 busy shared cores: the first
step's compile takes ~6 s with "eager", ~35 s with "aot_eager" (AOT autograd's joint graph, plus one restart of
the analysis for a traced float), minutes with inductor's C++ code generation. Inductor's numerics and speed are
the GPU call's to measure (bench/product_plans.py, plan "compile").

The compile cache (open_cache) keeps inductor's artefacts only, so its tests use inductor: the folder's key and
safety on a tiny model without compiling, and one slow test that trains the demo three times (cold, from the cache,
with the cache home replaced by a link).
"""

import json
from pathlib import Path

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
    assert ("compile" in result.summary) == (cfg.compile_layers == "on")
    return [e["loss"] for e in events if e["kind"] == "metrics" and "loss" in e], events


def test_compiled_layers_train_with_the_same_losses(tmp_path, eager_backend):
    from torch._dynamo.utils import counters

    # the demo in 4-bit NF4 + LoRA on attention and MLP, checkpointed; packing: a new total length every micro-batch
    common = dict(packing=True, per_device_train_batch_size=4, gradient_checkpointing=True)
    off, _ = _train(tmp_path, "off", **common)
    assert not counters["stats"].get("unique_graphs")
    on, events = _train(tmp_path, "on", compile_layers="on", **common)
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
    # "eager" keeps no compile cache: the phase and the summary say so
    assert [e["key"] for e in events if e["kind"] == "phase" and e["phase"] == "compiling"] == ["log.compile.no_cache"]
    cache = next(e for e in events if e["kind"] == "done")["summary"]["compile"]["cache"]
    assert cache["folder"] is None and not cache["hit"] and "keeps no compile cache" in cache["why_not"]


def test_a_layer_the_compiler_fails_on_trains_uncompiled_with_the_same_losses_and_says_so(tmp_path, eager_backend,
                                                                                        monkeypatch):
    """compile_auto turns compiling on for `fastest` on models it was never measured on: a compiler failure there
    (here a backend that raises) must cost the speed, not the run."""
    import torch._dynamo
    from torch._dynamo.backends.registry import list_backends

    def memtune_test_broken(gm, example_inputs):
        raise RuntimeError("this compiler cannot take the layer")

    if "memtune_test_broken" not in list_backends(exclude_tags=()):
        torch._dynamo.register_backend(memtune_test_broken)
    monkeypatch.setattr(torch._dynamo.config, "suppress_errors", False)  # dynamo's default, put back after
    monkeypatch.setenv(regional.BACKEND_ENV, "memtune_test_broken")
    off, _ = _train(tmp_path, "off")
    on, events = _train(tmp_path, "on", compile_layers="on")
    assert on == off and len(on) == 2
    warned = [e for e in events if e.get("key") == "log.compile_no_graph"]
    assert len(warned) == 1 and warned[0]["level"] == "warning"


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

    assert sft_kwargs(TrainConfig(use_liger_kernel=True, compile_layers="on"), "out", cuda=True)["use_liger_kernel"] is False
    assert sft_kwargs(TrainConfig(use_liger_kernel=True), "out", cuda=True)["use_liger_kernel"] is True
    assert "liger_kernel_config" not in sft_kwargs(TrainConfig(use_liger_kernel=True, compile_layers="on"), "out", True)


# --- the compile cache (open_cache): inductor's FX graph and AOT autograd caches in the user's own folder ---------
@pytest.fixture
def inductor_cache(tmp_path, monkeypatch):
    """The inductor backend (the only one whose artefacts torch caches) with this test's own cache folder, and
    torch's cache settings put back after it."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    monkeypatch.setenv(regional.BACKEND_ENV, "inductor")
    monkeypatch.setenv(regional.CACHE_ENV, str(tmp_path / "compile-cache"))
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # open_cache sets them; monkeypatch restores
        monkeypatch.setenv(name, "")
    # torch's config modules, put back by hand: monkeypatch's undo deletes the attribute, which a config module
    # then reports as missing
    monkeypatch.delenv(regional.CUSTOM_FUNCTIONS_ENV, raising=False)
    flags = [(inductor_config, "fx_graph_cache"), (functorch_config, "enable_autograd_cache"),
             (functorch_config, regional.CUSTOM_FUNCTIONS_FLAG)]
    saved = [(module, name, getattr(module, name)) for module, name in flags if hasattr(module, name)]
    yield tmp_path / "compile-cache"
    for module, name, value in saved:
        setattr(module, name, value)


def _tiny(**arch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from core.demo import ARCH

    return LlamaForCausalLM(LlamaConfig(vocab_size=32, **{**ARCH, **arch}))


def test_the_cache_folder_is_keyed_by_shape_and_settings_and_private(inductor_cache):
    import os
    import stat

    from core.config.settings import TrainConfig

    cfg = TrainConfig(compile_layers="on")
    cache = regional.open_cache(cfg, _tiny())
    assert cache.folder is not None and cache.folder.parent == inductor_cache and not cache.refused
    assert cache.known == 0 and cache.words()["key"] == "log.compile.first"
    assert "LlamaDecoderLayer, hidden 64, 2 layers" in cache.words()["params"]["shape"]
    for folder in (inductor_cache, cache.folder):
        assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache.folder)
    assert regional.open_cache(cfg, _tiny()).folder == cache.folder  # the same shape and settings: the same folder
    # another hidden size, another LoRA rank, checkpointing off: other graphs, other folders (a miss)
    others = {regional.open_cache(cfg, _tiny(hidden_size=128)).folder,
              regional.open_cache(TrainConfig(compile_layers="on", lora_r=8), _tiny()).folder,
              regional.open_cache(TrainConfig(compile_layers="on", gradient_checkpointing=False), _tiny()).folder}
    assert len(others) == 3 and cache.folder not in others
    # what the first run left (its manifest) is what the next one's phase says
    (cache.folder / regional.MANIFEST).write_text('{"graphs": 4}')
    again = regional.open_cache(cfg, _tiny())
    assert again.known == 4 and again.words()["key"] == "log.compile.cached" and again.words()["params"]["n"] == 4


def _refused(cfg, events):
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    cache = regional.open_cache(cfg, _tiny(), events.append)
    assert cache.folder is None and cache.refused
    assert inductor_config.fx_graph_cache is False and functorch_config.enable_autograd_cache is False
    assert cache.words()["key"] == "log.compile.no_cache"
    warning = events[-1]
    assert warning["kind"] == "log" and warning["level"] == "warning" and warning["key"] == "log.compile.refused"
    assert warning["params"]["why"]["key"].startswith("files.refused.cache_")  # keyed: a page says it in its language
    return warning["message"]


def test_a_planted_link_or_someone_elses_folder_is_refused(inductor_cache, tmp_path, monkeypatch):
    import os

    from core.config.settings import TrainConfig

    cfg = TrainConfig(compile_layers="on")
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir()
    inductor_cache.symlink_to(elsewhere)  # the cache home planted as a link
    events = []
    assert "is a link" in _refused(cfg, events)
    assert not any(elsewhere.iterdir())  # nothing made through the link
    inductor_cache.unlink()
    folder = regional.open_cache(cfg, _tiny()).folder
    folder.rmdir()
    folder.symlink_to(elsewhere)  # the key's folder planted as a link
    assert "is a link" in _refused(cfg, events)
    folder.unlink()
    monkeypatch.setattr(regional.os, "getuid", lambda: os.lstat(inductor_cache).st_uid + 1)  # as another user sees it
    assert "belongs to another user" in _refused(cfg, events)
    assert len(events) == 3


def test_an_uncached_backend_compiles_and_says_so(tmp_path, eager_backend):
    from core.config.settings import TrainConfig

    cache = regional.open_cache(TrainConfig(compile_layers="on"), _tiny())
    assert cache.folder is None and not cache.refused and "eager backend keeps no compile cache" in cache.why


@pytest.mark.slow
def test_a_second_run_loads_the_compiled_layers_from_the_cache(tmp_path, inductor_cache):
    """Inductor on the demo, as three runs of the app (dynamo's and inductor's in-memory state dropped in
    between): the second loads every graph from the disk cache and trains to the same losses; the third finds the
    cache home replaced by a link to that same cache, refuses it (a keyed warning), compiles everything again
    and trains to the same losses. Slow: a cold run's C++ code generation takes ~45 s on 2 busy CPU cores (a run
    from the cache ~10 s)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch._inductor.utils import clear_caches

    def fresh():
        torch._dynamo.reset()
        clear_caches()
        counters.clear()

    runs, hits = [], []
    for name in ("cold", "warm", "planted"):
        if name == "planted":  # someone's link where the cache home was, to a full cache: not followed
            inductor_cache.rename(tmp_path / "theirs")
            inductor_cache.symlink_to(tmp_path / "theirs")
        fresh()
        cfg = demo_config(output_dir=str(tmp_path), run_name=name, device="cpu", max_steps=2, logging_steps=1,
                          validation_share=0.0, compile_layers="on", kernel_warmup="on")
        events = []
        result = run_training(cfg, events.append)
        assert result.status == "completed", result.message
        runs.append((result, events, [e["loss"] for e in events if e["kind"] == "metrics"]))
        hits.append(counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"])
    fresh()
    (cold, cold_events, cold_losses), (warm, warm_events, warm_losses), (planted, planted_events, planted_losses) = runs
    first, second = cold.summary["compile"]["cache"], warm.summary["compile"]["cache"]
    assert first["compiled"] > 0 and first["loaded"] == 0 and not first["hit"], first
    assert second["hit"] and second["loaded"] == first["compiled"] and second["compiled"] == 0, second
    assert second["known_before"] == first["compiled"] and first["folder"] == second["folder"]
    # the manifest keeps both compiles' seconds: compile_layers auto weighs the next run's compile by them
    kept = json.loads((Path(first["folder"]) / regional.MANIFEST).read_text(encoding="utf-8"))["seconds"]
    assert kept == {"first": first["seconds"], "cached": second["seconds"]}, kept
    # where each compile's seconds went, by dynamo's timers: the capture, and inside it the backend (code generated
    # cold, loaded warm); the rest of a cached compile is dynamo tracing the layers again
    for cache in (first, second):
        capture = next(t for k, t in cache["phases"].items() if k.endswith("compile_inner"))
        assert 0 < cache["phases"]["OutputGraph.call_user_compiler"] <= capture, cache["phases"]
    assert len(cold_losses) == 2 and warm_losses == cold_losses  # the same code, loaded: the same numbers
    # the warm-up is the compiling phase, in the cache's words
    phases = [[e.get("key") for e in evs if e["kind"] == "phase" and e["phase"] == "compiling"]
              for evs in (cold_events, warm_events)]
    assert phases[0][0] == "log.compile.first" and phases[1][0] == "log.compile.cached", phases
    results = [e for e in warm_events if e.get("key") == "log.compile.result"]
    assert len(results) == 1 and results[0]["params"]["compiled"] == 0
    refused = planted.summary["compile"]["cache"]
    assert refused["folder"] is None and refused["loaded"] == 0 and refused["compiled"] > 0, refused
    assert "is a link" in refused["why_not"] and planted_losses == cold_losses
    assert hits[0] == 0 and hits[1] > 0 and hits[2] == 0, hits  # torch's own counts: nothing read through the link
    warnings = [e for e in planted_events if e.get("key") == "log.compile.refused"]
    assert len(warnings) == 1 and warnings[0]["level"] == "warning"


def test_without_checkpointing_every_layer_shares_one_graph(tmp_path, eager_backend):
    """`fastest` has no checkpointing: the first layer's input (the frozen embedding's output) would need no gradient
    and the second's would, a recompile of each layer graph that a second run loads from the cache again (run 14: 7
    graphs for `fastest`). compile_layers makes the first layer's input require grad as checkpointing does: one
    graph, one compile, the same losses as the uncompiled run."""
    common = dict(packing=True, per_device_train_batch_size=4, gradient_checkpointing=False)
    off, _ = _train(tmp_path, "off", **common)
    on, _ = _train(tmp_path, "on", compile_layers="on", **common)
    assert len(on) == len(off) == 2
    for a, b in zip(on, off):
        assert abs(a - b) <= 1e-4 * abs(b), (on, off)
    assert regional.stats() == {"graphs": 1, "compiles": 1, "graph_breaks": 0}


def test_the_compile_phases_say_where_the_time_went(tmp_path, eager_backend):
    """summary.json's compile.cache.phases: dynamo's own timers over the compile (the capture, the backend...), the
    longest first, so a GPU row can split a cached run's compile into tracing again and loading."""
    _, events = _train(tmp_path, "on", compile_layers="on", packing=True, per_device_train_batch_size=2)
    phases = next(e for e in events if e["kind"] == "done")["summary"]["compile"]["cache"]["phases"]
    assert phases and all(t > 0 for t in phases.values()), phases
    assert list(phases.values()) == sorted(phases.values(), reverse=True)
    capture = next(t for k, t in phases.items() if k.endswith("compile_inner"))  # dynamo's capture, all included
    assert capture == max(phases.values()), phases
