"""The data tab in a real browser: a rejected upload leaves the previous dataset selected and says so.

Same set-up as tests/test_browser.py (`python app.py` on localhost, Debian's chromium through Playwright); skipped
with the reason when either is missing, unless MEMTUNE_REQUIRE_BROWSER=1.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("MEMTUNE_CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("MEMTUNE_REQUIRE_BROWSER") == "1"

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover
    sync_playwright = None

if sync_playwright is None:
    MISSING = "Playwright is not installed (pip install playwright)"
elif not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
    MISSING = f"no chromium at {CHROMIUM} (apt-get install chromium)"
else:
    MISSING = None

if MISSING and not REQUIRED:
    pytest.skip(f"browser tests skipped: {MISSING}; set MEMTUNE_REQUIRE_BROWSER=1 to make this a failure",
                allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("app")
    port = free_port()
    env = dict(os.environ, MEMTUNE_HOME=str(work / "home"), HF_HOME=str(work / "hf"), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", MEMTUNE_CONFIG_DIR=str(work / "configs"))
    env.pop("MEMTUNE_AUTH", None)
    log = open(work / "app.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=work, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"app.py exited: {(work / 'app.log').read_text()}")
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                proc.kill()
                pytest.fail("app.py did not answer within 120 s")
            time.sleep(0.5)
    yield {"url": url, "work": work, "port": port}
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture
def page(server):
    assert MISSING is None, f"MEMTUNE_REQUIRE_BROWSER=1 but {MISSING}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.set_default_timeout(60_000)
        pg.errors = []
        pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
        pg.goto(server["url"])
        pg.wait_for_selector("#start-btn")
        yield pg
        browser.close()


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
