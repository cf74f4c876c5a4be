"""One training job at a time for the whole app, each in its own child process (no gradio here).

The GPU is one, so the manager holds at most one running job behind a lock: a second `start()` from any tab
raises `JobBusy`. A job is the same command a user runs, `python -m core.train --config RUN/config.yaml`, started
as a child process in its own session (process group): the manager chooses the run folder, writes config.yaml
there, and sends the child's stdout/stderr to RUN/train.log (a file, never an unread pipe). A thread per job follows
RUN/events.jsonl incrementally (by byte offset) into the job's in-memory event list, which every tab polls, so
closing or reloading a page never touches the run and a reloaded page reattaches by reading the same list.

Stop writes RUN/STOP; the child's callback ends after the current optimizer step and saves the adapter, and says at
once that it saw the Stop (an `ack` event). A second Stop, no answer within STOP_ACK_S, or no end within
STOP_FINISH_S after answering, kills the process group (SIGTERM, then SIGKILL). A child that dies without a `done`
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
from core.runs.events import EventTail, JsonlSink, make_event, read_events
from core.jobs import warm
from core.jobs.supervise import PARENT_ENV, Child

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
    """A job is already running; the message says which and what to do."""


@dataclass
class Job:
    id: int
    config: TrainConfig
    started: float = field(default_factory=time.time)
    stop_event: threading.Event = field(default_factory=threading.Event)
    events: list[dict[str, Any]] = field(default_factory=list)
    finished: float | None = None
    from_disk: bool = False  # loaded from an events.jsonl of an earlier server process
    gpu_peak_gib: float = 0.0  # highest NVML "used" seen while this job ran (sampled by the gauge)
    folder: str | None = None  # the run folder, known from the start for a child job
    pid: int | None = None  # the child process (its process group has the same id)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _child: Child | None = field(default=None, repr=False)
    _view: Any = field(default=None, repr=False)  # core.jobs.view's running fold of the events (it sits above jobs)

    def emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def events_since(self, start: int = 0) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events[start:])

    @property
    def running(self) -> bool:
        return self.finished is None and not self.from_disk

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
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running


class JobManager:
    """App-wide: use `MANAGER` below. Thread-safe. `program`: what the child runs, followed by `--config FILE
    --run-dir DIR` (the CLI, `python -m core.train`; the UI tests give a tiny child of the same protocol)."""

    def __init__(self, program: list[str] | None = None) -> None:
        self._program = list(program or CLI)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._job: Job | None = None  # the running job, or the last one

    def prepare(self) -> None:
        """Start the warm-start server now, in the background (core/jobs/warm.py), so the first Start is warm too."""
        if self._program == CLI and warm.enabled():
            warm.context()

    # --- control ----------------------------------------------------------------------------------------
    def start(self, cfg: TrainConfig) -> Job:
        """Start `cfg` as a child process, or raise JobBusy if a job is running (from any tab).

        A run that cannot even be started (its folder cannot be made, Python cannot be run) is returned as a
        failed job whose message says why, like any other failed run.
        """
        with self._lock:
            if self._job is not None and self._job.running and self._job.said_done():
                self._job.wait(DONE_EXIT_WAIT_S)  # finished, only its process is still exiting
            if self._job is not None and self._job.running:
                job = self._job
                what = "stopping" if job.stopping else "running"
                raise JobBusy(f"A training run is already {what} (job {job.id}, {job.config.model}); "
                              "one run at a time uses the GPU. Wait for it to finish or press Stop.")
            job = Job(id=next(self._ids), config=cfg)
            self._job = job
            try:
                tail = self._spawn(job)
            except Exception as exc:  # noqa: BLE001 - e.g. a folder that cannot be made: a failed run, not a crash
                message = f"Could not start the training process: {exc}"
                job.emit(make_event("error", error_type="other", message=message))
                job.emit(make_event("done", status="failed", run_dir=job.folder, summary={}, message=message))
                job.finished = time.time()
                return job
            job._thread = threading.Thread(target=self._follow, args=(job, tail), name=f"memtune-job-{job.id}",
                                           daemon=True)
            job._thread.start()
            return job

    def stop(self) -> Job | None:
        """First Stop: the run ends after its current step and saves the adapter. Second Stop: ended at once.

        None if nothing is running.
        """
        job = self._job
        if job is None or not job.running or job._child is None:
            return None
        job.stop_event.set()
        job._child.ask_stop("stop requested from the app\n")
        return job

    def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """App exit: ask the child to stop (it saves after its step), then kill its process group; never orphan it."""
        job = self._job
        if job is None or job._child is None or job._child.proc.poll() is not None:
            return
        if not job.stop_event.is_set():
            self.stop()
        try:
            job._child.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            job._child.end("shutdown")
        job.wait(10)  # the follower records how it ended

    def current(self) -> Job | None:
        """The running job, or the last one this process ran or loaded."""
        return self._job

    def busy(self) -> bool:
        job = self._job
        return job is not None and job.running

    def is_running(self, run_dir: str | Path) -> bool:
        """Whether `run_dir` is the folder of the job running now (what history asks before deleting/listing)."""
        job = self._job
        if job is None or not job.running:
            return False
        mine = job.run_dir
        try:
            return mine is not None and Path(mine).resolve() == Path(run_dir).resolve()
        except OSError:
            return False

    def load_run(self, run_dir: str | Path) -> Job | None:
        """Show an earlier run (from its events.jsonl) when this process has none of its own."""
        path = Path(run_dir) / "events.jsonl"
        events = read_events(path)
        if not events:
            return None
        with self._lock:
            if self._job is not None:
                return self._job
            first_run = next((e for e in events if e.get("kind") == "run"), {})
            try:
                cfg = TrainConfig.from_dict(first_run.get("config") or {})
            except ValueError:
                cfg = TrainConfig()
            job = Job(id=next(self._ids), config=cfg, events=events, from_disk=True,
                      started=events[0].get("time", time.time()),
                      finished=events[-1].get("time", time.time()))
            self._job = job
            return job

    # --- the child process ------------------------------------------------------------------------------
    def _spawn(self, job: Job) -> EventTail:
        """Make the run folder, write config.yaml, start the CLI on it; returns a reader of its events.jsonl."""
        from core.runs.folders import create_run_dir  # light: no torch

        # Marked, config.yaml written, resume_from and output_dir checked: a refusal (ConfigError) fails the job
        # before any child starts, and the child continues in exactly this folder.
        run_dir = create_run_dir(job.config)
        job.folder = str(run_dir)
        config_path = run_dir / "config.yaml"
        (run_dir / STOP_FILE).unlink(missing_ok=True)  # a resumed run's folder may keep one from its last Stop
        command = [*self._program, "--config", str(config_path), "--run-dir", str(run_dir)]
        # Said at once (the child needs seconds to import torch): a new Start never shows the previous run's state.
        starting = make_event("phase", phase="starting", progress=None,
                              message=f"Starting the training process: python -m core.train --config {config_path}")
        events = run_dir / "events.jsonl"
        JsonlSink(events)(starting)
        job.emit(starting)
        tail = EventTail(events)
        tail.offset = events.stat().st_size  # what follows is the child's (a resumed run's older events are not)
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        env[PARENT_ENV] = str(os.getpid())  # the child stops and saves if the app dies (core.jobs.supervise)
        env.setdefault("MEMTUNE_NUM_THREADS", str(max(1, _cores() - 1)))  # one core for the web server + browser
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
                child.record_death(run_dir, "The training process died unexpectedly ({how}).", log=run_dir / LOG_FILE)
                take()
        except Exception:  # noqa: BLE001 - the follower must always end the job, or Start stays refused forever
            job.emit(make_event("error", error_type="other", message=traceback.format_exc(limit=4)))
            job.emit(make_event("done", status="failed", run_dir=job.folder, summary={},
                                message="memtune lost track of the training process."))
        finally:
            with contextlib.suppress(OSError):
                (Path(job.folder) / STOP_FILE).unlink(missing_ok=True)
            job.finished = time.time()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


MANAGER = JobManager()


def latest_run_dir(output_dir: str | Path) -> Path | None:
    """The newest run folder (by its events.jsonl) under output_dir, or None."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    runs = [p.parent for p in root.glob("*/events.jsonl")]
    return max(runs, key=lambda p: (p / "events.jsonl").stat().st_mtime, default=None)
