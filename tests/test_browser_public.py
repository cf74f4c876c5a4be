"""Public mode (`app.py --public`, what SPACE_ID turns on) in a real browser: a visitor uploads a small jsonl through the
page, previews it, trains the demo model on it to completion; a second visitor (another browser session) sees
neither the upload nor the run, and a path typed to the first visitor's upload is refused.

Its own `python app.py` (public mode, on 127.0.0.1) beside the shared one, and the shared chromium
(tests/browser_app.py); skipped, with the reason, where chromium or Playwright is missing.
"""

import json
from pathlib import Path

import pytest

from tests.browser_app import MISSING, REQUIRED, app_server, set_number, state, wait_state

if MISSING and not REQUIRED:
    pytest.skip(f"browser tests skipped: {MISSING}; set MEMTUNE_REQUIRE_BROWSER=1 to make this a failure",
                allow_module_level=True)


@pytest.fixture(scope="module")
def public_server(tmp_path_factory):
    # --public, as on a Space (SPACE_ID itself makes Gradio act as if it ran on the Spaces servers)
    started = app_server(tmp_path_factory, "--public", "--host", "127.0.0.1")
    yield next(started)
    next(started, None)  # stop it, and check it left no process behind


def visitor(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    pg.errors = []
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    pg.goto(server["url"])
    pg.wait_for_selector("#start-btn")
    pg.wait_for_selector("#mt-public")  # the page says it is public
    return context, pg


def test_a_visitor_uploads_previews_and_trains_and_another_sees_none_of_it(browser, public_server, tmp_path):
    first, a = visitor(browser, public_server)
    a.click("#preset-demo")
    a.wait_for_function("document.querySelector('#field-dataset input').value === 'memtune/demo'")
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Say {w}", "response": w}) + "\n"
                            for w in ("alpha", "beta", "gamma", "delta")), encoding="utf-8")
    a.set_input_files("#data-upload input[type=file]", str(data))
    a.wait_for_function("document.querySelector('#field-dataset input').value.endsWith('mine.jsonl')")
    a.wait_for_selector("#mt-preview")
    assert "4 of 4 rows train" in a.locator("#mt-preview").inner_text()
    uploaded = a.locator("#field-dataset input").input_value()
    assert "/uploads/visitor-" in uploaded and Path(uploaded).is_file()  # the visitor's own folder

    set_number(a, "max_steps", 3)
    a.click("#start-btn")
    wait_state(a, ["completed", "failed", "stopped"], timeout=300_000)
    assert state(a) == ("completed", 3), a.locator("#run-result").inner_text()
    runs = list((public_server["work"] / "runs").glob("visitor-*/*/adapter/adapter_config.json"))
    assert len(runs) == 1, runs  # trained on the upload, saved in the visitor's runs folder
    run_name = runs[0].parent.parent.name
    a.get_by_role("tab", name="History").click()
    a.wait_for_selector("#history-table [data-testid=cell-0-1]", timeout=30_000)
    assert run_name in a.locator("#history-table").inner_text()

    second, b = visitor(browser, public_server)  # another visitor: a new browser session
    b.get_by_role("tab", name="History").click()
    b.wait_for_timeout(1500)  # its refresh has answered (a table with no rows)
    assert run_name not in b.locator("#history-table").inner_text()
    b.get_by_role("tab", name="Train", exact=True).click()
    b.get_by_role("tab", name="1 · Model & data").click()
    box = b.locator("#field-dataset input")
    for typed in (uploaded, str(Path(uploaded).parent), str(Path(uploaded).parent.parent)):
        box.fill(typed)
        box.press("Tab")
        b.click("#preview-btn")
        said = json.dumps(f"{typed} is a path on the server")
        b.wait_for_function(f"document.querySelector('#data-preview')?.textContent.includes({said})",
                            timeout=180_000)  # a busy machine's first previews; generous, never a timing assert
        assert "Say alpha" not in b.locator("#data-preview").inner_text()
    assert not a.errors and not b.errors, (a.errors, b.errors)
    first.close()
    second.close()
