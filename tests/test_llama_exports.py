"""GGUF exports that llama.cpp runs as trained, or refuses by name (tests/llama_cpp.py: the real llama.cpp):

- sliding windows: a model whose window llama.cpp does not run (Mistral v0.1, Phi-3-mini-4k: llama.cpp's llama and
  phi3 attend to everything) is refused; Gemma-2 and Gemma-3, whose windows llama.cpp runs, give the same logits
  as transformers on prompts several times longer than their 8-token window;
- general.name: a run folder named "my-phi3-test" (llama.cpp picks Phi-3's token handling by that name) loads;
- `--plan --out` into a non-empty folder memtune did not make says the export will refuse it, as it does.
Tiny untrained models and an untrained adapter: conversion and loading are what is tested, not training.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.export.gguf import GGUFError
from core.export.gguf_export import export_gguf, plan_gguf
from tests import families, llama_cpp

# Several times the 8-token window of tests/families.py's tiny models
LONG = ["### Instruction:\nTranslate the word 'cat' into French, then the words 'dog', 'sun' and 'moon'.\n\n"
        "### Input:\nUser: earlier turn one\nAssistant: earlier answer\n\n### Response:\n",
        "Hello world, this is a test of the window: one two three four five six seven eight nine ten."]


@pytest.mark.parametrize("name", ["mistral", "phi3"])
def test_windows_llama_cpp_ignores_are_refused_by_name(name, tmp_path):
    """Mistral v0.1 (llama.cpp's llama) and Phi-3-mini-4k (llama.cpp's phi3: "Phi SWA is currently disabled") with a
    window shorter than their context: refused before anything is written, naming the window; a window as long as
    the context never engages (Mistral v0.3 has none) and converts."""
    folder = families.build(name, tmp_path / name)
    assert families.hf_config(name).sliding_window == 8
    with pytest.raises(GGUFError, match="sliding window of 8 tokens"):
        plan_gguf(model_dir=folder, formats="f32")
    with pytest.raises(GGUFError, match="sliding window of 8 tokens"):
        export_gguf(model_dir=folder, formats="f32", out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_windows_llama_cpp_runs_match_transformers_past_the_window(tmp_path, demo_model_path):
    """Gemma-2 (a window on every other layer) and Gemma-3 (sliding, full: llama.cpp reads the pattern only as a
    period, and ran its default of 6 when given the per-layer list) with an 8-token window: llama.cpp's logits
    after prompts of 30+ tokens are transformers' within 0.5% of their range, so the window is run as trained.
    A layer pattern no period gives is refused by name."""
    from core.export.gguf import _swa_period
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llama_cpp.require()
    requests, expected = [], []
    for name in ("gemma2", "gemma3"):
        folder = _windowed(name, tmp_path / name)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
        tok = AutoTokenizer.from_pretrained(folder)
        ids = [tok(t)["input_ids"] for t in LONG]
        assert min(len(i) for i in ids) > 3 * model.config.sliding_window
        with torch.no_grad():
            ref = [model(torch.tensor([i])).logits[0, -1].log_softmax(-1) for i in ids]
        path = export_gguf(model_dir=folder, formats="f32").files["f32"]
        requests.append(dict(model=str(path), tokenize=LONG, logits=LONG))
        expected.append((name, ids, ref))
    assert [_swa_period(p) for p in ([True, False], [True] * 5 + [False], [True] * 7)] == [2, 6, 0]
    with pytest.raises(GGUFError, match="pattern llama.cpp cannot run"):
        _swa_period([False, True, True])
    for (name, ids, ref), answer in zip(expected, llama_cpp.run(requests)["answers"]):
        assert answer["tokenize"] == ids, name
        for r, ours in zip(ref, answer["logits"]):
            ours = torch.tensor([float("nan") if v is None else v for v in ours[: r.numel()]])
            seen = ~ours.isnan() & (r > -60)
            span = (r.max() - r.min()).item()
            assert (ours[seen] - r[seen]).abs().max().item() <= 0.005 * span, name


def _windowed(name: str, folder: Path) -> Path:
    """tests/families.py's tiny `name` (8-token window) with query_pre_attn_scalar = head_dim, the scaling llama.cpp
    runs (the families' other value is refused, tests/test_gguf.py), in float32."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    from core.demo import ensure_demo_model

    values = {**families.COMMON, **families.FAMILIES[name]}
    values["query_pre_attn_scalar"] = values["head_dim"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(values.pop("model_type"), **values))
    with torch.no_grad():
        for p in model.parameters():  # spread weights so attention differs with and without the window
            torch.nn.init.normal_(p, std=0.15)
    model.save_pretrained(folder)
    for f in ensure_demo_model().iterdir():
        if "token" in f.name:
            shutil.copy(f, folder / f.name)
    return folder


def _untrained_adapter(run_dir: Path) -> Path:
    """A memtune adapter folder (LoRA weights + memtune.yaml) on the demo model, as a run named run_dir.name would
    save it; LoRA's B matrices are zero, so merging changes nothing: the name is what is tested."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from core.config.settings import demo_config
    from core.demo import ensure_demo_model
    from core.infer import ADAPTER_CONFIG

    adapter = run_dir / "adapter"
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(ensure_demo_model(), dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(adapter)
    demo_config(output_dir=str(run_dir.parent), run_name=run_dir.name).save(adapter / ADAPTER_CONFIG)
    return adapter


def test_run_folder_named_like_phi3_loads_in_llama_cpp(tmp_path):
    """An adapter from runs/my-phi3-test: general.name is the base model's name, not the run folder's (which made
    llama.cpp apply Phi-3's token handling to a Llama vocabulary: "error loading model vocabulary"); the file
    names keep the run's name, and llama.cpp loads and tokenizes the file."""
    from gguf import GGUFReader

    llama_cpp.require()
    adapter = _untrained_adapter(tmp_path / "runs" / "my-phi3-test")
    result = export_gguf(adapter_dir=adapter, formats="f32")
    path = result.files["f32"]
    assert "my-phi3-test" in path.name
    name = GGUFReader(path).fields["general.name"].contents()
    assert "phi" not in name.lower() and name == "demo-tiny-llama"
    answer = llama_cpp.run([dict(model=str(path), tokenize=["### Instruction:\nhi"])])["answers"][0]
    assert answer["tokenize"][0]


def test_plan_says_the_export_refuses_a_folder_memtune_did_not_make(tmp_path, demo_model_path, capsys):
    """--plan --out <a non-empty folder without memtune's marker>: the plan says the export will not write there
    (and exits 1), which is what the export then does, with or without --replace."""
    from core.export.cli import main

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my own file")
    plan = plan_gguf(model_dir=demo_model_path, formats="f32", out_dir=out)
    assert not plan.ok and "not made by memtune" in plan.message and "replaces" not in plan.message
    assert main(["gguf", str(demo_model_path), "--model", "--formats", "f32", "--out", str(out), "--plan"]) == 1
    assert "not made by memtune" in capsys.readouterr().out
    for replace in (False, True):
        with pytest.raises(GGUFError, match="not made by memtune"):
            export_gguf(model_dir=demo_model_path, formats="f32", out_dir=out, overwrite=replace)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    from ui.gguf import on_gguf_plan  # the Export tab says it too, not "Not enough room"

    adapter = _untrained_adapter(tmp_path / "runs" / "run-1")
    (adapter.parent / "gguf").mkdir()
    (adapter.parent / "gguf" / "notes.txt").write_text("my own file")
    note = on_gguf_plan("en", str(adapter), ["f32"])
    assert "was not made by memtune" in note and "Not enough room" not in note


def test_base_model_chats_in_the_modelfile_equal_the_gguf_template_llama_cpp_reads(tmp_path, demo_model_path):
    """A base model's multi-turn chats: the Modelfile's TEMPLATE rendered by Ollama's own code in Go
    (tests/ollama_go.py) is the chat template llama.cpp reads from the GGUF file, rendered by transformers' Jinja;
    llama.cpp reads general.name as the model, not the folder."""
    from transformers import AutoTokenizer

    from tests import ollama_go
    from tests.test_modelfile import CHATS, SPACED, _model_with_template, _ollama_merged

    llama_cpp.require()
    ollama_go.require()
    folder = _model_with_template(tmp_path / "my-phi3-test", demo_model_path, None)
    result = export_gguf(model_dir=folder, formats="f32")
    keys = ["general.name", "tokenizer.chat_template"]
    meta = llama_cpp.run([dict(model=str(result.files["f32"]), metadata=keys)])["answers"][0]["metadata"]
    # the folder's name, less the words llama.cpp pattern-matches (free text); never the class name
    assert meta["general.name"] == "my-test"
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = meta["tokenizer.chat_template"]
    chats = CHATS + SPACED
    for messages, text in zip(chats, ollama_go.texts(ollama_go.render(result.modelfile, chats)), strict=True):
        messages = _ollama_merged(messages)
        assert text == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), messages
