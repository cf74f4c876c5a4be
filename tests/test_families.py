"""README's support matrix, family by family (tiny models of each: tests/families.py).

Attention: every path memtune installs equals the model's own eager attention on packed rows, each row compared with
the same row run alone through eager attention, with the soft-cap engaged (Gemma-2), sliding windows shorter than
the rows, custom scaling (query_pre_attn_scalar) and grouped-query heads.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from core.model import attention as varlen
from tests import families

ROWS = (13, 19, 7)  # longer than every tiny sliding window (8), so the window engages


def _rows(seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(3, families.VOCAB, (1, n), generator=g) for n in ROWS]
    pos = torch.cat([torch.arange(n) for n in ROWS])[None]
    return rows, torch.cat(rows, 1), pos


def _sharpen(m, factor: float = 40.0):
    """Scale every q/k projection so attention logits reach past Gemma-2's soft-cap (50)."""
    with torch.no_grad():
        for name, mod in m.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("q_proj", "k_proj"):
                mod.weight.mul_(factor)
            elif leaf == "qkv_proj":  # Phi-3: the q and k thirds (all heads here have one width)
                q_and_k = mod.weight.shape[0] - 2 * (mod.weight.shape[0] // 3) + mod.weight.shape[0] // 3
                mod.weight[:q_and_k].mul_(factor)
    return m


def _alone(ref, rows):
    with torch.no_grad():
        return torch.cat([ref(input_ids=r, use_cache=False).logits[0] for r in rows])


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("name", families.NAMES)
def test_varlen_attention_equals_the_models_eager_attention_on_packed_rows(name):
    ref = _sharpen(families.model(name))
    m = copy.deepcopy(ref)
    varlen.use_varlen_attention(m)
    rows, packed, pos = _rows()
    expected = _alone(ref, rows)
    with torch.no_grad():
        got = m(input_ids=packed, position_ids=pos, use_cache=False).logits[0]
    assert _rel(got, expected) < 1e-4, name


@pytest.mark.parametrize("name", families.NAMES)
def test_the_sdpa_setting_keeps_packed_rows_apart_as_eager_does(name):
    """attention: sdpa loads the model with transformers' default implementation (eager where a family has no SDPA,
    as Gemma-2): packed rows must still equal each row alone."""
    ref = _sharpen(families.model(name))
    default = families.hf_config(name, attn=None)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(default)
    m.load_state_dict(ref.state_dict())
    m.eval()
    rows, packed, pos = _rows()
    with torch.no_grad():
        got = m(input_ids=packed, position_ids=pos, use_cache=False).logits[0]
    assert _rel(got, _alone(ref, rows)) < 1e-4, (name, m.config._attn_implementation)


def test_the_gemma2_soft_cap_is_engaged_and_kept():
    """The test above would pass with the cap dropped if the logits never reached it: they do here (the cap changes
    the output by far more than the tolerance), and memtune's path keeps it."""
    ref = _sharpen(families.model("gemma2"))
    uncapped = copy.deepcopy(ref)
    for mod in uncapped.modules():
        if hasattr(mod, "attn_logit_softcapping"):
            mod.attn_logit_softcapping = None
    rows, packed, pos = _rows()
    assert _rel(_alone(uncapped, rows), _alone(ref, rows)) > 1e-2
    m = copy.deepcopy(ref)
    varlen.use_varlen_attention(m)
    before = varlen.VARLEN_CALLS["eager_rows"]
    with torch.no_grad():
        m(input_ids=packed, position_ids=pos, use_cache=False)
    assert varlen.VARLEN_CALLS["eager_rows"] - before == m.config.num_hidden_layers
    assert "eager attention per packed row" in varlen.path_note(m.config, cuda=True)


def _reference_kernel(with_scale: bool, calls: list):
    """A CPU stand-in for torch.nn.attention.varlen.varlen_attn that honours window_size and scale exactly as
    FlashAttention defines them (left window = keys before the query), to check memtune's glue on every family."""
    def rows(q, k, v, cu, window, scale):
        out = []
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
            qi, ki, vi = (t[s:e].transpose(0, 1).float() for t in (q, k, v))
            scores = qi @ ki.transpose(1, 2) * (scale if scale is not None else qi.shape[-1] ** -0.5)
            n = e - s
            i, j = torch.arange(n)[:, None], torch.arange(n)[None]
            keep = (j <= i) & ((window[0] < 0) | (i - j <= window[0]))
            w = scores.masked_fill(~keep, float("-inf")).softmax(-1)
            out.append((w @ vi).transpose(0, 1).to(q.dtype))
        calls.append(window)
        return torch.cat(out)

    if with_scale:  # torch 2.13
        def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1),
                        enable_gqa=False):
            if enable_gqa:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            return rows(q, k, v, cu_q, window_size, scale)
    else:  # torch 2.11 (the H200 image): no scale, no enable_gqa
        def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, window_size=(-1, -1)):
            assert k.shape[1] == q.shape[1]
            return rows(q, k, v, cu_q, window_size, None)
    return varlen_attn


@pytest.mark.parametrize("with_scale", [True, False], ids=["torch2.13", "torch2.11"])
@pytest.mark.parametrize("name", ["mistral", "gemma3", "phi3", "qwen3"])
def test_the_flashattention_glue_passes_window_and_scale(name, with_scale, monkeypatch):
    calls = []
    monkeypatch.setattr(varlen, "_varlen_kernel", lambda: _reference_kernel(with_scale, calls))
    monkeypatch.setattr(varlen, "_varlen_device", lambda t: True)
    ref = families.model(name)
    m = copy.deepcopy(ref).to(torch.bfloat16)
    varlen.use_varlen_attention(m)
    rows, packed, pos = _rows()
    with torch.no_grad():
        got = m(input_ids=packed, position_ids=pos, use_cache=False).logits[0]
    assert len(calls) == m.config.num_hidden_layers  # every layer through the kernel
    window = getattr(m.config, "sliding_window", None)
    if window:
        assert (window - 1, 0) in calls
    assert _rel(got, _alone(ref, rows)) < 2e-2  # bf16


# --- every preset trains, LoRA where it was asked ------------------------------------------------------------------
@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return lambda name: families.build(name, root / name)


def _train(tmp_path, folder, preset: str, **changes):
    from core.config.settings import Hardware, demo_config
    from core.config.presets import apply_preset
    from core.train.recipe import run_training

    cfg = demo_config(model=str(folder), output_dir=str(tmp_path / "runs"), max_steps=1, logging_steps=1,
                      lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], **changes)
    cfg = apply_preset(cfg, preset, Hardware.detect()).replace(per_device_train_batch_size=4,
                                                               gradient_accumulation_steps=1)
    events = []
    result = run_training(cfg, sink=events.append)
    return result, events


# fastest (packing + memtune's varlen attention) on every family; the other two presets on the families whose paths
# differ from Llama's (Gemma-2: eager attention, soft-caps, tied 4-bit head; Phi-3: fused projections). Two CPU
# seconds a run: all 33 pairs would cost a minute of the suite (README's matrix lists what the GPU measured).
PAIRS = [(n, "fastest") for n in families.NAMES] + [(n, p) for n in ("gemma2", "phi3") for p in ("chapter", "lowest_memory")]


@pytest.mark.parametrize("name,preset", PAIRS)
def test_every_preset_trains_every_family_with_lora_where_asked(name, preset, family_dirs, tmp_path):
    import json

    from core.model import lora_targets

    folder = family_dirs(name)
    result, events = _train(tmp_path, folder, preset)
    assert result.status == "completed", result.message
    expected = lora_targets.for_path(["q_proj", "k_proj", "v_proj", "o_proj"], 32, str(folder))
    assert result.summary["lora_modules"] == sorted(expected.modules)
    assert result.summary["trainable_params"] == expected.trainable
    saved = json.loads((Path(result.adapter_dir) / "adapter_config.json").read_text())
    assert sorted(saved["target_modules"]) == sorted(expected.modules)
    logs = [e.get("message", "") for e in events if e.get("kind") == "log"]
    assert any(line.startswith("LoRA on ") for line in logs)


@pytest.mark.parametrize("name", families.NAMES)
def test_lora_targets_resolve_on_the_meta_device_and_the_estimator_counts_the_same(name, tmp_path):
    """Resolved from config.json alone (no weights): Phi-3's q,k,v,o land on qkv_proj + o_proj; an unknown name is
    refused with the model's linear layers; the estimator's LoRA size (core/model/shapes.py) is the same count."""
    from core.model import lora_targets
    from core.config.settings import ConfigError, TrainConfig
    from core.model.load import lora_targets as cfg_targets
    from core.model.shapes import get_shape

    families.hf_config(name).save_pretrained(tmp_path)  # config.json only: the tree is built on the meta device
    shape = get_shape(str(tmp_path))
    for asked in (["q_proj", "k_proj", "v_proj", "o_proj"], ["attention", "mlp"], ["all_linear"]):
        found = lora_targets.for_path(asked, 16, str(tmp_path))
        assert found.trainable == shape.lora_params(16, asked), (name, asked)
    chapter = lora_targets.for_path(["q_proj", "k_proj", "v_proj", "o_proj"], 16, str(tmp_path))
    fused = name.startswith("phi")
    assert chapter.modules == (["o_proj", "qkv_proj"] if fused else ["q_proj", "k_proj", "v_proj", "o_proj"])
    with pytest.raises(ConfigError) as err:
        cfg_targets(TrainConfig(model=str(tmp_path), lora_target_modules=["q_proj", "wq"]), str(tmp_path))
    text = str(err.value)
    assert "wq" in text and "o_proj" in text and ("qkv_proj" in text) == fused


def test_a_model_outside_the_matrix_trains_on_the_generic_path_with_one_line_saying_so(tmp_path):
    """GPT-2 (fused c_attn, Conv1D layers) is not in the matrix: it trains, its LoRA lands on c_attn/c_proj, and the
    log says once that it is not verified. A model that cannot work (T5: not a causal LM) is refused by name."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.config.settings import demo_config
    from core.demo import ensure_demo_model
    from core.model.load import ModelError
    from core.train.recipe import run_training

    folder = tmp_path / "gpt2"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "gpt2", n_layer=2, n_embd=32, n_head=2, vocab_size=families.VOCAB, n_positions=128, bos_token_id=0,
        eos_token_id=1)).save_pretrained(folder)
    for f in ensure_demo_model().iterdir():
        if "token" in f.name:
            (folder / f.name).write_bytes(f.read_bytes())
    events = []
    cfg = demo_config(model=str(folder), output_dir=str(tmp_path / "runs"), max_steps=1,
                      lora_target_modules=["attention"], per_device_train_batch_size=4)
    result = run_training(cfg, sink=events.append)
    assert result.status == "completed", result.message
    assert result.summary["lora_modules"] == ["attn.c_proj", "c_attn"]  # by role: never the MLP's c_proj
    logs = [e.get("message", "") for e in events if e.get("kind") == "log"]
    assert sum("not in memtune's support matrix" in line for line in logs) == 1
    t5 = tmp_path / "t5"
    AutoConfig.for_model("t5").save_pretrained(t5)
    from core.model.load import lora_targets

    with pytest.raises(ModelError, match="not a causal"):
        lora_targets(demo_config(model=str(t5)), str(t5))


def test_readme_support_matrix_lists_every_verified_family():
    """README's table and the code's matrix (core/model/families.py) and test models (tests/families.py) agree."""
    from core.model.families import VERIFIED

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Support matrix", 1)[1].split("\n\n- ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| family")]
    types = {part.split("`")[1] for line in rows for part in [line.split("|")[1]] if "`" in part}
    assert types == set(VERIFIED)
    assert len(rows) >= len({n.split("-")[0] for n in families.NAMES})
    assert {families.FAMILIES[n]["model_type"] for n in families.NAMES} == set(VERIFIED)


def test_the_data_preview_says_which_modules_get_lora(family_dirs):
    """Phi-3's chapter targets, as the preview shows them before training: the fused qkv_proj and o_proj, the
    layer count and the trainable parameters, in the page's language."""
    from core.config.settings import demo_config
    from ui.data import preview

    folder = family_dirs("phi3")
    cfg = demo_config(model=str(folder), lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    html = preview(cfg.to_dict(), "fr")
    assert "LoRA sur o_proj, qkv_proj : 4 couches" in html and "qkv_proj s&#x27;entraîne en entier" in html


def test_the_lora_target_log_line_follows_the_page_language(tmp_path):
    """The run log's LoRA line (Targets.describe) for Phi-3's chapter targets, in French on the page: modules,
    layers, parameters with French digit grouping, and the fused layer's note."""
    from core.jobs.view import format_event
    from core.messages import keyed, words_of
    from core.model import lora_targets
    from core.runs.events import make_event
    from ui.render import log_line

    families.hf_config("phi3").save_pretrained(tmp_path)
    found = lora_targets.for_path(["q_proj", "k_proj", "v_proj", "o_proj"], 32, str(tmp_path))
    line = format_event(make_event("log", level="info", **words_of(found.describe())))
    assert log_line(line, "en") == line and found.trainable >= 1000
    assert line[8:].startswith(f"  LoRA on o_proj, qkv_proj: {found.layers} layers, {found.trainable:,} trainable ")
    fr = log_line(line, "fr")[8:]
    grouped = f"{found.trainable:,}".replace(",", "\u202f")
    assert fr.startswith(f"  LoRA sur o_proj, qkv_proj : {found.layers} couches, {grouped} paramètres "
                         "entraînables; ")
    assert "qkv_proj s'entraîne en entier : une couche fusionnée contient q, k et v" in fr
    assert "trainable" not in fr and "trains whole" not in fr
    # the eval lines (keys log.eval, log.eval_baseline) too, with the language's decimal comma
    evaluated = format_event(make_event("log", level="info", **keyed("log.eval", step=2, total=4, loss=3.27)))
    assert evaluated[8:] == "  eval step 2/4  validation loss 3.2700"
    assert log_line(evaluated, "pt")[8:] == "  validação passo 2/4  perda de validação 3,2700"
    baseline = format_event(make_event("log", level="info", **keyed("log.eval_baseline", loss=8.54)))
    assert log_line(baseline, "fr")[8:] == "  validation de référence (avant l'entraînement)  perte de validation 8,5400"
    # an older run's line, without a key: shown as the engine wrote it
    assert log_line("12:00:01  eval step 2/4  eval_loss 3.2700", "pt") == "12:00:01  eval step 2/4  eval_loss 3.2700"
