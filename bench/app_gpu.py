"""The whole app on the GPU machine: `python app.py`, driven over its own HTTP API (gradio_client; no browser).

    python -m bench.app_gpu --out OUT [--runs 5] [--smoke]

Starts the app on a local model folder (Llama-3.1-8B architecture, random weights saved with save_pretrained, built
by bench.product) and a dolly-format file, then: presses Start with the `lowest_memory` preset and follows the run to
its finished adapter through the page's own poll (the gauge must name the real GPU; the result must show predicted
next to measured peaks), does this `--runs` times in a row recording NVML used and the app process's own GPU memory
before and after each run (one run = one child process: the app must hold nothing), then starts a long run and
presses Stop (it must end as "stopped" with an adapter). --smoke does the same with the demo model on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from core.gpus.vram import device_used_bytes, process_used_bytes

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gpu:
    """Point readings of GPU 0 through core.gpus.vram (the app's and the run's NVML reader); None/0 without NVML."""

    def used_gib(self) -> float | None:
        used = device_used_bytes(0)
        return None if used is None else round(used / 2**30, 3)

    def process_gib(self, pid: int) -> float:
        """GPU memory NVML attributes to `pid` (0 when it has no CUDA context at all)."""
        return round((process_used_bytes(pid, 0) or 0) / 2**30, 3)


def newest_run(runs: Path, before: set[str]) -> Path | None:
    fresh = [p for p in runs.glob("*") if p.is_dir() and p.name not in before]
    return max(fresh, key=lambda p: p.stat().st_mtime, default=None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.app_gpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("BENCH_WORK", "/tmp/memtune-bench"))
    runs = work / "app-runs"
    runs.mkdir(parents=True, exist_ok=True)

    from core.config.settings import TrainConfig, demo_config
    from core.config.presets import apply_preset
    from ui.fields import FIELD_NAMES, to_values

    if args.smoke:
        cfg = demo_config(device="cpu", output_dir=str(runs))
    else:
        from bench.product import write_dolly

        model, data = work / "model-llama-3.1-8b", work / "dolly.jsonl"
        write_dolly(data, 3000)
        if not (model / "config.json").is_file():  # in another process: this one must hold no GPU memory
            subprocess.run([sys.executable, "-m", "bench.product", "--out", str(out), "--arch", "llama-3.1-8b",
                            "--build-only", str(model)], cwd=ROOT, check=True)
        cfg = apply_preset(TrainConfig(model=str(model), dataset=str(data), dataset_split="train",
                                       save_strategy="no", logging_steps=1, output_dir=str(runs)), "lowest_memory", None)
    port = free_port()
    env = dict(os.environ, MEMTUNE_HOME=str(work / "home"), PYTHONUNBUFFERED="1")
    gpu = Gpu()
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "nvml_before_app_gib": gpu.used_gib()}
    t0 = time.time()
    app = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=ROOT, env=env,
                           stdout=(out / "app.log").open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    while True:
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                break
        except OSError:
            pass
        if app.poll() is not None or time.time() - t0 > 120:
            print((out / "app.log").read_text()[-3000:])
            raise SystemExit("the app did not come up")
        time.sleep(0.5)
    report["app_up_s"] = round(time.time() - t0, 1)
    from gradio_client import Client

    client = Client(url, verbose=False)

    def poll():  # the page's 1 s poll (ui/layout.py names its endpoints start, stop and poll)
        gauge, progress, plot, log, result, *_ = client.predict("en", None, api_name="/poll")
        # a handler's update (gr.update(...)) arrives as a dict; a plain value as itself; gr.skip() as None-ish
        text = [(v.get("value") if isinstance(v, dict) else v) or "" for v in (gauge, result)]
        return str(text[0]), str(text[1])

    def start(values: dict) -> Path:  # the page's widget values (ui.form.to_values of a config)
        before = {p.name for p in runs.glob("*")}
        notice = client.predict("en", *[values[n] for n in FIELD_NAMES], api_name="/start")
        notice = notice[0] if isinstance(notice, (list, tuple)) else notice  # one visible output: a bare value
        deadline = time.time() + 60
        while (run := newest_run(runs, before)) is None:
            if time.time() > deadline:
                raise SystemExit(f"Start made no run folder: {notice}")
            time.sleep(0.5)
        return run

    def wait_done(run: Path, limit: float = 420) -> dict:
        deadline = time.time() + limit
        gauge = result = ""
        while time.time() < deadline:
            g, r = poll()  # an unchanged panel comes back empty (the page skips it): keep the last one shown
            gauge, result = g or gauge, r or result
            summary = run / "summary.json"
            if summary.is_file():
                time.sleep(1.5)  # the next poll shows the finished run
                return {"summary": json.loads(summary.read_text()), "gauge": gauge, "result": poll()[1] or result}
            time.sleep(1.0)
        raise SystemExit(f"{run} did not finish in {limit} s")

    rows = []
    for i in range(args.runs):
        c = cfg.replace(max_steps=args.steps, run_name=f"app-{i + 1}")
        before = {"nvml_gib": gpu.used_gib(), "app_process_gib": gpu.process_gib(app.pid)}
        run = start(to_values(c))
        done = wait_done(run)
        time.sleep(2.0)  # the child has exited: what is still held belongs to the app (or nobody)
        after = {"nvml_gib": gpu.used_gib(), "app_process_gib": gpu.process_gib(app.pid)}
        s = done["summary"]
        row = {"run": run.name, "status": s.get("status"), "steps": s.get("steps"), "before": before, "after": after,
               "peak_allocated_gib": s.get("peak_allocated_gib"), "nvml_peak_gib": s.get("nvml_peak_gib"),
               "gauge_names_gpu": ("H200" in done["gauge"]) if not args.smoke else None,
               "result_has_predicted_and_measured": "mt-peaks" in done["result"] or "predicted" in done["result"].lower()}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if i == 0:
            (out / "gauge.html").write_text(done["gauge"])
            (out / "result.html").write_text(done["result"])
    report["runs"] = rows
    # Stop: a long run, stopped after its first step, must save an adapter
    run = start(to_values(cfg.replace(max_steps=100000, run_name="app-stop")))
    deadline = time.time() + 300
    while time.time() < deadline and not any('"kind": "step"' in line for line in
                                              (run / "events.jsonl").read_text().splitlines()):
        time.sleep(0.5)
    pressed = time.time()
    client.predict("en", api_name="/stop")
    done = wait_done(run)
    report["stop"] = {"status": done["summary"].get("status"), "steps": done["summary"].get("steps"),
                      "stop_to_summary_s": round(time.time() - pressed, 1),
                      "adapter": (run / "adapter" / "adapter_model.safetensors").is_file()}
    print(json.dumps(report["stop"]), flush=True)
    app.send_signal(signal.SIGTERM)
    report["app_exit_code"] = app.wait(60)
    report["nvml_after_app_gib"] = gpu.used_gib()
    (out / "app_gpu.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
