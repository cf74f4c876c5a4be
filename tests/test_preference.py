"""Preference stages (issue 44): DPO, ORPO and KTO through TRL's own trainers on the tiny demo model, no mocks.

The demo's word pairs with another word's French as the rejected answer (core.demo.preference_rows): DPO's reward
accuracy rises within a few steps; every preference row is accounted for; files without the needed columns are
refused by name; an SFT run's adapter is the start of a DPO run; SFT configs and runs are as before.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from core.config.settings import DEMO_PAIRS, TrainConfig, config_problems, demo_config, parse_overrides
from core.data.pairs import check_pairs, plan_pairs
from core.data.read import DataError
from core.demo import WORDS, preference_rows
from core.train.recipe import run_training


def _keys(events):
    return [e.get("key") for e in events if e["kind"] == "log"]


def _write(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_demo_pairs_are_fixed_and_always_wrong():
    rows = preference_rows()
    shipped = [json.loads(line) for line in DEMO_PAIRS.read_text(encoding="utf-8").splitlines()]
    assert rows == shipped and len(rows) == 100  # the shipped file is what the builder makes
    assert all(r["chosen"] in WORDS.values() and r["rejected"] in WORDS.values() for r in rows)
    assert not any(r["chosen"] == r["rejected"] for r in rows)
    assert all(r["prompt"].startswith("### Instruction:\n") and r["prompt"].endswith("### Response:\n") for r in rows)


def test_dpo_demo_reward_accuracy_rises(tmp_path):
    events = []
    cfg = demo_config(stage="dpo", max_steps=15, logging_steps=5, output_dir=str(tmp_path))
    result = run_training(cfg, events.append)
    assert result.status == "completed", result.message
    accuracy = [e["reward_accuracy"] for e in events if e["kind"] == "metrics"]
    assert len(accuracy) == 3
    assert accuracy[0] <= 0.6 and accuracy[-1] >= 0.8 and accuracy[-1] - accuracy[0] >= 0.3, accuracy
    saved = json.loads((Path(result.run_dir) / "summary.json").read_text())
    pref = saved["preference"]
    assert saved["stage"] == "dpo" and saved["reference"] == "base model, adapter disabled"
    assert pref["first_reward_accuracy"] == accuracy[0] and pref["final_reward_accuracy"] == accuracy[-1]
    assert pref["best_reward_accuracy"] == max(accuracy) and pref["final_reward_margin"] > 0
    assert pref["final_logp_chosen"] > pref["final_logp_rejected"]
    keys = _keys(events)
    assert "log.pref.reference" in keys and keys.count("log.pref.rewards") == 3 and "log.pairs" in keys
    # the reference is the base with the adapter disabled: TRL's "ref" copy of the adapter is gone, none saved
    adapter = Path(result.adapter_dir)
    assert not (adapter / "ref").exists()
    assert saved["data"]["rows_in_split"] == 100 and saved["data"]["kept"] == 100
    # the default validation_share on 100 pairs: every pair trains, said as for SFT rows (held-out pairs:
    # tests/test_preference_eval.py)
    assert "log.val_small" in keys and saved["validation"]["mode"] == "off" and saved["eval"] is None


def test_every_preference_row_is_accounted_for(tmp_path, demo_tokenizer):
    prompt = "### Instruction:\nTranslate the word 'cat' into French.\n\n### Response:\n"
    rows = [
        {"prompt": prompt, "chosen": "chat", "rejected": "chien"},  # kept
        {"prompt": prompt, "chosen": "chat " * 40, "rejected": "chien"},  # chosen cut at max_length
        {"prompt": prompt, "chosen": "chat", "rejected": "mer " * 40},  # rejected cut
        {"prompt": prompt * 6, "chosen": "chat", "rejected": "chien"},  # the prompt alone fills max_length
        {"prompt": prompt, "chosen": "", "rejected": "chien"},  # empty answer
        {"prompt": None, "chosen": "chat", "rejected": "chien"},  # no prompt
    ]
    data = _write(tmp_path / "pairs.jsonl", rows)
    cfg = demo_config(stage="dpo", dataset=data, max_steps=1, output_dir=str(tmp_path / "runs"))
    plan = plan_pairs(cfg, demo_tokenizer)
    assert plan.counts == {"kept": 1, "truncated": 2, "dropped_long": 1, "dropped_empty": 2}
    assert sum(plan.counts.values()) == plan.n_source == len(rows) and len(plan.rows) == plan.n_train == 3
    events = []
    result = run_training(cfg, events.append)
    assert result.status == "completed", result.message
    data_event = next(e for e in events if e["kind"] == "data")
    assert data_event["kept"] + data_event["truncated"] + data_event["dropped_long"] + data_event["dropped_empty"] == 6
    assert "3 train" in data_event["message"] and "1 dropped (the prompt alone fills max_length)" in data_event["message"]
    assert result.summary["data"]["train_rows"] == 3


def test_implicit_pairs_and_kto_rows_are_planned_as_trl_reads_them(tmp_path, demo_tokenizer):
    tok = demo_tokenizer.__class__.from_pretrained(demo_tokenizer.name_or_path)
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    user = {"role": "user", "content": "Translate the word 'cat' into French."}
    ultra = [{"chosen": [user, {"role": "assistant", "content": "chat"}],
              "rejected": [user, {"role": "assistant", "content": "chien"}]}] * 3
    cfg = demo_config(stage="dpo", dataset=_write(tmp_path / "ultra.jsonl", ultra))
    plan = plan_pairs(cfg, tok)
    assert plan.format == "implicit_pairs" and plan.conversational and plan.counts["kept"] == 3
    assert plan.rows[0]["prompt"] == [user] and plan.rows[0]["chosen"] == [{"role": "assistant", "content": "chat"}]
    with pytest.raises(DataError, match="no chat template"):
        plan_pairs(cfg, demo_tokenizer)  # the demo tokenizer has none: said, with the fix
    # KTO: unpaired rows as they are; pairs split by TRL's unpair_preference_dataset (one row per answer)
    kto = [{"prompt": "a", "completion": "chat", "label": True}, {"prompt": "b", "completion": "x", "label": False}]
    unpaired = plan_pairs(demo_config(stage="kto", dataset=_write(tmp_path / "kto.jsonl", kto)), demo_tokenizer)
    assert unpaired.format == "unpaired" and unpaired.n_train == 2 and [r["label"] for r in unpaired.rows] == [True, False]
    split = plan_pairs(demo_config(stage="kto"), demo_tokenizer)
    assert split.n_source == 200 and split.n_train == 200 and sum(r["label"] for r in split.rows) == 100


def test_files_without_the_needed_columns_are_refused_by_name(tmp_path):
    sft_rows = _write(tmp_path / "sft.jsonl", [{"instruction": "hi", "response": "salut"}])
    for stage, needs in (("dpo", "prompt/chosen/rejected"), ("orpo", "prompt/chosen/rejected"),
                         ("kto", "prompt/completion/label")):
        with pytest.raises(DataError) as err:
            check_pairs(demo_config(stage=stage, dataset=sft_rows))
        text = str(err.value)
        assert sft_rows in text and "instruction, response" in text and needs in text and "stage to sft" in text
    unpaired = _write(tmp_path / "kto.jsonl", [{"prompt": "a", "completion": "b", "label": True}])
    with pytest.raises(DataError, match="chosen and a rejected answer"):
        check_pairs(demo_config(stage="dpo", dataset=unpaired))
    # a run with such a file fails as a data error, before any model is loaded, with the same words
    result = run_training(demo_config(stage="dpo", dataset=sft_rows, output_dir=str(tmp_path / "runs")))
    assert result.status == "failed" and result.error_type == "data" and sft_rows in result.message


def test_stage_settings_are_checked_before_any_work(tmp_path, finished_run):
    problems = {p.field: p for p in config_problems(demo_config(stage="dpo", packing=True,
                                                                init_adapter=str(tmp_path / "nothing")))}
    assert "packing" in problems and "init_adapter" in problems
    assert str(tmp_path / "nothing") in problems["init_adapter"].message
    other = demo_config(stage="dpo", model="meta-llama/Llama-3.1-8B", init_adapter=finished_run.result.run_dir)
    wrong = [p for p in config_problems(other) if p.field == "init_adapter"]
    assert wrong and "memtune/demo-tiny-llama" in wrong[0].message and "set model to" in wrong[0].fix
    assert not [p for p in config_problems(demo_config(stage="dpo", init_adapter=finished_run.result.run_dir))
                if p.field == "init_adapter"]
    assert any(p.field == "stage" for p in config_problems(demo_config(**parse_overrides(["stage=ppo"]))))
    # PiSSA's moved base under a reference: named; keep_best and early stopping read the validation pairs' eval loss
    # (tests/test_preference_eval.py), refused only without validation, as for SFT
    many = config_problems(demo_config(stage="dpo", keep_best=True, early_stopping_patience=2, lora_init="pissa",
                                       load_in_4bit=False))
    named = {p.field: p.message for p in many}
    assert "keep_best" not in named and "early_stopping_patience" not in named
    assert "lora_init pissa" in named["lora_init"] and "reference" in named["lora_init"]
    no_val = {p.field for p in config_problems(demo_config(stage="dpo", keep_best=True, validation_share=0.0))}
    assert "keep_best" in no_val
    orpo = config_problems(demo_config(stage="orpo", lora_init="pissa", load_in_4bit=False))  # no reference: fine
    assert not [p for p in orpo if p.field == "lora_init"]
    assert not [p for p in config_problems(demo_config(keep_best=True, early_stopping_patience=2))
                if "stage" in p.message]  # sft: as before


class Optimizer(TrainerCallback):
    def on_train_begin(self, args, state, control, optimizer=None, model=None, **kw):
        self.lrs = sorted({g["initial_lr"] for g in optimizer.param_groups})  # before the warm-up scales them
        self.dora = any("lora_magnitude_vector" in n for n, _ in model.named_parameters())


def test_dpo_takes_dora_and_loraplus(tmp_path):
    seen = Optimizer()
    cfg = demo_config(stage="dpo", use_dora=True, loraplus_lr_ratio=16, max_steps=1, output_dir=str(tmp_path))
    result = run_training(cfg, callbacks=[seen])
    assert result.status == "completed", result.message
    assert seen.dora  # DoRA's magnitudes trained
    # peft's LoRA+ groups: lora_A (and the rest) at the learning rate, lora_B at 16 times it
    assert pytest.approx(cfg.learning_rate) in seen.lrs and pytest.approx(16 * cfg.learning_rate) in seen.lrs


def test_one_set_per_stage_and_the_yaml_follows():
    changes = parse_overrides(["stage=dpo", "beta=0.2", "dpo_loss_type=ipo"])
    cfg = demo_config(**changes)
    text = cfg.to_yaml()
    assert "stage: dpo" in text and "beta: 0.2" in text and "dpo_loss_type: ipo" in text
    assert TrainConfig.from_yaml(text) == cfg
    sft = TrainConfig().to_yaml()  # an sft file: stage only, no other stage's fields
    assert "stage: sft" in sft and "beta" not in sft and "init_adapter" not in sft and "dpo_loss_type" not in sft
    orpo = demo_config(stage="orpo").to_dict()
    assert "beta" in orpo and "dpo_loss_type" not in orpo


def test_sft_runs_are_as_before(finished_run):
    assert finished_run.cfg.stage == "sft"
    assert "preference" not in finished_run.result.summary and "stage" not in finished_run.result.summary
    metrics = [e for e in finished_run.events if e["kind"] == "metrics"]
    assert metrics and not any(k.startswith(("reward_", "logp_")) for e in metrics for k in e)
    assert "log.pref.rewards" not in _keys(finished_run.events)


@pytest.mark.parametrize("stage", ["orpo", "kto"])
def test_orpo_and_kto_train_a_few_steps(tmp_path, stage):
    events = []
    result = run_training(demo_config(stage=stage, max_steps=2, logging_steps=1, output_dir=str(tmp_path)),
                          events.append)
    assert result.status == "completed", result.message
    losses = [e["loss"] for e in events if e["kind"] == "metrics"]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert result.summary["stage"] == stage and result.summary["preference"]["steps"]
    keys = _keys(events)
    assert ("log.pref.no_reference" if stage == "orpo" else "log.pref.reference") in keys
    if stage == "orpo":
        assert result.summary["preference"]["final_reward_accuracy"] is not None


class FirstWeights(TrainerCallback):
    """The LoRA weights at the start and at the end of training, by adapter ("default": trained; "ref": TRL's copy)."""

    @staticmethod
    def _by_adapter(model, name):
        return {n.replace(f".{name}", ""): p.detach().float().clone() for n, p in model.named_parameters()
                if "lora_" in n and f".{name}." in n}

    def on_train_begin(self, args, state, control, model=None, **kw):
        self.weights, self.ref = self._by_adapter(model, "default"), self._by_adapter(model, "ref")

    def on_train_end(self, args, state, control, model=None, **kw):
        self.end, self.ref_end = self._by_adapter(model, "default"), self._by_adapter(model, "ref")


def test_dpo_starts_from_an_sft_runs_adapter_and_keeps_it_as_reference(tmp_path, finished_run):
    from peft import load_peft_weights

    first, events = FirstWeights(), []
    cfg = demo_config(stage="dpo", init_adapter=finished_run.result.run_dir, max_steps=2, output_dir=str(tmp_path))
    result = run_training(cfg, events.append, callbacks=[first])
    assert result.status == "completed", result.message
    keys = _keys(events)
    assert "log.pref.init_adapter" in keys and "log.pref.reference_adapter" in keys and "log.pref.reference" not in keys
    assert result.summary["reference"] == "init_adapter, frozen copy"
    saved = load_peft_weights(str(Path(finished_run.result.run_dir) / "adapter"))
    assert set(saved) == set(first.weights) == set(first.ref)  # the policy and TRL's reference copy: the SFT adapter
    assert all((first.weights[n] - w.float()).abs().max() < 1e-2 for n, w in saved.items())
    assert all((first.ref[n] - w.float()).abs().max() < 1e-2 for n, w in saved.items())
    # the reference stays the SFT model (frozen) while the policy moves away from it
    assert all(torch.equal(first.ref[n], first.ref_end[n]) for n in first.ref)
    assert any(not torch.equal(first.weights[n], first.end[n]) for n in first.weights)
    adapter = Path(result.adapter_dir)  # only the trained adapter is saved, not TRL's copy
    assert not (adapter / "ref").exists() and set(load_peft_weights(str(adapter))) == set(saved)


def test_the_estimate_counts_two_sequences_per_pair():
    from core.estimate.predict import estimate

    sft, dpo, orpo, kto = (estimate(TrainConfig(stage=s)) for s in ("sft", "dpo", "orpo", "kto"))
    assert dpo.tokens == orpo.tokens == 2 * sft.tokens and kto.tokens == sft.tokens
    assert 1.95 <= dpo.activations / sft.activations <= 2.05 and dpo.logits >= sft.logits  # + a padding mask
    assert dpo.nvml_training > sft.nvml_training and kto.nvml_training == sft.nvml_training
    assert any("reference pass" in n for n in dpo.notes) and not any("reference" in n for n in orpo.notes)


@pytest.mark.parametrize("stage", ["dpo", "orpo", "kto"])
def test_every_stage_counts_the_tokens_it_trains_on(tmp_path, demo_tokenizer, stage):
    """tokens/s and summary.json's train_tokens count every sequence of the batch: prompt + chosen and prompt +
    rejected of each pair (DPO, ORPO), prompt + completion of each KTO row. ORPO's batch has no input_ids (only
    chosen_/rejected_input_ids), so the Trainer's own count stayed 0 there."""
    from trl.data_utils import _tokenize

    prompt = "### Instruction:\nTranslate the word '{}' into French.\n\n### Response:\n"
    words = [("cat", "chat", "chien"), ("sea", "mer mer", "chat"), ("dog", "chien", "mer chat chien"),
             ("house", "maison", "chat")]
    if stage == "kto":
        rows = [{"prompt": prompt.format(w), "completion": a, "label": i % 2 == 0} for i, (w, a, _) in enumerate(words)]
        answers = ("completion",)
    else:
        rows = [{"prompt": prompt.format(w), "chosen": c, "rejected": r} for w, c, r in words]
        answers = ("chosen", "rejected")
    eos = demo_tokenizer.eos_token
    # what the trainers tokenize: the prompt, its answer and EOS (core/data/pairs.py counts rows the same way)
    expected = sum(len(_tokenize(demo_tokenizer, r["prompt"] + r[a] + eos)["input_ids"]) for r in rows for a in answers)
    events = []
    cfg = demo_config(stage=stage, dataset=_write(tmp_path / "rows.jsonl", rows), per_device_train_batch_size=4,
                      max_steps=1, output_dir=str(tmp_path / "runs"))
    result = run_training(cfg, events.append)
    assert result.status == "completed", result.message
    step = next(e for e in events if e["kind"] == "step")
    assert step["tokens"] == result.summary["train_tokens"] == expected
    assert step["tokens_per_s"] > 0


def test_the_estimate_sizes_micro_batches_for_the_longest_pair(tmp_path, demo_tokenizer, capsys):
    """`python -m core.estimate --data` on a pairs file: read as the stage reads it (an SFT reading refused the file:
    no instruction/response columns), each micro-batch two sequences per pair of at most the longest side."""
    from core.config.settings import DEMO_MODEL
    from core.estimate.predict import main

    prompt = "### Instruction:\nTranslate the word 'cat' into French.\n\n### Response:\n"
    rows = [{"prompt": prompt, "chosen": "chat", "rejected": "chien " * n} for n in (1, 30, 12)]
    data = _write(tmp_path / "pairs.jsonl", rows)
    base = ["--set", f"model={DEMO_MODEL}", "--set", f"dataset={data}", "--set", "stage=dpo", "--set",
            "per_device_train_batch_size=4", "--set", "max_length=256", "--json"]
    assert main(base) == 0
    assumed = json.loads(capsys.readouterr().out)
    assert main(base + ["--data"]) == 0
    measured = json.loads(capsys.readouterr().out)
    longest = plan_pairs(demo_config(stage="dpo", dataset=data, max_length=256), demo_tokenizer).longest_row
    assert 30 < longest < 256 and assumed["tokens_per_micro_batch"] == 2 * 4 * 256
    assert measured["tokens_per_micro_batch"] == 2 * 4 * longest and measured["total_gib"] < assumed["total_gib"]
