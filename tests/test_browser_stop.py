"""Issue 43, item 6, on the page: Stop clicked many times at once is one Stop (the run stops and keeps its adapter), and
End now, the way to end at once, asks first (Cancel leaves the run going). The confirmed End now itself is
tests/test_stop.py's (JobManager.end_now)."""

import json

import pytest

from tests.browser_app import MISSING, REQUIRED
from tests.helpers import ms

if MISSING and not REQUIRED:
    pytest.skip(f"browser tests skipped: {MISSING}; set MEMTUNE_REQUIRE_BROWSER=1 to make this a failure",
                allow_module_level=True)

from tests.browser_app import PROGRESS, set_number, state, wait_idle, wait_state  # noqa: E402


def test_many_stop_clicks_are_one_stop_and_end_now_asks_first(page, server):
    wait_idle(page)
    set_number(page, "max_steps", 100000)
    previous = page.locator(PROGRESS).get_attribute("data-run") or ""
    page.click("#start-btn")
    page.wait_for_function(f"(() => {{ const p = document.querySelector('{PROGRESS}'); return p && p.dataset.run"
                           f" && p.dataset.run !== {json.dumps(previous)} && +p.dataset.step >= 1; }})()",
                           timeout=ms(120), polling=200)
    page.wait_for_function("!document.querySelector('#end-now-btn').disabled", timeout=ms(30))

    page.click("#end-now-btn")  # asks first: nothing ends yet
    box = page.locator("#end-now-confirm")
    box.wait_for(state="visible")
    assert box.count() == 1
    assert "no adapter" in box.inner_text()
    page.click("#end-now-cancel")
    box.wait_for(state="hidden")
    assert state(page)[0] == "running"

    page.evaluate("() => { const b = document.querySelector('#stop-btn'); for (let i = 0; i < 10; i++) b.click(); }")
    wait_state(page, ["stopped", "failed"], timeout=180_000)
    assert state(page)[0] == "stopped", page.locator("#run-result").inner_text()
    assert "Stopped after step" in page.locator("#run-result").inner_text()
    adapter = page.locator("#mt-adapter-path").inner_text()
    assert (server["work"] / adapter / "adapter_model.safetensors").is_file()
    assert page.errors == []
