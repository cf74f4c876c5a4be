"""Issue 20 on the GPU: memtune's attention against eager per family on CUDA, then real-shape families trained.

    python -m bench.families_gpu --out DIR [--archs gemma-2-9b,phi-3-mini,...] [--budget-s 500] [--smoke]

1. Attention (DIR/attention.json): each tiny family of tests/families.py in bf16 on CUDA, q/k scaled so Gemma-2's
   soft-cap engages; packed rows through memtune's varlen attention (FlashAttention per row; eager per row where the
   model soft-caps) and through transformers' default (the `sdpa` setting) against each row alone under eager
   attention; which path ran (core.model.attention.VARLEN_CALLS).
2. Families (DIR/<arch>/): `python -m bench.product --arch A --plan families-A` (one `python -m core.train --preset P`
   process per preset, NVML sampled from outside), the model folder removed after each arch (disk).
3. DIR/families.json and DIR/families.md: per (arch, preset) the NVML peak, the estimate for the config the preset
   gave for that model (core.estimate.predict.fit_preset) with the run's longest row, the error, tokens/s, trainable parameters,
   LoRA modules.

The NVML peak is the device's "used" memory, which also counts whatever else holds GPU memory. The estimator's
calibration (core.estimate.terms.CUDA_CONTEXT) includes the idle driver floor (DRIVER_FLOOR_GIB) and nothing else, so
the error is taken against the peak less what the device held above that floor before the run started
(`nvml_own_gib`). Run 8 (2026-12-01) ran the attention check in this process first: its CUDA context stayed, the
floor was 1.314 GiB instead of 0.601, and every row read 0.713 GiB high (Phi-3-mini's -18.9% was -7.0%). The check
now runs in a child process, so the parent never holds a CUDA context.

    python -m bench.families_gpu --recheck --out DIR   # CPU: the table again from DIR's raw files, today's estimator
    python -m bench.families_gpu --predict --out DIR --archs A,B   # CPU: today's estimates before a GPU call

Archs outside the issue-20 plans (bench/archs.py FAMILIES_41) run every preset (`fastest`, `lowest_memory`,
`chapter`), 4 steps each, no held-out eval (bench/product_plans.py `families-A`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("gemma-2-9b", "phi-3-mini", "qwen3-8b", "llama-3.1-8b", "llama-3.2-3b")
DRIVER_FLOOR_GIB = 0.601  # NVML "used" of the idle H200 with no process on it (runs 1-7: 0.601-0.604)


def attention_check(device: str) -> list[dict]:
    import copy

    import torch

    from core.model import attention as varlen
    from tests import families
    from tests.test_families import _rows, _sharpen

    out = []
    for name in families.NAMES:
        ref = _sharpen(families.model(name)).to(device=device, dtype=torch.bfloat16)
        rows, packed, pos = _rows()
        with torch.no_grad():
            alone = torch.cat([ref(input_ids=r.to(device), use_cache=False).logits[0] for r in rows]).float()
            row = {"family": name}
            for setting in ("varlen", "sdpa"):
                m = copy.deepcopy(ref)
                if setting == "varlen":
                    varlen.use_varlen_attention(m)
                else:
                    m.set_attn_implementation("sdpa" if m._supports_sdpa else "eager")
                before = dict(varlen.VARLEN_CALLS)
                got = m(input_ids=packed.to(device), position_ids=pos.to(device), use_cache=False).logits[0].float()
                row[f"{setting}_rel_error"] = round(float((got - alone).norm() / alone.norm()), 5)
                row[f"{setting}_path"] = ({k: varlen.VARLEN_CALLS[k] - before[k] for k in ("varlen", "sdpa", "eager_rows", "cast")}
                                          if setting == "varlen" else m.config._attn_implementation)
        row["note"] = varlen.path_note(ref.config, cuda=device == "cuda")
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def estimates(out: Path, arch: str) -> list[dict]:
    """The estimate for each preset run of `arch`, for the config the run trained with: the run folder's config.yaml
    (the preset as core.train applied it), else the preset applied today to the config bench.product wrote, with the
    settings the results row reports (run 9's Llama-3.2-3B `fastest` ran 8 x 1 where today's preset fits 16 x 1)."""
    from bench.archs import HUB_IDS
    from bench.validate_estimate import preset_as_run
    from core.estimate.predict import fit_preset
    from core.config.settings import TrainConfig
    from core.estimate.predict import estimate

    results = out / arch / "results.json"
    if not results.is_file():
        return []
    rows = []
    data = json.loads(results.read_text())
    for r in data["rows"]:
        name = r["name"]
        preset = (r.get("variant") or {}).get("preset")
        # one row per (arch, preset): the preset's own run, not bench.product's discarded warm copy of it (run 17
        # reported granite's and starcoder2's `fastest` twice) nor a variant with other settings
        if name != preset:
            continue
        cfg_path = out / arch / "runs" / f"{name}.yaml"
        summary_path = out / arch / "runs" / name / "summary.json"
        if not cfg_path.is_file():
            continue
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        resolved = out / arch / "runs" / name / "config.yaml"  # what the run trained with, its preset applied
        if resolved.is_file():
            cfg = TrainConfig.load(resolved).replace(model=model_for(arch, out), device="cuda")
        else:
            cfg = fit_preset(TrainConfig.load(cfg_path).replace(model=model_for(arch, out), device="cuda"),
                             r["variant"]["preset"]).cfg
            cfg = preset_as_run(cfg, data.get("info", {}).get("date", ""), r["variant"]["preset"])
        # the settings the run reports it trained with: today's preset may fit another batch to the same model (the
        # error is the estimator's on what ran, not a preset change's)
        ran = {k: v for k, v in (r.get("settings") or {}).items() if k in {f.name for f in dataclasses.fields(cfg)}}
        if ran:
            cfg = cfg.replace(**ran)
        longest = (summary.get("data") or {}).get("longest_row_tokens")
        try:
            est = estimate(cfg, max_row_tokens=longest)
        except Exception as exc:  # noqa: BLE001 - the smoke run's tiny shape is in no table
            print(f"no estimate for {arch}/{name}: {exc}", flush=True)
            continue
        nvml, floor = r.get("nvml_peak_gib"), r.get("nvml_floor_gib")
        # what this run itself added to the idle device: other processes' memory is not the run's
        own = round(nvml - max(0.0, floor - DRIVER_FLOOR_GIB), 3) if nvml and floor is not None else nvml
        rows.append({"arch": arch, "preset": r["variant"]["preset"], "rc": r.get("rc"), "nvml_peak_gib": nvml,
                     "nvml_floor_gib": floor, "nvml_own_gib": own, "estimate_gib": round(est.total_gib, 3),
                     "error_pct": round(100 * (est.total_gib / own - 1), 1) if own else None,
                     "error_raw_pct": round(100 * (est.total_gib / nvml - 1), 1) if nvml else None,
                     "peak_allocated_gib": r.get("peak_allocated_gib"),
                     "estimate_allocated_gib": round(est.peak_allocated_gib, 3),
                     "tokens_per_s": r.get("steady_tokens_per_s"), "trainable_params": summary.get("trainable_params"),
                     "lora_modules": summary.get("lora_modules"),
                     "batch": f"{cfg.per_device_train_batch_size} x {cfg.gradient_accumulation_steps}"
                              f"{', checkpointing' if cfg.gradient_checkpointing else ''}"})
    return rows


def model_for(arch: str, out: Path) -> str:
    """What the estimate reads the shape from: the Hub id of a known arch, else the arch's config.json written under
    `out` (the full-size config of bench/archs.py, so the estimate counts the model the run built)."""
    from bench.archs import ARCHS, FAMILIES_41, HUB_IDS

    if arch in HUB_IDS and arch not in FAMILIES_41:
        return HUB_IDS[arch]
    folder = out / arch / "shape"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(ARCHS[arch]))
    return str(folder)


def predict(out: Path, archs: list[str]) -> list[str]:
    """Before the GPU call: today's estimate for every preset of each arch, as fit_preset gives it for one H200."""
    from core.config.settings import Hardware, TrainConfig
    from core.estimate.predict import estimate, fit_preset

    gpu = Hardware(cuda=True, bf16=True, bitsandbytes=True, liger=True)
    lines = ["| arch | preset | micro-batch | estimate (NVML) | allocated |", "|---|---|---|---|---|"]
    for arch in archs:
        for preset in ("fastest", "lowest_memory", "chapter"):
            cfg = fit_preset(TrainConfig(model=model_for(arch, out), device="cuda"), preset, gpu).cfg
            est = estimate(cfg, max_row_tokens=512)
            lines.append(f"| {arch} | {preset} | {cfg.per_device_train_batch_size} x {cfg.gradient_accumulation_steps}"
                         f"{', checkpointing' if cfg.gradient_checkpointing else ''} | {est.total_gib:.2f} GiB | "
                         f"{est.peak_allocated_gib:.2f} GiB |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.families_gpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--budget-s", type=float, default=500.0)
    ap.add_argument("--only", default="", help="these presets only (comma-separated), e.g. the rows a call missed")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny-llama, the smoke plan's code paths")
    ap.add_argument("--attention-only", action="store_true", help="only step 1 (what main runs in a child process)")
    ap.add_argument("--recheck", action="store_true", help="no GPU work: the table again from --out's raw files")
    ap.add_argument("--predict", action="store_true", help="no GPU work: today's estimates of --archs, every preset")
    args = ap.parse_args(argv)
    t0 = time.time()
    out = Path(args.out)
    if args.predict:
        print("\n".join(predict(out, [a for a in args.archs.split(",") if a])))
        return 0
    if args.recheck:
        table = [row for arch in sorted(p.parent.name for p in out.glob("*/results.json")) for row in estimates(out, arch)]
        print("\n".join(table_lines(table)))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if args.attention_only:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        (out / "attention.json").write_text(json.dumps(attention_check(device), indent=1))
        return 0
    # A child process: a CUDA context left in this one would sit in every row's NVML (run 8: +0.713 GiB)
    subprocess.run([sys.executable, "-m", "bench.families_gpu", "--out", str(out), "--attention-only"], cwd=str(ROOT),
                   check=False)
    archs = ["tiny-llama"] if args.smoke else [a for a in args.archs.split(",") if a]
    table = []
    for i, arch in enumerate(archs):
        left = args.budget_s - (time.time() - t0)
        if left < 60:
            print(f"skipped {arch}: {left:.0f} s left", flush=True)
            continue
        cmd = product_command(out, arch, left, warm_row=i == 0) + (["--only", args.only] if args.only else [])
        subprocess.run(cmd, cwd=str(ROOT), check=False)
        work = Path("/tmp/memtune-bench") / f"model-{arch}"
        shutil.rmtree(work, ignore_errors=True)  # 64 GiB of disk: one model folder at a time
        table += estimates(out, arch)
        (out / "families.json").write_text(json.dumps(table, indent=1))
    lines = table_lines(table)
    (out / "families.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def product_command(out: Path, arch: str, left: float, warm_row: bool) -> list[str]:
    """bench.product for one arch's presets. Its discarded warm row (the first process of a GPU call runs slower:
    run 13) only on the call's first arch: run 17 spent 30-40 s per arch on one, and the budget ran out before
    redpajama-3b and olmoe-1b-7b. Its memory is the preset row's (identical in run 17), so no table loses a row."""
    return [sys.executable, "-m", "bench.product", "--out", str(out / arch), "--arch", arch,
            "--plan", f"families-{arch}", "--rows", "400", "--budget-s", str(int(left)),
            *([] if warm_row else ["--no-warm-row"])]


def table_lines(table: list[dict]) -> list[str]:
    lines = ["| arch | preset | micro-batch | NVML peak (floor) | the run's own | estimate | error | tokens/s | trainable "
             "| LoRA on |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['arch']} | {r['preset']} | {r['batch']} | {r['nvml_peak_gib']} ({r.get('nvml_floor_gib')}) | "
                     f"{r.get('nvml_own_gib')} | {r['estimate_gib']} | {r['error_pct']}% | {r['tokens_per_s']} | "
                     f"{r['trainable_params']} | {', '.join(r['lora_modules'] or [])} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
