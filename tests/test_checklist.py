"""The chapter's memory checklist maps both ways onto the configuration."""

import pytest

from core.config import checklist
from core.checks import validate
from core.config.settings import TrainConfig, demo_config, Hardware

HW = Hardware(cuda=True, bf16=True, bitsandbytes=True)


def test_seven_items_in_the_chapters_order():
    assert [i.key for i in checklist.ITEMS] == [
        "qlora", "gradient_checkpointing", "gradient_accumulation", "efficient_optimizer", "bf16",
        "short_max_length", "small_batches"]
    assert all(len(i.tradeoff) > 40 and i.fields for i in checklist.ITEMS)


def test_the_chapter_recipe_has_every_item_on():
    assert all(checklist.active(TrainConfig()).values())


@pytest.mark.parametrize("key", [i.key for i in checklist.ITEMS])
def test_toggle_off_and_on_round_trips(key):
    base = TrainConfig()
    off = checklist.toggle(base, key, False)
    assert checklist.active(off)[key] is False
    assert validate(off, HW) == []
    on = checklist.toggle(off, key, True)
    assert checklist.active(on)[key] is True
    assert on == base  # ticking back restores the chapter's settings


def test_batch_items_keep_the_effective_batch():
    c = checklist.toggle(TrainConfig(), "small_batches", False)
    assert c.per_device_train_batch_size == 8 and c.effective_batch_size == 16
    c = checklist.toggle(TrainConfig(), "gradient_accumulation", False)
    assert (c.per_device_train_batch_size, c.gradient_accumulation_steps) == (16, 1)


def test_missing_lists_what_is_off():
    c = demo_config()  # the demo turns checkpointing and the 8-bit optimizer off, and uses batch 8
    assert {i.key for i in checklist.missing(c)} == {"gradient_checkpointing", "gradient_accumulation",
                                                    "efficient_optimizer", "small_batches"}


# --- the lever registry (core/config/levers.py): declared once, on the field; everything else derived ------------
import importlib
import inspect
import json
import re
from dataclasses import fields
from pathlib import Path

import yaml

from core.config import levers, presets
from core.config.settings import PLACES, field_meta

ROOT = Path(__file__).resolve().parent.parent
FIELDS = {f.name for f in fields(TrainConfig)}
# Fields the estimator reads that are not levers: they define the adapter (what is trained), not how it is trained.
NOT_LEVERS = {"lora_r", "lora_target_modules"}


def _estimator_fields() -> set[str]:
    return set(re.findall(r"\bcfg\.([a-z_0-9]+)\b", (ROOT / "core/estimate/terms.py").read_text())) & FIELDS


def test_every_lever_field_is_declared_and_every_declaration_is_a_real_field():
    # What makes a field a lever, found in the code rather than in the registry: a preset sets it, a checklist item
    # governs it, or the estimator's memory terms read it.
    preset_set = {k for p in presets.PRESETS.values() for k in p["overrides"]}
    governed = {f for item in checklist.ITEMS for f in item.fields}
    found = (preset_set | governed | _estimator_fields()) - NOT_LEVERS
    assert found - set(levers.LEVERS) == set(), "declare these with lever=Lever(...) in core/config/settings.py"
    assert set(levers.LEVERS) <= FIELDS and governed <= FIELDS
    assert "quantize_output_head" in levers.LEVERS and "attention" in levers.LEVERS
    for name, lever in levers.LEVERS.items():
        assert lever.place in PLACES, name
        assert (lever.place == "checklist") == bool(lever.item), name
        if lever.item:
            assert lever.item in checklist.BY_KEY, f"{name}: no checklist item {lever.item!r}"
        assert lever.library, f"{name}: say where the engine hands it to the libraries"
        assert field_meta(name)["lever"] is lever
    for item in checklist.ITEMS:  # every item's fields are levers of that item or of its sibling batch item
        assert all(f in levers.LEVERS for f in item.fields), item.key
        assert not item.switch or levers.LEVERS[item.switch].item == item.key


def _resolve(ref: str):
    module, _, name = ref.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_declarations_name_the_code_that_uses_the_field():
    results = (ROOT / levers.RESULTS).read_text(encoding="utf-8")
    headings = [line.lstrip("#").strip() for line in results.splitlines() if line.startswith("#")]
    for name, lever in levers.LEVERS.items():
        for ref in lever.library + lever.term:
            source = inspect.getsource(_resolve(ref))
            assert re.search(rf"\b{name}\b", source), f"{name}: {ref} never reads it"
        if lever.measured:
            assert any(h.startswith(lever.measured) for h in headings), f"{name}: no section {lever.measured!r}"
    assert {levers.measured(i.key) for i in checklist.ITEMS} >= {"Levers, one at a time"}


def test_a_lever_without_an_estimator_term_changes_no_estimate():
    from core.estimate.predict import estimate

    base = TrainConfig(per_device_train_batch_size=2, gradient_accumulation_steps=4)
    free = [n for n, lv in levers.LEVERS.items() if not lv.term]
    assert free == ["bnb_4bit_quant_type", "gradient_accumulation_steps", "compile_layers"]
    for changed in (base.replace(bnb_4bit_quant_type="fp4"), base.replace(gradient_accumulation_steps=1),
                    base.replace(compile_layers=True)):  # no term until the GPU call measures one
        assert estimate(changed).nvml_peak == estimate(base).nvml_peak
    assert estimate(base.replace(quantize_output_head=True)).nvml_peak < estimate(base).nvml_peak  # a term that counts


def test_presets_fit_and_tutorial_lists_come_from_the_registry():
    from scripts import tutorial

    assert presets.CHAPTER == {n: getattr(TrainConfig(), n) for n, lv in levers.LEVERS.items() if lv.preset}
    assert all(set(p["overrides"]) <= set(presets.CHAPTER) for p in presets.PRESETS.values())
    assert presets.CUDA_ONLY == ("use_liger_kernel", "offload_activations") == levers.cuda_only()
    assert tutorial.CHECKLIST_KEYS == tuple(i.key for i in checklist.ITEMS)
    assert levers.fit_fields() == ("per_device_train_batch_size", "gradient_accumulation_steps", "max_length",
                                   "gradient_checkpointing", "optim")  # the order Fit's note lists them in


def test_fit_to_my_gpu_changes_only_the_fields_the_registry_gives_it():
    from core.estimate.predict import FIT_MARGIN, fit_floor, fit_to_gpu

    cfg = TrainConfig(upcast_to_fp32=False, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                      gradient_checkpointing=False, max_length=2048, optim="adamw_torch")
    floor = int(fit_floor(cfg).nvml_peak / (1 - FIT_MARGIN)) + 1  # just fits the smallest setting Fit may choose
    changed = set()
    for budget in (floor, 3 * floor):
        fitted, _ = fit_to_gpu(cfg, budget)
        changed |= {f for f in FIELDS if getattr(fitted, f) != getattr(cfg, f)}
    assert changed == set(levers.fit_fields())  # every one of them is used, and nothing else


def test_the_page_places_every_lever_once_from_the_registry():
    from ui import handlers, layout

    assert handlers.FIT_FIELDS == levers.fit_fields()
    assert layout.GOVERNS == {i.key: levers.beside(i.key) for i in checklist.ITEMS}
    assert layout.BEYOND == levers.placed("beyond")
    assert layout.BEYOND.index("quantize_output_head") == layout.BEYOND.index("offload_embeddings") + 1
    switches = [i.switch for i in checklist.ITEMS if i.switch]  # the box is the field; its widget sits in Advanced
    shown = [n for ns in layout.GOVERNS.values() for n in ns] + layout.BEYOND + levers.placed("training") + switches
    assert sorted(shown) == sorted(levers.LEVERS)  # each lever once


# --- the speed facts: a small committed table, written by bench's assemble step from the committed data ---------
def test_the_speed_table_is_what_assemble_writes_from_the_committed_measurements():
    from bench import assemble

    committed = json.loads((ROOT / "assets/lever_facts.json").read_text(encoding="utf-8"))
    written = assemble.committed_facts()
    assert json.loads(json.dumps(written)) == committed, "run python -m bench.assemble and commit the table"
    assert list(committed["checklist"]) == [i.key for i in checklist.ITEMS]
    raw = json.loads((ROOT / "bench/levers.json").read_text())["checklist"]
    pairs = yaml.safe_load((ROOT / "bench/lever_pairs.yaml").read_text())  # what levers.json was assembled from
    keys = {i.key for i in checklist.ITEMS}
    assert {p["key"] for p in pairs["checklist"]} | set(pairs["not_measured"]) | set(pairs["speed_not_a_cost"]) <= keys
    for key, entry in committed["checklist"].items():
        assert entry["section"] == (levers.measured(key) if entry["measurements"] else "")
        ratios = [m["speed_ratio"] for m in raw.get(key, {}).get("measurements", [])]
        assert all(m["speed_ratio"] in ratios for m in entry["measurements"])  # copied, never computed anew


def _facts():
    def m(ratio, on, off, **settings):
        s = dict(model="org/Llama-8B", max_length=512, per_device_train_batch_size=1, packing=True,
                 load_in_4bit=True, gradient_checkpointing=True, optim="paged_adamw_8bit", use_liger_kernel=False,
                 upcast_to_fp32=True, precision="bf16") | settings
        return {"speed_ratio": ratio, "on": on, "off": off, "settings": s}

    return {
        "gradient_checkpointing": {"section": "Levers, one at a time", "cost": "tokens_per_s", "measurements": [
            m(0.5, {"tokens_per_s": 100.0}, {"tokens_per_s": 200.0}, upcast_to_fp32=False, optim="adamw_torch"),
            m(0.75, {"tokens_per_s": 75.0}, {"tokens_per_s": 100.0}, packing=False, per_device_train_batch_size=8)]},
        "short_max_length": {"section": "Levers, one at a time", "cost": "step_time", "measurements": [
            m(0.25, {"tokens_per_s": 800.0, "s_per_step": 1.23}, {"tokens_per_s": 3200.0, "s_per_step": 1.22})]},
        "bf16": {"section": "", "cost": "tokens_per_s", "measurements": [], "not_measured": "every run was bf16"},
        "qlora": {"section": "", "cost": "tokens_per_s", "measurements": []},
    }


def test_speed_lines_print_the_table_in_the_pages_language():
    from ui import speed

    facts = _facts()
    ck = speed.speed_lines("gradient_checkpointing", None, "en", facts=facts)
    # Cited as a user can open it (bench/RESULTS.md and its section), never by the benchmark's row names.
    assert ck == [("\u221250% tokens/s with it (100 vs 200 without)", "max length 512, packing, 1 per micro-step, "
                   "Llama-8B — bench/RESULTS.md, section “Levers, one at a time”")]
    closer = speed.speed_lines("gradient_checkpointing", TrainConfig(per_device_train_batch_size=8), "fr", facts=facts)
    assert len(closer) == 2 and closer[1][0].startswith("\u221225") and "lot de 8" in closer[1][1]  # then the closest
    length = speed.speed_lines("short_max_length", TrainConfig(), "pt", facts=facts)
    assert length[0][0].startswith("1,23 s por passo do otimizador com o item contra 1,22 s")  # not "-75%"; pt commas
    assert speed.speed_lines("bf16", None, "en", facts=facts)[0] == ("Not measured: every benchmark run used bf16.",
                                                                     "source: bench/levers.json")
    assert speed.speed_lines("qlora", None, "en", facts=facts) == [("Not measured.", "source: bench/levers.json")]


def test_speed_lines_read_only_the_committed_table(tmp_path):
    from ui import speed

    assert speed.FACTS == ROOT / "assets" / "lever_facts.json" and speed.lever_facts()
    assert speed.CONTEXT == levers.speed_context()  # the page says where by these (max length, batch or packs, 4-bit)
    assert {"max_length", "per_device_train_batch_size", "packing", "load_in_4bit"} <= set(speed.CONTEXT)
    for entry in speed.lever_facts().values():
        assert all(set(m["settings"]) == {"model", *speed.CONTEXT} for m in entry["measurements"] if "settings" in m)
    assert set(speed.lever_facts()) == {i.key for i in checklist.ITEMS}
    assert "bench/" not in inspect.getsource(speed).replace("bench/RESULTS.md", "").replace("bench/levers.json", "") \
        .replace("bench.assemble", "")  # no path into bench's own data
    (tmp_path / "broken.json").write_text('{"checklist": 3}')
    assert speed.lever_facts.__wrapped__(tmp_path / "broken.json") == {}
