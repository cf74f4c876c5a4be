"""`python -m core.export gguf|merge|zip ...`: the Export tab's actions on the command line.

The actions themselves live in core/export/adapter.py (zip, merge) and core/export/gguf_export.py (GGUF files +
Modelfile); core/export/__main__.py runs `main` here when started with `python -m core.export`.
"""

from __future__ import annotations

import argparse
import os
import sys

from core.export.adapter import MERGE_TARGETS, ExportError, merge_adapter, zip_adapter
from core.files import RefusedError
from core.export.gguf import FAMILY_NAMES, GGUFError

MERGE_INTO_HELP = ("which base weights the LoRA delta is added to: 'dequantized' (default for adapters trained on a "
                   "4-bit base: the NF4-rounded weights the adapter was trained against, so the merged model answers "
                   "as Try it does) or 'original' (the unrounded weights: answers can differ from Try it)")


def quiet_before_loading() -> None:
    """The libraries' progress bars off and their noise silenced (core/quiet.py), without importing them: a refusal
    of the arguments never loads torch and transformers (seconds of imports), and an export that does reads the two
    variables below when they load (a value the user set wins, as over core.quiet's calls)."""
    from core.quiet import quiet_libraries

    loaded = any(name in sys.modules for name in ("datasets", "transformers"))  # main() called in a process that has
    if not loaded:  # them: their own calls, and this process's environment stays as it was (a fork server compares it)
        for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):  # transformers: the hub's
            os.environ.setdefault(name, "1")
    quiet_libraries(progress_bars=not loaded)  # the warnings and loggers always; the libraries' calls if loaded


def main(argv: list[str] | None = None) -> int:
    """`python -m core.export gguf|merge|zip ...`: the Export tab's actions on the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m core.export", description="Take a memtune adapter elsewhere: GGUF files for llama.cpp / "
        "Ollama / LM Studio (several formats in one go), a merged bf16 model, or a zip of the adapter.")
    sub = parser.add_subparsers(dest="command", required=True)
    gg = sub.add_parser("gguf", help="merge the adapter into its base and write GGUF files + Ollama Modelfile",
                        description="Merge a memtune adapter into its base model (or take a model folder) and write "
                        "one GGUF file per format, an Ollama Modelfile and a README with the ollama / llama-cli "
                        "commands. Supported: " + FAMILY_NAMES + ".")
    gg.add_argument("source", help="a run's adapter folder (runs/<run>/adapter), or a transformers model folder "
                    "with --model")
    gg.add_argument("--model", action="store_true", help="SOURCE is a model folder (already merged), not an adapter")
    gg.add_argument("--formats", default="f16,q8_0", help="comma-separated, from: f16, bf16, q8_0, f32, q4_k_m, "
                    "q5_k_m, q6_k (the last three by llama.cpp's quantizer; default: f16,q8_0)")
    gg.add_argument("--out", default=None, help="output folder (default: the run's gguf/ folder)")
    gg.add_argument("--replace", action="store_true", help="replace an earlier GGUF export in --out")
    gg.add_argument("--merge-into", choices=MERGE_TARGETS, default=None, help=MERGE_INTO_HELP)
    gg.add_argument("--plan", action="store_true", help="only say how much RAM and disk it needs, write nothing")
    remote = dict(action="store_true", help="run the base model's own Python code, when the adapter was trained "
                  "with trust_remote_code: true (refused without this flag; only for code you trust)")
    gg.add_argument("--trust-remote-code", **remote)
    mg = sub.add_parser("merge", help="merge the adapter into its base model (bf16 transformers folder)")
    mg.add_argument("adapter")
    mg.add_argument("--out", default=None, help="output folder (default: the run's merged/ folder)")
    mg.add_argument("--replace", action="store_true", help="replace an earlier merged folder in --out")
    mg.add_argument("--merge-into", choices=MERGE_TARGETS, default=None, help=MERGE_INTO_HELP)
    mg.add_argument("--trust-remote-code", **remote)
    zp = sub.add_parser("zip", help="zip the adapter folder")
    zp.add_argument("adapter")
    zp.add_argument("--out", default=None, help="folder for the zip (default: a temporary folder)")
    zp.add_argument("--replace", action="store_true", help="replace a zip of the same name in --out")
    args = parser.parse_args(argv)
    quiet_before_loading()  # memtune's own progress lines only

    def show(fraction: float, message: str) -> None:
        print(f"[{fraction * 100:5.1f}%] {message}", flush=True)


    try:
        if args.command == "gguf":
            from core.export.gguf_export import export_gguf, plan_gguf

            src = dict(model_dir=args.source) if args.model else dict(adapter_dir=args.source)
            if args.plan:
                plan = plan_gguf(formats=args.formats, out_dir=args.out, **src)  # says whether it replaces
                print(plan.message)
                return 0 if plan.ok else 1
            if not args.model:
                src["merge_into"] = args.merge_into
            result = export_gguf(formats=args.formats, out_dir=args.out, progress=show, overwrite=args.replace,
                                 trust_remote_code=args.trust_remote_code, **src)
            print(f"\nWritten to {result.out_dir}:")
            for path in [*result.files.values(), result.modelfile, result.readme]:
                print(f"  {path.name}")
            print("\nRun it:\n  " + "\n  ".join(result.commands))
        elif args.command == "merge":
            print(merge_adapter(args.adapter, args.out, progress=show, overwrite=args.replace,
                                merge_into=args.merge_into, trust_remote_code=args.trust_remote_code))
        else:
            print(zip_adapter(args.adapter, args.out, overwrite=args.replace))
    except (ExportError, GGUFError, RefusedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
