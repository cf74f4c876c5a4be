"""The app-wide job manager: one run (child process) at a time, events followed for reattaching, the page's view.

Stop, End now, a killed child and the training itself are in test_child.py."""

import threading
import time

import pytest

from core.config.settings import demo_config
from core.runs.events import EventTail, JsonlSink, make_event
from core.jobs.manager import Job, JobBusy, JobManager, latest_run_dir
from core.jobs.view import format_event, job_view


def view(events, running=False, stopping=False, from_disk=False):
    """The page's view of a job that holds `events` (running, being stopped, or shown from an earlier run's file)."""
    job = Job(id=1, config=demo_config(), events=list(events), from_disk=from_disk,
              finished=None if running else time.time())
    if stopping:
        job.stop_event.set()
    return job_view(job)


def stop_at_once(mgr: JobManager, job) -> None:
    """Two Stops: the child's process group ends now (these tests need no adapter)."""
    mgr.end_now()
    assert job.wait(120)


def test_second_start_is_refused_while_a_job_runs(tmp_path):
    mgr = JobManager()
    job = mgr.start(demo_config(output_dir=str(tmp_path)))
    assert mgr.busy() and job.pid
    with pytest.raises(JobBusy, match="already in progress") as busy:
        mgr.start(demo_config(output_dir=str(tmp_path)))
    assert busy.value.key == "msg.one_job" and busy.value.params["model"] == job.config.model  # said by key
    stop_at_once(mgr, job)
    assert not mgr.busy()
    assert job_view(job).state == "failed" and "End now" in job_view(job).message


def test_concurrent_starts_from_many_tabs_start_exactly_one(tmp_path):
    mgr = JobManager()
    results, barrier = [], threading.Barrier(8)

    def tab():
        barrier.wait()
        try:
            results.append(mgr.start(demo_config(output_dir=str(tmp_path))))
        except JobBusy as exc:
            results.append(exc)

    threads = [threading.Thread(target=tab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(not isinstance(r, JobBusy) for r in results) == 1
    assert len(list(tmp_path.iterdir())) == 1  # one run folder, one child
    stop_at_once(mgr, mgr.current())


def test_is_running_names_the_running_jobs_folder_from_the_start(tmp_path):
    mgr = JobManager()
    job = mgr.start(demo_config(output_dir=str(tmp_path / "runs"), run_name="mine"))
    run = tmp_path / "runs" / "mine"
    assert job.run_dir == str(run)  # chosen by the manager, before the child says anything
    assert job_view(job).state == "running" and job_view(job).phase == "starting"  # not the previous run's view
    assert mgr.is_running(run) and mgr.is_running(tmp_path / "runs" / ".." / "runs" / "mine")
    assert not mgr.is_running(tmp_path)
    stop_at_once(mgr, job)
    assert not mgr.is_running(run)  # finished: deletable, resumable


def test_an_unstartable_run_is_a_failed_job_not_an_exception(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    mgr = JobManager()
    job = mgr.start(demo_config(output_dir=str(blocker / "runs")))
    v = job_view(job)
    assert not job.running and v.state == "failed" and "Could not start" in v.message
    assert not mgr.busy()


def test_events_are_read_incrementally_and_only_whole_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read() == []  # no file yet
    sink = JsonlSink(path)
    sink(make_event("step", step=1))
    with path.open("a") as fh:
        fh.write('{"kind": "step", "st')  # the writer is mid-line
    assert [e["step"] for e in tail.read()] == [1]
    with path.open("a") as fh:
        fh.write('ep": 2}\n')
    sink(make_event("step", step=3))
    assert [e["step"] for e in tail.read()] == [2, 3]
    assert tail.read() == [] and tail.offset == path.stat().st_size


def test_job_view_folds_only_new_events(tmp_path):
    job = Job(id=1, config=demo_config())
    job.emit(make_event("step", step=1, total_steps=4))
    first = job_view(job)
    job.emit(make_event("metrics", step=2, loss=1.5))
    job.emit(make_event("step", step=2, total_steps=4))
    second = job_view(job)
    assert (first.step, first.losses) == (1, [])  # a snapshot: later events do not change it
    assert (second.step, second.losses) == (2, [(2, 1.5)])
    assert job_view(job) == second == view(job.events_since(0), running=True)


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
    mgr = JobManager()
    job = mgr.load_run(run)
    assert job.config == demo_config() and not job.running
    v = job_view(job)
    assert v.state == "interrupted" and v.step == 3 and v.losses == [(3, 1.5)]
    assert mgr.load_run(run) is job  # never replaces what the manager already shows
    assert not mgr.busy()


def test_the_supervisor_ends_a_child_that_does_not_answer_stop_and_records_why(tmp_path):
    """core.jobs.supervise, shared by the job manager and the launcher: a real child that ignores the stop file."""
    import json
    import signal
    import sys

    from core.runs.events import read_events
    from core.jobs.supervise import Child

    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    run = tmp_path / "run"
    run.mkdir()
    child = Child.spawn(sleeper, run / "STOP", ack_s=0.0, finish_s=600.0)
    child.ask_stop()
    assert (run / "STOP").is_file() and child.stopping
    assert child.follow(poll_s=0.05) == -signal.SIGTERM and child.kill_reason == "no_answer"
    message = child.record_death(run, "died {how}", world_size=2)
    assert message.startswith("The training process did not answer Stop within 0 s and was ended (killed by signal "
                              "SIGTERM)") and "Resume in History" in message
    assert [e["kind"] for e in read_events(run / "events.jsonl")] == ["error", "done"]
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"], summary["exit_code"], summary["world_size"]) == ("failed", -signal.SIGTERM, 2)

    twice = Child.spawn(sleeper, run / "STOP", ack_s=600.0, finish_s=600.0)
    twice.ask_stop()
    twice.end_now()  # End now ends the group at once
    assert twice.follow(poll_s=0.05) == -signal.SIGTERM and twice.kill_reason == "end_now"
    unwritable = Child.spawn(sleeper, tmp_path / "no" / "folder" / "STOP", ack_s=600.0, finish_s=600.0)
    unwritable.ask_stop()
    assert unwritable.follow(poll_s=0.05) == -signal.SIGTERM and unwritable.kill_reason == "unwritable"
    crashed = Child.spawn([sys.executable, "-c", "raise SystemExit(3)"], run / "STOP", ack_s=600.0, finish_s=600.0)
    assert crashed.follow(poll_s=0.05) == 3 and crashed.death_message("died ({how})") == "died (exit code 3)"


def test_public_queue_each_owner_sees_and_stops_only_their_own_and_the_next_starts_when_a_slot_frees(tmp_path):
    """Issue 38 (public mode): A's job runs; B's waits in the queue (place 1, behind A's), C's behind it; B's Stop
    leaves the queue and never touches A's; an owner at their limit is refused; A's end starts C's. Real children."""
    mgr = JobManager()
    a = mgr.start(demo_config(max_steps=100000, output_dir=str(tmp_path / "a")), owner="visitor-a", queue=True,
                  per_owner=1)
    b = mgr.start(demo_config(max_steps=3, output_dir=str(tmp_path / "b")), owner="visitor-b", queue=True, per_owner=1)
    c = mgr.start(demo_config(max_steps=3, output_dir=str(tmp_path / "c")), owner="visitor-c", queue=True, per_owner=1)
    assert a.running and b.waiting and c.waiting and not (tmp_path / "b").exists()  # no folder, no process yet
    assert mgr.position(a) is None and mgr.position(b) == (1, [a]) and mgr.position(c) == (2, [a, b])
    with pytest.raises(JobBusy) as refused:
        mgr.start(demo_config(output_dir=str(tmp_path / "b")), owner="visitor-b", queue=True, per_owner=1)
    assert refused.value.reason == "yours" and refused.value.limit == 1 and refused.value.key == "msg.own_limit"
    assert mgr.current("visitor-b") is b and mgr.current("visitor-a") is a and mgr.current("visitor-z") is None
    assert mgr.current() is a  # the app's own user (the Space owner): the running job
    assert mgr.stop("visitor-z") is None and a.running and not a.stop_event.is_set()  # nothing of theirs
    assert mgr.stop("visitor-b") is b and not b.active and job_view(b).state == "stopped"  # left the queue
    assert a.running and not a.stop_event.is_set() and mgr.position(c) == (1, [a])
    assert mgr.queue() == ([a], [c])
    assert mgr.stop("visitor-a") is a
    assert mgr.end_now("visitor-a") is a  # at once: A's adapter is not this test's (its child need not finish loading)
    assert a.wait(180)
    assert c.wait(300) and job_view(c).state == "completed", job_view(c).message  # started when A's slot freed
    assert c.started >= a.finished and mgr.seconds_per_step  # measured on the runs: the queue's predictions
    assert not (tmp_path / "b").exists()


def test_a_queued_jobs_wait_is_predicted_from_the_jobs_before_it_or_said_unknown():
    from core.jobs.view import predicted_wait

    running = Job(id=1, config=demo_config(max_steps=100))
    running.emit({**make_event("phase", phase="loading"), "time": 1000.0})
    running.emit({**make_event("step", step=20, total_steps=100, elapsed_s=9.0, eta_s=40.0), "time": 1010.0})
    queued = Job(id=2, config=demo_config(max_steps=50), waiting=True)
    # its ETA, then the queued job's steps at the speed measured now (10 s from its start for 20 steps)
    assert predicted_wait([running, queued], None) == pytest.approx(40.0 + 50 * 0.5)
    assert predicted_wait([queued], 2.0) == pytest.approx(50 * 2.0)  # nothing running: the last run's speed
    assert predicted_wait([queued], None) is None  # no speed measured yet: unknown, not a guess
    by_epochs = Job(id=3, config=demo_config(max_steps=-1), waiting=True)
    assert predicted_wait([by_epochs], 2.0) is None  # its steps are not known before it plans its rows
    capped = Job(id=4, config=demo_config(max_steps=10_000), waiting=True, max_s=60.0)
    assert predicted_wait([capped], 1.0) == pytest.approx(60.0)  # the time limit stops it first


def test_twenty_concurrent_starts_of_one_visitor_make_one_job_and_of_twenty_visitors_one_running(tmp_path):
    """Public mode: one visitor's 20 simultaneous Starts give one job (their limit is 1); 20 visitors' give one
    running job and 19 queued, in one order, with no folder or process for the queued ones."""
    mgr = JobManager()
    results, barrier = [], threading.Barrier(20)

    def start(owner: str) -> None:
        barrier.wait()
        try:
            results.append(mgr.start(demo_config(max_steps=100000, output_dir=str(tmp_path / "one")), owner=owner,
                                     queue=True, per_owner=1))
        except JobBusy as exc:
            results.append(exc)

    for owners in (["visitor-same"] * 20, [f"visitor-{i}" for i in range(20)]):
        results.clear()
        threads = [threading.Thread(target=start, args=(o,)) for o in owners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        jobs = [r for r in results if isinstance(r, Job)]
        if len(set(owners)) == 1:
            assert len(jobs) == 1 and all(r.reason == "yours" for r in results if isinstance(r, JobBusy))
            assert mgr.end_now("visitor-same") is jobs[0]  # no adapter needed: the child ends at once
            assert jobs[0].wait(120)
        else:
            running, waiting = mgr.queue()
            assert len(jobs) == 20 and len(running) == 1 and len(waiting) == 19
            assert [mgr.position(j)[0] for j in waiting] == list(range(1, 20))
            for j in waiting:
                mgr.stop(j.owner)  # out of the queue before it starts
            assert mgr.end_now(running[0].owner) is running[0]
            assert running[0].wait(120) and not mgr.busy()
    assert len(list((tmp_path / "one").iterdir())) == 2  # one folder per job that ran, none for the queued ones


def test_a_phase_that_says_how_far_it_is_shows_it_in_the_log_in_each_language(monkeypatch):
    """A long data phase (300,000 rows: most of a minute tokenizing) said only its seconds; the phase is handed a
    function to say how far it is, and its beats carry it: "(12 s, 34%)" on the CLI, in the page's language too."""
    from core.train import callbacks
    from ui import render

    monkeypatch.setattr(callbacks, "HEARTBEAT_S", 0.01)  # a beat at once: the test waits for it, never on a clock
    events, seen = [], threading.Event()

    def sink(e):
        events.append(e)
        if e.get("progress") is not None:
            seen.set()

    with callbacks.phase(sink, "tokenizing", "log.phase.formatting", n=300000, format="dolly") as progressed:
        progressed(0.34)
        assert seen.wait(60)
    beat = next(e for e in events if e.get("progress") is not None)
    assert beat["progress"] == 0.34 and beat["message"].endswith(f"({beat['elapsed_s']} s, 34%)")
    line = format_event(beat)
    assert line.head["progress"] == 0.34 and line.head["seconds"] == beat["elapsed_s"]
    assert render.log_line(line, "fr").endswith(f"de 300\u202f000 lignes (dolly) ({beat['elapsed_s']} s, 34 %)")
    assert render.log_line(line, "pt").endswith(f"300.000 linhas (dolly) ({beat['elapsed_s']} s, 34%)")
    assert format_event(events[0]).head["progress"] is None  # the phase's first line: no beat, no share yet
    v = view([make_event("run", run_dir="runs/x", config={}, total_steps=None), beat], running=True)
    assert v.phase_progress == 0.34 and "34%)" in render.progress_html(v, "en")
    assert "tokenizando 300.000 linhas (dolly) (34%)" in render.progress_html(v, "pt")
