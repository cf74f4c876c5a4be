"""What `python -m bench.run` measures: each run as a Variant (architecture, recipe or preset, changes), in plans.

main = the 8B table (seed recipe, engine chapter preset, presets and variants); lever = one lever at a time,
cumulative; grid = issue 5's rows (8B, 14B, 70B; every micro-batch full); experiment and profile runs; followup = what
bench/RESULTS.md listed as not measured yet; dry = a tiny model on the CPU. bench/run.py runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Variant:
    name: str
    arch: str
    recipe: str  # "seed": bench/seed_recipe.py (the chapter as written) | "engine": core.model + core.train
    preset: str = "chapter"  # engine runs start from this preset (core/presets.py)
    changes: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides on top of the preset
    data: str = "dolly"  # dolly: lognormal lengths | full: every row longer than max_length
    steps: int = 5
    profile: bool = False
    grid: bool = False  # also a row of grid_measured.json (issue 5)
    group: str = "main"
    note: str = ""
    est_s: float = 30.0  # rough wall time, for the --budget-s guard
    varlen: bool = False  # experiment: bench/varlen.py attention per packed row (not an engine lever yet)


def gpu_plan() -> list[Variant]:
    """Everything, in the order of a full rerun (~9 min on an H200 + the 70B rows)."""
    return main_plan() + [v for v in grid_plan() if v.arch != "llama-3.1-8b"] + lever_plan() + \
        [v for v in grid_plan() if v.arch == "llama-3.1-8b"] + experiment_plan() + profile_plan()


def followup_plan() -> list[Variant]:
    """What the 2026-11-29 session could not measure cleanly (see bench/RESULTS.md, "Not measured yet")."""
    return [v for v in grid_plan() if v.arch == "llama-3.1-70b"] + experiment_plan() + lever_plan() + \
        [v for v in grid_plan() if v.arch == "llama-3.1-8b"] + profile_plan()


def main_plan() -> list[Variant]:
    v8 = "llama-3.1-8b"
    return [
        # --- 8B: the chapter as written, then the same settings through memtune's engine ---------------------
        Variant("seed", v8, "seed", steps=3, est_s=45,
                note="chapter script as written: batch 1 x 16, checkpointing, paged 8-bit, fp32 upcast"),
        Variant("engine-chapter", v8, "engine", "chapter", steps=3, est_s=38,
                note="memtune engine, chapter preset: same settings as the seed row"),
        # --- 8B: presets and their alternatives ----------------------------------------------------------------
        Variant("lowest_memory", v8, "engine", "lowest_memory", steps=4, group="preset", est_s=14),
        Variant("lowest_memory-1pack", v8, "engine", "lowest_memory",
                {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 6}, steps=4, group="preset",
                est_s=16),
        Variant("fastest", v8, "engine", "fastest", steps=8, group="preset", est_s=10),
        Variant("fastest-6packs", v8, "engine", "fastest", {"per_device_train_batch_size": 6}, steps=8,
                group="preset", est_s=10),
        Variant("fastest-16packs+ckpt", v8, "engine", "fastest", {"per_device_train_batch_size": 16,
                "gradient_checkpointing": True}, steps=6, group="preset",
                note="~3x the chapter's tokens per optimizer step", est_s=12),
    ]


def lever_plan() -> list[Variant]:
    """8B: one lever at a time, cumulative from the chapter's settings (accumulation 4 to keep runs short)."""
    v8 = "llama-3.1-8b"
    acc4 = {"gradient_accumulation_steps": 4}
    lean = {**acc4, "upcast_to_fp32": False}
    lean2 = {**lean, "lora_dropout": 0.0}
    lean3 = {**lean2, "offload_embeddings": True}
    lean4 = {**lean3, "expandable_segments": True}
    lean5 = {**lean4, "packing": True}
    lean6 = {**lean5, "use_liger_kernel": True}
    return [
        Variant("chapter-acc4", v8, "engine", "chapter", acc4, group="lever", steps=4, est_s=14),
        Variant("+no-upcast", v8, "engine", "chapter", lean, group="lever", steps=4, est_s=12),
        Variant("+dropout0", v8, "engine", "chapter", lean2, group="lever", steps=4, est_s=12),
        Variant("+embed-on-cpu", v8, "engine", "chapter", lean3, group="lever", steps=4, est_s=12),
        Variant("+expandable", v8, "engine", "chapter", lean4, group="lever", steps=4, est_s=12),
        Variant("+packing", v8, "engine", "chapter", lean5, group="lever", steps=4, est_s=12),
        Variant("+liger", v8, "engine", "chapter", lean6, group="lever", steps=4, est_s=12),
        Variant("+no-ckpt", v8, "engine", "chapter", {**lean6, "gradient_checkpointing": False}, group="lever",
                steps=4, est_s=10),
    ]


def experiment_plan() -> list[Variant]:
    v8 = "llama-3.1-8b"
    return [
        Variant("fastest+varlen", v8, "engine", "fastest", steps=8, group="experiment", varlen=True, est_s=10),
        Variant("fastest+expandable", v8, "engine", "fastest", {"expandable_segments": True}, steps=8,
                group="experiment", est_s=10),
        Variant("lowest_memory+varlen", v8, "engine", "lowest_memory", steps=4, group="experiment", varlen=True,
                est_s=14),
    ]


def profile_plan() -> list[Variant]:
    """Profiles last: the profiler's CUPTI buffers stay on the GPU and would inflate later NVML peaks."""
    v8 = "llama-3.1-8b"
    return [
        Variant("seed (profile)", v8, "seed", changes={"gradient_accumulation_steps": 3}, steps=2, profile=True,
                group="profile", est_s=12),
        Variant("engine-chapter (profile)", v8, "engine", "chapter", {"gradient_accumulation_steps": 3}, steps=2,
                profile=True, group="profile", est_s=12),
        Variant("lowest_memory (profile)", v8, "engine", "lowest_memory", steps=2, profile=True, group="profile",
                est_s=10),
        Variant("fastest (profile)", v8, "engine", "fastest", steps=3, profile=True, group="profile", est_s=8),
    ]


def grid_plan() -> list[Variant]:
    v8, v14, v70 = "llama-3.1-8b", "qwen2.5-14b", "llama-3.1-70b"
    g = dict(data="full", steps=2, grid=True, group="grid")
    acc2 = {"gradient_accumulation_steps": 2}
    return [
        Variant("g8-seed-512", v8, "seed", changes={**acc2}, est_s=8, **g),
        Variant("g8-seed-2048", v8, "seed", changes={**acc2, "max_length": 2048}, est_s=9, **g),
        Variant("g8-seed-256-b8-adamw", v8, "seed", changes={**acc2, "max_length": 256,
                "per_device_train_batch_size": 8, "optim": "adamw_torch"}, est_s=8, **g),
        Variant("g8-chapter-1024-b4-nockpt-paged32", v8, "engine", "chapter", {**acc2, "max_length": 1024,
                "per_device_train_batch_size": 4, "gradient_checkpointing": False, "optim": "paged_adamw_32bit"},
                est_s=9, **g),
        Variant("g8-low-512", v8, "engine", "lowest_memory", {**acc2}, est_s=8, **g),
        Variant("g8-low-2048", v8, "engine", "lowest_memory", {**acc2, "max_length": 2048}, est_s=9, **g),
        Variant("g8-fast-512", v8, "engine", "fastest", {**acc2}, est_s=8, **g),
        Variant("g8-fast-1024-b2-adamw", v8, "engine", "fastest", {**acc2, "max_length": 1024,
                "per_device_train_batch_size": 2, "optim": "adamw_torch"}, est_s=8, **g),
        Variant("g8-chapter-256-b8-nockpt-8bit", v8, "engine", "chapter", {**acc2, "max_length": 256,
                "per_device_train_batch_size": 8, "gradient_checkpointing": False, "optim": "adamw_8bit"},
                est_s=8, **g),
        Variant("g14-seed-512", v14, "seed", changes={**acc2}, est_s=20, **g),
        Variant("g14-low-512", v14, "engine", "lowest_memory", {**acc2}, est_s=20, **g),
        Variant("g70-seed-512", v70, "seed", changes={**acc2}, est_s=35, **g),
        Variant("g70-low-512", v70, "engine", "lowest_memory", {**acc2}, est_s=35, **g),
        Variant("g70-low-2048", v70, "engine", "lowest_memory", {**acc2, "max_length": 2048}, est_s=35, **g),
        Variant("g70-low-1024-b2-adamw", v70, "engine", "lowest_memory", {**acc2, "max_length": 1024,
                "per_device_train_batch_size": 2, "optim": "adamw_torch"}, est_s=35, **g),
    ]


def dry_plan() -> list[Variant]:
    """The same code paths on a tiny model on the CPU (liger and NVML need CUDA and are skipped there)."""
    t = "tiny-llama"
    return [
        Variant("seed", t, "seed", changes={"gradient_accumulation_steps": 2}, steps=2, profile=True),
        Variant("engine-chapter", t, "engine", "chapter", {"gradient_accumulation_steps": 2}, steps=2),
        Variant("lowest_memory", t, "engine", "lowest_memory", {"gradient_accumulation_steps": 2}, steps=2,
                profile=True),
        Variant("fastest", t, "engine", "fastest", steps=2, profile=True),
        Variant("fastest-bf16", t, "engine", "fastest", {"load_in_4bit": False}, steps=2),
        Variant("fastest+varlen", t, "engine", "fastest", steps=2, varlen=True),
        Variant("g-seed-256-b8-adamw", t, "seed", changes={"gradient_accumulation_steps": 2, "max_length": 256,
                "per_device_train_batch_size": 8, "optim": "adamw_torch"}, data="full", steps=2, grid=True),
        Variant("g-low-1024", t, "engine", "lowest_memory", {"gradient_accumulation_steps": 2,
                "max_length": 1024}, data="full", steps=2, grid=True),
    ]
