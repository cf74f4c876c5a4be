"""What a page shows of a job (progress, loss curve, log lines, result), as plain data: tested without a browser.

`job_view(job)` keeps a fold of the job's events per job and adds only the events that arrived since the last poll,
so a long run does not cost the page more each second.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.messages import SaidLine, said_of, say

# A preference run's `metrics` events also carry these (core/runs/events.py, core/train/rewards.py)
REWARD_FIELDS = ("reward_accuracy", "reward_margin", "reward_chosen", "reward_rejected", "logp_chosen", "logp_rejected",
                 "reward_mean", "reward_std", "completion_length", "completion_share", "kl")  # the last: GRPO's
BY_SCORER = "reward_by_"  # + a scorer's name: its mean reward in a GRPO run (core/train/rewards.py)

if TYPE_CHECKING:
    from core.jobs.manager import Job


@dataclass
class JobView:
    state: str = "idle"  # idle | running | stopping | completed | stopped | failed | interrupted
    phase: str = ""
    phase_message: str = ""
    phase_said: dict[str, Any] = field(default_factory=dict)  # the phase message's key + params: the page's words
    phase_progress: float | None = None  # how far the phase is, when it says (the data's tokenizing)
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
    eval_losses: list[tuple[int, float]] = field(default_factory=list)  # (step, validation loss): `eval` events
    # a preference run's (step, {reward_accuracy, reward_margin, ...}): its `metrics` events (core/train/rewards.py)
    rewards: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    eval_rewards: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # the same, of its `eval` events
    answers: list[dict[str, str]] = field(default_factory=list)  # the latest eval's prompt/reference/answer
    answers_step: int | None = None
    log: list[str] = field(default_factory=list)
    run_dir: str | None = None
    adapter_dir: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    error_type: str | None = None
    said: dict[str, Any] = field(default_factory=dict)  # the error's key + params (core.messages): the page's words

    @property
    def fraction(self) -> float | None:
        if self.state == "completed":
            return 1.0
        if self.total_steps:
            return min(1.0, self.step / self.total_steps)
        return None


def _clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "--:--:--"


def phase_progress(e: dict[str, Any]) -> float | None:
    """How far a phase event says its phase is (0 to 1), or None."""
    return e.get("progress") if isinstance(e.get("progress"), (int, float)) else None


def format_event(e: dict[str, Any]) -> str | None:
    """One log line for an event (its English text, as the CLI says it), or None for events that only feed the
    progress view. The line is a SaidLine: the message's key + params (core.messages.keyed) and what frames it
    (warning, error type, status, phase), so a page says it in its language; an old run's event without a key keeps
    its English message."""
    kind, t = e.get("kind"), _clock(e.get("time"))
    said = {k: e[k] for k in ("key", "params") if k in e}
    if kind == "run":
        path = e.get("run_dir")
        return SaidLine(f"{t}  run folder {path}", {"key": "log.run_folder", "params": {"path": str(path)}}, kind)
    if kind == "phase":
        message = e.get("message") or ""
        # a heartbeat (core.train.callbacks.phase): the phase's message + " (12 s)", or " (12 s, 34%)" when the phase
        # says how far it is; its key's params, its seconds and share (an older run's beat: the seconds from its words)
        seconds = progress = None
        if said and message != (first := say(said["key"], said.get("params"))) and message.startswith(first + " ("):
            tail = message[len(first) + 2:]
            seconds = e["elapsed_s"] if isinstance(e.get("elapsed_s"), int) else (
                int(tail[:-3]) if tail.endswith(" s)") and tail[:-3].isdigit() else None)
            progress = phase_progress(e) if seconds is not None else None
            message = first if seconds is not None else message
        line = f"{t}  [{e.get('phase')}] {e.get('message') or ''}".rstrip()
        return SaidLine(line, said, kind, message, phase=e.get("phase"), seconds=seconds, progress=progress)
    if kind == "log":
        warning = e.get("level") == "warning"
        line = f"{t}  {'WARNING ' if warning else ''}{e.get('message', '')}"
        return SaidLine(line, said, kind, e.get("message", ""), warning=warning)
    if kind == "error":
        line = f"{t}  ERROR ({e.get('error_type', 'other')}): {e.get('message', '')}"
        return SaidLine(line, said_of(e), kind, e.get("message", ""), error_type=e.get("error_type", "other"))
    if kind == "done":
        line = f"{t}  finished: {e.get('status')} - {e.get('message', '')}"
        if not said and e.get("status") == "failed":
            said = said_of(e.get("summary") or {})
        return SaidLine(line, said, kind, e.get("message", ""), status=e.get("status"))
    return None


def _rewards(e: dict[str, Any]) -> dict[str, float]:
    """The reward figures a `metrics` or `eval` event carries (core/train/rewards.py; none for an SFT run)."""
    return {k: float(v) for k, v in e.items()
            if (k in REWARD_FIELDS or k.startswith(BY_SCORER)) and isinstance(v, (int, float))}


class _Fold:
    """What the events so far add up to; `add` takes only new events, so a poll costs the new events, not the run."""

    def __init__(self) -> None:
        self.v = JobView(state="idle")
        self.losses: dict[int, float] = {}
        self.eval_losses: dict[int, float] = {}
        self.rewards: dict[int, dict[str, float]] = {}
        self.eval_rewards: dict[int, dict[str, float]] = {}
        self.last_phase: str | None = None  # a phase's heartbeats replace its previous line instead of piling up
        self.seen = 0  # events added so far
        self.started: float | None = None  # the run's first event: "elapsed" counts from it, as the result's Time does

    def add(self, events: list[dict[str, Any]]) -> None:
        v = self.v
        for e in events:
            self.seen += 1
            if v.state == "idle":
                v.state = "running"
            if self.started is None and isinstance(e.get("time"), (int, float)):
                self.started = float(e["time"])
            kind = e.get("kind")
            line = format_event(e)
            if kind == "run" and e.get("run_dir") and e.get("run_dir") == v.run_dir:
                line = None  # the engine announces the run again once the step count is known
            if line:
                if kind == "phase" and self.last_phase == e.get("phase") and v.log:
                    v.log[-1] = line
                else:
                    v.log.append(line)
                self.last_phase = e.get("phase") if kind == "phase" else None
            if kind == "run":
                v.run_dir = e.get("run_dir") or v.run_dir
                v.total_steps = e.get("total_steps") or v.total_steps
            elif kind == "phase":
                v.phase, v.phase_message = e.get("phase", ""), e.get("message", "") or ""
                v.phase_said = {k: e[k] for k in ("key", "params") if k in e}
                v.phase_progress = phase_progress(e)
            elif kind == "step":
                v.step = int(e.get("step") or v.step)
                v.total_steps = e.get("total_steps") or v.total_steps
                for name in ("epoch", "eta_s", "elapsed_s", "tokens_per_s", "tokens"):
                    if e.get(name) is not None:
                        setattr(v, name, e[name])
                if self.started is not None and isinstance(e.get("time"), (int, float)):
                    # one clock for one run: from its start (loading included), not from the first training step
                    v.elapsed_s = max(0.0, float(e["time"]) - self.started)
                if e.get("peak_gib") is not None:
                    v.peak_gib = max(v.peak_gib or 0.0, float(e["peak_gib"]))
            elif kind == "metrics":  # every logging_steps: the loss curve (step events never carry the loss)
                loss = e.get("loss")
                if isinstance(loss, (int, float)) and not isinstance(loss, bool) and e.get("step") is not None:
                    self.losses[int(e["step"])] = v.last_loss = float(loss)  # a resumed run logs a step again
                    if rewards := _rewards(e):
                        self.rewards[int(e["step"])] = rewards
            elif kind == "eval" and isinstance(e.get("eval_loss"), (int, float)) and e.get("step") is not None:
                self.eval_losses[int(e["step"])] = float(e["eval_loss"])
                if rewards := _rewards(e):  # a preference run's eval on its validation pairs
                    self.eval_rewards[int(e["step"])] = rewards
                if e.get("answers"):
                    v.answers, v.answers_step = list(e["answers"]), int(e["step"])
            elif kind == "error":
                v.error_type = e.get("error_type")
                v.message = e.get("message", "")
                v.said = said_of(e)
            elif kind == "done":
                v.state = e.get("status") or "failed"
                v.run_dir = e.get("run_dir") or v.run_dir
                v.adapter_dir = e.get("adapter_dir") or v.adapter_dir
                v.summary = e.get("summary") or {}
                if isinstance(v.summary.get("runtime_s"), (int, float)):
                    v.elapsed_s = float(v.summary["runtime_s"])  # the same figure as the result's and History's Time
                v.message = e.get("message", "") or v.message
                if e.get("key") and e.get("message"):  # the end's own words (log.lost_track) replace the error's
                    v.said = said_of(e)

    def result(self, running: bool, stopping: bool, from_disk: bool) -> JobView:
        v = copy.copy(self.v)  # the fold keeps growing; callers get a snapshot
        v.log = list(v.log)
        v.losses = sorted(self.losses.items())
        v.eval_losses = sorted(self.eval_losses.items())
        v.rewards = sorted(self.rewards.items())
        v.eval_rewards = sorted(self.eval_rewards.items())
        if v.state == "running":
            if stopping:
                v.state = "stopping"
            elif not running:
                v.state = "interrupted" if from_disk else v.state
        return v


def job_view(job: "Job | None") -> JobView:
    """The page's view of a job, updated with only the events that arrived since the last call."""
    if job is None:
        return JobView()
    with job._lock:
        if job._view is None:
            job._view = _Fold()
        fold = job._view
        fold.add(job.events[fold.seen:])
        return fold.result(job.running, job.stopping, job.from_disk)


def predicted_wait(ahead: list["Job"], seconds_per_step: float | None) -> float | None:
    """Seconds until a queued job starts: what the jobs before it have left, from each one's own ETA, else its steps
    left at the measured speed (its own, or the server's last run's), each capped by its time limit. None when one
    of them cannot be predicted (no speed measured yet, or a run counted in epochs): the page says "unknown"."""
    views = {job.id: job_view(job) if job.running else JobView() for job in ahead}
    # The speed measured now (the running job's, from its start: loading counted, so on the slow side), else the last
    # run's; a queued job's steps are assumed to go at it.
    measured = next((v.elapsed_s / v.step for v in views.values() if v.step and v.elapsed_s), seconds_per_step)
    total = 0.0
    for job in ahead:
        v = views[job.id]
        left: float | None = v.eta_s if v.state == "running" else None
        if left is None:
            steps = (v.total_steps - v.step) if v.total_steps else (job.config.max_steps
                                                                    if job.config.max_steps > 0 else None)
            left = steps * measured if steps is not None and measured else None
        if job.max_s:
            spent = time.time() - job.started if job.running else 0.0
            left = min(left, job.max_s - spent) if left is not None else None
        if left is None:
            return None
        total += max(0.0, left)
    return total
