"""The web server never maps torch: `python app.py` serves the page, a visitor uploads rows and previews them (the
tokenizer loaded and the rows planned by a preview child: core/jobs/actions.py Actions.preview, core/jobs/preview.py),
changes the model and the preset, the estimate is measured by an inspect child (core/jobs/actions.py Inspections,
core/estimate/inspect.py), and the server's own memory maps hold no libtorch."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.browser_app import MISSING, app_server, chromium
from tests.helpers import patient

pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

TINY = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "tie_word_embeddings": False}


def _entries(cache: Path) -> dict:
    try:
        return json.loads((cache / "layer_saved.json").read_text())
    except (OSError, ValueError):
        return {}


def _wait(what, timeout_s: float = 240):
    deadline = time.monotonic() + patient(timeout_s)
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _measured(pg) -> None:
    """The summary shows an estimate and no measurement is running."""
    pg.wait_for_function("(() => { const s = document.querySelector('#config-summary');"
                         " return s && !s.querySelector('#mt-measuring'); })()", timeout=patient(240) * 1000, polling=200)


def test_the_server_changes_model_and_preset_without_mapping_torch(tmp_path_factory, tmp_path):
    model = tmp_path / "tiny-qwen2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    cache = tmp_path / "cache"
    started = app_server(tmp_path_factory, MEMTUNE_CACHE=str(cache))
    server = next(started)
    browser_started = chromium()
    browser = next(browser_started)
    try:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.set_default_timeout(patient(240) * 1000)
        pg.goto(server["url"])
        pg.wait_for_selector("#start-btn")
        _measured(pg)  # the demo's measurement: the first inspect child (it found the demo model built)
        pg.click("#preview-btn")  # a Preview of the demo's rows: the tokenizer loaded by a preview child
        pg.wait_for_selector("#mt-preview, #mt-data-error")
        assert pg.locator("#mt-preview").count(), pg.locator("#data-preview").inner_text()
        rows = tmp_path / "upload" / "rows.jsonl"  # an upload: checked here (no tokenizer), previewed by a child
        rows.parent.mkdir()
        rows.write_text("".join(json.dumps({"instruction": f"Say {w}", "response": w}) + "\n" for w in "abc"))
        pg.set_input_files("#data-upload input[type=file]", str(rows))
        pg.wait_for_function("document.querySelector('#field-dataset input').value.endsWith('rows.jsonl')")
        pg.wait_for_function("(document.querySelector('#mt-preview') || {}).textContent?.includes('3 of 3 rows train')")
        assert "libtorch" not in Path(f"/proc/{server['pid']}/maps").read_text()
        box = pg.locator("#field-model input")
        box.fill(str(model))
        box.press("Enter")
        box.press("Tab")
        pg.wait_for_function(f"document.querySelector('#mt-summary').textContent.includes('{model.name}')")
        # the child measured the tiny model's shape and a decoder layer of it into the cache the server reads
        _wait(lambda: any(k.startswith("shape|") and TINY["hidden_size"] == v["shape"]["hidden_size"]
                          for k, v in _entries(cache).items()))
        _measured(pg)
        before = pg.locator("#config-summary").inner_text()
        pg.get_by_role("tab", name="2 · Memory checklist").click()
        pg.locator("#preset-radio").get_by_label("Lowest memory").check()
        pg.wait_for_function("(b) => document.querySelector('#config-summary').innerText !== b", arg=before)
        _measured(pg)
        layers = [v for v in _entries(cache).values() if "saved" in v]
        assert layers, "no decoder layer was measured"
        assert not pg.locator(".mt-measure-failed").count(), pg.locator("#config-summary").inner_text()
        maps = Path(f"/proc/{server['pid']}/maps").read_text()
        assert "libtorch" not in maps, [line for line in maps.splitlines() if "libtorch" in line][:3]
    finally:
        next(browser_started, None)
        next(started, None)
