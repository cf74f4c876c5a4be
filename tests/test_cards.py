"""Exports that say what they are: the model card of the adapter folder, its zip, the merged folder and the GGUF
README (the run's figures, none invented, relative paths only), llama.cpp's general.* naming keys read back by the
tests' llama.cpp, Ollama names within Ollama's rules, and weights written with the mode of every other file.

The adapter is an untrained LoRA on the demo model, saved by the run's own save_adapter: no training needed here.
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
from pathlib import Path

import pytest

from core.config.settings import demo_config
from tests import llama_cpp

SUMMARY = {"status": "completed", "steps": 200, "final_loss": 0.01234, "data": {"rows_in_split": 100, "train_rows": 90},
           "eval": {"final": 0.5678, "final_step": 200},
           "nvml_peak_gib": 3.25,
           "heldout": {"scorer": "exact", "rows": 10, "base": {"mean": 0.1}, "parent": None, "adapter": {"mean": 0.9},
                       "verdict": {"verdict": "better",
                                   "message": "The adapter scores 90.0% where the base scores 10.0%."}}}
OLLAMA_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}")


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _no_absolute(text: str, *roots: Path) -> None:
    for root in roots:
        assert str(root) not in text
    assert "/tmp/" not in text and "/home/" not in text and "/root/" not in text


@pytest.fixture
def run_dir(tmp_path, demo_model_path, umask):
    """runs/<a run name longer than Ollama's 80 characters, with llama.cpp's Phi-3 trigger in it>/adapter, saved by
    save_adapter from an untrained LoRA on the demo model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.runs.folders import save_adapter

    run = tmp_path / "runs" / ("my-phi3-" + "very-long-run-name-" * 5)
    run.mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(demo_model_path)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    cfg = demo_config(output_dir=str(run.parent), load_in_4bit=False)
    save_adapter(model, AutoTokenizer.from_pretrained(demo_model_path), cfg.to_yaml(), run, dict(SUMMARY))
    return run


def test_the_card_says_what_the_run_recorded_and_invents_nothing():
    from core.runs.card import model_card

    cfg = demo_config()
    card = model_card(SUMMARY, cfg, "adapter", "apache-2.0")
    for text in ("demo-tiny-llama", cfg.dataset, "split `train`", "90 of 100 rows", "| Stage | sft |", "200 steps",
                 "0.0123", "0.5678", "3.25 GiB", "apache-2.0", "| base model | 10.0% |", "| this adapter | 90.0% |",
                 "Verdict: The adapter scores", "AutoPeftModelForCausalLM"):
        assert text in card, text
    assert "starting adapter" not in card  # no parent: no row for it
    bare = model_card({}, cfg, "merged")
    assert "see the base model's card" in bare and "AutoModelForCausalLM" in bare and "AutoPeft" not in bare
    for absent in ("loss", "GPU memory", "Held-out", "rows trained", "steps"):
        assert absent not in bare, absent
    assert "## Held-out scores" in card and "rows the run did not train on" in card
    demo = model_card({**SUMMARY, "heldout": {**SUMMARY["heldout"], "source": "demo"}}, cfg, "adapter")
    assert "## Scores on trained rows" in demo and "trained on (it held none out)" in demo and "Held-out" not in demo
    gguf = model_card(SUMMARY, cfg, "gguf")
    assert "from_pretrained" not in gguf  # the GGUF README adds its own llama.cpp and Ollama sections


def test_the_license_comes_from_the_base_models_card(tmp_path):
    from core.runs.card import base_license

    (tmp_path / "README.md").write_text("---\nlicense: mit\ntags: [x]\n---\n# A model\n")
    assert base_license(str(tmp_path)) == "mit"
    (tmp_path / "README.md").write_text("# no front matter\n")
    assert base_license(str(tmp_path)) is None


def test_the_adapter_folder_and_its_zip_carry_the_card_and_0644_weights(run_dir, tmp_path):
    from core.export.adapter import zip_adapter

    adapter = run_dir / "adapter"
    readme = (adapter / "README.md").read_text()
    assert "Model Card for Model ID" not in readme and "demo-tiny-llama" in readme and "0.0123" in readme
    assert "AutoPeftModelForCausalLM" in readme
    _no_absolute(readme, tmp_path)
    assert _mode(adapter / "adapter_model.safetensors") == 0o644 == _mode(adapter / "adapter_config.json")
    path = zip_adapter(adapter, tmp_path / "zips")
    with zipfile.ZipFile(path) as zf:
        assert zf.read("README.md").decode() == readme
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
    assert modes["adapter_model.safetensors"] == 0o644, modes


def test_an_older_adapters_zip_gets_the_card_in_place_of_peft_s_blank_one(run_dir, tmp_path):
    from core.export.adapter import zip_adapter

    adapter = run_dir / "adapter"
    (adapter / "README.md").write_text("# Model Card for Model ID\n")
    (adapter / "adapter_model.safetensors").chmod(0o600)
    with zipfile.ZipFile(zip_adapter(adapter, tmp_path / "zips")) as zf:
        assert "Model Card for Model ID" not in zf.read("README.md").decode()
        assert (zf.getinfo("adapter_model.safetensors").external_attr >> 16) & 0o777 == 0o644


def test_the_merged_folder_carries_a_card_and_no_absolute_path(run_dir, tmp_path):
    from core.export.adapter import merge_adapter

    out = merge_adapter(run_dir / "adapter", tmp_path / "merged")
    readme = (out / "README.md").read_text()
    assert "demo-tiny-llama" in readme and "0.5678" in readme and "AutoModelForCausalLM" in readme
    assert "AutoPeft" not in readme
    for name in ("README.md", "memtune-merge.json"):
        _no_absolute((out / name).read_text(), tmp_path)
    assert all(_mode(p) == 0o644 for p in out.glob("*.safetensors"))


def test_ollama_names_keep_to_ollamas_rules():
    from core.export.gguf_export import OLLAMA_NAME_MAX, ollama_name

    short = "smollm2-135m-run-1"
    assert ollama_name(short) == short
    long = ollama_name("Qwen2.5-Coder-7B-Instruct-" + "a very long run name " * 5)
    assert len(long) <= OLLAMA_NAME_MAX and OLLAMA_NAME.fullmatch(long), long
    assert long != ollama_name("Qwen2.5-Coder-7B-Instruct-" + "a very long run name " * 6)


def test_general_name_is_never_the_architecture_class(demo_model_path, tmp_path):
    from core.export.gguf import general_name, read_config

    config = read_config(demo_model_path)
    folder = tmp_path / "my-phi3-test"
    folder.mkdir()
    for model in (None, str(folder)):
        name = general_name(config, model)
        assert name != "LlamaForCausalLM" and "phi3" not in name.lower(), name
    assert general_name(config, "HuggingFaceTB/SmolLM2-135M") == "SmolLM2-135M"


def test_the_gguf_folder_has_a_card_relative_commands_naming_keys_and_0644_files(run_dir, tmp_path,
                                                                                  demo_model_path):
    from core.export.gguf import naming, read_config, write_gguf
    from core.export.gguf_export import OLLAMA_NAME_MAX, export_gguf, plan_gguf

    llama_cpp.require()
    plan = plan_gguf(adapter_dir=run_dir / "adapter", formats="f32")
    assert len(plan.name) <= OLLAMA_NAME_MAX and OLLAMA_NAME.fullmatch(plan.name)
    assert "at most 80 characters" in str(plan.message)
    result = export_gguf(adapter_dir=run_dir / "adapter", formats="f32")
    readme = result.readme.read_text()
    for text in ("demo-tiny-llama", "0.0123", "| this adapter | 90.0% |", "ollama create", "llama-cli -m",
                 "at most 80 characters"):
        assert text in readme, text
    for name in ("README.md", "Modelfile"):
        _no_absolute((result.out_dir / name).read_text(), tmp_path)
    assert all(_mode(p) == 0o644 for p in result.files.values())
    # a base on the Hub: its repo URL too (the demo is built locally)
    config = read_config(demo_model_path)
    hub = write_gguf(demo_model_path, tmp_path / "hub.gguf", "f32",
                     naming(config, "HuggingFaceTB/SmolLM2-135M", "my-run", "HuggingFaceTB/SmolLM2-135M"))
    keys = ["general.name", "general.basename", "general.finetune", "general.base_model.count",
            "general.base_model.0.name", "general.base_model.0.repo_url"]
    got = [a["metadata"] for a in llama_cpp.run([dict(model=str(result.files["f32"]), metadata=keys),
                                                 dict(model=str(hub), metadata=keys)])["answers"]]
    assert got[0]["general.name"] == got[0]["general.basename"] == "demo-tiny-llama"
    assert got[0]["general.finetune"] == plan.names["finetune"] and "phi3" not in got[0]["general.finetune"]
    assert got[0]["general.base_model.count"] == 1 and got[0]["general.base_model.0.name"] == "demo-tiny-llama"
    assert got[0]["general.base_model.0.repo_url"] is None
    assert got[1]["general.name"] == "SmolLM2-135M" and got[1]["general.finetune"] == "my-run"
    assert got[1]["general.base_model.0.repo_url"] == "https://huggingface.co/HuggingFaceTB/SmolLM2-135M"
