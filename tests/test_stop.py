"""Issue 43, item 6: Stop pressed twice (a double click, ten presses at once) is one Stop, and the run ends stopped with
its adapter; ending at once is its own action (JobManager.end_now, the page's confirmed End now)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from core.config.settings import demo_config
from core.jobs.manager import JobManager
from core.jobs.view import job_view
from tests.helpers import group_members
from tests.tiny_child import TINY_CHILD

WAIT = 240  # generous bounds for a busy 2-core machine; never a timing assert


def _wait_for(predicate, what: str):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def test_ten_stops_at_once_are_one_stop_and_the_run_keeps_its_adapter(tmp_path, demo_model_path):
    mgr = JobManager()
    job = mgr.start(demo_config(max_steps=100000, output_dir=str(tmp_path / "runs"), run_name="presses"))
    _wait_for(lambda: any(e["kind"] == "step" for e in job.events_since(0)) or not job.running, "a step")
    assert job.running, job_view(job).message
    barrier = threading.Barrier(10)

    def press():
        barrier.wait()
        mgr.stop()

    presses = [threading.Thread(target=press) for _ in range(10)]
    for p in presses:
        p.start()
    for p in presses:
        p.join()
    mgr.stop()  # and once more, later: still the same Stop
    assert job.wait(WAIT)
    v = job_view(job)
    assert v.state == "stopped", v.message
    assert Path(v.adapter_dir, "adapter_model.safetensors").is_file()
    assert group_members(job.pid) == []


def test_end_now_ends_at_once_without_an_adapter_and_says_so(tmp_path):
    mgr = JobManager(program=TINY_CHILD)  # the manager's real spawn, Stop and kill; a child that never trains
    assert mgr.end_now() is None  # nothing running
    job = mgr.start(demo_config(output_dir=str(tmp_path / "runs"), run_name="now"))
    _wait_for(lambda: any(e["kind"] == "run" for e in job.events_since(0)), "the child's run event")
    assert mgr.end_now() is job
    assert job.wait(WAIT)
    v = job_view(job)
    assert v.state == "failed" and "End now" in v.message and "no adapter" in v.message
    assert not Path(job.folder, "adapter").exists()
    assert group_members(job.pid) == []


CHILD = textwrap.dedent("""
    import sys, threading, time
    from core.jobs.supervise import stop_on_signals
    stop = threading.Event()
    stop_on_signals(stop, sys.argv[1])
    print("ready", flush=True)
    while not stop.is_set():
        time.sleep(0.01)
    print("stopping", flush=True)
    time.sleep(float(sys.argv[2]))
    print("saved", flush=True)
""")


def test_a_double_ctrl_c_is_one_stop_for_the_child(tmp_path):
    """The child's own handler: Ctrl-C twice at once (a key held, a double press) still finishes and saves."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), "1.0"], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent, env=dict(os.environ, PYTHONPATH="."))
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline().strip() == "stopping"  # the first press was taken...
    proc.send_signal(signal.SIGINT)  # ...and the second comes while it finishes (well within REPEAT_S)
    out, _ = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0 and out.split() == ["saved"]
