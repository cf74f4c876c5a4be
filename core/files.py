"""Small helpers for every module that writes, replaces or deletes folders: markers, atomic writes, disk-full text.

memtune deletes, replaces or resumes into a folder only when it carries memtune's own marker (`.memtune.json`,
written when memtune created the folder). Paths are resolved (`..`, symlinks) once, by `target`, before any check,
so a check and the action that follows it always look at the same folder. A copied `.memtune.json` makes memtune
treat a folder as its own: the marker is the only thing that counts.

- `target(path, action)`: the one resolver every create / replace / delete calls first.

- `write_marker(folder, kind)`, `marker(folder)`, `require_marker(folder, kinds, action)`.
- `atomic_write_text(path, text)`: temp file + rename: never a 0-byte or half file under the final name.
- `move_into_place(tmp, final)`: replace a folder by renames; `recover(final)` finishes or undoes a crash.
- `storage_message(exc, folder)`: "no space left in FOLDER" and friends, for OSErrors a user can act on.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Iterable

from core.messages import Keyed, Said

MARKER = ".memtune.json"
MEMTUNE_VERSION = "0.9"
KINDS = ("run", "adapter", "merged", "export")


class RefusedError(Keyed, RuntimeError):
    """memtune refused to touch a folder it did not make; the message names the folder and why (keyed when given as
    a Said: a page says it in its language)."""

    def __init__(self, message: str) -> None:
        super().__init__(self._keyed(message.key, message.params) if isinstance(message, Said) else message)


class StorageError(OSError):
    """Writing failed for a reason the user can fix (disk full, read-only, no permission); the message says which."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def real(path: str | Path) -> Path:
    """The path with `~`, `..` and symlinks resolved: what a check and the action after it both act on."""
    return Path(os.path.realpath(os.path.expanduser(str(path))))


MAX_LINKS = 40  # what Linux allows (ELOOP): a longer chain is a loop
NAME_MAX = 255  # bytes in one file or folder name on Linux, macOS and Windows file systems (ENAMETOOLONG beyond)


def _inside_ours(folder: str) -> str | None:
    """The nearest folder at or above `folder` that carries memtune's marker, or None."""
    here = Path(folder)
    for p in (here, *here.parents):
        if marker(p) is not None:
            return str(p)
    return None


def _walk(path: str, start: str, hops: list[int]) -> str:
    """Resolve `path` component by component from `start` (like the kernel and os.path.realpath), refusing a link
    that sits inside a folder memtune made."""
    current = "/" if path.startswith("/") else start
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)  # `current` is already physical: its parent is the real parent
            continue
        step = os.path.join(current, part)
        if os.path.islink(step):
            ours = _inside_ours(current)
            if ours is not None:
                raise RefusedError(Said("files.refused.link_inside", path=step, ours=str(ours)))
            hops[0] += 1
            if hops[0] > MAX_LINKS:
                raise RefusedError(Said("files.refused.link_loop", path=step))
            step = _walk(os.readlink(step), current, hops)
        current = step
    return current


def target(path: str | Path, action: str | Said = "write", folder: bool = True) -> Path:
    """THE resolver of every path memtune creates, replaces or deletes: call it before any check, then use only
    what it returns.

    Relative paths are taken from the current folder, `~` is expanded, links and `..` are followed exactly as
    os.path.realpath does (`missing/../victim` is `victim`), so the check and the action see the same folder. A
    link inside a folder memtune made (RUN/merged planted as a link) is refused, and so (folder=True) is a path
    that names a file where a folder is expected. RefusedError names the path; `action` says what was wanted (a
    files.action.* Said, so a page says the refusal in its language).
    """
    if not str(path).strip():
        raise RefusedError(Said("files.refused.empty", action=action))
    long = next((part for part in Path(os.fspath(path)).parts if len(os.fsencode(part)) > NAME_MAX), None)
    if long is not None:  # else ENAMETOOLONG from the first mkdir, as a traceback
        raise RefusedError(Said("files.refused.long_name", name=long[:40], action=action,
                                bytes=len(os.fsencode(long)), max=NAME_MAX))
    resolved = Path(os.path.realpath(_walk(os.path.expanduser(os.fspath(path)), os.getcwd(), [0])))
    if folder and os.path.lexists(resolved) and not resolved.is_dir():
        raise RefusedError(Said("files.refused.is_file", path=str(resolved), action=action))
    return resolved


# --- markers ---------------------------------------------------------------------------------------------------
def write_marker(folder: str | Path, kind: str, **extra: Any) -> Path:
    """Mark `folder` as made by memtune (kind: run | adapter | merged | export)."""
    assert kind in KINDS, kind
    info = {"kind": kind, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "memtune": MEMTUNE_VERSION, **extra}
    return atomic_write_text(Path(folder) / MARKER, json.dumps(info, indent=2))


def marker(folder: str | Path) -> dict[str, Any] | None:
    """The folder's memtune marker, or None when the folder is not memtune's (or the marker is unreadable)."""
    try:
        data = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") in KINDS else None


def has_marker(folder: str | Path, kinds: str | Iterable[str]) -> bool:
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    m = marker(folder)
    return m is not None and m["kind"] in kinds


def require_marker(folder: str | Path, kinds: str | Iterable[str], action: str | Said) -> Path:
    """The resolved folder if it carries a marker of one of `kinds`; else RefusedError naming it."""
    path = target(folder, action)
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    if not has_marker(path, kinds):
        found = marker(path)
        if found:
            raise RefusedError(Said("files.refused.other_kind", path=str(path), found=found["kind"],
                                    kinds="/".join(kinds), action=action))
        raise RefusedError(Said("files.refused.no_marker", path=str(path), marker=MARKER, action=action))
    return path


# --- writing ---------------------------------------------------------------------------------------------------
def _errno(exc: BaseException) -> int | None:
    """The OS error number of an OSError, or of a library error that wraps one in its text (safetensors writes
    through Rust and raises SafetensorError("... No space left on device (os error 28)"))."""
    if isinstance(exc, OSError):
        return exc.errno
    found = re.search(r"\(os error (\d+)\)", str(exc))
    if found:
        return int(found.group(1))
    return errno.ENOSPC if "No space left on device" in str(exc) else None


LOW_DISK_BYTES = 16 * 2**20  # a failed write with less free space than this was, in practice, a full disk


WRITE_FAILURES = ("write failed", "iostream error", "unexpected pos")  # what torch.save says, without an errno


def _chain(exc: BaseException | None):
    seen = 0
    while exc is not None and seen < 8:
        yield exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1


def _full_disk(exc: BaseException, folder: str | Path) -> bool:
    """torch.save reports a full disk without an errno: call it that when it failed writing and the disk is full."""
    if not any(s in str(e) for e in _chain(exc) for s in WRITE_FAILURES):
        return False
    try:
        return shutil.disk_usage(folder).free < LOW_DISK_BYTES
    except OSError:
        return False


def storage_message(exc: BaseException, folder: str | Path) -> Said | None:
    """A plain sentence for the write errors a user can fix, naming the folder (keyed: log.disk_full, log.read_only,
    log.no_permission); None for anything else."""
    code = next((c for c in map(_errno, _chain(exc)) if c is not None), None)
    if code in (errno.ENOSPC, errno.EDQUOT) or (code is None and _full_disk(exc, folder)):
        return Said("log.disk_full", path=str(folder))
    if code == errno.EROFS:
        return Said("log.read_only", path=str(folder))
    if code in (errno.EACCES, errno.EPERM):
        return Said("log.no_permission", path=str(folder))
    return None


def storage_error(exc: BaseException, folder: str | Path) -> BaseException:
    """StorageError with the plain message when there is one, else the original error."""
    message = storage_message(exc, folder)
    return StorageError(_errno(exc) or 0, message) if message else exc


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to a temp file next to `path`, then rename it over `path`: readers see old or new, never half.

    A failure (disk full) removes the temp file and leaves any earlier `path` as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise storage_error(exc, path.parent) from None
    return path


def plain_mode(folder: str | Path, pattern: str) -> None:
    """Give the files of `folder` matching `pattern` the mode every other file there has (what open() gives under
    the umask, 0644 for most): safetensors writes its files 0600, readable by their owner alone."""
    folder = Path(folder)
    probe = folder / ".memtune-mode"
    probe.write_bytes(b"")
    try:
        mode = probe.stat().st_mode & 0o777
    finally:
        probe.unlink()
    for path in folder.glob(pattern):
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)


def tmp_for(final: str | Path) -> Path:
    """Where a folder is written before it is renamed to `final` (same parent: the rename is atomic)."""
    final = target(final, folder=False)
    return final.parent / f".{final.name}.tmp"


def _old_for(final: Path) -> Path:
    return final.parent / f".{final.name}.old"


def _ours(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and marker(path) is not None


def recover(final: str | Path) -> str | None:
    """Tidy what a crash in `move_into_place(…, final)` or while writing `tmp_for(final)` left behind.

    A crash between the two renames leaves `.NAME.old` and no NAME: the old folder is put back. After the second
    rename, a left `.NAME.old` is deleted; a left `.NAME.tmp` is a half-written folder and is deleted. Only
    folders carrying memtune's marker are touched (writers mark a temp folder first, before filling it).
    Returns what was done, or None. Call it before writing `final` again, and when a run folder is next opened.
    """
    final = target(final, folder=False)
    old, tmp = _old_for(final), tmp_for(final)
    done = []
    if _ours(old) and not os.path.lexists(final):
        os.replace(old, final)
        done.append(f"restored {final} from an interrupted replace")
    elif _ours(old):
        shutil.rmtree(old, ignore_errors=True)
        done.append(f"removed the leftover {old.name}")
    if _ours(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        done.append(f"removed the half-written {tmp.name}")
    return "; ".join(done) or None


def make_tmp(final: str | Path, kind: str) -> Path:
    """A fresh, marked temporary folder to write `final` into (marked first, so a crash leaves it recoverable)."""
    tmp = tmp_for(final)
    if os.path.lexists(tmp):
        if not _ours(tmp):
            raise RefusedError(Said("files.refused.in_way", path=str(tmp)))
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    write_marker(tmp, kind)
    return tmp


def move_into_place(tmp: str | Path, final: str | Path) -> Path:
    """Replace `final` with the fully written folder `tmp` by renames, so readers never see half a folder.

    Both paths are resolved first: `/a/x/../x` would otherwise rename through a parent that the first rename just
    moved away. Returns the resolved final path; leaves no `.old` folder behind.
    """
    tmp, final = target(tmp), target(final)
    old = _old_for(final)
    if os.path.lexists(old):
        if not _ours(old):
            raise RefusedError(Said("files.refused.in_way", path=str(old)))
        if not os.path.lexists(final):
            os.replace(old, final)  # an earlier crash between the renames: that folder is the current one
        else:
            shutil.rmtree(old)
    if os.path.lexists(final):
        os.replace(final, old)
        try:
            os.replace(tmp, final)
        except OSError:
            os.replace(old, final)  # put the previous one back: nothing lost
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    return final


def remove_tree(path: str | Path) -> None:
    """Delete a folder memtune made by renaming it to a hidden name first: gone from every list at once."""
    path = target(path, "delete")
    trash = path.parent / f".{path.name}.deleting"
    n = 0
    while os.path.lexists(trash) and not _ours(trash):  # someone's own folder of that name: never ours to delete
        n += 1
        trash = path.parent / f".{path.name}.{n}.deleting"
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def long_lived():
    """What is made inside lives as long as the process (the libraries' modules, the page): no collection while it is
    made, and afterwards it sits in gc's permanent generation, which every later collection skips. torch,
    transformers, trl and gradio make ~600k such objects; each full collection walked them all again (~0.4 s), a
    dozen times while they are imported, then twice per run (the Trainer's accelerator.free_memory, free_memory)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def free_memory() -> None:
    """Collect dropped models and hand cached CUDA blocks back, so the next model can use the memory."""
    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
