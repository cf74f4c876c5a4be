"""GRPO (TrainConfig.stage grpo): online RL with the scorers as rewards, through TRL's own GRPOTrainer and GRPOConfig.

The recipe (core/train/recipe.py) stays one sequence: the rows are SFT rows, read, held out and planned as an SFT
run's (core/train/data.py), so a prompt's reference answer is the answer the row trains on in SFT. `prompt_rows`
turns the plan's training rows into what GRPOTrainer reads: the prompt as text (TRL tokenizes it, and samples
num_generations answers to it with transformers' generate on the training model) and its `reference`, the column
the rewards read. `rewards` binds grpo_rewards' scorers once, in this process (core.scoring.scorers.Reward: a user's
python scorer is imported here, never in the web server, and refused in public mode), with their weights as TRL's
reward_weights. The model is memtune's LoRA on the 4-bit base; with init_adapter its weights are the start
(core/train/stages.py start_from). The reference of the KL term (grpo_beta > 0) is what DPO's is: TRL's frozen copy of
init_adapter's adapter, or from a fresh adapter the base with the adapter disabled (the copy is removed, as
core/train/stages.py does): never a second copy of the base. grpo_beta 0: no reference pass at all.

What it logs: TRL's `reward`, `rewards/<scorer>/mean`, `completions/mean_length` and `kl` become the run's metrics
events (core/train/rewards.py names them), drawn on the page's reward chart; `SampleLog` puts a few of the last
sampled answers with their rewards in the log at each logging step.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Protocol

from transformers import TrainerCallback

from core.config import arguments
from core.config.settings import ConfigError, Problem, reward_options, reward_spec
from core.config.slices import DataSlice, ModelSlice, PlaceSlice, StageSlice, TrainerSlice
from core.data.validation import prompts_and_answers
from core.messages import keyed
from core.model import load as model_lib
from core.model.resolve import adapter_dir
from core.runs.events import EventSink, make_event, one_line
from core.scoring.scorers import Reward, ScorerError
from core.train.host import counted_once
from core.train.rewards import SAMPLING_S

SAMPLES_PER_LOG = 2  # sampled answers said in the log at each logging step


class _Staged(ModelSlice, DataSlice, StageSlice, TrainerSlice, PlaceSlice, Protocol):
    """GRPO's trainer: its TRL config (the step, tracker) and the stage's sampling and rewards."""


def trainer_classes() -> tuple[type, type]:
    """(trainer, config) of TRL for GRPO, the trainer counting its tokens once (`counting_itself`)."""
    from trl import GRPOConfig, GRPOTrainer

    return counting_itself(GRPOTrainer), GRPOConfig


@functools.cache  # one class per trainer class, not one per run
def counting_itself(trainer_class: type) -> type:
    """`trainer_class` timing its sampling (SAMPLING_S in its logs), without the Trainer's own token count per
    micro-batch: GRPOTrainer adds every generation's prompt and completion tokens to state.num_input_tokens_seen
    itself (tokens/s, summary.json's train_tokens), and its batches hold no `input_ids` for the Trainer to count,
    which made it warn at every micro-batch."""
    class CountingItself(trainer_class):
        def _track_num_input_tokens(self, inputs):
            return None

        def _generate(self, prompts):
            # the sampling's own seconds, logged as GRPOTrainer logs its other figures (averaged over the logging
            # window's generation batches, one per optimizer step by default): the step's sampling share
            started = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                mode = "train" if self.model.training else "eval"
                self._metrics[mode][SAMPLING_S].append(time.perf_counter() - started)

    CountingItself.__name__ = CountingItself.__qualname__ = trainer_class.__name__
    return CountingItself


# --- the rewards ----------------------------------------------------------------------------------------------------
class Recorded:
    """A reward function that keeps its last call's answers and scores (for SampleLog) and returns the scorer's
    values unchanged; TRL names its log entries after `__name__` (the scorer's)."""

    def __init__(self, reward: Reward, seen: dict[str, Any]) -> None:
        self.reward, self.seen, self.__name__ = reward, seen, reward.__name__

    def __call__(self, prompts: list, completions: list, **columns: Any) -> list[float]:
        values = self.reward(prompts, completions, **columns)
        self.seen["prompts"], self.seen["completions"] = list(prompts), list(completions)
        self.seen.setdefault("scores", {})[self.__name__] = list(values)
        return values


def rewards(cfg: StageSlice, seen: dict[str, Any] | None = None) -> tuple[list[Any], list[float]]:
    """grpo_rewards' scorers bound with grpo_reward_options (checked once, here) as GRPOTrainer's reward functions,
    and their weights. A scorer that cannot be bound (a bad pattern, a user's file that fails to import, a python
    scorer in public mode) is a ConfigError naming grpo_rewards or grpo_reward_options."""
    spec, options = reward_spec(cfg.grpo_rewards), reward_options(cfg.grpo_reward_options)
    funcs = []
    for name, _ in spec:
        try:
            reward = Reward(name, **options.get(name, {}))
        except ScorerError as exc:
            field = "grpo_reward_options" if name in options else "grpo_rewards"
            raise ConfigError([Problem.of(field, "problem.grpo_scorer", scorer=name, why=str(exc))]) from None
        funcs.append(Recorded(reward, seen) if seen is not None else reward)
    return funcs, [weight for _, weight in spec]


# --- the prompts ----------------------------------------------------------------------------------------------------
def prompt_rows(train_dataset: Any, tokenizer: Any) -> Any:
    """The plan's training rows (input_ids, labels with -100 on the prompt) as GRPOTrainer's dataset: `prompt`, the
    prompt's text (TRL tokenizes it again, with the tokenizer's special tokens), and `reference`, the answer the row
    trains on in SFT, split as the held-out rows are (core.data.validation.prompts_and_answers). Rows without a
    prompt (plain text) have nothing to answer and are left out."""
    import datasets

    rows = prompts_and_answers(train_dataset["input_ids"], train_dataset["labels"], tokenizer)
    return datasets.Dataset.from_dict({"prompt": [r["prompt"] for r in rows],
                                       "reference": [r["reference"].strip() for r in rows]})


# --- the trainer ----------------------------------------------------------------------------------------------------
def grpo_kwargs(cfg: StageSlice, weights: list[float]) -> dict[str, Any]:
    """GRPOConfig's own arguments on top of the TrainingArguments memtune builds for every run."""
    return {"num_generations": cfg.num_generations, "max_completion_length": cfg.max_completion_length,
            "temperature": cfg.temperature, "beta": cfg.grpo_beta, "reward_weights": weights,
            "log_completions": False}  # SampleLog says them in the run's log instead of a rich table on stdout


def build_config(cfg: _Staged, output_dir: str | Path, weights: list[float], console: bool = False,
                 run_dir: str | Path | None = None, cuda: bool | None = None):
    """GRPOConfig: sft_kwargs (batch, accumulation, optimizer, precision, checkpointing ...; what GRPOConfig lacks,
    e.g. max_length and packing, is left out) + the tracker + GRPO's fields. No eval: GRPO has no eval loss, and the
    held-out score says whether it helped (core/train/heldout.py)."""
    _, config_class = trainer_classes()
    return arguments.trainer_config(config_class, cfg, output_dir,
                                    model_lib.use_cuda(cfg) if cuda is None else cuda, console, False, run_dir,
                                    **grpo_kwargs(cfg, weights))


def trainer_for(cfg: _Staged, model, tokenizer, train_dataset, output_dir: Path, callbacks=(), console: bool = False,
                cuda: bool | None = None):
    """GRPOTrainer on the plan's prompts with the scorers as rewards, the reference as the module docstring says;
    SampleLog beside the run's event callback. trainer.build_trainer adds what every run's trainer gets."""
    trainer_class, _ = trainer_classes()
    seen: dict[str, Any] = {}
    funcs, weights = rewards(cfg, seen)
    args = build_config(cfg, output_dir, weights, console, output_dir.parent, cuda)
    sinks = [c.sink for c in callbacks if hasattr(c, "sink")]  # the run's event callback (core/train/callbacks.py)
    extra = [SampleLog(sinks[0], seen)] if sinks else []
    trainer = counted_once(trainer_class)(model=model, reward_funcs=funcs, args=args,
                                          train_dataset=prompt_rows(train_dataset, tokenizer),
                                          processing_class=tokenizer, callbacks=[*callbacks, *extra])
    peft_config = getattr(trainer.model, "peft_config", {})
    if "ref" in peft_config and adapter_dir(cfg) is None:  # a fresh adapter's copy is the base: TRL then disables
        trainer.model.delete_adapter("ref")  # the adapter for the reference instead
    return trainer


def reference(cfg: StageSlice) -> str | None:
    """summary.json's "reference" of a GRPO run: what its KL term compares with (None without one)."""
    if cfg.grpo_beta == 0:
        return None
    return "init_adapter, frozen copy" if adapter_dir(cfg) is not None else "base model, adapter disabled"


def reference_said(cfg: StageSlice, folder: Path | None) -> dict[str, Any]:
    """The log's line about GRPO's reference (start_from says it)."""
    if cfg.grpo_beta == 0:
        return keyed("log.grpo.no_reference")
    if folder is not None:
        return keyed("log.pref.reference_adapter", stage=cfg.stage, path=str(folder))
    return keyed("log.pref.reference", stage=cfg.stage)


# --- the log --------------------------------------------------------------------------------------------------------
class SampleLog(TrainerCallback):
    """At each logging step, a few of the last sampled answers, their prompt and each scorer's reward, in the log."""

    def __init__(self, sink: EventSink, seen: dict[str, Any]) -> None:
        self.sink, self.seen = sink, seen

    def on_log(self, args, state, control, logs=None, **kw):
        if "loss" not in (logs or {}) or not self.seen.get("completions"):
            return
        from core.scoring.scorers import completion_text

        scores = self.seen.get("scores", {})
        for i, (prompt, completion) in enumerate(zip(self.seen["prompts"], self.seen["completions"])):
            if i >= SAMPLES_PER_LOG:
                break
            rewards = ", ".join(f"{name} {values[i]:g}" for name, values in scores.items() if i < len(values))
            self.sink(make_event("log", level="info", **keyed(
                "log.grpo.sample", step=state.global_step, prompt=one_line(completion_text(prompt)),
                answer=one_line(completion_text(completion)), rewards=rewards)))
