"""Multi-turn conversations: every assistant turn trains by default (each on its answer only), `train_turns: last`
trains the last one; the plan counts turns trained whole, cut at max_length and dropped."""

from __future__ import annotations

import json

import pytest

from core.config.settings import TrainConfig
from core.data.plan import plan_rows

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "Name?"},
        {"role": "assistant", "content": "Ann"}]


@pytest.fixture(params=["chat template", "no template"])
def tokenizer(request):
    from transformers import AutoTokenizer

    from core.demo import ensure_demo_model

    tok = AutoTokenizer.from_pretrained(ensure_demo_model())
    if request.param == "chat template":
        tok.chat_template = CHATML
    return tok


def _plan(tmp_path, rows, tokenizer, **changes):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = TrainConfig(dataset=str(path), dataset_split="train", **changes)
    return plan_rows(cfg, tokenizer)


def _trained_text(plan, tokenizer, i=0):
    ids, labels = plan.input_ids[i], plan.labels[i]
    return tokenizer.decode([int(t) for t, lab in zip(ids, labels) if lab != -100])


def test_every_assistant_turn_trains_by_default_and_last_turn_only_is_an_option(tmp_path, tokenizer):
    plan = _plan(tmp_path, [{"messages": CHAT}], tokenizer)
    trained = _trained_text(plan, tokenizer)
    assert "Hello there" in trained and "Ann" in trained
    for context in ("Be brief.", "Hi\n", "Name?"):  # system and user turns stay context
        assert context not in trained
    assert plan.turns == {"trained": 2, "cut": 0, "dropped": 0}
    assert plan.describe_turns() == "2 assistant turns: 2 trained whole, 0 cut at max_length, 0 dropped"

    last = _plan(tmp_path, [{"messages": CHAT}], tokenizer, train_turns="last")
    assert "Hello there" not in _trained_text(last, tokenizer) and "Ann" in _trained_text(last, tokenizer)
    assert last.turns == {"trained": 1, "cut": 0, "dropped": 0}
    # the same tokens either way: only the labels differ
    assert list(last.input_ids[0]) == list(plan.input_ids[0])


LONG = " ".join(["word"] * 60)
THREE = CHAT + [{"role": "user", "content": "More?"}, {"role": "assistant", "content": LONG}]


def test_a_turn_that_crosses_max_length_is_left_out_whole_and_the_earlier_turns_train(tmp_path, tokenizer):
    """The 3rd assistant turn crosses max_length: the row ends where the 2nd turn ends (both train whole), no token
    of the 3rd trains, and the plan, the log line and the preview say 2 trained, 1 dropped."""
    whole = _plan(tmp_path, [{"messages": THREE}], tokenizer, max_length=1024)
    assert whole.turns == {"trained": 3, "cut": 0, "dropped": 0} and whole.counts["kept"] == 1
    full_ids, full_labels = list(whole.input_ids[0]), list(whole.labels[0])
    cut = _plan(tmp_path, [{"messages": THREE}], tokenizer, max_length=len(full_ids) - 8)
    ids, labels = list(cut.input_ids[0]), list(cut.labels[0])
    assert cut.turns == {"trained": 2, "cut": 0, "dropped": 1}
    assert cut.counts["truncated"] == 1 and cut.n_train == 1
    # the row is the conversation up to the end of turn 2: far shorter than max_length, not cut where it falls
    assert len(ids) < len(full_ids) - 60 and ids == full_ids[:len(ids)] and labels == full_labels[:len(ids)]
    trained = _trained_text(cut, tokenizer)
    assert "Hello there" in trained and "Ann" in trained and "word" not in trained
    assert labels[-1] != -100  # it ends on the last trained token of turn 2
    assert cut.describe_turns() == "3 assistant turns: 2 trained whole, 0 cut at max_length, 1 dropped"
    assert cut.to_dict()["turns"] == cut.turns  # summary.json["data"] and the data event carry the same counts
    shown = cut.examples[0]
    assert shown["reason"] == "truncated" and "Ann" in shown["prompt"] and "word" not in shown["prompt"]
    assert "do not fit max_length" in shown["completion"]


def test_a_first_answer_too_long_for_max_length_is_cut_as_a_single_turn_row_and_said(tmp_path, tokenizer):
    """No turn fits whole: the row is its first exchange, cut at max_length as a single-turn row is (counted cut,
    never silent); the later turns are dropped."""
    chat = CHAT[:2] + [{"role": "assistant", "content": LONG}] + CHAT[3:]
    whole = _plan(tmp_path, [{"messages": chat}], tokenizer, max_length=1024)
    n = 128 if tokenizer.chat_template else 96  # past the first prompt + a quarter, short of the first answer's end
    cut = _plan(tmp_path, [{"messages": chat}], tokenizer, max_length=n)
    assert cut.turns == {"trained": 0, "cut": 1, "dropped": 1} and cut.counts["truncated"] == 1
    assert list(cut.input_ids[0]) == list(whole.input_ids[0][:n])
    assert "Ann" not in _trained_text(cut, tokenizer)


def test_single_turn_rows_are_cut_where_max_length_falls_as_before(tmp_path, tokenizer):
    """One assistant turn (and train_turns=last): the answer is cut at max_length, as TRL truncates."""
    one = _plan(tmp_path, [{"messages": CHAT[:2] + [{"role": "assistant", "content": LONG}]}], tokenizer,
                max_length=48)
    assert len(one.input_ids[0]) == 48 and one.turns == {"trained": 0, "cut": 1, "dropped": 0}
    last = _plan(tmp_path, [{"messages": THREE}], tokenizer, max_length=48, train_turns="last")
    assert len(last.input_ids[0]) == 48 and last.turns == {"trained": 0, "cut": 1, "dropped": 0}


def test_single_turn_rows_train_exactly_as_before(tmp_path, tokenizer):
    """One assistant turn: labels are the completion only, as TRL's completion-only loss (no change from before)."""
    plan = _plan(tmp_path, [{"messages": CHAT[:3]}], tokenizer)
    labels = plan.labels[0]
    first = next(i for i, lab in enumerate(labels) if lab != -100)
    assert all(lab == -100 for lab in labels[:first]) and all(lab != -100 for lab in labels[first:])
    assert plan.turns == {"trained": 1, "cut": 0, "dropped": 0}
    assert plan.describe_turns() is None


def test_the_preview_counts_the_turns(tmp_path):
    from ui.data import preview

    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n", encoding="utf-8")
    cfg = TrainConfig(model="memtune/demo-tiny-llama", dataset=str(path), dataset_split="train")
    html = preview(cfg.to_dict(), "pt")
    assert "2 turnos do assistente: 2 treinados inteiros, 0 cortados em max_length, 0 descartados" in html


def test_the_turn_and_data_log_lines_follow_the_page_language(tmp_path, tokenizer):
    """The engine logs the turn count and the row counts by key (English on the CLI); the page's log says them in
    French (the preview's words), English stays as written."""
    from ui.render import log_line

    plan = _plan(tmp_path, [{"messages": THREE}] * 2, tokenizer, max_length=len(
        _plan(tmp_path, [{"messages": THREE}], tokenizer, max_length=1024).input_ids[0]) - 8)
    from core.jobs.view import format_event
    from core.messages import words_of
    from core.runs.events import make_event

    turns, data = (format_event(make_event("log", level="info", **words_of(x)))
                   for x in (plan.describe_turns(), plan.describe()))
    assert log_line(turns, "en") == turns and turns.endswith("  6 assistant turns: 4 trained whole, 0 cut at "
                                                             "max_length, 2 dropped")
    assert log_line(turns, "fr")[8:] == ("  6 tours de l'assistant : 4 entraînés en entier, 0 coupés à "
                                         "max_length, 2 abandonnés")
    assert log_line(data, "fr").endswith(f", 2 s'entraînent à max_length {plan.max_length} : 0 gardées entières, "
                                         "2 avec la réponse coupée à max_length")
