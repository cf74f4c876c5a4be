"""The string table: complete in every language, consistent with the engine's own texts, language detection."""

import re
import string
from dataclasses import fields
from pathlib import Path

import pytest

from core.config import checklist
from core.config.settings import TrainConfig
from core.runs.history import HEADERS
from core.i18n import EN, LANGUAGES, STRINGS, detect_language, request_language, t
from tests.chapter import CHAPTER_FR, CHAPTER_PT
from tests.helpers import checklist_texts

ROOT = Path(__file__).resolve().parent.parent


def placeholders(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def test_every_key_exists_in_every_language_with_the_same_placeholders():
    assert set(STRINGS) == set(LANGUAGES) == {"en", "pt", "fr"}
    for lang, table in STRINGS.items():
        assert set(table) == set(EN), (lang, sorted(set(table) ^ set(EN)))
        for key, text in table.items():
            assert isinstance(text, str) and text.strip(), (lang, key)
            assert text == text.strip(), (lang, key)
            assert placeholders(text) == placeholders(EN[key]), (lang, key)


def test_translations_are_translated():
    """A string identical to the English one is fine for names (Top-p, LoRA), not for sentences."""
    for lang in ("pt", "fr"):
        same = [k for k, v in STRINGS[lang].items()
                if v == EN[k] and len(re.sub(r"\{[^}]*\}", "", v).split()) > 3]
        assert not same, (lang, same)


def test_english_checklist_is_the_engines_and_translations_follow_the_chapter():
    for item in checklist.ITEMS:
        assert t(f"checklist.{item.key}.label", "en") == item.label
        assert t(f"checklist.{item.key}.tradeoff", "en") == item.tradeoff
    assert [label for _, label, _ in checklist_texts("pt")] == CHAPTER_PT
    assert [label for _, label, _ in checklist_texts("fr")] == CHAPTER_FR
    assert t("checklist.title", "pt") == "Checklist de Memória"
    assert t("checklist.title", "fr") == "Liste de vérification de la mémoire"
    assert [key for key, _, _ in checklist_texts("fr")] == [item.key for item in checklist.ITEMS]


def test_every_setting_has_a_label_and_help_and_english_help_is_the_configs():
    for f in fields(TrainConfig):
        assert f"field.{f.name}" in EN, f.name
        assert t(f"help.{f.name}", "en") == f.metadata.get("help", ""), f.name


def test_every_key_the_page_asks_for_exists():
    """Each literal t("key", ...) in ui/*.py names a key of the table (read as text: no gradio import here)."""
    used = set()
    for source in (ROOT / "ui").glob("*.py"):
        used |= set(re.findall(r'\bt\(\s*"([A-Za-z0-9_.]+)"', source.read_text(encoding="utf-8")))
    assert len(used) > 100  # the page is translated through this table, not literals
    assert sorted(k for k in used if k not in EN) == []


def test_required_interface_texts_exist():
    for key in ("field.model", "field.dataset", "field.dataset_split", "data.upload", "data.preview",
                "checklist.title", "run.start", "run.stop", "run.progress", "run.log", "run.loss_curve",
                "gauge.no_gpu", "config.save", "config.load", "code.show", "tab.try", "tab.export",
                "tab.history", "history.delete_confirm", "msg.one_job", "msg.validation_failed", "msg.oom",
                "msg.adapter_saved", "export.merge_warning", "export.no_token", "try.base", "try.tuned",
                *(f"history.col.{c}" for c in HEADERS)):
        assert key in EN, key
    assert t("gauge.no_gpu", "en") == "No NVIDIA GPU found"


def test_t_fills_placeholders_and_falls_back():
    assert t("msg.adapter_saved", "en", path="runs/a/adapter") == "Adapter saved to runs/a/adapter"
    assert t("msg.adapter_saved", "pt", path="x") == "Adaptador salvo em x"
    assert t("msg.adapter_saved", "fr", path="x") == "Adaptateur enregistré dans x"
    assert t("msg.adapter_saved", "pt-BR", path="x") == "Adaptador salvo em x"
    assert t("msg.adapter_saved", "de", path="x") == "Adapter saved to x"  # unknown language: English
    assert t("msg.adapter_saved", None) == "Adapter saved to {path}"  # a missing value stays visible
    assert t("no.such.key", "fr") == "no.such.key"


@pytest.mark.parametrize("header, lang", [
    ("pt-BR,pt;q=0.9", "pt"), ("fr-FR", "fr"), ("de", "en"), ("", "en"), (None, "en"),
    ("de-DE,fr;q=0.8,en;q=0.5", "fr"), ("en-US,en;q=0.9,pt;q=0.8", "en"), ("fr;q=0.3, pt;q=0.7", "pt"),
    ("pt_PT", "pt"), ("*", "en"), ("fr;q=0", "en"), ("garbage;;;", "en"), ("FR-ca", "fr"),
])
def test_detect_language(header, lang):
    assert detect_language(header) == lang


def test_request_language_reads_the_header():
    class Request:
        headers = {"accept-language": "fr-FR,fr;q=0.9"}

    assert request_language(Request()) == "fr"
    assert request_language(None) == "en"
