"""Did it help? A run scores the held-out prompts before and after training (core/train/recipe.py with
core/scoring): the base model and, for a continued run, its parent adapter, then the new adapter; summary.json,
the log and the CLI say the verdict, a warning when the adapter scores lower. The demo has no held-out share, so
its own 100 prompts are scored: the n/100 the demo states. A preference run continued from History starts at its
stage's own learning rate, never the SFT run's, which made the demo's DPO adapter worse while its reward accuracy
rose."""

import json
from pathlib import Path

import pytest

from core.config.settings import HELDOUT_SCORERS, TrainConfig, config_problems, demo_config
from core.runs.history import DEMO_STAGE_LR, preference_config, schedule_note, stage_schedule
from core.scoring.scorers import SCORERS
from core.train.recipe import run_training

PARENT_LR = 8e-3  # the demo SFT run's own rate: what a DPO continuation inherited before it got the stage's own


def test_the_scorer_choices_are_the_scorers_and_off():
    assert HELDOUT_SCORERS == (*SCORERS, "off")


def test_scorer_options_that_are_no_json_object_are_a_problem_naming_the_field():
    for bad in ("[1, 2]", "{pattern", "3"):
        problems = config_problems(demo_config(heldout_options=bad))
        assert [p.field for p in problems] == ["heldout_options"], (bad, problems)
    assert config_problems(demo_config(heldout_scorer="numeric", heldout_options='{"abs_tol": 0.5}')) == []


def test_options_the_scorer_refuses_fail_the_run_before_the_model_loads(tmp_path):
    events = []
    cfg = demo_config(output_dir=str(tmp_path), heldout_scorer="regex", heldout_options='{"pattern": "("}')
    result = run_training(cfg, events.append)
    assert result.status == "failed" and result.error_type == "config", result.message
    assert "heldout_options" in result.message and "regular expression" in result.message
    assert "loading_model" not in {e.get("phase") for e in events}


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """The demo's SFT run as it ships (200 steps): its adapter answers the demo's 100 prompts exactly."""
    events = []
    result = run_training(demo_config(output_dir=str(tmp_path_factory.mktemp("heldout")), run_name="sft"),
                          events.append)
    assert result.status == "completed", result.message
    return result, events


def test_a_demo_sft_run_scores_base_and_adapter_on_the_demos_prompts(sft_run):
    result, events = sft_run
    held = json.loads((Path(result.run_dir) / "summary.json").read_text())["heldout"]
    assert (held["scorer"], held["rows"], held["source"], held["parent"]) == ("exact", 100, "demo", None)
    assert held["base"]["mean"] < 0.1 and held["adapter"]["mean"] >= 0.98, held
    assert held["verdict"]["verdict"] == "better" and not held["verdict"]["worse"]
    verdicts = [e for e in events if e["kind"] == "log" and e.get("key", "").startswith("score.verdict")]
    # the demo's own prompts train: its verdict never calls them held-out
    assert [(e["key"], e["level"]) for e in verdicts] == [("score.verdict.trained.better", "info")]
    assert "held-out" not in verdicts[0]["message"].lower()
    started = [e for e in events if e["kind"] == "log" and e.get("key", "").startswith("log.heldout.start")]
    assert [e["key"] for e in started] == ["log.heldout.start_trained"], started


def test_dpo_at_the_parents_rate_is_flagged_worse_than_its_parent(sft_run, tmp_path):
    parent, _ = sft_run
    events = []
    cfg = demo_config(output_dir=str(tmp_path), stage="dpo", init_adapter=parent.run_dir, max_steps=40,
                      learning_rate=PARENT_LR)
    result = run_training(cfg, events.append)
    assert result.status == "completed", result.message
    held = json.loads((Path(result.run_dir) / "summary.json").read_text())["heldout"]
    assert held["parent"]["mean"] >= 0.98 and held["adapter"]["mean"] < held["parent"]["mean"] - 0.02, held
    assert held["verdict"]["verdict"] == "worse_parent" and held["verdict"]["worse"]
    warned = [e for e in events if e["kind"] == "log" and e.get("key") == "score.verdict.trained.worse_parent"]
    assert len(warned) == 1 and warned[0]["level"] == "warning"
    assert "got worse than its parent" in warned[0]["message"]
    # the reward accuracy alone would have called it a success
    assert result.summary["preference"]["final_reward_accuracy"] >= 0.9


def test_a_continuation_from_history_gets_the_stages_learning_rate(sft_run):
    parent, _ = sft_run
    new = preference_config(parent.run_dir)
    assert new.stage == "dpo" and new.learning_rate == DEMO_STAGE_LR != PARENT_LR
    note = schedule_note(demo_config(), new)
    assert note is not None and note.key == "history.pref.schedule" and note.params["parent_lr"] == "0.008"


def test_another_models_continuation_takes_trls_default_for_the_stage():
    from trl import DPOConfig, GRPOConfig, KTOConfig
    from trl.experimental.orpo import ORPOConfig

    from core.runs.history import STAGE_SCHEDULE

    for stage, config in (("dpo", DPOConfig), ("kto", KTOConfig), ("orpo", ORPOConfig), ("grpo", GRPOConfig)):
        defaults = {f.name: f.default for f in config.__dataclass_fields__.values()}
        assert STAGE_SCHEDULE == (defaults["learning_rate"], defaults["lr_scheduler_type"])  # one default for all four
        assert stage_schedule(TrainConfig(), stage) == {"learning_rate": defaults["learning_rate"],
                                                        "lr_scheduler_type": defaults["lr_scheduler_type"]}
    assert stage_schedule(TrainConfig(), "sft") == {}  # SFT is never a continuation's stage


def test_kto_says_what_it_measures_and_never_nan():
    from core.train.callbacks import rewards_line
    from core.train.rewards import reward_metrics

    logs = {"loss": 0.5, "rewards/chosen": 0.012, "rewards/rejected": -0.008, "kl": 0.0004,
            "logps/chosen": -0.03, "logps/rejected": -13.6}
    said = rewards_line(reward_metrics(logs), logs)
    assert said["key"] == "log.pref.kto_rewards" and "nan" not in said["message"]
    assert "desirable 0.012" in said["message"] and "KL 0.000" in said["message"]
    only_desirable = {"loss": 0.5, "rewards/chosen": 0.01, "kl": float("nan"), "logps/chosen": -0.03}
    said = rewards_line(reward_metrics(only_desirable), only_desirable)  # a batch without undesirable rows
    assert "nan" not in said["message"] and "undesirable -" in said["message"]
    dpo = {"rewards/accuracies": 0.5, "rewards/margins": 0.1, "logps/chosen": -1.0, "logps/rejected": -2.0}
    assert rewards_line(reward_metrics(dpo), dpo)["key"] == "log.pref.rewards"  # pairs: their accuracy, as before


def test_orpo_prints_none_of_trls_warnings(tmp_path, capfd):
    import subprocess
    import sys

    code = ("from core.quiet import silence_loggers; silence_loggers(); import warnings; "
            "warnings.simplefilter('always'); import trl.experimental.orpo")
    err = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, check=True).stderr
    assert "TRLExperimentalWarning" not in err, err
    cfg = demo_config(output_dir=str(tmp_path), stage="orpo", max_steps=1, logging_steps=1)
    result = run_training(cfg)
    assert result.status == "completed", result.message
    captured = capfd.readouterr()
    assert "remove_unused_columns" not in captured.err + captured.out


def test_the_card_says_a_worse_adapter_in_the_pages_language_and_is_not_green():
    from core.jobs.view import JobView
    from core.scoring.heldout import judge
    from ui import render

    worse = judge(0.42, 0.0, 1.0, n=100)
    summary = {"steps": 40, "heldout": {"scorer": "exact", "rows": 100, "source": "demo", "base": {"mean": 0.0},
                                        "parent": {"mean": 1.0}, "adapter": {"mean": 0.42},
                                        "verdict": worse.to_dict()}}
    view = JobView(state="completed", adapter_dir="/r/a/adapter", run_dir="/r/a", summary=summary)
    card = render.result_html(view, "pt")
    assert "O adaptador ficou pior que o adaptador de origem" in card and 'data-verdict="worse_parent"' in card
    assert "mt-result-ok" not in card and "Pai" in card and "42%" in card
    better = {**summary["heldout"], "parent": None, "verdict": judge(1.0, 0.0, n=100).to_dict()}
    assert "mt-result-ok" in render.result_html(JobView(state="completed", adapter_dir="/r/a/adapter", run_dir="/r/a",
                                                        summary={**summary, "heldout": better}), "fr")
    on_train = render.heldout_rows({"heldout": {**better, "source": "train"}}, "en")
    assert "Scored on training rows" in on_train[0][1] and "Held-out" not in on_train[0][0]
    assert "held-out" not in on_train[0][1].lower(), on_train  # the verdict's sentence too
    on_demo = render.heldout_rows({"heldout": {**better, "source": "demo"}}, "en")  # the demo's prompts train
    assert "which it trained on" in on_demo[0][1] and on_demo[0][0].endswith("prompts it trained on"), on_demo
    held = render.heldout_rows({"heldout": {**better, "source": "validation"}}, "en")
    assert held[0][0].startswith("Did it help? Held-out") and "trained on" not in held[0][1], held


def test_a_held_out_score_that_fails_costs_the_run_nothing(tmp_path, monkeypatch):
    import core.train.heldout as heldout

    def broken(*args, **kw):
        raise RuntimeError("generate failed")

    monkeypatch.setattr(heldout, "score_start", broken)
    events = []
    result = run_training(demo_config(output_dir=str(tmp_path), max_steps=1), events.append)
    assert result.status == "completed" and "heldout" not in result.summary, result.message
    warned = [e for e in events if e["kind"] == "log" and e.get("key") == "log.heldout.failed"]
    assert len(warned) == 1 and warned[0]["level"] == "warning" and "generate failed" in warned[0]["message"]


def test_a_schema_file_is_refused_in_public_mode(public_mode, tmp_path):
    from core.scoring.scorers import ScorerError, bind

    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}', encoding="utf-8")
    with pytest.raises(ScorerError) as err:
        bind("json_schema", schema=str(schema))
    assert err.value.key == "score.err.public_schema_path"
    assert bind("json_schema", schema='{"type": "object"}')('{"a": 1}', "") == 1.0  # written out: fine


def test_scoring_off_is_accepted_before_loading():
    """"off" is one of the scorer's choices: the run's check before loading binds no scorer for it (it refused "off"
    as an unknown scorer), and a bad scorer is still refused by name."""
    from core.config.settings import ConfigError
    from core.train.data import heldout_scorer

    assert heldout_scorer(demo_config(heldout_scorer="off")) is None
    assert heldout_scorer(demo_config(heldout_rows=0, heldout_scorer="regex", heldout_options='{"pattern": "("}')) is None
    with pytest.raises(ConfigError) as caught:
        heldout_scorer(demo_config(heldout_scorer="regex", heldout_options='{"pattern": "("}'))
    assert caught.value.problems[0].field == "heldout_options"
