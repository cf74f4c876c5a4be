"""Held-out pairs evaluated (issue 44, "seeing it learn"): a preference stage splits its pairs as SFT splits rows
(validation_share held out with the run's seed, or validation_data read as pairs) and TRL's own trainer evaluates
them as its eval_dataset. The tiny demo model, no mocks: the eval's loss and reward metrics reach the run log, the
eval events (the live reward chart's validation series), summary.json and History's detail; the held-out pairs never
reach the trainer's training rows.
"""

import json
import math
import random
from pathlib import Path

import pytest
from transformers import TrainerCallback

from core.config.settings import DEMO_DATA, demo_config
from core.data.pairs import check_pairs, plan_pairs, split_pairs
from core.data.read import DataError
from core.demo import preference_rows
from core.jobs.view import _Fold
from core.train.recipe import run_training


def _keys(events):
    return [e.get("key") for e in events if e["kind"] == "log"]


def _write(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


class Seen(TrainerCallback):
    """The prompts (token ids, as TRL tokenized them) of the rows the trainer trains on and of those it evaluates."""

    def __init__(self):
        self.train, self.eval = [], []

    def on_train_begin(self, args, state, control, train_dataloader=None, **kw):
        self.train = [tuple(p) for p in train_dataloader.dataset["prompt_ids"]]

    def on_evaluate(self, args, state, control, eval_dataloader=None, **kw):
        self.eval = [tuple(p) for p in eval_dataloader.dataset["prompt_ids"]]


def test_dpo_evaluates_the_held_out_share_and_never_trains_on_it(tmp_path, demo_tokenizer):
    seen, events = Seen(), []
    rows = preference_rows()[:20]  # 20 of the demo's pairs: a few seconds on 2 cores
    cfg = demo_config(stage="dpo", dataset=_write(tmp_path / "pairs.jsonl", rows), validation_share=0.25,
                      max_steps=2, logging_steps=1, eval_steps=2, eval_samples=1, eval_max_new_tokens=4,
                      output_dir=str(tmp_path / "runs"))
    result = run_training(cfg, events.append, callbacks=[seen])
    assert result.status == "completed", result.message
    # 5 of the 20 pairs held out with the run's seed, as SFT holds out rows; those never train
    held = sorted(random.Random(cfg.seed).sample(range(20), 5))
    held_ids = {tuple(demo_tokenizer(rows[i]["prompt"])["input_ids"]) for i in held}
    assert len(seen.train) == 15 and len(seen.eval) == 5 and len(set(seen.train) | set(seen.eval)) == 20
    assert set(seen.eval) == held_ids and not held_ids & set(seen.train)
    s = result.summary
    assert s["validation"]["mode"] == "share" and s["validation"]["held_out_rows"] == 5
    assert s["validation"]["plan"]["train_rows"] == 5 and s["data"]["rows_in_split"] == s["data"]["train_rows"] == 15
    # TRL's eval: before training (the policy is the reference: loss log 2, no pair preferred yet) and at the end
    assert [step for step, _ in s["eval"]["losses"]] == [0, 2] and math.isclose(s["eval"]["baseline"], math.log(2),
                                                                                  rel_tol=1e-4)
    pref = s["preference"]
    assert [e["step"] for e in pref["eval_steps"]] == [0, 2] and pref["baseline_eval_reward_accuracy"] == 0.0
    assert pref["final_eval_reward_accuracy"] == pref["eval_steps"][-1]["reward_accuracy"]
    assert pref["final_eval_reward_margin"] == pref["eval_steps"][-1]["reward_margin"]
    assert pref["final_reward_accuracy"] is not None  # the training steps' rewards, as before
    saved = json.loads((Path(result.run_dir) / "summary.json").read_text())
    assert saved["preference"]["eval_steps"] == pref["eval_steps"] and saved["eval"]["final_step"] == 2
    # the log: what was held out, the validation pairs' plan, each eval's loss and rewards; no "not evaluated" line
    keys = _keys(events)
    assert "log.val_share" in keys and "log.val_pairs" in keys and "log.pairs_no_validation" not in keys
    assert keys.count("log.eval_baseline") == 1 and keys.count("log.eval") == 1
    assert keys.count("log.pref.eval_rewards") == 2 and keys.count("log.answer") == 2
    line = next(e["message"] for e in events if e.get("key") == "log.pref.eval_rewards")
    assert line.startswith("validation rewards: accuracy 0%")
    # the eval events carry the rewards; the page's fold of them is the chart's validation series
    evals = [e for e in events if e["kind"] == "eval"]
    assert [e["reward_accuracy"] for e in evals] == [e["reward_accuracy"] for e in pref["eval_steps"]]
    fold = _Fold()
    fold.add(events)
    view = fold.result(False, False, False)
    assert [step for step, _ in view.eval_rewards] == [0, 2] and len(view.rewards) == 2
    # Compare lists the final validation reward accuracy beside the training one
    from core.runs.history import compare_runs

    figures = dict(compare_runs([result.run_dir, result.run_dir]).figures)
    assert figures["final_eval_reward_accuracy"] == [pref["final_eval_reward_accuracy"]] * 2


def test_orpo_evaluates_a_validation_file_of_pairs(tmp_path):
    rows = preference_rows()
    train = _write(tmp_path / "train.jsonl", rows[:6])
    val = _write(tmp_path / "val.jsonl", rows[4:8])  # two of them train too: dropped from training, as SFT does
    events = []
    cfg = demo_config(stage="orpo", dataset=train, validation_data=val, max_steps=2, eval_steps=1, eval_samples=0,
                      keep_best=True, output_dir=str(tmp_path / "runs"))
    result = run_training(cfg, events.append)
    assert result.status == "completed", result.message
    s = result.summary
    assert s["validation"]["mode"] == "separate" and s["validation"]["validation_rows"] == 4
    assert s["validation"]["train_part_rows"] == 4 and s["data"]["train_rows"] == 4
    said = [e["message"] for e in events if e["kind"] == "log" and e["message"].startswith("Validation: 4 rows of")]
    assert len(said) == 1 and "2 of the 6 training rows were validation rows too" in said[0]
    evals = [e for e in events if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 1, 2] and all("reward_accuracy" in e for e in evals)
    assert s["preference"]["final_eval_reward_accuracy"] == evals[-1]["reward_accuracy"]
    assert _keys(events).count("log.pref.eval_rewards") == 3
    # keep_best reads the pairs' eval loss (as an SFT run's): the adapter is the best checkpoint's
    ev = s["eval"]
    assert ev["best"] == min(e["eval_loss"] for e in evals[1:]) and ev["adapter_step"] == ev["best_step"] > 0
    assert ev["best_checkpoint"].endswith(f"checkpoint-{ev['best_step']}")


def test_kto_holds_out_both_answers_of_a_pair_and_evaluates_them(tmp_path, demo_tokenizer):
    data = _write(tmp_path / "pairs.jsonl", preference_rows()[:20])
    cfg = demo_config(stage="kto", dataset=data, validation_share=0.2, max_steps=1, eval_steps=1, eval_samples=1,
                      eval_max_new_tokens=2, output_dir=str(tmp_path / "runs"))
    raw, fmt = check_pairs(cfg)
    plan = plan_pairs(cfg, demo_tokenizer, raw, fmt, split_pairs(cfg, raw, fmt))
    assert plan.n_source == 32 and plan.validation.n_source == 8 and plan.evaluates
    assert sum(r["label"] for r in plan.validation.rows) == 4  # each held-out pair's two answers
    assert not {r["prompt"] for r in plan.validation.rows} & {r["prompt"] for r in plan.rows}
    assert plan.validation_dict()["plan"]["rows_in_split"] == 8 and plan.validation_dict()["held_out_rows"] == 4
    samples = plan.validation.prompt_samples(demo_tokenizer, 3)  # the desirable answers are the references
    assert len(samples) == 3 and all(s["reference"] in {r["completion"] for r in plan.validation.rows if r["label"]}
                                     for s in samples)
    events = []
    result = run_training(cfg, events.append)
    assert result.status == "completed", result.message
    evals = [e for e in events if e["kind"] == "eval"]
    assert len(evals) == 2 and all(math.isfinite(e["eval_loss"]) and "reward_margin" in e for e in evals)
    pref = result.summary["preference"]
    assert pref["final_eval_reward_accuracy"] is None and len(pref["eval_steps"]) == 2  # KTO logs no accuracy


def test_validation_pairs_are_refused_or_skipped_as_sft_rows_are(tmp_path, demo_tokenizer):
    from core.data.validation import split

    sft_rows = _write(tmp_path / "sft.jsonl", [{"instruction": "hi", "response": "salut"}])
    cfg = demo_config(stage="dpo", validation_data=sft_rows)
    raw, fmt = check_pairs(cfg)
    with pytest.raises(DataError) as err:  # read as this stage's pairs, refused by name with the columns found
        split_pairs(cfg, raw, fmt)
    assert sft_rows in str(err.value) and "instruction, response" in str(err.value)
    # a share that leaves no pair to train: refused with the fix (SFT's split alike)
    one = _write(tmp_path / "one.jsonl", preference_rows()[:1])
    tiny = demo_config(stage="dpo", dataset=one, validation_share=0.5)
    raw, fmt = check_pairs(tiny)
    with pytest.raises(DataError, match="holds out every row.*Lower validation_share"):
        split_pairs(tiny, raw, fmt)
    with pytest.raises(DataError, match="holds out every row"):
        split(demo_config(validation_share=0.5), raw, fmt)
    # the default share on the demo's 100 pairs: every pair trains, said (as for SFT's 100 rows), no eval
    default = demo_config(stage="dpo")
    raw, fmt = check_pairs(default)
    plan = plan_pairs(default, demo_tokenizer, raw, fmt, split_pairs(default, raw, fmt))
    assert not plan.evaluates and plan.n_train == 100 and plan.validation_dict()["mode"] == "off"
    assert [line.key for _, line in plan.log_lines()].count("log.val_small") == 1
    # validation pairs that all drop (the prompt alone fills max_length): a warning, no eval
    long = _write(tmp_path / "long.jsonl", [{"prompt": "word " * 80, "chosen": "a", "rejected": "b"}])
    cut = demo_config(stage="dpo", validation_data=long)
    raw, fmt = check_pairs(cut)
    plan = plan_pairs(cut, demo_tokenizer, raw, fmt, split_pairs(cut, raw, fmt))
    assert not plan.evaluates and ("warning", "log.val_none_fit") in [(lv, s.key) for lv, s in plan.log_lines()]


def test_the_reward_chart_and_results_show_the_validation_accuracy():
    from ui.live import reward_frame
    from ui.render import reward_rows

    rewards = [(1, {"reward_accuracy": 0.4, "reward_margin": 0.1}), (2, {"reward_accuracy": 0.6, "reward_margin": 0.2})]
    evals = [(0, {"reward_accuracy": 0.0, "reward_margin": 0.0}), (2, {"reward_accuracy": 0.7, "reward_margin": 0.3})]
    frame = reward_frame(rewards, "en", evals)
    val = frame[frame["series"] == "validation reward accuracy"]
    assert list(val["step"]) == [0, 2] and list(val["value"]) == [0.0, 0.7]
    assert len(frame) == 6 and len(reward_frame(rewards, "en")) == 4  # a run without an eval: as before
    assert "validação" in reward_frame(rewards, "pt", evals)["series"].iloc[-1]
    (label, text), = reward_rows(evals, "en", "x", "result.eval_reward_accuracy")
    assert label == "Validation reward accuracy" and "0% &rarr; <b>70%</b>" in text


def test_the_preview_of_a_preference_stage_accounts_for_the_held_out_pairs():
    from ui.data import preview

    html = preview(demo_config(stage="dpo", validation_share=0.2).to_dict())
    assert "Validation: 20 of 100 rows held out" in html and "80 rows go to the plan below" in html
    assert "Preference data (dpo): 80 rows" in html and "Validation pairs (dpo): 20 rows" in html
    assert "20 evaluated at max_length 64" in html
    held = demo_config(stage="dpo", validation_share=0.2).to_dict()
    assert "Pares de validação (dpo): 20 linhas" in preview(held, "pt")
    off = preview(demo_config(stage="kto").to_dict())  # the default share on 100 pairs: every pair trains, said
    assert "Validation off: every row trains" in off and "200 rows" in off and "Validation pairs" not in off
    sft_file = preview(demo_config(stage="dpo", validation_data=str(DEMO_DATA)).to_dict())  # SFT rows, not pairs: said
    assert str(DEMO_DATA) in sft_file and "prompt/chosen/rejected" in sft_file
