"""Where the first optimizer step's extra time goes: the product's CLI run with one timing callback added.

    python -m bench.stepprof --out PROFILE.json [--cprofile-step 1] [--torch-steps A-B] -- --config F --preset P [...]

The arguments after `--` are `python -m core.train`'s. The run is the CLI's own (`core.train.cli.main`: same
config, preset, overrides, run folder, events; one process), plus a TrainerCallback that synchronizes CUDA at
each step's boundaries (so a profiled run is a little slower than a measured one: never use its speed) and
records, per optimizer step:
- forward+backward of all micro-batches (step begin -> before the optimizer step), the optimizer step, the rest
  (clipping, scheduler, logging, callbacks) and the gap before the next step (the data loader);
- the CUDA caching allocator's segment count and cudaMalloc calls (first-touch allocations show there);
- for the chosen step, a cProfile of the main thread (top functions by cumulative and by own time): Triton or
  bitsandbytes kernel compilation, cuBLAS/cuDNN set-up and optimizer-state creation show up by name.

With `--torch-steps A-B` the timing callback is replaced by a torch.profiler over optimizer steps A..B (steady steps:
nothing is synchronized outside them, so the other steps' speed is the product's). What it keeps is small: the
key_averages tables (top CUDA and CPU ops) and a summary computed from the trace (bench/profsum.py): GPU busy
share, kernel count per step, host synchronizations, and the gaps between consecutive matrix-product kernels.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path


def timing_callback(out: Path, cprofile_step: int):
    import torch
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()

    def now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def alloc_stats() -> dict:
        if not cuda:
            return {}
        s = torch.cuda.memory_stats()
        return {"segments": s.get("segment.all.current", 0), "cuda_mallocs": s.get("segment.all.allocated", 0),
                "reserved_gib": round(s.get("reserved_bytes.all.current", 0) / 2**30, 3)}

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.rows, self.t, self.prof, self.text = [], {}, None, ""

        def on_train_begin(self, args, state, control, **kw):
            self.t["train_begin"] = now()

        def on_step_begin(self, args, state, control, **kw):
            t = now()
            prev_end = self.t.get("end", self.t.get("train_begin", t))
            self.t = {"begin": t, "gap": t - prev_end}
            if state.global_step + 1 == cprofile_step:
                self.prof = cProfile.Profile()
                self.prof.enable()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.t["fwd_bwd"] = now()

        def on_optimizer_step(self, args, state, control, **kw):
            self.t["opt"] = now()

        def on_step_end(self, args, state, control, **kw):
            end = now()
            if self.prof is not None:
                self.prof.disable()
                for key in ("cumulative", "tottime"):
                    buf = io.StringIO()
                    pstats.Stats(self.prof, stream=buf).sort_stats(key).print_stats(30)
                    self.text += f"### step {state.global_step}, sorted by {key}\n{buf.getvalue()}\n"
                self.prof = None
            t = self.t
            fb, opt = t.get("fwd_bwd", end), t.get("opt", end)
            self.rows.append({"step": state.global_step, "gap_before_s": round(t["gap"], 4),
                              "fwd_bwd_s": round(fb - t["begin"], 4), "optimizer_s": round(opt - fb, 4),
                              "rest_s": round(end - opt, 4), "total_s": round(end - t["begin"], 4),
                              **alloc_stats()})
            self.t["end"] = end
            out.write_text(json.dumps({"steps": self.rows}, indent=1), encoding="utf-8")
            if self.text:
                out.with_suffix(".cprofile.txt").write_text(self.text, encoding="utf-8")

    return StepTimer()


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(prog="python -m bench.stepprof")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cprofile-step", type=int, default=1)
    ap.add_argument("--torch-steps", default="", help="A-B: torch.profiler over optimizer steps A..B instead")
    args = ap.parse_args(ours)
    from core.train.cli import main as train_main  # the CLI itself: same config, preset, overrides and run

    if args.torch_steps:
        from bench.profsum import torch_profile_callback

        first, last = (int(x) for x in args.torch_steps.split("-"))
        return train_main(train_args, callbacks=[torch_profile_callback(Path(args.out), first, last)])
    return train_main(train_args, callbacks=[timing_callback(Path(args.out), args.cprofile_step)])


if __name__ == "__main__":
    sys.exit(main())
