"""The browser tests' shared set-up: ONE `python app.py` (offline, its own MEMTUNE_HOME, a free port) and ONE headless
Debian chromium per test process for the browser modules (tests/test_browser*.py), which tests/conftest.py makes
every module's fixtures. Starting the app and the browser costs seconds each; tests/conftest.py puts the browser
modules in three xdist groups (BROWSER_GROUPS), so that each group runs in file order in one worker, on that worker's
server, and stops both after the last browser test of a run of them. Every wait here is a bound for an idle machine
stretched by the machine's load (tests/helpers.py patient), never a timing assert.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import Patience, patient

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_server(tmp_path_factory, *args: str, **env_extra: str):
    """`python app.py [ARGS]` on a free port, offline, in its own MEMTUNE_HOME: yields its address, then stops it and
    checks that it left no process behind. env_extra: more environment (e.g. SPACE_ID for public mode)."""
    work = tmp_path_factory.mktemp("app")
    port = free_port()
    # The demo model this worker built once (conftest's MEMTUNE_HOME), copied into the app's own home: its warm-up
    # finds it instead of building it again beside the server's start, on every app server of every worker.
    from core.demo import ensure_demo_model

    built = ensure_demo_model()  # MEMTUNE_HOME/<demo model>: the same place under the app's MEMTUNE_HOME
    shutil.copytree(built, work / "home" / built.name)
    env = dict(os.environ, MEMTUNE_HOME=str(work / "home"), HF_HOME=str(work / "hf"), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", MEMTUNE_CONFIG_DIR=str(work / "configs"))
    env.pop("MEMTUNE_AUTH", None)
    env.update(env_extra)
    log = open(work / "app.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), *args], cwd=work, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    # seconds on an idle machine; a loaded one gets longer (a fixed 120 s failed at load 30-39 on 2 cores)
    waiting = Patience(120)
    retries = 2
    while True:
        if proc.poll() is not None:
            said = (work / "app.log").read_text()
            # Gradio's launch() gives up when its own first request to the page takes over 3 s, which a machine
            # shared by many test runs sometimes makes it: start again (a busy machine, not a memtune failure).
            if "When localhost is not accessible" in said and retries:
                retries -= 1
                proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), *args], cwd=work,
                                        env=env, stdout=log, stderr=subprocess.STDOUT)
                continue
            pytest.fail(f"app.py exited: {said}")
        try:
            urllib.request.urlopen(url, timeout=2)
            # ready once launch() has returned (it prints its URL before its own first startup-events request)
            if "memtune: running on" in (work / "app.log").read_text(errors="replace"):
                break
            raise ConnectionRefusedError
        except OSError:  # refused at once until the server listens: look again soon (a try costs ~1 ms)
            if waiting.over():
                proc.kill()
                pytest.fail(f"app.py did not answer within {waiting}")
            time.sleep(0.1)
    yield {"url": url, "work": work, "port": port, "pid": proc.pid}
    import psutil

    children = psutil.Process(proc.pid).children(recursive=True)  # a training child, if one still runs
    proc.terminate()  # SIGTERM: the app stops (then kills) its training child before it exits
    try:
        proc.wait(timeout=patient(60))
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    gone, alive = psutil.wait_procs(children, timeout=patient(30))
    assert not alive, f"app.py left processes behind: {alive}"


def chromium():
    """Headless Debian chromium through Playwright: yields the browser, then closes it and Playwright."""
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


class Shared:
    """The app server and the browser, started by the first test that asks and kept for the next ones; close() runs
    the rest of each generator. tests/conftest.py closes them after the last of a run of browser tests, not at the
    end of the session: Playwright's sync API keeps an event loop running in this thread, and a later test's
    asyncio.run() would meet it."""

    def __init__(self):
        self.running = {}

    def get(self, name: str, start):
        if name not in self.running:
            started = start()
            self.running[name] = (next(started), started)
        return self.running[name][0]

    def close(self) -> None:
        problems = []
        for name in ("context", "browser", "server"):
            if name in self.running:
                _, started = self.running.pop(name)
                try:
                    next(started, None)
                except Exception as exc:  # noqa: BLE001 - close the other one too, then report
                    problems.append(exc)
        if problems:
            raise problems[0]


SHARED = Shared()


@pytest.fixture
def server(tmp_path_factory):
    return SHARED.get("server", lambda: app_server(tmp_path_factory))


@pytest.fixture
def browser():
    return SHARED.get("browser", chromium)


def browser_context(browser):
    """One en-US context for every test's page: its memory cache keeps Gradio's scripts compiled and loaded between
    tests (a first load in a new context costs the renderer ~3.5 s of CPU, a later one well under a second). The app
    keeps nothing in the browser (no cookies, no storage): each page load is its own Gradio session all the same.
    Tests that need another browser session (another visitor, another locale) make their own context."""
    context = browser.new_context(locale="en-US", viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(patient(30) * 1000)  # Playwright's own 30 s, stretched by the load
    yield context
    context.close()


@pytest.fixture
def context(browser):
    return SHARED.get("context", lambda: browser_context(browser))


@pytest.fixture
def page(context, server):
    pg = context.new_page()
    # a bound for a busy 2-core machine (a checklist tick once took over 30 s while the suite's first tests loaded
    # models beside it), stretched by the load, never a timing assert; waits that must be quick name their own
    pg.set_default_timeout(patient(120) * 1000)
    pg.errors = []
    pg.foreign = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    local = f"127.0.0.1:{server['port']}"
    pg.on("request", lambda r: pg.foreign.append(r.url) if local not in r.url and not r.url.startswith(("data:", "blob:")) else None)
    pg.goto(server["url"])
    pg.wait_for_selector("#start-btn")
    pg.wait_for_selector("#vram-gauge .mt-gauge")
    yield pg
    pg.close()
    context.clear_cookies()  # none are set today; a later one must not carry over to the next test's session


# --- helpers the browser modules share --------------------------------------------------------------------------------
PROGRESS = "#run-progress .mt-progress"


def state(pg) -> tuple[str, int]:
    el = pg.locator(PROGRESS)
    return el.get_attribute("data-state"), int(el.get_attribute("data-step") or 0)


def summary_chip(pg, key: str) -> str:
    return pg.locator(f"#mt-summary [data-key={key}]").inner_text()


def set_number(pg, field: str, value: int) -> None:
    pg.get_by_role("tab", name="3 · Training").click()
    box = pg.locator(f"#field-{field} input")
    box.fill(str(value))
    box.press("Tab")
    pg.wait_for_function(f"document.querySelector('#mt-summary [data-key=schedule]').textContent.includes('{value}')",
                         timeout=patient(120) * 1000)  # a busy 2-core machine (CI once took over 30 s)


def point_at_runs(pg, folder) -> None:
    """Point the page at a runs folder of the test's own (Training's output_dir): History and Try it list its runs."""
    pg.get_by_role("tab", name="3 · Training").click()
    box = pg.locator("#field-output_dir input, #field-output_dir textarea").first
    box.fill(str(folder))
    box.press("Tab")


def wait_state(pg, states, timeout=120_000):
    """Until the progress bar shows one of `states`; `timeout` (ms) is for an idle machine, stretched by the load."""
    timeout = patient(timeout)
    cond = " || ".join(f"p.dataset.state === '{s}'" for s in states)
    pg.wait_for_function(f"(() => {{ const p = document.querySelector('{PROGRESS}'); return p && ({cond}); }})()",
                         timeout=timeout, polling=200)


def choose(pg, dropdown: str, option_text: str) -> None:
    """Pick an option of a Gradio dropdown (by the text of the option)."""
    pg.click(f"{dropdown} input")
    pg.get_by_role("option", name=option_text, exact=False).first.click()


def wait_idle(pg, timeout=240_000):
    """Until no run is going: an earlier test's run may still be saving, or its process exiting after its `done`
    (Start comes back, and Try it accepts, only once the training process has ended)."""
    timeout = patient(timeout)  # ms for an idle machine
    pg.wait_for_function(f"(() => {{ const p = document.querySelector('{PROGRESS}');"
                         " return p && !['running', 'stopping'].includes(p.dataset.state)"
                         " && !document.querySelector('#start-btn').disabled; })()",
                         timeout=timeout, polling=250)


def train_here(pg, steps: int, timeout_s: float = 600) -> tuple[str, list[int]]:
    """Start a demo run of `steps` steps from this page and wait for its end: (its state, the steps seen rising).
    The bound is for a busy machine (xdist runs another test beside this), not a timing assert."""
    wait_idle(pg)
    set_number(pg, "max_steps", steps)
    previous = pg.locator(PROGRESS).get_attribute("data-run") or ""
    pg.click("#start-btn")
    # Until the next poll the page may still show the previous run: wait for this one's folder.
    pg.wait_for_function(f"(() => {{ const p = document.querySelector('{PROGRESS}'); return p && p.dataset.run"
                         f" && p.dataset.run !== {previous!r}; }})()", timeout=patient(120) * 1000, polling=200)
    seen, waiting = [], Patience(timeout_s)
    while not waiting.over():
        st, step = state(pg)
        seen.append(step)
        if st not in ("running", "stopping"):
            break
        pg.wait_for_timeout(400)
    return state(pg)[0], seen


def trained_run(pg, server, steps: int = 60, fresh: bool = False) -> str:
    """The adapter folder (as the page shows it, relative to the app's folder) of a completed demo run of THIS app
    server. The first test to ask trains it from its page; later ones reuse it while it is still on disk. Every
    test that needs a run asks for one, so none depends on which tests ran before it, or in which worker. fresh: a
    new run for this test alone, not handed to later tests."""
    adapter = server.get("trained")
    if not fresh and adapter and (server["work"] / adapter / "adapter_model.safetensors").is_file():
        return adapter
    st, _ = train_here(pg, steps)
    assert st == "completed", pg.locator("#run-result").inner_text()
    adapter = pg.locator("#mt-adapter-path").inner_text()
    assert (server["work"] / adapter / "adapter_model.safetensors").is_file()
    if not fresh:  # a fresh run is its test's own (it may delete it): later tests keep reusing the shared one
        server["trained"] = adapter
    return adapter


def continue_with_preference(pg, run_name: str, shown: str | None = None, button: str = "#history-prefer") -> str:
    """History: select the run named `run_name` (its cell reads `shown`, default the name), press "Continue with
    preference tuning" (`button` #history-grpo: "Continue with GRPO"), and return the notice that says what the
    Train tab now holds."""
    import json

    from tests.helpers import ms

    pg.get_by_role("tab", name="History").click()
    text = json.dumps(shown or run_name)
    pg.wait_for_function("[...document.querySelectorAll('#history-table [data-testid^=cell-]')]"
                         f".some(c => c.textContent.trim() === {text})", timeout=ms(60))
    cell = pg.evaluate("[...document.querySelectorAll('#history-table [data-testid^=cell-][data-testid$=\"-1\"]')]"
                       f".find(c => c.textContent.trim() === {text})?.dataset.testid")
    assert cell, pg.locator("#history-table").inner_text()
    pg.click(f"#history-table [data-testid={cell}]")
    pg.wait_for_function(f"!document.querySelector('{button}')?.disabled", timeout=ms(60))
    pg.click(button)
    pg.wait_for_function("document.querySelector('#history-status')?.textContent.includes('Press Start')",
                         timeout=ms(60))
    return pg.locator("#history-status").inner_text()


def start_and_finish(pg):
    """Press Start and wait until the new run ends completed; returns the result card's locator."""
    from tests.helpers import ms

    previous = pg.locator(PROGRESS).get_attribute("data-run") or ""
    pg.click("#start-btn")
    pg.wait_for_function(f"(() => {{ const p = document.querySelector('{PROGRESS}'); return p && p.dataset.run"
                         f" && p.dataset.run !== {previous!r}; }})()", timeout=ms(120), polling=200)
    wait_state(pg, ("completed", "stopped", "failed", "interrupted"), timeout=600_000)
    result = pg.locator("#run-result")
    assert pg.locator(PROGRESS).get_attribute("data-state") == "completed", result.inner_text()
    return result
