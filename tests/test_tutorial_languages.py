"""Every language the tutorial can render (scripts/tutorial.py's LANGUAGES, the page's eight) has every step's text,
with the same placeholders as English, and renders its page without a browser. The committed pages (COMMITTED:
en, pt, fr) are checked against their screenshots by tests/test_tutorial.py."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from core.i18n import LANGUAGES as UI_LANGUAGES, t
from scripts.tutorial import COMMITTED, LANGUAGES, LOCALES, STEPS, TEXT, UI_KEYS, named, render_markdown, step_text

PLACEHOLDER = re.compile(r"\{([a-z_.]+)\}")


def test_the_tutorial_renders_every_language_of_the_page():
    assert set(LANGUAGES) == set(UI_LANGUAGES)
    assert set(COMMITTED) <= set(LANGUAGES)
    assert set(LOCALES) == set(LANGUAGES) == set(TEXT)


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_step_with_the_english_placeholders(lang):
    assert set(TEXT[lang]) == set(TEXT["en"]) == {"title", "intro", *STEPS}
    for part, english in TEXT["en"].items():
        text = TEXT[lang][part]
        assert Counter(PLACEHOLDER.findall(text)) == Counter(PLACEHOLDER.findall(english)), (lang, part)
        if part in STEPS:
            assert text.startswith("**") and text.count("**") >= 2, (lang, part)  # "**Heading.** body"
        if lang != "en":
            assert text != english, (lang, part)


@pytest.mark.parametrize("lang", LANGUAGES)
def test_render_markdown(lang):
    md = render_markdown(lang)
    assert md.startswith(f"# {TEXT[lang]['title']}\n")
    assert not PLACEHOLDER.search(md), "a placeholder left unfilled"
    assert len(re.findall(r"^## \d\. ", md, flags=re.M)) == len(STEPS)
    images = re.findall(r"!\[[^\]]*\]\(img/([^)]+)\)", md)
    assert images == [f"{lang}-{i + 1:02d}-{step}.png" for i, step in enumerate(STEPS)]
    assert not re.search(r"^## \d\. .*[.。]$", md, flags=re.M), "a heading keeps its full stop"
    for step in STEPS:
        assert all(s in step_text(lang, step) for s in named(lang, step))
    assert all(t(key, lang) in md for key in UI_KEYS)
    links = re.findall(r"\]\((\w+)\.md\)", md)
    assert links == [code for code in COMMITTED if code != lang]  # links only to pages that exist
