"""The screenshot tutorial (docs/tutorial/{en,pt,fr}.md) is complete and up to date with the UI.

Rule: the tutorial's screenshots were taken from the code that renders the page now. `python scripts/screenshots.py`
records, per language, a SHA-256 of the sources that render what the screenshots show and of the tutorial's own
text and driver (ui/*.py, core/i18n.py, scripts/tutorial.py, scripts/screenshots.py) in docs/tutorial/manifest.json.
This test recomputes that hash: after changing any of those files, regenerate the tutorial with
`python scripts/screenshots.py --only tutorial` (about two minutes per language on a CPU) and commit the result.
Comparing hashes rather than file times keeps the rule true after a git checkout, which resets modification times.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scripts.tutorial import LANGUAGES, STEPS, TUTORIAL_DIR, render_markdown, sources_hash

REGENERATE = "run `python scripts/screenshots.py --only tutorial` and commit docs/tutorial/"


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


@pytest.mark.parametrize("lang", LANGUAGES)
def test_tutorial_is_up_to_date_with_the_ui(lang):
    manifest = json.loads((TUTORIAL_DIR / "manifest.json").read_text())
    assert lang in manifest, f"no {lang} tutorial recorded: {REGENERATE}"
    assert manifest[lang]["sources_sha256"] == sources_hash(), (
        f"ui/, core/i18n.py or the tutorial scripts changed since the {lang} screenshots were taken: {REGENERATE}")
    assert (TUTORIAL_DIR / f"{lang}.md").read_text(encoding="utf-8") == render_markdown(lang)


def test_readme_links_the_tutorials():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    for lang in LANGUAGES:
        assert f"docs/tutorial/{lang}.md" in readme
