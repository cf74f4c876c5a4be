"""What each call of bench/product.py runs: one Variant per process, grouped in named plans (one per GPU call).

A plan is a record of what was measured in that call (bench/RESULTS.md names the plan next to each table), so old
plans stay as they were run.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Variant:
    name: str
    preset: str = ""  # "" = a script (the chapter's, or the peer's: `peer`); else core.train --preset
    sets: list[str] = field(default_factory=list)  # --set field=value on top of the preset
    steps: int = 20
    warm: int = 3  # steady window = steps after this many
    timeout_s: int = 180
    note: str = ""
    peer: bool = False  # Unsloth's script (bench/unsloth_script.py) with its own wheels (UNSLOTH_SITE)
    profile: bool = False  # the CLI run through bench/stepprof.py (step timings + cProfile of step 1)

    @property
    def script(self) -> bool:
        return not self.preset


def plan(name: str) -> list[Variant]:
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
    if name == "call2":  # the new presets side by side with the chapter's script; levers alone
        return [
            Variant("chapter-script", steps=5, warm=2, timeout_s=170, note="the chapter's script as written"),
            Variant("fastest", "fastest", steps=25, timeout_s=120),
            Variant("lowest_memory", "lowest_memory", steps=20, timeout_s=140),
        ]
    raise SystemExit(f"unknown plan {name}")
