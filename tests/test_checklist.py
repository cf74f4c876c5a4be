"""The chapter's memory checklist maps both ways onto the configuration, and the speed facts it prints per item.

The lever registry behind it (core/config/levers.py) is tests/test_registry.py's."""

import inspect
import json
from pathlib import Path

import pytest
import yaml

from core.config import checklist, levers
from core.checks import validate
from core.config.settings import TrainConfig, demo_config, Hardware

HW = Hardware(cuda=True, bf16=True, bitsandbytes=True)
ROOT = Path(__file__).resolve().parent.parent


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
