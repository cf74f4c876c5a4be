"""adapter_config.json names its base portably: the Hub id where the run's model is one, else the base folder
relative to the adapter folder (peft wrote the absolute path of the folder it loaded); peft still loads the adapter
from its folder, and memtune's own loaders (memtune.yaml) read it back."""

from __future__ import annotations

import json
import os
from pathlib import Path

from core.runs.card import portable_base


def test_hub_models_are_named_by_their_id_and_local_ones_relative(tmp_path):
    adapter = tmp_path / "runs" / "r1" / "adapter"
    assert portable_base("/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B/snapshots/abc",
                         "Qwen/Qwen2.5-0.5B", adapter) == "Qwen/Qwen2.5-0.5B"
    assert portable_base(str(tmp_path / "models" / "mine"), str(tmp_path / "models" / "mine"),
                         adapter) == "../../../models/mine"
    assert portable_base("already/relative", "./mine", adapter) == "already/relative"
    # a local model id that is a folder of the Hub cache: its Hub id, which loads on any machine
    snapshot = "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B/snapshots/abc"
    assert portable_base(snapshot, snapshot, adapter) == "Qwen/Qwen2.5-0.5B"
    assert portable_base(snapshot + "/", "/elsewhere", adapter) == "Qwen/Qwen2.5-0.5B"
    assert portable_base(str(tmp_path / "models--x" / "y"), "m", adapter) == "../../../models--x/y"


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
    assert not Path(saved).is_absolute() and (adapter / saved).resolve() == base.resolve(), saved
    assert adapter_config(adapter).model == cfg.model  # memtune reads memtune.yaml, not peft's field
    monkeypatch.chdir(adapter)  # the card's peft commands run from the adapter folder
    loaded = AutoPeftModelForCausalLM.from_pretrained(".")
    rows = [{"instruction": "Translate the word 'cat' into French."}]
    with torch.no_grad():
        assert model_answers(loaded, tok, rows) == model_answers(model, tok, rows)
    assert os.path.samefile(Path.cwd(), adapter)
