"""Presets: what they set, that they leave the user's choices alone, that the checklist still works item by item
on top of each, and that every preset trains end to end on the CPU with the demo model."""

import dataclasses

import pytest

from core.config import checklist
from core.checks import validate
from core.config.settings import Hardware, TrainConfig, demo_config
from core.config.presets import CHAPTER, PRESETS, apply_preset, matching, overrides

GPU = Hardware(cuda=True, bf16=True, bitsandbytes=True, liger=True)
CPU = Hardware(cuda=False, bf16=True, bitsandbytes=True)
FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}


def test_the_presets_exist_with_a_one_line_description():
    assert list(PRESETS) == ["chapter", "lowest_memory", "fastest", "six_gb"]
    for name, preset in PRESETS.items():
        assert preset["description"] and "\n" not in preset["description"], name
        assert set(preset["overrides"]) <= FIELDS, name


def test_chapter_preset_is_the_default_config_exactly():
    assert apply_preset(TrainConfig(), "chapter") == TrainConfig()
    assert {k: getattr(TrainConfig(), k) for k in CHAPTER} == CHAPTER
    assert matching(TrainConfig()) == "chapter"


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_validate_and_keep_the_users_choices(name):
    user = TrainConfig(model="Qwen/Qwen2.5-7B", dataset="my.jsonl", learning_rate=1e-4, max_length=1024,
                       num_train_epochs=3.0, lora_r=32, lora_alpha=64, seed=7)
    cfg = apply_preset(user, name)
    assert validate(cfg, GPU) == []
    for field in ("model", "dataset", "learning_rate", "max_length", "num_train_epochs", "lora_r", "lora_alpha",
                  "seed"):
        assert getattr(cfg, field) == getattr(user, field), field
    assert matching(cfg) == name
    assert TrainConfig.from_yaml(cfg.to_yaml()) == cfg


@pytest.mark.parametrize("stage", ["dpo", "orpo", "kto"])
@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_validates_for_a_preference_stage(name, stage):
    """TRL's preference trainers pad pairs: a preset gives them its levers without packing, whether the stage came
    first (the page, a config file) or with the preset (the CLI's --preset P --set stage=S)."""
    from core.estimate.predict import fit_preset

    first = apply_preset(TrainConfig(stage=stage), name)
    assert validate(first, GPU) == [] and not first.packing
    assert matching(first) == name
    with_set = fit_preset(TrainConfig(), name, GPU, fixed={"stage": stage}).cfg
    assert validate(with_set, GPU) == [] and not with_set.packing
    assert apply_preset(TrainConfig(), name).packing == overrides(name).get("packing", False)  # SFT packs as before


def test_switching_presets_does_not_leak_levers():
    cfg = apply_preset(apply_preset(TrainConfig(), "lowest_memory"), "fastest")
    assert cfg == apply_preset(TrainConfig(), "fastest")
    assert apply_preset(cfg, "chapter") == TrainConfig()


def test_lean_presets_use_the_measured_levers():
    low, fast = overrides("lowest_memory"), overrides("fastest")
    assert low["upcast_to_fp32"] is False and low["offload_embeddings"] is True and low["packing"] is True
    assert low["gradient_checkpointing"] is True and low["lora_dropout"] == 0.0
    assert fast["upcast_to_fp32"] is False and fast["packing"] is True and fast["per_device_train_batch_size"] > 1


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(KeyError, match="lowest_memory"):
        apply_preset(TrainConfig(), "smallest")


def test_cuda_only_levers_are_left_off_on_a_cpu_machine():
    for name in PRESETS:
        cfg = apply_preset(demo_config(device="cpu"), name, CPU)
        assert cfg.use_liger_kernel is False
        assert validate(cfg, CPU) == [], name


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("item", [i.key for i in checklist.ITEMS])
def test_every_checklist_item_works_on_its_own_on_top_of_each_preset(name, item):
    cfg = apply_preset(TrainConfig(), name)
    governed = set(checklist.BY_KEY[item].fields)
    for on in (True, False, True):
        new = checklist.toggle(cfg, item, on)
        assert checklist.active(new)[item] is on, (name, item, on)
        assert validate(new, GPU) == [], (name, item, on)
        changed = {f for f in FIELDS if getattr(new, f) != getattr(cfg, f)}
        # batch and accumulation move together (the effective batch is kept); nothing else moves
        assert changed <= governed | {"per_device_train_batch_size", "gradient_accumulation_steps"}, changed
        cfg = new


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_trains_end_to_end_on_the_cpu(name, tmp_path, demo_model_path):
    """The code paths each preset turns on (4-bit + LoRA, packing, no upcast, embedding on the CPU, checkpointing
    on or off, paged 8-bit AdamW) run for real; liger is CUDA-only and dropped here by apply_preset(hw)."""
    from core.train.recipe import run_training

    cfg = apply_preset(demo_config(output_dir=str(tmp_path), run_name=name, device="cpu"), name, CPU)
    cfg = cfg.replace(max_steps=3, logging_steps=1, learning_rate=1e-2)
    events = []
    result = run_training(cfg, events.append)
    assert result.status == "completed", result.message
    losses = [e["loss"] for e in events if e["kind"] == "metrics"]
    assert len(losses) == 3 and all(loss == loss and loss > 0 for loss in losses)
    assert result.summary["train_tokens"] > 0


def test_fastest_keeps_its_24_gb_promise_for_the_model_in_hand():
    """Issue 20: Gemma-2-9B took 29 GiB with `fastest`'s fixed levers. The preset now asks the estimator for this
    model, takes fewer packs per micro-step (accumulating more) until it fits, and says what it changed; a model
    whose smallest setting cannot fit gets that setting and a note saying so; Llama-3.1-8B keeps the preset as is."""
    from core.estimate.predict import PRESET_MARGIN, fit_preset
    from core.estimate.predict import estimate

    llama = fit_preset(TrainConfig(model="meta-llama/Llama-3.1-8B"), "fastest")
    assert llama.key == "preset.fit.holds" and llama.cfg == apply_preset(TrainConfig(), "fastest")
    gemma = fit_preset(TrainConfig(model="google/gemma-2-9b"), "fastest")
    assert gemma.key == "preset.fit.changed"
    assert estimate(gemma.cfg).total_gib <= 24 * PRESET_MARGIN < estimate(
        apply_preset(TrainConfig(model="google/gemma-2-9b"), "fastest")).total_gib
    b = gemma.cfg
    assert b.per_device_train_batch_size < 8 and b.per_device_train_batch_size * b.gradient_accumulation_steps >= 8
    for lang in ("en", "pt", "fr"):
        assert "per_device_train_batch_size=" in gemma.note(lang) and "{" not in gemma.note(lang)
    huge = fit_preset(TrainConfig(model="meta-llama/Llama-3.1-70B"), "fastest")
    assert huge.key == "preset.fit.cannot" and huge.cfg.per_device_train_batch_size == 1
    assert huge.cfg.gradient_checkpointing and "70B" not in huge.note("en") and "GiB" in huge.note("en")
    assert fit_preset(TrainConfig(model="google/gemma-2-9b"), "lowest_memory").key is None  # no promise


def test_fastest_grows_the_micro_batch_of_a_small_model_on_a_gpu():
    """Issue 25: Llama-3.2-3B is launch-bound at 8 packs (9,810 tokens/s, GPU 27% busy, run 10; 16 packs: 18,661
    tokens/s within 21.2 GiB, run 7). `fastest` doubles its packs per micro-step while the estimate keeps the 24 GB
    promise, and says that each optimizer step then sees more packs; Llama-3.1-8B (22.4 GiB) keeps 8, Gemma-2-9B
    still shrinks to fit, and without CUDA nothing grows (a CPU is not launch-bound)."""
    from core.estimate.predict import GROW_MAX_TOKENS, PRESET_MARGIN, estimate, fit_preset

    small = fit_preset(TrainConfig(model="meta-llama/Llama-3.2-3B"), "fastest", GPU)
    assert small.key == "preset.fit.grown" and small.changes == {"per_device_train_batch_size": 16}
    assert small.cfg.gradient_accumulation_steps == 1 and not small.cfg.gradient_checkpointing
    assert estimate(small.cfg).total_gib <= 24 * PRESET_MARGIN < estimate(small.cfg.replace(
        per_device_train_batch_size=32)).total_gib  # the largest power of two that keeps the promise
    assert 32 * small.cfg.max_length <= GROW_MAX_TOKENS  # so it was the budget that stopped it, not the cap
    for lang, words in (("en", "16 packs instead of 8"), ("pt", "16 pacotes em vez de 8"),
                        ("fr", "16 paquets au lieu de 8")):
        note = small.note(lang)
        assert words in note and "per_device_train_batch_size=16" in note and "{" not in note, note
    assert fit_preset(TrainConfig(model="meta-llama/Llama-3.2-3B"), "fastest", CPU).cfg.per_device_train_batch_size == 8
    assert fit_preset(TrainConfig(model="meta-llama/Llama-3.2-3B"), "fastest").cfg == small.cfg  # hw unknown: as a GPU
    big = fit_preset(TrainConfig(model="meta-llama/Llama-3.1-8B"), "fastest", GPU)
    assert big.key == "preset.fit.holds" and big.cfg.per_device_train_batch_size == 8
    gemma = fit_preset(TrainConfig(model="google/gemma-2-9b"), "fastest", GPU)
    assert gemma.key == "preset.fit.changed" and gemma.cfg.per_device_train_batch_size < 8
    # A 1B grows to the cap (32 packs, 16k tokens per micro-step); at max_length 2048 the 3B's 8 packs are 16k
    # tokens already, and it shrinks instead
    tiny = fit_preset(TrainConfig(model="meta-llama/Llama-3.2-1B"), "fastest", GPU)
    assert tiny.cfg.per_device_train_batch_size * tiny.cfg.max_length == GROW_MAX_TOKENS
    long = fit_preset(TrainConfig(model="meta-llama/Llama-3.2-3B", max_length=2048), "fastest", GPU)
    assert long.key == "preset.fit.changed" and long.cfg.per_device_train_batch_size < 8


def test_grown_micro_batch_trades_accumulation_to_keep_the_packs_per_step():
    """Where the accumulation is above 1, growing divides it, so each optimizer step sees the same packs."""
    from core.estimate.predict import grown_candidates

    base = apply_preset(TrainConfig(model="meta-llama/Llama-3.2-3B"), "fastest", GPU).replace(
        gradient_accumulation_steps=4)
    shapes = [(c.per_device_train_batch_size, c.gradient_accumulation_steps) for c in grown_candidates(base)]
    assert shapes == [(32, 1), (16, 2)]  # largest first, never past GROW_MAX_TOKENS (64 x 512)
    assert grown_candidates(base.replace(max_length=2048)) == []



def test_a_preset_on_the_command_line_is_fitted_for_the_final_settings(capsys):
    """Issue 37: `--preset fastest --set model=X` fitted the preset for the default model (Llama-3.1-8B keeps 8 packs)
    and then swapped in X (Gemma-2-9B, 29 GiB at 8 packs). It is now fitted for X, and a value given with --set is
    never changed by the fit: the micro-batch is sized around it."""
    import yaml

    from core.estimate.predict import fit_preset
    from core.train.cli import main

    def dumped(*sets):
        assert main(["--preset", "fastest", *[a for s in sets for a in ("--set", s)], "--dump-config"]) == 0
        return TrainConfig.from_dict(yaml.safe_load(capsys.readouterr().out))

    gemma = dumped("model=google/gemma-2-9b")
    assert gemma == fit_preset(TrainConfig(model="google/gemma-2-9b"), "fastest").cfg
    assert gemma.per_device_train_batch_size < 8  # what the default model's fit would have kept
    kept = dumped("model=google/gemma-2-9b", "per_device_train_batch_size=6")
    assert kept.per_device_train_batch_size == 6 and kept.gradient_checkpointing  # the fit moved what was left


def test_every_preset_figure_a_user_reads_comes_from_one_measured_table():
    """Issue 37: the preset's description said ~13,000 tokens/s, 36x, 22.7 GiB (run 6) where README said 10,736, 35.5x,
    22.55 GiB (run 10). Descriptions now carry no figures; the page adds each preset's latest product-path row from
    assets/lever_facts.json (bench/presets_measured.json), and README's table cites the same numbers."""
    import json
    import re
    from pathlib import Path

    from core.i18n import t
    from ui.derive import preset_descriptions
    from ui.speed import preset_facts

    root = Path(__file__).resolve().parent.parent
    figure = re.compile(r"\d[\d.,]*(\s*(GiB|Gio|GB|tokens/s)|x\b)")
    for lang in ("en", "pt", "fr"):
        for name, preset in PRESETS.items():
            text = preset["description"] if lang == "en" else t(f"preset.{name}.description", lang)
            assert not figure.search(text.replace("24 GB", "").replace("24 Go", "").replace("6 GB", "")
                                     .replace("6 Go", "")), (lang, name, text)
    facts = preset_facts()
    assert facts == json.loads((root / "bench/presets_measured.json").read_text())["presets"]
    shown = preset_descriptions("en")
    readme = (root / "README.md").read_text(encoding="utf-8")
    for name, m in facts.items():
        assert f"{m['tokens_per_s']:,} tokens/s" in shown and f"{m['nvml_gib']:.2f} GiB" in shown, name
    fastest = facts["fastest"]
    row = next(line for line in readme.splitlines() if line.startswith("| memtune, preset `fastest`"))
    assert f"{fastest['nvml_gib']:.2f} GiB | {fastest['tokens_per_s']:,} | {fastest['vs_chapter']}x" in row, row
