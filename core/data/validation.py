"""Validation: which rows are held out, and what the model answers on a few of them at each eval.

`split(cfg, raw)` runs BEFORE the row plan: it divides the loaded split into training and validation rows (a seeded
share, or a separate file / split read like any dataset), then `plan_parts` plans each part with
`core.data.plan.plan_rows`, so validation rows get exactly the training rows' formatting, truncation and accounting,
and declares the validation part in the training plan (DataPlan.held, DataPlan.validation). `samples(plan, ...)`
picks the prompts answered greedily at each eval; `generate_answers` answers them (core/train/callbacks.py calls it from
the Trainer's own `on_evaluate`). The Trainer computes the eval loss itself (eval_dataset, eval_strategy).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, TypeVar

from core.config.settings import TrainConfig
from core.config.slices import DataSlice, ModelSlice, TrainerSlice
from core.data.plan import DataPlan, check_data, plan_rows
from core.data.read import DataError, Limit
from core.messages import Said

MIN_ROWS_FOR_SHARE = 200  # with the default share, a smaller split trains on every row: 5% of it would be a handful
DEFAULT_SHARE = TrainConfig.__dataclass_fields__["validation_share"].default  # only the default steps aside


class _Held(DataSlice, TrainerSlice, Protocol):
    """The data and the seed its validation share is drawn with."""


class _Rows(DataSlice, ModelSlice, Protocol):
    """The rows and the model whose tokenizer plans them."""


D = TypeVar("D", bound=DataSlice)


@dataclass
class Split:
    train: Any  # datasets.Dataset: the rows that may train
    val: Any | None  # the validation rows (None: no validation)
    val_format: str | None
    train_ids: list[int]  # each part's rows as indices of the loaded split (for a separate file: of that file)
    val_ids: list[int]
    mode: str  # off | share | separate
    why: str  # one line for the log and the page: what was held out, or why nothing was
    source: str = ""  # the validation data (the dataset itself for a share)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "held_out_rows": len(self.val_ids) if self.mode == "share" else 0,
                "validation_rows": len(self.val_ids), "train_part_rows": len(self.train_ids),
                "source": self.source, "why": self.why}


def separate(cfg: DataSlice) -> bool:
    """A validation file or split was given (it wins over validation_share)."""
    return bool(cfg.validation_data.strip() or cfg.validation_split.strip())


def val_config(cfg: D) -> D:
    """The config whose dataset fields name the validation data, for core.data.plan's readers and plan."""
    if not separate(cfg):
        return cfg
    return cfg.replace(dataset=cfg.validation_data.strip() or cfg.dataset,
                       dataset_split=cfg.validation_split.strip() or "train")


def split(cfg: _Held, raw: Any, fmt: str, read: Callable[..., tuple[Any, str]] = check_data,
          limit: Limit | None = None) -> Split:
    """Divide the loaded training split (`raw`, of format `fmt`) into the part that trains and the validation part.
    `read` reads and checks a separate validation dataset as the training one was read: SFT rows (check_data), or a
    preference stage's pairs (core.data.pairs.check_pairs: the same split, the same shares, of pairs), within
    `limit` when given (a preview's: core.data.read.PREVIEW_LIMIT)."""
    everything = list(range(len(raw)))
    if separate(cfg):
        vcfg = val_config(cfg)
        val, vfmt = read(vcfg, limit)
        source = f"{vcfg.dataset} [{vcfg.dataset_split}]"
        why = Said("log.val_separate", n=len(val), source=source)
        kept = _not_in(raw, val)  # train[:90] + train[50:]: rows 50-89 would train while "never trained on"
        if len(kept) < len(raw):
            if not kept:
                raise DataError("data.err.val_is_train", total=len(raw), source=source,
                                train=f"{cfg.dataset} [{cfg.dataset_split}]")
            why = Said("msg.two", first=why, second=Said("log.val_overlap", n=len(raw) - len(kept), total=len(raw),
                                                         left=len(kept)))
            raw = raw.select(kept)
        return Split(raw, val, vfmt, kept, list(range(len(val))), "separate", why, source=source)
    if cfg.validation_share <= 0:
        return Split(raw, None, None, everything, [], "off", Said("log.val_off"))
    if len(raw) < MIN_ROWS_FOR_SHARE and cfg.validation_share == DEFAULT_SHARE:  # a share the user chose is kept
        return Split(raw, None, None, everything, [], "off",
                     Said("log.val_small", rows=len(raw), min=MIN_ROWS_FOR_SHARE))
    n_val = max(1, round(cfg.validation_share * len(raw)))
    if n_val >= len(raw):  # a tiny split (1 row at 50%): refused by name rather than planned with no row to train
        raise DataError("data.err.val_share_all", total=len(raw), train=f"{cfg.dataset} [{cfg.dataset_split}]",
                        share=round(100 * cfg.validation_share))
    held = sorted(random.Random(cfg.seed).sample(everything, n_val))  # seeded: a resumed run holds out the same rows
    held_set = set(held)
    kept = [i for i in everything if i not in held_set]
    return Split(raw.select(kept), raw.select(held), fmt, kept, held, "share",
                 Said("log.val_share", n=n_val, total=len(raw), share=round(100 * cfg.validation_share), seed=cfg.seed),
                 source=cfg.dataset)


def _not_in(raw: Any, val: Any) -> list[int]:
    """The indices of `raw`'s rows that are not also rows of `val` (same columns, same values)."""
    def rows(ds: Any):
        names = sorted(ds.column_names)
        for batch in ds.iter(batch_size=1000):
            yield from (repr(row) for row in zip(*(batch[n] for n in names)))

    if sorted(raw.column_names) != sorted(val.column_names):
        return list(range(len(raw)))
    held = set(rows(val))
    return [i for i, row in enumerate(rows(raw)) if row not in held]


def plan_parts(cfg: _Rows, tokenizer: Any, held: Split, fmt: str,
               progress: Callable[[float], None] | None = None) -> DataPlan:
    """The plan of the rows that train, its validation part declared in it: what was held out (`held`, from `split`)
    and the validation rows' own plan, made alike (formatting, truncation, every row counted). `progress`: the
    tokenizing of the rows that train (plan_rows), most of the work."""
    vcfg = val_config(cfg)
    plan = plan_rows(cfg, tokenizer, held.train, fmt, n_examples=0, progress=progress)
    val = None
    if held.val is not None:
        val = plan_rows(vcfg, tokenizer, held.val, held.val_format, n_examples=0)
    return dataclasses.replace(plan, held=held, validation=val)


def samples(plan: DataPlan, tokenizer: Any, n: int) -> list[dict[str, Any]]:
    """The first `n` validation rows that train, as {row, prompt_ids, prompt, reference}: the prompt exactly as the
    row plan tokenized and cut it, the reference the answer tokens it trains on (`prompts_and_answers`). Plain-text
    rows have no prompt and give none. A preference stage's validation pairs (core.data.pairs.PairPlan) give their
    own: the prompt as TRL tokenizes it, the chosen answer as the reference."""
    if hasattr(plan, "prompt_samples"):  # a PairPlan (duck-typed: core.data.pairs imports this module)
        return plan.prompt_samples(tokenizer, n)
    return prompts_and_answers(plan.input_ids, plan.labels, tokenizer, n)


def prompts_and_answers(input_ids: Any, labels: Any, tokenizer: Any, n: int | None = None) -> list[dict[str, Any]]:
    """Planned rows split where their labels start: {row, prompt_ids, prompt, reference}, the prompt the tokens the
    labels mask (-100), the reference the answer tokens the row trains on, both decoded without special tokens. Rows
    without a prompt (plain text) give none; the first `n` rows that have one (None: all). The held-out rows and
    GRPO's prompts (core/train/grpo.py) are split here."""
    import numpy as np

    out = []
    for i, (ids, masks) in enumerate(zip(input_ids, labels)):
        if n is not None and len(out) >= n:
            break
        n_prompt = int(np.count_nonzero(np.asarray(masks) == -100))
        if n_prompt == 0:
            continue
        prompt = [int(x) for x in ids[:n_prompt]]
        out.append({"row": i, "prompt_ids": prompt, "prompt": tokenizer.decode(prompt, skip_special_tokens=True),
                    "reference": tokenizer.decode([int(x) for x in ids[n_prompt:]], skip_special_tokens=True)})
    return out


def generate_answers(model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
    """Greedy answers to `prompts` (token ids), in one left-padded batch, at most `max_new_tokens` each."""
    import torch
    from transformers import GenerationConfig

    if not prompts:
        return []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    device = next(p for p in model.parameters()).device
    gen = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                           eos_token_id=tokenizer.eos_token_id, use_cache=True)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gen)
    finally:
        model.train(was_training)
    return [a.strip() for a in tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)]
