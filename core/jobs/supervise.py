"""The one supervisor of memtune's child processes (no torch, no gradio: the app imports it).

Two parents use it: the app's job manager (core/jobs/manager.py: one `python -m core.train` per run) and the parent of a
multi-process run (core/jobs/launcher.py: `accelerate launch` and its workers). `Child` is one child process in its own
session (process group), and everything a parent does with it:
- `spawn`: start it, its output into a log file (or the terminal), optionally killed with its parent (Linux);
- `ask_stop`: Stop writes the run's stop file (the child's callback ends after the current optimizer step and saves
  the adapter, and answers with an `ack` event); pressed again (a double click, ten presses) it is the same Stop;
- `end_now`: the separate, confirmed "End now" (the page's End now, a terminal's Ctrl-C pressed again after
  REPEAT_S): the group ends at once, and no adapter is saved;
- `enforce`: Stop's deadlines, no answer within `ack_s`, no end within `finish_s` after answering: end the group
  (SIGTERM, then SIGKILL after KILL_GRACE_S);
- `follow`: the poll loop until the child exits, with the parent-death watch where the parent was itself started by
  the app (MEMTUNE_PARENT_PID);
- `record_death`: a child that ended without its `done` event becomes a failed run (runs.record_failure, the one
  failed-run writer), its message saying how it ended.

The child's side of the same contract is here too: `stop_on_signals` (SIGTERM/Ctrl-C = Stop),
`stop_when_orphaned` (the app died: stop and save) and `torch_threads` (the CPU threads of a run's process, for the
app's child and the command line alike: every core but one, unless a setting says otherwise).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from core.messages import Said, lines, table
from core.runs.folders import STOP_FILE

PARENT_ENV = "MEMTUNE_PARENT_PID"  # set by the app for its child: the pid whose death means "stop and save"
KILL_GRACE_S = 5.0  # between SIGTERM and SIGKILL to the process group
TAIL_LINES = 15  # lines of the log quoted when a child dies
# why a run was ended; each has its message (core/locales log.kill.<reason>, with {how} and {s}, the seconds waited)
KILL_REASONS = ("end_now", "no_answer", "no_end", "shutdown", "unwritable")
# Presses of Stop (or Ctrl-C) closer together than this are one press: a double click or a key held down must never
# throw a run's adapter away. Ending at once is its own action (Child.end_now).
REPEAT_S = 2.0


class Child:
    """One supervised child process and its process group. Thread-safe enough for one follower thread plus Stop
    calls from others (each field is written once, in order)."""

    def __init__(self, proc: subprocess.Popen, stop_file: str | Path, ack_s: float, finish_s: float) -> None:
        self.proc, self.pid, self.stop_file = proc, proc.pid, Path(stop_file)
        self.ack_s, self.finish_s = ack_s, finish_s
        self.stop_at: float | None = None  # when the first Stop was asked
        self.acked = False  # the child said it saw the Stop
        self.kill_reason: str | None = None
        self.kill_at: float | None = None

    @classmethod
    def spawn(cls, argv: list[str], stop_file: str | Path, *, ack_s: float, finish_s: float, log=None,
              env: dict[str, str] | None = None, die_with_parent: bool = False) -> "Child":
        """Start argv in its own session. `log`: an open file for stdout+stderr (None: this process's terminal).
        `die_with_parent`: SIGTERM to the child when this process dies (PR_SET_PDEATHSIG, Linux)."""
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL if log is not None else None, stdout=log,
                                stderr=subprocess.STDOUT if log is not None else None,
                                **({"preexec_fn": dies_with_parent} if die_with_parent else
                                   {"start_new_session": True}))
        return cls(proc, stop_file, ack_s, finish_s)

    @property
    def stopping(self) -> bool:
        return self.stop_at is not None

    def ask_stop(self, note: str = "stop\n") -> None:
        """Write the stop file (every rank ends after the same step; rank 0 saves the adapter); a folder that cannot
        be written cannot be answered either, so the group ends. Asked again, nothing more happens: Stop pressed
        twice, or ten times, is one Stop (its deadlines still apply); `end_now` is what ends at once."""
        if self.stop_at is not None:
            return
        self.stop_at = time.monotonic()
        try:
            self.stop_file.write_text(note, encoding="utf-8")
        except OSError:
            self.kill("unwritable")

    def end_now(self) -> None:
        """The confirmed End now: end the group at once; the run saves no adapter (complete checkpoints remain).
        The stop file goes first, so the child's signal handler ends at once instead of stopping after its step."""
        if self.stop_at is None:
            self.stop_at = time.monotonic()
            with contextlib.suppress(OSError):
                self.stop_file.write_text("end now\n", encoding="utf-8")
        self.kill("end_now")

    def press(self) -> None:
        """A terminal's Ctrl-C (or SIGTERM) to the parent: the first is Stop, repeats within REPEAT_S of it are the
        same press, a later one ends at once (the log said so when Stop was acknowledged)."""
        if self.stop_at is None or time.monotonic() - self.stop_at < REPEAT_S:
            self.ask_stop()
        else:
            self.end_now()

    def note(self, events: list[dict[str, Any]]) -> None:
        """Read the child's new events for its answer to Stop."""
        if any(e.get("ack") == "stop" for e in events):
            self.acked = True

    def kill(self, reason: str) -> None:
        """End the child's whole process group: SIGTERM now, SIGKILL after KILL_GRACE_S (`enforce`)."""
        if self.kill_at is not None:
            return
        self.kill_reason, self.kill_at = reason, time.monotonic()
        signal_group(self.pid, signal.SIGTERM)

    def enforce(self) -> None:
        """Stop's deadlines; call it from the poll loop."""
        now = time.monotonic()
        if self.kill_at is not None:
            if now - self.kill_at > KILL_GRACE_S:
                signal_group(self.pid, signal.SIGKILL)
        elif self.stop_at is not None:
            if now - self.stop_at > (self.finish_s if self.acked else self.ack_s):
                self.kill("no_end" if self.acked else "no_answer")

    def follow(self, tick: Callable[[], None] = lambda: None, poll_s: float = 0.25,
               watch_parent: bool = False) -> int:
        """Poll until the child exits: `tick()` (read its events), the parent-death watch, the deadlines. Then end
        whatever the child left in its group. Returns the exit code (negative: killed by that signal)."""
        while self.proc.poll() is None:
            tick()
            if watch_parent and not self.stopping and parent_gone():
                self.ask_stop()  # the app died: stop and save, never linger
            self.enforce()
            time.sleep(poll_s)
        tick()
        signal_group(self.pid, signal.SIGKILL)
        return self.proc.returncode

    def end(self, reason: str, grace_s: float = KILL_GRACE_S) -> None:
        """End the group now and wait for the child (SIGTERM, then SIGKILL after grace_s); a no-op once it exited."""
        if self.proc.poll() is not None:
            return
        self.kill(reason)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            signal_group(self.pid, signal.SIGKILL)
            self.proc.wait()

    def death_message(self, unexpected: str, log: Path | None = None, **params: Any) -> str:
        """Why the child ended without its `done` event: the reason it was ended for, or `unexpected` (a locale key
        such as log.died, said with {how} and `params`; or an English text formatted with {how}) with the end of
        its log. Keyed (a Said) so the page says it in its language; the log's lines are quoted as they are."""
        code = self.proc.returncode
        how = exit_text(code)
        if self.kill_reason is not None:
            seconds = self.ack_s if self.kill_reason == "no_answer" else self.finish_s
            reason = self.kill_reason if self.kill_reason in KILL_REASONS else "shutdown"
            why = Said(f"log.kill.{reason}", how=how, s=seconds)
            return Said("msg.two", first=why, second=Said("log.kill.checkpoints_remain"))
        message = Said(unexpected, how=how, **params) if unexpected in table("en") else unexpected.format(how=how)
        if code is not None and code < 0 and -code == signal.SIGKILL:
            message = Said("msg.two", first=message, second=Said("log.sigkill"))
        tail = log_tail(log) if log is not None else ""
        return lines(message, Said("log.last_lines", path=str(log)), tail) if tail else message

    def record_death(self, run_dir: str | Path, unexpected: str, log: Path | None = None,
                     **details: Any) -> str:
        """Record the run as failed (events.jsonl, summary.json); returns the message."""
        from core.runs.folders import record_failure

        message = self.death_message(unexpected, log, **details)  # the details fill the message too (world_size)
        record_failure(run_dir, message, exit_code=self.proc.returncode, **details)
        return message


def dies_with_parent() -> None:
    """In the child, before exec: its own session (a terminal's Ctrl-C reaches only memtune's parent, which turns it
    into a graceful Stop) and SIGTERM when the parent dies (killed by the app or by hand: no orphans)."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's own handlers still end the group
        pass


THREAD_SETTINGS = ("MEMTUNE_NUM_THREADS", "OMP_NUM_THREADS")  # a number set by hand (or by the app), in this order


@dataclass(frozen=True)
class Threads:
    """How many CPU threads torch gets in a run's process (`n`), out of the cores it may use, and which setting
    chose the number ("" for the rule itself)."""

    n: int
    cores: int
    setting: str = ""

    def said(self) -> Said:
        if self.setting:
            return Said("log.threads.env", n=self.n, name=self.setting, cores=self.cores)
        return Said("log.threads.auto", n=self.n, cores=self.cores, left=self.cores - self.n)


def cores() -> int:
    """The cores this process may run on (its CPU affinity: taskset's, a container's cpuset), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def torch_threads(env: dict[str, str] | None = None) -> Threads:
    """The torch threads of a run's process, for the app's child and the command line alike: a whole number in
    MEMTUNE_NUM_THREADS, else in OMP_NUM_THREADS (what torch itself reads); else every core this process may use
    but one, at least one: torch's threads on every core wait for each other whenever anything else takes a core
    (the page, the browser, another program), and a CPU run then goes many times slower than with one core left."""
    env = os.environ if env is None else env
    available = cores()
    for name in THREAD_SETTINGS:
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return Threads(int(value), available, name)
    return Threads(max(1, available - 1), available)


def signal_group(pgid: int | None, sig: int) -> None:
    if pgid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def exit_text(code: int | None) -> Said:
    if code is None:
        return Said("log.exit_none")
    if code < 0:
        try:
            return Said("log.exit_signal", signal=signal.Signals(-code).name)
        except ValueError:
            return Said("log.exit_signal", signal=str(-code))
    return Said("log.exit_code", code=code)


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    text = text.replace("\r", "\n")  # progress bars
    return "\n".join([ln for ln in text.splitlines() if ln.strip()][-lines:])


# --- the child's side ----------------------------------------------------------------------------------------------
def parent_gone() -> bool:
    """Started by the app (MEMTUNE_PARENT_PID) and the app is gone. A cold child's parent is the app itself; a warm
    one's is the fork server (core/jobs/warm.py), which outlives the app while the child runs, so then the app's own
    pid is checked: no such process, or a dead one not yet reaped."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or os.getppid() == int(parent):
        return False
    try:
        os.kill(int(parent), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process took the pid: ours is gone
        return True
    try:
        with open(f"/proc/{parent}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # exited, waiting to be reaped
    except (OSError, IndexError):
        return False


def stop_when_orphaned(stop: threading.Event) -> None:
    """Started by the app: if the app dies without stopping us, stop and save, never linger."""
    if not os.environ.get(PARENT_ENV, "").isdigit():
        return

    def watch() -> None:
        while not stop.wait(1.0):
            if parent_gone():
                stop.set()

    threading.Thread(target=watch, daemon=True, name="memtune-parent-watch").start()


def stop_on_signals(stop: threading.Event, run_dir: str | None = None) -> None:
    """SIGTERM / Ctrl-C: finish the current step and save the adapter. Repeats within REPEAT_S of the first are the
    same press (a double Ctrl-C). A later signal after a Stop was asked for (this flag, or the run folder's stop file:
    the app's End now, its shutdown) ends the process at once."""
    stop_file = Path(run_dir) / STOP_FILE if run_dir else None
    pressed: list[float] = []  # when a signal here first asked for Stop

    def handler(signum, frame):  # only sets a flag: never write or lock inside a signal handler
        now = time.monotonic()
        if pressed and now - pressed[0] < REPEAT_S:
            return
        if stop.is_set() or (stop_file is not None and stop_file.exists()):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        stop.set()
        pressed.append(now)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
