"""Run history over folders written by the real engine (core.train.recipe.run_training on the demo), plus damaged ones."""

import html
import json
import os
import shutil
import time

import pytest

from core.config.settings import DEMO_DATASET, TrainConfig
from core.runs.events import read_events
from core.i18n import STRINGS
from core.messages import say
from core.files import write_marker
from core.runs.history import (HistoryError, adapter_choices, delete_run, list_runs, load_run, resume_config,
                          run_info)
from core.train.recipe import run_training
from tests.helpers import checkpointed_run
from ui.fields import FIELD_NAMES, collect


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_model_path):
    """output_dir with one engine run (5 steps, checkpoint at 5) next to foreign and half-written folders."""
    out = tmp_path_factory.mktemp("runs")
    result = checkpointed_run(out, "five", max_steps=5, save_steps=5)
    (out / "foreign").mkdir()  # not a memtune run: no config.yaml
    (out / "foreign" / "notes.txt").write_text("hello")
    (out / "stray-file.txt").write_text("not a folder")
    broken = out / "broken"  # a crash while writing: garbage config, a cut-off events line, no summary
    broken.mkdir()
    write_marker(broken, "run")  # memtune marks a run folder first, before anything else is written
    (out / "lookalike").mkdir()  # not memtune's: a config.yaml is a common name
    (out / "lookalike" / "config.yaml").write_text("x\n")
    (broken / "config.yaml").write_text("model: [unclosed\n")
    (broken / "events.jsonl").write_text('{"kind": "run", "time": 1.0}\n{"kind": "step", "st')
    (broken / "summary.json").write_text("{not json")
    old = time.time() - 3600
    os.utime(broken / "events.jsonl", (old, old))
    return out, result


def test_history_lists_engine_runs_newest_first_and_skips_foreign_folders(runs):
    out, result = runs
    infos = list_runs(out)
    assert [r.name for r in infos] == ["five", "broken"]  # "five" started later than the broken one (t=1.0)
    five = infos[0]
    s = result.summary
    assert five.run_dir == result.run_dir and five.status == "completed"
    assert five.model == "memtune/demo-tiny-llama" and five.dataset == "memtune/demo"
    assert five.final_loss == s["final_loss"] and five.first_loss == s["first_loss"]
    assert five.steps == 5 and five.duration_s == s["runtime_s"]
    assert five.adapter_dir == result.adapter_dir
    assert five.checkpoint.endswith("checkpoint-5") and five.resumable
    assert five.peak_gib is None  # a CPU run has no GPU peak
    assert five.date.startswith(time.strftime("%Y-"))
    assert len(five.row()) == 11
    assert infos[1].status == "interrupted" and infos[1].model == "" and infos[1].adapter_dir is None
    assert adapter_choices(out) == [(f"five (memtune/demo-tiny-llama, loss {s['final_loss']:.3f})",
                                     result.adapter_dir)]
    assert list_runs(out / "does-not-exist") == []


def test_a_running_run_is_shown_from_its_events(runs, tmp_path):
    out, result = runs
    copy = tmp_path / "live"
    shutil.copytree(result.run_dir, copy)
    (copy / "summary.json").unlink()  # as while training: no summary yet
    info = run_info(copy, is_running=lambda p: p == copy)
    assert info.status == "running"
    events = read_events(copy / "events.jsonl")
    losses = [e["loss"] for e in events if e["kind"] == "metrics"]
    assert info.final_loss == losses[-1] and info.first_loss == losses[0] and info.steps == 5
    assert info.duration_s is not None and info.duration_s >= 0
    assert run_info(copy).status == "running"  # no job manager: recent events count as running
    assert run_info(copy, is_running=lambda p: False).status == "interrupted"


def test_load_run_gives_settings_loss_curve_and_summary(runs):
    out, result = runs
    detail = load_run(result.run_dir)
    assert isinstance(detail.config, TrainConfig) and detail.config.max_steps == 5
    assert detail.config_text.startswith("model: memtune/demo-tiny-llama")
    metrics = [e for e in read_events(f"{result.run_dir}/events.jsonl") if e["kind"] == "metrics"]
    assert detail.losses == [(e["step"], e["loss"]) for e in metrics]
    assert [s for s, _ in detail.losses] == [1, 2, 3, 4, 5]
    assert detail.summary["status"] == "completed"
    assert detail.checkpoints[-1].endswith("checkpoint-5")
    with pytest.raises(HistoryError, match="not a memtune run"):
        load_run(out / "foreign")
    broken = load_run(out / "broken")  # unreadable settings: shown as text, no crash
    assert broken.config is None and broken.losses == []


def test_resume_from_history_continues_the_step_count(runs, tmp_path):
    _, result = runs
    run_dir = tmp_path / "five"
    shutil.copytree(result.run_dir, run_dir)  # keep the module's run as it was
    cfg = resume_config(run_dir)
    assert cfg.resume_from == str(run_dir) and cfg.max_steps == 5
    events = []
    resumed = run_training(cfg.replace(max_steps=10), events.append)
    assert resumed.status == "completed", resumed.message
    assert resumed.run_dir == str(run_dir)  # same folder, continued
    assert [e["step"] for e in events if e["kind"] == "step"] == [6, 7, 8, 9, 10]
    info = list_runs(tmp_path)[0]
    assert info.steps == 10 and info.status == "completed"
    assert [s for s, _ in load_run(run_dir).losses] == list(range(1, 11))


def test_resume_needs_a_complete_checkpoint(runs, tmp_path):
    _, result = runs
    run_dir = tmp_path / "five"
    shutil.copytree(result.run_dir, run_dir)
    shutil.rmtree(run_dir / "checkpoints")
    with pytest.raises(HistoryError, match="no complete checkpoint"):
        resume_config(run_dir)
    assert not run_info(run_dir).resumable


def test_delete_refuses_anything_but_a_finished_run_inside_output_dir(runs, tmp_path):
    out, result = runs
    root = tmp_path / "runs"
    root.mkdir()
    run_dir = root / "five"
    shutil.copytree(result.run_dir, run_dir)
    elsewhere = tmp_path / "elsewhere"  # a memtune run, but outside output_dir
    shutil.copytree(result.run_dir, elsewhere)
    (root / "foreign").mkdir()
    nested = run_dir / "inner"
    shutil.copytree(result.run_dir, nested, ignore=shutil.ignore_patterns("checkpoints", "adapter"))

    with pytest.raises(HistoryError, match="not a run folder inside"):
        delete_run(elsewhere, root)
    with pytest.raises(HistoryError, match="not a run folder inside"):
        delete_run(root / ".." / "elsewhere", root)
    with pytest.raises(HistoryError, match="not a run folder inside"):
        delete_run(root, root)
    with pytest.raises(HistoryError, match="not a run folder inside"):
        delete_run(nested, root)
    with pytest.raises(HistoryError, match="not a memtune run"):
        delete_run(root / "foreign", root)
    (root / "link").symlink_to(elsewhere)
    with pytest.raises(HistoryError, match="link"):
        delete_run(root / "link", root)
    with pytest.raises(HistoryError, match="still running") as running:
        delete_run(run_dir, root, is_running=lambda p: True)
    # keyed, so the page says it in its language
    assert running.value.key == "history.refuse_running" and running.value.params == {"name": run_dir.name}
    assert "em execução" in say(running.value.key, running.value.params, "pt", lookup=lambda k, lg: STRINGS[lg].get(k))
    assert run_dir.is_dir() and elsewhere.is_dir() and (root / "foreign").is_dir()

    deleted = delete_run(run_dir, root, is_running=lambda p: False)
    assert deleted == run_dir.resolve() and not run_dir.exists()
    assert sorted(p.name for p in root.iterdir()) == ["foreign", "link"]  # no hidden leftovers
    assert elsewhere.is_dir()


def test_delete_without_a_job_manager_treats_fresh_events_as_running(runs, tmp_path):
    _, result = runs
    run_dir = tmp_path / "five"
    shutil.copytree(result.run_dir, run_dir)
    (run_dir / "summary.json").unlink()
    with pytest.raises(HistoryError, match="still running"):
        delete_run(run_dir, tmp_path)
    old = time.time() - 3600
    os.utime(run_dir / "events.jsonl", (old, old))  # a crashed run an hour ago
    delete_run(run_dir, tmp_path)
    assert not run_dir.exists()


def test_summary_of_a_failed_run(runs, tmp_path):
    out, result = runs
    run_dir = tmp_path / "failed"
    shutil.copytree(result.run_dir, run_dir, ignore=shutil.ignore_patterns("adapter", "checkpoints"))
    (run_dir / "summary.json").write_text(json.dumps({"status": "failed", "error_type": "oom",
                                                      "message": "The GPU ran out of memory."}))
    info = run_info(run_dir)
    assert info.status == "failed" and info.message.startswith("The GPU ran out")
    assert info.adapter_dir is None and info.final_loss is not None  # last logged loss, from the events


# --- History → Continue with preference tuning (issue 44): the handler, without a browser -----------------------------
@pytest.fixture(scope="module")
def page():
    from core.config.settings import demo_config
    from ui.layout import build_ui

    return build_ui(demo_config().to_dict())


def form_values(form, res) -> dict:
    """The widget values a handler's updates put into the form (every field must be there)."""
    return {n: (u["value"] if isinstance(u, dict) else u) for n in FIELD_NAMES for u in [res[form.fields[n]]]}


def form_config(form, res) -> TrainConfig:
    cfg, problems = collect(form_values(form, res))
    assert not problems, problems
    return cfg


def notice(res, h) -> str:
    return html.unescape(res[h.note])


def copy_with(result, dest, exclude=(), **settings):
    """A copy of the module's run with its config.yaml changed (the module's folder is never written)."""
    shutil.copytree(result.run_dir, dest, ignore=shutil.ignore_patterns(*exclude))
    TrainConfig.load(dest / "config.yaml").replace(**settings).save(dest / "config.yaml")
    return dest


def test_continue_with_preference_tuning_fills_the_form_for_dpo_from_the_runs_adapter(runs, page):
    from core.checks import validate
    from core.data.pairs import check_pairs
    from core.model.resolve import starting_values
    from ui import history

    out, result = runs
    form, h = page.memtune_form, page.memtune_history
    assert history.history_open(h, "en", result.run_dir)[h.prefer]["interactive"]
    res = history.on_history_prefer(form, h, "en", result.run_dir)
    cfg = form_config(form, res)
    assert cfg.stage == "dpo" and cfg.init_adapter == result.run_dir  # the run folder: stages.py reads its adapter/
    assert cfg.dataset == DEMO_DATASET and not cfg.packing and cfg.resume_from == ""
    assert cfg.run_name == "five-dpo" and cfg.output_dir == str(out)  # a new folder beside it, never the old one
    saved = load_run(result.run_dir).config.to_dict()
    # beta, loss: the dpo fields' defaults; the learning rate: the stage's own (tests/test_heldout_run.py)
    changed = {"stage", "init_adapter", "run_name", "beta", "dpo_loss_type", "learning_rate"}
    assert {k: v for k, v in cfg.to_dict().items() if k not in changed} == {k: v for k, v in saved.items()
                                                                              if k not in changed}
    said = notice(res, h)
    assert "Learning rate 0.008 → 0.0001" in said
    assert f"{result.adapter_dir}" in said and "five-dpo" in said and "no second copy" in said
    assert "base with the adapter disabled" in said and "demo's preference pairs" in said
    assert "mt-note-ok" in res[h.note] and res[h.main_tabs].selected == "tab-train"
    assert validate(cfg) == []  # what Start checks: a DPO run from the adapter, packing off, on this CPU
    raw, fmt = check_pairs(cfg)  # the demo's data for dpo: its prompt/chosen/rejected pairs
    assert fmt == "pairs" and {"prompt", "chosen", "rejected"} <= set(raw.column_names)
    start = starting_values(cfg)  # what the engine resolves first: the saved adapter's LoRA shape
    assert (start["lora_r"], start["lora_alpha"]) == (32, 64)
    # A 2-step DPO run from this config (log.pref.init_adapter, log.pref.reference_adapter) took 27 s on this 2-core
    # machine: tests/test_preference.py trains one from a run folder; this test stops at what Start validates.


def test_continue_keeps_the_runs_preset_for_dpo_and_asks_for_pairs_data(runs, page, tmp_path):
    from core.config.presets import matching, overrides
    from ui import history

    _, result = runs
    form, h = page.memtune_form, page.memtune_history
    data = tmp_path / "sft.jsonl"
    data.write_text('{"instruction": "hi", "output": "hello"}\n')
    mine = copy_with(result, tmp_path / "mine", **{**overrides("lowest_memory"), **dict(
        output_dir=str(tmp_path), run_name="mine", dataset=str(data), keep_best=True, lora_init="pissa")})
    assert TrainConfig.load(mine / "config.yaml").packing and matching(TrainConfig.load(mine / "config.yaml"))
    (tmp_path / "mine-dpo").mkdir()  # taken: the next free name
    res = history.on_history_prefer(form, h, "en", str(mine))
    cfg = form_config(form, res)
    assert cfg.stage == "dpo" and cfg.init_adapter == str(mine) and cfg.run_name == "mine-dpo-2"
    assert not cfg.packing and matching(cfg) == "lowest_memory"  # the preset's levers for dpo (presets.for_stage)
    assert cfg.use_liger_kernel and cfg.offload_activations  # the rest of the preset kept
    assert not cfg.keep_best and cfg.lora_init == "default"  # what a preference stage from init_adapter refuses
    assert cfg.dataset == str(data)  # kept, and the notice says it must change
    said = notice(res, h)
    assert "Change the dataset" in said and "prompt/chosen/rejected" in said and "mt-note-warn" in res[h.note]


@pytest.mark.filterwarnings("ignore:Pick a run", "ignore:.*saved no adapter", "ignore:.*already a dpo run",
                            "ignore:.*já é uma execução", "ignore:.*still running")
def test_continue_with_preference_tuning_refuses_by_name(runs, page, tmp_path, monkeypatch):
    from ui import history

    _, result = runs
    form, h = page.memtune_form, page.memtune_history

    def refused(run, lang="en"):
        res = history.on_history_prefer(form, h, lang, run)
        assert h.main_tabs not in res and not set(res) & set(form.inputs)  # the form stays as it was
        return notice(res, h)

    assert "Pick a run" in refused(None)
    bare = copy_with(result, tmp_path / "bare", exclude=("adapter",))  # failed before saving its adapter
    assert "bare saved no adapter" in refused(str(bare))
    dpo = copy_with(result, tmp_path / "pref", stage="dpo", init_adapter=result.run_dir)
    assert "pref is already a dpo run" in refused(str(dpo)) and "by hand" in refused(str(dpo))
    assert "pref já é uma execução dpo" in refused(str(dpo), "pt")
    monkeypatch.setattr(page.memtune_app.manager, "is_running", lambda p: True)
    assert "five is still running" in refused(result.run_dir)
    assert not history.history_open(h, "en", result.run_dir)[h.prefer]["interactive"]


@pytest.mark.filterwarnings("ignore:On this public server")
def test_public_mode_continues_only_the_visitors_own_run(runs, page, tmp_path, monkeypatch):
    from core.checks import validate
    from core.runs import public
    from ui import history

    _, result = runs
    form, h = page.memtune_form, page.memtune_history
    monkeypatch.chdir(tmp_path)  # as the app runs: its runs folder `runs`, which the form's output_dir names
    root = tmp_path / "runs"
    monkeypatch.setenv("MEMTUNE_PUBLIC", "1")
    monkeypatch.setenv("MEMTUNE_PUBLIC_RUNS", "runs")
    a, b = "a" * 22, "b" * 22
    who = {"id": a}
    monkeypatch.setattr(public, "_visitor_source", lambda: who["id"])
    mine = copy_with(result, root / f"visitor-{a}" / "five", output_dir=str(root / f"visitor-{a}"))
    res = history.on_history_prefer(form, h, "en", str(mine))
    values = form_values(form, res)
    assert values["init_adapter"] == "runs/five" and values["output_dir"] == "runs"  # no server path on the page
    said = notice(res, h)
    assert "runs/five/adapter" in said and str(root) not in said
    cfg = public.visitor_config(form_config(form, res))  # what Start reads back: the visitor's own run folder
    assert cfg.init_adapter == str(mine) and validate(cfg) == []
    who["id"] = b  # another visitor: neither the button nor a typed path reaches visitor a's adapter
    assert "public server" in notice(history.on_history_prefer(form, h, "en", str(mine)), h)
    typed = [p.field for p in validate(cfg)]
    assert "init_adapter" in typed
    back = collect({**values, "init_adapter": f"runs/../visitor-{a}/five"})[0]
    assert "init_adapter" in [p.field for p in validate(public.visitor_config(back))]
    who["id"] = a  # Resume shows `runs/five` in the form too: a Start from that form resumes the visitor's own run
    again = public.visitor_config(collect({**values, "init_adapter": "", "resume_from": "runs/five"})[0])
    assert again.resume_from == str(mine) and validate(again) == []
