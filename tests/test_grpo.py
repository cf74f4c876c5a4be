"""GRPO as a fourth stage (core/train/grpo.py through TRL's GRPOTrainer): its settings checked by name, the scorers as
rewards, the estimator's sampling term, and tiny real runs on the demo model that log rewards and write summary.json."""

import json
from pathlib import Path

import pytest

from core.config.settings import TrainConfig, config_problems, demo_config, reward_spec
from core.estimate import stages as stage_terms
from core.estimate.predict import estimate
from core.model.shapes import table_lookup
from core.runs.history import DEMO_GRPO, preference_config
from core.train import grpo
from core.train.recipe import run_training


def grpo_config(**changes):
    return demo_config(stage="grpo", **changes)


def fields_of(cfg):
    return [(p.field, p.key) for p in config_problems(cfg)]


# --- settings --------------------------------------------------------------------------------------------------------
def test_the_demos_grpo_settings_have_no_problem():
    assert fields_of(grpo_config()) == []
    assert fields_of(grpo_config(**DEMO_GRPO)) == []


def test_a_group_that_does_not_divide_the_generation_batch_is_refused_with_a_size_that_fits():
    problems = config_problems(grpo_config(per_device_train_batch_size=20, gradient_accumulation_steps=1,
                                           num_generations=3))
    assert [(p.field, p.key) for p in problems] == [("num_generations", "problem.grpo_group")]
    assert "21" in problems[0].fix and "20" in problems[0].message
    assert fields_of(grpo_config(per_device_train_batch_size=2, gradient_accumulation_steps=3,
                                 num_generations=3)) == []
    assert ("num_generations", "problem.below_min") in fields_of(grpo_config(num_generations=1))
    # the other stages never read it
    assert fields_of(demo_config(num_generations=3)) == []


@pytest.mark.parametrize("rewards, options, field, key", [
    ("nonsense", "", "grpo_rewards", "problem.grpo_rewards"),
    ("contains:x", "", "grpo_rewards", "problem.grpo_rewards"),
    ("exact, exact", "", "grpo_rewards", "problem.grpo_rewards"),
    (" , ", "", "grpo_rewards", "problem.grpo_rewards"),
    ("exact", "[1]", "grpo_reward_options", "problem.grpo_reward_options"),
    ("exact", '{"regex": 3}', "grpo_reward_options", "problem.grpo_reward_options"),
    ("exact", '{"regex": {"pattern": "x"}}', "grpo_reward_options", "problem.grpo_options_unused"),
])
def test_rewards_and_options_that_cannot_be_read_are_named(rewards, options, field, key):
    assert fields_of(grpo_config(grpo_rewards=rewards, grpo_reward_options=options)) == [(field, key)]


def test_keep_best_and_early_stopping_are_refused_for_grpo():
    cfg = grpo_config(keep_best=True, early_stopping_patience=2, validation_share=0.2)
    assert fields_of(cfg) == [("keep_best", "problem.grpo_no_eval"),
                              ("early_stopping_patience", "problem.grpo_no_eval")]


def test_the_kernel_warm_up_never_runs_a_grpo_step():
    from core.train.callbacks import warms_up

    assert not warms_up(TrainConfig(stage="grpo", kernel_warmup="on"), cuda=True)
    assert warms_up(TrainConfig(stage="dpo", kernel_warmup="on"), cuda=True)


def test_reward_spec_reads_weights():
    assert reward_spec("contains") == [("contains", 1.0)]
    assert reward_spec("exact:1, regex:0.5") == [("exact", 1.0), ("regex", 0.5)]


# --- the rewards -----------------------------------------------------------------------------------------------------
def test_the_reward_functions_return_the_scorers_values_for_right_and_wrong_answers():
    cfg = grpo_config(grpo_rewards="exact:1, regex:0.5", grpo_reward_options='{"regex": {"pattern": "[a-z]+"}}')
    seen = {}
    funcs, weights = grpo.rewards(cfg, seen)
    assert [f.__name__ for f in funcs] == ["exact", "regex"] and weights == [1.0, 0.5]
    prompts, answers, refs = ["p1", "p2", "p3"], ["ami", "chien", "Ami!"], ["ami", "ami", "ami"]
    assert funcs[0](prompts, answers, reference=refs) == [1.0, 0.0, 0.0]
    assert funcs[1](prompts, answers, reference=refs) == [1.0, 1.0, 0.0]
    # what the log's samples read: the last call's answers and each scorer's values
    assert seen["completions"] == answers and seen["scores"] == {"exact": [1.0, 0.0, 0.0], "regex": [1.0, 1.0, 0.0]}
    # a conversational completion is scored on its last message's content
    assert funcs[0](["p"], [[{"role": "assistant", "content": "ami"}]], reference=["ami"]) == [1.0]


def test_a_scorer_that_cannot_be_bound_is_a_config_error_naming_the_field(tmp_path, monkeypatch):
    from core.config.settings import ConfigError

    with pytest.raises(ConfigError) as caught:
        grpo.rewards(grpo_config(grpo_rewards="regex", grpo_reward_options='{"regex": {"pattern": "("}}'))
    assert [(p.field, p.key) for p in caught.value.problems] == [("grpo_reward_options", "problem.grpo_scorer")]
    file = tmp_path / "mine.py"
    file.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\ndef f(p, r):\n    return 1.0\n")
    monkeypatch.setenv("MEMTUNE_PUBLIC", "1")
    with pytest.raises(ConfigError) as caught:
        grpo.rewards(grpo_config(grpo_rewards="python", grpo_reward_options=json.dumps({"python": {
            "function": f"{file}:f"}})))
    assert "public" in str(caught.value).lower() and not (tmp_path / "ran").exists()


# --- the estimate ----------------------------------------------------------------------------------------------------
def test_the_generation_term_grows_with_the_sampled_answers_times_their_length():
    shape = table_lookup("meta-llama/Llama-3.1-8B")

    def sampling(generations, length):  # one prompt per step: its num_generations answers are the generation batch
        cfg = TrainConfig(stage="grpo", per_device_train_batch_size=1, gradient_accumulation_steps=generations,
                          num_generations=generations, max_length=256, max_completion_length=length)
        return stage_terms.kv_cache_bytes(cfg, shape), stage_terms.generation_bytes(cfg, shape)

    kv, total = sampling(4, 256)
    # keys and values of 32 layers x 1024 wide (8 KV heads x 128), 4 answers x (256 + 256) tokens, bf16
    assert kv == 2 * 32 * 1024 * 4 * 512 * 2
    assert total == kv + 4 * shape.vocab_size * stage_terms.SAMPLED_LOGITS_BYTES  # and one decoding step's logits
    assert sampling(8, 256)[0] == 2 * kv  # twice the answers
    assert sampling(4, 768)[0] == 2 * kv  # twice prompt + answer
    assert stage_terms.generation_bytes(TrainConfig(), shape) == 0  # sft samples nothing


def test_a_grpo_estimate_holds_the_sampling_peak_where_it_exceeds_the_training_step():
    shape = table_lookup("meta-llama/Llama-3.1-8B")
    base = TrainConfig(stage="grpo", per_device_train_batch_size=1, max_length=512, max_completion_length=512)
    few, many = (base.replace(gradient_accumulation_steps=n, num_generations=n) for n in (4, 64))
    # the same micro-batch trains; the 64 sampled answers' cache (4 GiB) is what grows the peak
    grown = estimate(many, shape).nvml_peak - estimate(few, shape).nvml_peak
    cache = stage_terms.kv_cache_bytes(many, shape) - stage_terms.kv_cache_bytes(few, shape)
    assert 0.8 * cache < grown < 1.5 * cache, (grown, cache)
    assert any("grpo: sampling 64 answers" in n for n in estimate(many, shape).notes)


# --- real runs ---------------------------------------------------------------------------------------------------------
TINY = dict(max_steps=2, logging_steps=1, per_device_train_batch_size=8, num_generations=4,
            max_completion_length=4, heldout_rows=4, save_strategy="no")


def test_a_tiny_grpo_run_logs_rewards_and_samples_and_writes_its_summary(tmp_path):
    events = []
    cfg = grpo_config(output_dir=str(tmp_path), run_name="g", grpo_rewards="exact:1, regex:0.5",
                      grpo_reward_options='{"regex": {"pattern": "[a-z]+"}}', **TINY)
    result = run_training(cfg, events.append)
    assert result.status == "completed", result.message
    metrics = [e for e in events if e["kind"] == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert {"reward_mean", "reward_by_exact", "reward_by_regex", "completion_length", "completion_share",
                "kl"} <= set(m), m
        assert m["reward_mean"] == pytest.approx(m["reward_by_exact"] + 0.5 * m["reward_by_regex"], abs=1e-5)
        assert m["sampling_s"] > 0  # the step's sampling seconds (generate), timed apart from the training
    keys = [e.get("key") for e in events if e["kind"] == "log"]
    assert keys.count("log.grpo.rewards") == 2 and "log.grpo.sample" in keys and "log.pref.reference" in keys
    summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
    assert summary["stage"] == "grpo" and summary["reference"] == "base model, adapter disabled"
    assert [s["step"] for s in summary["grpo"]["steps"]] == [1, 2]
    assert set(summary["grpo"]["final_rewards_by_scorer"]) == {"exact", "regex"}
    assert summary["heldout"]["rows"] == 4 and summary["heldout"]["adapter"] is not None
    assert summary["train_tokens"] > 0
    assert not any("Tried to track the number of tokens" in str(e.get("message", "")) for e in events)


def test_history_continues_an_sft_run_with_grpo_from_its_adapter(tmp_path):
    parent = run_training(demo_config(output_dir=str(tmp_path), run_name="sft", max_steps=1, heldout_rows=0),
                          lambda e: None)
    assert parent.status == "completed", parent.message
    cfg = preference_config(parent.run_dir, stage="grpo")
    assert (cfg.stage, cfg.init_adapter, cfg.run_name) == ("grpo", str(Path(parent.run_dir).resolve()), "sft-grpo")
    assert {k: getattr(cfg, k) for k in DEMO_GRPO} == DEMO_GRPO  # the demo's measured GRPO settings
    events = []
    result = run_training(cfg.replace(**TINY, grpo_beta=0.1), events.append)
    assert result.status == "completed", result.message
    summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
    assert summary["reference"] == "init_adapter, frozen copy" and summary["heldout"]["parent"] is not None
    assert "log.pref.reference_adapter" in [e.get("key") for e in events]


# --- the page ----------------------------------------------------------------------------------------------------------
def test_grpo_events_are_drawn_and_summed_up_in_the_pages_language():
    from core.jobs.view import _rewards
    from ui.live import reward_frame
    from ui.render import grpo_rows

    event = {"kind": "metrics", "step": 20, "loss": 0.1, "reward_mean": 0.55, "reward_by_exact": 0.28,
             "reward_by_regex": 0.54, "completion_length": 3.4, "completion_share": 0.425, "kl": 0.075}
    rewards = [(10, _rewards({**event, "reward_mean": 0.37})), (20, _rewards(event))]
    assert rewards[1][1] == {k: v for k, v in event.items() if k not in ("kind", "step", "loss")}
    frame = reward_frame(rewards, "fr")
    assert {"récompense moyenne", "récompense : exact", "récompense : regex", "KL par rapport à la référence",
            "longueur des réponses (part du maximum)"} == set(frame["series"])
    (label, text), = grpo_rows(rewards, "pt")
    assert label == "Recompensa média" and "0,370" in text and "<b>0,550</b>" in text and "exact 0,280" in text
    assert grpo_rows([(10, {"reward_accuracy": 0.5})], "en") == []  # a DPO run's rows are reward_rows'


def test_grpos_prompts_are_split_as_the_held_out_rows_are():
    """prompt_rows and the held-out rows share one split of a planned row (core.data.validation.prompts_and_answers):
    the prompt its labels mask, the reference the answer it trains on; plain-text rows give none."""
    from core.data.validation import prompts_and_answers
    from core.demo import build_tokenizer
    from core.train.grpo import prompt_rows
    import datasets

    tok = build_tokenizer()
    prompt, answer = tok("Q: dog?\nA:")["input_ids"], tok(" chien")["input_ids"]
    rows = datasets.Dataset.from_dict({"input_ids": [prompt + answer, answer],
                                       "labels": [[-100] * len(prompt) + answer, answer]})
    split = prompts_and_answers(rows["input_ids"], rows["labels"], tok)
    assert [(r["row"], r["prompt_ids"]) for r in split] == [(0, prompt)]  # the plain-text row has no prompt
    assert split[0]["prompt"] == tok.decode(prompt, skip_special_tokens=True)
    grpo = prompt_rows(rows, tok)
    assert grpo["prompt"] == [split[0]["prompt"]] and grpo["reference"] == [split[0]["reference"].strip()]
    assert prompts_and_answers(list(rows["input_ids"]) * 3, list(rows["labels"]) * 3, tok, n=2)[-1]["row"] == 2


def test_grpos_packing_refusal_speaks_of_sampled_answers_not_pairs():
    from core.checks import validate
    from core.config.settings import demo_config

    problems = [p for p in validate(demo_config(stage="grpo", packing=True, per_device_train_batch_size=4))
                if p.field == "packing"]
    assert [p.key for p in problems] == ["problem.grpo_packing"] and "pairs" not in problems[0].message
    dpo = [p for p in validate(demo_config(stage="dpo", packing=True)) if p.field == "packing"]
    assert [p.key for p in dpo] == ["problem.stage_packing"]
