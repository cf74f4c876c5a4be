"""The data tab in a real browser: a rejected upload leaves the previous dataset selected and says so."""

import json

import pytest

# The same app (python app.py on a free port, offline, its own MEMTUNE_HOME) and chromium as the main browser tests
# (the fixtures: tests/browser_app.py); skipped, with the reason, where chromium or Playwright is missing.
from tests.browser_app import MISSING, REQUIRED

if MISSING and not REQUIRED:
    pytest.skip(f"browser tests skipped: {MISSING}; set MEMTUNE_REQUIRE_BROWSER=1 to make this a failure",
                allow_module_level=True)


def dataset_value(pg) -> str:
    return pg.locator("#field-dataset input").input_value()


def test_a_broken_upload_leaves_the_previous_dataset_selected(page, tmp_path):
    page.click("#preset-demo")  # the demo: a model whose tokenizer is on this machine
    page.wait_for_function("document.querySelector('#field-dataset input').value === 'memtune/demo'")
    good = tmp_path / "good" / "pairs.jsonl"
    good.parent.mkdir()
    good.write_text("".join(json.dumps({"instruction": f"Say {w}", "response": w}) + "\n" for w in ("a", "b", "c")),
                    encoding="utf-8")
    page.set_input_files("#data-upload input[type=file]", str(good))
    page.wait_for_function("document.querySelector('#field-dataset input').value.endsWith('pairs.jsonl')")
    page.wait_for_selector("#mt-preview")
    chosen = dataset_value(page)
    assert "3 of 3 rows train" in page.locator("#mt-preview").inner_text()

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"instruction": "a", "response": "b"}\n{"instruction": "cut off\n', encoding="utf-8")
    page.click("#data-upload button[aria-label=Clear]")  # the upload box holds the first file until cleared
    page.set_input_files("#data-upload input[type=file]", str(broken))
    page.wait_for_selector("#mt-data-error")
    notice = page.locator("#mt-data-error").inner_text()
    assert "Upload not used" in notice and "line 2 is not valid JSON" in notice and "broken.jsonl" in notice
    assert f"The dataset stays {chosen}" in notice
    assert dataset_value(page) == chosen  # still the earlier upload, which Start would use
    assert not page.errors, page.errors
