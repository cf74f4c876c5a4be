"""The vision demo in a real browser: its button fills the form, the Preview shows each image row's thumbnail (made
server-side, inline), the text that trains and its image tokens, Start trains it, and Try it answers a question
about an uploaded image with the base model and the adapter."""

import json
import shutil

import pytest

# The fixtures server, browser and page: tests/browser_app.py, through tests/conftest.py (one app, one browser).
from tests.browser_app import MISSING, REQUIRED

if MISSING and not REQUIRED:
    pytest.skip(f"browser tests skipped: {MISSING}; set MEMTUNE_REQUIRE_BROWSER=1 to make this a failure",
                allow_module_level=True)

from core.config.settings import DEMO_VISION_DATA  # noqa: E402
from tests.browser_app import choose, train_here, wait_idle  # noqa: E402
from tests.helpers import ms  # noqa: E402

DEMO_STEPS = 240  # the vision demo's own length: 16 epochs of 15 steps


def with_vision_model(server) -> None:
    """The tiny vision model this worker built once, copied into the app's home (as the text demo's is): the
    preview and the run find it instead of building it again."""
    from core.demo_vision import ensure_tiny_model

    built = ensure_tiny_model()
    target = server["work"] / "home" / built.name
    if not target.exists():
        shutil.copytree(built, target)


def test_the_vision_demo_previews_thumbnails_trains_and_answers_about_an_uploaded_image(page, server):
    with_vision_model(server)
    wait_idle(page)
    page.click("#preset-demo-vision")
    page.wait_for_function("document.querySelector('#field-dataset input').value.endsWith('demo_vision/train.jsonl')")
    page.click("#preview-btn")
    page.wait_for_selector("#mt-preview .mt-image-row img.mt-thumb")
    thumbs = page.locator("#mt-preview img.mt-thumb")
    assert thumbs.count() >= 3
    assert all(thumbs.nth(i).get_attribute("src").startswith("data:image/png;base64,") for i in range(thumbs.count()))
    # shown, not blocked: the browser decoded each thumbnail
    page.wait_for_function("[...document.querySelectorAll('#mt-preview img.mt-thumb')]"
                           ".every(i => i.complete && i.naturalWidth > 0)")
    preview = page.locator("#mt-preview").inner_text()
    assert "120 of 120 rows train" in preview and "[16 image tokens]" in preview
    assert "16 of them image tokens" in preview.lower() and "Assistant:" in preview  # (the row's label in capitals)

    st, _ = train_here(page, DEMO_STEPS)
    assert st == "completed", page.locator("#run-result").inner_text()

    row = json.loads(DEMO_VISION_DATA.read_text().splitlines()[0])  # a training row: the adapter has learnt it
    image = DEMO_VISION_DATA.parent / row["messages"][0]["content"][0]["image"]
    page.get_by_role("tab", name="Try it").click()
    page.wait_for_selector("#try-adapter input")
    choose(page, "#try-adapter", "demo-tiny-vl")
    page.wait_for_selector("#try-image", state="visible")
    page.set_input_files("#try-image input[type=file]", str(image))
    page.wait_for_selector("#try-image img")
    page.locator("#try-prompt textarea").fill(row["messages"][0]["content"][1]["text"])
    page.click("#try-send")
    page.wait_for_function("document.querySelector('#try-status')?.textContent.includes('Done')", timeout=ms(180),
                           polling=250)
    base = page.locator("#try-base textarea").input_value()
    tuned = page.locator("#try-tuned textarea").input_value()
    assert tuned.strip() == row["messages"][1]["content"][0]["text"] and base.strip() != tuned.strip()
    assert page.errors == []
