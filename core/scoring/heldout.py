"""Did it help? The held-out prompts answered greedily and scored: the base model, the parent adapter (a continued
run) and the new adapter, and a verdict that says plainly when the adapter scores lower than its parent or the base.

`score_model` answers with transformers' own generate (greedy, left-padded batches: core.data.validation's
generate_answers, the answers the Trainer's evaluations show) and scores each answer with a scorer
(core/scoring/scorers.py). The base is the same model with peft's `disable_adapter()`: never a second load. Before
training, the model with its starting adapter is the parent (init_adapter's weights); after training, the adapter.
`judge` compares the three means within a tolerance and says the verdict with a locale key.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from core.data.validation import generate_answers
from core.messages import Said
from core.scoring.scorers import SCORERS, bind

TOLERANCE = 0.02  # a difference of up to 2 held-out points in 100 is the same score: greedy answers on a few rows
KEEP_ANSWERS = 5  # answers kept per model in summary.json: enough to see what changed


@dataclass(frozen=True)
class Scored:
    scores: tuple[float, ...]  # per row, in the rows' order
    answers: tuple[str, ...]

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"mean": round(self.mean, 6), "n": len(self.scores), "scores": [round(s, 6) for s in self.scores],
                "answers": list(self.answers[:KEEP_ANSWERS])}


def prompt_ids(tokenizer: Any, row: dict[str, Any]) -> list[int]:
    """A row's prompt as token ids: `prompt_ids` as the row plan cut them (core.data.validation.samples), else its
    `prompt` text tokenized, the tokenizer's BOS added unless the text already starts with it (a chat template's)."""
    if row.get("prompt_ids") is not None:
        return [int(i) for i in row["prompt_ids"]]
    text = str(row["prompt"])
    bos = getattr(tokenizer, "bos_token", None)
    return tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]


def batches(lengths: Sequence[int], max_new_tokens: int, batch_size: int, tokens: int | None = None) -> list[range]:
    """Consecutive rows per generate call: at most `batch_size`, and (with `tokens`) no more than fit `tokens`
    left-padded tokens (rows x (longest prompt + max_new_tokens)), one row at least. Fixed by the prompts' lengths
    alone, so the same rows always meet the same batches (greedy answers then repeat exactly)."""
    out, start = [], 0
    while start < len(lengths):
        stop, longest = start + 1, lengths[start]
        while stop < len(lengths) and stop - start < max(1, batch_size):
            wider = max(longest, lengths[stop])
            if tokens is not None and (stop + 1 - start) * (wider + max_new_tokens) > tokens:
                break
            stop, longest = stop + 1, wider
        out.append(range(start, stop))
        start = stop
    return out


def score_model(model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], scorer: Callable[[str, str], float] | str,
                max_new_tokens: int = 32, batch_size: int = 8, tokens: int | None = None) -> Scored:
    """Each row's greedy answer (at most `max_new_tokens`) scored against its `reference`, in `batches` of rows per
    generate call; the same model, rows and batching give the same scores. `tokens`: the most tokens one generate
    call holds (a training run passes its micro-batch's, so scoring never needs more GPU memory than a training
    step). `scorer`: a bound scorer, or a scorer's name without options."""
    score = bind(scorer) if isinstance(scorer, str) else scorer
    prompts = [prompt_ids(tokenizer, row) for row in rows]
    answers: list[str] = []
    for batch in batches([len(p) for p in prompts], max_new_tokens, batch_size, tokens):
        answers += generate_answers(model, tokenizer, [prompts[i] for i in batch], max_new_tokens)
    scores = tuple(float(score(answer, str(row.get("reference", "")))) for answer, row in zip(answers, rows))
    return Scored(scores, tuple(answers))


def base_of(model: Any) -> contextlib.AbstractContextManager:
    """The base model inside the block: peft's disable_adapter() (every adapter off, the same weights); a model
    without adapters is the base already."""
    disable = getattr(model, "disable_adapter", None)
    return disable() if disable is not None else contextlib.nullcontext()


def score_start(model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]], scorer: Callable[[str, str], float],
                continued: bool, max_new_tokens: int = 32, batch_size: int = 8,
                tokens: int | None = None) -> dict[str, Scored]:
    """Before training: {"base": ...} and, for a continued run (its adapter loaded from init_adapter), "parent"."""
    with base_of(model):
        scored = {"base": score_model(model, tokenizer, rows, scorer, max_new_tokens, batch_size, tokens)}
    if continued:
        scored["parent"] = score_model(model, tokenizer, rows, scorer, max_new_tokens, batch_size, tokens)
    return scored


@dataclass(frozen=True)
class Verdict:
    kind: str  # better | same | worse_parent | worse_base
    message: Said  # the verdict with its key, in the page's language on the page
    base: float
    adapter: float
    parent: float | None = None
    tolerance: float = TOLERANCE

    @property
    def worse(self) -> bool:
        return self.kind.startswith("worse")

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.kind, "worse": self.worse, "base": self.base, "parent": self.parent,
                "adapter": self.adapter, "tolerance": self.tolerance, "key": self.message.key,
                "params": self.message.params, "message": str(self.message)}


def verdict_kind(adapter: float, base: float, parent: float | None = None, tolerance: float = TOLERANCE) -> str:
    """Worse than the parent first (a continued run is judged against where it started), then than the base; better
    or the same against the parent where there is one, else the base."""
    if parent is not None and adapter < parent - tolerance:
        return "worse_parent"
    if adapter < base - tolerance:
        return "worse_base"
    return "better" if adapter > (base if parent is None else parent) + tolerance else "same"


TRAINED_SOURCES = ("train", "demo")  # rows the run trained on (core/train/data.py heldout_rows): never called held-out


def verdict_key(key: str, source: str | None) -> str:
    """The verdict's locale key for rows from `source`: score.verdict.<kind> for held-out rows, its
    score.verdict.trained.<kind> twin for rows the run trained on (a summary written before the twins is said
    rightly too)."""
    prefix, trained = "score.verdict.", "score.verdict.trained."
    if source in TRAINED_SOURCES and key.startswith(prefix) and not key.startswith(trained):
        return trained + key[len(prefix):]
    return key


def judge(adapter: float, base: float, parent: float | None = None, tolerance: float = TOLERANCE,
          scorer: str = "exact", n: int = 0, source: str = "validation") -> Verdict:
    """The verdict on the three held-out means (fractions 0-1), said with its key: `scorer` names the scorer (its
    label is said in the page's language), `n` the scored rows, `source` where they come from (rows it trained on
    are not called held-out: verdict_key)."""
    kind = verdict_kind(adapter, base, parent, tolerance)
    label = {"key": SCORERS[scorer].label if scorer in SCORERS else "score.name.python", "params": {}}
    words = dict(scorer=label, adapter=100 * adapter, base=100 * base, n=n, tolerance=100 * tolerance)
    if kind == "worse_parent":
        key, words["parent"] = "worse_parent", 100 * parent
    elif kind == "worse_base":
        key = "worse_base"
    elif parent is not None:
        key, words["parent"] = ("better_parent" if kind == "better" else "same_parent"), 100 * parent
    else:
        key = "better" if kind == "better" else "same"
    trained = source in TRAINED_SOURCES  # verdict_key's twin, written out: every key a message can take is readable
    message = Said(f"score.verdict.trained.{key}" if trained else f"score.verdict.{key}", **words)
    return Verdict(kind, message, base, adapter, parent, tolerance)
