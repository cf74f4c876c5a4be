"""Who a public-mode visitor is: an id the server issues, never one the client chooses (no gradio here).

On a visitor's first request the server draws a random id and hands it to the browser in a cookie signed with this
server's key (HMAC-SHA256): `<id>.<signature>`. The cookie is HttpOnly (no script reads it) and never sent by
another site's page (SameSite=Lax, or over https a partitioned cookie: set_cookie_header). A request is that visitor only if its cookie's signature checks; anything
else (no cookie, a forged or edited one, another server's) is a new visitor. Gradio's session hash, which the
client picks, is never used to tell visitors apart.

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

COOKIE = "memtune-visitor"
KEEP_S = 30 * 24 * 3600  # the browser keeps the id a month: a visitor's runs are pruned long before that
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


def _sign(visitor_id: str) -> str:
    return hmac.new(key(), visitor_id.encode(), hashlib.sha256).hexdigest()


def issue() -> tuple[str, str]:
    """A new visitor: (id, the cookie's value)."""
    visitor_id = secrets.token_urlsafe(16)
    return visitor_id, f"{visitor_id}.{_sign(visitor_id)}"


def verified(value: str | None) -> str | None:
    """The visitor id a cookie's value carries, if this server signed it; None otherwise."""
    visitor_id, dot, signature = (value or "").partition(".")
    if not dot or not ID_PATTERN.fullmatch(visitor_id):
        return None
    return visitor_id if hmac.compare_digest(signature.encode(), _sign(visitor_id).encode()) else None


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
