"""Public mode's request transport and visitor identity (ui/requests_guard.py, ui/visitors.py, core/runs/identity.py):
bodies bounded while they stream, one Content-Type and one visitor cookie per request, the visitor read once (by the
middleware, into the request's state) for plain and queued requests alike, session hashes never handed to another
visitor, cookies that expire on the server and are renewed for the same visitor, and the message for a browser that
keeps no cookie."""

from __future__ import annotations

import asyncio
import json
import pickle
import secrets
import time
import tracemalloc
from itertools import chain
from pathlib import Path

import gradio as gr
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from core.i18n import t
from core.runs import identity
from ui import requests_guard
from ui.visitors import STATE_KEY, Sessions, VisitorCookie, request_visitor

MiB = 2**20


def who(request):
    """What a handler reads: the visitor the middleware put in the request's state."""
    return PlainTextResponse(request_visitor(request) or "nobody")


def app_and_clients(n: int = 2):
    app = VisitorCookie(Starlette(routes=[Route(p, who, methods=["GET", "POST"]) for p in
                                          ("/who", "/gradio_api/queue/join", "/gradio_api/cancel",
                                           "/gradio_api/upload", "/gradio_api/component_server",
                                           "/gradio_api/heartbeat/{h}")]))
    clients = [TestClient(app) for _ in range(n)]
    ids = [c.get("/who").text for c in clients]
    return app, clients, ids


def call(method: str, path: str, headers: list[tuple[bytes, bytes]], chunks, app=None):
    """One request through the middleware with a body that streams from `chunks`, to `app` (by default one that
    reads the body it is given, as Gradio's routes do); (status, detail, what the app saw of the body, how many
    chunks the client had to send)."""
    sent, pulled, seen = [], [0], []
    source = iter(chunks)

    async def receive():
        chunk = next(source, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        pulled[0] += 1
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message):
        sent.append(message)

    async def reader(scope, receive, send):
        while (message := await receive())["type"] == "http.request":
            seen.append(len(message.get("body", b"")))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'"read"'})

    scope = {"type": "http", "http_version": "1.1", "method": method, "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "headers": headers, "scheme": "http",
             "server": ("testserver", 80), "client": ("127.0.0.1", 1)}
    asyncio.run(VisitorCookie(app or reader)(scope, receive, send))
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, json.loads(body), sum(seen), pulled[0]


def test_a_streamed_oversized_body_is_refused_as_it_arrives_and_never_held_past_the_limit():
    """Issue 58: a 768 MiB chunked POST to queue/join was read whole before the 64 MiB check (+1.5 GiB resident).
    Now 256 MiB streamed in 1 MiB chunks, no cookie, no Content-Length: 413 once past 64 MiB, the rest never read,
    and at no time more than the limit held (tracemalloc's peak: the old code held the 256 MiB twice)."""
    limit = requests_guard.MAX_BODY
    assert limit == 64 * MiB

    def chunks():  # a fresh 1 MiB each time, as a server hands them over
        for _ in range(256):
            yield bytes(MiB)

    tracemalloc.start()
    try:
        status, said, seen, pulled = call("POST", "/gradio_api/queue/join",
                                          [(b"content-type", b"application/json")], chunks())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status == 413 and said["detail"] == t("request.too_large", "en", size="64 MiB")
    assert seen == 0 and pulled == limit // MiB + 1  # the app read nothing; the client was cut at the limit
    assert peak < limit + 4 * MiB, peak / MiB

    # declared too large: 413 before a byte is read
    status, said, seen, pulled = call("POST", "/gradio_api/queue/join",
                                      [(b"content-length", str(768 * MiB).encode())], chunks())
    assert (status, pulled) == (413, 0)


def test_an_upload_passed_on_unread_is_bounded_by_the_visitor_s_disk_budget(monkeypatch, tmp_path):
    """A multipart body goes to Gradio's upload route unread, counted as it streams: cut (413) past the owner's disk
    budget per visitor, and Gradio's parser told so the way it deletes the file it was writing; within the budget
    the upload is stored."""
    monkeypatch.setenv("MEMTUNE_SPACE_DISK_GIB", str(4 / 1024))  # 4 MiB
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    limit = requests_guard.upload_limit()
    assert limit == 5 * MiB  # the budget and a multipart body's margin
    with gr.Blocks() as demo:
        gr.File()
    demo.max_file_size = None  # what launch() sets
    app = gr.routes.App.create_app(demo)
    boundary = b"memtune-test"
    head = (b"--" + boundary + b'\r\nContent-Disposition: form-data; name="files"; filename="rows.jsonl"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\n")
    headers = [(b"content-type", b"multipart/form-data; boundary=" + boundary)]

    def upload(mib: int):
        return call("POST", "/gradio_api/upload", headers,
                    chain([head], (bytes(MiB) for _ in range(mib)), [b"\r\n--" + boundary + b"--\r\n"]), app)

    status, said, _, pulled = upload(64)
    assert status == 413 and said["detail"] == t("request.too_large", "en", size="5 MiB")
    assert pulled == 6  # its head and 5 MiB: cut as the fifth MiB passed the limit
    assert not [p for p in (tmp_path / "gradio").rglob("*") if p.is_file()]  # the part written is deleted
    status, stored, _, _ = upload(3)
    assert status == 200 and [Path(p).stat().st_size for p in stored] == [3 * MiB]
    monkeypatch.setenv("MEMTUNE_SPACE_DISK_GIB", "0")  # the owner set no budget: the documented ceiling
    assert requests_guard.upload_limit() == requests_guard.UNBUDGETED_UPLOAD + requests_guard.MULTIPART_MARGIN


def test_one_content_type_and_one_visitor_cookie_per_request_or_400():
    """Issue 58: two Content-Types (the middleware read the last, multipart, and skipped the body; FastAPI the first,
    JSON) let B's request name A's session hash; two visitor cookies (the middleware trusted the first, the handlers
    the last) made a forged one "visitor-unknown". Now each is refused, as is a multipart body to a route that is not
    the upload (Gradio's component_server parses one)."""
    app, (a, b), (a_id, b_id) = app_and_clients()
    a_hash = f"page-of-a-{secrets.token_hex(4)}"
    assert a.post("/gradio_api/queue/join", json={"session_hash": a_hash}).status_code == 200
    body = json.dumps({"session_hash": a_hash})
    for kinds in ([("content-type", "multipart/form-data; boundary=x"), ("content-type", "application/json")],
                  [("content-type", "application/json"), ("content-type", "multipart/form-data; boundary=x")]):
        for path in ("/gradio_api/queue/join", "/gradio_api/cancel"):
            answer = b.post(path, content=body, headers=kinds)
            assert answer.status_code == 400, (path, kinds)
            assert answer.json()["detail"] == t("request.repeated", "en", name="content-type")
    assert b.post("/gradio_api/component_server", content=body,
                  headers={"content-type": "multipart/form-data; boundary=x"}).status_code == 415
    assert b.post("/gradio_api/queue/join", content=body, headers={"content-type": "application/json"}).status_code \
        == 403

    good = a.cookies[identity.COOKIE]
    _, forged = identity.issue()
    raw = TestClient(app)
    for cookie_headers in ([("cookie", f"{identity.COOKIE}={good}; {identity.COOKIE}=x")],
                           [("cookie", f"{identity.COOKIE}={good}"), ("cookie", f"{identity.COOKIE}={forged}")],
                           [("cookie", f"{identity.COOKIE}={good}; {identity.COOKIE.upper()}={forged}")],
                           [("cookie", f"{identity.COOKIE}={good}; {identity.COOKIE} ={forged}")],
                           [("cookie", f" {identity.COOKIE}={good};{identity.COOKIE}= {forged}")]):
        answer = raw.get("/who", headers=cookie_headers)
        assert answer.status_code == 400, cookie_headers
        assert answer.json()["detail"] == t("request.repeated", "en", name=identity.COOKIE)
    assert raw.get("/who", headers=[("cookie", f"other=1; {identity.COOKIE}={good}")]).text == a_id


def test_every_session_hash_a_request_names_must_be_its_visitor_s():
    """A session hash named twice (two query parameters, the query and the body, one JSON key twice in either
    order): each copy is claimed, so one of A's among them refuses B's request."""
    _, (a, b), _ = app_and_clients()
    a_hash, b_hash = f"a-{secrets.token_hex(4)}", f"b-{secrets.token_hex(4)}"
    assert a.get(f"/who?session_hash={a_hash}").status_code == 200
    assert b.get(f"/who?session_hash={b_hash}").status_code == 200
    twice = [lambda c: c.get(f"/who?session_hash={b_hash}&session_hash={a_hash}"),
             lambda c: c.get(f"/who?session_hash={a_hash}&session_hash={b_hash}"),
             lambda c: c.post(f"/gradio_api/queue/join?session_hash={b_hash}", json={"session_hash": a_hash}),
             lambda c: c.post(f"/gradio_api/queue/join?session_hash={a_hash}", json={"session_hash": b_hash}),
             lambda c: c.post("/gradio_api/queue/join",
                              content=f'{{"session_hash": "{b_hash}", "session_hash": "{a_hash}"}}'),
             lambda c: c.post("/gradio_api/queue/join",
                              content=f'{{"session_hash": "{a_hash}", "session_hash": "{b_hash}"}}'),
             lambda c: c.get(f"/gradio_api/heartbeat/{b_hash}?session_hash={a_hash}")]
    for request in twice:
        assert request(b).status_code == 403
    assert b.post("/gradio_api/queue/join", json={"session_hash": b_hash, "data": [{"session_hash": a_hash}]}) \
        .status_code == 200  # a value inside the form's data is not a session hash


def test_a_session_hash_is_never_given_to_another_visitor_after_100_001_claims():
    """Issue 58: the table forgot a hash after 100,000 newer claims and then gave it to whoever named it first. Now
    A's hash still refuses B after 100,001 claims by others (one visitor's flood, then many visitors'); a hash that
    is forgotten (bounded memory) is refused to everyone, never handed on."""
    table = Sessions()
    assert table.claim("a-page", "A") and table.claim("a-page", "A")
    for i in range(100_001):  # one visitor's flood: only their own oldest hashes go
        assert table.claim(f"flood-{i}", "F")
    assert len(table) == 1 + table.per_visitor
    assert not table.claim("a-page", "B") and table.claim("a-page", "A")
    assert not table.claim("flood-0", "B") and not table.claim("flood-0", "F")  # forgotten: nobody's now
    for i in range(100_001):  # many visitors, a few hashes each
        assert table.claim(f"many-{i}", f"V{i // 4}")
    assert not table.claim("a-page", "B") and table.claim("a-page", "A")

    small = Sessions(per_visitor=2, kept=3, bits=1 << 16)
    assert all(small.claim(h, v) for h, v in (("h1", "A"), ("h2", "B"), ("h3", "C"), ("h4", "C")))
    assert len(small) == 3  # A, the least recently active, lost h1: refused to everyone
    assert not small.claim("h1", "D") and not small.claim("h1", "A")
    assert small.claim("h2", "B") and not small.claim("h2", "D")


def test_cookies_expire_on_the_server_and_are_renewed_for_the_same_visitor():
    """A cookie carries the time it was signed: past KEEP_S it is a new visitor's, whatever the browser kept;
    older than RENEW_S it is signed again for the same id (an active visitor keeps their runs); its time cannot be
    edited; the older form without a time is a new visitor."""
    now = time.time()
    visitor_id, value = identity.issue(now=now)
    _, issued, signature = value.split(".")
    assert identity.verified(value, now=now + identity.KEEP_S - 1) == visitor_id
    assert identity.verified(value, now=now + identity.KEEP_S) is None
    assert identity.verified(f"{visitor_id}.{int(issued) + 86400}.{signature}", now=now + 86400) is None
    assert identity.verified(f"{visitor_id}.0{issued}.{signature}", now=now) is None  # one spelling per time
    assert identity.verified(value, now=now - identity.SKEW_S - 1) is None  # signed "in the future"
    legacy = f"{visitor_id}.{identity.hmac.new(identity.key(), visitor_id.encode(), 'sha256').hexdigest()}"
    assert identity.verified(legacy) is None
    assert identity.renew(identity.read(value, now), now=now + 60) is None
    fresh = identity.renew(identity.read(value, now), now=now + identity.RENEW_S)
    assert identity.read(fresh, now=now + identity.RENEW_S) == (visitor_id, int(now + identity.RENEW_S))

    app, _, _ = app_and_clients(0)
    two_days = identity.issue(now=now - 2 * 86400)[1]
    client = TestClient(app, cookies={identity.COOKIE: two_days})
    answer = client.get("/who")
    old_id = two_days.split(".")[0]
    assert answer.text == old_id and answer.headers["set-cookie"].startswith(f"{identity.COOKIE}={old_id}.")
    renewed = identity.read(answer.headers["set-cookie"].split(";")[0].split("=", 1)[1])
    assert renewed.visitor_id == old_id and renewed.issued >= int(now)
    for stale in (identity.issue(now=now - identity.KEEP_S - 1)[1], legacy):
        answer = TestClient(app, cookies={identity.COOKIE: stale}).get("/who")
        assert answer.text not in (stale.split(".")[0], "nobody") and "set-cookie" in answer.headers


def test_a_browser_that_keeps_no_cookie_is_told_to_open_the_space_at_its_own_address(monkeypatch):
    """Issue 58: framed cross-site over http the page gets no cookie, and the toast blamed "another visitor". A
    request with no cookie at all naming a session hash already bound is told its browser keeps no cookie, in the
    browser's language, with the Space's own address; a visitor with a cookie naming another's hash is told that
    the session is someone else's. (Gradio's page shows a refused event's `detail` in its toast.)"""
    monkeypatch.delenv("SPACE_HOST", raising=False)
    app, (a,), _ = app_and_clients(1)
    page = f"framed-{secrets.token_hex(4)}"
    no_cookie = TestClient(app, cookies=None)
    first = no_cookie.post("/gradio_api/queue/join", json={"session_hash": page})
    assert first.status_code == 200  # a new visitor, as each of this browser's requests will be
    no_cookie.cookies.clear()  # the browser kept nothing
    again = no_cookie.post("/gradio_api/queue/join", json={"session_hash": page})
    assert again.status_code == 403
    assert again.json()["detail"] == t("visitor.no_cookie", "en", url="http://testserver/")
    no_cookie.cookies.clear()
    in_pt = no_cookie.post("/gradio_api/queue/join", json={"session_hash": page},
                           headers={"accept-language": "pt-BR,pt;q=0.9"})
    assert in_pt.json()["detail"] == t("visitor.no_cookie", "pt", url="http://testserver/")
    other = a.post("/gradio_api/queue/join", json={"session_hash": page})
    assert other.status_code == 403 and other.json()["detail"] == t("visitor.other_session", "en")
    monkeypatch.setenv("SPACE_HOST", "someone-memtune.hf.space")
    no_cookie.cookies.clear()
    said = no_cookie.post("/gradio_api/queue/join", json={"session_hash": page}).json()["detail"]
    assert said == t("visitor.no_cookie", "en", url="https://someone-memtune.hf.space")


def test_the_visitor_is_read_once_the_same_for_a_plain_request_and_a_queued_event():
    """The middleware puts the visitor it verified (or issued) in the request's state; `request_visitor` reads only
    that: Gradio's queued event (its gr.Request holds the join request), a pickled copy of it, and a request whose
    Cookie header says otherwise all agree."""
    from starlette.middleware import Middleware

    def handler(text, request: gr.Request):
        plain = request_visitor(request)  # before pickling: Gradio's pickling drops the original's request
        return f"{plain}|{request_visitor(pickle.loads(pickle.dumps(request)))}"

    with gr.Blocks() as demo:
        box, out = gr.Textbox(), gr.Textbox()
        box.submit(handler, box, out, api_name="who")
    demo.queue()
    app = gr.routes.App.create_app(demo, app_kwargs={"middleware": [Middleware(VisitorCookie)]})
    with TestClient(app) as client:
        client.get("/gradio_api/startup-events")
        page = f"queued-{secrets.token_hex(4)}"
        join = client.post("/gradio_api/queue/join",  # the first request: its new id is the event's
                            json={"data": ["x"], "fn_index": 0, "session_hash": page, "trigger_id": None})
        assert join.status_code == 200
        visitor_id = identity.verified(client.cookies[identity.COOKIE])
        with client.stream("GET", f"/gradio_api/queue/data?session_hash={page}") as stream:
            said = [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:")]  # to its end
        done = next(m for m in said if m["msg"] == "process_completed")
        assert done["output"]["data"] == [f"{visitor_id}|{visitor_id}"]

    class Fake:
        state = type("State", (), {STATE_KEY: "X" * 22})()
        cookies = {identity.COOKIE: identity.issue()[1]}

    assert request_visitor(Fake()) == "X" * 22 and request_visitor(None) is None
    assert request_visitor(gr.Request(username=None)) == ""  # no middleware in front: nobody
    assert request_visitor(gr.Request(username="owner")) is None
