"""The Modelfile's TEMPLATE for the chat templates a per-message Ollama template could not express before: Mistral's
[INST] family (Mistral-Nemo: the system text goes inside the LAST user turn) and Gemma-2 (no system role: llama.cpp
folds the system text into the first user turn). Exported, read by Ollama's own parser and rendered by Ollama's own
template code (tests/go), multi-turn and system chats included."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.export.gguf_export import export_gguf, folded
from tests import ollama_go
from tests.test_modelfile import _model_with_template

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "tests" / "llama" / "templates"
CHATS = [
    [{"role": "user", "content": "Translate the word 'cat' into French."}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "What is 'sun' in French?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "One"},
     {"role": "assistant", "content": "Two"}, {"role": "user", "content": "Three"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "One"},
     {"role": "assistant", "content": "Two"}, {"role": "user", "content": "Three"},
     {"role": "assistant", "content": "Four"}, {"role": "user", "content": "Five"}],
    [{"role": "user", "content": "First,"}, {"role": "assistant", "content": "yes?"},
     {"role": "user", "content": "second"}],
    [{"role": "system", "content": " Spaced system.\n"}, {"role": "user", "content": "\tSpaced user "}],
]


def _export(tmp_path, demo_model_path, name):
    from transformers import AutoTokenizer

    folder = _model_with_template(tmp_path / "chat", demo_model_path, (TEMPLATES / f"{name}.jinja").read_text())
    return AutoTokenizer.from_pretrained(folder), export_gguf(model_dir=folder, formats="f32")


def _without_bos(tok, text: str) -> str:
    return text[len(tok.bos_token):] if tok.bos_token and text.startswith(tok.bos_token) else text  # llama.cpp adds it


def test_mistral_nemo_system_and_multi_turn_chats_render_as_the_hf_template(tmp_path, demo_model_path):
    ollama_go.require()
    tok, result = _export(tmp_path, demo_model_path, "mistralai-Mistral-Nemo-Instruct-2407")
    got = ollama_go.render(result.modelfile, CHATS)
    assert "parse_error" not in got and "template_error" not in got, got
    for messages, text in zip(CHATS, ollama_go.texts(got), strict=True):
        expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == _without_bos(tok, expected), messages
    assert "[INST]Be brief.\n\nFive[/INST]" in ollama_go.texts(got)[3]  # the system text in the last turn only
    assert not result.notes  # the same text as the HF template: nothing to say


@pytest.mark.parametrize("name", ["google-gemma-2-2b-it"])
def test_gemma2_system_chats_render_folded_as_llama_cpp(name, tmp_path, demo_model_path):
    """Gemma-2's template raises on a system message; Ollama renders it folded into the first user turn (the
    system text stripped, a blank line, the user's text stripped: llama.cpp's llm_chat_apply_template), the HF
    template's text for the folded chat, and every other chat as the HF template; the README says so."""
    ollama_go.require()
    tok, result = _export(tmp_path, demo_model_path, name)
    got = ollama_go.render(result.modelfile, CHATS)
    assert "parse_error" not in got and "template_error" not in got, got
    for messages, text in zip(CHATS, ollama_go.texts(got), strict=True):
        if messages[0]["role"] == "system":
            with pytest.raises(Exception, match="System role not supported"):
                tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            messages = folded(messages)
        expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == _without_bos(tok, expected), messages
    assert "<start_of_turn>user\nSpaced system.\n\nSpaced user<end_of_turn>" in ollama_go.texts(got)[5]
    assert [n.key for n in result.notes] == ["gguf.template.folded"]
    assert "folded into the first user turn" in result.readme.read_text(encoding="utf-8")
    assert "# Ollama TEMPLATE: " in result.modelfile.read_text(encoding="utf-8")
