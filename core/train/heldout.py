"""The held-out score of a run ("did it help?"): the base model's, and the parent adapter's for a continued run, on
the held-out rows before training; the adapter's after; the verdict (core/scoring/heldout.py) in the log and in
summary.json's `heldout`. The recipe (core/train/recipe.py) calls `heldout_start` in setup and `heldout_end` in save.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from core.config.slices import DataSlice, StageSlice, TrainerSlice
from core.files import free_memory
from core.messages import Said, words_of
from core.runs.events import make_event
from core.data.images import ImageRow
from core.infer import heldout_rows
from core.scoring.heldout import TRAINED_SOURCES, Scored, base_of, judge, score_model, score_start
from core.train import vision
from core.train.callbacks import phase

HELDOUT_BATCH = 16  # held-out prompts per generate call


class _Scoring(DataSlice, StageSlice, TrainerSlice, Protocol):
    """The held-out score: its rows, scorer and answer length, and whether the run continues a parent adapter."""


class HeldOut:
    """The held-out rows of a run, their scorer and the scores before training (base, and parent)."""

    def __init__(self, rows: list[dict[str, Any]], source: str, scorer: Any, start: dict[str, Scored]) -> None:
        self.rows, self.source, self.scorer, self.start = rows, source, scorer, start


def unscored(emit, score, *args) -> Any:
    """`score(*args)`, or None and a warning when it fails: a held-out score that cannot be computed (a model whose
    generate fails, a user's scorer that raises) never costs the run its training or its adapter."""
    try:
        return score(*args)
    except Exception as exc:  # noqa: BLE001 - said, and the run goes on without a held-out score
        free_memory()
        emit(make_event("log", level="warning", **words_of(Said("log.heldout.failed", error=f"{type(exc).__name__}: "
                                                                                           f"{exc}"))))
        return None


def scoring_tokens(cfg: _Scoring) -> int:
    """The most tokens one scoring generate call may hold: a training micro-batch's (its rows x max_length). Without
    gradients, a prompt's KV cache and one layer's transient are smaller than what training keeps for the same
    tokens, so scoring stays under the training step's peak (the estimate's)."""
    return max(1, cfg.per_device_train_batch_size) * cfg.max_length


def heldout_start(cfg: _Scoring, plan, tokenizer, model, scorer, emit) -> HeldOut | None:
    """The base model's score on the held-out rows (peft's disable_adapter) and, for a run continued from
    init_adapter (its weights loaded), the parent's; said in the log. None when off (no scorer) or without rows."""
    images = getattr(plan, "images", False)
    wanted = cfg.heldout_rows if scorer is not None else 0
    if images and wanted > 0:  # image rows: answered with the processor (core/train/vision.py)
        rows, source = vision.heldout_rows(plan, wanted)
    else:
        rows, source = heldout_rows(plan, tokenizer, cfg.dataset, wanted)
    if not rows:
        return None
    continued = cfg.stage != "sft" and bool(cfg.init_adapter.strip())
    with phase(emit, "scoring", "log.phase.scoring", n=len(rows)):
        with torch.compiler.set_stance("force_eager"):  # as heldout_end says why
            if images:
                with base_of(model):
                    start = {"base": vision.score(model, tokenizer, rows, scorer, cfg.eval_max_new_tokens)}
            else:
                start = score_start(model, tokenizer, rows, scorer, continued, cfg.eval_max_new_tokens,
                                    HELDOUT_BATCH, scoring_tokens(cfg))
    params = dict(n=len(rows), base=100 * start["base"].mean, source={"key": f"score.source.{source}", "params": {}})
    if source in TRAINED_SOURCES:  # rows it trains on: never called held-out
        line = (Said("log.heldout.start_parent_trained", parent=100 * start["parent"].mean, **params) if continued
                else Said("log.heldout.start_trained", **params))
    else:
        line = (Said("log.heldout.start_parent", parent=100 * start["parent"].mean, **params) if continued
                else Said("log.heldout.start", **params))
    emit(make_event("log", level="info", **words_of(line)))
    return HeldOut(rows, source, scorer, start)


def heldout_end(cfg: _Scoring, held: HeldOut, model, tokenizer, emit) -> dict[str, Any]:
    """The adapter's score on the same rows, judged against the base and the parent: summary.json's `heldout`; the
    verdict in the log (a warning when the adapter scores lower)."""
    # eagerly (torch's own switch): compiled layers would compile again for every generated length, for the same answers
    with torch.compiler.set_stance("force_eager"):
        if held.rows and isinstance(held.rows[0], ImageRow):
            adapter = vision.score(model, tokenizer, held.rows, held.scorer, cfg.eval_max_new_tokens)
        else:
            adapter = score_model(model, tokenizer, held.rows, held.scorer, cfg.eval_max_new_tokens, HELDOUT_BATCH,
                                  scoring_tokens(cfg))
    base, parent = held.start["base"], held.start.get("parent")
    verdict = judge(adapter.mean, base.mean, parent.mean if parent else None, scorer=cfg.heldout_scorer,
                    n=len(held.rows), source=held.source)
    emit(make_event("log", level="warning" if verdict.worse else "info", **words_of(verdict.message)))
    return {"scorer": cfg.heldout_scorer, "rows": len(held.rows), "source": held.source, "base": base.to_dict(),
            "parent": parent.to_dict() if parent else None, "adapter": adapter.to_dict(),
            "verdict": verdict.to_dict()}
