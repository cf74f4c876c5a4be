"""The GPU plans of issue 42 (bench/product_plans.py lean1, compile2) are runnable as written: every row's preset
and --set are what `python -m core.train` accepts on a CUDA machine (the settings' own parsing and checks), rows are
named once, and the compile rows that must share a cache share one."""

import pytest

from bench.product_plans import plan
from core.checks import validate
from core.config.presets import apply_preset, names
from core.config.settings import Hardware, TrainConfig, parse_overrides

GPU = Hardware(cuda=True, bf16=True, bitsandbytes=True)


@pytest.mark.parametrize("name", ["lean1", "lean1smoke", "compile2", "compile2smoke", "dpo1", "dpo1smoke", "grpo2",
                                  "grpo2smoke"])
def test_every_row_is_a_setting_the_cli_accepts(name, tmp_path):
    rows = plan(name)
    assert len({v.name for v in rows}) == len(rows)
    data = tmp_path / "d.jsonl"
    data.write_text('{"instruction": "a", "response": "b"}\n', encoding="utf-8")
    for v in rows:
        if v.script:
            continue
        assert v.preset in names(), v.name
        changes = parse_overrides(v.sets)
        cfg = apply_preset(TrainConfig(model="m", dataset=str(data), max_length=v.max_length), v.preset, GPU)
        cfg = cfg.replace(**changes)
        for k, value in changes.items():
            assert getattr(cfg, k) == value, (v.name, k)
        named = [p for p in validate(cfg, GPU) if p.field in changes]
        assert not named, (v.name, named)


def test_lean1_rows_are_the_issue_sized_ones():
    rows = plan("lean1")
    runs = [v for v in rows if v.preset]
    assert all(12 <= v.steps <= 16 for v in runs)
    assert rows[0].name == "chapter-script" and any(v.peer for v in rows)  # the yardstick and the peer, same call
    assert {v.preset for v in runs} == {"lowest_memory", "six_gb"}


def test_compile2s_cold_and_warm_rows_share_one_cache_folder_of_their_own():
    rows = {v.name: v for v in plan("compile2")}
    folders = {v.env.get("MEMTUNE_COMPILE_CACHE") for v in rows.values() if "compile_layers=true" in v.sets}
    assert len(folders) == 1 and None not in folders
    assert "MEMTUNE_COMPILE_CACHE" not in rows["fastest"].env
    assert [n for n in rows if n.endswith("-cold")] == ["fastest-compile-cold", "lowest_memory-compile-cold"]


def test_a_compile_rows_seconds_split_into_tracing_and_the_backend():
    from bench.product import compile_split

    assert compile_split(None) == {}
    summary = {"graphs": 3, "cache": {"seconds": 52.1, "loaded": 7, "compiled": 0, "phases": {
        "_compile.compile_inner": 40.0, "OutputGraph.call_user_compiler": 12.5, "bytecode_tracing": 20.0}}}
    got = compile_split(summary)
    assert (got["compile_s"], got["compile_loaded"], got["compile_compiled"]) == (52.1, 7, 0)
    assert (got["capture_s"], got["backend_s"], got["tracing_s"]) == (40.0, 12.5, 27.5)


def test_a_grpo_rows_sampling_share_is_its_steady_steps_sampling_over_the_median_step():
    from bench.product import sampling_share

    events = [{"kind": "metrics", "step": s, "sampling_s": x} for s, x in ((1, 30.0), (2, 10.0), (3, 12.0), (4, 14.0))]
    assert sampling_share(events, warm=1, steady_step_s=20.0) == {"sampling_s_median": 12.0, "sampling_share": 0.6}
    assert sampling_share([{"kind": "metrics", "step": 3, "loss": 1.0}], warm=1, steady_step_s=20.0) == {}
    assert sampling_share(events, warm=1, steady_step_s=None) == {}
def test_grpo2_runs_grpo_after_sft_on_the_qwen_1_5b_shape_within_a_6_gib_card(tmp_path):
    from bench.archs import HUB_IDS, parameter_count
    from bench.product import command

    sft, grpo = plan("grpo2")
    assert (sft.sets, grpo.sets) and "stage=grpo" not in " ".join(sft.sets)
    assert {"stage=grpo", "num_generations=4", "max_completion_length=256"} <= set(grpo.sets)
    assert sft.arch == grpo.arch == "qwen2.5-1.5b-instruct" and HUB_IDS[grpo.arch] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert sft.card_gib == grpo.card_gib == 6.0
    assert abs(parameter_count(grpo.arch) / 1e9 - 1.54) < 0.01  # the model card's 1.54B (tied embeddings)
    cmd = command(grpo, tmp_path / "model", tmp_path / "d.jsonl", tmp_path / "runs" / grpo.name, smoke=False)
    assert cmd[1:6] == ["-m", "bench.capped", "--card-gib", "6", "--"] and "--preset" in cmd
    assert all(v.card_gib == 0 for v in plan("grpo2smoke"))  # no cap on the CPU


def test_a_capped_run_leaves_the_cuda_context_outside_the_allocators_share():
    from bench.capped import allocator_fraction

    gib = 2**30
    assert allocator_fraction(6 * gib, 80 * gib, gib) == pytest.approx(5 / 80)
    assert allocator_fraction(100 * gib, 80 * gib, gib) == 1.0
    with pytest.raises(ValueError):
        allocator_fraction(gib, 80 * gib, 2 * gib)
