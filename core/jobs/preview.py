"""What a data preview shows, worked out where a tokenizer may be loaded (the preview child, core/jobs/act.py kind
"preview"; in-process for a caller without an app), and answered as JSON the page renders (ui/data.py): the web server
never imports transformers or torch.

The answer is one of
- {"error": "data" | "read" | "tokenizer", "words": {message, key/params or problems}}: the preview's place says why;
- {"stage": "sft", "split", "plan", "notes", "longest", "heldout"}: the plan's counts, lengths, outcomes and examples
  (each text that carries a key as its words), the run's changes for this model, the longest row in tokens (the
  estimate's), and up to three rows the held-out scorer would score (heldout_sample: the scorer's preview);
- {"stage": "pairs", "split", "lines"}: a preference stage's run-log lines on its pairs;
- {"stage": "images", "plan", "notes", "longest", "heldout", "rows"}: image rows planned as the vision run plans them
  (core.data.images.plan_images: the processor's own token counts), and the first rows each with its images'
  thumbnails (data: addresses, made here from the checked images), the exact text that trains around its image
  tokens, and its token and image-token counts.
Every text is its words (core.messages.words_of: key and params when it has them), said in the page's language there.
What it reads and plans is bounded by `limit` (core.data.read.PREVIEW_LIMIT, or None: the whole split).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Protocol, TypeVar

from core.config.settings import PREFERENCE_STAGES, ConfigError, Problem, TrainConfig
from core.config.slices import DataSlice, LoraSlice, Loading, ModelSlice, StageSlice, TrainerSlice
from core.data.images import has_images
from core.messages import Said, fields_of, words_of

Phase = Callable[[Said, "float | None"], None]  # (what the bar says, how far: 0..1 or None)
PLAN_FIELDS = ("source", "format", "max_length", "long_prompts", "packing", "n_source", "counts", "lengths",
               "reasons", "n_packs", "turns")


class _Rows(ModelSlice, LoraSlice, DataSlice, StageSlice, TrainerSlice, Protocol):
    """An SFT preview's: the rows, held out and planned with the model's tokenizer, and the layers LoRA reaches;
    image rows with the model's processor, for stage sft only."""


class _Pairs(ModelSlice, DataSlice, StageSlice, TrainerSlice, Protocol):
    """A preference preview's: the pairs its stage needs, held out and planned with the model's tokenizer."""


class _Adapted(ModelSlice, LoraSlice, DataSlice, TrainerSlice, Protocol):
    """What the model's own adaptations read and change (packing, attention, gradient checkpointing) and its
    experts' LoRA."""


A = TypeVar("A", bound=_Adapted)


def failure(exc: BaseException) -> dict[str, Any]:
    """An exception's words: its key (or a ConfigError's problems) and its English message."""
    return {**fields_of(exc), "message": str(exc) if fields_of(exc) else f"{type(exc).__name__}: {exc}"}


def split_dict(held: Any) -> dict[str, Any]:
    """What the page's note on validation reads of a core.data.validation.Split."""
    return {"mode": held.mode, "source": held.source, "train": len(held.train_ids), "val": len(held.val_ids)}


def answer(config: dict[str, Any], limit: Any = None, phase: Phase | None = None) -> dict[str, Any]:
    """The preview of `config` (a TrainConfig's dict), as the module's docstring says."""
    cfg = TrainConfig.from_dict(config)
    said = phase or (lambda words, progress: None)
    return as_json(pairs(cfg, limit, said) if cfg.stage in PREFERENCE_STAGES else sft(cfg, limit, said))


def as_json(value: Any) -> Any:
    """`value` as the child's event file carries it (numpy's numbers as numbers): the same whether it crossed from a
    child or was made in-process."""
    return json.loads(json.dumps(value, default=lambda x: x.item() if hasattr(x, "item") else str(x)))


def sft(cfg: _Rows, limit: Any, said: Phase) -> dict[str, Any]:
    """The file read and checked first, without a tokenizer (an empty, non-UTF-8 or malformed file is named as such
    even when the model's tokenizer cannot be loaded), then the rows planned as the run will."""
    from core.data.plan import DataError, check_data, plan_rows
    from core.data.validation import split

    try:
        said(Said("preview.reading"), 0.0)
        raw, fmt = check_data(cfg, limit)
    except DataError as exc:
        return {"error": "data", "words": failure(exc)}
    except Exception as exc:  # noqa: BLE001 - the page stays alive whatever the data holds
        return {"error": "read", "words": failure(exc)}
    if has_images(raw):
        return images(cfg, raw, limit)
    try:
        tokenizer = load_tokenizer(cfg)
    except TokenizerError as exc:
        return {"error": "tokenizer", "words": failure(exc.__cause__)}
    try:
        held = split(cfg, raw, fmt, limit=limit)  # as the engine does: held-out rows are not in the plan
        # the run's own changes for this model (unpacked rows...) first, from its meta-device tree
        cfg, model_lines, tree = model_changes(cfg)
        words = Said("preview.tokenizing")
        plan = plan_rows(cfg, tokenizer, held.train, fmt, n_examples=3, progress=lambda f: said(words, f))
        notes = [*plan.notes, *filter(None, [plan.describe_turns()])]
        lines = [words_of(n) for n in notes] + [lora_line(cfg, tree)] + model_lines
        examples = [{**ex, **({"note": words_of(ex["note"])} if ex.get("note") else {})} for ex in plan.examples]
        return {"stage": "sft", "split": split_dict(held), "longest": int(plan.longest_row), "notes": lines,
                "plan": {**{k: getattr(plan, k) for k in PLAN_FIELDS}, "lengths": [int(n) for n in plan.lengths],
                         "examples": examples}, "heldout": heldout_sample(cfg, held, tokenizer, plan)}
    except DataError as exc:
        return {"error": "data", "words": failure(exc)}
    except Exception as exc:  # noqa: BLE001
        return {"error": "read", "words": failure(exc)}


IMAGE_ROWS = 4  # image rows the preview shows, each with its thumbnails


def images(cfg: _Rows, raw: Any, limit: Any) -> dict[str, Any]:
    """Image rows' preview, planned as core/train/data.py's read_images plans them: an sft stage and an image-text
    model, every image checked (all problems at once: a "data" error), every row counted by the model's processor."""
    from core.data.images import plan_images, thumbnail, trained_text
    from core.data.plan import DataError, Naming, check_data
    from core.model.load import is_vision_model, load_processor, resolve_model_path
    from core.runs.public import is_public

    try:
        if cfg.stage != "sft":
            raise DataError("data.err.images_stage", stage=cfg.stage)
        try:
            path = resolve_model_path(cfg)
            vision = is_vision_model(cfg, path)
            processor = load_processor(cfg, path) if vision else None
        except Exception as exc:  # noqa: BLE001 - a ModelError, an OSError, a ValueError: the model's own words
            return {"error": "tokenizer", "words": failure(exc)}
        if not vision:
            raise DataError("data.err.images_text_model", model=cfg.model, dataset=cfg.dataset)
        plan = plan_images(cfg.dataset, cfg.max_length, processor, raw, Naming(cfg.dataset).where, is_public())
        heldout = 0
        if cfg.validation_data.strip():
            held = cfg.replace(dataset=cfg.validation_data.strip(), dataset_split=cfg.validation_split or "train")
            held_raw, _ = check_data(held, limit)
            heldout = plan_images(held.dataset, cfg.max_length, processor, held_raw, Naming(held.dataset).where,
                                  is_public()).n_source
    except DataError as exc:
        return {"error": "data", "words": failure(exc)}
    except Exception as exc:  # noqa: BLE001
        return {"error": "read", "words": failure(exc)}
    _, model_lines, tree = model_changes(cfg)
    rows = [{"row": i + 1, "tokens": plan.lengths[i], "image_tokens": plan.image_tokens[i],
             "reason": "kept" if plan.lengths[i] <= plan.max_length else "dropped_long",
             "thumbs": [thumbnail(image) for image in row.images], "text": trained_text(processor, row)}
            for i, row in enumerate(plan.rows[:IMAGE_ROWS])]
    notes = [words_of(n) for n in [plan.describe(), *plan.notes]] + [lora_line(cfg, tree)] + model_lines
    return {"stage": "images", "longest": int(plan.longest_row), "notes": notes, "rows": rows,
            "heldout": {"n": heldout, "source": cfg.validation_data.strip()},
            "plan": {"n_source": plan.n_source, "n_train": plan.n_train, "max_length": plan.max_length,
                     "lengths": [int(n) for n in plan.lengths], "image_tokens": [int(n) for n in plan.image_tokens],
                     "refusal": words_of(plan.refusal()) if plan.refusal() else None}}


SAMPLE_ROWS = 3  # rows the held-out scorer's preview shows
SAMPLE_CHARS = 300  # of each prompt and reference: the preview stays small


def heldout_sample(cfg: DataSlice, held: Any, tokenizer: Any, plan: Any) -> dict[str, Any]:
    """The held-out scorer's preview rows: the first SAMPLE_ROWS the run's score answers (core.infer.heldout_rows,
    the run's own choice of rows) with the first rows of the validation part planned as the run plans them, each
    {row, prompt, reference} cut to SAMPLE_CHARS. Plain-text rows have no reference and give none."""
    import dataclasses

    from core.data.plan import plan_rows
    from core.data.validation import val_config
    from core.infer import heldout_rows

    validation = None
    if held.val is not None and len(held.val):
        some = held.val.select(range(min(SAMPLE_ROWS, len(held.val))))
        validation = plan_rows(val_config(cfg), tokenizer, some, held.val_format, n_examples=0)
    rows, source = heldout_rows(dataclasses.replace(plan, validation=validation), tokenizer, cfg.dataset,
                                SAMPLE_ROWS)
    return {"source": source, "rows": [{"row": r["row"], "prompt": r["prompt"][-SAMPLE_CHARS:],
                                        "reference": r["reference"][:SAMPLE_CHARS]} for r in rows]}


def pairs(cfg: _Pairs, limit: Any, said: Phase) -> dict[str, Any]:
    """A preference stage's preview: what is held out for validation, and the run log's lines on its pairs."""
    from core.data.pairs import check_pairs, plan_pairs, split_pairs
    from core.data.read import DataError

    try:
        said(Said("preview.reading"), 0.0)
        raw, fmt = check_pairs(cfg, limit)
        held = split_pairs(cfg, raw, fmt, limit)
    except DataError as exc:
        return {"error": "data", "words": failure(exc)}
    try:
        tokenizer = load_tokenizer(cfg)
    except TokenizerError as exc:
        return {"error": "tokenizer", "words": failure(exc.__cause__)}
    try:
        plan = plan_pairs(cfg, tokenizer, raw, fmt, held)
    except DataError as exc:
        return {"error": "data", "words": failure(exc)}
    lines = [words_of(line) for _, line in plan.log_lines() if line is not held.why]  # the split's note says it
    return {"stage": "pairs", "split": split_dict(held), "lines": lines}


class TokenizerError(Exception):
    """The model's tokenizer cannot be loaded (its cause: a ModelError, an OSError, a ValueError)."""


def load_tokenizer(cfg: ModelSlice) -> Any:
    from core.model.load import ModelError, load_tokenizer as load

    try:
        return load(TrainConfig(model=cfg.model, trust_remote_code=cfg.trust_remote_code))
    except (ModelError, OSError, ValueError) as exc:
        raise TokenizerError(exc) from exc


def model_changes(cfg: A) -> tuple[A, list[dict[str, Any]], Any]:
    """What the run will change for this model before loading, from its config.json and meta-device tree, as the run
    log's words: the pre-flight's adaptations (core.model.families.adapt: rows unpacked for a stateful mixer, another
    attention path), and the experts' weights that get LoRA with lora_experts. `cfg` comes back as the run will train
    it, so the plan shows the rows as they will train; and the tree (None when it cannot be built)."""
    from core.levers.experts import expert_parameters
    from core.model import families
    from core.model.load import refuse_lora_experts, resolve_model_path, skeleton

    tree = None
    try:
        tree = skeleton(cfg, resolve_model_path(cfg))  # the run's own: a model that is no causal LM refused by name
        changes, said = families.adapt(cfg, families.traits(tree.config, tree))
        lines = [words_of(s) for s in said]
        if cfg.lora_experts:
            refuse_lora_experts(cfg, tree)  # as the run refuses it, with the same reason
            names = expert_parameters(tree)
            if not names:
                raise ConfigError([Problem.of("lora_experts", "problem.lora_experts_dense", model=cfg.model)])
            lines.append(words_of(Said("log.moe.lora_experts", params=", ".join(names))))
        return (cfg.replace(**changes) if changes else cfg), lines, tree
    except ConfigError as exc:
        return cfg, [failure(exc)], tree
    except Exception:  # noqa: BLE001 - the tree cannot be built: lora_line says why, once
        return cfg, [], tree


def lora_line(cfg: Loading, tree: Any = None) -> dict[str, Any]:
    """Which layers get LoRA and how many parameters train (the run log's line: renamed, fused and shared-name
    layers), from the model's module tree (no weights loaded): `tree` when the caller built it, else built here."""
    from core.model.load import lora_targets

    try:
        return words_of((lora_targets(cfg, model=tree) if tree is not None else lora_targets(cfg)).describe())
    except ConfigError as exc:
        return failure(exc)
    except Exception as exc:  # noqa: BLE001 - the preview stays useful when the tree cannot be built
        return words_of(Said("preview.lora_unknown", error=f"{type(exc).__name__}: {exc}"))
