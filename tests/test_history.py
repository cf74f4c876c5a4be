"""Run history over folders written by the real engine (core.train.recipe.run_training on the demo), plus damaged ones."""

import json
import os
import shutil
import time

import pytest

from core.config.settings import TrainConfig
from core.runs.events import read_events
from core.files import write_marker
from core.runs.history import (HistoryError, adapter_choices, delete_run, list_runs, load_run, resume_config,
                          run_info)
from core.train.recipe import run_training
from tests.helpers import checkpointed_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_model_path):
    """output_dir with one engine run (5 steps, checkpoint at 5) next to foreign and half-written folders."""
    out = tmp_path_factory.mktemp("runs")
    result = checkpointed_run(out, "five", max_steps=5, save_steps=5)
    (out / "foreign").mkdir()  # not a memtune run: no config.yaml
    (out / "foreign" / "notes.txt").write_text("hello")
    (out / "stray-file.txt").write_text("not a folder")
    broken = out / "broken"  # a crash while writing: garbage config, a cut-off events line, no summary
    broken.mkdir()
    write_marker(broken, "run")  # memtune marks a run folder first, before anything else is written
    (out / "lookalike").mkdir()  # not memtune's: a config.yaml is a common name
    (out / "lookalike" / "config.yaml").write_text("x\n")
    (broken / "config.yaml").write_text("model: [unclosed\n")
    (broken / "events.jsonl").write_text('{"kind": "run", "time": 1.0}\n{"kind": "step", "st')
    (broken / "summary.json").write_text("{not json")
    old = time.time() - 3600
    os.utime(broken / "events.jsonl", (old, old))
    return out, result


def test_history_lists_engine_runs_newest_first_and_skips_foreign_folders(runs):
    out, result = runs
    infos = list_runs(out)
    assert [r.name for r in infos] == ["five", "broken"]  # "five" started later than the broken one (t=1.0)
    five = infos[0]
    s = result.summary
    assert five.run_dir == result.run_dir and five.status == "completed"
    assert five.model == "memtune/demo-tiny-llama" and five.dataset == "memtune/demo"
    assert five.final_loss == s["final_loss"] and five.first_loss == s["first_loss"]
    assert five.steps == 5 and five.duration_s == s["runtime_s"]
    assert five.adapter_dir == result.adapter_dir
    assert five.checkpoint.endswith("checkpoint-5") and five.resumable
    assert five.peak_gib is None  # a CPU run has no GPU peak
    assert five.date.startswith(time.strftime("%Y-"))
    assert len(five.row()) == 10
    assert infos[1].status == "interrupted" and infos[1].model == "" and infos[1].adapter_dir is None
    assert adapter_choices(out) == [(f"five (memtune/demo-tiny-llama, loss {s['final_loss']:.3f})",
                                     result.adapter_dir)]
    assert list_runs(out / "does-not-exist") == []


def test_a_running_run_is_shown_from_its_events(runs, tmp_path):
    out, result = runs
    copy = tmp_path / "live"
    shutil.copytree(result.run_dir, copy)
    (copy / "summary.json").unlink()  # as while training: no summary yet
    info = run_info(copy, is_running=lambda p: p == copy)
    assert info.status == "running"
    events = read_events(copy / "events.jsonl")
    losses = [e["loss"] for e in events if e["kind"] == "metrics"]
    assert info.final_loss == losses[-1] and info.first_loss == losses[0] and info.steps == 5
    assert info.duration_s is not None and info.duration_s >= 0
    assert run_info(copy).status == "running"  # no job manager: recent events count as running
    assert run_info(copy, is_running=lambda p: False).status == "interrupted"


def test_load_run_gives_settings_loss_curve_and_summary(runs):
    out, result = runs
    detail = load_run(result.run_dir)
    assert isinstance(detail.config, TrainConfig) and detail.config.max_steps == 5
    assert detail.config_text.startswith("model: memtune/demo-tiny-llama")
    metrics = [e for e in read_events(f"{result.run_dir}/events.jsonl") if e["kind"] == "metrics"]
    assert detail.losses == [(e["step"], e["loss"]) for e in metrics]
    assert [s for s, _ in detail.losses] == [1, 2, 3, 4, 5]
    assert detail.summary["status"] == "completed"
    assert detail.checkpoints[-1].endswith("checkpoint-5")
    with pytest.raises(HistoryError, match="not a memtune run"):
        load_run(out / "foreign")
    broken = load_run(out / "broken")  # unreadable settings: shown as text, no crash
    assert broken.config is None and broken.losses == []


def test_resume_from_history_continues_the_step_count(runs, tmp_path):
    _, result = runs
    run_dir = tmp_path / "five"
    shutil.copytree(result.run_dir, run_dir)  # keep the module's run as it was
    cfg = resume_config(run_dir)
    assert cfg.resume_from == str(run_dir) and cfg.max_steps == 5
    events = []
    resumed = run_training(cfg.replace(max_steps=10), events.append)
    assert resumed.status == "completed", resumed.message
    assert resumed.run_dir == str(run_dir)  # same folder, continued
    assert [e["step"] for e in events if e["kind"] == "step"] == [6, 7, 8, 9, 10]
    info = list_runs(tmp_path)[0]
    assert info.steps == 10 and info.status == "completed"
    assert [s for s, _ in load_run(run_dir).losses] == list(range(1, 11))


def test_resume_needs_a_complete_checkpoint(runs, tmp_path):
    _, result = runs
    run_dir = tmp_path / "five"
    shutil.copytree(result.run_dir, run_dir)
    shutil.rmtree(run_dir / "checkpoints")
    with pytest.raises(HistoryError, match="no complete checkpoint"):
        resume_config(run_dir)
    assert not run_info(run_dir).resumable


def test_delete_refuses_anything_but_a_finished_run_inside_output_dir(runs, tmp_path):
    out, result = runs
    root = tmp_path / "runs"
    root.mkdir()
    run_dir = root / "five"
    shutil.copytree(result.run_dir, run_dir)
    elsewhere = tmp_path / "elsewhere"  # a memtune run, but outside output_dir
    shutil.copytree(result.run_dir, elsewhere)
    (root / "foreign").mkdir()
    nested = run_dir / "inner"
    shutil.copytree(result.run_dir, nested, ignore=shutil.ignore_patterns("checkpoints", "adapter"))

    with pytest.raises(HistoryError, match="not a run folder inside"):
        delete_run(elsewhere, root)
    with pytest.raises(HistoryError, match="not a run folder inside"):
        delete_run(root / ".." / "elsewhere", root)
    with pytest.raises(HistoryError, match="not a run folder inside"):
        delete_run(root, root)
    with pytest.raises(HistoryError, match="not a run folder inside"):
        delete_run(nested, root)
    with pytest.raises(HistoryError, match="not a memtune run"):
        delete_run(root / "foreign", root)
    (root / "link").symlink_to(elsewhere)
    with pytest.raises(HistoryError, match="link"):
        delete_run(root / "link", root)
    with pytest.raises(HistoryError, match="still running"):
        delete_run(run_dir, root, is_running=lambda p: True)
    assert run_dir.is_dir() and elsewhere.is_dir() and (root / "foreign").is_dir()

    deleted = delete_run(run_dir, root, is_running=lambda p: False)
    assert deleted == run_dir.resolve() and not run_dir.exists()
    assert sorted(p.name for p in root.iterdir()) == ["foreign", "link"]  # no hidden leftovers
    assert elsewhere.is_dir()


def test_delete_without_a_job_manager_treats_fresh_events_as_running(runs, tmp_path):
    _, result = runs
    run_dir = tmp_path / "five"
    shutil.copytree(result.run_dir, run_dir)
    (run_dir / "summary.json").unlink()
    with pytest.raises(HistoryError, match="still running"):
        delete_run(run_dir, tmp_path)
    old = time.time() - 3600
    os.utime(run_dir / "events.jsonl", (old, old))  # a crashed run an hour ago
    delete_run(run_dir, tmp_path)
    assert not run_dir.exists()


def test_summary_of_a_failed_run(runs, tmp_path):
    out, result = runs
    run_dir = tmp_path / "failed"
    shutil.copytree(result.run_dir, run_dir, ignore=shutil.ignore_patterns("adapter", "checkpoints"))
    (run_dir / "summary.json").write_text(json.dumps({"status": "failed", "error_type": "oom",
                                                      "message": "The GPU ran out of memory."}))
    info = run_info(run_dir)
    assert info.status == "failed" and info.message.startswith("The GPU ran out")
    assert info.adapter_dir is None and info.final_loss is not None  # last logged loss, from the events
