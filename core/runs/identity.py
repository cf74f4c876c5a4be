"""Who a public-mode visitor is: an id the server issues, never one the client chooses (no gradio here).

On a visitor's first request the server draws a random id and hands it to the browser in a cookie signed with this
server's key (HMAC-SHA256): `<id>.<issued>.<signature>`, `issued` the Unix time it was signed. The cookie is HttpOnly
(no script reads it) and never sent by another site's page (SameSite=Lax, or over https a partitioned cookie:
set_cookie_header). A request is that visitor only if its cookie's signature checks and it was issued less than
KEEP_S ago (the server's own expiry: the browser's Max-Age is only a request); anything else (no cookie, a forged,
edited, expired or another server's one) is a new visitor. The same id is signed again, with a fresh time, once its
cookie is older than RENEW_S (`renew`): a visitor who comes back within the month keeps their id, and so their runs.
Cookies of the older form `<id>.<signature>`, without a time, are not read: their visitors become new ones.
Gradio's session hash, which the client picks, is never used to tell visitors apart.

The key lives in MEMTUNE_HOME/visitor-key (made once, readable by this user only), so visitors keep their runs
across a restart of the app; where it cannot be written, a key for this process alone.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import threading
import time
from typing import NamedTuple

COOKIE = "memtune-visitor"
KEEP_S = 30 * 24 * 3600  # a cookie is good for a month after it was signed: a visitor's runs are pruned long before
RENEW_S = 24 * 3600  # a cookie older than a day is signed again for the same id: an active visitor never expires
SKEW_S = 300  # a cookie signed "in the future" by this much: the clock went back; further, it is refused
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{22}")  # secrets.token_urlsafe(16)
_key: bytes | None = None
_key_lock = threading.Lock()


def _key_file():
    from core.config.settings import cache_root

    return cache_root() / "visitor-key"


def key() -> bytes:
    """This server's signing key: kept in MEMTUNE_HOME (created once, mode 600), or this process's own."""
    global _key
    with _key_lock:
        if _key is None:
            path = _key_file()
            try:
                if not path.is_file():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never someone else's file
                    with os.fdopen(fd, "wb") as f:
                        f.write(secrets.token_bytes(32))
                data = path.read_bytes()
                _key = data if len(data) >= 32 else secrets.token_bytes(32)
            except OSError:  # a read-only home: the ids hold until the app restarts
                _key = secrets.token_bytes(32)
        return _key


class Cookie(NamedTuple):
    visitor_id: str
    issued: int  # Unix seconds, as signed


ISSUED = re.compile(r"[0-9]{1,12}")


def _sign(visitor_id: str, issued: str) -> str:
    return hmac.new(key(), f"{visitor_id}.{issued}".encode(), hashlib.sha256).hexdigest()


def _value(visitor_id: str, now: float | None) -> str:
    issued = str(int(time.time() if now is None else now))
    return f"{visitor_id}.{issued}.{_sign(visitor_id, issued)}"


def issue(now: float | None = None) -> tuple[str, str]:
    """A new visitor: (id, the cookie's value)."""
    visitor_id = secrets.token_urlsafe(16)
    return visitor_id, _value(visitor_id, now)


def renew(cookie: Cookie, now: float | None = None) -> str | None:
    """A fresh value for the same visitor when its cookie is older than RENEW_S; None while it is recent."""
    now = time.time() if now is None else now
    return _value(cookie.visitor_id, now) if now - cookie.issued >= RENEW_S else None


def read(value: str | None, now: float | None = None) -> Cookie | None:
    """The visitor a cookie's value names, if this server signed it less than KEEP_S ago; None otherwise."""
    parts = (value or "").split(".")
    if len(parts) != 3 or not ID_PATTERN.fullmatch(parts[0]) or not ISSUED.fullmatch(parts[1]):
        return None
    visitor_id, issued, signature = parts
    if not hmac.compare_digest(signature.encode(), _sign(visitor_id, issued).encode()):
        return None
    age = (time.time() if now is None else now) - int(issued)
    return Cookie(visitor_id, int(issued)) if -SKEW_S <= age < KEEP_S else None


def verified(value: str | None, now: float | None = None) -> str | None:
    """The visitor id a cookie's value carries, if this server signed it and it has not expired; None otherwise."""
    cookie = read(value, now)
    return cookie.visitor_id if cookie else None


def set_cookie_header(value: str, secure: bool) -> str:
    """The Set-Cookie header that gives the browser its id.

    Over https (a Space): SameSite=None; Secure; Partitioned (CHIPS). A Space is usually shown inside huggingface.co's
    page, a frame of another site, where the browser keeps no Lax cookie; a partitioned cookie is kept there, and
    only there: the browser files it under the top-level site it was set beneath, so a page of any other site that
    calls this server (Gradio's CORS answer lets it, off localhost) sends no cookie of the visitor's, and is a new
    visitor itself. Over plain http (this machine, a LAN): SameSite=Lax, never None, for the same reason."""
    if secure:
        return f"{COOKIE}={value}; Path=/; Max-Age={KEEP_S}; HttpOnly; Secure; SameSite=None; Partitioned"
    return f"{COOKIE}={value}; Path=/; Max-Age={KEEP_S}; HttpOnly; SameSite=Lax"
