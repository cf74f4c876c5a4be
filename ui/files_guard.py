"""Public mode's files, each served only to the visitor it was handed to: `FilesGuard`, the ASGI middleware app.py puts
inside `ui.visitors.VisitorCookie` (so every request already carries a visitor id).

Gradio keeps every file it hands a browser in its upload folder (GRADIO_TEMP_DIR): an upload's temp copy, and each
output file copied there (the adapter's zip, Export's zip). It serves any of them at /gradio_api/file=PATH (and the
older /gradio_api/file/PATH) to whoever asks, and accepts any of them as an input: the path is the only secret. The
guard makes the visitor the key instead:

- it records which visitor each path was handed to, from the answers Gradio sends that visitor: /upload's list of
  paths, and the files (FileData) in the queue's event stream and in the API's answers;
- a path inside Gradio's upload or cache folder is served only to a visitor it was handed to, and a request body
  naming one (an input's FileData) is refused from anyone else; the page's own files (those in the Blocks' config)
  are everyone's. The target is compared after `..`, symbolic links and a trailing slash are resolved, as the
  operating system opens it; Starlette has already decoded %2F. Paths outside those folders are left to Gradio's own
  rule (only allowed and static paths, which memtune sets none of).
- /gradio_api/deep_link, which copies a session's values into the upload folder for anyone holding its name, is not
  served.

What is remembered is bounded: the newest PER_VISITOR paths of each visitor, TOTAL in all (the least recently active
visitors' oldest go first). A path forgotten is refused to its owner too: the page hands a new one on the next answer.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterator

from ui.requests_guard import body_rule, read_body, refuse, route_path
from ui.visitors import scope_visitor

PER_VISITOR = 256  # a visitor's newest files: uploads and downloads of a few hours' work
TOTAL = 50_000  # every visitor's together: ~12 MiB at most
SCANNED = 16 * 2**20  # an answer larger than this is not read for paths (its files are then not served)
FILE_ROUTE = re.compile(r"/gradio_api/file[=/](.*)", re.S)
UPLOAD_ROUTE = re.compile(r"^/gradio_api/upload/?$")
DEEP_LINK_ROUTE = re.compile(r"/gradio_api/deep_link/?$")
FILEDATA = "gradio.FileData"


def target(path: str) -> str:
    """The file the operating system opens for `path`, as Gradio opens it (os.path.abspath, then the links)."""
    return os.path.realpath(os.path.abspath(path))


def inside(path: str, folders: tuple[str, ...]) -> bool:
    """Whether `path`, as written or as resolved, lies in one of `folders` (each already resolved)."""
    candidates = {os.path.abspath(path), target(path)}
    return any(c == f or c.startswith(f.rstrip(os.sep) + os.sep) for c in candidates for f in folders)


class Owners:
    """Which visitor was handed which file (resolved paths), bounded: PER_VISITOR each, TOTAL in all."""

    def __init__(self, per_visitor: int = PER_VISITOR, total: int = TOTAL) -> None:
        self.per_visitor, self.total = per_visitor, total
        self._files: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()  # least recently active first
        self._count = 0
        self._lock = threading.Lock()

    def grant(self, visitor: str, path: str) -> None:
        with self._lock:
            mine = self._touch(visitor)
            if path in mine:
                mine.move_to_end(path)
                return
            mine[path] = None
            self._count += 1
            if len(mine) > self.per_visitor:
                mine.popitem(last=False)
                self._count -= 1
            while self._count > self.total:
                oldest, theirs = next(iter(self._files.items()))
                theirs.popitem(last=False)
                self._count -= 1
                if not theirs:
                    del self._files[oldest]

    def owns(self, visitor: str, path: str) -> bool:
        with self._lock:
            mine = self._files.get(visitor)
            if mine is None or path not in mine:
                return False
            self._touch(visitor)
            mine.move_to_end(path)
            return True

    def _touch(self, visitor: str) -> OrderedDict[str, None]:
        mine = self._files.pop(visitor, None)
        self._files[visitor] = mine = mine if mine is not None else OrderedDict()
        return mine

    def __len__(self) -> int:
        return self._count


def file_paths(data: Any, filedata_only: bool = True) -> Iterator[str]:
    """The "path" of every file object in decoded JSON: Gradio's FileData (marked by its meta), or with
    filedata_only=False any object with a "path" string (what an input may name, marked or not)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            path = item.get("path")
            meta = item.get("meta")
            if isinstance(path, str) and (not filedata_only
                                          or (isinstance(meta, dict) and meta.get("_type") == FILEDATA)):
                yield path
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _load(text: bytes) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError), or nested past Python's stack
        return None


def answer_paths(body: bytes, upload: bool) -> list[str]:
    """The file paths an answer hands its visitor: /upload's JSON list of paths, or the FileData in a JSON answer."""
    data = _load(body)
    if upload:
        return [p for p in data if isinstance(p, str)] if isinstance(data, list) else []
    return list(file_paths(data)) if b'"path"' in body else []


def event_paths(line: bytes) -> list[str]:
    """The FileData paths in one line of a server-sent event stream (`data: {...}`)."""
    if not line.startswith(b"data:") or b'"path"' not in line:
        return []
    return list(file_paths(_load(line[5:])))


async def _not_found(send: Callable[..., Any]) -> None:
    """Starlette's own answer for a missing route, on purpose: someone else's file reads as no file at all."""
    await refuse(send, 404, "Not Found")


class FilesGuard:
    """ASGI middleware (public mode, inside VisitorCookie): the files in Gradio's upload folder only for their owner."""

    def __init__(self, app: Callable[..., Any], owners: Owners | None = None) -> None:
        self.app = app
        self.owners = owners if owners is not None else Owners()
        self._folders: tuple[str, ...] | None = None
        self._everyone: tuple[Any, frozenset[str]] = (None, frozenset())  # (the page's config, its files)

    async def __call__(self, scope: dict, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        visitor = scope_visitor(scope) or ""  # none: not behind VisitorCookie, so nobody's files are served
        path = route_path(scope)
        if DEEP_LINK_ROUTE.search(path):
            await _not_found(send)
            return
        if m := FILE_ROUTE.search(path):
            if not self.may_read(scope, visitor, m.group(1)):
                await _not_found(send)
                return
            await self.app(scope, receive, _private(send))
            return
        _, as_json = body_rule(scope)  # a body Gradio may parse as JSON (VisitorCookie has bounded it)
        if as_json:
            body, receive = await read_body(receive)
            if b'"path"' in body and not all(self.may_read(scope, visitor, p)
                                             for p in file_paths(_load(body), filedata_only=False)):
                await _not_found(send)
                return
        await self.app(scope, receive, self._recording(send, visitor, bool(UPLOAD_ROUTE.search(path))))

    def may_read(self, scope: dict, visitor: str, path: str) -> bool:
        """Whether `visitor` may have `path`: anything outside Gradio's folders (Gradio's own rule applies there),
        else a file the page shows everyone or one handed to this visitor."""
        try:
            if not inside(path, self.folders(scope)):  # a URL too: as a path it lies in the working folder
                return True
            resolved = target(path)
        except ValueError:  # a NUL byte: no file has that name
            return False
        return resolved in self.everyone(scope) or (bool(visitor) and self.owners.owns(visitor, resolved))

    def folders(self, scope: dict) -> tuple[str, ...]:
        """Gradio's upload folder (uploads and every output's copy) and its examples cache, resolved."""
        if self._folders is None:
            from gradio.utils import get_cache_folder, get_upload_folder

            upload = getattr(scope.get("app"), "uploaded_file_dir", None) or get_upload_folder()
            self._folders = tuple({target(str(upload)), target(str(get_cache_folder()))})
        return self._folders

    def everyone(self, scope: dict) -> frozenset[str]:
        """The files in the page's own config (a component's initial value): served to every visitor."""
        blocks = getattr(scope.get("app"), "get_blocks", lambda: None)()
        config = getattr(blocks, "config", None)
        if self._everyone[0] is not config:  # set once by launch(), again only by a reload
            self._everyone = (config, frozenset(target(p) for p in file_paths(config)))
        return self._everyone[1]

    def _recording(self, send: Callable[..., Any], visitor: str, upload: bool) -> Callable[..., Any]:
        """`send`, granting this visitor the files each answer hands them before they can ask for one."""
        reader = AnswerPaths(upload)

        async def recording(message: dict) -> None:
            if visitor:
                for path in reader.read(message):
                    self.owners.grant(visitor, target(path))
            await send(message)

        return recording


class AnswerPaths:
    """The file paths one answer hands its visitor, read as it streams: a successful JSON answer whole (at most
    SCANNED bytes), an event stream line by line (a line over SCANNED is skipped, the stream read on: it can last
    for hours)."""

    def __init__(self, upload: bool = False) -> None:
        self.upload = upload
        self.kind = b""
        self.pending = bytearray()
        self.skipping = False

    def read(self, message: dict) -> list[str]:
        if message["type"] == "http.response.start":
            kinds = [v for k, v in message.get("headers", []) if k.lower() == b"content-type"]
            kind = kinds[0].split(b";")[0].strip().lower() if kinds else b""
            ok = 200 <= message.get("status", 200) < 300 and kind in (b"application/json", b"text/event-stream")
            self.kind = kind if ok else b""
            return []
        if message["type"] != "http.response.body" or not self.kind:
            return []
        chunk, more = message.get("body", b""), message.get("more_body", False)
        if self.kind == b"application/json":
            self.pending.extend(chunk)
            if len(self.pending) > SCANNED:
                self.kind = b""  # too large to read for paths: its files are not served
                self.pending.clear()
                return []
            return [] if more else self._take(answer_paths(bytes(self.pending), self.upload))
        if self.skipping:
            newline = chunk.find(b"\n")
            if newline < 0:
                return []
            chunk, self.skipping = chunk[newline + 1:], False
        self.pending.extend(chunk)
        found: list[str] = []
        end = self.pending.rfind(b"\n")
        if end >= 0:
            for line in bytes(self.pending[:end]).split(b"\n"):
                found += event_paths(line.rstrip(b"\r"))
            del self.pending[:end + 1]
        if len(self.pending) > SCANNED:
            self.pending.clear()
            self.skipping = True
        elif not more:
            found += self._take(event_paths(bytes(self.pending)))
        return found

    def _take(self, found: list[str]) -> list[str]:
        self.pending.clear()
        return found


def _private(send: Callable[..., Any]) -> Callable[..., Any]:
    """A visitor's file is never kept by a shared cache in front of the Space for the next person asking."""
    async def private(message: dict) -> None:
        if message["type"] == "http.response.start":
            kept = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"cache-control"]
            message = {**message, "headers": kept + [(b"cache-control", b"private, no-store")]}
        await send(message)

    return private
