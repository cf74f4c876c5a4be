"""Preference stages (TrainConfig.stage: dpo, orpo, kto) through TRL's own trainers and configs; GRPO's trainer is
core/train/grpo.py's, its start and summary go through the same hooks here.

The recipe (core/train/recipe.py) stays one sequence (data plan -> model with LoRA -> trainer -> adapter); for a
preference stage it reads and plans the preference rows (core/data/pairs.py) instead of SFT rows, reported alike,
and asks this module at three marked hooks:
- `start_from`: with init_adapter, the earlier run's weights (peft's load_peft_weights + set_peft_model_state_dict)
  as the policy's start, in the LoRA shape core.model.resolve took from it; the log says which reference is used;
- `trainer_for`: DPOTrainer / ORPOTrainer / KTOTrainer with DPOConfig / ORPOConfig / KTOConfig built from the same
  TrainingArguments memtune gives SFT (core/config/arguments.py), plus the stage's own fields;
- `summary_part`: the reward metrics TRL logged (core/train/rewards.py) in summary.json, those of its evals on the
  validation pairs (core/data/pairs.py holds them out as SFT holds out rows; TRL evaluates them as eval_dataset) too.

The reference model: TRL, given a peft model and no ref_model, copies the adapter as a frozen "ref" adapter (its
`use_adapter(model, adapter_name="ref")`: adapter-sized memory, never a second copy of the base). With init_adapter
that copy is the standard DPO reference, the SFT model the stage starts from, and memtune keeps it. From a fresh
adapter (B = 0) the copy equals the base, so memtune removes it right after the trainer is made and TRL takes its
other path, the base with the adapter disabled (`adapter_name=None`). ORPO has no reference. trainer.build_trainer
then gives this trainer what every run's trainer gets (LoRA+'s optimizer, memtune's log callbacks, FSDP's wrap policy).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Protocol

from core.config import arguments
from core.config.settings import ConfigError, Problem
from core.config.slices import DataSlice, LoraSlice, ModelSlice, PlaceSlice, StageSlice, TrainerSlice
from core.messages import keyed
from core.model import load as model_lib
from core.model.resolve import adapter_dir
from core.runs.events import EventSink, make_event
from core.train import grpo
from core.train.host import counted_once
from core.train.rewards import eval_rewards, grpo_summary, reward_summary


class _Started(LoraSlice, StageSlice, Protocol):
    """Where the policy starts: init_adapter and the LoRA shape it was resolved to."""


class _Objective(DataSlice, StageSlice, Protocol):
    """The stage's own arguments: its loss, beta and the pairs' length."""


class _Staged(ModelSlice, DataSlice, StageSlice, TrainerSlice, PlaceSlice, Protocol):
    """A stage's trainer: its TRL config (the step, evals, tracker) and the stage's own arguments."""


def trainer_classes(stage: str) -> tuple[type, type]:
    """(trainer, config) of TRL for `stage`: ORPO lives in trl.experimental in TRL 1.x."""
    if stage == "dpo":
        from trl import DPOConfig, DPOTrainer

        return DPOTrainer, DPOConfig
    if stage == "kto":
        from trl import KTOConfig, KTOTrainer

        return KTOTrainer, KTOConfig
    if stage == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        return counting_pairs(ORPOTrainer), ORPOConfig
    raise ValueError(f"no preference trainer for stage {stage!r}")


@functools.cache  # one class per trainer class, not one per run
def counting_pairs(trainer_class: type) -> type:
    """`trainer_class` whose token count (state.num_input_tokens_seen: tokens/s, summary.json's train_tokens) holds
    the pairs' sequences. The Trainer counts the batch's `input_ids` (model.main_input_name); ORPO's batch has
    none, only `chosen_input_ids` and `rejected_input_ids` (each the prompt and its answer) with their attention
    masks, so it counted 0. Each side is handed to the Trainer's own counting as the batch it would read (its
    non_padding / all setting and the gather across processes stay the Trainer's): the prompt + chosen and
    prompt + rejected tokens, as DPO's batch (both sides in `input_ids`) counts them."""
    class CountingPairs(trainer_class):
        def _track_num_input_tokens(self, inputs):
            name = getattr(self.model, "main_input_name", "input_ids")
            if name in inputs or "chosen_input_ids" not in inputs:
                return super()._track_num_input_tokens(inputs)
            for side in ("chosen", "rejected"):
                super()._track_num_input_tokens({name: inputs[f"{side}_input_ids"],
                                                 "attention_mask": inputs[f"{side}_attention_mask"]})

    CountingPairs.__name__ = CountingPairs.__qualname__ = trainer_class.__name__
    return CountingPairs


# --- hook 1: where the policy starts, and its reference -------------------------------------------------------
def start_from(model, cfg: _Started, emit: EventSink) -> None:
    """Load init_adapter's weights into the model's (trainable) adapter, and say which reference the stage uses."""
    folder = adapter_dir(cfg)
    if folder is not None:
        from peft import load_peft_weights, set_peft_model_state_dict

        from core.levers import expert_lora

        # LoRA on 4-bit experts: the file's ParamWrapper keys to this model's ExpertLoRA keys
        result = set_peft_model_state_dict(model, expert_lora.from_peft(model, load_peft_weights(str(folder))))
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing or result.unexpected_keys:  # a hand-edited adapter_config.json: refuse rather than half-load
            raise ConfigError([Problem.of("init_adapter", "problem.init_adapter_shape", path=str(folder),
                                          n=len(missing) + len(result.unexpected_keys))])
        emit(make_event("log", level="info", **keyed("log.pref.init_adapter", path=str(folder), r=cfg.lora_r,
                                                     alpha=cfg.lora_alpha,
                                                     modules=", ".join(cfg.lora_target_modules))))
    said = (grpo.reference_said(cfg, folder) if cfg.stage == "grpo" else
            keyed("log.pref.no_reference", stage=cfg.stage) if cfg.stage == "orpo" else
            keyed("log.pref.reference_adapter", stage=cfg.stage, path=str(folder)) if folder is not None else
            keyed("log.pref.reference", stage=cfg.stage))
    emit(make_event("log", level="info", **said))


# --- hook 2: the trainer --------------------------------------------------------------------------------------
def stage_kwargs(cfg: _Objective) -> dict[str, Any]:
    """The stage's own arguments on top of the TrainingArguments memtune builds for every run."""
    out: dict[str, Any] = {"beta": cfg.beta, "max_length": cfg.max_length}
    if cfg.stage == "dpo":
        out["loss_type"] = [cfg.dpo_loss_type]
        out["padding_free"] = False  # TRL 1.16's DPO pads pairs (its padding_free is off for now)
    if cfg.stage == "orpo":  # ORPO's collator reads the pairs' own columns: TRL warns unless the Trainer keeps them
        out["remove_unused_columns"] = False
    return out


def build_config(cfg: _Staged, output_dir: str | Path, console: bool = False, evaluate: bool = False,
                 run_dir: str | Path | None = None, cuda: bool | None = None):
    """The stage's TRL config: sft_kwargs (batch, accumulation, optimizer, precision, checkpointing ...; what the
    config class lacks, e.g. packing, is left out by installed_names) + eval + tracking + the stage's fields."""
    _, config_class = trainer_classes(cfg.stage)
    return arguments.trainer_config(config_class, cfg, output_dir,
                                    model_lib.use_cuda(cfg) if cuda is None else cuda, console, evaluate, run_dir,
                                    **stage_kwargs(cfg))


def trainer_for(cfg: _Staged, model, tokenizer, train_dataset, output_dir: Path, callbacks=(),
                console: bool = False, eval_dataset=None, cuda: bool | None = None):
    """trainer.build_trainer for a preference stage: TRL's trainer on the plan's rows, the reference being TRL's copy
    of init_adapter's adapter, or else the base with the adapter disabled (module docstring)."""
    trainer_class, _ = trainer_classes(cfg.stage)
    args = build_config(cfg, output_dir, console, eval_dataset is not None, output_dir.parent, cuda)
    trainer = counted_once(trainer_class)(model=model, args=args, train_dataset=train_dataset,
                                          eval_dataset=eval_dataset, processing_class=tokenizer,
                                          callbacks=list(callbacks))
    peft_config = getattr(trainer.model, "peft_config", {})
    if "ref" in peft_config and adapter_dir(cfg) is None:  # a fresh adapter's copy is the base: TRL then disables
        trainer.model.delete_adapter("ref")  # the adapter for the reference instead (module docstring)
    return trainer  # trainer.build_trainer adds what every run's trainer gets (LoRA+, the log's callbacks, FSDP)


def reference(cfg: StageSlice) -> str | None:
    """summary.json's "reference": what the stage's reference log-probabilities come from."""
    if cfg.stage == "orpo":
        return None
    return "init_adapter, frozen copy" if adapter_dir(cfg) is not None else "base model, adapter disabled"


# --- hook 3: the summary ---------------------------------------------------------------------------------------
def summary_part(cfg: StageSlice, trainer) -> dict[str, Any]:
    """summary.json's "stage" and "preference" (the reward metrics TRL logged) of a preference run; {} for sft."""
    if cfg.stage == "sft":
        return {}
    if cfg.stage == "grpo":  # its rewards, completion lengths and KL, as TRL logged them
        return {"stage": "grpo", "init_adapter": cfg.init_adapter or None, "reference": grpo.reference(cfg),
                "grpo": grpo_summary(trainer.state.log_history)}
    preference = reward_summary(trainer.state.log_history)
    evals = eval_rewards(trainer.state.log_history)
    if evals:  # the validation pairs' (summary.json["eval"] holds their eval losses, as an SFT run's)
        preference = {**(preference or {}), **evals}
    return {"stage": cfg.stage, "init_adapter": cfg.init_adapter or None,
            "reference": reference(cfg), "preference": preference}

