"""How long a Start takes to train: runs the app's job manager starts cold (a new interpreter imports the libraries)
and warm (forked from the server that imported them once, core/jobs/warm.py), on this machine's device.

    python -m bench.warm_start --out DIR [--runs 3] [--steps 3]

Each run is the demo (the tiny model memtune builds locally) for `--steps` steps through `JobManager.start`, as the
app's Start button starts it; per run: seconds from Start to the child's first event, to its first optimizer step and
to its end, and which start it had (the `run` event's `start`). The first warm run may wait for the server's own
imports (started when the manager is prepared, as the app does at launch); the later ones show the steady case.
On a GPU machine the warm runs must fork warm (the server's imports start no CUDA: core/train/preload.py) and train
on the GPU; the last line says whether they all did, and the exit code is 1 where one did not.
Writes DIR/warm_start.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def one(mgr, out: Path, name: str, steps: int) -> dict:
    from core.config.settings import demo_config
    from core.jobs.view import job_view

    t0 = time.monotonic()
    job = mgr.start(demo_config(max_steps=steps, output_dir=str(out / "runs"), run_name=name))
    returned = time.monotonic() - t0
    marks: dict[str, float] = {}
    while job.running or not marks.get("done"):
        for e in job.events_since(0):
            key = {"run": "first_event", "step": "first_step", "done": "done"}.get(e["kind"])
            if key and key not in marks:
                marks[key] = round(time.monotonic() - t0, 2)
        if not job.running and "done" in marks:
            break
        if not job.running:
            job.wait(5)
            marks.setdefault("done", round(time.monotonic() - t0, 2))
        time.sleep(0.05)
    events = job.events_since(0)
    run = next((e for e in events if e["kind"] == "run"), {})
    summary = next((e.get("summary") or {} for e in events if e["kind"] == "done"), {})
    # a run that used the GPU has its peak: a warm run forked from a server that had started CUDA could not have
    on_gpu = summary.get("peak_allocated_gib") is not None
    return {"name": name, "state": job_view(job).state, "start": run.get("start", ""), "on_gpu": on_gpu,
            "peak_allocated_gib": summary.get("peak_allocated_gib"), "start_returned_s": round(returned, 2), **marks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.warm_start")
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from core.demo import ensure_demo_model
    from core.jobs.manager import JobManager

    ensure_demo_model()
    rows = []
    for mode in ("cold", "warm"):
        os.environ["MEMTUNE_WARM_START"] = "1" if mode == "warm" else "0"
        mgr = JobManager()
        mgr.prepare()
        for i in range(args.runs):
            row = one(mgr, out, f"{mode}-{i + 1}", args.steps)
            rows.append({"mode": mode, **row})
            print(json.dumps(rows[-1]), flush=True)
    (out / "warm_start.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print("| run | start | state | device | to first event | to first step | to the end |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['start'] or 'a new interpreter'} | {r['state']} | {'GPU' if r['on_gpu'] else 'CPU'} "
              f"| {r.get('first_event', '-')} s | {r.get('first_step', '-')} s | {r.get('done', '-')} s |")
    # what the warm start is for: every warm-mode run forked warm and trained where a cold one trains
    wrong = [r["name"] for r in rows if r["mode"] == "warm" and (r["start"] != "warm" or r["state"] != "completed"
                                                                 or r["on_gpu"] != rows[0]["on_gpu"])]
    print("warm start: " + (f"NOT as a cold run in {', '.join(wrong)}" if wrong else "every warm run forked warm, "
                            "completed, on the device the cold runs used"))
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
