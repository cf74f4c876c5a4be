"""What each call of bench/product.py runs: one Variant per process, grouped in named plans (one per GPU call).

A plan is a record of what was measured in that call (bench/RESULTS.md names the plan next to each table), so old
plans stay as they were run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path


@dataclass
class Variant:
    name: str
    preset: str = ""  # "" = a script (the chapter's, or the peer's: `peer`); else core.train.recipe --preset
    sets: list[str] = field(default_factory=list)  # --set field=value on top of the preset
    steps: int = 20
    warm: int = 3  # steady window = steps after this many
    timeout_s: int = 180
    note: str = ""
    peer: bool = False  # Unsloth's script (bench/unsloth_script.py) with its own wheels (UNSLOTH_SITE)
    profile: bool = False  # the CLI run through bench/stepprof.py (step timings + cProfile of step 1)
    torch_steps: str = ""  # "A-B": the CLI run through bench/stepprof.py with torch.profiler over steps A..B
    arch: str = ""  # "" = the call's --arch
    max_length: int = 512
    env: dict = field(default_factory=dict)  # extra environment of the run's process
    script_args: list[str] = field(default_factory=list)  # extra arguments of a script row (the peer's settings)
    code: str = ""  # a source tree of another commit (git archive) the row runs from: bisecting a regression
    module: str = ""  # a script row's module ("": bench.chapter_script, or bench.unsloth_script with `peer`)
    data: str = ""  # "": the call's dolly rows; "pairs": its preference pairs (bench/synth.py preference_pairs);
    # "images": photo-sized image rows in messages format (bench/synth.py image_rows)
    card_gib: float = 0.0  # > 0: the run's CUDA allocator capped like a card of this many GiB (bench/capped.py)


    @property
    def script(self) -> bool:
        return not self.preset


# Issue 42: `fastest` fell from 13,136 tok/s (fcbfe14, 2026-12-01) to ~9,900 (99127b1). The first-parent commits
# between, each run from its own tree (`bash bench/bisect_trees.sh COMMIT...` writes .bisect/COMMIT), the chapter's
# script of this tree as the yardstick. validation_share=0 where the tree has the field (as the 12-01 rows had none).
BISECT = {"bisect1": ["fcbfe14", "9c8b101", "23f3c2f", "99127b1"]}
# bisect1 found no fall (fcbfe14 11,546, 99127b1 13,298 tok/s): bisect2 checks order and noise, both presets, this tree.
OFF = ["validation_share=0"]


def bisect2() -> list[Variant]:
    old = [v for v in bisect_rows(["fcbfe14", "99127b1"]) if v.code]
    low = Variant("lowest_memory-fcbfe14", "lowest_memory", [], steps=12, warm=3, timeout_s=120, code=old[0].code)
    return [Variant("chapter-script", steps=4, warm=1, timeout_s=150, note="the chapter's script as written"),
            Variant("fastest-main-1", "fastest", OFF, steps=20, timeout_s=110), old[0], low,
            Variant("lowest_memory-main", "lowest_memory", OFF, steps=12, warm=3, timeout_s=120), old[1],
            Variant("fastest-main-2", "fastest", OFF, steps=20, timeout_s=110)]


def bisect_rows(commits: list[str]) -> list[Variant]:
    from pathlib import Path

    rows = [Variant("chapter-script", steps=4, warm=1, timeout_s=150, note="the chapter's script as written")]
    for c in commits:
        tree = Path(".bisect") / c
        has_val = any("validation_share" in f.read_text() for f in tree.glob("core/**/*.py") if f.name in
                      ("config.py", "settings.py"))
        rows.append(Variant(f"fastest-{c}", "fastest", ["validation_share=0"] if has_val else [], steps=20,
                            timeout_s=110, code=str(tree)))
    return rows


def bisect3() -> list[Variant]:
    """bisect2: the same code 10,247 and 11,764 tok/s in one call, the first `fastest` row slowest in both calls (GPU
    busy 57-80%: host-bound). Three interleaved pairs, old and this tree, after one discarded warm row."""
    old = [v for v in bisect_rows(["fcbfe14"]) if v.code][0]
    rows = [Variant("chapter-script", steps=4, warm=1, timeout_s=150, note="the chapter's script as written"),
            Variant("fastest-discarded", "fastest", OFF, steps=8, timeout_s=90, note="first liger row: not compared")]
    for i in (1, 2, 3):
        rows += [Variant(f"fastest-fcbfe14-{i}", "fastest", [], steps=20, timeout_s=110, code=old.code),
                 Variant(f"fastest-main-{i}", "fastest", OFF, steps=20, timeout_s=110)]
    return rows


def presets_and_compile_cache() -> list[Variant]:
    """Run 14: each preset beside the chapter's script in one call (presets_measured.json's same-call ratios), and
    `fastest` with compile_layers twice: the first process fills the compile cache, the second loads it."""
    comp = [*OFF, "compile_layers=true"]
    return [Variant("chapter-script", steps=4, warm=1, timeout_s=150, note="the chapter's script as written"),
            Variant("fastest", "fastest", OFF, steps=20, timeout_s=110),
            Variant("fastest-compile-cold", "fastest", comp, steps=20, warm=5, timeout_s=200,
                    note="compile cache empty"),
            Variant("fastest-compile-warm", "fastest", comp, steps=20, warm=5, timeout_s=150,
                    note="the compile cache the row before filled"),
            Variant("lowest_memory", "lowest_memory", OFF, steps=12, warm=3, timeout_s=100),
            Variant("six_gb", "six_gb", OFF, steps=12, warm=3, timeout_s=100)]


def moe(name: str) -> list[Variant]:
    """Issue 40: MoE shapes with their experts stored in 4 bits, each preset beside the chapter's script on the same
    model in the same call. moe1: Qwen3-30B-A3B cut to 12 layers (three presets; the chapter's script as written,
    whose experts stay 16-bit) and to 24 layers (the estimator at a second depth). moe2: the full 48 layers (its bf16
    folder in memory: --out's machine has no 61 GB of disk). moe3: gpt-oss-20b, its `chapter` row the second shape
    for the upcast's pinned experts."""
    script = Variant("chapter-script", steps=4, warm=1, timeout_s=170, note="the chapter's script as written")
    if name == "moe1":  # each expert a Python-loop step of its own (the eager experts path): few steps per row
        return [script, Variant("lowest_memory", "lowest_memory", OFF, steps=4, warm=2, timeout_s=150),
                Variant("fastest", "fastest", OFF, steps=4, warm=2, timeout_s=130),
                Variant("chapter", "chapter", OFF, steps=3, warm=1, timeout_s=130),
                Variant("lowest_memory-24l", "lowest_memory", OFF, steps=3, warm=1, timeout_s=170,
                        arch="qwen3-30b-a3b-24l")]
    if name == "moe2":
        return [Variant("lowest_memory-48l", "lowest_memory", OFF, steps=3, warm=1, timeout_s=300)]
    if name == "moe3":
        return [script, Variant("lowest_memory", "lowest_memory", OFF, steps=4, warm=2, timeout_s=200),
                Variant("fastest", "fastest", OFF, steps=4, warm=2, timeout_s=200),
                # a second MoE shape for the chapter's fp32 upcast (terms.py MOE_STACK_PINNED, read from run 19's
                # Qwen3 row alone): its estimate is checked here on another model
                Variant("chapter", "chapter", OFF, steps=3, warm=1, timeout_s=200)]
    if name in ("moe4", "moe4smoke"):
        return grouped_experts(name.endswith("smoke"))
    if name == "moe4b":
        return grouped_fastest()
    if name in ("moe5", "moe5smoke"):
        return grouped_no_sync(name.endswith("smoke"))
    if name == "moe5b":
        return qwen3_full()
    if name == "moe6":
        return gpt_oss_full()
    if name == "moe7":
        return olmoe_against_dense()
    if name == "moe8":
        return lora_on_4bit_experts()
    if name in ("moe9", "moe9smoke"):
        return llama4_grouped(name.endswith("smoke"))
    return [Variant("lowest_memory", "lowest_memory", steps=2, warm=1), Variant("fastest", "fastest", steps=2, warm=1)]


# moe4's pairs: the same preset, model folder, seed and batches, experts computed one at a time (the reference) or in
# grouped products (core/levers/experts.py, MEMTUNE_EXPERTS); `grouped_verdict` compares each pair.
GROUPED_PAIRS = {"olmoe": "olmoe-1b-7b", "qwen3-12l": "qwen3-30b-a3b-12l"}


def grouped_experts(smoke: bool) -> list[Variant]:
    """Issue 60, grouped experts: OLMoE-1B-7B (full depth) and Qwen3-30B-A3B (12 of 48 layers) under `lowest_memory`,
    one expert at a time then grouped, each step's loss logged (the first losses compared); the dense Llama-3.1-8B's
    `lowest_memory` for the ratio the issue asks (OLMoE >= 2x); OLMoE `fastest` grouped (its estimate with the grouped
    transient). Priority order: --budget-s skips the last rows first. moe4smoke: the same rows on the CPU, tiny
    models (tiny-qwen3-moe for every MoE row)."""
    log = [*OFF, "logging_steps=1"]
    rows = []
    for tag, arch in GROUPED_PAIRS.items():
        loop_steps = 6 if tag == "olmoe" else 4  # the loop's steps are slow (5-6 s on the 12-layer Qwen3)
        # grouped first: a fresh machine's first process runs slow (bench/RESULTS.md), against grouped if at all
        rows += [Variant(f"{tag}-lowest_memory-grouped", "lowest_memory", log, steps=8, warm=2, timeout_s=120,
                         arch=arch, env={"MEMTUNE_EXPERTS": "grouped"}, note="experts in grouped products"),
                 Variant(f"{tag}-lowest_memory-loop", "lowest_memory", log, steps=loop_steps, warm=2, timeout_s=150,
                         arch=arch, env={"MEMTUNE_EXPERTS": "loop"}, note="experts one at a time (the reference)")]
    rows += [Variant("llama8b-lowest_memory", "lowest_memory", log, steps=8, warm=3, timeout_s=100, arch="llama-3.1-8b",
                     note="dense 8B, the yardstick"),
             Variant("olmoe-fastest-grouped", "fastest", log, steps=10, warm=3, timeout_s=100, arch="olmoe-1b-7b",
                     env={"MEMTUNE_EXPERTS": "grouped"}, note="experts in grouped products")]
    if smoke:
        for v in rows:
            v.steps, v.warm, v.max_length, v.timeout_s = 3, 1, 128, 400
            v.arch = "tiny-qwen3-moe" if v.env else ""
    return rows


def grouped_fastest() -> list[Variant]:
    """moe4's second call: the chapter's script on the dense 8B (the yardstick of every claim), then OLMoE-1B-7B
    `fastest` grouped and one at a time."""
    log = [*OFF, "logging_steps=1"]
    return [Variant("chapter-script", steps=3, warm=1, timeout_s=150, arch="llama-3.1-8b",
                    note="the chapter's script as written"),
            Variant("olmoe-fastest-grouped", "fastest", log, steps=10, warm=3, timeout_s=120, arch="olmoe-1b-7b",
                    env={"MEMTUNE_EXPERTS": "grouped"}, note="experts in grouped products"),
            Variant("olmoe-fastest-loop", "fastest", log, steps=5, warm=2, timeout_s=150, arch="olmoe-1b-7b",
                    env={"MEMTUNE_EXPERTS": "loop"}, note="experts one at a time (the reference)")]


def grouped_no_sync(smoke: bool) -> list[Variant]:
    """Issue 60, grouped experts without a host sync per layer: OLMoE-1B-7B `lowest_memory` grouped, the dense
    Llama-3.1-8B's `lowest_memory` (the ratio: >= 2x), OLMoE one at a time (the first loss of the pair), OLMoE
    `fastest` grouped with its layers compiled (the preset's auto) and not (where `fastest`'s extra memory over the
    loop comes from), then the chapter's script on the 8B. Priority order (--budget-s skips the last rows first).
    moe5smoke: the same rows on the CPU, tiny models."""
    log = [*OFF, "logging_steps=1"]
    grouped, loop = {"MEMTUNE_EXPERTS": "grouped"}, {"MEMTUNE_EXPERTS": "loop"}
    rows = [Variant("olmoe-lowest_memory-grouped", "lowest_memory", log, steps=10, warm=3, timeout_s=100,
                    arch="olmoe-1b-7b", env=grouped, note="experts in grouped products, no host sync"),
            Variant("llama8b-lowest_memory", "lowest_memory", log, steps=8, warm=3, timeout_s=100, arch="llama-3.1-8b",
                    note="dense 8B, the yardstick"),
            Variant("olmoe-lowest_memory-loop", "lowest_memory", log, steps=5, warm=2, timeout_s=120,
                    arch="olmoe-1b-7b", env=loop, note="experts one at a time (the reference)"),
            Variant("olmoe-fastest-grouped", "fastest", log, steps=10, warm=3, timeout_s=100, arch="olmoe-1b-7b",
                    env=grouped, note="experts in grouped products, layers compiled (auto)"),
            Variant("olmoe-fastest-grouped-nocompile", "fastest", [*log, "compile_layers=off"], steps=10, warm=3,
                    timeout_s=100, arch="olmoe-1b-7b", env=grouped, note="the same, no regional compile"),
            Variant("chapter-script", steps=3, warm=1, timeout_s=150, arch="llama-3.1-8b",
                    note="the chapter's script as written")]
    if smoke:
        for v in rows:
            v.steps, v.warm, v.max_length, v.timeout_s = 3, 1, 128, 400
            v.arch = "tiny-qwen3-moe" if v.env else ""
    return rows


def _grouped_presets(prefix: str) -> list[Variant]:
    """`lowest_memory` and `fastest` on the call's model, experts grouped, 8 steps each after 3 warm ones."""
    log = [*OFF, "logging_steps=1"]
    return [Variant(f"{prefix}-{preset}-grouped", preset, log, steps=8, warm=3, timeout_s=200,
                    env={"MEMTUNE_EXPERTS": "grouped"}, note="experts in grouped products, no host sync")
            for preset in ("lowest_memory", "fastest")]


def qwen3_full() -> list[Variant]:
    """moe5's second call: Qwen3-30B-A3B at its full 48 layers (issue 60: >= 4,000 tok/s within 18 GiB at
    `lowest_memory`; >= 12,000 tok/s within 24 GiB at `fastest`)."""
    return _grouped_presets("qwen3-48l")


def gpt_oss_full() -> list[Variant]:
    """gpt-oss-20b at its full 24 layers (issue 60: at most 14 GiB at `lowest_memory`; `fastest` within 24 GiB)."""
    return _grouped_presets("gptoss")


def olmoe_against_dense() -> list[Variant]:
    """OLMoE-1B-7B grouped against the dense Llama-3.1-8B at `lowest_memory` (issue 60 asks >= 2x), the chapter's
    script on the 8B in the same call, and OLMoE's steady steps under torch.profiler (where the idle GPU time goes)."""
    log = [*OFF, "logging_steps=1"]
    grouped = {"MEMTUNE_EXPERTS": "grouped"}
    return [Variant("olmoe-lowest_memory-grouped", "lowest_memory", log, steps=10, warm=3, timeout_s=100,
                    arch="olmoe-1b-7b", env=grouped, note="experts in grouped products"),
            Variant("llama8b-lowest_memory", "lowest_memory", log, steps=8, warm=3, timeout_s=100, arch="llama-3.1-8b",
                    note="dense 8B, the yardstick"),
            Variant("chapter-script", steps=3, warm=1, timeout_s=150, arch="llama-3.1-8b",
                    note="the chapter's script as written"),
            Variant("olmoe-lowest_memory-profile", "lowest_memory", log, steps=8, warm=3, timeout_s=120,
                    arch="olmoe-1b-7b", env=grouped, torch_steps="6-7", note="torch.profiler over steps 6-7")]


def lora_on_4bit_experts() -> list[Variant]:
    """OLMoE-1B-7B at `lowest_memory`, experts grouped, without and with `lora_experts` (per-expert LoRA beside the
    4-bit experts, core/levers/expert_lora.py): it trains on CUDA, its speed and memory against the same row without,
    and its estimate."""
    log = [*OFF, "logging_steps=1"]
    grouped = {"MEMTUNE_EXPERTS": "grouped"}
    return [Variant("olmoe-lowest_memory-grouped", "lowest_memory", log, steps=10, warm=3, timeout_s=100,
                    env=grouped, note="experts in grouped products"),
            Variant("olmoe-lowest_memory-lora_experts", "lowest_memory", [*log, "lora_experts=true"], steps=10, warm=3,
                    timeout_s=120, env=grouped, note="the same with LoRA on every expert")]


def llama4_grouped(smoke: bool) -> list[Variant]:
    """Llama-4 (Scout's text model, 4 of 48 layers) with its own experts class in 4 bits: `lowest_memory` in grouped
    products (core/levers/family_experts.py, no host sync) then one expert at a time (the first losses of the pair
    compared), with `lora_experts` (per-expert LoRA on the 4-bit experts), and `fastest` grouped: speed, NVML peak
    against each row's estimate (Llama-4's every-token copies, measured: core/estimate/measure.py ROUTED_ROWS).
    moe9smoke: the same rows on the CPU, a tiny Llama-4."""
    log = [*OFF, "logging_steps=1"]
    grouped, loop = {"MEMTUNE_EXPERTS": "grouped"}, {"MEMTUNE_EXPERTS": "loop"}
    arch = "llama4-scout-text-4l"
    rows = [Variant("llama4-lowest_memory-grouped", "lowest_memory", log, steps=8, warm=3, timeout_s=150, arch=arch,
                    env=grouped, note="its own experts class in grouped products"),
            Variant("llama4-lowest_memory-loop", "lowest_memory", log, steps=5, warm=2, timeout_s=150, arch=arch,
                    env=loop, note="experts one at a time (the reference)"),
            Variant("llama4-lowest_memory-lora_experts", "lowest_memory", [*log, "lora_experts=true"], steps=8, warm=3,
                    timeout_s=150, arch=arch, env=grouped, note="the same with LoRA on every expert"),
            Variant("llama4-fastest-grouped", "fastest", log, steps=8, warm=3, timeout_s=150, arch=arch, env=grouped,
                    note="experts in grouped products")]
    if smoke:
        for v in rows:
            v.steps, v.warm, v.max_length, v.timeout_s = 3, 1, 128, 400
            v.arch = "tiny-llama4-text"
    return rows


# issue 60's targets for Qwen3-30B-A3B at full depth: tok/s at least, NVML GiB at most
TARGETS = {"qwen3-48l-lowest_memory-grouped": (4000, 18), "qwen3-48l-fastest-grouped": (12000, 24)}


def grouped_verdict(results: dict, runs: Path) -> list[str]:
    """moe4's checks, one line each, PASS/FAIL/INFO: every row ran; each row's log says how its experts computed;
    each pair's first loss within 0.5% (issue 60); grouped over loop tok/s; each grouped row's estimate within 10% of
    NVML; OLMoE grouped over the dense 8B (issue 60 asks >= 2x)."""
    rows = {r["name"]: r for r in results.get("rows", [])}
    lines = []

    def said(name: str) -> set[str]:
        path = runs / name / "events.jsonl"
        if not path.is_file():
            return set()
        import json

        keys = set()
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                keys.add(json.loads(line).get("key") or "")
            except ValueError:
                continue
        return keys

    for name, r in rows.items():
        ok = r.get("rc") == 0
        lines.append(f"{'PASS' if ok else 'FAIL'} ran: {name} rc={r.get('rc')}")
        how = said(name)
        want = {"loop": "log.moe.experts_4bit", "grouped": "log.moe.experts_4bit_grouped"}.get(name.rsplit("-", 1)[-1])
        if want:
            lines.append(f"{'PASS' if want in how else 'FAIL'} log: {name} says {want}")
    for tag in GROUPED_PAIRS:
        loop, grouped = rows.get(f"{tag}-lowest_memory-loop"), rows.get(f"{tag}-lowest_memory-grouped")
        if not (loop or grouped):  # a plan without this pair (moe5b)
            continue
        if not (loop and grouped and loop.get("first_losses") and grouped.get("first_losses")):
            lines.append(f"FAIL losses: {tag} pair incomplete")
            continue
        a, b = loop["first_losses"][0], grouped["first_losses"][0]
        rel = abs(b - a) / abs(a) if a else float("inf")
        lines.append(f"{'PASS' if rel <= 0.005 else 'FAIL'} first loss {tag}: loop {a} grouped {b} ({100 * rel:.3f}%, "
                     f"<= 0.5%); next: loop {loop['first_losses'][1:]} grouped {grouped['first_losses'][1:]}")
        s_loop, s_grouped = loop.get("steady_tokens_per_s"), grouped.get("steady_tokens_per_s")
        if s_loop and s_grouped:
            lines.append(f"INFO speed {tag}: loop {s_loop:,.0f} tok/s, grouped {s_grouped:,.0f} tok/s "
                         f"({s_grouped / s_loop:.2f}x); NVML {loop.get('nvml_peak_gib')} -> {grouped.get('nvml_peak_gib')} GiB")
    for name, r in rows.items():
        est, got = r.get("estimate_nvml_gib"), r.get("nvml_peak_gib")
        if name.endswith("grouped") and est and got:
            err = est / got - 1
            lines.append(f"{'PASS' if abs(err) <= 0.10 else 'FAIL'} estimate {name}: {est:.2f} GiB against NVML "
                         f"{got:.2f} ({100 * err:+.1f}%, within 10%)")
    for name, (speed, gib) in TARGETS.items():
        r = rows.get(name, {})
        if r.get("steady_tokens_per_s") and r.get("nvml_peak_gib"):
            ok = r["steady_tokens_per_s"] >= speed and r["nvml_peak_gib"] <= gib
            lines.append(f"{'PASS' if ok else 'FAIL'} target {name}: {r['steady_tokens_per_s']:,.0f} tok/s at "
                         f"{r['nvml_peak_gib']:.2f} GiB (issue 60: >= {speed:,} tok/s within {gib} GiB)")
    moe, dense = rows.get("olmoe-lowest_memory-grouped", {}), rows.get("llama8b-lowest_memory", {})
    if moe.get("steady_tokens_per_s") and dense.get("steady_tokens_per_s"):
        ratio = moe["steady_tokens_per_s"] / dense["steady_tokens_per_s"]
        lines.append(f"{'PASS' if ratio >= 2 else 'INFO'} OLMoE grouped / dense 8B lowest_memory: {ratio:.2f}x "
                     f"(issue 60 asks >= 2x)")
    return lines


def lean(name: str) -> list[Variant]:
    """Issue 42's lean goals on the 8B shape: `lowest_memory` >= 1.25x Unsloth's lowest-memory setting (run 10: 1,993
    tok/s at 7.46 GiB NVML) at no more NVML, `six_gb` >= 1,500 tok/s at <= 5.5 GiB. Both presets are host-bound
    (GPU busy 12-30%, ~19,000 launches per optimizer step): more tokens per launch is the lever. Run 6's `lowest_memory
    + varlen + liger + 4 packs x 2` ran 4,224 tok/s at 6.76 GiB (before offloading, when the preset ran 2,364); today's
    preset runs ~1,700 at 6.22. Rows in priority order (--budget-s skips the tail): the yardstick, each preset as it
    is, the candidates most likely to meet the goals, the peer in the same call, then the variants that say which
    lever did it. lean1smoke: the same rows on the CPU with the tiny model (CUDA-only levers dropped there)."""
    smoke = name.endswith("smoke")
    off = ["validation_share=0"]
    varlen = ["attention=varlen"]
    x42 = ["per_device_train_batch_size=4", "gradient_accumulation_steps=2"]
    x32 = ["per_device_train_batch_size=3", "gradient_accumulation_steps=2"]
    x23 = ["per_device_train_batch_size=2", "gradient_accumulation_steps=3"]
    x61 = ["per_device_train_batch_size=6", "gradient_accumulation_steps=1"]
    ws = ["small_cublas_workspace=true"]
    lm = dict(steps=12, warm=3, timeout_s=75)
    rows = [
        Variant("chapter-script", steps=3, warm=1, timeout_s=120, note="the chapter's script as written"),
        Variant("lowest_memory", "lowest_memory", off, **lm,
                note="the preset: 4 packs x 2, varlen, offloaded (run 18)"),
        Variant("lm-4x2-varlen", "lowest_memory", [*off, *varlen, *x42], **lm,
                note="run 6's 4,224 tok/s row, with today's offloading: the lead candidate (estimate 6.56 GiB)"),
        Variant("unsloth-low", steps=10, warm=3, timeout_s=100, peer=True,
                script_args=["--packing", "--batch", "2", "--accum", "3", "--checkpointing", "unsloth"],
                note="Unsloth, its packing, 2 packs x 3, its offloaded checkpointing (run 10: 1,993 at 7.46 GiB)"),
        Variant("six_gb", "six_gb", off, **lm, note="the preset today: 1 pack x 6 (estimate 5.54 GiB)"),
        Variant("six_gb-1x6-varlen-offload", "six_gb", [*off, *varlen, "offload_activations=true"], **lm,
                note="per-row FlashAttention and offloaded layer inputs at one pack (estimate 5.43 GiB)"),
        Variant("six_gb-2x3-varlen-ws-offload", "six_gb", [*off, *varlen, *x23, *ws, "offload_activations=true"], **lm,
                note="2 packs per launch; small cuBLAS workspaces and offloading pay for the second pack (est. 5.50)"),
        Variant("six_gb-2x3-varlen-ws", "six_gb", [*off, *varlen, *x23, *ws], **lm,
                note="the same without offloading: its cost at 2 packs (estimate 5.72 GiB: over 5.5)"),
        Variant("lm-3x2-varlen", "lowest_memory", [*off, *varlen, *x32], **lm,
                note="the preset's 6 packs per optimizer step in 2 micro-steps (estimate 6.42 GiB)"),
        Variant("lm-4x2-varlen-nooffload", "lowest_memory", [*off, *varlen, *x42, "offload_activations=false"], **lm,
                note="run 6's row exactly: what offloading costs at 4 packs (estimate 7.00 GiB)"),
        Variant("lm-2x3-varlen", "lowest_memory", [*off, *varlen], **lm, note="varlen alone"),
        Variant("lm-6x1-varlen", "lowest_memory", [*off, *varlen, *x61], **lm,
                note="one micro-step per optimizer step (estimate 6.83 GiB)"),
    ]
    if smoke:  # the tiny model on the CPU: few steps; the peer needs its own wheels and a GPU; the chapter's script
        rows = [v for v in rows if v.preset]  # takes minutes on 2 CPU cores and is not what this plan changes
        for v in rows:
            v.steps, v.warm, v.max_length, v.timeout_s = 3, 1, 128, 300
    return rows


def compile2(name: str) -> list[Variant]:
    """Issue 42's "compile that pays", after run 14 (`fastest` + compile_layers: 86 s cold for 7 graphs, 52 s from
    the cache with 7 loaded and 0 compiled, 3-8% faster than plain). Since: the first layer's input requires grad
    like the others' (no recompile of each layer graph without checkpointing), Python floats are constants from the
    start (no restarted analysis: a cached demo compile 37 -> 8 s on the CPU), and summary.json's compile phases
    split a cached compile into dynamo tracing again (`tracing_s`) and the backend loading (`backend_s`). Cold and
    warm rows share a compile cache folder of this call's own (MEMTUNE_COMPILE_CACHE), empty at the first. Then the
    launch-bound `lowest_memory` compiled (run 11: one steady step at 2,746 tok/s, 1.38x the peer's 1,993, before its
    row timed out), cold and from the cache: whether compiling is the lever for issue 42's lean goal.
    compile2smoke: the same rows on the CPU with the tiny model and inductor (minutes per cold compile on 2 cores)."""
    import time

    smoke = name.endswith("smoke")
    cache = {"MEMTUNE_COMPILE_CACHE": f"/tmp/memtune-compile2-{int(time.time())}",
             "TORCH_LOGS": "recompiles,graph_breaks"}
    off, on = ["validation_share=0"], ["validation_share=0", "compile_layers=true"]
    rows = [
        Variant("fastest", "fastest", off, steps=16, warm=4, timeout_s=70),
        Variant("fastest-compile-cold", "fastest", on, steps=16, warm=5, timeout_s=180, env=cache,
                note="compile cache empty (run 14: 86.1 s, 7 graphs)"),
        Variant("fastest-compile-warm", "fastest", on, steps=16, warm=5, timeout_s=120, env=cache,
                note="the cache the row before filled (run 14: 52.1 s, 7 loaded)"),
        Variant("lowest_memory-compile-cold", "lowest_memory", on, steps=12, warm=4, timeout_s=150, env=cache,
                note="run 11: 92 s to the first step, then 2,746 tok/s for one step"),
        Variant("lowest_memory-compile-warm", "lowest_memory", on, steps=12, warm=4, timeout_s=110, env=cache),
    ]
    if smoke:
        for v in rows:
            v.steps, v.warm, v.max_length, v.timeout_s = 3, 1, 128, 600
    return rows


def preference(name: str) -> list[Variant]:
    """Issue 44: DPO and ORPO on the Llama-3.1-8B shape with `lowest_memory` (NVML peak, steady tokens/s, the
    estimate a user reads before Start and its error) beside TRL's documented QLoRA DPO setup as written
    (bench/trl_dpo_script.py), in one call, all on the call's preference pairs (bench/synth.py preference_pairs,
    dolly-like lengths). The preset packs rows, which TRL's preference trainers cannot (they pad pairs): packing off,
    as memtune's check tells a user (problem.stage_packing); its 4 rows per micro-step are then 4 pairs (8
    sequences), x 2 accumulation. A loss every step: while the policy equals its reference DPO's first loss is
    ln 2 = 0.6931, on memtune's row and TRL's alike. Timeouts: ~60 s to build the 8B folder, then 200 + 110 + 100 s
    of rows and two estimates of ~15 s, in one 600 s call with --budget-s 520 (the plan runs no discarded warm row:
    the script row, first, warms the machine). dpo1smoke: the same rows on the CPU with the tiny model, 2 steps."""
    smoke = name.endswith("smoke")
    pref = ["packing=false", "validation_share=0", "logging_steps=1"]
    rows = [
        Variant("trl-dpo-qlora", steps=5, warm=1, timeout_s=200, module="bench.trl_dpo_script", data="pairs",
                note="TRL's documented QLoRA DPO setup as written (2 pairs x 8, max length 1024, float32 base)"),
        Variant("dpo-lowest_memory", "lowest_memory", ["stage=dpo", *pref], steps=6, warm=2, timeout_s=110,
                data="pairs", note="memtune DPO: the preset's 4 rows x 2 as pairs, the reference the adapter disabled"),
        Variant("orpo-lowest_memory", "lowest_memory", ["stage=orpo", *pref], steps=6, warm=2, timeout_s=100,
                data="pairs", note="memtune ORPO: no reference pass"),
    ]
    if smoke:  # the tiny model on the CPU (CUDA-only levers dropped there): the rows' code paths, not a measurement;
        for v in rows:  # the warm-up pass too (CUDA's auto, the CPU's off)
            v.steps, v.warm, v.max_length, v.timeout_s = 2, 1, 128, 600
            v.sets += ["kernel_warmup=on"] if v.preset else []
    return rows


def grpo(name: str) -> list[Variant]:
    """GRPO (stage=grpo, TRL's GRPOTrainer) on the Llama-3.1-8B shape with `lowest_memory`, 4 answers of up to 256
    tokens per prompt (issue 61: the estimate within 10% of NVML, tokens/s and the sampling's share of the step),
    beside the SFT row of the same preset in the same call. Rewards on random weights are 0: the row measures memory
    and time, not learning. grpo1smoke: the same rows on the CPU with the tiny model."""
    smoke = name.endswith("smoke")
    sets = ["stage=grpo", "packing=false", "validation_share=0", "logging_steps=1", "num_generations=4",
            "max_completion_length=256", "grpo_rewards=exact"]
    rows = [Variant("sft-lowest_memory", "lowest_memory", [*OFF, "logging_steps=1"], steps=8, warm=3, timeout_s=100,
                    note="SFT, the same preset"),
            Variant("grpo-lowest_memory", "lowest_memory", sets, steps=4, warm=1, timeout_s=300,
                    note="GRPO, 4 answers x 256 tokens per prompt, sampled with transformers' generate")]
    if smoke:
        for v in rows:
            v.steps, v.warm, v.max_length, v.timeout_s = 2, 1, 128, 600
            v.sets = [s.replace("max_completion_length=256", "max_completion_length=8") for s in v.sets]
    return rows


SIX_GIB = 6.0  # a 6 GB card (RTX 2060/3050/4050 class) holds 6 GiB


def grpo_small(name: str) -> list[Variant]:
    """GRPO on the Qwen2.5-1.5B-Instruct shape within a 6 GiB card (issue 61): `lowest_memory`, 4 answers of up to 256
    tokens per prompt, after the SFT row of the same preset, both in a process that sees only 6 GiB (bench/capped.py:
    the allocator's cap is the card less the CUDA context the estimate counts). A row that fits ends with its NVML
    peak at most 6 GiB; one that does not ends in an out-of-memory error, as it would on that card. grpo2smoke: the
    same rows on the CPU with the tiny model (no cap there)."""
    smoke = name.endswith("smoke")
    arch = "" if smoke else "qwen2.5-1.5b-instruct"
    sets = ["stage=grpo", "packing=false", "validation_share=0", "logging_steps=1", "num_generations=4",
            "max_completion_length=256", "grpo_rewards=exact"]
    rows = [Variant("sft-lowest_memory-6gib", "lowest_memory", [*OFF, "logging_steps=1"], steps=8, warm=3,
                    timeout_s=100, arch=arch, card_gib=SIX_GIB, note="SFT, the same preset, a 6 GiB card"),
            Variant("grpo-lowest_memory-6gib", "lowest_memory", sets, steps=4, warm=1, timeout_s=300, arch=arch,
                    card_gib=SIX_GIB, note="GRPO, 4 answers x 256 tokens per prompt, a 6 GiB card")]
    if smoke:
        for v in rows:
            v.steps, v.warm, v.max_length, v.timeout_s, v.card_gib = 2, 1, 128, 600, 0.0
            v.sets = [s.replace("max_completion_length=256", "max_completion_length=8") for s in v.sets]
    return rows


def speed22(name: str) -> list[Variant]:
    """Issue 42 after run 21's profile of `fastest` (4,779 launches per step, the GPU idle half the step): two levers
    that remove launches at a known memory cost, each alone and together, beside the preset as it is. (1) 4-bit
    weights without double quantization: every dequantize of a frozen weight is then one kernel instead of three
    (its 8-bit absmax dequantized, the offset added, then the NF4 weight), 56 fewer launches per layer and step, for
    ~0.30 GiB more on 8B (fp32 absmax). (2) torch's fused AdamW instead of bitsandbytes' paged 8-bit AdamW, which
    synchronizes the GPU once per parameter (258 per step): one multi-tensor kernel, +0.08 GiB of fp32 states for
    the 13.6M LoRA parameters. Then `six_gb` on this call's card (run 21's 1,266 tok/s was an H100), the candidate
    compiled (cold, then from the cache), the 3B grown, and where the 6 GB setting's time goes. speed22a: the levers
    on the 8B and the 3B and `six_gb`, one call (run 22); speed22b: compiled, the profile, the lean presets (not
    run yet). speed22smoke: the same rows on the CPU with the tiny model."""
    import time

    smoke = name.endswith("smoke")
    nodq, fused = ["bnb_4bit_use_double_quant=false"], ["optim=adamw_torch_fused"]
    cache = {"MEMTUNE_COMPILE_CACHE": f"/tmp/memtune-speed22-{int(time.time())}"}
    fast = dict(steps=16, warm=4, timeout_s=80)
    lm = dict(steps=12, warm=3, timeout_s=75)
    b3 = "llama-3.2-3b"
    compiled = [*OFF, *nodq, *fused, "compile_layers=on"]
    a = [
        Variant("chapter-script", steps=3, warm=1, timeout_s=120, note="the chapter's script as written"),
        Variant("fastest", "fastest", OFF, **fast, note="the preset as it is (run 13's H200 mean: 12,356)"),
        Variant("fastest-nodq-fusedopt", "fastest", [*OFF, *nodq, *fused], **fast, note="both levers"),
        Variant("fastest-nodq", "fastest", [*OFF, *nodq], **fast, note="one dequantize kernel per weight, not 3"),
        Variant("fastest-fusedopt", "fastest", [*OFF, *fused], **fast, note="no per-parameter GPU sync"),
        Variant("six_gb", "six_gb", OFF, **lm, note="2 packs x 3 (run 21, H100: 1,266 tok/s at 5.20 GiB)"),
        Variant("3b-fastest", "fastest", OFF, steps=14, warm=4, timeout_s=70, arch=b3,
                note="grown to 16 packs (run 10: 24,995 tok/s)"),
        Variant("3b-fastest-nodq-fusedopt", "fastest", [*OFF, *nodq, *fused], steps=14, warm=4, timeout_s=70,
                arch=b3),
    ]
    b = [
        Variant("fastest-nodq-fusedopt-compile-cold", "fastest", compiled, steps=16, warm=5, timeout_s=150, env=cache,
                note="compile cache empty"),
        Variant("fastest-nodq-fusedopt-compile-warm", "fastest", compiled, steps=16, warm=5, timeout_s=100, env=cache,
                note="the cache the row before filled"),
        Variant("prof-six_gb", "six_gb", OFF, steps=9, torch_steps="8-9", timeout_s=110,
                note="torch.profiler over two optimizer steps of the 6 GB setting"),
        Variant("3b-fastest-nodq-fusedopt-compile-cold", "fastest", compiled, steps=14, warm=5, timeout_s=120,
                arch=b3, env=cache),
        Variant("lowest_memory", "lowest_memory", OFF, **lm),
        Variant("lowest_memory-fusedopt", "lowest_memory", [*OFF, *fused], **lm),
        Variant("six_gb-fusedopt", "six_gb", [*OFF, *fused], **lm),
    ]
    rows = {"speed22a": a, "speed22b": b}.get(name, a + b)
    if smoke:  # the tiny model on the CPU: the rows' code paths; the chapter's script takes minutes on 2 cores
        rows = [v for v in rows if v.preset and not v.torch_steps]
        for v in rows:
            v.steps, v.warm, v.max_length, v.timeout_s, v.arch = 3, 1, 128, 600, ""
    return rows


def speed23(name: str) -> list[Variant]:
    """Issue 42 with the pairs repeated (run 22 had one row each, inside the +-8% identical processes spread): the
    preset and the candidate (no double quantization + torch's fused AdamW) alternated three times in one call, 28
    steps each so that their steps pair, then the candidate compiled from an empty cache and twice from the cache it
    filled. speed23a: the 8B beside the chapter's script; speed23b: the 3B the same way, and the lean presets with
    fused AdamW against their own. speed23smoke: the rows' code paths on the CPU with the tiny model."""
    import time

    smoke = name.endswith("smoke")
    cand = [*OFF, "bnb_4bit_use_double_quant=false", "optim=adamw_torch_fused"]
    cache = {"MEMTUNE_COMPILE_CACHE": f"/tmp/memtune-speed23-{int(time.time())}"}
    fast = dict(steps=28, warm=4, timeout_s=80)
    lm = dict(steps=12, warm=3, timeout_s=75)

    def pairs(arch: str = "", tag: str = "") -> list[Variant]:
        rows = []
        for i in (1, 2, 3):
            rows.append(Variant(f"{tag}fastest-{i}", "fastest", OFF, **fast, arch=arch, note="the preset as it is"))
            rows.append(Variant(f"{tag}cand-{i}", "fastest", cand, **fast, arch=arch,
                                note="no double quantization + fused AdamW"))
        compiled = [*cand, "compile_layers=on"]
        rows += [Variant(f"{tag}cand-compile-cold", "fastest", compiled, steps=28, warm=6, timeout_s=150, arch=arch,
                         env=cache, note="compile cache empty"),
                 *(Variant(f"{tag}cand-compile-warm-{i}", "fastest", compiled, steps=28, warm=4, timeout_s=100,
                           arch=arch, env=cache, note="the cache the cold row filled") for i in (1, 2))]
        return rows

    a = [Variant("chapter-script", steps=3, warm=1, timeout_s=120, note="the chapter's script as written"), *pairs()]
    b = [*pairs("llama-3.2-3b", "3b-"),
         *(Variant(f"{p}{s}", p, [*OFF, *extra], **lm) for p in ("lowest_memory", "six_gb")
           for s, extra in (("", []), ("-fusedopt", ["optim=adamw_torch_fused"])))]
    rows = {"speed23a": a, "speed23b": b}.get(name, a + b)
    if smoke:
        rows = [v for v in rows if v.preset and not v.name.endswith(("-2", "-3"))]
        for v in rows:
            v.steps, v.warm, v.max_length, v.timeout_s, v.arch = 3, 1, 128, 600, ""
    return rows


def speed24(name: str) -> list[Variant]:
    """Issue 42 on the card its goals name (an H200, when lent): today's presets with the chapter's script and the
    peer at its best in one call, then what compiling adds to today's `fastest` (alternated with the eager preset,
    the cache warm), where its step goes now, and the 3B. speed24a: the chapter's script, `fastest` three times
    (first, middle, last), Unsloth's fastest within 24 GB (8 packs x 1, its offloaded checkpointing: run 10's row) and
    its lowest memory (2 packs x 3) beside `lowest_memory`, then `six_gb`. speed24b: `fastest` compiled from an empty
    cache, then eager / compiled-from-the-cache alternated twice (28 steps each: their steps pair), torch.profiler over
    two steady steps of `fastest` eager and compiled, the 3B with one pair. speed24smoke: the preset rows' code paths on the CPU."""
    import time

    smoke = name.endswith("smoke")
    cache = {"MEMTUNE_COMPILE_CACHE": f"/tmp/memtune-speed24-{int(time.time())}"}
    fast = dict(steps=28, warm=4, timeout_s=80)
    lm = dict(steps=12, warm=3, timeout_s=75)
    peer = ["--packing", "--checkpointing", "unsloth"]
    a = [
        Variant("chapter-script", steps=3, warm=1, timeout_s=120, note="the chapter's script as written"),
        Variant("fastest-1", "fastest", OFF, **fast),
        Variant("unsloth-fast", steps=10, warm=3, timeout_s=110, peer=True,
                script_args=[*peer, "--batch", "8", "--accum", "1"],
                note="Unsloth 2026.10.9, its packing, 8 packs x 1, its offloaded checkpointing (its fastest in 24 GB)"),
        Variant("lowest_memory", "lowest_memory", OFF, **lm),
        Variant("unsloth-low", steps=10, warm=3, timeout_s=110, peer=True,
                script_args=[*peer, "--batch", "2", "--accum", "3"],
                note="Unsloth 2026.10.9, its packing, 2 packs x 3, its offloaded checkpointing (its lowest memory)"),
        Variant("fastest-2", "fastest", OFF, **fast),
        Variant("six_gb", "six_gb", OFF, **lm),
        Variant("fastest-3", "fastest", OFF, **fast),
    ]

    on = [*OFF, "compile_layers=on"]

    def compiled(arch: str = "", tag: str = "", pairs: int = 2) -> list[Variant]:
        rows = [Variant(f"{tag}compile-cold", "fastest", on, steps=28, warm=6, timeout_s=150, arch=arch, env=cache,
                        note="compile cache empty")]
        for i in range(1, pairs + 1):
            rows += [Variant(f"{tag}eager-{i}", "fastest", [*OFF, "compile_layers=off"], **fast, arch=arch),
                     Variant(f"{tag}compile-warm-{i}", "fastest", on, steps=28, warm=4, timeout_s=100, arch=arch,
                             env=cache, note="the cache the cold row filled")]
        return rows

    b = [*compiled(),
         Variant("prof-fastest", "fastest", [*OFF, "compile_layers=off"], steps=10, torch_steps="8-9", timeout_s=90,
                 note="torch.profiler over two optimizer steps of today's preset"),
         Variant("prof-compiled", "fastest", on, steps=10, torch_steps="8-9", timeout_s=90, env=cache,
                 note="the same, compiled from the cache: what compiling leaves of the host's work"),
         *compiled("llama-3.2-3b", "3b-", pairs=1)]
    rows = {"speed24a": a, "speed24b": b}.get(name, a + b)
    if smoke:
        rows = [v for v in rows if v.preset and not v.name.endswith(("-2", "-3")) and not v.torch_steps]
        for v in rows:
            v.steps, v.warm, v.max_length, v.timeout_s, v.arch = 3, 1, 128, 600, ""
    return rows


def speed25(name: str) -> list[Variant]:
    """Issue 42, host time: `fastest` is host-bound (GPU busy ~70%), and on the CPU the Trainer's flop count walks
    every parameter per micro-batch and the varlen attention read its kernel's signature per layer; this tree counts
    once and reads once (core/train/host.py, core/model/attention.py). Rows from dcb0998's tree (`bash
    bench/bisect_trees.sh dcb0998`, before) alternate with this tree's, eager, their steps paired. Then inductor's CUDA
    graphs over the compiled layers (MEMTUNE_COMPILE_MODE=reduce-overhead, every micro-batch padded to 8 x 512 tokens so
    each layer piece is recorded once), cold and from its cache, beside today's compile from its own cache. That switch
    lived in commit 6f8d4af (core/model/compile.py, core/config/arguments.py) and was removed after run 25 measured it
    (+1.6% a step over today's compile, +2.3 GiB, past 24 GiB): its rows now run today's compile.
    speed25a: the 8B. speed25b: the 3B. speed25c: after 25a (the first process of a fresh machine slow, the host
    faster row by row; CUDA graphs +1-2% over today's compile for +2.3 GiB): the chapter's script, old and new eager,
    today's compile, then the 3B eager and compiled. speed25smoke: this tree's rows on the CPU with the tiny model."""
    import time
    from pathlib import Path

    smoke = name.endswith("smoke")
    stamp = int(time.time())
    arch = "llama-3.2-3b" if name.startswith("speed25b") else ""
    tag = "3b-" if arch else ""
    old = str(Path(".bisect") / "dcb0998")
    eager = [*OFF, "compile_layers=off"]
    on = [*OFF, "compile_layers=on"]
    graphs = {"MEMTUNE_COMPILE_MODE": "reduce-overhead", "TORCH_LOGS": "perf_hints",
              "MEMTUNE_COMPILE_CACHE": f"/tmp/memtune-graphs25-{tag}{stamp}"}
    plain = {"MEMTUNE_COMPILE_CACHE": f"/tmp/memtune-plain25-{tag}{stamp}"}
    fast = dict(steps=28, warm=4, timeout_s=80, arch=arch)
    rows = []
    for i in (1, 2):  # new, old, old, new: a drift over the call weighs on both alike
        pair = [Variant(f"{tag}new-{i}", "fastest", eager, **fast, note="this tree, eager"),
                Variant(f"{tag}old-{i}", "fastest", eager, **fast, code=old, note="dcb0998's tree, eager")]
        rows += pair if i == 1 else pair[::-1]
    rows += [Variant(f"{tag}graphs-cold", "fastest", on, steps=28, warm=8, timeout_s=170, arch=arch, env=graphs,
                     note="compiled layers with CUDA graphs, cache empty"),
             Variant(f"{tag}graphs-warm", "fastest", on, steps=28, warm=6, timeout_s=110, arch=arch, env=graphs,
                     note="the same from the cache the cold row filled")]
    if not arch:
        rows += [Variant("plain-cold", "fastest", on, steps=8, warm=4, timeout_s=120, env=plain,
                         note="today's compile, filling its cache (not compared)"),
                 Variant("plain-warm", "fastest", on, steps=28, warm=4, timeout_s=100, env=plain,
                         note="today's compile from its cache")]
    if name.startswith("speed25c"):  # run 25a's lesson: a warm machine first, the yardstick in the call
        rows = [Variant("chapter-script", steps=3, warm=1, timeout_s=120, note="the chapter's script as written"),
                *rows[:4], *(v for v in rows if v.name.startswith("plain")),
                *(replace(v, name=f"3b-{v.name}", arch="llama-3.2-3b",
                          env={k: f"{x}-3b" if k == "MEMTUNE_COMPILE_CACHE" else x for k, x in v.env.items()})
                  for v in (next(r for r in rows if r.name == n) for n in ("new-1", "plain-cold", "plain-warm",
                                                                             "new-2")))]
    if smoke:
        rows = [v for v in rows if not v.code and not v.name.endswith("-2")]
        for v in rows:
            v.steps, v.warm, v.max_length, v.timeout_s, v.arch = 3, 1, 128, 900, ""
    return rows


def vision1() -> list[Variant]:
    """Image-text models at `lowest_memory`, 8 steps each (3 warm) on 1024 x 768 image rows with 20-120-word answers
    (bench/synth.py image_rows), sized for the real rows by the estimate (--data: the processor counts each row's
    image tokens): Qwen2.5-VL-7B's shape (about 1,000 image tokens a photo at the processor's default budget; its
    processor needs torchvision) and Gemma-3-12B's (256 image tokens a photo, 896 x 896)."""
    return [Variant(f"{arch}-lowest_memory", "lowest_memory", steps=8, warm=3, timeout_s=420, arch=arch,
                    max_length=2048, data="images")
            for arch in ("qwen2.5-vl-7b", "gemma-3-12b-it")]


def plan(name: str) -> list[Variant]:
    if name == "vision1":
        return vision1()
    if name.startswith("speed25"):
        return speed25(name)
    if name.startswith("speed24"):
        return speed24(name)
    if name.startswith("speed23"):
        return speed23(name)
    if name.startswith("speed22"):
        return speed22(name)
    if name in ("grpo1", "grpo1smoke"):
        return grpo(name)
    if name in ("grpo2", "grpo2smoke"):
        return grpo_small(name)
    if name in ("dpo1", "dpo1smoke"):
        return preference(name)
    if name in ("compile2", "compile2smoke"):
        return compile2(name)
    if name in ("lean1", "lean1smoke"):
        return lean(name)
    if name.startswith("moe"):
        return moe(name)
    if name == "run14":
        return presets_and_compile_cache()
    if name == "bisect3":
        return bisect3()
    if name in BISECT:
        return bisect_rows(BISECT[name])
    if name == "bisect2":
        return bisect2()
    if name == "smoke":
        return [Variant("chapter-script", steps=3, warm=1), Variant("chapter", "chapter", steps=3, warm=1),
                Variant("lowest_memory", "lowest_memory", steps=3, warm=1),
                Variant("lowest_memory-varlen", "lowest_memory", ["attention=varlen"], steps=3, warm=1),
                Variant("fastest", "fastest", steps=3, warm=1),
                Variant("prof-lowest_memory", "lowest_memory", steps=3, warm=1, profile=True)]
    if name == "call1":  # baseline rows of issue 12, then one lever each (levers chosen from the earlier profiles)
        return [
            Variant("chapter-script", steps=5, warm=2, timeout_s=170, note="the chapter's script as written"),
            Variant("fastest", "fastest", steps=25, timeout_s=120),
            Variant("lowest_memory", "lowest_memory", steps=18, timeout_s=140),
            Variant("fastest-varlen", "fastest", ["attention=varlen"], steps=25, timeout_s=120),
            Variant("lowest_memory-varlen", "lowest_memory", ["attention=varlen"], steps=18, timeout_s=140),
            Variant("fastest-varlen-ckpt-24packs", "fastest",
                    ["attention=varlen", "gradient_checkpointing=true", "per_device_train_batch_size=24"],
                    steps=15, timeout_s=140),
            Variant("lowest_memory-varlen-liger-4packs", "lowest_memory",
                    ["attention=varlen", "use_liger_kernel=true", "per_device_train_batch_size=4",
                     "gradient_accumulation_steps=2"], steps=15, timeout_s=140),
            Variant("chapter", "chapter", steps=4, warm=1, timeout_s=150, note="engine, chapter preset"),
        ]
    if name == "call3":  # 2026-12-01: the first step, lowest_memory's last 0.04 GiB, the peer; 8B
        return [
            Variant("chapter-script", steps=4, warm=1, timeout_s=150, note="the chapter's script as written"),
            Variant("lowest_memory", "lowest_memory", steps=16, timeout_s=110),
            Variant("lowest_memory-liger", "lowest_memory", ["use_liger_kernel=true"], steps=16, timeout_s=110),
            Variant("fastest", "fastest", steps=25, timeout_s=100),
            Variant("fastest-again", "fastest", steps=25, timeout_s=100, note="same, second process: warm caches"),
            Variant("prof-fastest", "fastest", steps=8, warm=2, timeout_s=90, profile=True),
            Variant("prof-lowest_memory-liger", "lowest_memory", ["use_liger_kernel=true"], steps=8, warm=2,
                    timeout_s=90, profile=True),
            Variant("unsloth", steps=6, warm=2, timeout_s=170, peer=True, note="Unsloth 2026.10.9, 2 x 8"),
        ]
    if name == "call4":  # 2026-12-01: what the first step pays for (profiles) and the optimizer's share of it
        return [
            Variant("prof-fastest", "fastest", steps=6, warm=2, timeout_s=80, profile=True),
            Variant("prof-lowest_memory", "lowest_memory", steps=6, warm=2, timeout_s=80, profile=True),
            Variant("fastest-adamw8", "fastest", ["optim=adamw_8bit"], steps=15, timeout_s=80),
            Variant("lowest_memory-adamw8", "lowest_memory", ["optim=adamw_8bit"], steps=12, timeout_s=90),
            Variant("prof-fastest-adamw8", "fastest", ["optim=adamw_8bit"], steps=6, warm=2, timeout_s=80,
                    profile=True),
        ]
    if name == "eval":  # issue 22: what eval costs at the default settings (chapter preset, validation defaults)
        return [
            Variant("chapter-noeval", "chapter", ["validation_share=0"], steps=2, warm=1, timeout_s=70,
                    note="validation off"),
            Variant("chapter-eval", "chapter", ["eval_steps=2"], steps=2, warm=1, timeout_s=95,
                    note="validation defaults (5% held out, 3 answers of <= 32 tokens); evals at steps 0 and 2"),
        ]
    if name == "evalsmoke":  # the same on the CPU with a tiny model (checks the command before a GPU call)
        return [Variant("chapter-noeval", "chapter", ["validation_share=0", "optim=adamw_torch"], steps=2, warm=1),
                Variant("chapter-eval", "chapter", ["eval_steps=2", "optim=adamw_torch"], steps=2, warm=1)]
    if name in ("stream70", "stream70-smoke"):  # stream_layers: the 70B shape (saved in 4-bit) on a 24 GB card,
        # max length 2048, 8 steps, beside the non-streamed lowest_memory row; a 14B on 8 GiB, a 32B on 16 GiB.
        # --arch llama-3.1-70b --quantized; summary.json's stream_layers (the row's) has the share of the training
        # time compute waited on copies. lowest_memory has offload_activations on already.
        smoke = name.endswith("smoke")
        log = ["logging_steps=1", "validation_share=0", "heldout_scorer=off"]
        stream = [*log, "stream_layers=true", "offload_activations=true"]
        rows = [
            Variant("lowest_memory-2048", "lowest_memory", log, steps=8, warm=2, max_length=2048, timeout_s=420,
                    note="not streamed, not capped (run 11: 36.13 GiB at 512): the speed to compare with"),
            Variant("stream-24g", "lowest_memory", stream, steps=8, warm=2, max_length=2048, timeout_s=600,
                    card_gib=24.0, note="frozen layers streamed from pinned memory, allocator capped as a 24 GiB card"),
            Variant("14b-stream-8g", "lowest_memory", stream, steps=8, warm=2, max_length=2048, timeout_s=420,
                    arch="qwen2.5-14b", card_gib=8.0),
            Variant("32b-stream-16g", "lowest_memory", stream, steps=8, warm=2, max_length=2048, timeout_s=540,
                    arch="qwen2.5-32b", card_gib=16.0),
        ]
        if smoke:  # the tiny model on the CPU: the commands and the summary's fields, no cap
            for v in rows:
                v.steps, v.warm, v.arch, v.max_length, v.timeout_s, v.card_gib = 2, 1, "", 128, 400, 0.0
        return rows
    if name == "call70b":  # the 70B's last GiB: one pack per micro-step (the same 6 packs per optimizer step)
        return [
            Variant("lowest_memory-1pack", "lowest_memory",
                    ["per_device_train_batch_size=1", "gradient_accumulation_steps=6"], steps=6, warm=2, timeout_s=170),
        ]
    if name == "firststep":  # after the varlen kernel moved to loading: fastest on a cold, then a warm Triton cache
        return [
            Variant("fastest", "fastest", steps=15, timeout_s=80, note="first liger run of this machine"),
            Variant("fastest-again", "fastest", steps=15, timeout_s=80, note="second process: warm caches"),
            Variant("lowest_memory", "lowest_memory", steps=12, timeout_s=90),
        ]
    if name == "call70":  # the 70B shape, model saved already in 4-bit (bf16 storage)
        return [
            Variant("chapter-script", steps=2, warm=1, timeout_s=200, note="the chapter's script as written"),
            Variant("lowest_memory", "lowest_memory", steps=6, warm=2, timeout_s=150),
            Variant("lowest_memory-noliger", "lowest_memory", ["use_liger_kernel=false"], steps=6, warm=2,
                    timeout_s=150),
        ]
    if name == "i25a":  # 2026-12-01 issue 25: profiles of steady steps, the peer at its best beside the presets
        b3 = "llama-3.2-3b"
        return [
            Variant("prof-fastest-512", "fastest", steps=10, torch_steps="8-9", timeout_s=80),
            Variant("prof-fastest-2048", "fastest", ["per_device_train_batch_size=2"], steps=10, torch_steps="8-9",
                    max_length=2048, timeout_s=80, note="2 packs of 2048: the same ~4k tokens per micro-step"),
            Variant("prof-lowest_memory-512", "lowest_memory", steps=9, torch_steps="8-9", timeout_s=90),
            Variant("prof-3b-fastest", "fastest", steps=12, torch_steps="10-11", arch=b3, timeout_s=70),
            Variant("3b-fastest-16packs", "fastest", ["per_device_train_batch_size=16"], steps=12, arch=b3,
                    timeout_s=70, note="micro-batch sized for the small model"),
            Variant("unsloth-fast", steps=10, peer=True, timeout_s=110,
                    script_args=["--packing", "--batch", "8", "--accum", "1", "--checkpointing", "false"],
                    note="Unsloth, its packing, 8 packs x 1, no checkpointing (fastest's shape)"),
            Variant("unsloth-fast-ckpt", steps=10, peer=True, timeout_s=110,
                    script_args=["--packing", "--batch", "8", "--accum", "1", "--checkpointing", "unsloth"],
                    note="Unsloth, its packing, 8 packs x 1, its offloaded checkpointing"),
            Variant("unsloth-low", steps=8, peer=True, timeout_s=120,
                    script_args=["--packing", "--batch", "2", "--accum", "3", "--checkpointing", "unsloth"],
                    note="Unsloth, its packing, 2 packs x 3 (lowest_memory's shape), its offloaded checkpointing"),
        ]
    if name == "i25b":  # issue 25, not run yet (no device lent after call 1): the 6 GB setting, losses per step
        log, lazy = "logging_steps=1", {"CUDA_MODULE_LOADING": "LAZY"}
        one = ["per_device_train_batch_size=1", "gradient_accumulation_steps=6"]
        return [
            Variant("six_gb", "six_gb", [log], steps=6, warm=2, timeout_s=80, env=lazy),
            Variant("lowest_memory-1pack", "lowest_memory", [log, *one], steps=6, warm=2, timeout_s=80,
                    note="six_gb's batches without the 4-bit head: the lever's own loss difference"),
            Variant("7b-six_gb", "six_gb", [log], steps=6, warm=2, arch="llama-2-7b", timeout_s=90, env=lazy),
            Variant("six_gb-2packs", "six_gb", [log, "per_device_train_batch_size=2", "gradient_accumulation_steps=3"],
                    steps=6, warm=2, timeout_s=80, env=lazy),
            Variant("chapter", "chapter", [log], steps=2, warm=1, timeout_s=90, note="the chapter recipe's losses"),
            Variant("unsloth-low", steps=8, peer=True, timeout_s=120,
                    script_args=["--packing", "--batch", "2", "--accum", "3", "--checkpointing", "unsloth"],
                    note="Unsloth, its packing, 2 packs x 3 (lowest_memory's shape), its offloaded checkpointing"),
        ]
    if name == "i25c":  # issue 25, call 2 of 2026-12-01 22:3x: i25b's rows with no held-out eval (i25b's steps
        # alternated 3-13 s: the default 5% validation share evaluated between steps), the 6 GB rows first
        log = ["logging_steps=1", "validation_share=0"]
        one = ["per_device_train_batch_size=1", "gradient_accumulation_steps=6"]
        return [
            Variant("six_gb", "six_gb", log, steps=6, warm=2, timeout_s=75),
            Variant("lowest_memory-1pack", "lowest_memory", [*log, *one], steps=6, warm=2, timeout_s=70,
                    note="six_gb's batches without the 4-bit head: the lever's own loss difference"),
            Variant("lowest_memory", "lowest_memory", log, steps=6, warm=2, timeout_s=70),
            Variant("7b-six_gb", "six_gb", log, steps=6, warm=2, arch="llama-2-7b", timeout_s=75),
        ]
    if name == "i25d":  # 2026-12-02 issue 25: the peer at its best beside both presets, same call, no held-out eval
        off = ["validation_share=0"]
        return [
            Variant("fastest", "fastest", off, steps=20, timeout_s=90),
            Variant("unsloth-fast-ckpt", steps=12, peer=True, timeout_s=120,
                    script_args=["--packing", "--batch", "8", "--accum", "1", "--checkpointing", "unsloth"],
                    note="Unsloth, its packing, 8 packs x 1 (fastest's shape), its offloaded checkpointing: within 24 GB"),
            Variant("lowest_memory", "lowest_memory", off, steps=10, timeout_s=100),
            Variant("unsloth-low", steps=8, peer=True, timeout_s=120,
                    script_args=["--packing", "--batch", "2", "--accum", "3", "--checkpointing", "unsloth"],
                    note="Unsloth, its packing, 2 packs x 3 (lowest_memory's shape), its offloaded checkpointing"),
            Variant("chapter-script", steps=3, warm=1, timeout_s=130, note="the chapter's script as written"),
            Variant("3b-fastest", "fastest", off, steps=15, arch="llama-3.2-3b", timeout_s=80,
                    note="the preset as sized for the 3B today"),
        ]
    if name == "phi":  # 2026-12-02 issues 20 + 25 (branch phi): Phi-3's fused-qkv activations term, the 3B sized up
        off = ["validation_share=0"]
        return [
            Variant("phi3-fastest", "fastest", off, steps=15, arch="phi-3-mini", timeout_s=90,
                    note="run 9 measured 13.25 GiB allocated / 16.08 NVML; estimate now 13.37 / 15.65"),
            Variant("phi3-fastest-4packs", "fastest", [*off, "per_device_train_batch_size=4"], steps=15,
                    arch="phi-3-mini", timeout_s=90,
                    note="half the tokens: the difference with phi3-fastest is the per-token term alone"),
            Variant("3b-fastest", "fastest", off, steps=15, arch="llama-3.2-3b", timeout_s=90,
                    note="as fit_preset now sizes it on a GPU: 16 packs x 1"),
            Variant("3b-fastest-8packs", "fastest", [*off, "per_device_train_batch_size=8"], steps=15,
                    arch="llama-3.2-3b", timeout_s=80, note="the preset's 8 packs, same call (run 10: 9,810 tok/s)"),
            Variant("8b-fastest", "fastest", off, steps=15, arch="llama-3.1-8b", timeout_s=90,
                    note="8 packs: not grown (22.4 GiB predicted)"),
        ]
    if name == "i25e":  # 2026-12-02 call 3: compile_layers with liger's in-layer kernels off (call 2: dynamo could
        # not trace them), the grown 3B fastest, Phi-3's new activation term; fastest beside them for the ratio
        off, on = ["validation_share=0"], ["validation_share=0", "compile_layers=true"]
        logs = {"TORCH_LOGS": "recompiles,graph_breaks"}
        return [
            Variant("fastest", "fastest", off, steps=15, warm=4, timeout_s=60),
            Variant("fastest-compile", "fastest", on, steps=20, warm=6, timeout_s=150, env=logs),
            Variant("lowest_memory-compile", "lowest_memory", on, steps=12, warm=4, timeout_s=150, env=logs),
            Variant("3b-fastest", "fastest", off, steps=15, warm=4, arch="llama-3.2-3b", timeout_s=70,
                    note="fit_preset grows the 3B's micro-batch (16 packs)"),
            Variant("3b-fastest-compile", "fastest", on, steps=15, warm=5, arch="llama-3.2-3b", timeout_s=100,
                    env=logs),
            Variant("phi3-fastest", "fastest", off, steps=10, warm=3, arch="phi-3-mini", timeout_s=80,
                    note="the estimate with v as a view of qkv_proj's output: 13.37 / 15.65 GiB"),
        ]
    if name == "i25smoke":  # the i25 plans' code paths on the CPU (tiny model)
        return [Variant("prof-fastest-512", "fastest", steps=4, torch_steps="3-4", warm=1),
                Variant("prof-lowest_memory-512", "lowest_memory", steps=3, torch_steps="2-3", warm=1,
                        max_length=256),
                Variant("six_gb", "six_gb", ["logging_steps=1"], steps=2, warm=1, max_length=256)]
    if name in ("compile", "compile-smoke"):  # issue 25: regional compile (compile_layers) beside both presets
        # Steady windows start after the compile (first step) and any recompile (warm); no held-out eval (its eval
        # mode would compile again). TORCH_LOGS puts dynamo's recompiles and graph breaks, with reasons, in the row's
        # .log; the run's own log counts them after the first step and at the end. Timeouts sum to 500 s (+ the two
        # model folders' build) for one 540 s call, in priority order: --budget-s skips what no longer fits.
        # compile-smoke: the same rows on the CPU with the tiny model, dynamo's eager backend (no C++ build).
        smoke = name.endswith("smoke")
        off, on = ["validation_share=0"], ["validation_share=0", "compile_layers=true"]
        logs = {"TORCH_LOGS": "recompiles,graph_breaks"}
        if smoke:
            logs = {**logs, "MEMTUNE_COMPILE_BACKEND": "eager"}
        rows = [Variant("fastest", "fastest", off, steps=25, warm=6, timeout_s=60),
                Variant("fastest-compile", "fastest", on, steps=25, warm=6, timeout_s=100, env=logs),
                Variant("lowest_memory", "lowest_memory", off, steps=14, warm=4, timeout_s=75),
                Variant("lowest_memory-compile", "lowest_memory", on, steps=14, warm=4, timeout_s=100, env=logs),
                Variant("3b-fastest-compile", "fastest", on, steps=25, warm=6, arch="llama-3.2-3b", timeout_s=75,
                        env=logs, note="beside run 10's 3b-fastest (9,810 tok/s)"),
                Variant("six_gb-compile", "six_gb", on, steps=12, warm=4, timeout_s=90, env=logs)]
        if smoke:
            for v in rows:
                v.steps, v.warm, v.arch, v.max_length, v.timeout_s = 3, 1, "", 128, 400  # 2 shared cores
        return rows
    if name in ("warmup", "warmupsmoke"):  # issue 25, branch warmup: the first step after the warm-up pass
        # (kernel_warmup: auto = on with CUDA) against a steady step, and fastest without it, each on cold Triton
        # and Inductor caches of its own (the first liger run of a fresh machine, as run 10 measured 5.08 s)
        smoke = name == "warmupsmoke"
        on = ["validation_share=0", *(["kernel_warmup=on"] if smoke else [])]  # the CPU's auto is off

        def cold(tag: str) -> dict:
            return {"TRITON_CACHE_DIR": f"/tmp/memtune-warmup-triton-{tag}",
                    "TORCHINDUCTOR_CACHE_DIR": f"/tmp/memtune-warmup-inductor-{tag}"}

        rows = [
            Variant("fastest", "fastest", on, steps=12, timeout_s=80, env=cold("fastest")),
            Variant("fastest-nowarmup", "fastest", ["validation_share=0", "kernel_warmup=off"], steps=12,
                    timeout_s=80, env=cold("fastest-nowarmup"), note="the same without the warm-up pass"),
            Variant("lowest_memory", "lowest_memory", on, steps=8, timeout_s=90, env=cold("lowest_memory")),
            Variant("six_gb", "six_gb", on, steps=6, timeout_s=90, env=cold("six_gb")),
            Variant("3b-fastest", "fastest", on, steps=12, arch="llama-3.2-3b", timeout_s=70, env=cold("3b")),
        ]
        if smoke:  # the tiny model on the CPU: few steps, short rows, one architecture
            for v in rows:
                v.steps, v.warm, v.max_length, v.arch, v.timeout_s = 3, 1, 128, "", 240
        return rows
    if name in ("i25f", "i25f-smoke"):  # 2026-12-02 (run 11) call 1: activation offloading for the 6 GB setting and
        # lowest_memory, regional compile (liger off) beside fastest and lowest_memory. In priority order: --budget-s
        # skips what no longer fits. Losses are logged per step: offloading must leave them exactly as they were.
        smoke = name.endswith("smoke")
        log = ["logging_steps=1", "validation_share=0"]
        off, on = ["validation_share=0"], ["validation_share=0", "compile_layers=true"]
        offload = [*log, "offload_activations=true"]
        logs = {"TORCH_LOGS": "recompiles,graph_breaks", **({"MEMTUNE_COMPILE_BACKEND": "eager"} if smoke else {})}
        rows = [
            Variant("six_gb-offload", "six_gb", offload, steps=6, warm=2, timeout_s=80),
            Variant("7b-six_gb-offload", "six_gb", offload, steps=6, warm=2, arch="llama-2-7b", timeout_s=80,
                    note="run 9: 5.144 GiB NVML without offloading"),
            Variant("six_gb", "six_gb", log, steps=6, warm=2, timeout_s=75, note="the same batches, not offloaded"),
            Variant("lowest_memory-offload", "lowest_memory", offload, steps=8, warm=3, timeout_s=75),
            Variant("fastest-compile", "fastest", on, steps=20, warm=6, timeout_s=110, env=logs),
            Variant("fastest", "fastest", off, steps=15, warm=4, timeout_s=60),
            Variant("lowest_memory-compile", "lowest_memory", on, steps=10, warm=4, timeout_s=100, env=logs),
            Variant("lowest_memory", "lowest_memory", log, steps=8, warm=3, timeout_s=70),
        ]
        if smoke:  # the tiny model on the CPU (offloading is off there: CUDA only)
            for v in rows:
                v.steps, v.warm, v.arch, v.max_length, v.timeout_s = 3, 1, "", 128, 400
        return rows
    if name in ("i25g", "i25g-smoke"):  # run 11 call 2: the 70B (saved in 4-bit) with the 6 GB setting's levers and
        # activation offloading, beside the chapter's script (the ratio); --arch llama-3.1-70b --quantized
        smoke = name.endswith("smoke")
        log = ["logging_steps=1", "validation_share=0"]
        offload = [*log, "offload_activations=true"]
        two = ["per_device_train_batch_size=2", "gradient_accumulation_steps=3"]
        rows = [
            Variant("six_gb-2packs-offload", "six_gb", [*offload, *two], steps=6, warm=2, timeout_s=100,
                    note="lowest_memory's 2 packs x 3, the 4-bit head, offloaded layer inputs"),
            Variant("chapter-script", steps=2, warm=1, timeout_s=200, note="the chapter's script as written"),
            Variant("six_gb-offload", "six_gb", offload, steps=6, warm=2, timeout_s=100),
            Variant("lowest_memory-offload", "lowest_memory", offload, steps=6, warm=2, timeout_s=100,
                    note="bf16 head, 2 packs x 3"),
            Variant("six_gb", "six_gb", log, steps=6, warm=2, timeout_s=100),
            Variant("7b-six_gb-offload-ws", "six_gb", offload, steps=6, warm=2, arch="llama-2-7b", timeout_s=80,
                    env={"CUBLAS_WORKSPACE_CONFIG": ":4096:1", "CUBLASLT_WORKSPACE_SIZE": "1024"},
                    note="call 1's 7b-six_gb-offload (5.078 GiB) with 4 MiB cuBLAS / 1 MiB cuBLASLt workspaces"),
        ]
        if smoke:
            for v in rows:
                v.steps, v.warm, v.max_length, v.timeout_s, v.arch = 2, 1, 128, 400, ""
        return rows
    if name in ("i25h", "i25h-smoke"):  # run 11 call 3: compile_layers with packs padded to a multiple of 8 (call 1:
        # each new length residue recompiled, ~50 s each), long enough for a steady window; the 7B with small cuBLAS
        # workspaces; fastest beside them for the ratio
        smoke = name.endswith("smoke")
        off, on = ["validation_share=0"], ["validation_share=0", "compile_layers=true"]
        logs = {"TORCH_LOGS": "recompiles,graph_breaks", **({"MEMTUNE_COMPILE_BACKEND": "eager"} if smoke else {})}
        rows = [
            Variant("fastest-compile", "fastest", on, steps=30, warm=10, timeout_s=200, env=logs),
            Variant("fastest", "fastest", off, steps=20, warm=5, timeout_s=60),
            Variant("7b-six_gb-offload-ws", "six_gb", ["logging_steps=1", "validation_share=0",
                                                       "offload_activations=true"], steps=6, warm=2,
                    arch="llama-2-7b", timeout_s=80,
                    env={"CUBLAS_WORKSPACE_CONFIG": ":4096:1", "CUBLASLT_WORKSPACE_SIZE": "1024"},
                    note="call 1's 7b-six_gb-offload (5.078 GiB) with 4 MiB cuBLAS / 1 MiB cuBLASLt workspaces"),
            Variant("lowest_memory-compile", "lowest_memory", on, steps=14, warm=6, timeout_s=150, env=logs),
        ]
        if smoke:
            for v in rows:
                v.steps, v.warm, v.arch, v.max_length, v.timeout_s = 3, 1, "", 128, 400
        return rows
    if name == "call2":  # the new presets side by side with the chapter's script; levers alone
        return [
            Variant("chapter-script", steps=5, warm=2, timeout_s=170, note="the chapter's script as written"),
            Variant("fastest", "fastest", steps=25, timeout_s=120),
            Variant("lowest_memory", "lowest_memory", steps=20, timeout_s=140),
        ]
    if name.startswith("families-"):  # issue 20: each family with the presets the issue measured (few steps)
        arch = name.split("-", 1)[1]
        presets = {"gemma-2-9b": ("fastest", "lowest_memory", "chapter"), "phi-3-mini": ("chapter", "fastest", "lowest_memory"),
                   "qwen3-8b": ("lowest_memory",), "llama-3.1-8b": ("lowest_memory",),
                   "llama-3.2-3b": ("fastest", "lowest_memory"), "tiny-llama": ("fastest", "lowest_memory")}
        if arch not in presets:  # issue 41's families: every preset, few steps, no held-out eval
            return [Variant(p, p, ["validation_share=0"], steps=4, warm=1, timeout_s=110)
                    for p in ("fastest", "lowest_memory", "chapter")]
        return [Variant(p, p, steps=6, warm=2, timeout_s=120) for p in presets[arch]]
    raise SystemExit(f"unknown plan {name}")


if __name__ == "__main__":  # python -m bench.product_plans verdict OUT: moe4's checks on OUT/results.json
    import json
    import sys

    out = Path(sys.argv[2])
    print("\n".join(grouped_verdict(json.loads((out / "results.json").read_text()), out / "runs")))
