"""Public mode: a file Gradio hands a visitor (an upload's temp copy, an output such as the adapter's or Export's zip,
copied into Gradio's upload folder) is served to that visitor only (ui/files_guard.py). Over a real Gradio app with the
middlewares app.py puts in front of it in public mode (VisitorCookie, then FilesGuard): visitor A uploads and is
handed a zip; visitor B (another signed cookie), a request without a cookie and one with a forged cookie read neither,
by /gradio_api/file=, its /file/ alias, the path spelled otherwise, a symbolic link, or as an input of their own.
"""

import json
import os
import secrets
from pathlib import Path

import pytest

pytest.importorskip("gradio")


@pytest.fixture
def public_app(tmp_path, monkeypatch):
    """A small page (an upload echoed back, a button handing out a zip made on the server: the live panel's adapter
    download and Export's zip work so), served by Gradio's own routes, with Gradio's folder in tmp_path."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    monkeypatch.setenv("MEMTUNE_HOME", str(tmp_path / "home"))
    import gradio as gr
    from starlette.middleware import Middleware
    from starlette.testclient import TestClient

    from ui.files_guard import FilesGuard
    from ui.visitors import VisitorCookie

    made = tmp_path / "runs" / "adapter.zip"
    made.parent.mkdir()
    made.write_bytes(b"PK A's adapter")
    shown = tmp_path / "page-logo.txt"
    shown.write_text("everyone's")

    with gr.Blocks() as demo:
        upload = gr.File(type="filepath")
        echoed = gr.File()
        zipped = gr.File()
        gr.File(value=str(shown))  # a file in the page itself: every visitor loads it
        button = gr.Button()
        upload.upload(lambda p: p, upload, echoed, api_name="echo")
        button.click(lambda: str(made), None, zipped, api_name="zip")
    demo.queue()
    demo.max_file_size = None  # what launch() sets
    app = gr.routes.App.create_app(demo, app_kwargs={"middleware": [Middleware(VisitorCookie),
                                                                    Middleware(FilesGuard)]})
    with TestClient(app) as client:  # one event loop for every request: the queue's
        assert client.get("/gradio_api/startup-events").status_code == 200
        yield Page(client, demo), made


class Page:
    def __init__(self, client, demo):
        self.client, self.demo = client, demo


class Visitor:
    """A browser: the signed cookie its first request was given, sent with every request after (keep=False: a client
    that sends none, a new visitor each time)."""

    def __init__(self, page: Page, keep: bool = True, cookie: str | None = None) -> None:
        self.page, self.keep, self.cookie = page, keep, cookie
        self.session = secrets.token_hex(8)  # its page's session hash (bound to it by VisitorCookie)
        if keep and cookie is None:
            self.request("GET", "/gradio_api/startup-events")

    def _headers(self, headers: dict | None) -> dict:
        self.page.client.cookies.clear()
        return {**(headers or {}), **({"cookie": f"memtune-visitor={self.cookie}"} if self.cookie else {})}

    def request(self, method: str, url: str, headers: dict | None = None, **kw):
        answer = self.page.client.request(method, url, headers=self._headers(headers), **kw)
        if self.keep and self.cookie is None:
            self.cookie = answer.cookies["memtune-visitor"]
        return answer

    def get(self, url: str, **kw):
        return self.request("GET", url, **kw)

    def head(self, url: str, **kw):
        return self.request("HEAD", url, **kw)

    def upload(self, name: str = "mine.jsonl", data: bytes = b'{"instruction": "A\'s secret row"}\n') -> str:
        answer = self.request("POST", "/gradio_api/upload", files={"files": (name, data)})
        assert answer.status_code == 200, answer.text
        return answer.json()[0]

    def run(self, api_name: str, data: list) -> list:
        """One event through the queue as the page sends it; its outputs from the visitor's event stream (the HTTP
        status and detail if it was refused)."""
        demo = self.page.demo
        fn_index = next(i for i, fn in demo.fns.items() if fn.api_name == api_name)
        joined = self.request("POST", "/gradio_api/queue/join", json={
            "data": data, "fn_index": fn_index, "session_hash": self.session, "event_data": None, "trigger_id": None})
        if joined.status_code != 200:
            return [joined.status_code, joined.text]
        outputs = []
        with self.page.client.stream("GET", f"/gradio_api/queue/data?session_hash={self.session}",
                                     headers=self._headers(None)) as stream:
            for line in stream.iter_lines():  # the stream ends after the event's completion
                if line.startswith("data:") and '"process_completed"' in line:
                    outputs = json.loads(line[5:])["output"].get("data", [])
        return outputs


def filedata(path: str) -> dict:
    return {"path": path, "meta": {"_type": "gradio.FileData"}, "orig_name": Path(path).name}


def test_an_upload_is_served_to_the_visitor_who_uploaded_it_and_to_nobody_else(public_app):
    page, _ = public_app
    a, b, nobody = Visitor(page), Visitor(page), Visitor(page, keep=False)
    path = a.upload()
    got = a.get(f"/gradio_api/file={path}")
    assert got.status_code == 200 and b"secret row" in got.content
    assert "private" in got.headers["cache-control"]  # no shared cache keeps it for the next person
    forged = Visitor(page, cookie=a.cookie[:-1] + ("0" if a.cookie[-1] != "0" else "1"))
    for stranger in (b, nobody, forged):
        answer = stranger.get(f"/gradio_api/file={path}")
        assert answer.status_code == 404 and b"secret" not in answer.content
    assert a.get(f"/gradio_api/file={path}").status_code == 200  # still theirs


def test_an_output_file_like_the_adapter_zip_is_served_to_its_visitor_only(public_app):
    page, made = public_app
    a, b, nobody = Visitor(page), Visitor(page), Visitor(page, keep=False)
    handed = a.run("zip", [])[0]["path"]  # Gradio's copy of the zip, in its upload folder
    assert Path(handed) != made and a.get(f"/gradio_api/file={handed}").content == b"PK A's adapter"
    for stranger in (b, nobody):
        for url in (f"/gradio_api/file={handed}", f"/gradio_api/file/{handed}", f"/gradio_api/file={made}"):
            answer = stranger.get(url)
            assert answer.status_code in (403, 404) and b"PK" not in answer.content, url
    # B's own click is handed a copy of the same bytes, the same path: theirs too, once the server answered them
    assert b.run("zip", [])[0]["path"] == handed
    assert b.get(f"/gradio_api/file={handed}").status_code == 200
    assert nobody.get(f"/gradio_api/file={handed}").status_code == 404


def test_the_path_spelled_otherwise_is_refused_to_a_stranger_and_served_to_its_owner(public_app, tmp_path):
    page, _ = public_app
    a, b = Visitor(page), Visitor(page)
    path = a.upload()
    folder, name = os.path.split(path)
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)  # outside Gradio's folder, pointing into it: Gradio alone would serve it
    spellings = [
        f"/gradio_api/file={path.replace('/', '%2F')}",
        f"/gradio_api/file={folder}/%2E%2E/{os.path.basename(folder)}/{name}",
        f"/gradio_api/file={folder}/./{name}",
        f"/gradio_api/file={path}?download=1",
        f"/gradio_api/file/{path}",
        f"/gradio_api/file={link}",
        f"/gradio_api/file={os.path.relpath(path).replace('..', '%2E%2E')}",  # from the server's folder
        f"/gradio_api/file={path}/",
        f"/gradio_api/file=/{path}",
    ]
    assert b.get(f"/gradio_api/file={path}%00").status_code == 404  # a NUL byte: refused, not a server error
    for url in spellings:
        assert b.get(url).status_code == 404, url
        assert b.head(url).status_code == 404, url
        assert b.get(url, headers={"range": "bytes=0-4"}).status_code == 404, url
    for url in spellings[:-2]:  # the same file for its owner (a trailing slash, "//": Gradio's own 403)
        assert a.get(url).status_code == 200, url


def test_another_visitors_file_named_as_an_input_is_refused(public_app):
    page, _ = public_app
    a, b = Visitor(page), Visitor(page)
    path = a.upload()
    assert b.run("echo", [filedata(path)])[0] == 404  # B's page naming A's upload
    assert b.run("echo", [{"path": path}])[0] == 404  # without Gradio's marker
    mine = b.upload("theirs.jsonl", b'{"instruction": "B\'s row"}\n')
    assert b.run("echo", [filedata(mine)])[0]["path"].endswith("theirs.jsonl")
    assert a.run("echo", [filedata(path)])[0]["path"].endswith("mine.jsonl")


def test_the_page_s_own_files_load_for_everyone_and_deep_links_are_not_made(public_app):
    page, _ = public_app
    a, b, nobody = Visitor(page), Visitor(page), Visitor(page, keep=False)
    config = a.get("/config").json()
    page_file = next(c["props"]["value"]["path"] for c in config["components"]
                     if (c.get("props", {}).get("value") or {}).get("orig_name") == "page-logo.txt")
    for visitor in (a, b, nobody):
        assert visitor.get(f"/gradio_api/file={page_file}").content == b"everyone's"
    # a deep link copies a session's values into Gradio's folder for anyone holding its name
    assert a.get(f"/gradio_api/deep_link?session_hash={a.session}").status_code == 404


def test_what_the_guard_remembers_is_bounded_per_visitor_and_in_all():
    from ui.files_guard import Owners

    owners = Owners(per_visitor=3, total=5)
    for i in range(4):
        owners.grant("A", f"/g/a{i}")
    assert not owners.owns("A", "/g/a0") and all(owners.owns("A", f"/g/a{i}") for i in (1, 2, 3))
    owners.grant("B", "/g/b0")
    owners.grant("B", "/g/b1")
    assert len(owners) == 5
    owners.grant("C", "/g/c0")  # past the total: the least recently active visitor's oldest goes
    assert len(owners) == 5 and not owners.owns("A", "/g/a1") and owners.owns("B", "/g/b0")
    assert not owners.owns("B", "/g/a2") and not owners.owns("", "/g/a2")


def test_an_answer_is_read_for_its_files_as_it_streams_and_text_naming_a_path_grants_nothing(monkeypatch):
    from ui import files_guard
    from ui.files_guard import AnswerPaths

    monkeypatch.setattr(files_guard, "SCANNED", 64)

    def start(kind: bytes, status: int = 200) -> dict:
        return {"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]}

    def body(data: bytes, more: bool = True) -> dict:
        return {"type": "http.response.body", "body": data, "more_body": more}

    def event(path: str) -> bytes:
        return b"data: " + json.dumps({"output": {"data": [filedata(path)]}}).encode() + b"\n\n"

    stream = AnswerPaths()
    assert stream.read(start(b"text/event-stream; charset=utf-8")) == []
    first = event("/g/1/a.zip")
    assert stream.read(body(first[:20])) == [] and stream.read(body(first[20:])) == ["/g/1/a.zip"]  # split mid-line
    assert stream.read(body(b"data: " + b"x" * 100)) == []  # a line too long to read: skipped to its end
    assert stream.read(body(b"y" * 100 + b"\n\n" + event("/g/2/b.zip"))) == ["/g/2/b.zip"]  # and read on after it
    quoted = json.dumps({"output": {"data": [json.dumps(filedata("/g/3/c.zip"))]}})  # a path in text the page shows
    assert stream.read(body(b"data: " + quoted.encode() + b"\n\n", more=False)) == []

    upload = AnswerPaths(upload=True)
    upload.read(start(b"application/json"))
    assert upload.read(body(b'["/g/4/d.jsonl"]', more=False)) == ["/g/4/d.jsonl"]
    refused = AnswerPaths(upload=True)
    refused.read(start(b"application/json", 413))
    assert refused.read(body(b'["/g/5/e.jsonl"]', more=False)) == []
    large = AnswerPaths()
    large.read(start(b"application/json"))
    assert large.read(body(json.dumps({"data": [filedata("/g/6/f"), "z" * 100]}).encode(), more=False)) == []


def test_app_py_in_public_mode_serves_an_upload_to_its_visitor_only(tmp_path_factory):
    """The wiring itself: `python app.py --public` puts the guard inside VisitorCookie (HTTP only, no browser)."""
    import http.cookiejar
    import urllib.error
    import urllib.request

    from tests.browser_app import app_server

    started = app_server(tmp_path_factory, "--public", "--host", "127.0.0.1")
    server = next(started)
    try:
        def opener():
            return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

        def status(client, path: str, data: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
            req = urllib.request.Request(server["url"] + path.lstrip("/"), data=data, headers=headers or {})
            try:
                with client.open(req, timeout=60) as answer:
                    return answer.status, answer.read()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read()

        a, b = opener(), opener()
        assert status(a, "/")[0] == 200 and status(b, "/")[0] == 200
        form = (b"--x\r\nContent-Disposition: form-data; name=\"files\"; filename=\"mine.jsonl\"\r\n\r\n"
                b'{"instruction": "A\'s secret row", "response": "x"}\n\r\n--x--\r\n')
        code, said = status(a, "/gradio_api/upload", form, {"content-type": "multipart/form-data; boundary=x"})
        assert code == 200, said
        url = f"/gradio_api/file={json.loads(said)[0]}"
        assert status(a, url) == (200, b'{"instruction": "A\'s secret row", "response": "x"}\n')
        assert status(b, url)[0] == 404 and status(urllib.request.build_opener(), url)[0] == 404
    finally:
        next(started, None)
