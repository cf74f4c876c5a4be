"""Image rows through TRL's own vision support: SFTTrainer with the model's processor as processing_class, whose
DataCollatorForVisionLanguageModeling opens each batch's images, applies the processor's training chat template and
trains only the assistant's turns (assistant_only_loss; image tokens and prompts carry no loss). And the held-out
images answered greedily before and after training, scored exactly, as the text demo's n/100.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from trl import SFTConfig, SFTTrainer

from core.config import arguments
from core.config.slices import DataSlice, Loading, ModelSlice, PlaceSlice, TrainerSlice
from core.data.images import ImageRow, generation_inputs


class _Configured(ModelSlice, DataSlice, TrainerSlice, PlaceSlice, Protocol):
    """The SFT run's TRL config, as a text run's, with the vision collator's settings."""


class _Built(Loading, DataSlice, TrainerSlice, PlaceSlice, Protocol):
    """The vision run's trainer: its TRL config and the adapter it trains."""


def is_vision(train_dataset: Any) -> bool:
    return getattr(train_dataset, "memtune_images", False)


def build_config(cfg: _Configured, output_dir: str | Path, cuda: bool, console: bool = False) -> SFTConfig:
    return arguments.trainer_config(SFTConfig, cfg, output_dir, cuda, console, False, Path(output_dir).parent,
                                    **arguments.vision_kwargs())


def build_trainer(cfg: _Built, model, processor, train_dataset, output_dir: str | Path, callbacks=(),
                  console: bool = False, cuda: bool = False) -> SFTTrainer:
    """TRL's SFTTrainer on image rows: the processor is the processing class, so TRL builds its vision collator."""
    return SFTTrainer(model=model, args=build_config(cfg, output_dir, cuda, console), train_dataset=train_dataset,
                      processing_class=processor, callbacks=list(callbacks))


def reference(row: ImageRow) -> str:
    """The row's last assistant answer, as text."""
    last = [m for m in row.messages if m["role"] == "assistant"][-1]
    return "".join(p.get("text", "") for p in last["content"] if p["type"] == "text").strip()


def answer(model, processor, rows: list[ImageRow], max_new_tokens: int = 8) -> list[str]:
    """Greedy answers to each row's question (its messages before the last assistant turn), one row at a time."""
    import torch

    answers = []
    was_training = model.training
    model.eval()
    for row in rows:
        last = max(i for i, m in enumerate(row.messages) if m["role"] == "assistant")
        inputs = generation_inputs(processor, ImageRow(row.messages[:last], row.images))
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=processor.tokenizer.pad_token_id)
        answers.append(processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:],
                                                  skip_special_tokens=True).strip())
    if was_training:
        model.train()
    return answers


def score(model, processor, rows: list[ImageRow], scorer, max_new_tokens: int):
    """Each row's greedy answer scored against its reference (core.scoring's Scored, as a text run's held-out)."""
    from core.scoring.heldout import Scored

    answers = answer(model, processor, rows, max_new_tokens)
    return Scored(tuple(float(scorer(a, reference(r))) for a, r in zip(answers, rows)), tuple(answers))


def heldout_rows(plan, n: int) -> tuple[list[ImageRow], str]:
    """(rows, source) a vision run scores: validation_data's image rows ("validation"), else its first training
    rows ("train", never called held-out)."""
    if plan.heldout is not None:
        return plan.heldout.rows[:n], "validation"
    return [plan.rows[i] for i in plan.kept][:n], "train"
