"""The app's model-running actions in child processes (core/jobs/actions.py, core/jobs/act.py): Try it, merge and
GGUF export never load a model in the app's process, a child killed with SIGKILL becomes a failed action with a
message, and the next action starts a fresh child. Real children on the demo model (CPU)."""

import json
import os
import subprocess
import sys
import signal
from pathlib import Path

import pytest

from core.jobs.actions import ActionBusy, sweep_orphans, this_app
from core.jobs.manager import JobManager

SETTINGS = dict(max_new_tokens=6, temperature=0.0, top_p=0.9, seed=0, template=True)


@pytest.fixture
def manager():
    m = JobManager()  # each test its own: nothing shared, nothing patched
    yield m
    m.shutdown()


def answer(action, n, timeout=300):
    """The `answered` event of request n, or the `done` event if the child ended first."""
    import time

    deadline = time.monotonic() + timeout  # a guard against a hang only; nothing asserts on time
    while time.monotonic() < deadline:
        for e in action.events_since(0):
            if e.get("kind") == "answered" and e.get("request") == n:
                return e
        if not action.running:
            return action.result()
        time.sleep(0.05)
    raise AssertionError(f"no answer to request {n}: {action.events_since(0)[-5:]}")


def test_try_child_answers_survives_sigkill_and_the_next_try_starts_fresh(finished_run, manager):
    adapter = finished_run.result.adapter_dir
    actions = manager.actions
    first = actions.try_child(adapter)
    n = first.ask(prompt="Translate the word 'cat' into French.", **SETTINGS)
    got = answer(first, n)
    assert got["kind"] == "answered" and got["status"] == "completed" and got["tuned"].strip(), got
    assert actions.try_child(adapter) is first  # the same adapter: the loaded child answers again
    n2 = first.ask(prompt="Hello", **SETTINGS)
    assert answer(first, n2)["status"] == "completed"

    os.kill(first.pid, signal.SIGKILL)  # what the kernel's OOM killer does
    assert first.wait(60)
    done = first.result()
    error = next(e for e in first.events_since(0) if e["kind"] == "error")
    assert done["status"] == "failed" and error["error_type"] == "died" and error["key"] == "action.died_oom"
    assert "SIGKILL" in error["message"] and "still running" in error["message"]

    second = actions.try_child(adapter)  # a fresh child, not the dead one
    assert second is not first and second.pid != first.pid
    assert answer(second, second.ask(prompt="Hello", **SETTINGS))["status"] == "completed"


def test_stop_ends_a_try_child_and_says_so(finished_run, manager):
    action = manager.actions.try_child(finished_run.result.adapter_dir, owner="visitor-a")
    assert manager.actions.stop(owner="visitor-b") is None  # another visitor's child is not theirs to stop
    assert manager.actions.stop(owner="visitor-a", kind="try") is action
    assert action.wait(60)
    assert action.result()["status"] == "stopped"
    assert next(e for e in action.events_since(0) if e["kind"] == "error")["key"] == "action.stopped"


def test_merge_in_a_child_reports_phases_and_a_refusal_is_a_failure_record(finished_run, manager, tmp_path):
    adapter = finished_run.result.adapter_dir
    merge = manager.actions.start("merge", {"adapter": adapter, "out_dir": str(tmp_path / "merged")})
    with pytest.raises(ActionBusy):  # one model-running action at a time
        manager.actions.start("gguf", {"adapter": adapter, "formats": ["f16"]})
    assert merge.wait(300)
    done = merge.result()
    assert done["status"] == "completed", merge.events_since(0)[-3:]
    assert Path(done["path"]).is_dir() and any(Path(done["path"]).glob("*.safetensors"))
    phases = [e["phase"] for e in merge.events_since(0) if e["kind"] == "phase"]
    assert phases[:2] == ["starting", "loading"] and "merging" in phases
    again = manager.actions.start("merge", {"adapter": adapter, "out_dir": str(tmp_path / "merged")})
    assert again.wait(300)  # the folder exists and replacing was not asked for: refused, in the child's own words
    error = next(e for e in again.events_since(0) if e["kind"] == "error")
    assert again.result()["status"] == "failed" and error["error_type"] == "refused" and error["message"]


def test_stop_ends_a_merge_child_at_once(finished_run, manager, tmp_path):
    """Merge's Stop: nothing to save halfway through a merge, so its child is ended; the record says it was
    stopped, and no merged folder is left claiming to be complete."""
    merge = manager.actions.start("merge", {"adapter": finished_run.result.adapter_dir,
                                            "out_dir": str(tmp_path / "merged")})
    assert manager.actions.stop(kind="merge") is merge  # at once: the child is still importing its libraries
    assert merge.wait(60)
    assert merge.result()["status"] == "stopped" and not (tmp_path / "merged" / "config.json").exists()
    error = next(e for e in merge.events_since(0) if e["kind"] == "error")
    assert error["key"] == "action.stopped" and error["what"] == "merge"
    assert not manager.actions.busy()


def test_the_pages_merge_stop_ends_the_merge_and_the_page_says_so(finished_run, manager, tmp_path):
    """ui.tryexport: Merge runs in the child of the page's own manager (passed in its state, not imported), and the
    Stop beside it ends that child; the merge's answer says it was stopped."""
    import threading
    import time

    from ui.state import AppState
    from ui.tryexport import TryExportTab, on_action_stop, on_merge

    x = TryExportTab(*(object() for _ in range(9)), app=AppState(manager))
    said = []
    merging = threading.Thread(target=lambda: said.append(on_merge(
        x, "en", finished_run.result.adapter_dir, str(tmp_path / "m"), False, True, progress=None)))
    merging.start()
    stopped = ""
    while not stopped and merging.is_alive():  # until the merge's child exists; it imports torch for seconds
        stopped = on_action_stop(x, "merge", "en")
        time.sleep(0.01)
    merging.join(120)
    assert "The merge was stopped" in stopped and "The merge was stopped" in said[0], (stopped, said)
    assert not (tmp_path / "m" / "config.json").exists()


def _action_folder(where: Path, kind: str, app, tag: str = "abc123") -> Path:
    folder = where / f"memtune-{kind}-{tag}"
    folder.mkdir()
    (folder / "action.json").write_text(json.dumps({"kind": kind, "params": {}, **({"app": app} if app else {})}))
    (folder / "merged.safetensors").write_bytes(b"0" * 64)
    return folder


def test_an_app_killed_mid_action_leaves_no_folder_and_a_live_apps_folders_stay(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    mine = this_app()
    orphan = _action_folder(tmp_path, "merge", {"pid": gone.pid, "started": mine["started"]})
    reused = _action_folder(tmp_path, "gguf", {"pid": mine["pid"], "started": mine["started"] - 3600})  # pid reused
    live = _action_folder(tmp_path, "try", mine)
    unnamed = _action_folder(tmp_path, "merge", None, "old")  # an older version's: whose it is is unknown
    other = tmp_path / "memtune-launch-xyz"  # not an action's folder
    other.mkdir()

    removed = sweep_orphans(tmp_path)

    assert sorted(removed) == sorted([orphan, reused])
    assert not orphan.exists() and not reused.exists()
    assert live.exists() and unnamed.exists() and other.exists()
