"""The run panel's reward chart (issue 44): a preference run's reward accuracy and margin, read from its `metrics`
events, drawn in a chart of their own and said in the result; an SFT run's panel is as before (no reward chart, the
same loss chart). Real runs of the demo model, shown as the page shows an earlier run: from its events.jsonl."""

import types
from pathlib import Path

import gradio as gr
import pytest

from core.jobs.manager import JobManager
from core.jobs.view import job_view
from ui import live, render


def panel_for(run_dir) -> tuple[live.LivePanel, object]:
    """The run panel's components (the page's kinds) over a manager showing `run_dir`, as a reloaded page sees it."""
    manager = JobManager()
    job = manager.load_run(run_dir)
    assert job is not None
    parts = {name: gr.HTML() for name in ("gauge", "progress", "log", "result")}
    panel = live.LivePanel(**parts, plot=gr.LinePlot(x="step", y="loss", color="series"), download=gr.File(),
                           start=gr.Button(), stop=gr.Button(), state=gr.State(), app=types.SimpleNamespace(
                               manager=manager), reward_plot=gr.LinePlot(x="step", y="value", color="series"))
    return panel, job


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory, demo_model_path):
    from core.config.settings import demo_config
    from core.train.recipe import run_training

    cfg = demo_config(stage="dpo", max_steps=2, logging_steps=1, output_dir=str(tmp_path_factory.mktemp("dpo")))
    result = run_training(cfg)
    assert result.status == "completed", result.message
    return Path(result.run_dir)


def test_a_dpo_run_draws_its_reward_accuracy_and_margin(dpo_run):
    from core.jobs.view import REWARD_FIELDS
    from core.train.rewards import GRPO_NAMES, NAMES

    # the page reads every reward figure the engine writes: the preference stages', GRPO's, and GRPO's answer length
    # as a share of its maximum (core/train/callbacks.py)
    assert set(REWARD_FIELDS) == set(NAMES.values()) | set(GRPO_NAMES.values()) | {"completion_share"}
    panel, job = panel_for(dpo_run)
    v = job_view(job)
    logged = [e for e in job.events if e["kind"] == "metrics"]
    assert [s for s, _ in v.rewards] == [e["step"] for e in logged] == [1, 2]
    out = live.live_update(panel, {})
    chart = out[panel.reward_plot]
    assert chart["visible"] is True
    frame = chart["value"]
    accuracy = frame[frame.series == "reward accuracy"]
    margin = frame[frame.series == "reward margin"]
    assert accuracy.step.tolist() == margin.step.tolist() == [1, 2]
    assert accuracy.value.tolist() == [e["reward_accuracy"] for e in logged]
    assert margin.value.tolist() == [e["reward_margin"] for e in logged]
    # the loss chart keeps the loss alone
    assert set(out[panel.plot]["value"].series) == {"training"}
    # the result says the last logged step's reward accuracy, first -> last, and the best with its step
    result = out[panel.result]
    first, last = logged[0]["reward_accuracy"], logged[-1]["reward_accuracy"]
    assert "Reward accuracy" in result and f"{100 * first:.0f}% &rarr; <b>{100 * last:.0f}%</b>" in result
    assert f'data-value="{last:.6g}"' in result
    again = live.live_update(panel, out[panel.state])
    assert panel.reward_plot not in again  # nothing new: not re-sent
    pt = live.live_update(panel, {}, "pt")  # the page's language: the series and the result's words
    assert set(pt[panel.reward_plot]["value"].series) == {"acurácia da recompensa", "margem da recompensa"}
    assert "Acurácia da recompensa" in pt[panel.result]
    assert f"{100 * last:.0f} %" in live.live_update(panel, {}, "fr")[panel.result]


def test_an_sft_runs_panel_is_as_before(finished_run):
    panel, job = panel_for(finished_run.result.run_dir)
    v = job_view(job)
    assert v.losses and v.rewards == []
    out = live.live_update(panel, {})
    assert out[panel.reward_plot]["visible"] == live.OUT_OF_SIGHT  # out of sight, still in the page
    assert out[panel.plot]["value"].equals(live.loss_frame(v.losses, v.eval_losses))
    assert "Reward" not in out[panel.result] and render.reward_rows(v.rewards) == []


def test_history_and_compare_say_a_preference_runs_reward_accuracy(dpo_run, finished_run):
    """History's detail of a DPO run says its reward accuracy (summary.json's preference), Compare lists its final
    one beside an SFT run's "-"; two SFT runs' figures are as before (no reward row)."""
    import json

    from core.runs.history import FIGURES, PREFERENCE_FIGURES, compare_runs, load_run
    from ui.validation import compare_html

    pref = json.loads((dpo_run / "summary.json").read_text())["preference"]
    detail = render.run_detail_html(load_run(dpo_run), "en")
    assert "Reward accuracy" in detail and 'id="mt-history-reward-accuracy"' in detail
    assert f'data-value="{pref["final_reward_accuracy"]:.6g}"' in detail
    assert "Reward" not in render.run_detail_html(load_run(finished_run.result.run_dir), "en")
    mixed = compare_runs([dpo_run, finished_run.result.run_dir])
    assert dict(mixed.figures)["final_reward_accuracy"] == [pref["final_reward_accuracy"], None]
    row = compare_html(mixed, "fr")
    row = row[row.index('data-figure="final_reward_accuracy"'):].split("</tr>")[0]
    assert "Précision finale de la récompense" in row and f"{100 * pref['final_reward_accuracy']:.0f} %" in row
    sft = compare_runs([finished_run.result.run_dir, finished_run.result.run_dir])
    assert [k for k, _ in sft.figures] == [k for k in FIGURES if k not in PREFERENCE_FIGURES]
