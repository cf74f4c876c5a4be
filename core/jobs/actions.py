"""The app's model-running actions (Try it, merge, GGUF export), each in a child process (no torch, no gradio here).

The web server never loads a model: an action is `python -m core.jobs.act --dir DIR` (core/jobs/act.py), started
(forked warm from the libraries already imported, as a training run is: core/jobs/warm.py) and ended by the one
supervisor (core.jobs.supervise.Child), its events followed from
DIR/events.jsonl by an EventTail into the action's in-memory list, which the page's handler reads. A child that dies
without its `done` event (SIGKILL, out of memory, a crash in a library) becomes a failed action: an `error` event
(error_type "died") and `done`, whose message the page shows; the app keeps serving and the next action starts a
fresh child.

The GPU is one, so one action runs at a time. A Try it child stays loaded between prompts (same owner, same adapter,
same weights): any other action first ends it. A merge or GGUF export in progress refuses another action
(ActionBusy). `owner` is the public mode's visitor: Stop and reuse apply to that owner's own action only.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from core.messages import Said, keyed
from core.runs.events import EventList, EventTail, make_event
from core.jobs import warm
from core.jobs.supervise import PARENT_ENV, Child, exit_text, log_tail

ACT_CLI = [sys.executable, "-m", "core.jobs.act"]
ROOT = Path(__file__).resolve().parents[2]
LOG_FILE = "action.log"
POLL_S = 0.1
KINDS = ("try", "merge", "gguf")


class ActionBusy(RuntimeError):
    """Another model-running action holds the machine; the message says which, `what` its kind."""

    def __init__(self, message: str, what: str) -> None:
        super().__init__(message)
        self.what = what


@dataclass(eq=False)
class Action(EventList):
    id: int
    kind: str
    params: dict[str, Any]
    owner: str | None = None
    folder: Path | None = None
    key: tuple | None = None  # Try it: what the loaded child answers for (adapter, its weights' mtime, trust)
    events: list[dict[str, Any]] = field(default_factory=list)
    finished: float | None = None
    stopped: bool = False  # ended by the user's Stop
    pid: int | None = None
    _child: Child | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _ended: threading.Event = field(default_factory=threading.Event, repr=False)
    _requests: Any = field(default_factory=lambda: itertools.count(1), repr=False)

    @property
    def running(self) -> bool:
        return self.finished is None

    @property
    def ending(self) -> bool:
        """Its child was told to end (Stop, or room for another action): never handed a new prompt."""
        return self._child is not None and self._child.kill_at is not None

    @property
    def answering(self) -> bool:
        """A Try it child with a request not yet answered (or still loading)."""
        if not self.running:
            return False
        with self._lock:
            asked = max((e.get("request", 0) for e in self.events if e.get("kind") == "asked"), default=0)
            answered = max((e.get("request", 0) for e in self.events if e.get("kind") == "answered"), default=0)
            ready = any(e.get("phase") == "ready" for e in self.events)
        return not ready or asked > answered

    def wait(self, timeout: float | None = None) -> bool:
        self._ended.wait(timeout)
        return not self.running

    def result(self) -> dict[str, Any] | None:
        """The `done` event, once there is one."""
        with self._lock:
            return next((e for e in reversed(self.events) if e.get("kind") == "done"), None)

    def ask(self, **request: Any) -> int:
        """Try it: hand the child one prompt (atomically: it never reads half a file); returns its number."""
        n = next(self._requests)
        inbox = self.folder / "requests"
        inbox.mkdir(exist_ok=True)
        tmp = inbox / f".{n:06d}.tmp"
        tmp.write_text(json.dumps({"request": n, **request}), encoding="utf-8")
        self.emit(make_event("asked", request=n))
        tmp.rename(inbox / f"{n:06d}.json")
        return n


class Actions:
    """Every model-running child of the app. Thread-safe. `program`: what the child runs, followed by `--dir DIR`."""

    def __init__(self, program: list[str] | None = None) -> None:
        self._program = list(program or ACT_CLI)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._live: list[Action] = []  # running actions (one at a time, by the rule above)
        self._last: dict[tuple[str | None, str], Action] = {}  # (owner, kind) -> the newest
        sweep_orphans()

    # --- control ------------------------------------------------------------------------------------------------
    def start(self, kind: str, params: dict[str, Any], owner: str | None = None) -> Action:
        """Start a merge or GGUF export (ActionBusy while another action works; an idle Try it child is ended)."""
        if kind not in KINDS:
            raise ValueError(f"unknown action {kind!r}")
        with self._lock:
            self._make_room(owner)
            return self._launch(kind, params, owner)

    def try_child(self, adapter: str, trust_remote_code: bool = False, owner: str | None = None) -> Action:
        """The Try it child for this adapter: the loaded one when it is the same (owner, adapter, weights, trust),
        else a fresh one (the old one ended first: one model in memory)."""
        key = try_key(adapter, trust_remote_code)
        with self._lock:
            for action in self._live:
                if (action.kind == "try" and action.owner == owner and action.key == key and action.running
                        and not action.ending):
                    if action.answering:
                        raise ActionBusy(keyed("action.busy_try")["message"], "try")
                    return action
            self._make_room(owner)
            action = self._launch("try", {"adapter": adapter, "trust_remote_code": bool(trust_remote_code)}, owner)
            action.key = key
            return action

    def _make_room(self, owner: str | None) -> None:
        """Under the lock: end idle Try it children; refuse while another action works."""
        for action in list(self._live):
            if not action.running:
                self._live.remove(action)
            elif action.ending:  # on its way out (SIGKILL after the grace): its memory is being given back
                continue
            elif action.kind == "try" and not action.answering:
                self._end(action, stopped=False)
            else:
                raise ActionBusy(keyed("action.busy", what=Said(f"action.what.{action.kind}"))["message"], action.kind)

    def _launch(self, kind: str, params: dict[str, Any], owner: str | None) -> Action:
        action = Action(id=next(self._ids), kind=kind, params=params, owner=owner)
        action.folder = Path(tempfile.mkdtemp(prefix=f"memtune-{kind}-"))
        spec = {"kind": kind, "params": params, "app": this_app()}  # `app`: whose folder it is (sweep_orphans)
        (action.folder / "action.json").write_text(json.dumps(spec), encoding="utf-8")
        starting = make_event("phase", phase="starting", progress=None, what=kind,
                              **keyed("action.starting", what=Said(f"action.what.{kind}")))
        action.emit(starting)
        events = action.folder / "events.jsonl"
        events.touch()
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        env[PARENT_ENV] = str(os.getpid())
        argv = [*self._program, "--dir", str(action.folder)]
        # Stop ends the child (there is nothing to save halfway through a merge or an answer): no stop-file
        # deadlines, so ack_s/finish_s are never reached; die_with_parent: the app's death ends it too.
        if self._program == ACT_CLI and warm.enabled():  # forked from the libraries already imported (a Try it
            # answers seconds sooner); a fresh interpreter where the fork server's state says so (core/jobs/warm.py)
            action._child = Child(warm.spawn(argv, env, str(action.folder / LOG_FILE), die_with_parent=True),
                                  action.folder / "STOP", ack_s=0.0, finish_s=0.0)
        else:
            with open(action.folder / LOG_FILE, "ab") as log:
                action._child = Child.spawn(argv, action.folder / "STOP", ack_s=0.0, finish_s=0.0, log=log, env=env,
                                            die_with_parent=True)
        action.pid = action._child.pid
        self._live.append(action)
        self._last[(owner, kind)] = action
        threading.Thread(target=self._follow, args=(action, EventTail(events)), daemon=True,
                         name=f"memtune-{kind}-{action.id}").start()
        return action

    def stop(self, owner: str | None = None, kind: str | None = None) -> Action | None:
        """End `owner`'s running action (of `kind`): its child is ended at once; None if there is none."""
        with self._lock:
            action = next((a for a in self._live if a.running and a.owner == owner and kind in (None, a.kind)), None)
        if action is not None:
            self._end(action, stopped=True)
        return action

    def free(self) -> None:
        """Before a training run: end every idle Try it child, so the run has the memory."""
        with self._lock:
            for action in list(self._live):
                if action.kind == "try" and action.running:
                    self._end(action, stopped=False)

    def _end(self, action: Action, stopped: bool) -> None:
        action.stopped = action.stopped or stopped
        if action._child is not None:
            action._child.kill("stopped" if stopped else "replaced")  # SIGTERM now, SIGKILL after the grace

    def shutdown(self) -> None:
        for action in list(self._live):
            if action.running and action._child is not None:
                action._child.end("shutdown")
                action.wait(10)

    # --- what the page reads ------------------------------------------------------------------------------------
    def busy(self) -> bool:
        """A merge or GGUF export is working (training waits for it; an idle Try it child does not count)."""
        return any(a.running and a.kind != "try" for a in list(self._live))

    # --- the child ----------------------------------------------------------------------------------------------
    def _follow(self, action: Action, tail: EventTail) -> None:
        child = action._child

        def take() -> None:
            for e in tail.read():
                action.emit(e)

        try:
            child.follow(take, POLL_S)
            if action.result() is None:
                action.emit(make_event("error", error_type="stopped" if action.stopped else "died", what=action.kind,
                                       **death(action, child)))
                error = action.events_since(len(action.events) - 1)[0]
                action.emit(make_event("done", status="stopped" if action.stopped else "failed",
                                       message=error["message"]))
        finally:
            action.finished = time.time()
            action._ended.set()
            with self._lock:
                if action in self._live:
                    self._live.remove(action)
            shutil.rmtree(action.folder, ignore_errors=True)


def this_app() -> dict[str, float]:
    """This process as an action folder records its owner: the pid and its start time (a pid is reused)."""
    me = psutil.Process()
    return {"pid": me.pid, "started": me.create_time()}


def _alive(app: dict) -> bool:
    """The app process `app` names still runs (its pid, started when recorded); True where that cannot be told."""
    try:
        return abs(psutil.Process(int(app["pid"])).create_time() - float(app["started"])) < 1.0
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, KeyError, TypeError, ValueError):
        return True


def sweep_orphans(where: Path | None = None) -> list[Path]:
    """Remove the action folders (a merged model, a GGUF, a Try it child's requests) of app processes that are gone:
    an app killed mid-action never reached `_follow`'s cleanup (its children die with it). Only folders whose
    action.json names a dead app are touched: another app on this machine, live, keeps its own, and a folder that
    names no app is left alone. Returns the removed folders."""
    removed = []
    for folder in Path(where or tempfile.gettempdir()).glob("memtune-*-*"):
        if folder.name.split("-")[1] not in KINDS or not folder.is_dir():
            continue
        try:
            app = json.loads((folder / "action.json").read_text(encoding="utf-8")).get("app")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(app, dict) and "pid" in app and not _alive(app):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def death(action: Action, child: Child) -> dict[str, Any]:
    """Why the child ended without its `done` event, as an event's words (keyed)."""
    what = Said(f"action.what.{action.kind}")  # nested: the page says it in its language too
    how = exit_text(child.proc.returncode)
    if action.stopped:
        return keyed("action.stopped", what=what)
    if child.kill_reason == "replaced":
        return keyed("action.replaced", what=what)
    code = child.proc.returncode
    oom = code is not None and code < 0 and -code == signal.SIGKILL
    words = keyed("action.died_oom" if oom else "action.died", what=what, how=how)
    tail = log_tail(action.folder / LOG_FILE)  # the page shows it under the message (a library's last words)
    return {**words, "message": words["message"] + (f"\n{tail}" if tail else ""), "tail": tail}


def try_key(adapter: str, trust_remote_code: bool) -> tuple:
    # The path and the weights' mtime: a run resumed to completion rewrites the same folder with new weights.
    weights = Path(adapter) / "adapter_model.safetensors"
    with contextlib.suppress(OSError):
        return str(Path(adapter).resolve()), weights.stat().st_mtime, bool(trust_remote_code)
    return str(adapter), 0.0, bool(trust_remote_code)
