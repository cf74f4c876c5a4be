"""Public mode's visitors, on the web side: `VisitorCookie`, the ASGI middleware app.py puts in front of Gradio, gives
each browser a visitor id the server issued (core.runs.identity), and `request_visitor` reads it back from the
request a handler answers. Gradio's session hash (chosen by the client) plays no part.

The middleware runs before any route: a request without a valid cookie gets a new id at once, in the request itself
(so the page's first load and its first events agree) and in a Set-Cookie header (so the browser keeps it); a valid
cookie older than a day is signed again for the same id. The id is read once, here: the middleware puts it in the
request's ASGI state (STATE_KEY), where `request_visitor` finds it for a plain request and for a queued event alike
(Gradio's queued event holds the join request itself, or a pickled copy that keeps its state). A request carrying
the visitor cookie twice, or two Content-Types, is refused (400): no two readers of it can disagree.

Gradio keeps a page's state (gr.State), its queue's messages and its heartbeat by the session hash the client picks;
so the middleware also binds each session hash to the first visitor that uses it (`Sessions`), and refuses (403)
another visitor's request naming it, wherever it names it (query, path, JSON body; every copy): a client that copies
someone's session hash reads nothing of theirs. A request that carries no cookie at all is told that its browser
keeps none (a page framed by another site over http) and where the Space opens on its own.

Bodies are bounded before they are read (ui/requests_guard.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import threading
from collections import OrderedDict
from typing import Any, Callable
from urllib.parse import parse_qsl

from core.i18n import t
from core.runs.identity import COOKIE, issue, read, renew, set_cookie_header
from ui.requests_guard import (Bounded, body_rule, headers_named, language, media_type, problem, read_body, refuse,
                               route_path)

STATE_KEY = "memtune_visitor"  # the request's ASGI state: the visitor id this middleware verified or issued
IN_PATH = re.compile(r"/gradio_api/(?:heartbeat|stream)/([^/]+)")
HASHES_PER_VISITOR = 64  # one per page load: a visitor's oldest beyond that is forgotten, for them alone
BINDINGS_KEPT = 200_000  # every visitor's together (~50 MB); beyond, the least recently active visitors' oldest go
FORGOTTEN_BITS = 2**27  # 16 MiB: every forgotten hash, never claimable again (a Bloom filter, 7 bits a hash)


class Sessions:
    """Session hash -> the visitor who used it first, never given to another.

    Memory is bounded, and what is forgotten is forgotten for everyone: a visitor holds at most `per_visitor` hashes
    (their oldest beyond that goes), all visitors together `kept` (the least recently active visitor's oldest goes
    first; a page's 1 s poller keeps its visitor recent). A forgotten hash enters a Bloom filter that refuses it to
    anyone who names it later, its owner too (the page's next load draws a new hash); a new hash is refused only if
    the filter mistakes it for a forgotten one, about one in 500 after ten million forgotten."""

    def __init__(self, per_visitor: int = HASHES_PER_VISITOR, kept: int = BINDINGS_KEPT,
                 bits: int = FORGOTTEN_BITS) -> None:
        self.per_visitor, self.kept, self.bits = per_visitor, kept, bits
        self._owner: dict[bytes, str] = {}
        self._held: OrderedDict[str, dict[bytes, None]] = OrderedDict()  # least recently active visitor first
        self._forgotten: bytearray | None = None  # made on the first hash forgotten
        self._salt = secrets.token_bytes(16)  # nobody can aim a hash at the filter's bits
        self._lock = threading.Lock()

    def _digest(self, session_hash: str) -> bytes:
        return hashlib.blake2b(session_hash.encode("utf-8", "surrogatepass"), key=self._salt, digest_size=28).digest()

    def _bits(self, digest: bytes) -> list[int]:
        return [int.from_bytes(digest[i:i + 4], "little") % self.bits for i in range(0, 28, 4)]

    def _was_forgotten(self, digest: bytes) -> bool:
        gone = self._forgotten
        return gone is not None and all(gone[b >> 3] & (1 << (b & 7)) for b in self._bits(digest))

    def _forget(self, visitor_id: str) -> None:
        """The visitor's oldest hash, into the filter."""
        held = self._held[visitor_id]
        digest = next(iter(held))
        del held[digest], self._owner[digest]
        if not held:
            del self._held[visitor_id]
        if self._forgotten is None:
            self._forgotten = bytearray(self.bits // 8 + 1)
        for b in self._bits(digest):
            self._forgotten[b >> 3] |= 1 << (b & 7)

    def claim(self, session_hash: str, visitor_id: str) -> bool:
        """Whether `visitor_id` may use `session_hash`: the first visitor to use one keeps it."""
        digest = self._digest(session_hash)
        with self._lock:
            owner = self._owner.get(digest)
            if owner is None:
                if self._was_forgotten(digest):
                    return False
                owner = self._owner[digest] = visitor_id
            if owner != visitor_id:
                return False
            held = self._held.setdefault(visitor_id, {})
            held.pop(digest, None)
            held[digest] = None  # newest last
            self._held.move_to_end(visitor_id)
            if len(held) > self.per_visitor:
                self._forget(visitor_id)
            while len(self._owner) > self.kept:
                self._forget(next(iter(self._held)))
            return True

    def __len__(self) -> int:
        return len(self._owner)


_sessions = Sessions()


def claim(session_hash: str, visitor_id: str) -> bool:
    """Whether `visitor_id` may use `session_hash` (the app's one table)."""
    return _sessions.claim(session_hash, visitor_id)


def cookies_of(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers:
        if name.lower() == b"cookie":
            for part in value.decode("latin-1").split(";"):
                k, eq, v = part.strip().partition("=")
                if eq:
                    out.setdefault(k, v)
    return out


def visitor_cookies(headers: list[tuple[bytes, bytes]]) -> list[str]:
    """Every value sent under the visitor cookie's name in any Cookie header, the name compared as a parser that
    trims spaces or ignores case would read it."""
    found = []
    for name, value in headers:
        if name.lower() == b"cookie":
            for part in value.decode("latin-1").split(";"):
                k, eq, v = part.partition("=")
                if eq and k.strip().lower() == COOKIE:
                    found.append(v.strip())
    return found


def session_hashes(scope: dict, body: bytes | None) -> list[str]:
    """Every session hash a request names: each in the query (Starlette's parse), the path, and the JSON body's
    top level (every copy of the key, though a JSON parser keeps the last)."""
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    found = [v for k, v in query if k == "session_hash"]
    if m := IN_PATH.match(route_path(scope)):
        found.append(m.group(1))
    if body:
        try:
            top = json.loads(body, object_pairs_hook=_Pairs)
        except (ValueError, RecursionError):  # not JSON: no route parses a session hash out of it either
            top = None
        if isinstance(top, _Pairs):
            found += [v for k, v in top.pairs if k == "session_hash" and isinstance(v, str)]
    return found


class _Pairs(dict):
    """A JSON object that remembers every key as written, repeated ones too."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs


def own_address(scope: dict) -> str:
    """Where the Space opens on its own: the Space's host on Hugging Face, else the host this request was sent to."""
    host = os.environ.get("SPACE_HOST", "")
    if host:
        return f"https://{host}"
    sent = headers_named(scope, b"host")
    host = re.sub(r"[^A-Za-z0-9.:\[\]-]", "", sent[0].decode("latin-1"))[:255] if sent else ""
    return f"{'https' if over_https(scope) else 'http'}://{host or 'localhost'}/"


def over_https(scope: dict) -> bool:
    """Whether the browser reached the app over https: the connection's own scheme, or behind a proxy (a Space) the
    first X-Forwarded-Proto."""
    forwarded = headers_named(scope, b"x-forwarded-proto")
    return scope.get("scheme") == "https" or (bool(forwarded) and
                                              forwarded[0].decode("latin-1").split(",")[0].strip() == "https")


class VisitorCookie:
    """ASGI middleware: every HTTP request carries a signed visitor id; a new visitor is given one."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lang = language(scope)
        cookies = visitor_cookies(scope.get("headers", []))
        refused = problem(scope, lang)
        if refused is None and len(cookies) > 1:
            refused = 400, t("request.repeated", lang, name=COOKIE)
        if refused:
            await refuse(send, *refused)
            return
        limit, inspect = body_rule(scope)
        bounded = Bounded(receive, send, limit, lang, multipart=media_type(scope) == b"multipart/form-data")
        receive, send = bounded.receive, bounded.send
        body = None
        if inspect:
            body, receive = await read_body(receive)
            if bounded.over:
                return
        cookie = read(cookies[0]) if cookies else None
        if cookie is None:
            visitor_id, value = issue()
            scope = _with_cookie(scope, value)
        else:
            visitor_id, value = cookie.visitor_id, renew(cookie)
        if not all(claim(h, visitor_id) for h in session_hashes(scope, body)):
            detail = t("visitor.other_session", lang) if cookies else t("visitor.no_cookie", lang,
                                                                        url=own_address(scope))
            await refuse(send, 403, detail)
            return
        scope = {**scope, "state": {**scope.get("state", {}), STATE_KEY: visitor_id}}
        if value is not None:
            send = _setting_cookie(send, scope, value)
        try:
            await self.app(scope, receive, send)
        except Exception:
            if not bounded.over:  # once it is answered 413, what the app makes of the cut body does not matter
                raise


def _with_cookie(scope: dict, value: str) -> dict:
    """The request as if it had carried the new visitor's cookie (for any reader of the Cookie header)."""
    kept = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"cookie"]
    others = "; ".join(f"{k}={v}" for k, v in cookies_of(scope.get("headers", [])).items()
                       if k.strip().lower() != COOKIE)
    cookie = f"{others}; {COOKIE}={value}" if others else f"{COOKIE}={value}"
    return {**scope, "headers": kept + [(b"cookie", cookie.encode("latin-1"))]}


def _setting_cookie(send: Callable[..., Any], scope: dict, value: str) -> Callable[..., Any]:
    header = (b"set-cookie", set_cookie_header(value, over_https(scope)).encode("latin-1"))

    async def with_cookie(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": list(message.get("headers", [])) + [header]}
        await send(message)

    return with_cookie


def scope_visitor(scope: dict) -> str | None:
    """The visitor id VisitorCookie verified or issued for this request (for a middleware inside it)."""
    return (scope.get("state") or {}).get(STATE_KEY)


def request_visitor(request: Any) -> str | None:
    """The visitor id a Gradio request carries ("" when it carries none: no VisitorCookie in front), or None for no
    request and for the Space owner (logged in with MEMTUNE_AUTH: sees every run and the whole queue). Read from the
    request's state, where VisitorCookie put it: a gr.Request's attributes are its Starlette request's (a queued
    event's is the join request's); a pickled gr.Request keeps that state in its kwargs (Gradio's own unpickling
    does not put it back)."""
    if request is None or getattr(request, "username", None):
        return None
    found = getattr(getattr(request, "state", None), STATE_KEY, None)
    if found is None:
        found = ((getattr(request, "kwargs", None) or {}).get("request_state") or {}).get(STATE_KEY)
    return found or ""
