"""Training jobs for the whole app, each in its own child process (no gradio here).

The GPU is one, so the manager runs at most `slots` jobs (one) behind a lock: a second `start()` from any tab
raises `JobBusy`, or, with `queue=True` (public mode: strangers share the GPU), waits in the manager's queue and
starts when a slot is free, first come first served. A job records its `owner` (public mode: the visitor the
server issued an id to, core.runs.public.visitor) and the network `address` it came from, and `current(owner)` /
`stop(owner)` act on that owner's own job only; `owner=None` is the app's own user (or the Space owner), who sees and
stops the running one. Who may join the queue (`admission`): at most so many jobs per owner and per address, and so
many waiting in all, each refusal a JobBusy saying which limit and the queue as it stands. A visitor's child is told
whose run it is (core.runs.public.VISITOR_ENV), and checks the config again as that visitor.

A job is the same command a user runs, `python -m core.train --config RUN/config.yaml`, started
as a child process in its own session (process group): the manager chooses the run folder, writes config.yaml
there, and sends the child's stdout/stderr to RUN/train.log (a file, never an unread pipe). A thread per job follows
RUN/events.jsonl incrementally (by byte offset) into the job's in-memory event list, which every tab polls, so
closing or reloading a page never touches the run and a reloaded page reattaches by reading the same list.

Stop writes RUN/STOP; the child's callback ends after the current optimizer step and saves the adapter, and says at
once that it saw the Stop (an `ack` event). Stop pressed again is the same Stop. `end_now` (the page's confirmed
End now), no answer within STOP_ACK_S, or no end within STOP_FINISH_S after answering, kills the process group
(SIGTERM, then SIGKILL). A child that dies without a `done`
event becomes a failed run (events.jsonl and summary.json say how it died, with the end of train.log).
`shutdown()` (app exit) stops, then kills, the child: the app never leaves an orphan behind. The child process
itself (spawn, Stop and its deadlines, the failed-run record) is core/jobs/supervise.py's, shared with core/jobs/launcher.py.

What a page shows of a job is core/jobs/view.py, which reads Jobs (this module never imports it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.runs.folders import STOP_FILE
from core.config.settings import TrainConfig
from core.config.slices import Queued
from core.messages import Said, keyed
from core.runs.events import EventList, EventTail, JsonlSink, make_event, read_events
from core.jobs import warm
from core.jobs.actions import Actions
from core.jobs.supervise import PARENT_ENV, Child, torch_threads
from core.runs.public import VISITOR_ENV

CLI = [sys.executable, "-m", "core.train"]
ROOT = Path(__file__).resolve().parents[2]  # the child imports `core` from here, whatever the app's cwd
LOG_FILE = "train.log"
POLL_S = 0.25  # how often the manager reads events.jsonl and checks the child
# A healthy child answers a Stop within about a second (a thread watches for the stop file), even mid-step or while
# loading a model; no answer in 30 s means it is hung (a stuck CUDA call, a deadlock): end it.
STOP_ACK_S = 30.0
# After answering, it finishes one optimizer step and saves the adapter: minutes at most, even for 8B on one GPU.
STOP_FINISH_S = 600.0
# A child that has written its `done` event (the page says "completed") still needs a moment to exit (freeing
# CUDA, joining threads: ~0.7 s): a Start in that moment waits for it, up to this long, instead of being refused.
DONE_EXIT_WAIT_S = 30.0
SHUTDOWN_GRACE_S = 10.0  # app exit: time for the child to finish its step and save before it is killed


class JobBusy(RuntimeError):
    """A job is already running (`reason` "busy"), or the owner has as many queued or running as allowed ("yours"),
    or the asker's address has ("address"), or the queue is full ("full"); the message says which and what to do.
    A refusal said by key carries it (`key`, `params`: the page says it in its language)."""

    def __init__(self, message: str, reason: str = "busy", limit: int = 0) -> None:
        super().__init__(message)
        self.reason, self.limit = reason, limit
        self.key: str = getattr(message, "key", "")
        self.params: dict[str, Any] = dict(getattr(message, "params", {}))


def admission(active: list[tuple[str | None, str | None]], waiting: int, would_wait: bool, owner: str | None,
              address: str | None = None, per_owner: int | None = None, per_address: int | None = None,
              queue_cap: int | None = None) -> JobBusy | None:
    """Whether a job of `owner` from `address` may join: None, or the JobBusy that refuses it. `active`: (owner,
    address) of each job running or waiting; `waiting`: how many wait; `would_wait`: no slot is free for it now.
    The owner's own limit first, then the address's (one machine's throw-away cookies count together), then the
    queue's length."""
    if owner is not None and per_owner is not None:
        mine = sum(o == owner for o, _ in active)
        if mine >= per_owner:
            return JobBusy(Said("msg.own_limit", n=per_owner), "yours", per_owner)
    if address and per_address is not None:
        theirs = sum(a == address for _, a in active)
        if theirs >= per_address:
            return JobBusy(Said("msg.address_limit", n=theirs, limit=per_address, waiting=waiting), "address",
                           per_address)
    if would_wait and queue_cap is not None and waiting >= queue_cap:
        return JobBusy(Said("msg.queue_full", waiting=waiting, place=waiting + 1, limit=queue_cap), "full", queue_cap)
    return None


@dataclass
class Job(EventList):
    id: int
    config: Queued  # a TrainConfig: the manager reads its names and writes its text for the child
    started: float = field(default_factory=time.time)
    stop_event: threading.Event = field(default_factory=threading.Event)
    events: list[dict[str, Any]] = field(default_factory=list)
    finished: float | None = None
    from_disk: bool = False  # loaded from an events.jsonl of an earlier server process
    gpu_peak_gib: float = 0.0  # highest NVML "used" seen while this job ran (sampled by the gauge)
    folder: str | None = None  # the run folder, known from the start for a child job
    pid: int | None = None  # the child process (its process group has the same id)
    owner: str | None = None  # public mode: the visitor who started it; None: the app's own user
    address: str | None = None  # public mode: the network address the Start came from
    waiting: bool = False  # in the queue: no folder, no process yet
    max_s: float | None = None  # the Space owner's limit: Stopped (and saved) after this long
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _ended: threading.Event = field(default_factory=threading.Event, repr=False)  # the follower recorded the end
    _child: Child | None = field(default=None, repr=False)
    _view: Any = field(default=None, repr=False)  # core.jobs.view's running fold of the events (it sits above jobs)

    @property
    def running(self) -> bool:
        return self.finished is None and not self.from_disk and not self.waiting

    @property
    def active(self) -> bool:
        """Running or waiting in the queue: its owner may not start another, and Stop applies to it."""
        return self.running or (self.waiting and self.finished is None)

    def said_done(self) -> bool:
        """The run has reported its end (a `done` event), whether or not its process has exited yet."""
        with self._lock:
            return any(e.get("kind") == "done" for e in reversed(self.events[-3:]))

    @property
    def stopping(self) -> bool:
        return self.running and self.stop_event.is_set()

    @property
    def run_dir(self) -> str | None:
        """The run folder: chosen by the manager, or announced by the engine's first `run` event."""
        if self.folder:
            return self.folder
        with self._lock:
            return next((e.get("run_dir") for e in self.events if e.get("kind") == "run" and e.get("run_dir")), None)

    def note_gpu_used(self, used_gib: float) -> None:
        if self.running:
            self.gpu_peak_gib = max(self.gpu_peak_gib, used_gib)

    def wait(self, timeout: float | None = None) -> bool:
        """Until the job has ended (a queued one: started, then ended); whether it has."""
        if self.finished is None and not self.from_disk:  # not the follower's end: it goes on to start the next job
            self._ended.wait(timeout)
        return not self.active


class JobManager:
    """One per app (app.py builds it and hands it to the page). Thread-safe. `program`: what the child runs, followed by `--config FILE
    --run-dir DIR` (the CLI, `python -m core.train`; the UI tests give a tiny child of the same protocol)."""

    def __init__(self, program: list[str] | None = None, slots: int = 1,
                 action_program: list[str] | None = None) -> None:
        self._program = list(program or CLI)
        # Try it, merge and GGUF export: children of the same supervisor (core/jobs/actions.py), never this process.
        self.actions = Actions(action_program)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._slots = max(1, slots)  # jobs that train at once: one per GPU (one GPU today)
        self._running: list[Job] = []  # the jobs holding a slot
        self._waiting: list[Job] = []  # the queue, first in first out
        self._jobs: list[Job] = []  # the newest job of each owner, and every active one (owner lookups)
        self._job: Job | None = None  # the last job started (or loaded): what the app's own user sees
        self.seconds_per_step: float | None = None  # measured on the last run that trained: the queue's predictions

    def prepare(self) -> None:
        """Start the warm-start server now, in the background (core/jobs/warm.py), so the first Start is warm too."""
        if self._program == CLI and warm.enabled():
            warm.context()

    # --- control ----------------------------------------------------------------------------------------
    def start(self, cfg: Queued, owner: str | None = None, queue: bool = False, per_owner: int | None = None,
              max_s: float | None = None, address: str | None = None, per_address: int | None = None,
              queue_cap: int | None = None) -> Job:
        """Start `cfg` as a child process; if every slot is taken, raise JobBusy, or with `queue` put it in the queue.
        `per_owner`: how many queued or running jobs one owner may have (JobBusy "yours" beyond); `per_address`:
        likewise from one network `address` ("address"); `queue_cap`: how many may wait ("full"); `max_s`: the job
        is Stopped after this long.

        A run that cannot even be started (its folder cannot be made, Python cannot be run) is returned as a
        failed job whose message says why, like any other failed run.
        """
        with self._lock:
            for old in self._running:
                if old.running and old.said_done():
                    old.wait(DONE_EXIT_WAIT_S)  # finished, only its process is still exiting
            self._running = [j for j in self._running if j.running]
            free = len(self._running) < self._slots and not self._waiting
            refused = admission([(j.owner, j.address) for j in self._running + self._waiting], len(self._waiting),
                                not free, owner, address, per_owner, per_address, queue_cap)
            if refused is not None:
                raise refused
            if not free and not queue:
                job = self._running[0]
                raise JobBusy(Said("msg.one_job", model=job.config.model))
            job = Job(id=next(self._ids), config=cfg, owner=owner, max_s=max_s, waiting=not free, address=address)
            self._jobs = [j for j in self._jobs if j.owner != owner or j.active] + [job]
            if job.waiting:
                self._waiting.append(job)
                return job
            self._launch(job)
            return job

    def _launch(self, job: Job) -> None:
        """Under the lock: give `job` a slot and start its child (or record why it could not start)."""
        job.waiting = False
        job.started = time.time()
        self._running.append(job)
        self._job = job
        try:
            tail = self._spawn(job)
        except Exception as exc:  # noqa: BLE001 - e.g. a folder that cannot be made: a failed run, not a crash
            words = keyed("log.not_started", error=str(exc))
            job.emit(make_event("error", error_type="other", **words))
            job.emit(make_event("done", status="failed", run_dir=job.folder, summary={}, **words))
            job.finished = time.time()
            job._ended.set()
            self._running.remove(job)
            return
        job._thread = threading.Thread(target=self._follow, args=(job, tail), name=f"memtune-job-{job.id}",
                                       daemon=True)
        job._thread.start()
        if job.max_s:
            timer = threading.Timer(job.max_s, self._time_up, args=(job,))
            timer.daemon = True
            timer.start()

    def _dispatch(self) -> None:
        """A slot came free: start the jobs waiting longest."""
        with self._lock:
            self._running = [j for j in self._running if j.running]
            while self._waiting and len(self._running) < self._slots:
                self._launch(self._waiting.pop(0))

    def _time_up(self, job: Job) -> None:
        if job.running and not job.stop_event.is_set():
            job.emit(make_event("log", level="warning", **keyed("log.time_limit", minutes=job.max_s / 60)))
            self._stop_job(job)

    def stop(self, owner: str | None = None, job_id: int | None = None) -> Job | None:
        """Stop: the run ends after its current step and saves the adapter; pressed again, nothing more (one Stop).
        A job still in the queue leaves it. `owner`: that owner's own job only (None: the app's own user, the running job).
        `job_id` (the Space owner's Stop of any job, running or queued): that job, whoever's it is.

        None if there is nothing of theirs to stop.
        """
        with self._lock:
            if job_id is not None:
                job = next((j for j in self._running + self._waiting if j.id == job_id and j.active), None)
            elif owner is None:
                job = next((j for j in self._running if j.running), None)
            else:
                job = next((j for j in self._running + self._waiting if j.owner == owner and j.active), None)
            if job is not None and job.waiting:
                self._waiting.remove(job)
                job.stop_event.set()
                job.emit(make_event("done", status="stopped", run_dir=None, summary={}, **keyed("log.left_queue")))
                job.waiting, job.finished = False, time.time()
                job._ended.set()
                return job
        return self._stop_job(job) if job is not None else None

    def end_now(self, owner: str | None = None) -> Job | None:
        """The confirmed End now: `owner`'s running job (None: the app's own user, the running job) ends at once,
        without saving an adapter (complete checkpoints remain). None if there is no running job of theirs."""
        with self._lock:
            job = next((j for j in self._running if j.running and (owner is None or j.owner == owner)), None)
        if job is None or job._child is None:
            return None
        job.stop_event.set()
        job._child.end_now()
        return job

    def _stop_job(self, job: Job) -> Job | None:
        if not job.running or job._child is None:
            return None
        job.stop_event.set()
        job._child.ask_stop("stop requested from the app\n")
        return job

    def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """App exit: the queue is dropped; ask each child to stop (it saves after its step), then kill its process
        group; never orphan it."""
        self.actions.shutdown()
        with self._lock:
            waiting, self._waiting = self._waiting, []
            running = [j for j in self._running if j._child is not None and j._child.proc.poll() is None]
        for job in waiting:
            job.waiting, job.finished = False, time.time()
            job._ended.set()
        for job in running:
            if not job.stop_event.is_set():
                self._stop_job(job)
        for job in running:
            try:
                job._child.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                job._child.end("shutdown")
            job.wait(10)  # the follower records how it ended

    def current(self, owner: str | None = None) -> Job | None:
        """`owner`'s newest job (running, queued or the last); owner None: the running job, or the last one this
        process ran or loaded, whoever started it."""
        if owner is not None:
            return next((j for j in reversed(self._jobs) if j.owner == owner), None)
        return next((j for j in self._running if j.running), None) or self._job

    def position(self, job: Job) -> tuple[int, list[Job]] | None:
        """A queued job's place (1: next to start) and the jobs that go before it (the running ones first); None
        for a job not in the queue."""
        with self._lock:
            if job not in self._waiting:
                return None
            at = self._waiting.index(job)
            return at + 1, [j for j in self._running if j.running] + self._waiting[:at]

    def queue(self) -> tuple[list[Job], list[Job]]:
        """(running, waiting): what the Space owner sees."""
        with self._lock:
            return [j for j in self._running if j.running], list(self._waiting)

    def busy(self) -> bool:
        return any(j.running for j in self._running)

    def is_running(self, run_dir: str | Path) -> bool:
        """Whether `run_dir` is the folder of a job running now (what history asks before deleting/listing)."""
        for job in list(self._running):
            mine = job.run_dir if job.running else None
            try:
                if mine is not None and Path(mine).resolve() == Path(run_dir).resolve():
                    return True
            except OSError:
                continue
        return False

    def load_run(self, run_dir: str | Path, owner: str | None = None) -> Job | None:
        """Show an earlier run (from its events.jsonl) when this process has none of its own (none of `owner`'s)."""
        path = Path(run_dir) / "events.jsonl"
        events = read_events(path)
        if not events:
            return None
        with self._lock:
            mine = self._job if owner is None else next((j for j in reversed(self._jobs) if j.owner == owner), None)
            if mine is not None:
                return mine
            first_run = next((e for e in events if e.get("kind") == "run"), {})
            try:
                cfg = TrainConfig.from_dict(first_run.get("config") or {})
            except ValueError:
                cfg = TrainConfig()
            job = Job(id=next(self._ids), config=cfg, events=events, from_disk=True, owner=owner,
                      started=events[0].get("time", time.time()),
                      finished=events[-1].get("time", time.time()))
            self._jobs = [j for j in self._jobs if j.owner != owner or j.active] + [job]
            if owner is None:
                self._job = job
            return job

    # --- the child process ------------------------------------------------------------------------------
    def _spawn(self, job: Job) -> EventTail:
        """Make the run folder, write config.yaml, start the CLI on it; returns a reader of its events.jsonl."""
        from core.runs.folders import create_run_dir  # light: no torch

        # Marked, config.yaml written, resume_from and output_dir checked: a refusal (ConfigError) fails the job
        # before any child starts, and the child continues in exactly this folder.
        run_dir = create_run_dir(job.config, job.config.to_yaml())
        job.folder = str(run_dir)
        config_path = run_dir / "config.yaml"
        (run_dir / STOP_FILE).unlink(missing_ok=True)  # a resumed run's folder may keep one from its last Stop
        command = [*self._program, "--config", str(config_path), "--run-dir", str(run_dir)]
        # Said at once (the child needs seconds to import torch): a new Start never shows the previous run's state.
        starting = make_event("phase", phase="starting", progress=None,
                              **keyed("log.phase.starting", command=f"python -m core.train --config {config_path}"))
        events = run_dir / "events.jsonl"
        JsonlSink(events)(starting)
        job.emit(starting)
        tail = EventTail(events)
        tail.offset = events.stat().st_size  # what follows is the child's (a resumed run's older events are not)
        env = child_env(job.owner)
        if self._program == CLI and warm.enabled():  # forked from the libraries already imported
            job._child = Child(warm.spawn(command, env, str(run_dir / LOG_FILE)), run_dir / STOP_FILE,
                               ack_s=STOP_ACK_S, finish_s=STOP_FINISH_S)
        else:
            with open(run_dir / LOG_FILE, "ab") as log:
                job._child = Child.spawn(command, run_dir / STOP_FILE, ack_s=STOP_ACK_S, finish_s=STOP_FINISH_S,
                                         log=log, env=env)
        job.pid = job._child.pid
        return tail

    def _follow(self, job: Job, tail: EventTail) -> None:
        """Copy the child's new events into the job until it exits (the supervisor enforces Stop's deadlines);
        record a death."""
        child = job._child

        def take() -> None:
            events = tail.read()
            child.note(events)
            for e in events:
                job.emit(e)

        try:
            child.follow(take, POLL_S)
            if not any(e.get("kind") == "done" for e in job.events_since(0)):
                run_dir = Path(job.folder)
                child.record_death(run_dir, "log.died", log=run_dir / LOG_FILE)
                take()
        except Exception:  # noqa: BLE001 - the follower must always end the job, or Start stays refused forever
            job.emit(make_event("error", error_type="other", message=traceback.format_exc(limit=4)))
            job.emit(make_event("done", status="failed", run_dir=job.folder, summary={}, **keyed("log.lost_track")))
        finally:
            with contextlib.suppress(OSError):
                (Path(job.folder) / STOP_FILE).unlink(missing_ok=True)
            job.finished = time.time()
            job._ended.set()
            speed = _seconds_per_step(job.events_since(0))
            self.seconds_per_step = speed or self.seconds_per_step
            self._dispatch()  # the next in the queue, if any


def child_env(owner: str | None) -> dict[str, str]:
    """The environment of a run's child: the app's, with `owner` (a visitor's job: core.runs.public checks the config
    again there as that visitor; the app's own user's: as the app) and the child's supervision."""
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop(VISITOR_ENV, None)
    if owner is not None:
        env[VISITOR_ENV] = owner
    env[PARENT_ENV] = str(os.getpid())  # the child stops and saves if the app dies (core.jobs.supervise)
    env.setdefault("MEMTUNE_NUM_THREADS", str(torch_threads(env).n))  # one core for the web server + browser
    return env


def _seconds_per_step(events: list[dict[str, Any]]) -> float | None:
    """A run's measured training speed (its last step event), for predicting the queue's waits."""
    last = next((e for e in reversed(events) if e.get("kind") == "step" and e.get("step") and e.get("elapsed_s")),
                None)
    return float(last["elapsed_s"]) / int(last["step"]) if last else None



def latest_run_dir(output_dir: str | Path) -> Path | None:
    """The newest run folder (by its events.jsonl) under output_dir, or None."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    runs = [p.parent for p in root.glob("*/events.jsonl")]
    return max(runs, key=lambda p: (p / "events.jsonl").stat().st_mtime, default=None)
