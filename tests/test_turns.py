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
    assert "2 assistant turns: 2 trained whole" in plan.describe()

    last = _plan(tmp_path, [{"messages": CHAT}], tokenizer, train_turns="last")
    assert "Hello there" not in _trained_text(last, tokenizer) and "Ann" in _trained_text(last, tokenizer)
    assert last.turns == {"trained": 1, "cut": 0, "dropped": 0}
    # the same tokens either way: only the labels differ
    assert list(last.input_ids[0]) == list(plan.input_ids[0])


def test_turn_accounting_says_what_max_length_cut_and_dropped(tmp_path, tokenizer):
    long_answer = " ".join(["word"] * 60)
    chat = CHAT[:2] + [{"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "More?"},
                       {"role": "assistant", "content": long_answer}]
    whole = _plan(tmp_path, [{"messages": chat}], tokenizer, max_length=1024)
    assert whole.turns == {"trained": 2, "cut": 0, "dropped": 0}
    n = len(whole.input_ids[0])
    cut = _plan(tmp_path, [{"messages": chat}], tokenizer, max_length=(n - 20) // 16 * 16)
    assert cut.n_train == 1 and cut.counts["kept"] == 0
    assert sum(cut.turns.values()) == 2 and cut.turns["cut"] >= 1  # a cut answer is counted, never silent
    assert f"{cut.turns['cut']} cut at max_length" in cut.describe()
    assert len(cut.input_ids[0]) <= cut.max_length


def test_single_turn_rows_train_exactly_as_before(tmp_path, tokenizer):
    """One assistant turn: labels are the completion only, as TRL's completion-only loss (no change from before)."""
    plan = _plan(tmp_path, [{"messages": CHAT[:3]}], tokenizer)
    labels = plan.labels[0]
    first = next(i for i, lab in enumerate(labels) if lab != -100)
    assert all(lab == -100 for lab in labels[:first]) and all(lab != -100 for lab in labels[first:])
    assert plan.turns == {"trained": 1, "cut": 0, "dropped": 0}
    assert "assistant turns" not in plan.describe()


def test_the_preview_counts_the_turns(tmp_path):
    from ui.data import preview

    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n", encoding="utf-8")
    html = preview(TrainConfig(model="memtune/demo-tiny-llama", dataset=str(path), dataset_split="train"), "pt")
    assert "2 turnos do assistente: 2 treinados inteiros, 0 cortados em max_length, 0 descartados" in html
