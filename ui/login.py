"""With a login (MEMTUNE_AUTH / --auth): `LoginRequired`, the ASGI middleware app.py puts in front of Gradio, answers
401 to every request without a valid login except the login itself and what its page loads, and takes the API
description out of the login page.

Why: Gradio guards most of its routes with the login but leaves a few open (`/gradio_api/heartbeat/*`,
`/gradio_api/startup-events`, `POST /gradio_api/cancel`), and its page embeds `window.gradio_api_info` (every
endpoint with its parameters and defaults) even before the login. Here the rule is the other way round: only what
is listed below is open. The login is Gradio's own: its `access-token-*` cookie, checked against the app's tokens,
the cookies read by Starlette's own parser, as Gradio's routes read them (a token sent twice is the same one here).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from starlette.requests import HTTPConnection

OPEN_PATHS = {"/", "/login", "/login/", "/theme.css", "/favicon.ico"}  # the login page and its form's POST
OPEN_PREFIXES = ("/assets/", "/static/")  # the login page's scripts, styles and fonts (Gradio's own files)
STARTUP = "/gradio_api/startup-events"
API_INFO = re.compile(rb"window\.gradio_api_info = .*?;</script>", re.S)


def logged_in(scope: dict) -> bool:
    app = scope.get("app")
    tokens = getattr(app, "tokens", None)
    if tokens is None:
        return False  # not Gradio's app: nobody is known
    cookies = HTTPConnection(scope).cookies
    cookie_id = getattr(app, "cookie_id", "")
    token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
    return token is not None and tokens.get(token) is not None


class LoginRequired:
    """ASGI middleware: no login, no route (401), except the login page (without the API description)."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] not in ("http", "websocket") or logged_in(scope):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        if path == STARTUP and not getattr(scope.get("app"), "startup_events_triggered", True):
            # Gradio's launch() asks for it once, without a login, before it returns; later callers need the login
            await self.app(scope, receive, send)
            return
        if path.startswith(OPEN_PREFIXES) or (path in OPEN_PATHS and path != "/"):
            await self.app(scope, receive, send)
            return
        if path == "/" and scope.get("method") in ("GET", "HEAD"):
            await self.app(scope, receive, _without_api_info(send))
            return
        body = json.dumps({"detail": "Not authenticated"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _without_api_info(send: Callable[..., Any]) -> Callable[..., Any]:
    """The login page as Gradio renders it, with `window.gradio_api_info = null`: the page needs none to log in."""
    start: dict | None = None
    body: list[bytes] = []

    async def edit(message: dict) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message  # held until the body is complete: its length changes
            return
        if message["type"] != "http.response.body" or start is None:
            await send(message)
            return
        body.append(message.get("body", b""))
        if message.get("more_body"):
            return
        data = API_INFO.sub(b"window.gradio_api_info = null;</script>", b"".join(body))
        headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
        await send({**start, "headers": headers + [(b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    return edit
