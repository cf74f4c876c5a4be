"""Public mode's visitors, on the web side: `VisitorCookie`, the ASGI middleware app.py puts in front of Gradio, gives
each browser a visitor id the server issued (core.runs.identity), and `request_visitor` reads it back from the
request a handler answers. Gradio's session hash (chosen by the client) plays no part.

The middleware runs before any route: a request without a valid cookie gets a new id at once, in the request itself
(so the page's first load and its first events agree) and in a Set-Cookie header (so the browser keeps it).
"""

from __future__ import annotations

from typing import Any, Callable

from core.runs.identity import COOKIE, issue, set_cookie_header, verified


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
        if scope["type"] != "http" or verified(cookies_of(scope.get("headers", [])).get(COOKIE)):
            await self.app(scope, receive, send)
            return
        _, value = issue()
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

        await self.app(scope, receive, with_cookie)


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
