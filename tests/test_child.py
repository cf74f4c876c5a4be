"""One run = one child process: the job manager runs `python -m core.train` on the tiny demo model (no fakes).

Stop (the stop file) saves an adapter; End now ends the process group at once; a child killed by hand
becomes a failed run with a clear message and the next Start works; nothing is left behind; the CLI reports a
user's mistake in one line without a traceback.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.config.settings import demo_config
from core.jobs.manager import JobManager
from core.jobs.view import job_view
from tests.helpers import group_members, train_cli

ROOT = Path(__file__).resolve().parent.parent
WAIT = 240  # generous bounds for a busy 2-core machine; never a timing assert


def wait_for(predicate, timeout: float = WAIT, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def first_step(job) -> None:
    wait_for(lambda: any(e["kind"] == "step" for e in job.events_since(0)) or not job.running, what="a step")
    assert job.running, job_view(job).message


def long_demo(tmp_path, name: str):
    return demo_config(max_steps=100000, output_dir=str(tmp_path / "runs"), run_name=name)


def check_a_finished_child(mgr: JobManager, job, run: Path, steps: int) -> None:
    """A started run: a child process in its own folder, chosen and written before it runs, followed to the end."""
    assert job.folder == str(run) and (run / "config.yaml").is_file()  # chosen and written before the child runs
    assert job.pid and job.pid != os.getpid()
    assert mgr.is_running(run)
    assert job.wait(WAIT)
    v = job_view(job)
    assert v.state == "completed", v.message
    assert v.step == steps and Path(v.adapter_dir, "adapter_config.json").is_file()
    announced = [e for e in job.events_since(0) if e["kind"] == "run"]
    assert announced[0]["pid"] == job.pid  # the engine ran in that child
    assert announced[0]["threads"] == max(1, len(os.sched_getaffinity(0)) - 1)  # a core left for the page
    on_disk = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in on_disk] == [e["kind"] for e in job.events_since(0)]  # followed, line for line
    assert (run / "train.log").stat().st_size > 0  # the child's output went to a file, not a pipe
    assert not (run / "STOP").exists()
    assert group_members(job.pid) == []


def test_stop_saves_an_adapter_and_leaves_nothing_running(tmp_path, demo_model_path):
    mgr = JobManager()
    job = mgr.start(long_demo(tmp_path, "stop"))
    first_step(job)
    assert mgr.stop() is job and job.stopping
    assert job.wait(WAIT)
    v = job_view(job)
    assert v.state == "stopped", v.message
    assert 0 < v.step < 100000 and Path(v.adapter_dir, "adapter_model.safetensors").is_file()
    assert any("Stop requested" in line for line in v.log)  # the child's own answer
    assert not Path(job.folder, "STOP").exists()
    assert group_members(job.pid) == []
    assert mgr.stop() is None  # nothing left to stop


def test_end_now_ends_the_process_group_at_once(tmp_path, demo_model_path):
    mgr = JobManager()
    job = mgr.start(long_demo(tmp_path, "twice"))
    first_step(job)
    mgr.stop()
    mgr.end_now()
    assert job.wait(WAIT)
    v = job_view(job)
    assert v.state == "failed" and "End now" in v.message
    assert not (Path(job.folder) / "adapter").exists()  # ended without finishing a save
    assert json.loads(Path(job.folder, "summary.json").read_text())["status"] == "failed"  # History shows it
    assert group_members(job.pid) == []


def test_a_killed_child_is_a_failed_run_and_the_next_start_is_a_child_process_in_its_own_folder(tmp_path, demo_model_path):
    mgr = JobManager()
    job = mgr.start(long_demo(tmp_path, "killed"))
    first_step(job)
    os.kill(job.pid, signal.SIGKILL)
    assert job.wait(WAIT)
    v = job_view(job)
    assert v.state == "failed"
    assert "died unexpectedly" in v.message and "SIGKILL" in v.message and "train.log" in v.message
    events = [json.loads(line) for line in Path(job.folder, "events.jsonl").read_text().splitlines()]
    assert events[-1]["kind"] == "done" and events[-1]["status"] == "failed"
    assert json.loads(Path(job.folder, "summary.json").read_text())["exit_code"] == -signal.SIGKILL
    assert not mgr.busy() and group_members(job.pid) == []

    # The next Start works, and is an ordinary run from start to end (one child process less than a test of its own).
    again = mgr.start(demo_config(max_steps=3, output_dir=str(tmp_path / "runs"), run_name="child"))
    check_a_finished_child(mgr, again, tmp_path / "runs" / "child", steps=3)


def test_settings_the_child_refuses_are_a_failed_run_with_the_reason(tmp_path):
    mgr = JobManager()
    job = mgr.start(demo_config(max_steps=-3, output_dir=str(tmp_path / "runs"), run_name="bad"))
    assert job.wait(WAIT)
    v = job_view(job)
    assert v.state == "failed" and v.error_type == "config" and "max_steps" in v.message
    assert "died" not in v.message  # the child said why itself; the manager added nothing
    assert json.loads((tmp_path / "runs" / "bad" / "summary.json").read_text())["error_type"] == "config"


def test_shutdown_stops_then_ends_the_child(tmp_path, demo_model_path):
    """What app.py calls on Ctrl-C, SIGTERM and exit: no trainer outlives the app."""
    mgr = JobManager()
    job = mgr.start(long_demo(tmp_path, "shutdown"))
    first_step(job)
    mgr.shutdown(grace_s=WAIT)  # a healthy child stops after its step and saves
    assert not job.running and group_members(job.pid) == []
    assert job_view(job).state == "stopped"


def test_a_child_whose_app_died_stops_and_saves(tmp_path, demo_model_path):
    """The app killed with SIGKILL cannot clean up: the child notices its parent is gone, stops and saves."""
    script = (
        "import sys, time\n"
        "from core.config.settings import demo_config\n"
        "from core.jobs.manager import JobManager\n"
        f"job = JobManager().start(demo_config(max_steps=100000, output_dir={str(tmp_path / 'runs')!r},"
        " run_name='orphan'))\n"
        "print(job.pid, flush=True)\n"
        "while not any(e['kind'] == 'step' for e in job.events_since(0)):\n"
        "    time.sleep(0.1)\n"
        "print('stepping', flush=True)\n"
        "time.sleep(600)\n")
    app = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        child = int(app.stdout.readline())
        assert app.stdout.readline().strip() == "stepping"
    finally:
        app.kill()
        app.wait()
    wait_for(lambda: not group_members(child), what="the orphaned child to end")
    run = tmp_path / "runs" / "orphan"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "stopped" and (run / "adapter" / "adapter_model.safetensors").is_file()


def test_sigterm_to_the_app_ends_its_training_child(tmp_path, demo_model_path):
    """app.py's exit wiring (SIGTERM -> KeyboardInterrupt -> atexit -> the manager's shutdown), without the web
    server."""
    script = (
        "import os, signal, time\n"
        "import app\n"
        "from core.config.settings import demo_config\n"
        "from core.jobs.manager import JobManager\n"
        "manager = JobManager()\n"
        "app.end_training_on_exit(manager)\n"
        f"job = manager.start(demo_config(max_steps=100000, output_dir={str(tmp_path / 'runs')!r}, run_name='app'))\n"
        "print(job.pid, flush=True)\n"
        "while not any(e['kind'] == 'step' for e in job.events_since(0)):\n"
        "    time.sleep(0.1)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(600)\n")
    app = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=WAIT)
    child = int(app.stdout.split()[0])
    assert group_members(child) == []  # gone by the time the app has exited
    summary = json.loads((tmp_path / "runs" / "app" / "summary.json").read_text())
    assert summary["status"] == "stopped"  # it was asked to stop and saved, not just killed


def test_cli_user_errors_are_one_message_without_a_traceback(tmp_path, demo_model_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no instruction or response columns"}\n' * 5, encoding="utf-8")
    out = str(tmp_path / "runs")
    code, _, err = train_cli(capfd, "--demo", "--set", f"dataset={bad}", "--set", f"output_dir={out}",
                             "--set", "max_steps=2")
    assert code != 0
    assert "Traceback" not in err and "(data)" in err
    assert err.count("match no known format") == 1, err  # said once, not three times
    logged = (next((tmp_path / "runs").glob("*")) / "events.jsonl").read_text()
    assert "Traceback" in logged  # kept for a bug report, in the run's own log
    code, _, err = train_cli(capfd, "--demo", "--set", "max_steps=-3", "--set", f"output_dir={out}")
    assert code != 0 and "Traceback" not in err and "max_steps" in err
    # The real entry point once (`python -m core.train`: its exit status), on a mistake it sees before any import.
    missing = subprocess.run([sys.executable, "-m", "core.train", "--config", str(tmp_path / "nope.yaml")],
                             cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                             timeout=WAIT)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr and "nope.yaml" in missing.stderr
