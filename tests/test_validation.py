"""Validation (issue 22): held-out rows never train, eval losses before/during/after training with sample answers,
the best checkpoint and early stopping (each with Stop + resume), and what eval costs in memory."""

import json
import threading
from pathlib import Path

import pytest
from transformers import TrainerCallback

from core.checks import validate
from core.config.settings import TrainConfig, demo_config
from core.train.data import plan_data
from core.train.recipe import run_training


def quiet(e):
    return None


def _rows(n, answer=None):
    return [{"instruction": f"Say the code word number {i}.", "context": "", "response": answer or f"w{i}x{i * 7}"}
            for i in range(n)]


def _write(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_held_out_rows_never_train_and_every_row_is_counted(tmp_path, demo_model_path):
    data = _write(tmp_path / "d.jsonl", _rows(300))
    cfg = demo_config(dataset=data, output_dir=str(tmp_path / "runs"), validation_share=0.1)
    plan, *_ = plan_data(cfg, quiet)
    held, val = plan.held, plan.validation
    assert held.mode == "share" and len(held.val_ids) == 30
    assert set(held.train_ids).isdisjoint(held.val_ids)  # row ids of the loaded split
    assert sorted(held.train_ids + held.val_ids) == list(range(300))  # the counts add up
    assert plan.n_source == 270 and val.n_source == 30 and sum(val.counts.values()) == 30
    # no training sequence is a validation row (every row is distinct)
    trained = {tuple(int(x) for x in ids) for ids in plan.train_dataset()["input_ids"]}
    validated = {tuple(int(x) for x in ids) for ids in val.train_dataset()["input_ids"]}
    assert len(trained) == 270 and len(validated) == 30 and trained.isdisjoint(validated)
    again, *_ = plan_data(cfg, quiet)
    other, *_ = plan_data(cfg.replace(seed=7), quiet)
    assert again.held.val_ids == held.val_ids != other.held.val_ids  # seeded


def test_small_splits_train_on_every_row_and_say_so(tmp_path, demo_model_path):
    events = []
    plan, *_ = plan_data(demo_config(output_dir=str(tmp_path)), events.append)  # the demo: 100 rows
    assert plan.validation is None and plan.n_source == 100
    assert any("Validation: off, every row trains: the split has 100 rows" in e.get("message", "") for e in events)
    data_event = next(e for e in events if e["kind"] == "data")
    assert data_event["validation"]["mode"] == "off"


def test_a_share_the_user_chose_is_held_out_on_a_small_split_too(tmp_path, demo_model_path):
    """Issue 37: only the default share steps aside under 200 rows; a value the user set is honoured."""
    plan, *_ = plan_data(demo_config(output_dir=str(tmp_path), validation_share=0.1), quiet)  # the demo: 100 rows
    assert plan.held.mode == "share" and len(plan.held.val_ids) == 10 and plan.n_source == 90


def test_eval_settings_are_checked():
    names = lambda cfg: {p.field for p in validate(cfg)}  # noqa: E731
    assert "eval_steps" in names(demo_config(eval_steps=2.5))
    assert "keep_best" in names(demo_config(validation_share=0.0, keep_best=True))
    assert "early_stopping_patience" in names(demo_config(validation_share=0.0, early_stopping_patience=2))
    assert not {"keep_best", "eval_steps"} & names(demo_config(keep_best=True, validation_split="train[90:]",
                                                               eval_steps=10))
    assert "tracking" in names(demo_config(tracking="wandb"))  # not installed here: named, never imported later
    assert TrainConfig().tracking == "none"  # no tracker, no network, by default


def test_demo_run_evaluates_before_during_and_after_with_answers(tmp_path, demo_model_path, capsys):
    from core.train.cli import main

    out = tmp_path / "runs"
    code = main(["--demo", "--set", f"output_dir={out}", "--set", "run_name=val", "--set", "max_steps=6",
                 "--set", "dataset_split=train[:90]", "--set", "validation_split=train[90:]", "--set", "eval_steps=3"])
    assert code == 0
    err = capsys.readouterr().err
    assert "eval baseline (before training)  validation loss" in err
    assert "eval step 3/6  validation loss" in err and "eval step 6/6" in err
    assert "eval_loss" not in err  # one name for it, the page's and README's (events keep the key eval_loss)
    # Issue 37: the held-out question asked, whole and as written, beside the reference: not the template's tail
    # cut mid-word with repr escapes ("tion:\\nTranslate the word 'star'..."), nor an answer's control characters.
    answers = [line for line in err.splitlines() if "(reference " in line]
    assert answers and "Translate the word 'star' into French. -> \"" in answers[0], answers
    assert answers[0].endswith('(reference "etoile")')
    assert not [line for line in answers if "\\n" in line or "\\x" in line or "###" in line], answers
    events = [json.loads(line) for line in (out / "val" / "events.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 3, 6]
    assert all(len(e["answers"]) == 3 and e["answers"][0]["reference"] == "etoile" for e in evals)
    summary = json.loads((out / "val" / "summary.json").read_text())
    ev = summary["eval"]
    assert [s for s, _ in ev["losses"]] == [0, 3, 6] and ev["baseline"] == evals[0]["eval_loss"]
    assert ev["final"] == evals[-1]["eval_loss"] < ev["baseline"]
    assert summary["validation"]["validation_rows"] == 10 and summary["data"]["rows_in_split"] == 90



def test_a_prompt_and_an_answer_read_on_one_line_as_written():
    from core.runs.events import one_line, prompt_gist

    assert prompt_gist("### Instruction:\nTranslate the word 'star' into French.\n\n### Response:\n") == (
        "Translate the word 'star' into French.")
    chat = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 'cat' in French?<|im_end|>\n" \
           "<|im_start|>assistant\n"
    assert prompt_gist(chat) == "What is 'cat' in French?"
    long = prompt_gist("### Instruction:\nTranslate these words into French: " + "star moon sun " * 20)
    assert long.endswith("…") and len(long) <= 81 and long[:-1].split()[-1] in ("star", "moon", "sun")  # whole words
    assert one_line("h\x1abread\nmai\x0b oeil") == "h bread mai oeil"  # no escapes, no control characters

# --- best checkpoint and early stopping: train towards "oui", validate on "non merci" -------------------------------
# lr 8e-3: the eval loss falls, then rises once the model answers "oui" to everything (lowest in the middle of 12 steps)
@pytest.fixture
def rising(tmp_path):
    train = _write(tmp_path / "train.jsonl", _rows(40, "oui"))
    val = _write(tmp_path / "val.jsonl", _rows(10, "non merci"))
    return demo_config(dataset=train, validation_data=val, output_dir=str(tmp_path / "runs"), eval_steps=2,
                       logging_steps=2, eval_samples=0, warmup_steps=0, per_device_train_batch_size=10)


class StopAfter(TrainerCallback):
    """Ask for Stop during step `n` (the run ends after step n, as the app's Stop button does)."""

    def __init__(self, stop: threading.Event, n: int):
        self.stop, self.n = stop, n

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step + 1 == self.n:
            self.stop.set()


def test_keep_best_saves_the_best_checkpoint_as_the_adapter_with_stop_and_resume(rising, demo_model_path):
    from safetensors.torch import load_file

    cfg = rising.replace(keep_best=True, max_steps=12, run_name="best")
    whole = run_training(cfg, quiet)
    assert whole.status == "completed", whole.message
    ev = whole.summary["eval"]
    losses = dict(ev["losses"])
    assert sorted(losses) == [0, 2, 4, 6, 8, 10, 12]
    best = min(losses, key=losses.get)
    assert best not in (0, 12) and ev["best_step"] == ev["adapter_step"] == best  # the middle: it overfits after
    adapter = load_file(Path(whole.adapter_dir) / "adapter_model.safetensors")
    ckpt = load_file(Path(whole.run_dir) / "checkpoints" / f"checkpoint-{best}" / "adapter_model.safetensors")
    assert adapter.keys() == ckpt.keys() and all((adapter[k] == ckpt[k]).all() for k in adapter)

    stop = threading.Event()  # Stop just before the best eval: the adapter is the best so far, then resume
    first = run_training(cfg.replace(run_name="best-stopped"), quiet, stop=stop, callbacks=[StopAfter(stop, best - 1)])
    assert first.status == "stopped" and first.summary["steps"] == best - 1
    so_far = dict(first.summary["eval"]["losses"])
    assert first.summary["eval"]["adapter_step"] == min(so_far, key=so_far.get) < best
    resumed = run_training(cfg.replace(run_name="best-stopped", resume_from=first.run_dir), quiet)
    assert resumed.status == "completed" and resumed.summary["steps"] == 12
    assert resumed.summary["eval"]["adapter_step"] == best
    assert [s for s, _ in resumed.summary["eval"]["losses"]] == sorted(losses)


def test_early_stopping_stops_after_patience_evals_with_stop_and_resume(rising, demo_model_path):
    cfg = rising.replace(early_stopping_patience=2, max_steps=30, save_strategy="steps", save_steps=2, run_name="es")
    whole = run_training(cfg, quiet)
    ev = whole.summary["eval"]
    best = ev["best_step"]
    assert whole.status == "completed" and ev["stopped_early"]
    assert whole.summary["steps"] == best + 2 * 2 < 30  # two evals (2 steps apart) without improvement
    stop = threading.Event()
    # Stopped after the first eval without gain (its count, 1, is in checkpoint-(best+2)): the resumed run goes on
    # counting from 1 and stops where the whole run did, not one eval later.
    first = run_training(cfg.replace(run_name="es-stopped"), quiet, stop=stop, callbacks=[StopAfter(stop, best + 3)])
    assert first.status == "stopped" and first.summary["steps"] == best + 3
    resumed = run_training(cfg.replace(run_name="es-stopped", resume_from=first.run_dir), quiet)
    assert resumed.summary["resumed_from"].endswith(f"checkpoint-{best + 2}")
    assert resumed.summary["steps"] == whole.summary["steps"] and resumed.summary["eval"]["stopped_early"]
    assert resumed.summary["eval"]["best_step"] == best


def test_eval_needs_no_memory_beyond_the_training_step():
    """The estimator counts no eval term: eval runs the training micro-batch, forward only, and keeps no logits
    across batches (bench/RESULTS.md measures the peak with and without eval on the GPU)."""
    from core.config import arguments as recipe
    from core.estimate.predict import estimate

    cfg = TrainConfig()
    kw = recipe.eval_kwargs(cfg)
    assert kw["per_device_eval_batch_size"] == cfg.per_device_train_batch_size and kw["prediction_loss_only"]
    off = cfg.replace(validation_share=0.0, eval_samples=0)
    assert estimate(cfg).total_gib == estimate(off).total_gib


def test_eval_leaves_training_exactly_as_it_was(tmp_path, demo_model_path):
    """The same rows train to the same losses with and without evals (and their answers) in between: on a CPU,
    bitsandbytes would otherwise repack the 4-bit weights for inference at the first eval and train wrongly after."""
    runs = {}
    for name, kw in (("off", dict(validation_share=0.0)), ("on", dict(validation_split="train[90:]"))):
        events = []
        cfg = demo_config(output_dir=str(tmp_path), run_name=name, dataset_split="train[:90]", max_steps=8,
                          logging_steps=4, eval_steps=0.5, **kw)
        assert run_training(cfg, events.append).status == "completed"
        runs[name] = [(e["step"], e["loss"], e["grad_norm"]) for e in events if e["kind"] == "metrics"]
        assert any(e["kind"] == "eval" for e in events) == (name == "on")
    assert runs["on"] == runs["off"]
