"""Did it help? Every scorer passes a right answer and fails a wrong one; its refusals are keyed; the held-out score of
the demo model is deterministic, and the verdict says "worse" for an adapter whose answers got worse."""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import pytest

from core.i18n import STRINGS
from core.scoring import heldout
from core.scoring.scorers import SCORERS, Reward, ScorerError, bind, last_number
from tests.test_messages import _keys, _name, placeholders

ROOT = Path(__file__).resolve().parent.parent


# --- each scorer: right passes, wrong fails ---------------------------------------------------------------------------
@pytest.mark.parametrize("name, options, right, wrong, reference", [
    ("exact", {}, " chien\n", "Chien", "chien"),
    ("normalized", {}, "  CAFÉ,   au lait! ", "cafe au lait", "café au lait"),  # NFKC keeps the accent: é is not e
    ("normalized", {}, "ｆｕｌｌ　ｗｉｄｔｈ", "full widths", "full width"),  # NFKC folds full-width forms
    ("contains", {}, "The French word is: Chien.", "chienne", "chien"),  # a word, not a substring
    ("regex", {"pattern": r"<answer>\w+</answer>"}, "<answer>chat</answer>", "<answer>chat</answer> etc", ""),
    ("regex", {}, "2024-12-07", "07/12/2024", r"\d{4}-\d{2}-\d{2}"),  # the reference as the row's pattern
    ("numeric", {}, "So the total is 1,234.5 dollars", "1234.6", "#### 1234.5"),
    ("numeric", {}, "three quarters: 3/4", "0.7", "0.75"),
    ("numeric", {}, "-3", "3", "minus three is -3"),
    ("numeric", {"rel_tol": 0.01}, "1e3", "1020", "1005"),
    ("numeric", {"abs_tol": 0.5}, "x = 2.4", "x = 2.6", "2"),
    ("json_schema", {"schema": {"type": "object", "required": ["word"], "additionalProperties": False,
                                "properties": {"word": {"type": "string", "minLength": 1}, "n": {"type": "integer"}}}},
     'Here: ```json\n{"word": "chat", "n": 2}\n```', '{"word": "chat", "n": 2.5}', ""),
    ("json_schema", {"schema": '{"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}'},
     '["a", "b"]', '["a", "c"]', ""),
])
def test_each_scorer_passes_a_right_answer_and_fails_a_wrong_one(name, options, right, wrong, reference):
    score = bind(name, **options)
    assert score(right, reference) == 1.0
    assert score(wrong, reference) == 0.0


def test_every_registered_scorer_is_tested_and_labelled():
    tested = {"exact", "normalized", "contains", "regex", "numeric", "json_schema", "python"}
    assert set(SCORERS) == tested
    for scorer in SCORERS.values():
        assert all(scorer.label in STRINGS[lang] for lang in ("en", "pt", "fr")), scorer.name


def test_a_scorer_is_grpos_reward_function_as_trl_calls_it():
    reward = Reward("numeric", column="answer", abs_tol=0.01)
    completions = ["It is 42.", [{"role": "assistant", "content": "41"}], "no idea"]
    assert reward(prompts=["q"] * 3, completions=completions, completion_ids=[[1]] * 3, answer=["42", "42", "42"],
                  trainer_state=None) == [1.0, 0.0, 0.0]
    assert reward.__name__ == "numeric"  # what trl.trainer.utils.get_callable_name reads: rewards/numeric/mean
    again = pickle.loads(pickle.dumps(reward))
    assert again.__name__ == "numeric" and again(prompts=["q"], completions=["42.001"], answer=["42"]) == [1.0]
    fmt = Reward("regex", pattern=r"<b>\w+</b>")  # no reference column needed
    assert fmt(prompts=["q", "q"], completions=["<b>chat</b>", "chat"]) == [1.0, 0.0]


def test_numbers_are_read_as_people_write_them():
    assert [last_number(t) for t in ("1,234.5", "-3", "1e3", "3/4", "step 1-2", "none", "1/0")] == [
        1234.5, -3.0, 1000.0, 0.75, 2.0, None, None]


def test_a_users_function_scores_and_its_failures_are_named(tmp_path, monkeypatch):
    monkeypatch.delenv("MEMTUNE_PUBLIC", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    file = tmp_path / "my_scorer.py"
    file.write_text("def starts(prediction, reference):\n    return float(prediction.startswith(reference))\n"
                    "def boom(prediction, reference):\n    raise KeyError('oops')\n"
                    "def big(prediction, reference):\n    return 5\n"
                    "def text(prediction, reference):\n    return 'yes'\n")
    score = bind("python", function=f"{file}:starts")
    assert score("chien rouge", "chien") == 1.0 and score("le chien", "chien") == 0.0
    failures = {
        f"{file}:boom": ("score.err.function_raised", "KeyError"),
        f"{file}:big": ("score.err.function_value", "5"),
        f"{file}:text": ("score.err.function_value", "'yes'"),
    }
    for spec, (key, named) in failures.items():
        with pytest.raises(ScorerError) as caught:
            bind("python", function=spec)("chien", "chien")
        assert caught.value.key == key and named in str(caught.value)
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    refusals = {f"{broken}:f": "score.err.function_import", f"{file}:missing": "score.err.function_missing",
                f"{tmp_path / 'nowhere.py'}:f": "score.err.function_file", "my_scorer": "score.err.function_spec"}
    for spec, key in refusals.items():
        with pytest.raises(ScorerError) as caught:
            bind("python", function=spec)
        assert caught.value.key == key, spec
    assert "SyntaxError" in str(_raised(lambda: bind("python", function=f"{broken}:f")))


def test_a_users_function_is_refused_in_public_mode_before_its_file_is_read(tmp_path, monkeypatch):
    file = tmp_path / "side_effect.py"
    file.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\ndef f(p, r):\n    return 1.0\n")
    monkeypatch.setenv("MEMTUNE_PUBLIC", "1")
    with pytest.raises(ScorerError) as caught:
        bind("python", function=f"{file}:f")
    assert caught.value.key == "score.err.public_function" and not (tmp_path / "ran").exists()


def _raised(call) -> ScorerError:
    with pytest.raises(ScorerError) as caught:
        call()
    return caught.value


def test_bad_options_are_refused_with_a_key_naming_the_problem():
    bad_regex = _raised(lambda: bind("regex", pattern="(unclosed"))
    assert bad_regex.key == "score.err.bad_regex"
    assert bad_regex.params["problem"] == "missing ), unterminated subpattern"
    assert _raised(lambda: bind("regex")("x", "[")).key == "score.err.bad_regex"  # a row's pattern, when scored
    assert _raised(lambda: bind("nope")).key == "score.err.unknown"
    assert _raised(lambda: bind("exact", pattern="x")).key == "score.err.unknown_option"
    assert _raised(lambda: bind("numeric", abs_tol=-1)).key == "score.err.tolerance"
    assert _raised(lambda: bind("numeric")("42", "forty-two")).key == "score.err.no_reference_number"
    assert _raised(lambda: bind("json_schema", schema={"$ref": "#/x"})).params["keyword"] == "$ref"
    assert _raised(lambda: bind("json_schema", schema={"properties": {"a": {"type": "float"}}})).params == {
        "value": "float", "where": "#/properties/a", "items": list(heldout_types())}
    assert _raised(lambda: bind("json_schema", schema="/no/such/schema.json")).key == "score.err.schema_unreadable"


def heldout_types():
    from core.scoring.scorers import TYPES

    return TYPES


def test_every_scoring_message_has_its_key_in_every_language_with_its_placeholders():
    calls = []
    for path in sorted((ROOT / "core" / "scoring").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and _name(node.func) in ("ScorerError", "Said") and node.args:
                star = any(k.arg is None for k in node.keywords)
                kwargs = {k.arg for k in node.keywords if k.arg}
                calls.append((path.name, node.lineno, _keys(node.args[0]), kwargs, star))
    assert len(calls) >= 20
    wrong = []
    for where, line, keys, kwargs, star in calls:
        for key in keys or [None]:
            if key is None or any(key not in STRINGS[lang] for lang in ("en", "pt", "fr")):
                wrong.append((where, line, key, "missing"))
                continue
            if any(placeholders(STRINGS[lang][key]) != placeholders(STRINGS["en"][key]) for lang in ("pt", "fr")):
                wrong.append((where, line, key, "placeholders differ"))
            if not star and placeholders(STRINGS["en"][key]) != kwargs:
                wrong.append((where, line, key, sorted(placeholders(STRINGS["en"][key])), sorted(kwargs)))
    assert wrong == []


# --- the verdict ------------------------------------------------------------------------------------------------------
def test_the_verdict_says_worse_than_the_parent_or_the_base_beyond_the_tolerance():
    assert heldout.verdict_kind(0.42, base=0.0, parent=1.0) == "worse_parent"  # the DPO-after-SFT run
    assert heldout.verdict_kind(0.99, base=0.0, parent=1.0) == "same"  # within 0.02
    assert heldout.verdict_kind(0.5, base=0.7) == "worse_base"
    assert heldout.verdict_kind(0.5, base=0.7, parent=0.5) == "worse_base"  # no worse than its parent, still below base
    assert heldout.verdict_kind(0.8, base=0.7) == "better"
    assert heldout.verdict_kind(0.8, base=0.7, tolerance=0.2) == "same"
    verdict = heldout.judge(0.42, base=0.0, parent=1.0, scorer="exact", n=100)
    assert verdict.worse and verdict.message.key == "score.verdict.worse_parent"
    assert str(verdict.message).startswith("The adapter got worse than its parent: held-out Exact match 42% against")
    from core.messages import say

    assert say(verdict.message.key, verdict.message.params, "fr").startswith(
        "L'adaptateur a régressé par rapport à son adaptateur de départ : Correspondance exacte")
    assert json.loads(json.dumps(verdict.to_dict()))["verdict"] == "worse_parent"


# --- held-out scores on the demo model --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_peft(demo_model_path):
    """The demo model with a LoRA adapter that starts as the base (B = 0), and 12 of the demo's prompts."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from core.data.formats import default_prompt
    from core.demo import demo_rows

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(demo_model_path)
    base = AutoModelForCausalLM.from_pretrained(demo_model_path, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"]))
    rows = [{"prompt": default_prompt(r["instruction"]), "reference": r["response"]} for r in demo_rows()[:12]]
    return model, tokenizer, rows


def test_the_held_out_score_is_deterministic(demo_peft):
    model, tokenizer, rows = demo_peft
    first = heldout.score_model(model, tokenizer, rows, "exact", max_new_tokens=6, batch_size=5)
    again = heldout.score_model(model, tokenizer, rows, "exact", max_new_tokens=6, batch_size=5)
    assert first == again and len(first.scores) == 12
    # the base's own greedy answers as references: it scores every row, so the score reads the answers it generated
    own = [{**row, "reference": answer} for row, answer in zip(rows, first.answers)]
    assert heldout.score_model(model, tokenizer, own, bind("exact"), max_new_tokens=6, batch_size=5).mean == 1.0


def test_the_verdict_says_worse_for_an_adapter_whose_answers_got_worse(demo_peft):
    """Held-out references are what the parent answers (it scores 100%); then the adapter's weights are made large
    and random, as a learning rate far too high would leave them: its answers change, and the verdict says so."""
    import torch

    model, tokenizer, rows = demo_peft
    settings = dict(max_new_tokens=6, batch_size=12)
    answers = heldout.score_model(model, tokenizer, rows, "exact", **settings).answers
    rows = [{**row, "reference": answer} for row, answer in zip(rows, answers)]
    saved = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    try:
        start = heldout.score_start(model, tokenizer, rows, bind("exact"), continued=True, **settings)
        assert start["base"].mean == start["parent"].mean == 1.0  # B = 0: the parent is the base
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=generator) * 2.0)
        after = heldout.score_model(model, tokenizer, rows, bind("exact"), **settings)
        with heldout.base_of(model):  # the base is untouched: peft's disable_adapter, not a second model
            assert heldout.score_model(model, tokenizer, rows, "exact", **settings).mean == 1.0
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in saved:
                    p.copy_(saved[name])
    assert after.mean < 0.5
    verdict = heldout.judge(after.mean, start["base"].mean, start["parent"].mean, scorer="exact", n=len(rows))
    assert verdict.kind == "worse_parent" and verdict.worse
    assert heldout.judge(after.mean, start["base"].mean, scorer="exact").kind == "worse_base"


def test_scoring_batches_fit_a_training_micro_batch_of_tokens():
    from core.scoring.heldout import batches
    from core.train.heldout import scoring_tokens
    from core.config.settings import TrainConfig

    lengths = [135, 140, 120, 600, 30, 30, 30, 30, 30]
    budget = scoring_tokens(TrainConfig(per_device_train_batch_size=1, max_length=512))
    assert budget == 512
    got = batches(lengths, 32, 16, budget)
    assert [i for b in got for i in b] == list(range(len(lengths)))  # every row once, in order
    for b in got:  # within the budget, or a row alone
        assert len(b) == 1 or len(b) * (max(lengths[i] for i in b) + 32) <= budget
    assert [len(b) for b in got] == [2, 1, 1, 5]  # 3 x (140 + 32) > 512; 600 alone
    # no budget: batch_size alone, as before
    assert [len(b) for b in batches(lengths, 32, 4)] == [4, 4, 1]
