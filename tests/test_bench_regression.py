"""bench/product.py's check against the last figures (issue 42): a preset row more than 5% slower than its last
same-call ratio to the chapter's script is flagged; warm rows, other trees and other settings are not compared."""

from bench.product import compared, rows_to_run, say_compared, with_warm_row
from bench.product_plans import Variant

LAST = {"fastest": {"tokens_per_s": 10736, "vs_chapter": 35.5, "section": "Run 10", "date": "2026-12-02"},
        "lowest_memory": {"tokens_per_s": 1359, "vs_chapter": None, "section": "Run 11", "date": "2026-12-02",
                          "gpu": "H200"}}


def row(name, preset="", tokens=0.0, sets=(), code="", **variant):
    return {"name": name, "steady_tokens_per_s": tokens,
            "variant": {"preset": preset, "sets": list(sets), "code": code, "arch": "", **variant}}


def test_a_preset_slower_than_its_last_ratio_is_flagged_and_a_faster_one_is_not():
    rows = [row("chapter-script", tokens=300.0), row("fastest", "fastest", 300.0 * 35.5 * 0.9, ["validation_share=0"]),
            row("fastest-again", "fastest", 300.0 * 35.5 * 0.97)]
    found = {c["row"]: c for c in compared(rows, LAST, "llama-3.1-8b")}
    assert found["fastest"]["slower"] and found["fastest"]["change"] == -0.1
    assert not found["fastest-again"]["slower"]
    assert "*** SLOWER: fastest:" in say_compared(list(found.values()))


def test_warm_rows_other_trees_and_other_settings_are_not_compared():
    rows = [row("chapter-script", tokens=300.0), row("fastest-discarded", "fastest", 100.0),
            row("fastest-fcbfe14", "fastest", 100.0, code=".bisect/fcbfe14"),
            row("fastest-ckpt", "fastest", 100.0, ["gradient_checkpointing=true"])]
    assert compared(rows, LAST, "llama-3.1-8b") == []
    assert compared([row("fastest", "fastest", 100.0)], LAST, "llama-3.2-3b") == []


def test_without_a_same_call_yardstick_tokens_per_s_are_compared_and_say_so():
    found = compared([row("lowest_memory", "lowest_memory", 1200.0)], LAST, "llama-3.1-8b", "NVIDIA H200")
    assert found[0]["slower"] and "no same-call yardstick" in found[0]["unit"]


def test_tokens_per_s_are_compared_only_on_the_card_of_the_last_figure_and_profiled_rows_never():
    """Run 21 ran on an H100: its rows were flagged -19% to -82% against the H200's figures by tokens/s alone, and a
    profiled row (the profiler slows its own step) as a preset row."""
    assert compared([row("lowest_memory", "lowest_memory", 1200.0)], LAST, "llama-3.1-8b",
                    "NVIDIA H100 80GB HBM3") == []
    rows = [row("chapter-script", tokens=300.0), row("prof-fastest", "fastest", 50.0, torch_steps="8-9"),
            row("prof-fastest-1", "fastest", 50.0, profile=True)]
    assert compared(rows, LAST, "llama-3.1-8b", "NVIDIA H100 80GB HBM3") == []
    # a same-call ratio needs no same card: the yardstick ran on this one
    found = compared([row("chapter-script", tokens=300.0), row("fastest", "fastest", 300.0 * 35.5)], LAST,
                     "llama-3.1-8b", "NVIDIA H100 80GB HBM3")
    assert [c["row"] for c in found] == ["fastest"] and not found[0]["slower"]


def test_the_first_preset_row_gets_a_discarded_warm_copy_once():
    plan = [Variant("chapter-script"), Variant("fastest", "fastest", ["validation_share=0"])]
    rows = with_warm_row(plan, smoke=False)
    assert [v.name for v in rows] == ["chapter-script", "fastest-discarded", "fastest"]
    assert rows[1].sets == ["validation_share=0"] and rows[1].steps < rows[2].steps
    assert with_warm_row(rows, smoke=False) == rows and with_warm_row(plan, smoke=True) == plan


def test_only_picks_the_rows_before_the_warm_row_copies_the_first_of_them():
    plan = [Variant("chapter-script"), Variant("fastest", "fastest"), Variant("lowest_memory", "lowest_memory")]
    rows = rows_to_run(plan, {"lowest_memory"}, warm=True, smoke=False)
    assert [v.name for v in rows] == ["lowest_memory-discarded", "lowest_memory"]
    assert [v.name for v in rows_to_run(plan, set(), warm=False, smoke=False)] == [v.name for v in plan]
