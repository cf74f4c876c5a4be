"""The estimator reads every family's config.json (issue 41): over the tiny models of tests/families.py and
tests/families_any.py, core.model.shapes counts exactly the parameters the loaded model holds, and one decoder
layer's saved activations are measured (core/estimate/measure.py) at the family's own widths."""

from __future__ import annotations

import json

import pytest
import torch

from tests import families, families_any

ALL = [("families", n) for n in families.NAMES] + [("families_any", n) for n in families_any.NAMES]


def _config(source: str, name: str) -> dict:
    module = families if source == "families" else families_any
    return module.hf_config(name).to_dict()


@pytest.mark.parametrize("source,name", ALL, ids=[n for _, n in ALL])
def test_shape_counts_what_the_model_holds(source, name):
    from transformers import AutoModelForCausalLM

    from core.model.shapes import ModelShape

    data = _config(source, name)
    shape = ModelShape.from_config(data, name)
    module = families if source == "families" else families_any
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(module.hf_config(name))
    held = sum(p.numel() for p in model.parameters())
    assert shape.total_params == held, (name, shape.total_params, held)
    assert shape.config_text  # built from the config: the activation term can be measured
    assert shape.hidden_size == int(model.config.get_text_config().hidden_size)


@pytest.mark.parametrize("name", ["gpt2", "gpt_neox", "falcon", "phi", "mixtral"])
def test_layer_activations_are_measured(name, tmp_path, monkeypatch):
    """One layer's saved bytes per token come from autograd at the family's widths, cached on disk, and grow with
    LoRA dropout (each adapted layer keeps its dropout output and mask) and with key/value heads repeated."""
    from core.estimate import measure
    from core.model.shapes import ModelShape

    monkeypatch.setenv("MEMTUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(measure, "_DISK", None)
    monkeypatch.setattr(measure, "_MEMO", {})
    torch.set_num_threads(1)
    text = ModelShape.from_config(families_any.hf_config(name).to_dict(), name).config_text
    plain = measure.layer_saved(text, "bf16", ("q_proj", "k_proj", "v_proj", "o_proj"), 8, False, False)
    dropout = measure.layer_saved(text, "bf16", ("q_proj", "k_proj", "v_proj", "o_proj"), 8, True, False)
    assert plain is not None and plain["saved"] > 0 and not plain["own_attention"]
    assert dropout["saved"] > plain["saved"]
    assert plain["moe"] == (name == "mixtral")
    cached = json.loads((tmp_path / "layer_saved.json").read_text())
    assert sorted(v["saved"] for v in cached.values()) == sorted([plain["saved"], dropout["saved"]])


@pytest.mark.parametrize("arch", ["olmoe-1b-7b", "granite-3.1-2b", "starcoder2-3b", "redpajama-3b"])
def test_issue41_gpu_rows_are_planned_and_counted(arch):
    """bench/archs.py's full-size families for the lead's GPU call: families_gpu's plan runs every preset (fastest
    included) without held-out eval, and the estimator's shape of the config counts the model's parameters."""
    from bench.archs import ARCHS, parameter_count
    from bench.product_plans import plan
    from core.model.shapes import ModelShape

    rows = plan(f"families-{arch}")
    assert [v.preset for v in rows] == ["fastest", "lowest_memory", "chapter"]
    assert all("validation_share=0" in v.sets for v in rows)
    assert ModelShape.from_config(dict(ARCHS[arch]), arch).total_params == parameter_count(arch)


def test_the_estimate_uses_the_measured_layer(tmp_path, monkeypatch):
    """A config the estimator can build (here gpt_neox: fused query_key_value, a GELU MLP without a gate) gets its
    layer term from the measurement, not from the Llama-shaped formula; a hand shape (no config) keeps the formula,
    and so does the chapter's fp32 upcast (no CPU stand-in for bitsandbytes' fp32 stream under bf16 autocast)."""
    from dataclasses import replace

    from core.config.presets import apply_preset
    from core.config.settings import TrainConfig
    from core.estimate import measure
    from core.estimate.terms import layer_bytes_per_token
    from core.model.shapes import ModelShape

    monkeypatch.setenv("MEMTUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(measure, "_DISK", None)
    torch.set_num_threads(1)
    shape = ModelShape.from_config(families_any.hf_config("gpt_neox").to_dict(), "gpt_neox")
    cfg = apply_preset(TrainConfig(model="x"), "fastest").replace(use_liger_kernel=False)
    saved, _ = layer_bytes_per_token(cfg, shape, liger_layers=False, kv_repeated=False)
    found = measure.layer_saved(shape.config_text, cfg.precision, tuple(cfg.lora_target_modules), cfg.lora_r,
                                cfg.lora_dropout > 0, False)
    assert saved == found["saved"]
    formula, _ = layer_bytes_per_token(cfg, replace(shape, config_text=""), liger_layers=False, kv_repeated=False)
    assert formula != saved
    chapter = apply_preset(TrainConfig(model="x"), "chapter")
    assert layer_bytes_per_token(chapter, shape)[0] == layer_bytes_per_token(chapter, replace(shape, config_text=""))[0]


def test_a_layernorm_family_on_4bit_keeps_an_fp32_stream(tmp_path, monkeypatch):
    """Run 17 (H200): StarCoder2-3B `fastest` peaked at 35.95 GiB against an estimate of 20.59 (-42.7%). CUDA autocast
    runs LayerNorm in fp32 and bitsandbytes' 4-bit linear returns its input's dtype, so a LayerNorm family's stream
    stays fp32 (its GELU keeps an fp32 input) and q/k/v reach attention in fp32. The measurement reproduces both on
    the CPU; an RMSNorm family (granite) casts back to its input dtype itself and measures the same whatever the
    base. memtune's varlen attention then casts q/k/v to bf16 for FlashAttention (core/model/attention.py
    `_target_dtype`; before that, run 17 and 18's `fastest`, it took SDPA with a [T, T] mask): no mask is counted."""
    from dataclasses import replace

    from core.config.presets import apply_preset
    from core.config.settings import TrainConfig
    from core.estimate import measure
    from core.estimate.terms import layer_bytes_per_token, single_gpu_terms
    from core.model.shapes import ModelShape

    monkeypatch.setenv("MEMTUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(measure, "_DISK", None)
    monkeypatch.setattr(measure, "_MEMO", {})
    torch.set_num_threads(1)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    got = {}
    for name in ("starcoder2", "granite"):
        text = ModelShape.from_config(families_any.hf_config(name).to_dict(), name).config_text
        got[name] = [measure.layer_saved(text, "bf16", targets, 8, False, True, four_bit=q4) for q4 in (True, False)]
    (sc_4bit, sc_16bit), (gr_4bit, gr_16bit) = got["starcoder2"], got["granite"]
    assert sc_4bit["fp32_attention"] and not sc_16bit["fp32_attention"]
    assert sc_4bit["saved"] > sc_16bit["saved"]
    assert gr_4bit == gr_16bit and not gr_4bit["fp32_attention"]

    shape = ModelShape.from_config(families_any.hf_config("starcoder2").to_dict(), "starcoder2")
    cfg = apply_preset(TrainConfig(model="x"), "fastest").replace(attention="varlen", packing=True,
                                                                  gradient_checkpointing=False,
                                                                  offload_activations=False)
    t = single_gpu_terms(cfg, shape, max_row_tokens=64, attention="varlen")
    assert any("casts them to bf16 for FlashAttention" in n for n in t.notes)
    saved, _ = layer_bytes_per_token(cfg, shape, kv_repeated=True)
    # every layer keeps its measured activations and nothing else: no [T, T] bool mask, no per-layer bf16 bias
    assert t.activations == shape.num_hidden_layers * saved * t.tokens
    sdpa = single_gpu_terms(cfg, shape, max_row_tokens=64, attention="sdpa")  # SDPA over the pack keeps the mask
    assert sdpa.activations - t.activations >= 2 * t.tokens ** 2 * shape.num_hidden_layers
    # the 16-bit base (no fp32 LayerNorm stream) says nothing about a cast
    plain = single_gpu_terms(cfg.replace(load_in_4bit=False), replace(shape), max_row_tokens=64, attention="varlen")
    assert not any("casts them" in n for n in plain.notes)


def test_families_table_has_each_preset_once_and_one_warm_row_per_call(tmp_path, monkeypatch):
    """Run 17's families.md listed granite's and starcoder2's `fastest` twice: bench.product's discarded warm row was
    read as a preset row. The table keeps the preset's own row, estimated with the settings the run reports (not
    what today's preset would fit), and only the call's first arch pays for a warm row."""
    from bench import families_gpu
    from core.config.settings import TrainConfig
    from core.estimate import measure

    monkeypatch.setenv("MEMTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measure, "_DISK", None)
    torch.set_num_threads(1)
    arch = "granite-3.1-2b"
    runs = tmp_path / arch / "runs"
    rows = []
    for name, preset, batch in (("fastest-discarded", "fastest", 8), ("fastest", "fastest", 5),
                                ("lowest_memory", "lowest_memory", 2)):
        (runs / name).mkdir(parents=True)
        TrainConfig(model="x", max_length=256).save(runs / f"{name}.yaml")
        (runs / name / "summary.json").write_text(json.dumps({"data": {"longest_row_tokens": 300}}))
        rows.append({"name": name, "variant": {"preset": preset}, "rc": 0, "nvml_peak_gib": 10.0,
                     "nvml_floor_gib": 0.601, "settings": {"per_device_train_batch_size": batch}})
    (tmp_path / arch / "results.json").write_text(json.dumps({"info": {"date": "2026-12-04"}, "rows": rows}))
    got = families_gpu.estimates(tmp_path, arch)
    assert [(r["preset"], r["batch"].split(" x ")[0]) for r in got] == [("fastest", "5"), ("lowest_memory", "2")]
    lines = families_gpu.table_lines(got)
    assert sum(f"| {arch} | fastest |" in line for line in lines) == 1
    first, later = (families_gpu.product_command(tmp_path, arch, 400, warm_row=w) for w in (True, False))
    assert "--no-warm-row" not in first and "--no-warm-row" in later
