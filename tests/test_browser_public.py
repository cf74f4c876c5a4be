"""Public mode (`app.py --public`, what SPACE_ID turns on) in a real browser: a visitor uploads a small jsonl through the
page, previews it, trains the demo model on it to completion; a second visitor (another browser session) sees
neither the upload nor the run, and a path typed to the first visitor's upload is refused.

Its own `python app.py` (public mode, on 127.0.0.1) beside the shared one, and the shared chromium
(tests/browser_app.py); skipped, with the reason, where chromium or Playwright is missing.
"""

import json
import warnings
from pathlib import Path

import pytest

from tests.browser_app import MISSING, PROGRESS, REQUIRED, app_server, set_number, state, wait_state
from tests.helpers import ms, patient

if MISSING and not REQUIRED:
    pytest.skip(f"browser tests skipped: {MISSING}; set MEMTUNE_REQUIRE_BROWSER=1 to make this a failure",
                allow_module_level=True)


@pytest.fixture(scope="module")
def public_server(tmp_path_factory):
    # --public, as on a Space (SPACE_ID itself makes Gradio act as if it ran on the Spaces servers)
    # room for a run that is still running however long the other visitor's checks take on a loaded machine
    started = app_server(tmp_path_factory, "--public", "--host", "127.0.0.1", MEMTUNE_SPACE_STEPS="1000000",
                         MEMTUNE_SPACE_TOKENS=str(10**12))
    yield next(started)
    next(started, None)  # stop it, and check it left no process behind


def visitor(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(ms(30))
    pg.errors, pg.console = [], []
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    pg.on("console", lambda msg: pg.console.append(f"{msg.type}: {msg.text}"))
    pg.goto(server["url"])
    pg.wait_for_selector("#start-btn")
    pg.wait_for_selector("#mt-public")  # the page says it is public
    return context, pg


def upload_four_rows(page, data: Path) -> None:
    """The demo's settings, then an upload of four rows as `data`'s name: the page names it uploads/NAME."""
    page.click("#preset-demo")
    page.wait_for_function("document.querySelector('#field-dataset input').value === 'memtune/demo'",
                           timeout=ms(120))  # a busy machine's first clicks; generous, never a timing assert
    data.write_text("".join(json.dumps({"instruction": f"Say {w}", "response": w}) + "\n"
                            for w in ("alpha", "beta", "gamma", "delta")), encoding="utf-8")
    page.set_input_files("#data-upload input[type=file]", str(data))
    page.wait_for_function(f"document.querySelector('#field-dataset input').value === 'uploads/{data.name}'",
                           timeout=ms(120))


def test_a_visitor_uploads_previews_and_trains_and_another_sees_none_of_it(browser, public_server, tmp_path):
    first, a = visitor(browser, public_server)
    upload_four_rows(a, tmp_path / "mine.jsonl")
    a.wait_for_selector("#mt-preview")
    assert "4 of 4 rows train" in a.locator("#mt-preview").inner_text()
    assert a.locator("#field-dataset input").input_value() == "uploads/mine.jsonl"  # no server path on the page
    uploaded = str(next((public_server["work"] / "home" / "uploads").glob("visitor-*/mine.jsonl")))  # theirs alone

    set_number(a, "max_steps", 3)
    a.click("#start-btn")
    wait_state(a, ["completed", "failed", "stopped"], timeout=300_000)
    assert state(a) == ("completed", 3), a.locator("#run-result").inner_text()
    runs = list((public_server["work"] / "runs").glob("visitor-*/*/adapter/adapter_config.json"))
    assert len(runs) == 1, runs  # trained on the upload, saved in the visitor's runs folder
    run_name = runs[0].parent.parent.name
    a.get_by_role("tab", name="History").click()
    a.wait_for_selector("#history-table [data-testid=cell-0-1]", timeout=ms(30))
    assert run_name in a.locator("#history-table").inner_text()

    second, b = visitor(browser, public_server)  # another visitor: a new browser session
    b.get_by_role("tab", name="History").click()
    b.wait_for_timeout(ms(1.5))  # its refresh has answered (a table with no rows)
    assert run_name not in b.locator("#history-table").inner_text()
    b.get_by_role("tab", name="Train", exact=True).click()
    b.get_by_role("tab", name="1 · Model & data").click()
    box = b.locator("#field-dataset input")
    for typed in (uploaded, str(Path(uploaded).parent), str(Path(uploaded).parent.parent)):
        box.fill(typed)
        box.press("Tab")
        said = json.dumps("is a path on the server")
        # Preview asked again if its answer has not shown: two CI runs on a loaded machine (52446ba, 6df3f8e) saw a
        # click whose preview never showed in 180 s, not reproduced here (open in the stop's note). The refusal must
        # show, and the upload's rows never.
        for attempt in range(3):
            b.click("#preview-btn")
            try:
                b.wait_for_function(f"document.querySelector('#data-preview')?.textContent.includes({said})",
                                    timeout=ms(90))  # a busy machine's first previews; generous, never a timing assert
                break
            except Exception as exc:  # noqa: BLE001 - Playwright's TimeoutError: ask once more, then fail
                # what the next session needs to find the cause: shown in CI's log as a warning, or in the failure
                seen = missed_preview(b, public_server, typed, attempt)
                if attempt == 2:
                    raise AssertionError(seen) from exc
                warnings.warn(seen, stacklevel=1)
        assert "Say alpha" not in b.locator("#data-preview").inner_text()
    assert not a.errors and not b.errors, (a.errors, b.errors)
    first.close()
    second.close()


def missed_preview(pg, server, typed: str, attempt: int) -> str:
    """The page's and the server's own words when a Preview's answer did not show."""
    log = (server["work"] / "app.log").read_text(errors="replace")
    return (f"Preview #{attempt + 1} for {typed!r} showed no answer in 90 s.\n"
            f"dataset box: {pg.locator('#field-dataset input').input_value()!r}\n"
            f"#data-preview: {pg.locator('#data-preview').inner_text()[:600]!r}\n"
            f"page console (last 20): {pg.console[-20:]}\npage errors: {pg.errors}\n"
            f"app.log (last 3000 characters):\n{log[-3000:]}")


def sessions_of(pg) -> list[str]:
    """The session hashes this page's Gradio client sends (what a forging client would copy)."""
    seen: list[str] = []

    def note(request) -> None:
        try:
            body = json.loads(request.post_data or "{}")
        except ValueError:
            return
        if isinstance(body, dict) and body.get("session_hash") and body["session_hash"] not in seen:
            seen.append(body["session_hash"])

    pg.on("request", note)
    return seen


def urllib_get(server, path: str, cookie: str) -> str:
    import urllib.request

    req = urllib.request.Request(server["url"] + path, headers={"cookie": cookie})
    with urllib.request.urlopen(req, timeout=patient(60)) as r:
        return r.read().decode()


def post(server, path: str, body: dict, cookie: str | None = None) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    headers = {"content-type": "application/json", **({"cookie": cookie} if cookie else {})}
    req = urllib.request.Request(server["url"] + path.lstrip("/"), data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=patient(60)) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_two_visitors_and_a_forger_each_see_only_their_own_and_share_the_gpu_through_a_queue(browser, public_server,
                                                                                             tmp_path):
    """Issue 38: A trains on an upload and saves settings; B sees none of it (panel, log, History, download, upload,
    saved settings), B's Stop leaves A's run going, B's Start waits in the queue behind A (each sees their own
    place), then runs once A's ends; a third client that copies A's session hash is refused or sees nothing."""
    first, a = visitor(browser, public_server)
    a_sessions = sessions_of(a)
    upload_four_rows(a, tmp_path / "secret-a.jsonl")
    a.wait_for_selector("#mt-preview")
    set_number(a, "max_steps", 1000000)  # long enough to be running while B looks (A stops it below)
    a.get_by_role("tab", name="4 · Settings & code").click()
    a.fill("#config-name input", "a-settings")
    a.click("#save-config-btn")
    a.wait_for_function("document.querySelector('#config-notice')?.textContent.includes('a-settings.yaml')")
    assert "/" not in a.locator("#config-notice").inner_text().split("a-settings.yaml")[0].split()[-1]  # no folder
    a.click("#start-btn")
    wait_state(a, ["running"], timeout=180_000)
    a.wait_for_function("document.querySelector('#run-log')?.textContent.includes('run folder')", timeout=ms(180))
    a_log = a.locator("#run-log").inner_text()
    assert str(public_server["work"]) not in a_log and "/home/" not in a_log  # names in the visitor's space only
    a_run = next(p.name for p in (public_server["work"] / "runs").glob("visitor-*/*") if p.is_dir())

    second, b = visitor(browser, public_server)
    b.wait_for_timeout(ms(2.5))  # a few polls have answered
    assert state(b)[0] == "idle"  # A's run is not B's: no progress, chart, log or result
    assert "secret-a" not in b.locator("#run-log").inner_text() and a_run not in b.content()
    assert not b.locator("#loss-plot").is_visible() and not b.locator("#adapter-download").is_visible()
    assert not b.locator("#owner-queue-row").is_visible()  # the Space owner's row of every job: not a visitor's
    assert str(public_server["work"]) not in b.content()  # no server path anywhere in the page
    b.get_by_role("tab", name="4 · Settings & code").click()
    b.click("#config-list input")
    b.wait_for_timeout(ms(0.5))
    assert b.get_by_role("option", name="a-settings").count() == 0  # A's saved settings are not listed for B
    b.keyboard.press("Escape")
    b.get_by_role("tab", name="History").click()
    b.wait_for_timeout(ms(1.5))
    assert a_run not in b.locator("#history-table").inner_text()
    b.get_by_role("tab", name="Train", exact=True).click()
    b.get_by_role("tab", name="1 · Model & data").click()
    box = b.locator("#field-dataset input")
    box.fill("uploads/secret-a.jsonl")  # A's upload as A's page names it: for B it is B's own (missing) file
    box.press("Tab")
    b.click("#preview-btn")
    b.wait_for_function("document.querySelector('#data-preview')?.textContent.includes('does not exist')",
                        timeout=ms(180))
    assert "Say alpha" not in b.locator("#data-preview").inner_text()
    assert b.locator("#stop-btn").is_disabled()  # B has no run; B's Stop sent anyway acts on B's runs only:
    cookie = "; ".join(f"{c['name']}={c['value']}" for c in second.cookies())
    stop = next(d["id"] for d in json.loads(urllib_get(public_server, "config", cookie))["dependencies"]
                if d.get("api_name") == "stop")
    assert post(public_server, "gradio_api/queue/join", {"data": ["en"], "fn_index": stop, "trigger_id": None,
                                                         "session_hash": "visitor-b-stop-1"}, cookie)[0] == 200
    b.wait_for_timeout(ms(3))  # the queued Stop has been answered
    assert state(a)[0] == "running"

    # A third client copies A's session hash: the server binds each hash to the visitor who used it first.
    assert a_sessions, "A's page sent no session hash"
    poll = {"data": [{}, "en", {}, 8, ""], "session_hash": a_sessions[0]}
    assert post(public_server, "gradio_api/run/poll", poll)[0] == 403
    status, said = post(public_server, "gradio_api/run/poll", {**poll, "session_hash": "forger-own-1"})
    assert status == 200 and "secret-a" not in said and a_run not in said and '"idle"' in said.replace("\\", "")
    assert post(public_server, "gradio_api/queue/join", {"data": ["en"], "fn_index": 0,
                                                         "session_hash": a_sessions[0]})[0] == 403
    assert state(a)[0] == "running"

    # B trains the demo: queued behind A's run, B sees their own place; A sees their run, not B's place.
    b.click("#preset-demo")
    b.wait_for_function("document.querySelector('#field-dataset input').value === 'memtune/demo'")
    set_number(b, "max_steps", 3)
    b.click("#start-btn")
    wait_state(b, ["queued"], timeout=60_000)
    assert b.locator(PROGRESS).get_attribute("data-position") == "1"
    assert "number 1 in the queue" in b.locator("#mt-queue").inner_text()
    assert state(a)[0] == "running" and a.locator("#mt-queue").count() == 0
    a.click("#stop-btn")  # A ends theirs (it saves its adapter): B's starts
    wait_state(a, ["stopped"], timeout=300_000)
    wait_state(b, ["running", "completed"], timeout=300_000)
    assert not b.locator("#adapter-download").is_visible() or state(b)[0] == "completed"
    wait_state(b, ["completed"], timeout=300_000)
    assert state(b) == ("completed", 3), b.locator("#run-result").inner_text()
    a.wait_for_selector("#adapter-download", state="visible", timeout=ms(60))
    assert state(a)[0] == "stopped"  # B's run never shows on A's page
    a.reload()  # A's saved settings are still A's after a reload (listed when their tab opens)
    a.wait_for_selector("#start-btn")
    a.get_by_role("tab", name="4 · Settings & code").click()
    a.click("#config-list input")
    a.get_by_role("option", name="a-settings").wait_for(timeout=ms(30))
    a.keyboard.press("Escape")
    assert not a.errors and not b.errors, (a.errors, b.errors)
    first.close()
    second.close()


def request(server, path: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None):
    """(status, headers, text) of one plain HTTP request: no cookies but those given."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(server["url"] + path.lstrip("/"), data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=patient(60)) as r:
            return r.status, r.headers, r.read(200_000).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode(errors="replace")


def test_with_a_login_every_route_but_the_login_page_needs_it_and_the_page_shows_no_api(browser, tmp_path_factory):
    """Issue 38: the login page embedded every endpoint's description, and heartbeat, startup-events and cancel
    answered without a login. Now only the login page (its assets, the login itself) is open."""
    # No run starts here: no warm-start server importing the training libraries beside the test (core/jobs/warm.py)
    started = app_server(tmp_path_factory, MEMTUNE_AUTH="me:long-secret-pw", MEMTUNE_WARM_START="0")
    server = next(started)
    try:
        status, _, page = request(server, "/")
        assert status == 200 and "window.gradio_api_info = null;" in page and "named_endpoints" not in page
        assert "auth_required" in page  # the login page's config: no components, no endpoints
        json_post = {"content-type": "application/json"}
        closed = [("gradio_api/heartbeat/abcdefgh12", "GET", None, {}),
                  ("gradio_api/startup-events", "GET", None, {}),
                  ("gradio_api/info", "GET", None, {}), ("config", "GET", None, {}),
                  ("gradio_api/queue/data?session_hash=abcdefgh12", "GET", None, {}),
                  ("gradio_api/cancel", "POST", b'{"session_hash": "a", "fn_index": 0, "event_id": "b"}', json_post),
                  ("gradio_api/queue/join", "POST", b'{"data": [], "fn_index": 0, "session_hash": "a"}', json_post),
                  ("gradio_api/run/poll", "POST", b'{"data": [{}, "en", {}, 8, ""]}', json_post),
                  ("gradio_api/upload", "POST", b"", {}), ("gradio_api/openapi.json", "GET", None, {})]
        for path, method, body, headers in closed:
            assert request(server, path, method, body, headers)[0] == 401, path
        status, headers, _ = request(server, "login", "POST", b"username=me&password=long-secret-pw",
                                     {"content-type": "application/x-www-form-urlencoded"})
        assert status == 200
        cookie = "; ".join(c.split(";")[0] for c in headers.get_all("set-cookie") if c.startswith("access-token"))
        assert cookie
        for path in ("config", "gradio_api/info", "gradio_api/startup-events"):
            assert request(server, path, headers={"cookie": cookie})[0] == 200, path
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(ms(30))
        pg = context.new_page()  # the login page still works without the API description
        pg.goto(server["url"])
        pg.fill("input[type=text]", "me")
        pg.fill("input[type=password]", "long-secret-pw")
        pg.keyboard.press("Enter")
        pg.wait_for_selector("#start-btn", timeout=ms(60))
        context.close()
    finally:
        next(started, None)
