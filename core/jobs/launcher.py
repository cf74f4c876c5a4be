"""The parent of a multi-process run: `python -m core.train` hands over here when the config asks for several
processes (core/gpus/distributed.py decides how many and with which strategy; this module starts and watches them).

It makes the run folder (main machine), runs `accelerate launch` with the workers' command
(`distributed.worker_argv`), turns the first Ctrl-C/SIGTERM into the run folder's stop file (quick repeats are the same press) and a
later one into the end of the process group, and records a run whose workers died without a `done` event as failed.
"""

from __future__ import annotations

import os
import sys

from core.gpus.distributed import plan, worker_argv
from core.jobs.supervise import PARENT_ENV, Child
from core.messages import Said, words_of


# --- the launching parent ---------------------------------------------------------------------------------------
def launch_workers(argv: list[str], stop_file, log=None, env: dict[str, str] | None = None,
                   kill_after_s: float = 600.0) -> Child:
    """Run `accelerate launch` (argv from worker_argv) under core.jobs.supervise and wait. First Ctrl-C/SIGTERM (or the
    app's death): write the stop file (every rank ends after the same step and rank 0 saves the adapter). Another,
    REPEAT_S or more after the first, or no end `kill_after_s` after the first: end the launcher's process group. Returns the ended child (its
    proc.returncode: negative when killed by that signal)."""
    import signal

    # Its own session, and SIGTERM when this process dies. The launcher reads no events, so Stop's only deadline is
    # kill_after_s, with or without an answer.
    child = Child.spawn(argv, stop_file, ack_s=kill_after_s, finish_s=kill_after_s, log=log, env=env,
                        die_with_parent=True)
    previous = {s: signal.signal(s, lambda signum, frame: child.press()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        child.follow(poll_s=0.2, watch_parent=True)  # started by the app: if the app dies, stop and save
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        child.end("shutdown")
    return child


# --- python -m core.train, when the config asks for more than one process ----------------------------------------
def _fits_one_gpu(cfg) -> bool | None:
    """For `auto`: does the estimated peak fit the smallest visible GPU? None when that cannot be told."""
    try:
        import torch

        from core.estimate.predict import estimate

        if not torch.cuda.is_available():
            return None
        smallest = min(torch.cuda.mem_get_info(i)[1] for i in range(torch.cuda.device_count()))
        return estimate(cfg.replace(num_gpus="1", num_machines=1)).total <= 0.95 * smallest
    except Exception:  # noqa: BLE001 - an unknown model shape: fall back to ddp and say so
        return None


def run_launcher(cfg, run_dir: str | None = None) -> int:
    """The parent of a multi-process run: resolve the plan, make the run folder (main machine), start this machine's
    workers through accelerate and wait; a run whose workers died without a `done` event is recorded as failed."""
    import tempfile
    from pathlib import Path

    from core.runs.folders import STOP_FILE
    from core.checks import check
    from core.config.settings import ConfigError
    from core.runs.events import JsonlSink, make_event, read_events
    from core.runs.folders import create_run_dir

    fits = _fits_one_gpu(cfg) if cfg.distributed_strategy == "auto" else None
    p = plan(cfg, fits_one_gpu=fits)
    resolved = cfg.replace(distributed_strategy=p.strategy)  # the workers run what was decided here
    scratch = Path(tempfile.mkdtemp(prefix="memtune-launch-"))
    try:
        check(resolved)
        run = create_run_dir(resolved, resolved.to_yaml(), prepared=Path(run_dir) if run_dir else None) if p.machine_rank == 0 else None
    except ConfigError as exc:
        print(f"memtune: {exc}", file=sys.stderr)
        return 2
    config_path = run / "config.yaml" if run else resolved.save(scratch / "config.yaml")
    what = Said("log.processes", n=p.world_size, per=p.processes_per_machine, machines=p.num_machines,
                strategy=p.strategy, reason=p.reason)
    print(f"[memtune] {what}", file=sys.stderr, flush=True)
    if run:
        JsonlSink(run / "events.jsonl")(make_event("log", level="info", **words_of(what)))
    env = {k: v for k, v in os.environ.items() if k != PARENT_ENV}  # the workers' parent is torchrun
    threads = int(os.environ.get("MEMTUNE_NUM_THREADS", "0") or 0) or (os.cpu_count() or 1)
    env["MEMTUNE_NUM_THREADS"] = str(max(1, threads // p.processes_per_machine))  # share this machine's cores
    argv = worker_argv(p, resolved, str(config_path), ["--run-dir", str(run)] if run else [])
    child = launch_workers(argv, (run or scratch) / STOP_FILE, env=env)
    code = child.proc.returncode
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    if run is None:
        return 0 if code == 0 else 1
    events = read_events(run / "events.jsonl")
    done = next((e for e in reversed(events) if e.get("kind") == "done"), None)
    if done is None:  # a worker died (killed, out of memory, a collective that timed out): say so, like one GPU
        message = child.record_death(run, "log.worker_died", world_size=p.world_size, strategy=p.strategy)
        print(f"memtune: training failed: {message}", file=sys.stderr)
        return 1
    if done.get("status") == "failed":
        return 1
    print(done.get("message", ""))
    if done.get("adapter_dir"):
        print(done["adapter_dir"])
    return 0
