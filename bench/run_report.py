"""What `python -m bench.run` writes after every run: the table (table.md), the loss check against the seed recipe
(math_check), the grid rows (grid_measured.json; bench/assemble.py builds the full file) and the profiles.
"""

from __future__ import annotations

import json
from typing import Any

from bench.archs import HUB_IDS


def table(results: list[dict]) -> str:
    seeds = {r["arch"]: r for r in results if r["name"] in ("seed", "g14-seed-512", "g70-seed-512")
             and r.get("tokens_per_s")}
    results = [r for r in results if r.get("group") != "profile"]
    lines = ["| run | arch | peak alloc GiB | peak reserved GiB | NVML GiB | tokens/s | s/step | tok/step | x seed | "
             "first loss |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.get("status") != "ok":
            lines.append(f"| {r['name']} | {r['arch']} | {r.get('peak_allocated_gib')} | "
                         f"{r.get('peak_reserved_gib')} | {r.get('nvml_peak_gib')} | FAILED: "
                         f"{r.get('error', '')[:60]} | | | | |")
            continue
        seed = seeds.get(r["arch"])
        ratio = (r["tokens_per_s"] / seed["tokens_per_s"]) if (seed and r.get("tokens_per_s")) else None
        first = r["losses"][0] if r.get("losses") else None
        lines.append(
            f"| {r['name']} | {r['arch'].replace('llama-3.1-', '').replace('qwen2.5-', 'q')} | "
            f"{r['peak_allocated_gib']} | {r['peak_reserved_gib']} | {r['nvml_peak_gib']} | "
            f"{r['tokens_per_s']} | {r['s_per_step']} | {r.get('tokens_per_step')} | "
            f"{ratio and round(ratio, 2)} | {first and round(first, 4)} |")
    return "\n".join(lines)


def math_check(results: list[dict]) -> dict[str, Any]:
    by = {r["name"]: r for r in results if r.get("status") == "ok"}
    out: dict[str, Any] = {}
    seed = by.get("seed")
    if not seed or not seed.get("losses"):
        return out
    for name, r in by.items():
        if name == "seed" or r["arch"] != seed["arch"] or r["data"] != "dolly" or not r.get("losses"):
            continue
        n = min(len(seed["losses"]), len(r["losses"]))
        rel = [abs(a - b) / abs(a) for a, b in zip(seed["losses"][:n], r["losses"][:n])]
        out[name] = {"first_loss_rel_diff": round(rel[0], 6), "max_curve_rel_diff": round(max(rel), 6),
                     "first_loss_within_1pct": rel[0] <= 0.01}
    # Same batches, one setting apart: the loss curves should agree to bf16 noise.
    for a, b in (("fastest+varlen", "fastest"), ("lowest_memory+varlen", "lowest_memory")):
        if a in by and b in by and by[a].get("losses") and by[b].get("losses"):
            n = min(len(by[a]["losses"]), len(by[b]["losses"]))
            rel = [abs(x - y) / abs(y) for x, y in zip(by[a]["losses"][:n], by[b]["losses"][:n])]
            out[f"{a} vs {b}"] = {"first_loss_rel_diff": round(rel[0], 6), "max_curve_rel_diff": round(max(rel), 6)}
    return out


def grid_rows(results: list[dict], env: dict) -> list[dict]:
    rows = []
    for r in results:
        if not r.get("grid"):
            continue
        rows.append({
            "name": r["name"], "arch": r["arch"], "hub_id": HUB_IDS[r["arch"]], "recipe": r["recipe"],
            "preset": r["preset"], "status": r.get("status"),
            "peak_allocated_gib": r.get("peak_allocated_gib"), "peak_reserved_gib": r.get("peak_reserved_gib"),
            "nvml_peak_gib": r.get("nvml_peak_gib"), "nvml_floor_gib": r.get("nvml_floor_gib"),
            "allocated_after_load_gib": r.get("allocated_after_load_gib"),
            "largest_micro_batch_tokens": r.get("largest_micro_batch_tokens"),
            "tokens_per_s": r.get("tokens_per_s"),
            "data": "every row longer than max_length: each micro-batch is batch x max_length tokens",
            "config": r["config"],
            "breakdown": r.get("breakdown"),
        })
    return rows


def profile_text(results: list[dict]) -> str:
    out = []
    for r in results:
        p = r.get("profile")
        if not p:
            continue
        out.append(f"## {r['name']} ({r['arch']}): {p['micro_steps']} micro-steps, wall {p['wall_s']:.3f} s, "
                   f"CPU self {p['cpu_self_s']:.3f} s, GPU kernels {p['gpu_kernel_s']:.3f} s "
                   f"(busy {100 * (p['gpu_busy_fraction'] or 0):.0f}%), {p['kernel_launches']} kernels")
        out.append(f"calls: {json.dumps(p['calls'])}")
        out.append(f"GPU time by kind (s): {json.dumps(p['gpu_by_kind_s'])}")
        out.append("top GPU ops (self ms, calls):")
        out += [f"  {ms:9.2f}  {n:6d}  {k}" for k, ms, n in p["top_gpu"]]
        out.append("top CPU ops (self ms, calls):")
        out += [f"  {ms:9.2f}  {n:6d}  {k}" for k, ms, n in p["top_cpu"]]
        out.append("")
    return "\n".join(out)
