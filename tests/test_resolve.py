"""The run is decided once (core/model/resolve.py): what trains, each change from what was asked with its keyed
reason, the one trainer built from it, and Show code's script training exactly that run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.config.presets import apply_preset
from core.config.settings import TrainConfig, demo_config
from core.messages import Said
from core.model import compile as regional
from core.model import families
from core.model.resolve import ResolvedRun, resolve
from tests import families_any
from tests.test_any_model import _folder as saved_family


def _tree(name: str):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        return AutoModelForCausalLM.from_config(families_any.hf_config(name))


_folder = saved_family  # the family's tiny model saved with the demo's tokenizer files (tests/test_any_model.py)


def _cpu(folder: Path, tmp_path: Path, preset: str = "fastest") -> TrainConfig:
    cfg = apply_preset(demo_config(model=str(folder), output_dir=str(tmp_path / "runs")), preset)
    return cfg.replace(use_liger_kernel=False, offload_activations=False, offload_embeddings=False, precision="fp32",
                       load_in_4bit=False, optim="adamw_torch", max_steps=1, device="cpu",
                       lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def test_a_conv_mixer_trains_unpacked_and_the_run_says_why():
    asked = apply_preset(TrainConfig(), "fastest").replace(compile_layers="off")
    assert asked.packing and asked.attention == "varlen"
    run = resolve(asked, _tree("lfm2"), cuda=False)
    assert run.asked is asked and run.cfg.packing is False and run.cfg.attention == "sdpa"
    assert [(c.field, c.before, c.after, c.key) for c in run.changes] == [
        ("packing", True, False, "log.adapt.unpacked_mixer"), ("attention", "varlen", "sdpa", "log.adapt.no_varlen")]
    assert run.changes[1].params["why"]["key"] == "log.adapt.why_unpacked"
    assert [(level, line.key) for level, line in run.lines()] == [
        ("warning", "log.adapt.unpacked_mixer"), ("warning", "log.adapt.no_varlen")]
    # what families.adapt says for the page's preview is what the run records
    assert [line.key for line in families.adapt(asked, families.traits(_tree("lfm2").config, _tree("lfm2")))[1]] \
        == [line.key for _, line in run.lines()]
    shown = json.loads(json.dumps(run.as_dict()))  # JSON for events, summary.json and the page
    assert shown["config"] == run.cfg.to_dict() and shown["changes"][0]["field"] == "packing"
    with pytest.raises(AttributeError):
        run.cfg = asked  # frozen: nothing rebinds the run after it is decided


def test_alibi_keeps_packed_rows_and_runs_sdpa():
    run = resolve(apply_preset(TrainConfig(), "fastest").replace(compile_layers="off"), _tree("falcon-alibi"),
                  cuda=False)
    assert run.cfg.packing and run.cfg.attention == "sdpa"
    assert [(c.field, c.key, c.params["why"]["key"]) for c in run.changes] == [
        ("attention", "log.adapt.no_varlen", "log.adapt.why_alibi")]


def test_varlen_without_packing_is_recorded_but_not_said():
    """A preset for dpo keeps varlen with its pairs unpacked: sdpa trains, the page can show it, the log stays as it
    was (nothing asked for is lost)."""
    asked = apply_preset(TrainConfig(stage="dpo"), "fastest").replace(compile_layers="off")
    assert not asked.packing and asked.attention == "varlen"
    run = resolve(asked, _tree("gpt2"), cuda=False)
    assert run.cfg.attention == "sdpa" and [c.logged for c in run.changes] == [False]
    assert run.lines() == [] and run.adapted() == []


def test_compile_auto_is_left_to_the_data_plan_where_only_its_steps_decide(tmp_path, monkeypatch):
    monkeypatch.setenv(regional.CACHE_ENV, str(tmp_path / "cache"))
    tree = _tree("gpt2")
    auto = TrainConfig(compile_layers="auto", gradient_checkpointing=False, max_steps=0)
    assert resolve(auto, tree, cuda=True).cfg.compile_layers == "auto"  # the page's call: no plan, no guess
    cpu = resolve(auto, tree, cuda=False)
    assert cpu.cfg.compile_layers == "off" and [(c.key, c.level) for c in cpu.changes] == [
        ("log.compile.auto_cpu", "info")]
    steps = resolve(auto.replace(max_steps=10), tree, cuda=True)  # a step count decides without the plan
    assert steps.cfg.compile_layers == "off" and steps.changes[0].key == "log.compile.auto_off"


def test_a_preference_stage_takes_the_adapters_lora_shape(tmp_path):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(
        {"r": 4, "lora_alpha": 8, "target_modules": ["v_proj", "q_proj"], "lora_dropout": 0.0, "use_dora": False}))
    asked = TrainConfig(stage="dpo", init_adapter=str(tmp_path), lora_r=16, lora_alpha=32, lora_dropout=0.0)
    run = resolve(asked, _tree("gpt2"), cuda=False)
    assert (run.cfg.lora_r, run.cfg.lora_alpha, run.cfg.lora_target_modules) == (4, 8, ["q_proj", "v_proj"])
    assert {c.field for c in run.changes} == {"lora_r", "lora_alpha", "lora_target_modules"}
    assert {c.key for c in run.changes} == {"log.pref.init_adapter"} and run.lines() == []  # start_from says it


def test_a_rejected_packing_is_decided_before_the_one_trainer(tmp_path, monkeypatch):
    """OPT's packed rows see each other under sdpa (config.json cannot tell): the pre-flight finds it on the loaded
    model before the trainer exists, and the one trainer is built on unpacked rows."""
    from core.train import recipe

    built = []

    def build(cfg, *args, **kwargs):
        built.append(cfg)
        return real(cfg, *args, **kwargs)

    real = recipe.build_trainer
    monkeypatch.setattr(recipe, "build_trainer", build)
    events = []
    cfg = _cpu(_folder("opt", tmp_path), tmp_path, "lowest_memory").replace(attention="sdpa")
    result = recipe.run_training(cfg, sink=events.append)
    assert result.status == "completed", result.message
    assert [c.packing for c in built] == [False]
    changes = result.summary["resolved"]["changes"]
    assert [(c["field"], c["after"], c["key"]) for c in changes] == [("packing", False, "log.preflight.unpacked")]
    assert result.summary["resolved"]["config"]["packing"] is False and result.summary["data"]["packs"] is None
    assert result.summary["preflight"]["switched_to"] == "unpacked"


def test_show_codes_script_trains_exactly_the_resolved_run(tmp_path):
    """lfm2's conv mixer turns packing off: the generated script's run records the run resolve() decides for the
    settings it holds, and trained it (unpacked rows)."""
    from core import codegen
    from core.model import lora_targets

    folder = _folder("lfm2", tmp_path)
    cfg = _cpu(folder, tmp_path)
    expected = resolve(cfg, lora_targets.skeleton(str(folder)), cuda=False)
    assert not expected.cfg.packing and expected.changes  # the family changes the run
    script = tmp_path / "train.py"
    script.write_text(codegen.python_script(cfg, expected.as_dict()["changes"]), encoding="utf-8")
    assert "- packing true -> false: lfm2 has" in script.read_text()  # said, and why
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = Path(re.search(r"^run folder: (.+)$", proc.stdout, re.M).group(1))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resolved"] == json.loads(json.dumps(expected.as_dict()))
    assert summary["data"]["packs"] is None and "rows" not in summary["preflight"]  # it trained unpacked
    keys = [json.loads(line).get("key") for line in (run_dir / "events.jsonl").read_text().splitlines()]
    said = [line.key for _, line in expected.lines()]  # each change's line, in order
    assert "log.adapt.unpacked_mixer" in said and [k for k in keys if k in said] == said


def test_the_resolved_run_is_a_frozen_value():
    run = ResolvedRun(TrainConfig(), TrainConfig())
    assert run.then(Said("log.adapt.why_unpacked"), packing=False) is run  # already off: no change
