"""One training job at a time for the whole process, shared by every browser tab (no gradio here).

The GPU is one, so the manager holds at most one running job behind a lock: a second `start()` from any tab
raises `JobBusy`. The job runs `core.train.run_training` in a daemon thread with two sinks: an in-memory list
(what the UI polls) and the run folder's `events.jsonl` (written by the engine), so closing or reloading a page
never touches the run, and a reloaded page reattaches by reading the same list. A run from an earlier server
process can still be shown from its `events.jsonl` (`load_run`).

`view(events)` turns an event list into what a page shows (progress, loss curve, log lines, result) as plain
data, so it is tested without a browser.
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from core.config import TrainConfig
from core.events import make_event, read_events

Runner = Callable[..., Any]  # run_training(cfg, sink=..., stop=...) -> RunResult


class JobBusy(RuntimeError):
    """A job is already running; the message says which and what to do."""


@dataclass
class Job:
    id: int
    config: TrainConfig
    started: float = field(default_factory=time.time)
    stop_event: threading.Event = field(default_factory=threading.Event)
    events: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None
    finished: float | None = None
    from_disk: bool = False  # loaded from an events.jsonl of an earlier server process
    gpu_peak_gib: float = 0.0  # highest NVML "used" seen while this job ran (sampled by the gauge)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def events_since(self, start: int = 0) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events[start:])

    @property
    def n_events(self) -> int:
        with self._lock:
            return len(self.events)

    @property
    def running(self) -> bool:
        return self.finished is None and not self.from_disk

    @property
    def stopping(self) -> bool:
        return self.running and self.stop_event.is_set()

    @property
    def run_dir(self) -> str | None:
        """The run folder, once the engine has announced it (its first `run` event)."""
        with self._lock:
            return next((e.get("run_dir") for e in self.events if e.get("kind") == "run" and e.get("run_dir")), None)

    def note_gpu_used(self, used_gib: float) -> None:
        if self.running:
            self.gpu_peak_gib = max(self.gpu_peak_gib, used_gib)

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running


def _default_runner(cfg: TrainConfig, sink=None, stop=None):
    from core.train import run_training  # heavy import (torch, transformers), only when a job starts

    return run_training(cfg, sink=sink, stop=stop)


class JobManager:
    """Process-wide: use `MANAGER` below. Thread-safe."""

    def __init__(self, runner: Runner | None = None) -> None:
        self._runner = runner or _default_runner
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._job: Job | None = None  # the running job, or the last one

    # --- control ----------------------------------------------------------------------------------------
    def start(self, cfg: TrainConfig, runner: Runner | None = None) -> Job:
        """Start `cfg` in a background thread, or raise JobBusy if a job is running (from any tab)."""
        with self._lock:
            if self._job is not None and self._job.running:
                job = self._job
                what = "stopping" if job.stopping else "running"
                raise JobBusy(f"A training run is already {what} (job {job.id}, {job.config.model}); "
                              "one run at a time uses the GPU. Wait for it to finish or press Stop.")
            job = Job(id=next(self._ids), config=cfg)
            self._job = job
            thread = threading.Thread(target=self._run, args=(job, runner or self._runner),
                                      name=f"memtune-job-{job.id}", daemon=True)
            job._thread = thread
            thread.start()
            return job

    def stop(self) -> Job | None:
        """Ask the running job to stop after its current step (it then saves the adapter); None if idle."""
        job = self._job
        if job is None or not job.running:
            return None
        if not job.stop_event.is_set():
            job.stop_event.set()
            job.emit(make_event("log", message="Stop requested: finishing the current step, then saving "
                                               "the adapter.", level="info"))
        return job

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
        if mine is None:  # started, folder not announced yet: it is a new folder, or the one it resumes
            mine = job.config.resume_from or None
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

    # --- the thread -------------------------------------------------------------------------------------
    def _run(self, job: Job, runner: Runner) -> None:
        try:
            job.result = runner(job.config, sink=job.emit, stop=job.stop_event)
        except BaseException as exc:  # run_training should never raise; if it does, the UI still gets told
            job.emit(make_event("error", error_type="other", message=f"{type(exc).__name__}: {exc}",
                                traceback=traceback.format_exc(limit=8)))
            job.emit(make_event("done", status="failed", run_dir=None, summary={},
                                message=f"The run crashed: {type(exc).__name__}: {exc}"))
        finally:
            if not any(e.get("kind") == "done" for e in job.events_since(0)):
                r = job.result
                job.emit(make_event("done", status=getattr(r, "status", "failed"),
                                    run_dir=str(getattr(r, "run_dir", "") or "") or None,
                                    adapter_dir=str(getattr(r, "adapter_dir", "") or "") or None,
                                    summary=getattr(r, "summary", {}) or {},
                                    message=getattr(r, "message", "") or "The run ended."))
            job.finished = time.time()


MANAGER = JobManager()


def latest_run_dir(output_dir: str | Path) -> Path | None:
    """The newest run folder (by its events.jsonl) under output_dir, or None."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    runs = [p.parent for p in root.glob("*/events.jsonl")]
    return max(runs, key=lambda p: (p / "events.jsonl").stat().st_mtime, default=None)


# --- what a page shows -------------------------------------------------------------------------------------
@dataclass
class JobView:
    state: str = "idle"  # idle | running | stopping | completed | stopped | failed | interrupted
    phase: str = ""
    phase_message: str = ""
    step: int = 0
    total_steps: int | None = None
    epoch: float | None = None
    eta_s: float | None = None
    elapsed_s: float | None = None
    tokens_per_s: float | None = None
    tokens: int | None = None
    last_loss: float | None = None
    peak_gib: float | None = None
    losses: list[tuple[int, float]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    run_dir: str | None = None
    adapter_dir: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    error_type: str | None = None

    @property
    def fraction(self) -> float | None:
        if self.state == "completed":
            return 1.0
        if self.total_steps:
            return min(1.0, self.step / self.total_steps)
        return None


def _clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "--:--:--"


def format_event(e: dict[str, Any]) -> str | None:
    """One log line for an event, or None for events that only feed the progress view."""
    kind, t = e.get("kind"), _clock(e.get("time"))
    if kind == "run":
        return f"{t}  run folder {e.get('run_dir')}"
    if kind == "phase":
        return f"{t}  [{e.get('phase')}] {e.get('message') or ''}".rstrip()
    if kind == "log":
        tag = "WARNING " if e.get("level") == "warning" else ""
        return f"{t}  {tag}{e.get('message', '')}"
    if kind == "error":
        return f"{t}  ERROR ({e.get('error_type', 'other')}): {e.get('message', '')}"
    if kind == "done":
        return f"{t}  finished: {e.get('status')} - {e.get('message', '')}"
    return None


def view(events: list[dict[str, Any]], running: bool = False, stopping: bool = False,
         from_disk: bool = False) -> JobView:
    v = JobView(state="idle" if not events else "running")
    losses: dict[int, float] = {}
    last_phase = None  # a phase's heartbeats replace its previous line instead of piling up
    for e in events:
        kind = e.get("kind")
        line = format_event(e)
        if kind == "run" and e.get("run_dir") and e.get("run_dir") == v.run_dir:
            line = None  # the engine announces the run again once the step count is known
        if line:
            if kind == "phase" and last_phase == e.get("phase") and v.log:
                v.log[-1] = line
            else:
                v.log.append(line)
            last_phase = e.get("phase") if kind == "phase" else None
        if kind == "run":
            v.run_dir = e.get("run_dir") or v.run_dir
            v.total_steps = e.get("total_steps") or v.total_steps
        elif kind == "phase":
            v.phase, v.phase_message = e.get("phase", ""), e.get("message", "") or ""
        elif kind == "step":
            v.step = int(e.get("step") or v.step)
            v.total_steps = e.get("total_steps") or v.total_steps
            for name in ("epoch", "eta_s", "elapsed_s", "tokens_per_s", "tokens"):
                if e.get(name) is not None:
                    setattr(v, name, e[name])
            if e.get("peak_gib") is not None:
                v.peak_gib = max(v.peak_gib or 0.0, float(e["peak_gib"]))
        elif kind == "metrics":  # every logging_steps: the loss curve (step events never carry the loss)
            loss = e.get("loss")
            if isinstance(loss, (int, float)) and not isinstance(loss, bool) and e.get("step") is not None:
                losses[int(e["step"])] = v.last_loss = float(loss)  # a resumed run logs a step again: latest wins
        elif kind == "error":
            v.error_type = e.get("error_type")
            v.message = e.get("message", "")
        elif kind == "done":
            v.state = e.get("status") or "failed"
            v.run_dir = e.get("run_dir") or v.run_dir
            v.adapter_dir = e.get("adapter_dir") or v.adapter_dir
            v.summary = e.get("summary") or {}
            v.message = e.get("message", "") or v.message
    v.losses = sorted(losses.items())
    if v.state == "running":
        if stopping:
            v.state = "stopping"
        elif not running:
            v.state = "interrupted" if from_disk else v.state
    return v


def job_view(job: Job | None) -> JobView:
    if job is None:
        return JobView()
    return view(job.events_since(0), running=job.running, stopping=job.stopping, from_disk=job.from_disk)
