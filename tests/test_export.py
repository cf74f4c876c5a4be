"""Export on the CPU: zip, merge (into the dequantized 4-bit weights by default, or the original bf16 ones; each
checked against peft's unmerged model on the same base weights), Hub push errors.

No network: tests/conftest.py sets HF_HUB_OFFLINE=1, and no test here reaches the point of an upload.
"""

import zipfile

import pytest
import torch

from core.export import adapter as export
from core.export.adapter import (ExportError, merge_adapter, merge_memory_check, merge_size, push_to_hub,
                         safetensors_params, zip_adapter)
from core.infer import adapter_config


@pytest.fixture(scope="module")
def adapter_dir(finished_run):
    """The session's finished demo run's adapter (run "finished"): every test here only reads it."""
    return finished_run.result.adapter_dir


@pytest.fixture(scope="module")
def merged(adapter_dir, tmp_path_factory):
    steps = []
    out = merge_adapter(adapter_dir, tmp_path_factory.mktemp("export") / "merged",
                        progress=lambda fraction, message: steps.append((fraction, message)))
    return out, steps


def test_zip_holds_the_adapter(adapter_dir, tmp_path):
    path = zip_adapter(adapter_dir, tmp_path)
    assert path.parent == tmp_path and path.name == "finished-adapter.zip"
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        assert {"adapter_model.safetensors", "adapter_config.json", "memtune.yaml"} <= names
        assert zf.testzip() is None
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind
    with pytest.raises(ExportError, match="adapter_config.json"):
        zip_adapter(tmp_path, tmp_path)


def test_default_merge_adds_the_delta_to_the_dequantized_4bit_weights(adapter_dir, merged):
    """The default merge of a 4-bit run: every merged matrix is bitsandbytes' dequantized NF4 weight (the run's own
    quant type, blocksize 64 and double quantization) + (alpha/r)·B·A, to bf16 rounding; the record says so."""
    import json

    import bitsandbytes as bnb
    from peft import PeftModel
    from safetensors.torch import load_file

    from core.model.load import load_model

    out, _ = merged
    record = json.loads((out / "memtune-merge.json").read_text())
    assert record["merged_into"] == "dequantized"
    assert record["quantization"] == [{"quant_type": "nf4", "blocksize": 64, "double_quant": True}]
    weights = load_file(out / "model.safetensors")
    cfg = adapter_config(adapter_dir).replace(load_in_4bit=False, precision="bf16", upcast_to_fp32=False,
                                              device="cpu")
    base = load_model(cfg)
    lora = PeftModel.from_pretrained(base, adapter_dir)
    name = "model.layers.1.mlp.down_proj"
    module = lora.get_submodule("base_model.model." + name)
    delta = module.get_delta_weight("default").float()
    original = module.base_layer.weight.detach()
    packed, state = bnb.functional.quantize_4bit(original, blocksize=64, quant_type="nf4", compress_statistics=True)
    expected = bnb.functional.dequantize_4bit(packed, state).float() + delta
    got = weights[name + ".weight"].float()
    step = expected.abs().max().item() / 128  # one bf16 rounding step near the largest value
    assert (got - expected).abs().max().item() <= step
    assert (got - (original.float() + delta)).abs().max().item() > 4 * step  # the rounding is really in there


@pytest.fixture(scope="module")
def merged_original(adapter_dir, tmp_path_factory):
    steps = []
    out = merge_adapter(adapter_dir, tmp_path_factory.mktemp("export") / "merged-original", merge_into="original",
                        progress=lambda fraction, message: steps.append((fraction, message)))
    return out, steps


def test_original_merge_gives_the_logits_of_base_plus_adapter(adapter_dir, merged_original):
    """Merging W' = W + (alpha/r)·B·A into the original weights must not change what the model computes.

    Reference: the same base loaded unquantized in bf16 with the adapter on top (peft, unmerged). Both run in
    bf16, which keeps 8 significant bits: near the largest demo logit (~9) one bf16 step is 0.0625. Each side
    rounds every weight and matmul output to bf16, along different paths (W + ΔW rounded once per weight vs.
    W·x and the LoRA branch rounded separately), so the logits differ by a few such steps (measured: ~0.19,
    3 steps). We allow 5% of the largest logit (~7 steps). A wrong merge (adapter missing, scaled wrongly or
    applied twice) is off by the adapter's whole effect, which is > 10 here and checked to dwarf the tolerance.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from core.model.load import load_model

    out, steps = merged_original
    assert [f for f, _ in steps] == sorted(f for f, _ in steps) and steps[-1][0] == 1.0
    assert '"merged_into": "original"' in (out / "memtune-merge.json").read_text()
    cfg = adapter_config(adapter_dir).replace(load_in_4bit=False, precision="bf16", upcast_to_fp32=False,
                                              device="cpu")
    ids = torch.tensor([[0, 261, 283, 28, 201, 312, 307, 289, 284, 297]])
    with torch.no_grad():
        base = load_model(cfg).eval()
        plain = base(input_ids=ids).logits.float()
        reference = PeftModel.from_pretrained(base, adapter_dir).eval()(input_ids=ids).logits.float()
        merged_model = AutoModelForCausalLM.from_pretrained(out).eval()
        assert merged_model.dtype == torch.bfloat16
        assert not any("lora" in name for name, _ in merged_model.named_parameters())
        result = merged_model(input_ids=ids).logits.float()
    scale = reference.abs().max().item()
    tolerance = 5e-2 * scale
    gap = (result - reference).abs().max().item()
    adapter_effect = (reference - plain).abs().max().item()
    assert gap <= tolerance, (gap, tolerance)
    assert adapter_effect > 4 * tolerance, (adapter_effect, tolerance)  # so the comparison means something
    assert (result.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9


def test_merged_folder_is_complete_and_its_size_is_known(merged):
    out, _ = merged
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "memtune-merge.json"} <= names
    assert not list(out.parent.glob(".*"))  # the temporary folder was renamed into place
    from transformers import AutoModelForCausalLM

    n_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(out).parameters())
    assert safetensors_params(out) == n_params


def test_merge_refuses_an_existing_folder(adapter_dir, merged):
    out, _ = merged
    with pytest.raises(ExportError, match="already exists"):
        merge_adapter(adapter_dir, out)


def test_memory_check_and_warning(adapter_dir, monkeypatch):
    cfg = adapter_config(adapter_dir)
    needed, available, ok, message = merge_memory_check(cfg)
    n = export.parameter_count(cfg)
    assert ok and needed >= 2 * n and available > needed and "GiB" in message
    assert merge_size(cfg) == (n, 2 * n, int(2 * n * export.MERGE_OVERHEAD))  # ui.tryexport words it

    monkeypatch.setattr(export, "_ram_free", lambda: 1000)
    monkeypatch.setattr(export, "_cuda_free", lambda: None)
    needed, available, ok, message = merge_memory_check(cfg)
    assert not ok and available == 1000 and "free RAM" in message
    with pytest.raises(ExportError, match="unquantized"):
        merge_adapter(adapter_dir)


def test_parameter_count_falls_back_to_safetensors_headers(adapter_dir, monkeypatch, demo_model_path):
    import core.model.shapes

    cfg = adapter_config(adapter_dir)
    expected = safetensors_params(demo_model_path)
    monkeypatch.setattr(core.model.shapes, "get_shape", lambda model: (_ for _ in ()).throw(ValueError(model)))
    assert export.parameter_count(cfg) == expected


def test_push_without_a_token_says_what_to_do(adapter_dir, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    with pytest.raises(ExportError, match="HF_TOKEN") as err:
        push_to_hub(adapter_dir, "someone/my-adapter")
    assert "huggingface.co/settings/tokens" in str(err.value)


def test_push_offline_is_a_clear_message_without_the_token(adapter_dir, monkeypatch):
    secret = "hf_" + "x" * 30
    monkeypatch.setenv("HF_TOKEN", secret)
    with pytest.raises(ExportError, match="HF_HUB_OFFLINE") as err:
        push_to_hub(adapter_dir, "someone/my-adapter")
    assert secret not in str(err.value)
    with pytest.raises(ExportError, match="not a Hub repository id"):
        push_to_hub(adapter_dir, "no slash here", token=secret)
    with pytest.raises(ExportError, match="neither an adapter folder nor a model folder"):
        push_to_hub(adapter_dir + "/nothing", "someone/my-adapter", token=secret)
