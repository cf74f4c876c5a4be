"""Public mode's request transport, before any route reads a byte: how large a body may be, and one value for each
header whose copies the server's parts would read differently.

Bodies are counted while they stream: a declared Content-Length over the limit is answered 413 before anything is
read, and a body that passes the limit as it arrives (chunked, or longer than declared) is answered 413 as it does,
the route told the client left (`http.disconnect`). Nothing holds more than the limit of one body. The limit is
MAX_BODY for every body but an upload (Gradio streams those to a file): that is the Space owner's disk budget per
visitor (MEMTUNE_SPACE_DISK_GIB, core.runs.public), or UNBUDGETED_UPLOAD where the owner set none.

One Content-Type, one Content-Length: FastAPI reads the first Content-Type, a middleware reading the last would
judge another body than the route parses. ui/visitors.py refuses the same for its cookie.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from starlette.formparsers import MultiPartException

from core.i18n import detect_language, t
from core.runs.public import limits

MAX_BODY = 64 * 2**20  # any body but an upload: the page's largest (the form's values) is a few KiB
UNBUDGETED_UPLOAD = 8 * 2**30  # an upload where the owner set no disk budget per visitor
MULTIPART_MARGIN = 2**20  # a multipart body's boundaries and part headers around the file itself
UPLOAD_ROUTES = ("/gradio_api/upload",)  # multipart bodies: Gradio streams each file to its upload folder
FORM_ROUTES = ("/login",)  # urlencoded bodies: the login form
Receive = Callable[[], Any]
Send = Callable[[dict], Any]


def headers_named(scope: dict, name: bytes) -> list[bytes]:
    """Every value of one header (ASGI names are lower case)."""
    return [v for k, v in scope.get("headers", []) if k.lower() == name]


def language(scope: dict) -> str:
    accept = headers_named(scope, b"accept-language")
    return detect_language(accept[0].decode("latin-1") if accept else None)


async def refuse(send: Send, status: int, detail: str) -> None:
    """A JSON answer {"detail": ...}: the text Gradio's page shows in its toast."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def route_path(scope: dict) -> str:
    """The path the routes match (without a root path the app is mounted under)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def media_type(scope: dict) -> bytes:
    kinds = headers_named(scope, b"content-type")
    return kinds[0].split(b";")[0].strip().lower() if kinds else b""


def upload_limit() -> int:
    budget = limits().disk_gib
    return (int(budget * 2**30) if budget > 0 else UNBUDGETED_UPLOAD) + MULTIPART_MARGIN


def body_rule(scope: dict) -> tuple[int, bool]:
    """(the body's limit, whether the middleware reads it as JSON): every POST is read but a multipart one to the
    upload route and an urlencoded one to the login form (`wrong_media` refuses those elsewhere)."""
    kind = media_type(scope)
    if kind == b"multipart/form-data":
        return upload_limit(), False
    if kind == b"application/x-www-form-urlencoded":
        return MAX_BODY, False
    return MAX_BODY, scope.get("method") == "POST"


def wrong_media(scope: dict) -> bool:
    """A multipart POST to any route but the upload, or an urlencoded one to any but the login form: passed on
    unread, a route that parses one (Gradio's component_server) would see a session hash nobody checked."""
    kind, path = media_type(scope), route_path(scope).rstrip("/")
    if scope.get("method") != "POST":
        return False
    return (kind == b"multipart/form-data" and path not in UPLOAD_ROUTES) or \
        (kind == b"application/x-www-form-urlencoded" and path not in FORM_ROUTES)


def problem(scope: dict, lang: str) -> tuple[int, str] | None:
    """Why a request is refused before its body is read, as (status, message); None when it may go on."""
    for name in (b"content-type", b"content-length"):
        if len(headers_named(scope, name)) > 1:
            return 400, t("request.repeated", lang, name=name.decode())
    if wrong_media(scope):
        return 415, t("request.wrong_type", lang)
    length = headers_named(scope, b"content-length")
    text = length[0].decode("latin-1").strip() if length else "0"
    if not (text.isascii() and text.isdigit()):
        return 400, t("request.bad_length", lang)
    limit = body_rule(scope)[0]
    return (413, t("request.too_large", lang, size=size_text(limit))) if int(text) > limit else None


def size_text(limit: int) -> str:
    return f"{limit / 2**30:.1f} GiB" if limit >= 2**30 else f"{limit / 2**20:.0f} MiB"


class Bounded:
    """A request's `receive` and `send` that count the body as it streams: past `limit` bytes the client is answered
    413 at once (unless the app has begun its answer) and what the app sends after is dropped. The app is told the
    client left (`http.disconnect`), or, reading a multipart body, that it is too large the way Starlette's and
    Gradio's multipart parsers expect (their MultiPartException): they then delete the file they were writing.
    `seen`: the body's bytes so far."""

    def __init__(self, receive: Receive, send: Send, limit: int, lang: str, multipart: bool = False) -> None:
        self._receive, self._send, self.limit, self.lang, self.multipart = receive, send, limit, lang, multipart
        self.seen = 0
        self.over = False
        self.started = False

    def _cut(self) -> dict:
        if self.multipart:
            raise MultiPartException(f"File size exceeded maximum allowed size of {self.limit} bytes.")
        return {"type": "http.disconnect"}

    async def receive(self) -> dict:
        if self.over:
            return self._cut()
        message = await self._receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.limit:
                self.over = True
                if not self.started:
                    await refuse(self._send, 413, t("request.too_large", self.lang, size=size_text(self.limit)))
                return self._cut()
        return message

    async def send(self, message: dict) -> None:
        if self.over:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


async def read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The whole request body and a `receive` that hands it to the app as if unread; b"" if the client left first
    (with a Bounded receive: check `over`, it may have been cut for its size)."""
    parts, more = [], True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return b"", receive
        parts.append(message.get("body", b""))
        more = message.get("more_body", False)
    body, given = b"".join(parts), False
    del parts

    async def replay() -> dict:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay
