"""Children that start warm: each `python -m core.train` the job manager starts, and each model-running action (Try it,
merge, GGUF export: `python -m core.jobs.act`, core/jobs/actions.py), is forked from a server process that has
imported the libraries once (core/train/preload.py), instead of a new interpreter importing them again.

Importing torch, transformers, peft, trl, datasets and bitsandbytes costs 5-7 s of CPU per run; the demo's whole
training costs less. The server is Python's own `multiprocessing` forkserver (Linux): started in the background
when the job manager is made, its child a fork of it. The child is what the supervisor (core/jobs/supervise.py)
expects of a process: its own session (process group), its output in the run's log file, stdin empty, the run's
environment (torch's thread count included), the exit code of its command, and for an action SIGTERM when the app
dies (the server's own end follows the app's: PR_SET_PDEATHSIG, as a cold action child gets it from the app).

Where the forked state cannot be trusted (CUDA started or a thread running in the server, or a run environment that
differs from the one the libraries read at import: core/train/preload.py `fork_safe`), the child replaces itself
with a fresh interpreter running the same command line (os.execve, same pid and session), which is exactly the
cold start. A training run's first event says which start it had (`start`: "warm" or "cold", and why).
MEMTUNE_WARM_START=0 turns the server off (every child a new interpreter, as `subprocess` starts it).
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import spawn
from pathlib import Path

from core.jobs.supervise import dies_with_parent, parent_gone


PRELOAD = "core.train.preload"
ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds core/
START_ENV = "MEMTUNE_START"  # what the child was told about its start, for its first event
_lock = threading.Lock()
_context = None


NAME = "memtune-train"


def _preparation_data(name, _original=spawn.get_preparation_data):
    """What multiprocessing sends a new process to prepare, without the parent's main script for ours: it would run
    app.py (gradio and all) again in each run's process. The run needs only core, which the server has imported."""
    data = _original(name)
    if name == NAME:
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


spawn.get_preparation_data = _preparation_data  # multiprocessing's forkserver launcher looks it up here


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get("MEMTUNE_WARM_START", "1").strip() != "0"


def context():
    """The forkserver context, its server started the first time (it imports in the background, in its own process)."""
    global _context
    with _lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload([PRELOAD])
            _start_server()  # quick: the server imports in its own process, and the first run waits for it
            _context = ctx
        return _context


def _start_server() -> None:
    from multiprocessing import forkserver

    # Python 3.11's forkserver drops the sys.path it is handed (3.12 applies it), so `core` was importable there
    # only when the app had been started from this folder: started anywhere else, every run went cold. PYTHONPATH
    # reaches the server's interpreter; the app's own environment gets it back at once (runs get it anyway).
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, before) if p)
    try:
        forkserver.ensure_running()
    except Exception:  # noqa: BLE001 - no server: spawn() below starts one, or the run starts cold
        pass
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


class WarmProcess:
    """The part of subprocess.Popen the supervisor uses (pid, poll, wait, returncode), for a forked run."""

    def __init__(self, process) -> None:
        self._process, self.pid, self.returncode = process, process.pid, None

    def poll(self) -> int | None:
        if self.returncode is None and self._process.exitcode is not None:
            self.returncode = self._process.exitcode  # negative: the signal that ended it, as Popen says
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self._process.name, timeout)
        return self.returncode


def spawn(argv: list[str], env: dict[str, str], log_path: str, die_with_parent: bool = False) -> WarmProcess:
    """Start `argv` (`python -m core.train ...`, `python -m core.jobs.act ...`) as a fork of the server, its output
    appended to `log_path`. `die_with_parent`: SIGTERM to the child when the app dies, as Child.spawn's."""
    ctx = context()
    _start_server()  # a no-op while it runs; else started again, as Process.start would, but with the path
    process = ctx.Process(target=_child, args=(list(argv), dict(env), str(log_path), os.getcwd(), die_with_parent),
                          name=NAME)
    process.start()
    # Return once the child leads its own process group (its first act), as subprocess's start_new_session does
    # before it returns: a Stop signalled to the group a moment after Start must reach it.
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and process.exitcode is None:
        try:
            if os.getpgid(process.pid) == process.pid:
                break
        except ProcessLookupError:
            break
        time.sleep(0.002)
    return WarmProcess(process)


def _child(argv: list[str], env: dict[str, str], log_path: str, cwd: str, die_with_parent: bool = False) -> None:
    """In the forked process: become what the cold start would have been, then run `python -m MODULE ...`."""
    if die_with_parent:  # its own session, and SIGTERM when the server ends, which it does when the app does
        dies_with_parent()  # (kept across the cold start's execve, as a cold child's own is)
    else:
        os.setsid()  # its own process group: Stop and the supervisor signal the group
    # The platform's default start method again, as in a cold process: with the forkserver's, the libraries' own
    # locks (tqdm's) become named semaphores that each run would leave to multiprocessing's tracker as "leaked".
    multiprocessing.set_start_method(None, force=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    os.chdir(cwd)
    preload = sys.modules.get(PRELOAD)
    why = "the fork server could not import the libraries" if preload is None else preload.fork_safe(env)
    if why:
        os.execve(argv[0], argv, dict(env, **{START_ENV: f"cold: {why}"}))  # the cold start, same pid
    os.environ.clear()
    os.environ.update({**preload.SET_BY_IMPORTS, **env, START_ENV: "warm"})
    if die_with_parent and parent_gone():  # the app ended before the line above could notice: as SIGTERM would
        os.kill(os.getpid(), signal.SIGTERM)
    threads = env.get("OMP_NUM_THREADS", "").strip()
    if threads.isdigit() and int(threads) > 0:  # what a cold interpreter's torch reads from it when it loads
        sys.modules["torch"].set_num_threads(int(threads))
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # the log file, line by line (PYTHONUNBUFFERED's effect)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    module = argv[argv.index("-m") + 1]
    sys.argv = [module, *argv[argv.index("-m") + 2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)  # core.train's __main__ ends with os._exit
