"""The screenshot tutorial (docs/tutorial/{en,pt,fr}.md) is complete and says what its pictures show.

These check the committed languages (scripts/tutorial.py's COMMITTED); tests/test_tutorial_languages.py checks that
every language the tutorial can render has every step's text.

`python scripts/screenshots.py --only tutorial` takes one screenshot per step in each language and keeps, beside
each, the text the page showed at that moment (docs/tutorial/text/). These tests read that text, not a hash of the
sources: each step's picture shows every button, tab and item the step's text names, in the words the UI uses now
(core/i18n.py); the Portuguese and French pages show no English UI string and one decimal convention. After a
wording change in the UI, regenerate (scripts/tutorial.py says how) and commit docs/tutorial/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from core.i18n import EN, t
from scripts.tutorial import COMMITTED as LANGUAGES, STEPS, TUTORIAL_DIR, named, render_markdown, shown_path

REGENERATE = "run `python scripts/screenshots.py --only tutorial` and commit docs/tutorial/"
# Where a number and its unit are written with the other language's decimal separator ("1.23 s" in pt, "6,0 GiB" in
# en). Versions and model names ("Llama-3.1-8B", "v0.21") have no unit after them.
# Seconds need the space memtune writes ("1,23 s"): Gradio's own hidden status timers read "0.4s".
WRONG_DECIMAL = {"en": re.compile(r"\b\d+,\d+(?:\s?(?:GiB|MiB|KiB|%)|\ss)\b"),
                 "pt": re.compile(r"\b\d+\.\d+(?:\s?(?:GiB|MiB|KiB|%)|\ss)(?![\w.])"),
                 "fr": re.compile(r"\b\d+\.\d+(?:\s?(?:Gio|Mio|Kio|GiB|MiB|%)|\ss)(?![\w.])")}
GRADIO_ENGLISH = ("Drop File Here", "Click to Upload")  # Gradio's own upload text, when it stays English


def shown(lang: str, step: str) -> str:
    path = shown_path(lang, STEPS.index(step), step)
    assert path.is_file(), f"{path} is missing: {REGENERATE}"
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_referenced_image_exists(lang):
    md = TUTORIAL_DIR / f"{lang}.md"
    assert md.is_file(), f"{md} is missing: {REGENERATE}"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md.read_text(encoding="utf-8"))
    assert len(images) == len(STEPS)  # one screenshot per step
    for ref in images:
        path = (md.parent / ref).resolve()
        assert path.is_file() and path.stat().st_size > 10_000, f"{ref} (in {md.name}) is missing or empty"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    manifest = json.loads((TUTORIAL_DIR / "manifest.json").read_text())
    assert manifest[lang]["images"] == images, REGENERATE


@pytest.mark.parametrize("lang", LANGUAGES)
def test_the_text_is_the_one_the_script_writes(lang):
    assert (TUTORIAL_DIR / f"{lang}.md").read_text(encoding="utf-8") == render_markdown(lang), REGENERATE


@pytest.mark.parametrize("lang", LANGUAGES)
@pytest.mark.parametrize("step", STEPS)
def test_each_picture_shows_what_its_step_names_in_todays_words(lang, step):
    page = shown(lang, step).casefold()  # inner_text applies CSS text-transform (tab names are as written)
    missing = [s for s in named(lang, step) if s.casefold() not in page]
    assert not missing, f"{lang} step {step!r} names {missing}, which its screenshot does not show: {REGENERATE}"


@pytest.mark.parametrize("lang", [lang for lang in LANGUAGES if lang != "en"])
def test_the_translated_pages_hold_no_english_ui_string(lang):
    english = {key: text for key, text in EN.items() if "{" not in text and len(text) >= 14 and t(key, lang) != text}
    for step in STEPS:
        page = shown(lang, step)
        left = sorted({key for key, text in english.items()  # whole words: "+ double quant" is not in "quantification"
                       if re.search(rf"(?<!\w){re.escape(text)}(?!\w)", page)})
        assert not left, f"{lang} step {step!r} still shows English: {[(k, english[k]) for k in left]}"
        assert not [g for g in GRADIO_ENGLISH if g in page], f"{lang} step {step!r}: Gradio's upload text in English"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_one_decimal_convention_per_language(lang):
    for step in STEPS:
        wrong = WRONG_DECIMAL[lang].findall(shown(lang, step))
        assert not wrong, f"{lang} step {step!r} writes {wrong} with the other decimal separator"


def test_readme_links_the_tutorials():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    for lang in LANGUAGES:
        assert f"docs/tutorial/{lang}.md" in readme
