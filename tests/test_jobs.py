"""The process-wide job manager: one run at a time, Stop, events kept for reattaching, and the page's view."""

import threading
import time
from pathlib import Path

import pytest

from core.config import TrainConfig, demo_config
from core.events import JsonlSink, make_event
from core.jobs import JobBusy, JobManager, format_event, job_view, latest_run_dir, view


class FakeRun:
    """Stands in for run_training: emits a few events, then waits for Stop (or `release`)."""

    def __init__(self, steps: int = 3):
        self.steps = steps
        self.release = threading.Event()
        self.started = threading.Event()

    def __call__(self, cfg, sink=None, stop=None):
        sink(make_event("run", run_dir="/tmp/fake-run", config=cfg.to_dict(), total_steps=None))
        sink(make_event("phase", phase="training", message="Training", progress=0.0))
        for step in range(1, self.steps + 1):
            sink(make_event("step", step=step, total_steps=self.steps, epoch=step / self.steps, tokens=10 * step,
                            tokens_per_s=100.0, elapsed_s=step, eta_s=self.steps - step))
            sink(make_event("metrics", step=step, total_steps=self.steps, epoch=step / self.steps, loss=5.0 - step,
                            learning_rate=1e-3, grad_norm=1.0))
            sink(make_event("log", level="info", message=f"step {step}/{self.steps}  loss {5.0 - step:.4f}  lr 1e-3"))
        self.started.set()
        while not (stop.is_set() or self.release.is_set()):
            time.sleep(0.01)
        status = "stopped" if stop.is_set() else "completed"
        sink(make_event("done", status=status, run_dir="/tmp/fake-run", adapter_dir="/tmp/fake-run/adapter",
                        summary={"final_loss": 2.0}, message=status))
        return None


def test_second_start_is_refused_while_a_job_runs():
    fake = FakeRun()
    mgr = JobManager(runner=fake)
    job = mgr.start(TrainConfig())
    assert fake.started.wait(5)
    assert mgr.busy()
    with pytest.raises(JobBusy, match="already running"):
        mgr.start(demo_config())
    fake.release.set()
    assert job.wait(5)
    assert not mgr.busy()
    again = mgr.start(demo_config())  # free again once the first has ended
    fake.release.set()
    assert again.wait(5) and again.id == job.id + 1


def test_concurrent_starts_from_many_tabs_start_exactly_one():
    fake = FakeRun()
    mgr = JobManager(runner=fake)
    results, barrier = [], threading.Barrier(8)

    def tab():
        barrier.wait()
        try:
            results.append(mgr.start(TrainConfig()))
        except JobBusy as exc:
            results.append(exc)

    threads = [threading.Thread(target=tab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(not isinstance(r, JobBusy) for r in results) == 1
    fake.release.set()
    mgr.current().wait(5)


def test_stop_ends_the_run_and_is_logged():
    fake = FakeRun()
    mgr = JobManager(runner=fake)
    assert mgr.stop() is None  # nothing to stop
    job = mgr.start(TrainConfig())
    assert fake.started.wait(5)
    assert mgr.stop() is job
    assert job.wait(5)
    v = job_view(job)
    assert v.state == "stopped"
    assert any("Stop requested" in line for line in v.log)


def test_a_crashing_runner_becomes_a_failed_job_not_a_dead_thread():
    def boom(cfg, sink=None, stop=None):
        sink(make_event("phase", phase="resolving", message="Finding"))
        raise RuntimeError("kaput")

    mgr = JobManager(runner=boom)
    job = mgr.start(TrainConfig())
    assert job.wait(5)
    v = job_view(job)
    assert v.state == "failed"
    assert "kaput" in v.message
    assert not mgr.busy()


def test_view_reads_progress_losses_and_collapses_heartbeats():
    events = [
        make_event("run", run_dir="runs/x", config={}, total_steps=None),
        make_event("phase", phase="loading_model", message="Loading"),
        make_event("phase", phase="loading_model", message="Loading (2 s)"),
        make_event("phase", phase="loading_model", message="Loading (4 s)"),
        make_event("run", run_dir="runs/x", config={}, total_steps=None),
        make_event("step", step=1, total_steps=10, tokens=5, tokens_per_s=50.0, elapsed_s=1.0, eta_s=9.0),
        make_event("step", step=2, total_steps=10, tokens=10, tokens_per_s=50.0, elapsed_s=2.0, eta_s=8.0),
        make_event("metrics", step=2, total_steps=10, epoch=0.2, loss=3.5, learning_rate=1e-3, grad_norm=1.0),
        make_event("log", level="info", message="step 2/10  loss 3.5000  lr 1.00e-03"),
        make_event("step", step=3, total_steps=10, tokens=15, tokens_per_s=50.0, elapsed_s=3.0, eta_s=7.0),
        make_event("log", level="info", message="step 3/10  loss 9.9900  lr 1.00e-03"),  # a log line is not data
        make_event("metrics", step=4, total_steps=10, epoch=0.4, loss=2.25, learning_rate=1e-3, grad_norm=None),
        make_event("metrics", step=4, total_steps=10, epoch=0.4, loss=2.0, learning_rate=1e-3, grad_norm=1.0),
        make_event("metrics", step=5, total_steps=10, epoch=0.5, loss=None, learning_rate=1e-3),  # no loss: skipped
        make_event("step", step=4, total_steps=10, tokens=20, tokens_per_s=50.0, elapsed_s=4.0, eta_s=6.0),
    ]
    v = view(events, running=True)
    assert v.state == "running" and v.step == 4 and v.total_steps == 10
    assert v.losses == [(2, 3.5), (4, 2.0)]  # from metrics events only; a step logged twice (resume): the latest
    assert v.last_loss == 2.0
    assert v.eta_s == 6.0 and v.tokens_per_s == 50.0 and v.fraction == pytest.approx(0.4)
    assert sum("loading_model" in line for line in v.log) == 1 and "(4 s)" in "\n".join(v.log)
    assert sum("run folder" in line for line in v.log) == 1
    assert view(events, running=True, stopping=True).state == "stopping"
    assert view(events, running=False, from_disk=True).state == "interrupted"
    assert view([]).state == "idle"


def test_is_running_names_the_running_jobs_folder(tmp_path):
    fake = FakeRun()
    mgr = JobManager(runner=fake)
    assert not mgr.is_running("/tmp/fake-run")
    job = mgr.start(TrainConfig())
    assert fake.started.wait(5)
    assert job.run_dir == "/tmp/fake-run"
    assert mgr.is_running("/tmp/fake-run") and mgr.is_running("/tmp/../tmp/fake-run")
    assert not mgr.is_running(tmp_path)
    fake.release.set()
    assert job.wait(5)
    assert not mgr.is_running("/tmp/fake-run")  # finished: deletable, resumable


def test_format_event_covers_every_kind():
    assert "ERROR (oom)" in format_event(make_event("error", error_type="oom", message="out of memory"))
    assert "WARNING" in format_event(make_event("log", level="warning", message="careful"))
    assert "finished: completed" in format_event(make_event("done", status="completed", message="ok"))
    assert format_event(make_event("step", step=1)) is None


def test_an_earlier_run_is_shown_from_its_events_file(tmp_path):
    run = tmp_path / "runs" / "run-1"
    sink = JsonlSink(run / "events.jsonl")
    sink(make_event("run", run_dir=str(run), config=demo_config().to_dict(), total_steps=None))
    sink(make_event("step", step=3, total_steps=9))
    sink(make_event("metrics", step=3, total_steps=9, loss=1.5, learning_rate=1e-3, grad_norm=0.5))
    assert latest_run_dir(tmp_path / "runs") == run
    assert latest_run_dir(tmp_path / "nothing") is None
    mgr = JobManager(runner=FakeRun())
    job = mgr.load_run(run)
    assert job.config == demo_config() and not job.running
    v = job_view(job)
    assert v.state == "interrupted" and v.step == 3 and v.losses == [(3, 1.5)]
    assert mgr.load_run(run) is job  # never replaces what the manager already shows
    assert not mgr.busy()


def test_the_real_engine_runs_through_the_manager(tmp_path, demo_model_path):
    """No fakes: the demo trains a few steps in the background thread and its events reach the view."""
    mgr = JobManager()
    job = mgr.start(demo_config(max_steps=10, output_dir=str(tmp_path / "runs"), run_name="ui-job"))
    assert job.wait(240)
    v = job_view(job)
    assert v.state == "completed", v.message
    assert v.step == 10 and v.losses and Path(v.adapter_dir, "adapter_config.json").is_file()
    assert (tmp_path / "runs" / "ui-job" / "events.jsonl").is_file()
