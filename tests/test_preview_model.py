"""The data preview says what the run will change for the model in hand before it loads (core.model.families.adapt,
from config.json and the meta-device tree) and which experts' weights get LoRA (lora_experts), in the run log's own
words and the page's language; the plan it shows is the one the run will train (rows unpacked when the run unpacks).

Tiny models of real families (tests/families_any.py's LFM2, tests/test_estimate_stored.py's Qwen3-MoE), saved with the
demo tokenizer; nothing is downloaded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from core.config.settings import demo_config
from core.demo import ensure_demo_model
from core.i18n import t
from tests import families_any
from tests.test_estimate_stored import _config
from ui import data
from ui.fields import FIELD_NAMES
from ui.form import to_values


def _save(config, folder: Path) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.to(torch.bfloat16).save_pretrained(folder)
    for f in ensure_demo_model().iterdir():
        if "token" in f.name or f.name == "chat_template.jinja":
            shutil.copy(f, folder / f.name)
    return folder


def _preview(lang: str, **changes) -> str:
    cfg = demo_config(**changes)
    values = to_values(cfg)
    return data.on_preview(lang, *[values[name] for name in FIELD_NAMES])


@pytest.mark.parametrize("lang", ["en", "pt"])
def test_a_stateful_mixer_is_previewed_unpacked_with_the_run_logs_reason(tmp_path, lang):
    folder = _save(families_any.hf_config("lfm2"), tmp_path / "lfm2")
    html = _preview(lang, model=str(folder), packing=True)
    reason = t("log.adapt.unpacked_mixer", lang, model_type="lfm2", kinds="conv")
    assert reason.split("conv")[0][:40] in html  # the run log's line, in the page's language
    assert t("preview.packs", lang, n=1, max_length=64).split("1")[0] not in html  # no packs: the rows train unpacked
    packed = _preview(lang, packing=True)  # the demo model (Llama) packs as asked: no such line
    assert reason.split("conv")[0][:40] not in packed


def test_lora_on_experts_is_previewed_by_weight_name(tmp_path):
    from transformers import AutoConfig

    values = _config("qwen3_moe")
    folder = _save(AutoConfig.for_model(values.pop("model_type"), **values), tmp_path / "moe")
    html = _preview("en", model=str(folder), lora_experts=True, load_in_4bit=False, lora_dropout=0.0)
    assert "LoRA on experts: mlp.experts.gate_up_proj, mlp.experts.down_proj" in html
    plain = _preview("en", model=str(folder), load_in_4bit=False, lora_dropout=0.0)
    assert "LoRA on experts" not in plain
