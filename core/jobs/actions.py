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

The estimate's inspect children (Inspections: the run resolved and its layers measured, on the CPU) run beside that
rule, deduplicated per settings and bounded per owner and in all; so do the data previews' children (the tokenizer
loaded and the rows planned, on the CPU), as many as the page's preview queue lets through, each as its visitor.
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
from typing import Any, Callable

import psutil

from core.messages import Said, keyed
from core.runs.events import EventList, EventTail, make_event
from core.jobs import warm
from core.jobs.supervise import PARENT_ENV, Child, exit_text, log_tail
from core.runs.public import VISITOR_ENV

ACT_CLI = [sys.executable, "-m", "core.jobs.act"]
ROOT = Path(__file__).resolve().parents[2]
LOG_FILE = "action.log"
POLL_S = 0.1
KINDS = ("try", "merge", "gguf")
INSPECT = "inspect"  # the estimate's measurements (Inspections below): CPU only, beside the GPU's one action
PREVIEW = "preview"  # the data preview (Actions.preview): CPU only, bounded by the page's own queue


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

    def ask(self, image: str | None = None, **request: Any) -> int:
        """Try it: hand the child one prompt (atomically: it never reads half a file); returns its number. `image`
        (a file path) is copied into the child's folder first: the child reads its own copy, whatever becomes of the
        page's upload."""
        n = next(self._requests)
        inbox = self.folder / "requests"
        inbox.mkdir(exist_ok=True)
        if image:
            kept = inbox / f"{n:06d}-image{Path(image).suffix.lower()[:8]}"
            shutil.copyfile(image, kept)
            request["image"] = str(kept)
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
        self.inspections = Inspections(self._program)  # the estimate's measurements: beside the rule above
        self._previews: set[Action] = set()  # running preview children (shutdown ends them)
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

    def preview(self, config: dict[str, Any], owner: str | None = None) -> Action:
        """Start a data preview's child for `config` (a TrainConfig's dict); `owner`, a public Space's visitor
        (core.runs.public.visitor()), is whose folders it reads (VISITOR_ENV). Beside the one-action rule: the page's
        preview queue bounds how many run at once; the caller waits for its `done` (the answer is in it)."""
        action = Action(id=next(self._ids), kind=PREVIEW, params={"config": config}, owner=owner)
        with self._lock:
            self._previews.add(action)
        spawn_child(action, self._program, self._preview_ended, visitor=owner)
        return action

    def _preview_ended(self, action: Action) -> None:
        with self._lock:
            self._previews.discard(action)

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
        spawn_child(action, self._program, self._ended)  # under the lock: its end waits for the line below
        self._live.append(action)
        self._last[(owner, kind)] = action
        return action

    def _ended(self, action: Action) -> None:
        with self._lock:
            if action in self._live:
                self._live.remove(action)

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
        self.inspections.shutdown()
        with self._lock:
            ending = [*self._live, *self._previews]
        for action in ending:
            if action.running and action._child is not None:
                action._child.end("shutdown")
                action.wait(10)

    # --- what the page reads ------------------------------------------------------------------------------------
    def busy(self) -> bool:
        """A merge or GGUF export is working (training waits for it; an idle Try it child does not count)."""
        return any(a.running and a.kind != "try" for a in list(self._live))

class Inspections:
    """The estimate's inspect children (`python -m core.jobs.act`, kind "inspect": the run resolved on the meta device,
    the layers it needs measured into core.estimate.measure's disk cache), so that the web server never builds a
    model. Thread-safe and bounded: one child per key (a config's digest) however many pages ask; one pending request
    per owner (a newer one supersedes it: its child is ended or its place in the queue taken); at most `running`
    children at once and `queued` requests waiting, beyond which a request is refused (the page keeps the formula).
    Answers (the child's `done` event) are kept for the last `kept` keys."""

    def __init__(self, program: list[str] | None = None, running: int = 1, queued: int = 16, kept: int = 256) -> None:
        self._program = list(program or ACT_CLI)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._limits = (running, queued, kept)
        self._running: list[Action] = []
        self._queue: list[Action] = []  # not started yet, oldest first
        self._by_key: dict[str, Action] = {}  # the newest request of each key, answered or not (oldest first)
        self._pending: dict[str | None, Action] = {}  # owner -> their request not answered yet
        self._answers: dict[str, Action] = {}  # params["base"] (the settings) -> the newest answered request
        self._wake = threading.Condition(self._lock)
        self._starter: threading.Thread | None = None
        self._closed = False

    def request(self, key: str, params: dict[str, Any], owner: str | None = None) -> Action | None:
        """The inspection of `key`: the one asked already (running, queued or answered), else a new one; None when
        the queue is full."""
        running, queued, kept = self._limits
        with self._lock:
            known = self._by_key.get(key)
            if known is not None and not (known.finished and known.stopped):
                return known
            older = self._pending.get(owner)
            if older is not None and older.running:
                self._drop(older)
            if len(self._queue) >= queued:
                return None
            action = Action(id=next(self._ids), kind=INSPECT, params=params, owner=owner, key=(key,))
            self._by_key.pop(key, None)
            self._by_key[key] = action
            while len(self._by_key) > kept:
                self._by_key.pop(next(iter(self._by_key)))
            self._pending[owner] = action
            self._queue.append(action)
            self._start_queued()
            return action

    def get(self, key: str) -> Action | None:
        with self._lock:
            return self._by_key.get(key)

    def answer(self, base: str) -> Action | None:
        """The newest finished, not superseded, inspection of the settings `base` (its params["base"])."""
        with self._lock:
            return self._answers.get(base)

    def _drop(self, action: Action) -> None:
        """Under the lock: a superseded request, ended (its child) or taken out of the queue (ended as stopped)."""
        action.stopped = True
        if action in self._queue:
            self._queue.remove(action)
            action.emit(make_event("done", status="stopped", message=""))
            action.finished = time.time()
            action._ended.set()
        elif action._child is not None:
            action._child.kill("replaced")
        if self._by_key.get(action.key[0]) is action:
            del self._by_key[action.key[0]]

    def _start_queued(self) -> None:
        """Under the lock: wake the starter. Children are started by one long-lived thread: a cold child's
        PR_SET_PDEATHSIG follows the thread that started it, and a follower or a request's thread ends."""
        if self._starter is None:
            self._starter = threading.Thread(target=self._start_loop, daemon=True, name="memtune-inspect-starter")
            self._starter.start()
        self._wake.notify()

    def _start_loop(self) -> None:
        with self._wake:
            while not self._closed:
                while self._queue and len(self._running) < self._limits[0]:
                    action = self._queue.pop(0)
                    self._running.append(action)
                    try:
                        spawn_child(action, self._program, self._ended)
                    except Exception as exc:  # noqa: BLE001 - no child (out of processes): this request fails, named
                        self._running.remove(action)
                        action.emit(make_event("error", error_type="died", what=INSPECT,
                                               **keyed("action.died", what=Said("action.what.inspect"), how=str(exc))))
                        action.emit(make_event("done", status="failed", message=str(exc)))
                        action.finished = time.time()
                        action._ended.set()
                self._wake.wait()

    def _ended(self, action: Action) -> None:
        with self._lock:
            if action in self._running:
                self._running.remove(action)
            if self._pending.get(action.owner) is action:
                del self._pending[action.owner]
            if not action.stopped and "base" in action.params:
                self._answers.pop(action.params["base"], None)
                self._answers[action.params["base"]] = action
                while len(self._answers) > self._limits[2]:
                    self._answers.pop(next(iter(self._answers)))
            self._start_queued()

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._wake.notify()
            running = list(self._running)
        for action in running:
            if action._child is not None:
                action._child.end("shutdown")
                action.wait(10)


def spawn_child(action: Action, program: list[str], ended: Callable[[Action], None], visitor: str | None = None) -> None:
    """Start `action`'s child (`program --dir FOLDER`, forked warm where it may be) and follow its events; `ended` is
    called once it is over, whatever ended it. `visitor`: the public Space's visitor it acts for (VISITOR_ENV: it
    reads and writes only their folders); None: the app's own, never a visitor left in the app's environment."""
    kind = action.kind
    action.folder = Path(tempfile.mkdtemp(prefix=f"memtune-{kind}-"))
    spec = {"kind": kind, "params": action.params, "app": this_app()}  # `app`: whose folder it is (sweep_orphans)
    (action.folder / "action.json").write_text(json.dumps(spec), encoding="utf-8")
    starting = make_event("phase", phase="starting", progress=None, what=kind,
                          **keyed("action.starting", what=Said(f"action.what.{kind}")))
    action.emit(starting)
    events = action.folder / "events.jsonl"
    events.touch()
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env[PARENT_ENV] = str(os.getpid())
    env.pop(VISITOR_ENV, None)
    if visitor is not None:
        env[VISITOR_ENV] = visitor
    argv = [*program, "--dir", str(action.folder)]
    # Stop ends the child (there is nothing to save halfway through a merge or an answer): no stop-file
    # deadlines, so ack_s/finish_s are never reached; die_with_parent: the app's death ends it too.
    if program == ACT_CLI and warm.enabled():  # forked from the libraries already imported (a Try it
        # answers seconds sooner); a fresh interpreter where the fork server's state says so (core/jobs/warm.py)
        action._child = Child(warm.spawn(argv, env, str(action.folder / LOG_FILE), die_with_parent=True),
                              action.folder / "STOP", ack_s=0.0, finish_s=0.0)
    else:
        with open(action.folder / LOG_FILE, "ab") as log:
            action._child = Child.spawn(argv, action.folder / "STOP", ack_s=0.0, finish_s=0.0, log=log, env=env,
                                        die_with_parent=True)
    action.pid = action._child.pid
    threading.Thread(target=_follow, args=(action, EventTail(events), ended), daemon=True,
                     name=f"memtune-{kind}-{action.id}").start()


def _follow(action: Action, tail: EventTail, ended: Callable[[Action], None]) -> None:
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
        ended(action)  # first: whoever sees it finished finds it where it is kept (Inspections.answer)
        action.finished = time.time()
        action._ended.set()
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
        if folder.name.split("-")[1] not in (*KINDS, INSPECT, PREVIEW) or not folder.is_dir():
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
