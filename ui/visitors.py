"""Public mode's visitors, on the web side: `VisitorCookie`, the ASGI middleware app.py puts in front of Gradio, gives
each browser a visitor id the server issued (core.runs.identity), and `request_visitor` reads it back from the
request a handler answers. Gradio's session hash (chosen by the client) plays no part.

The middleware runs before any route: a request without a valid cookie gets a new id at once, in the request itself
(so the page's first load and its first events agree) and in a Set-Cookie header (so the browser keeps it).

Gradio keeps a page's state (gr.State), its queue's messages and its heartbeat by the session hash the client picks;
so the middleware also binds each session hash to the first visitor that uses it, and refuses (403) another
visitor's request naming it: a client that copies someone's session hash reads nothing of theirs.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any, Callable
from urllib.parse import parse_qs

from core.runs.identity import COOKIE, issue, set_cookie_header, verified

SESSIONS_KEPT = 100_000  # session hash -> visitor, newest kept: a page's hash lives as long as the tab
MAX_JSON = 64 * 2**20  # a JSON body read to find its session hash (the form's values): larger ones are refused
_sessions: OrderedDict[str, str] = OrderedDict()
_sessions_lock = threading.Lock()
IN_PATH = re.compile(r"/gradio_api/(?:heartbeat|stream)/([^/]+)")


def claim(session_hash: str, visitor_id: str) -> bool:
    """Whether `visitor_id` may use `session_hash`: the first visitor to use one keeps it."""
    with _sessions_lock:
        owner = _sessions.setdefault(session_hash, visitor_id)
        _sessions.move_to_end(session_hash)
        while len(_sessions) > SESSIONS_KEPT:
            _sessions.popitem(last=False)
        return owner == visitor_id


async def _refuse(send: Callable[..., Any], status: int = 403,
                  detail: str = "This session belongs to another visitor.") -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def cookies_of(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers:
        if name.lower() == b"cookie":
            for part in value.decode("latin-1").split(";"):
                k, eq, v = part.strip().partition("=")
                if eq:
                    out.setdefault(k, v)  # the first of two same-named cookies, as browsers and Starlette read it
    return out


class VisitorCookie:
    """ASGI middleware: every HTTP request carries a signed visitor id; a new visitor is given one."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        visitor_id = verified(cookies_of(scope.get("headers", [])).get(COOKIE))
        if visitor_id is None:
            visitor_id, scope, send = self._new_visitor(scope, send)
        hashes = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash", [])
        if m := IN_PATH.match(scope.get("path", "")):
            hashes.append(m.group(1))
        headers = dict((k.lower(), v) for k, v in scope.get("headers", []))
        kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        # every POST body Gradio may read as JSON (FastAPI parses one without a content type too), not only those
        # labelled so; uploads and the login form are the others. Too large to read: refused, never passed unread.
        if scope.get("method") == "POST" and kind not in (b"multipart/form-data", b"application/x-www-form-urlencoded"):
            body, receive = await _read_body(receive)
            if len(body) > MAX_JSON:
                await _refuse(send, 413, "This request is too large.")
                return
            try:
                found = json.loads(body)
            except ValueError:
                found = None
            if isinstance(found, dict) and isinstance(found.get("session_hash"), str):
                hashes.append(found["session_hash"])
        if not all(claim(h, visitor_id) for h in hashes):
            await _refuse(send)
            return
        await self.app(scope, receive, send)

    def _new_visitor(self, scope: dict, send: Callable[..., Any]) -> tuple[str, dict, Callable[..., Any]]:
        visitor_id, value = issue()
        kept = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"cookie"]
        others = "; ".join(f"{k}={v}" for k, v in cookies_of(scope.get("headers", [])).items() if k != COOKIE)
        cookie = f"{others}; {COOKIE}={value}" if others else f"{COOKIE}={value}"
        scope = {**scope, "headers": kept + [(b"cookie", cookie.encode("latin-1"))]}
        forwarded = dict(scope["headers"]).get(b"x-forwarded-proto", b"").decode("latin-1")
        secure = scope.get("scheme") == "https" or forwarded.split(",")[0].strip() == "https"
        header = (b"set-cookie", set_cookie_header(value, secure).encode("latin-1"))

        async def with_cookie(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + [header]}
            await send(message)

        return visitor_id, scope, with_cookie


async def _read_body(receive: Callable[..., Any]) -> tuple[bytes, Callable[..., Any]]:
    """The whole request body, and a `receive` that hands it to the app as if unread."""
    parts, more = [], True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        more = message.get("more_body", False)
    body, given = b"".join(parts), False

    async def replay() -> dict:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


def request_visitor(request: Any) -> str | None:
    """The visitor id a Gradio request carries ("" when it carries none this server signed), or None for no request
    and for the Space owner (logged in with MEMTUNE_AUTH: sees every run and the whole queue). A queued event's
    request is Gradio's copy of the join request: its cookies, as a dict."""
    if request is None or getattr(request, "username", None):
        return None
    raw = getattr(request, "request", None)
    if raw is not None:
        value = raw.cookies.get(COOKIE)
    else:
        value = (getattr(request, "kwargs", None) or {}).get("cookies", {}).get(COOKIE)
    return verified(value) or ""
