"""The memory estimator: shapes, storage arithmetic, calibration on measured H200 runs, fit-to-GPU and the CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.checklist import ITEMS
from core.config import DEMO_MODEL, TrainConfig
from core.estimate import GIB, Estimate, FitError, estimate, fit_to_gpu, main, nf4_bytes, savings
from core.shapes import SHAPES, ShapeError, get_shape

ROOT = Path(__file__).resolve().parent.parent
L8B = SHAPES["meta-llama/Llama-3.1-8B"]
SEED = TrainConfig()  # the chapter's recipe


def close(pred: float, measured: float, tol: float) -> bool:
    return abs(pred - measured) <= tol * measured


# --- shapes ---------------------------------------------------------------------------------------------------------
# Published parameter counts (model cards), in billions; the table's shapes must reproduce them.
PUBLISHED = {
    "meta-llama/Llama-3.2-1B": 1.24, "meta-llama/Llama-3.2-3B": 3.21, "meta-llama/Llama-3.1-8B": 8.03,
    "meta-llama/Llama-3.1-70B": 70.6, "mistralai/Mistral-7B-v0.3": 7.25, "Qwen/Qwen2.5-0.5B": 0.49,
    "Qwen/Qwen2.5-1.5B": 1.54, "Qwen/Qwen2.5-3B": 3.09, "Qwen/Qwen2.5-7B": 7.61, "Qwen/Qwen2.5-14B": 14.7,
    "Qwen/Qwen2.5-32B": 32.5, "Qwen/Qwen2.5-72B": 72.7, "google/gemma-2-2b": 2.61, "google/gemma-2-9b": 9.24,
    "google/gemma-2-27b": 27.2,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_table_reproduces_published_parameter_counts(name):
    assert close(SHAPES[name].total_params / 1e9, PUBLISHED[name], 0.01)


def test_table_lookup_is_case_insensitive_and_maps_instruct_variants():
    assert get_shape("META-LLAMA/llama-3.1-8b") == L8B
    assert get_shape("meta-llama/Llama-3.1-8B-Instruct").hidden_size == 4096
    assert get_shape("Qwen/Qwen2.5-7B-Instruct").vocab_size == 152064
    assert get_shape("google/gemma-2-9b-it").head_dim == 256
    with pytest.raises(ShapeError, match="unknown"):
        get_shape("acme/no-such-model")


def _llama_config(**kw):
    cfg = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "tie_word_embeddings": False, "max_position_embeddings": 512}
    cfg.update(kw)
    return cfg


def test_shape_from_local_folder_and_config_path(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_llama_config()))
    for where in (tmp_path, tmp_path / "config.json"):
        shape = get_shape(str(where))
        assert (shape.hidden_size, shape.head_dim, shape.kv_dim) == (64, 16, 32)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ShapeError, match="no config.json"):
        get_shape(str(empty))


def test_shape_from_the_hf_cache_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    snap = tmp_path / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(_llama_config(vocab_size=777)))
    (tmp_path / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    assert get_shape("acme/tiny").vocab_size == 777


def test_demo_model_shape(demo_model_path):
    shape = get_shape(DEMO_MODEL)
    assert (shape.hidden_size, shape.num_hidden_layers) == (64, 2)


# --- weight storage -------------------------------------------------------------------------------------------------
def test_nf4_bytes_match_bitsandbytes_storage():
    import torch
    import bitsandbytes.functional as F

    for rows, cols in ((256, 512), (33, 77)):
        w = torch.randn(rows, cols, dtype=torch.bfloat16)
        for double in (True, False):
            packed, state = F.quantize_4bit(w, blocksize=64, compress_statistics=double, quant_type="nf4")
            tensors = [packed, state.absmax, state.code]
            if double:
                tensors += [state.state2.absmax, state.state2.code, state.offset]
            assert nf4_bytes(w.numel(), double) == sum(t.numel() * t.element_size() for t in tensors)


def test_8b_weights_match_the_measured_load():
    # Llama-3.1-8B has 8.03 B params; BASELINE: 5.32 GiB allocated after the 4-bit load (NF4 body ~3.4 GiB +
    # bf16 embeddings and head ~2.0 GiB).
    assert close(L8B.total_params / 1e9, 8.03, 0.005)
    est = estimate(SEED.replace(upcast_to_fp32=False), L8B)
    assert close(est.quantized_weights / GIB, 3.4, 0.02)
    assert close((est.quantized_weights + est.unquantized_weights) / GIB, 5.32, 0.02)
    plain = estimate(SEED.replace(bnb_4bit_use_double_quant=False, upcast_to_fp32=False), L8B)
    # double quant saves ~0.37 bit per quantized parameter
    saved_bits = 8 * (plain.quantized_weights - est.quantized_weights) / L8B.linear_params
    assert 0.35 < saved_bits < 0.4


# --- calibration: shared/gpu/BASELINE.md (one H200) -----------------------------------------------------------------
BASELINE = [
    # (config, peak allocated, peak reserved, NVML) in GiB
    (SEED, 8.22, 9.48, 10.87),
    (SEED.replace(optim="adamw_torch"), 8.25, 9.51, 10.89),
    (SEED.replace(load_in_4bit=False, upcast_to_fp32=False, gradient_checkpointing=False, optim="adamw_torch"),
     18.17, 18.42, 19.80),
    (SEED.replace(packing=True, per_device_train_batch_size=16, gradient_accumulation_steps=1), 15.08, 16.44, 17.79),
    (SEED.replace(packing=True, per_device_train_batch_size=16, gradient_accumulation_steps=1, use_liger_kernel=True),
     14.33, 15.56, 16.92),
]


@pytest.mark.parametrize("cfg, alloc, reserved, nvml", BASELINE)
def test_baseline_rows_within_ten_percent(cfg, alloc, reserved, nvml):
    est = estimate(cfg, L8B)
    assert close(est.total_gib, nvml, 0.10), est.table()
    assert close(est.peak_allocated_gib, alloc, 0.10)
    assert close(est.peak_reserved_gib, reserved, 0.10)


def test_components_sum_to_the_total_and_name_the_phase():
    est = estimate(SEED, L8B)
    assert sum(est.components().values()) == est.nvml_peak
    assert est.peak_phase == "loading"  # the fp32 upcast of embed/head, not training, is the recipe's peak
    lean = estimate(SEED.replace(upcast_to_fp32=False), L8B)
    assert lean.peak_phase == "training" and lean.load_spike == 0
    assert lean.total_gib < est.total_gib - 2


# --- monotonic behaviour --------------------------------------------------------------------------------------------
VARIANTS = [
    SEED,
    SEED.replace(gradient_checkpointing=False),
    SEED.replace(load_in_4bit=False, optim="adamw_torch"),
    SEED.replace(packing=True, use_liger_kernel=True, upcast_to_fp32=False),
    SEED.replace(precision="fp32", lora_target_modules=["q_proj", "down_proj"]),
]


@pytest.mark.parametrize("base", VARIANTS)
def test_more_rank_length_or_batch_never_predicts_less(base):
    for field, values in (("lora_r", [1, 4, 16, 64, 256]), ("max_length", [16, 128, 512, 2048, 8192]),
                          ("per_device_train_batch_size", [1, 2, 4, 16, 64])):
        totals = [estimate(base.replace(**{field: v}), L8B) for v in values]
        for a, b in zip(totals, totals[1:]):
            assert b.nvml_peak >= a.nvml_peak, field
            assert b.peak_allocated >= a.peak_allocated, field


def test_checkpointing_saves_at_long_rows():
    long = SEED.replace(max_length=4096, upcast_to_fp32=False)
    on, off = estimate(long, L8B), estimate(long.replace(gradient_checkpointing=False), L8B)
    assert off.total_gib - on.total_gib > 5


# --- savings --------------------------------------------------------------------------------------------------------
def test_savings_cover_the_seven_items():
    items = savings(SEED, L8B)
    assert [s.key for s in items] == [i.key for i in ITEMS]
    by_key = {s.key: s for s in items}
    assert by_key["qlora"].saved_gib > 3 and by_key["qlora"].on
    assert by_key["gradient_accumulation"].saved_gib > 1  # off = batch 16 in one micro-batch
    assert by_key["efficient_optimizer"].text == "saves nothing here"  # LoRA's optimizer state is tiny
    for s in items:
        assert s.text == ("saves nothing here" if s.saved_gib < 0.05 else f"saves {s.saved_gib:.1f} GiB here")


# --- fit to a GPU ---------------------------------------------------------------------------------------------------
def test_fit_respects_the_budget_and_keeps_the_effective_batch():
    greedy = SEED.replace(per_device_train_batch_size=16, gradient_accumulation_steps=2, max_length=2048,
                          gradient_checkpointing=False, optim="adamw_torch", upcast_to_fp32=False)
    assert estimate(greedy, L8B).total_gib > 40
    for budget_gib in (80, 40, 24, 16, 12):
        cfg, est = fit_to_gpu(greedy, budget_gib * GIB, margin=0.1, shape=L8B)
        assert est.nvml_peak <= 0.9 * budget_gib * GIB
        assert est == estimate(cfg, L8B)
        assert cfg.max_length <= greedy.max_length
        assert cfg.effective_batch_size >= greedy.effective_batch_size
        assert cfg.gradient_accumulation_steps == -(-greedy.effective_batch_size // cfg.per_device_train_batch_size)
    # A roomy GPU keeps the user's settings untouched
    roomy = int(estimate(greedy, L8B).nvml_peak / 0.9) + GIB
    assert fit_to_gpu(greedy, roomy, shape=L8B)[0] == greedy


def test_fit_raises_with_the_minimum_when_nothing_fits():
    with pytest.raises(FitError, match=r"needs \d+\.\d GiB"):
        fit_to_gpu(SEED, 6 * GIB, shape=L8B)


# --- CLI ------------------------------------------------------------------------------------------------------------
def test_cli_json(capsys):
    assert main(["--json", "--set", "max_length=1024"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total_gib"] > 5 and out["tokens_per_micro_batch"] == 1024
    assert {f"{c}_gib" for c in Estimate.COMPONENTS} <= set(out)


def test_cli_reads_a_yaml_config(tmp_path, capsys):
    path = SEED.replace(model="Qwen/Qwen2.5-0.5B", per_device_train_batch_size=4).save(tmp_path / "c.yaml")
    assert main(["--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert "Qwen/Qwen2.5-0.5B" in text and "total" in text


def test_cli_errors_are_clear_and_non_zero(capsys, tmp_path):
    assert main(["--set", "max_length=abc"]) == 2
    assert "max_length" in capsys.readouterr().err
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--set", "model=acme/no-such-model"]) == 2
    assert "unknown" in capsys.readouterr().err


def test_cli_as_a_module():
    run = subprocess.run([sys.executable, "-m", "core.estimate", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["total_gib"] == pytest.approx(estimate(SEED, L8B).total_gib, abs=0.01)
