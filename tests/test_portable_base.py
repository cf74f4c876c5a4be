"""adapter_config.json names its base portably: the Hub id where the run's model is one or its folder is a snapshot of
the Hugging Face cache, else the base folder's absolute path (never one relative to the adapter folder, which broke as
soon as the adapter moved); peft still loads the adapter from its folder, or from a copy elsewhere, and memtune's own
loaders (memtune.yaml) read it back."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from core.runs.card import portable_base


def test_hub_models_are_named_by_their_id_and_local_ones_absolute(tmp_path, monkeypatch):
    snapshot = "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B/snapshots/abc"
    assert portable_base(snapshot, "Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert portable_base(snapshot, snapshot) == "Qwen/Qwen2.5-0.5B"  # the cache's own folder named as the model
    assert portable_base(snapshot + "/", "/elsewhere") == "Qwen/Qwen2.5-0.5B"
    mine = tmp_path / "models" / "mine"
    assert portable_base(str(mine), str(mine)) == mine.resolve().as_posix()
    monkeypatch.chdir(tmp_path)
    assert portable_base("models/mine", "./models/mine") == mine.resolve().as_posix()  # the run's cwd's folder
    assert portable_base(str(tmp_path / "models--x" / "y"), "m") == (tmp_path / "models--x" / "y").resolve().as_posix()


def test_a_saved_adapter_names_its_base_relative_and_still_loads(tmp_path, demo_model_path, monkeypatch):
    import torch
    from peft import AutoPeftModelForCausalLM, LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.config.settings import demo_config
    from core.infer import adapter_config, model_answers
    from core.runs.folders import save_adapter

    base = Path(demo_model_path)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    tok = AutoTokenizer.from_pretrained(base)
    cfg = demo_config(output_dir=str(tmp_path / "runs"), run_name="r1")
    adapter = save_adapter(model, tok, cfg.to_yaml(), tmp_path / "runs" / "r1", {})
    saved = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert Path(saved).is_absolute() and Path(saved) == base.resolve() and ".." not in saved, saved
    assert adapter_config(adapter).model == cfg.model  # memtune reads memtune.yaml, not peft's field
    moved = shutil.copytree(adapter, tmp_path / "elsewhere" / "deeper" / "adapter")  # unzipped somewhere else
    monkeypatch.chdir(moved)  # the card's peft commands run from the adapter folder
    loaded = AutoPeftModelForCausalLM.from_pretrained(".")
    rows = [{"instruction": "Translate the word 'cat' into French."}]
    with torch.no_grad():
        assert model_answers(loaded, tok, rows) == model_answers(model, tok, rows)
    assert os.path.samefile(Path.cwd(), moved)
