"""Runs and the actions (Try it, merge, GGUF export) start warm (core/jobs/warm.py): the job manager forks each
`python -m core.train` and `python -m core.jobs.act` from a server that has imported the libraries once. A warm child
is the process a cold one would be (same command line, environment, pid, session, log file, exit code); where the
forked state cannot be trusted it becomes that cold process itself.

Real children of the real CLI on the tiny demo model; each test starts what it needs.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from core.config.settings import demo_config
from core.jobs.manager import JobManager
from core.jobs.view import job_view

WAIT = 240  # a busy 2-core machine; never a timing assert
ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux-only")


def finished(mgr: JobManager, tmp_path, name: str):
    job = mgr.start(demo_config(max_steps=2, output_dir=str(tmp_path / "runs"), run_name=name))
    assert job.wait(WAIT)
    view = job_view(job)
    assert view.state == "completed", view.message
    run = next(e for e in job.events_since(0) if e["kind"] == "run")
    assert run["pid"] == job.pid  # the process the manager follows is the one that trained
    assert (tmp_path / "runs" / name / "train.log").read_text().strip()  # its output went to the run's log
    return run


def test_a_run_starts_warm_and_a_changed_environment_starts_cold_in_the_same_process(tmp_path, demo_model_path):
    """A run and then a Try it child start warm, and a run after a change to the environment starts cold.

    In a process of its own: the fork server is one per process (multiprocessing's), started with the environment
    of its first use, so this test does not inherit one an earlier test started in another environment.

    That process is the app as `python /path/to/app.py` runs it from a home folder: its sys.path names the
    repository, its working folder does not. (Python 3.11's fork server drops the sys.path it is handed, so there
    `import core` failed and every run started cold, every browser test's run included.)"""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = (
        f"import json, os, sys\nsys.path.insert(0, {str(ROOT)!r})\n"  # what `python /path/app.py` gets: its folder
        "from pathlib import Path\n"
        "from tests.test_warm import finished\n"
        "from core.jobs.manager import JobManager\n"
        "mgr = JobManager()\n"
        "mgr.prepare()\n"
        "out = Path(sys.argv[1])\n"
        "starts = [finished(mgr, out, 'warm')['start']]\n"
        # Try it's child forks from the same server (core/jobs/actions.py) and answers from the warm run's adapter
        "adapter = next(e for e in mgr.current().events_since(0) if e['kind'] == 'done')['adapter_dir']\n"
        "act = mgr.actions.try_child(adapter)\n"
        "asked = act.ask(prompt='Hello', max_new_tokens=2, temperature=0.0, top_p=0.9, seed=0, template=True)\n"
        "while act.running and not any(e.get('request') == asked and e['kind'] == 'answered' for e in act.events_since(0)):\n"
        "    act.wait(0.1)\n"
        "answered = [e for e in act.events_since(0) if e['kind'] == 'answered']\n"
        "assert answered and answered[0]['status'] == 'completed', act.events_since(0)[-3:]\n"
        "starts.append(next(e for e in act.events_since(0) if e.get('phase') == 'loading')['start'])\n"
        # a variable the libraries read at import (huggingface_hub's constants) that the server read differently
        "os.environ['HF_HUB_ETAG_TIMEOUT'] = '17'\n"
        "starts.append(finished(mgr, out, 'changed')['start'])\n"
        "print(json.dumps([*starts, act.pid]), flush=True)\n"
        # the app dies without a word (what SIGKILL leaves): its Try it child, loaded and idle, must end with it
        "os._exit(0)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HUB_ETAG_TIMEOUT")}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr[-2000:]
    warm, try_it, cold, try_pid = json.loads(done.stdout.strip().splitlines()[-1])
    assert warm == "warm" and try_it == "warm"
    assert cold.startswith("cold: the run's environment differs") and "HF_HUB_ETAG_TIMEOUT" in cold, cold
    try:  # the fork server ends with the app, and so does the child (its PR_SET_PDEATHSIG, Try it's watch of the app)
        psutil.Process(try_pid).wait(WAIT)  # raises TimeoutExpired if it outlives the app
    except psutil.NoSuchProcess:
        pass


def test_warm_start_off_runs_a_new_interpreter(tmp_path, monkeypatch, demo_model_path):
    monkeypatch.setenv("MEMTUNE_WARM_START", "0")
    assert finished(JobManager(), tmp_path, "off")["start"] == ""


def test_the_servers_state_is_checked_before_a_run_trusts_it():
    """What the child reads to decide (core/train/preload.py), on this machine: no CUDA, no thread started by the
    imports beyond the allocator helpers it counted, and only memtune's own per-run variables ignored."""
    from core.train import preload

    env = dict(preload.STARTED_WITH, MEMTUNE_PARENT_PID="1", MEMTUNE_NUM_THREADS="3", PYTHONUNBUFFERED="1")
    assert preload.fork_safe(env) == ""
    assert preload.differs(dict(env, HF_HOME="/elsewhere")) == ["HF_HOME"]
    assert "environment differs" in preload.fork_safe({k: v for k, v in env.items() if k != "PATH"})
    assert preload.fork_safe(dict(env, PYTEST_CURRENT_TEST="x", COLUMNS="80")) == ""  # read when needed, not at import
    assert preload.SAFE_THREADS >= 1 and not preload.CUDA_STARTED
    assert os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"  # set before torch, so is_available() stays fork-safe


def test_what_lives_as_long_as_the_process_is_made_without_collections_and_skipped_by_later_ones():
    """core.files.long_lived, around the libraries' imports in the app, the CLI and the fork server: gc walked their
    ~600k objects in a dozen full collections while they loaded, then again in each of a run's own collections."""
    import gc

    from core.files import long_lived

    full = []
    count = lambda phase, info: full.append(1) if phase == "start" and info["generation"] == 2 else None  # noqa: E731
    gc.callbacks.append(count)
    try:
        frozen = gc.get_freeze_count()
        with long_lived():
            assert not gc.isenabled()
            made = []
            for _ in range(50_000):  # cycles, as modules and classes are: each one counts toward a collection
                node = {}
                node["self"] = node
                made.append(node)
        assert full == [] and gc.isenabled()
        assert gc.get_freeze_count() >= frozen + 50_000  # in the permanent generation: no collection walks them
        gc.disable()
        with long_lived():
            pass
        assert not gc.isenabled()  # a caller that had turned gc off keeps it off
        for node in made:  # frozen: no collection frees them, so their cycles are broken by hand
            node.clear()
    finally:
        gc.enable()
        gc.callbacks.remove(count)
