"""Did it help, on the page: History's Compare shows each run's held-out scores and a GRPO run's final reward, marks a
run whose adapter scored lower (the verdict's own words, in the page's language); the verdict never calls rows the
run trained on "held-out"; the held-out scorer's preview says what it accepts on three rows of the data."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from core.config.settings import demo_config
from core.files import write_marker
from core.i18n import LANGUAGES, said, t
from core.runs.history import compare_runs, final_reward, heldout_scores
from core.scoring.heldout import judge, verdict_key
from core.scoring.scorers import ScorerError, accepts
from ui.render import verdict_words
from ui.validation import compare_html, heldout_cell, sample_of, sample_tag, scorer_preview


def _part(mean: float) -> dict:
    return {"mean": mean, "n": 10, "scores": [], "answers": []}


def heldout(adapter: float, base: float, parent: float | None = None, source: str = "validation") -> dict:
    """summary.json's `heldout` as core/train/heldout.py writes it (the verdict judged as the engine judges it)."""
    verdict = judge(adapter, base, parent, scorer="exact", n=10, source=source)
    return {"scorer": "exact", "rows": 10, "source": source, "base": _part(base),
            "parent": _part(parent) if parent is not None else None, "adapter": _part(adapter),
            "verdict": verdict.to_dict()}


def run(tmp_path: Path, name: str, summary: dict, config: str = "model: m\n") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    write_marker(folder, "run")
    (folder / "config.yaml").write_text(config)
    (folder / "summary.json").write_text(json.dumps({"status": "completed", **summary}))
    return folder


def _text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


# --- the verdict on rows the run trained on ------------------------------------------------------------------------
@pytest.mark.parametrize("adapter,base,parent", [(0.9, 0.1, None), (0.5, 0.5, None), (0.9, 0.1, 0.5),
                                                  (0.5, 0.1, 0.5), (0.3, 0.1, 0.9), (0.1, 0.9, None)])
def test_a_verdict_on_training_rows_never_says_held_out(adapter, base, parent):
    for source in ("train", "demo"):
        verdict = judge(adapter, base, parent, scorer="exact", n=10, source=source)
        assert verdict.message.key.startswith("score.verdict.trained."), verdict.message.key
        assert "held-out" not in str(verdict.message).lower()
    held = judge(adapter, base, parent, scorer="exact", n=10, source="validation")
    assert not held.message.key.startswith("score.verdict.trained.")
    assert held.message.key.replace("score.verdict.", "score.verdict.trained.") == verdict.message.key


def test_an_older_summary_on_training_rows_is_said_without_held_out_in_every_language():
    # written before the trained twins: the key says held-out, the source says the rows trained
    old = {"key": "score.verdict.worse_base", "message": "old English",
           "params": {"scorer": {"key": "score.name.exact", "params": {}}, "adapter": 40.0, "base": 90.0, "n": 10,
                      "tolerance": 2.0}}
    assert verdict_key(old["key"], "train") == "score.verdict.trained.worse_base"
    assert verdict_key(old["key"], "validation") == old["key"]
    for lang in LANGUAGES:
        words = verdict_words(old, "demo", lang)
        assert words == said("score.verdict.trained.worse_base", old["params"], lang)
        assert words != said(old["key"], old["params"], lang), lang
    assert "held-out" not in verdict_words(old, "train", "en").lower()


# --- Compare ---------------------------------------------------------------------------------------------------------
def test_compare_reads_each_runs_heldout_scores_and_grpo_reward(tmp_path):
    sft = run(tmp_path, "sft", {"heldout": heldout(1.0, 0.0)})
    dpo = run(tmp_path, "dpo", {"heldout": heldout(0.42, 0.0, 1.0)})
    grpo = run(tmp_path, "grpo", {"grpo": {"first_reward": 0.4, "final_reward": 1.25, "best_reward": 1.3}})
    cmp = compare_runs([sft, dpo, grpo], is_running=lambda p: False)
    assert cmp.names == ["sft", "dpo", "grpo"]
    first, second, third = cmp.heldout
    assert (first["base"], first["parent"], first["adapter"], first["worse"]) == (0.0, None, 1.0, False)
    assert (second["parent"], second["adapter"], second["verdict"], second["worse"]) == (1.0, 0.42, "worse_parent",
                                                                                          True)
    assert third is None
    assert cmp.rewards == [None, None, 1.25]


def test_heldout_scores_and_final_reward_of_damaged_summaries():
    assert heldout_scores({}) is None
    assert heldout_scores({"heldout": {"adapter": {"mean": "x"}}}) is None
    assert heldout_scores({"heldout": "?"}) is None
    assert final_reward({"grpo": None}) is None and final_reward({"grpo": {"final_reward": True}}) is None
    assert final_reward({"grpo": {"final_reward": 0.5}}) == 0.5


@pytest.mark.parametrize("lang", ["en", "fr", "ja"])
def test_compare_marks_a_run_that_got_worse_with_its_verdict_in_the_pages_language(tmp_path, lang):
    better = run(tmp_path, "sft", {"heldout": heldout(1.0, 0.0)})
    worse = run(tmp_path, "dpo", {"heldout": heldout(0.42, 0.0, 1.0)})
    grpo = run(tmp_path, "grpo", {"grpo": {"final_reward": 1.25}})
    page = compare_html(compare_runs([better, worse, grpo], is_running=lambda p: False), lang)
    table = page[page.index('id="compare-heldout-table"'):]
    rows = dict(re.findall(r'<tr data-run="(\w+)" data-worse="(\d)">', table))
    assert rows == {"sft": "0", "dpo": "1", "grpo": "0"}
    verdict = heldout(0.42, 0.0, 1.0)["verdict"]
    words = said(verdict["key"], verdict["params"], lang)
    assert "data-worse=\"worse_parent\"" in table and _text(table).count(words) == 1
    assert t("history.compare.final_reward", lang) in table
    dpo_row = table[table.index('data-run="dpo"'):table.index('data-run="grpo"')]
    assert t("result.heldout.parent", lang) in _text(dpo_row) and words in _text(dpo_row)


def test_compare_shows_no_heldout_table_when_no_run_has_a_score(tmp_path):
    a, b = run(tmp_path, "a", {}), run(tmp_path, "b", {})
    assert "compare-heldout-table" not in compare_html(compare_runs([a, b], is_running=lambda p: False))


def test_the_heldout_column_says_where_training_rows_came_from():
    cell = heldout_cell(heldout_scores({"heldout": heldout(0.2, 0.9, source="train")}), "en")
    assert t("score.source.train", "en") in _text(cell)
    assert said("score.verdict.trained.worse_base", heldout(0.2, 0.9, source="train")["verdict"]["params"],
                "en") in _text(cell)


# --- the held-out scorer's preview -----------------------------------------------------------------------------------
def test_accepts_says_what_each_scorer_accepts():
    assert accepts("exact", " chat ").params == {"reference": "chat"}
    assert accepts("normalized", "Le Chat!").params == {"reference": "le chat"}
    assert accepts("regex", "chat", pattern="[a-z]+").params == {"pattern": "[a-z]+"}
    assert accepts("regex", "[0-9]{3}").params == {"pattern": "[0-9]{3}"}  # the row's reference is the pattern
    assert accepts("numeric", "The answer is 1,234.5", abs_tol=0.5).params == {"number": "1234.5", "tolerance": "0.5"}
    assert accepts("numeric", "3/4", rel_tol=0.1).params == {"number": "0.75", "tolerance": "0.075"}
    assert accepts("numeric", "none").key == "score.accepts.no_number"
    assert accepts("contains", "!!").key == "score.accepts.nothing"
    assert accepts("python", "x", function="/no/such/file.py:f").params == {"function": "/no/such/file.py:f"}
    with pytest.raises(ScorerError) as bad:
        accepts("regex", "x", pattern="[")
    assert bad.value.key == "score.err.bad_regex"


SAMPLE = {"source": "validation", "rows": [{"row": 1, "prompt": "What is 2+2? <b>", "reference": "4"},
                                           {"row": 2, "prompt": "Half of 3?", "reference": "1.5"},
                                           {"row": 3, "prompt": "Name a \"cat\"", "reference": "no number"}]}


def test_the_sample_travels_in_the_data_preview_and_back():
    page = "<div>the preview</div>" + sample_tag(SAMPLE)
    assert sample_of(page) == SAMPLE
    assert sample_of("<div>no preview</div>") is None and sample_of(None) is None and sample_tag(None) == ""


@pytest.mark.parametrize("lang", ["en", "de", "zh"])
def test_scorer_preview_shows_reference_and_what_is_accepted(lang):
    page = _text(scorer_preview(SAMPLE, "numeric", '{"abs_tol": 0.01}', lang))
    assert t("score.preview.title", lang, scorer=t("score.name.numeric", lang), n=3) in page
    assert said("score.accepts.numeric", {"number": "4", "tolerance": "0.01"}, lang) in page
    assert said("score.accepts.numeric", {"number": "1.5", "tolerance": "0.01"}, lang) in page
    assert said("score.accepts.no_number", {"reference": "no number"}, lang) in page
    exact = _text(scorer_preview(SAMPLE, "exact", "", lang))
    assert said("score.accepts.exact", {"reference": "1.5"}, lang) in exact
    regex = _text(scorer_preview(SAMPLE, "regex", '{"pattern": "[0-9.]+"}', lang))
    assert regex.count(said("score.accepts.regex", {"pattern": "[0-9.]+"}, lang)) == 3


def test_scorer_preview_on_training_rows_off_without_data_and_bad_options():
    trained = _text(scorer_preview({**SAMPLE, "source": "train"}, "exact", "", "en"))
    assert t("score.preview.title_trained", "en", scorer=t("score.name.exact", "en"), n=3) in trained
    assert "held-out" not in trained.lower()
    assert scorer_preview(SAMPLE, "off", "", "en") == ""
    assert t("score.preview.empty", "fr") in _text(scorer_preview(None, "exact", "", "fr"))
    assert "score-preview-error" not in scorer_preview(SAMPLE, "exact", "", "en")
    assert 'id="scorer-preview-error"' in scorer_preview(SAMPLE, "exact", "[1]", "en")
    bad = scorer_preview(SAMPLE, "regex", '{"pattern": "("}', "en")
    assert "mt-warn-text" in bad and "(" in _text(bad)


def test_the_preview_child_answers_three_validation_rows_with_their_references():
    from core.data.read import PREVIEW_LIMIT
    from core.demo import demo_rows
    from core.jobs.preview import answer

    found = answer(demo_config(validation_share=0.1).to_dict(), limit=PREVIEW_LIMIT)
    sample = found["heldout"]
    assert sample["source"] == "validation" and len(sample["rows"]) == 3
    answers = {r["response"] for r in demo_rows()}
    assert all(row["reference"] in answers for row in sample["rows"])  # the reference as scored: no EOS token
    assert sample == sample_of(sample_tag(sample))
    plain = answer(demo_config().to_dict(), limit=PREVIEW_LIMIT)["heldout"]
    assert plain["source"] == "demo" and [r["reference"] for r in plain["rows"]] == [
        r["response"] for r in demo_rows()[:3]]


def test_the_preview_shows_the_rows_the_runs_score_answers(tmp_path):
    """One choice of rows (core.infer.heldout_rows) for the run's held-out score and the data preview's scorer rows:
    the validation part, the demo's own prompts, else the training rows."""
    from core.data.read import PREVIEW_LIMIT
    from core.infer import heldout_rows
    from core.jobs.preview import SAMPLE_CHARS, SAMPLE_ROWS, answer
    from core.train.data import read_plan

    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_text("".join(json.dumps({"instruction": f"Say {w}.", "response": w}) + "\n"
                                 for w in ("one", "two", "three", "four")), encoding="utf-8")
    for cfg, source in ((demo_config(validation_share=0.1), "validation"), (demo_config(), "demo"),
                        (demo_config(dataset=str(rows_file)), "train")):
        shown = answer(cfg.to_dict(), limit=PREVIEW_LIMIT)["heldout"]
        plan, tokenizer, _, _ = read_plan(cfg, lambda event: None)
        scored, where = heldout_rows(plan, tokenizer, cfg.dataset, SAMPLE_ROWS)
        assert shown["source"] == where == source
        assert shown["rows"] == [{"row": r["row"], "prompt": r["prompt"][-SAMPLE_CHARS:],
                                  "reference": r["reference"][:SAMPLE_CHARS]} for r in scored]
        assert len(shown["rows"]) == SAMPLE_ROWS
    assert heldout_rows(plan, tokenizer, cfg.dataset, 0) == ([], "off")


def test_every_reader_takes_the_held_out_block_as_heldout_scores_reads_it(tmp_path):
    """History, Compare, the result card and the model card read summary.json's `heldout` through one parser: a block
    without a numeric adapter score is no score anywhere (the result card used to format its string and mark the
    run worse on a verdict History did not show), and a good block reads the same everywhere."""
    from core.runs.card import _heldout
    from core.runs.history import run_info
    from ui import render

    worse = heldout(0.42, 0.0, 1.0)
    broken = {**worse, "adapter": {"mean": "x"}}
    for block, shown in ((worse, True), (broken, False)):
        summary = {"status": "completed", "steps": 1, "heldout": block}
        info = run_info(run(tmp_path, f"r{shown}", summary, "model: m\n"))
        assert (info.heldout is not None, info.heldout_worse) == (shown, shown)
        assert bool(render.heldout_rows(summary, "en")) == shown and render.heldout_worse(summary) == shown
        assert bool(_heldout(summary)) == shown and (heldout_scores(summary) is not None) == shown
    assert "| this adapter | 42.0% |" in _heldout({"heldout": worse})
