"""compile_layers auto (issue 42): the decoder layers compile when this run's micro-steps repay the compile, by the
seconds measured on the GPU (bench/RESULTS.md run 21) or this machine's own for the shape (the compile cache's
manifest); off on the CPU and with checkpointing (measured slower there); the log says why, with the figures, in
every language. No compile runs here: the decision is made before loading."""

import json
import types

import pytest
import torch

from core.config.presets import apply_preset
from core.config.settings import TrainConfig, config_problems, demo_config, parse_overrides
from core.messages import say, words_of
from core.model import compile as regional
from core.model import load as model_lib
from core.runs.events import make_event
from core.train.data import plan_data
from core.train.recipe import run_training

FAST = dict(gradient_checkpointing=False, compile_layers="auto")


def plan(n_packs=None, n_train=100, packing=True):
    return types.SimpleNamespace(packing=packing, n_packs=n_packs, n_train=n_train)


def test_micro_steps_come_from_the_plan_the_batch_and_the_epochs_or_max_steps():
    cfg = TrainConfig(per_device_train_batch_size=8, gradient_accumulation_steps=1, num_train_epochs=2.0,
                      packing=True)
    assert regional.micro_steps(cfg, plan(n_packs=81)) == 2 * 11  # 81 packs in micro-batches of 8, twice
    # a model that trains unpacked (core.model.resolve): its rows, though the plan counted packs as asked
    assert regional.micro_steps(cfg.replace(packing=False), plan(n_packs=81, n_train=16)) == 4
    assert regional.micro_steps(cfg, plan(n_packs=81), processes=2) == 2 * 6  # each of 2 processes: half
    assert regional.micro_steps(cfg.replace(packing=False), plan(packing=False, n_train=16)) == 4
    assert regional.micro_steps(cfg.replace(max_steps=5, gradient_accumulation_steps=3), plan(n_packs=81)) == 15


def test_auto_compiles_when_the_steps_repay_the_compile_and_says_the_figures():
    cfg = TrainConfig(**FAST)
    per_step = 32 * regional.SAVED_PER_LAYER_S  # an 8B's 32 layers: 0.03 s a micro-step (run 21)
    first = regional.FIRST_S / per_step  # ~880 micro-steps repay a first compile, ~280 one from the cache
    on, said = regional.decide(cfg, cuda=True, steps=int(first) + 1, layers=32, known=0, seconds={})
    assert on and said.key == "log.compile.auto_on" and said.params["cost"] == regional.FIRST_S
    assert said.params["source"]["key"] == "log.compile.source_measured"
    off, said = regional.decide(cfg, cuda=True, steps=int(first) - 1, layers=32, known=0, seconds={})
    assert not off and said.key == "log.compile.auto_off"
    # the same steps pay from the cache (4 graphs an earlier run compiled), at the measured cached seconds...
    on, said = regional.decide(cfg, cuda=True, steps=int(first) - 1, layers=32, known=4, seconds={})
    assert on and said.params["cost"] == regional.CACHED_S and said.params["cache"]["params"]["n"] == 4
    # ...or at this machine's own seconds for the shape, once it has compiled it
    off, said = regional.decide(cfg, cuda=True, steps=400, layers=32, known=4, seconds={"cached": 20.0})
    assert not off and said.params["cost"] == 20.0 and said.params["source"]["key"] == "log.compile.source_here"
    # fewer layers save less per micro-step: a 2-layer model needs 16x the steps of a 32-layer one
    assert not regional.decide(cfg, cuda=True, steps=int(first) + 1, layers=2, known=0, seconds={})[0]


@pytest.mark.parametrize("changes, key", [(dict(), "log.compile.auto_checkpointing"),
                                          (dict(gradient_checkpointing=False), "log.compile.auto_no_layers")])
def test_auto_stays_off_where_compiling_was_measured_slower_or_has_nothing_to_compile(changes, key):
    cfg = TrainConfig(compile_layers="auto", **changes)
    on, said = regional.decide(cfg, cuda=True, steps=10**6, layers=0, known=0, seconds={})
    assert not on and said.key == key
    assert regional.decide(cfg.replace(gradient_checkpointing=False), cuda=False, steps=10**6, layers=32, known=0,
                           seconds={})[1].key == "log.compile.auto_cpu"


def test_every_auto_line_reads_in_every_language():
    cfg = TrainConfig(**FAST)
    lines = [regional.decide(cfg, cuda=True, steps=s, layers=32, known=k, seconds={})[1]
             for s in (10, 10**5) for k in (0, 3)]
    lines += [regional.decide(cfg, cuda=False, steps=1, layers=32, known=0, seconds={})[1]]
    for said in lines:
        event = make_event("log", level="info", **words_of(said))
        assert event["message"] == str(said)  # the CLI's English
        for lang in ("en", "pt", "fr"):
            text = say(event["key"], event["params"], lang)
            assert "{" not in text and "log.compile" not in text, (lang, text)
    event = make_event("log", level="info", **words_of(lines[0]))
    assert "micro-passos" in say(event["key"], event["params"], "pt")
    assert "première fois" in say(event["key"], event["params"], "fr")


def test_settle_reads_the_compile_cache_of_the_users_own_model_before_loading(tmp_path, monkeypatch,
                                                                             demo_model_path):
    """The key is computed from the model on the meta device, before any weight loads: it must name the folder a
    compiled run of the loaded model writes (core.model.compile.open_cache), or the cache is never seen."""
    monkeypatch.setenv(regional.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(regional.BACKEND_ENV, raising=False)
    cfg = demo_config(output_dir=str(tmp_path), device="cpu", validation_share=0.0, max_steps=400, **FAST)
    data, _, path, tree = plan_data(cfg, lambda e: None)
    loaded = model_lib.prepare_for_training(model_lib.load_model(cfg, path), cfg)
    assert regional.cache_key(cfg, loaded) == regional.cache_key(cfg, tree)  # what open_cache will key it by
    del loaded
    settled, said = regional.settle(cfg, tree, data, cuda=True)
    assert settled.compile_layers == "off" and said.key == "log.compile.auto_off"  # 2 layers: too few to repay
    assert said.params["cache"]["key"] == "log.compile.cache_cold" and said.params["steps"] == 400
    folder = regional.cache_home() / regional._digest(regional.cache_key(cfg, tree))
    folder.mkdir(parents=True)
    (folder / regional.MANIFEST).write_text(json.dumps({"graphs": 4, "seconds": {"cached": 0.5}}))
    settled, said = regional.settle(cfg, tree, data, cuda=True)
    assert settled.compile_layers == "on" and said.params["cost"] == 0.5  # 400 x 2 x 0.94 ms > 0.5 s
    assert said.params["source"]["key"] == "log.compile.source_here"
    # a manifest someone edited by hand: its seconds are not read, the measured ones stand
    (folder / regional.MANIFEST).write_text(json.dumps({"graphs": 4, "seconds": {"cached": "soon", "first": -1}}))
    assert regional.settle(cfg, tree, data, cuda=True)[1].params["cost"] == regional.CACHED_S
    (folder / regional.MANIFEST).write_text(json.dumps({"graphs": 4, "seconds": [1]}))
    assert regional.settle(cfg, tree, data, cuda=True)[1].params["cost"] == regional.CACHED_S
    assert regional.settle(cfg.replace(compile_layers="off"), tree, data, cuda=True) == (
        cfg.replace(compile_layers="off"), None)  # the user's choice stands, unsaid


def test_a_run_with_auto_on_the_cpu_trains_uncompiled_and_says_why(tmp_path):
    cfg = demo_config(output_dir=str(tmp_path), run_name="auto", device="cpu", max_steps=1, validation_share=0.0,
                      **FAST)
    events = []
    result = run_training(cfg, events.append)
    assert result.status == "completed", result.message
    assert "compile" not in result.summary
    assert [e["key"] for e in events if e.get("key", "").startswith("log.compile")] == ["log.compile.auto_cpu"]


def test_fastest_compiles_when_it_pays_and_older_configs_still_load():
    assert apply_preset(TrainConfig(), "fastest").compile_layers == "auto"
    assert {apply_preset(TrainConfig(), p).compile_layers for p in ("chapter", "lowest_memory", "six_gb")} == {"off"}
    # compile_layers was a bool before auto: YAML and --set keep meaning what they meant
    assert TrainConfig.from_yaml("compile_layers: true").compile_layers == "on"
    assert TrainConfig.from_yaml("compile_layers: false").compile_layers == "off"
    assert parse_overrides(["compile_layers=true", "kernel_warmup=off"]) == {"compile_layers": "on",
                                                                            "kernel_warmup": "off"}
    problems = [str(p) for p in config_problems(TrainConfig(compile_layers="sometimes"))]
    assert "compile_layers: 'sometimes' is not one of the choices -> pick one of: auto, on, off" in problems


def test_auto_stays_off_where_compiling_was_not_measured_read_from_the_users_own_model(tmp_path, demo_model_path):
    """Compiling was measured on SFT of a dense decoder trained as it is: a preference stage, a model with experts
    (transformers' experts interface, found in the model's own tree), or one preflight adapted, stays eager under
    auto, each said by name; a user's explicit on still compiles them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.test_estimate_stored import _config

    cfg = demo_config(output_dir=str(tmp_path), device="cpu", validation_share=0.0, max_steps=10**5, **FAST)
    data, _, _, tree = plan_data(cfg, lambda e: None)
    assert regional.settle(cfg, tree, data, cuda=True)[0].compile_layers == "on"  # 10^5 micro-steps repay it
    said = regional.settle(cfg.replace(stage="dpo"), tree, data, cuda=True)[1]
    assert said.key == "log.compile.auto_stage" and said.params["stage"] == "dpo"
    said = regional.settle(cfg, tree, data, cuda=True, processes=2)[1]
    assert said.key == "log.compile.auto_gpus" and said.params["n"] == 2
    adapted = [{"key": "log.adapt.unpacked"}]
    assert regional.settle(cfg, tree, data, cuda=True, adapted=adapted)[1].key == "log.compile.auto_adapted"
    values = _config("qwen3_moe")
    with torch.device("meta"):
        moe = AutoModelForCausalLM.from_config(AutoConfig.for_model(values.pop("model_type"), **values))
    settled, said = regional.settle(cfg, moe, data, cuda=True)
    assert settled.compile_layers == "off" and said.key == "log.compile.auto_experts"
    for line in (said, regional.unmeasured(cfg.replace(stage="orpo"), tree, []), regional.unmeasured(cfg, tree, [], 4)):
        event = make_event("log", level="info", **words_of(line))
        assert all("{" not in say(event["key"], event["params"], lang) for lang in ("en", "pt", "fr"))
    assert regional.settle(cfg.replace(compile_layers="on", stage="dpo"), moe, data, cuda=True)[1] is None


def test_a_resumed_run_weighs_only_the_steps_it_has_left(tmp_path, demo_model_path):
    cfg = demo_config(output_dir=str(tmp_path), device="cpu", validation_share=0.0, max_steps=10**5, **FAST)
    data, _, _, tree = plan_data(cfg, lambda e: None)
    fresh = regional.settle(cfg, tree, data, cuda=True)[1]
    resumed = regional.settle(cfg, tree, data, cuda=True, done=10**5 - 10)[1]
    assert fresh.params["steps"] == 10**5 * cfg.gradient_accumulation_steps
    assert resumed.params["steps"] == 10 * cfg.gradient_accumulation_steps and resumed.key == "log.compile.auto_off"
