"""The string table: complete in every language, consistent with the engine's own texts, language detection."""

import re
import string
from dataclasses import fields
from pathlib import Path

import pytest

from core.config import checklist
from core.config.settings import TrainConfig
from core.runs.history import HEADERS
from core.i18n import (EN, KNOWN, LANGUAGES, STRINGS, decimal, detect_language, environment_language, formatted,
                       integer, percent, request_language, said, t)
from tests.chapter import CHAPTER_FR, CHAPTER_PT
from tests.helpers import checklist_texts

ROOT = Path(__file__).resolve().parent.parent


def placeholders(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


# Words a translation may keep as English writes them: the chapter's and the field's terms, names, units, the
# config's own names and values. A text equal to the English one passes only if each of its words is one of these
# (or of its language's COGNATES); a sentence left in English fails.
KEPT_TERMS = {
    "QLoRA", "LoRA", "DoRA", "GGUF", "Q4_K_M", "GPU", "RAM", "GiB", "MiB", "KiB", "Top-p", "tokens/s", "tokens", "lr",
    "batch", "packing", "Prompt", "Dataset", "Split", "Log", "tensor", "checklist", "precision", "fp16",
    "Gradient", "gradient", "checkpointing", "accumulation", "Weight", "decay", "Adapter", "Seed", "Loss", "Tracking",
    "true", "false", "true/false", "alpha", "dropout", "KL",
    "my-run", "your-name/my-adapter",  # example identifiers: a run folder's and a Hub repository's names are ASCII
}
# Words each language writes as English does (not English left behind): French "Message", Portuguese "use"...
COGNATES = {
    "pt": {"Base", "Use", "use"},
    "fr": {"Base", "Parent", "Machines", "Date", "Message", "validation", "Format"},
    "es": {"Base", "ERROR", "Error"},
    "de": {"Log", "Split", "Training", "Format", "Name", "Status"},
}
EXPECTED = {"en", "pt", "fr", "es", "de"}  # the tables this repository ships itself (zh, ja, ko: when present)


def untranslated(lang: str) -> list[tuple[str, str]]:
    """(key, text) of `lang`'s texts equal to the English one with a word that is neither a kept term nor a cognate."""
    allowed = KEPT_TERMS | COGNATES.get(lang, set())
    left = []
    for key, text in STRINGS[lang].items():
        words = re.findall(r"[^\W\d_][\w/-]*", re.sub(r"\{[^}]*\}", " ", text))
        if text == EN[key] and any(word not in allowed for word in words):
            left.append((key, text))
    return left


def test_every_key_exists_in_every_language_with_the_same_placeholders():
    assert EXPECTED <= set(STRINGS) == set(LANGUAGES) <= set(KNOWN)
    for lang, table in STRINGS.items():
        assert set(table) == set(EN), (lang, sorted(set(table) ^ set(EN)))
        for key, text in table.items():
            assert isinstance(text, str) and text.strip(), (lang, key)
            assert text == text.strip(), (lang, key)
            assert placeholders(text) == placeholders(EN[key]), (lang, key)


@pytest.mark.parametrize("lang", sorted(set(LANGUAGES) - {"en"}))
def test_translations_are_translated(lang):
    """A text identical to the English one is fine for kept terms and names (Top-p, LoRA, GiB), not for words."""
    assert untranslated(lang) == []


def test_a_text_left_in_english_is_found():
    assert untranslated("en")  # every English text equals itself: the check sees words
    assert ("try.top_p", "Top-p") not in untranslated("en") and ("unit.gib", "GiB") not in untranslated("en")


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
    assert t("msg.adapter_saved", "it", path="x") == "Adapter saved to x"  # unknown language: English
    assert t("msg.adapter_saved", None) == "Adapter saved to {path}"  # a missing value stays visible
    assert t("no.such.key", "fr") == "no.such.key"


@pytest.mark.parametrize("header, lang", [
    ("pt-BR,pt;q=0.9", "pt"), ("fr-FR", "fr"), ("it", "en"), ("", "en"), (None, "en"),
    ("it-IT,fr;q=0.8,en;q=0.5", "fr"), ("en-US,en;q=0.9,pt;q=0.8", "en"), ("fr;q=0.3, pt;q=0.7", "pt"),
    ("pt_PT", "pt"), ("*", "en"), ("fr;q=0", "en"), ("garbage;;;", "en"), ("FR-ca", "fr"),
    ("de-DE,de;q=0.9,en;q=0.8", "de"), ("es-419,es;q=0.9", "es"), ("es-MX", "es"), ("de-AT;q=0.5,fr;q=0.4", "de"),
])
def test_detect_language(header, lang):
    assert detect_language(header) == lang


@pytest.mark.parametrize("header", ["zh-CN,zh;q=0.9", "zh-Hans", "zh", "zh_CN", "zh-Hans-SG"])
def test_simplified_chinese_is_detected_when_its_table_is_there(header, monkeypatch):
    import core.i18n as i18n

    monkeypatch.setitem(i18n.STRINGS, "zh", {})
    assert detect_language(header) == "zh"
    assert detect_language("zh-TW,ja;q=0.5") == ("ja" if "ja" in STRINGS else "en")  # traditional: not this table
    monkeypatch.delitem(i18n.STRINGS, "zh")
    assert detect_language(header + ",de;q=0.1") == "de"  # without its table: the next language the header asks


def test_a_language_without_its_table_is_not_offered(tmp_path, monkeypatch):
    from core.i18n import language_choices

    assert [code for _, code in language_choices()] == [code for code in KNOWN if code in LANGUAGES]
    assert ("Deutsch", "de") in language_choices() and ("Español", "es") in language_choices()
    assert all(name != code for code, name in KNOWN.items())
    assert {"zh": "简体中文", "ja": "日本語", "ko": "한국어"}.items() <= KNOWN.items()


@pytest.mark.parametrize("environ, lang", [
    ({"LANG": "de_DE.UTF-8"}, "de"), ({"LANG": "es_ES.UTF-8"}, "es"), ({"LANG": "C.UTF-8"}, "en"), ({}, "en"),
    ({"LANG": "it_IT.UTF-8"}, "en"), ({"LANG": "de_DE.UTF-8", "LC_MESSAGES": "fr_FR.UTF-8"}, "fr"),
    ({"LANG": "de_DE.UTF-8", "LC_MESSAGES": "fr_FR.UTF-8", "LC_ALL": "pt_BR.UTF-8"}, "pt"),
    ({"LANG": "de_DE.UTF-8", "LC_ALL": ""}, "de"), ({"LC_ALL": "C", "LANG": "de_DE.UTF-8"}, "en"),
    ({"LANG": "de_DE@euro"}, "de"),
])
def test_the_command_line_follows_the_posix_locale_variables(environ, lang):
    assert environment_language(environ) == lang


@pytest.mark.parametrize("lang, dec, count, pct", [
    ("en", "1234.5", "1,234,567", "57%"), ("pt", "1234,5", "1.234.567", "57%"),
    ("fr", "1234,5", "1\u202f234\u202f567", "57 %"), ("es", "1234,5", "1.234.567", "57 %"),
    ("de", "1234,5", "1.234.567", "57 %"), ("zh", "1234.5", "1,234,567", "57%"), ("ja", "1234.5", "1,234,567", "57%"),
    ("ko", "1234.5", "1,234,567", "57%"),
])
def test_numbers_as_each_language_writes_them(lang, dec, count, pct, monkeypatch):
    import core.i18n as i18n

    monkeypatch.setitem(i18n.STRINGS, lang, i18n.STRINGS.get(lang, {}))  # the rule, with or without the table
    assert decimal(1234.5, 1, lang) == dec and integer(1234567, lang) == count and percent(0.57, lang) == pct
    assert formatted(1234.5, ",.1f", lang) == count[:2] + "234" + dec[-2:]  # grouped and decimal: "1.234,5" in de


def test_an_engine_message_is_said_with_the_languages_numbers():
    assert said("cli.tokens", {"losses": "x", "tokens": "1", "seconds": "2"}, "de") == t("cli.tokens", "de", losses="x",
                                                                                          tokens="1", seconds="2")
    text = said("progress.tokens_per_s", {"n": 12345}, "de")
    assert "12.345" in text and text != said("progress.tokens_per_s", {"n": 12345}, "en")


def test_request_language_reads_the_header():
    class Request:
        headers = {"accept-language": "fr-FR,fr;q=0.9"}

    assert request_language(Request()) == "fr"
    assert request_language(None) == "en"


@pytest.mark.parametrize("lang_env, words", [("de_DE.UTF-8", "m wird geladen"), ("C.UTF-8", "Loading m")])
def test_the_command_line_speaks_its_terminals_language(lang_env, words, monkeypatch, capsys):
    from core.config.settings import demo_config
    from core.messages import keyed
    from core.train.cli import console_sink, loss_line

    for name in ("LC_ALL", "LC_MESSAGES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANG", lang_env)
    sink = console_sink()
    monkeypatch.setenv("LANG", "ja_JP.UTF-8" if lang_env.startswith("de") else "fr_FR.UTF-8")  # read once, before
    sink({"kind": "log", "level": "info", **keyed("log.phase.loading", model="m")})
    assert capsys.readouterr().err == f"[memtune] {words}\n"
    reads = []
    monkeypatch.setattr("core.train.cli.environment_language", lambda env: reads.append(1) or "en")
    sink, events = console_sink(), [{"kind": "log", "level": "info", **keyed("log.phase.loading", model="m")}] * 3
    for event in events:
        sink(event)
    assert len(reads) == 1  # once per sink, not once per event
    lang = environment_language({"LANG": lang_env})
    line = loss_line({"first_loss": 2.5, "final_loss": 1.25}, demo_config(), lang)
    english = "first loss 2.5000, last loss 1.2500"
    assert line == ("erster Loss 2,5000, letzter Loss 1,2500" if lang == "de" else english)


@pytest.mark.parametrize("lang, sep", [("en", ": "), ("fr", " : "), ("de", ": "), ("zh", "："), ("ja", "："),
                                       ("ko", ": ")])
def test_a_heading_and_its_text_are_joined_as_the_language_writes_it(lang, sep, monkeypatch):
    import core.i18n as i18n
    from core.i18n import colon

    monkeypatch.setitem(i18n.STRINGS, lang, i18n.STRINGS.get(lang, {}))
    assert colon(lang) == sep


def test_a_failed_run_is_said_in_the_terminals_language(monkeypatch, capsys):
    """A configuration the run refuses (output_dir in a system folder): the failure, its kind and each problem in
    German, by the keys the run's error event carries."""
    from core.train.cli import main

    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    assert main(["--demo", "--set", "output_dir=/dev/null/x"]) == 1
    err = capsys.readouterr().err
    assert "Training fehlgeschlagen (Konfiguration): 1 Problem(e) in der Konfiguration" in err
    assert t("output.system", "de", path="/dev/null/x", folder="/dev") in err and "system folder" not in err
