"""The demo's bars, measured on the product's own CLI path: `python -m core.train --demo`, run twice.

    python scripts/demo_bench.py [--runs 2] [--out DIR]

For each run: wall time from launching the process to the finished adapter, time from launch to the first
optimizer step (the first `step` event in the run's events.jsonl), and the adapter's exact answers to the 100
training prompts (core.infer.score_adapter, greedy). Then whether every run logged identical losses. The bars
(README's demo promise): under 45 s wall, first step within 10 s, at least 90/100 exact, identical losses. Exit status 1 when a
bar is missed. Timings depend on the machine and its load, so they live here and not in the test suite; the load
average is printed alongside.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BARS = {"wall_s": 45.0, "first_step_s": 10.0, "exact": 90}


def one_run(out: Path) -> dict:
    launched = time.time()
    proc = subprocess.run([sys.executable, "-m", "core.train", "--demo", "--set", f"output_dir={out}"],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.time() - launched
    if proc.returncode != 0:
        raise SystemExit(f"the demo failed:\n{proc.stderr[-3000:]}")
    adapter = Path(proc.stdout.strip().splitlines()[-1])
    events = [json.loads(line) for line in (adapter.parent / "events.jsonl").read_text().splitlines()]
    first_step = next(e["time"] for e in events if e["kind"] == "step")
    losses = [e["loss"] for e in events if e["kind"] == "metrics"]
    from core.infer import score_adapter
    from core.quiet import quiet_libraries

    quiet_libraries(progress_bars=False)  # the bench's own lines, not bitsandbytes' or transformers' noise

    right, total = score_adapter(adapter)
    return {"wall_s": round(wall, 1), "first_step_s": round(first_step - launched, 1), "exact": right,
            "prompts": total, "final_loss": losses[-1], "losses": losses}


def cpu_model() -> str:
    """The CPU's name and whether it has AVX512-BF16: bitsandbytes' CPU 4-bit kernels differ with it (and so may the
    demo's last digits of loss and its exact answers)."""
    name, flags = platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == platform.machine():
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        return name
    return f"{name} ({'with' if 'avx512_bf16' in flags else 'without'} AVX512-BF16)"


def versions() -> str:
    """The libraries the figures depend on, as installed (requirements.lock pins them)."""
    from importlib.metadata import PackageNotFoundError, version

    out = [f"python {platform.python_version()}"]
    for name in ("torch", "transformers", "peft", "trl", "bitsandbytes", "accelerate"):
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            out.append(f"{name} -")
    return ", ".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="memtune-demo-bench-"))
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, "
          f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"versions: {versions()} (the losses and answers depend on them: README's figures name theirs)")
    runs = []
    for i in range(args.runs):
        print(f"run {i + 1}: training the demo (python -m core.train --demo), then scoring its 100 answers...",
              flush=True)  # ~15 s of work: say so rather than stay silent
        r = one_run(out)
        runs.append(r)
        print(f"run {i + 1}: {r['wall_s']} s wall, first step at {r['first_step_s']} s, "
              f"{r['exact']}/{r['prompts']} exact, final loss {r['final_loss']:.4f}", flush=True)
    same = all(r["losses"] == runs[0]["losses"] for r in runs)
    print(f"identical losses across runs: {same}; load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ok = same and all(r["wall_s"] < BARS["wall_s"] and r["first_step_s"] <= BARS["first_step_s"]
                      and r["exact"] >= BARS["exact"] for r in runs)
    print("all bars met" if ok else f"a bar was missed (bars: {BARS})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
