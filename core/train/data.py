"""The recipe's data setup: the rows read and checked, the validation part held out, every row planned, the LoRA
targets announced on the model's module tree, and the plan refused where it cannot train.

The data comes first: a broken file is reported as such before any model is looked up or downloaded. The model's
path, its tokenizer and its module tree on the meta device (core/model/load.py) are found here too, since the rows
are planned with the tokenizer and the run is resolved (core/model/resolve.py) on the tree.
"""

from __future__ import annotations

from typing import Any, Protocol

from core.checks import check_planned
from core.config.settings import PREFERENCE_STAGES, ConfigError, Problem, heldout_options
from core.config.slices import DataSlice, Loading, ModelSlice, StageSlice, TrainerSlice, Training
from core.data import validation
from core.data.pairs import PairPlan, check_pairs, plan_pairs, split_pairs
from core.data import images
from core.data.plan import DataError, DataPlan, Naming, check_data
from core.model import families
from core.model import load as model_lib
from core.model.resolve import ResolvedRun
from core.runs.public import is_public
from core.runs.events import EventSink, make_event
from core.messages import words_of
from core.scoring.scorers import bind
from core.train.callbacks import phase


class _Read(ModelSlice, DataSlice, StageSlice, TrainerSlice, Protocol):
    """Reading and planning the rows: their source and format, the stage's (pairs or not), the held-out part's
    seed, and the model whose tokenizer plans them."""


class _Announced(Loading, TrainerSlice, Protocol):
    """The LoRA targets on the model's tree, and the levers that need validation rows (keep_best, early stopping)."""


def plan_data(cfg: Training, emit: EventSink) -> tuple[DataPlan | PairPlan, Any, str, Any]:
    """read_plan then announce, for a config taken as it trains: (plan, tokenizer, model path, the model's module
    tree on the meta device)."""
    plan, tokenizer, path, tree = read_plan(cfg, emit)
    announce(cfg, plan, tree, emit)
    return plan, tokenizer, path, tree


def read_plan(cfg: _Read, emit: EventSink) -> tuple[DataPlan | PairPlan, Any, str, Any]:
    """Read and check the data, find the model and its tokenizer, plan every row: (plan, tokenizer, model path, the
    model's module tree on the meta device, for core.model.resolve).

    The validation rows are held out before the plan (they never reach plan.train_dataset()) and planned alike, as
    the plan's validation part. The caller refuses a plan with nothing to train (`checked`) before loading the
    model, keeping the plan for the failed run's summary."""
    # stages hook: preference rows (core/data/pairs.py), split for validation alike; GRPO's prompts and reference
    # answers are SFT rows (core/train/grpo.py)
    pairs = cfg.stage in PREFERENCE_STAGES
    with phase(emit, "tokenizing", "log.phase.reading", source=f"{cfg.dataset} [{cfg.dataset_split}]"):
        raw, fmt = check_pairs(cfg) if pairs else check_data(cfg)
        if not pairs and images.has_images(raw):  # image rows: the vision run's own plan
            return read_images(cfg, raw, emit)
        held = split_pairs(cfg, raw, fmt) if pairs else validation.split(cfg, raw, fmt)
    with phase(emit, "resolving", "log.phase.finding", model=cfg.model):
        path = model_lib.resolve_model_path(cfg, emit)
        tokenizer = model_lib.load_tokenizer(cfg, path)
    with phase(emit, "tokenizing", "log.phase.formatting", n=len(raw), format=fmt) as progressed:
        plan = (plan_pairs(cfg, tokenizer, raw, fmt, held) if pairs else
                validation.plan_parts(cfg, tokenizer, held, fmt, progressed))
    return plan, tokenizer, path, model_lib.skeleton(cfg, path)


def read_images(cfg: _Read, raw: Any, emit: EventSink) -> tuple[images.VisionPlan, Any, str, Any]:
    """read_plan for image rows: the model must be an image-text one and the stage sft; every image checked (all
    problems at once) before the model loads; the rows counted with the model's processor; validation_data's image
    rows kept as the held-out images the run scores before and after training. (plan, processor, path, tree)."""
    if cfg.stage != "sft":
        raise DataError("data.err.images_stage", stage=cfg.stage)
    with phase(emit, "resolving", "log.phase.finding", model=cfg.model):
        path = model_lib.resolve_model_path(cfg, emit)
        if not model_lib.is_vision_model(cfg, path):
            raise DataError("data.err.images_text_model", model=cfg.model, dataset=cfg.dataset)
        processor = model_lib.load_processor(cfg, path)
    with phase(emit, "tokenizing", "log.phase.formatting", n=len(raw), format="messages+images"):
        plan = images.plan_images(cfg.dataset, cfg.max_length, processor, raw, Naming(cfg.dataset).where, is_public())
        if cfg.validation_data.strip():
            held = cfg.replace(dataset=cfg.validation_data.strip(), dataset_split=cfg.validation_split or "train")
            held_raw, _ = check_data(held)
            plan.heldout = images.plan_images(held.dataset, cfg.max_length, processor, held_raw,
                                              Naming(held.dataset).where, is_public())
    return plan, processor, path, model_lib.skeleton(cfg, path)


def announce(cfg: _Announced, plan: DataPlan | PairPlan, tree, emit: EventSink) -> None:
    """The LoRA targets of `cfg` (the run that trains) on the module tree, before any weight loads: a name the
    model lacks is refused here (ConfigError listing its linear layers), and the log says what gets LoRA; then the
    data event and its log lines. A run that needs validation rows and has none is refused."""
    targets = model_lib.lora_targets(cfg, model=tree)
    plan.notes += [targets.describe(), *filter(None, [families.note(targets.model_type)])]
    said, counts, part, lines = plan.describe(), plan.to_dict(), plan.validation_dict(), plan.log_lines()
    emit(make_event("data", **words_of(said), **counts, validation=part))
    for level, line in lines:
        emit(make_event("log", level=level, **words_of(line)))
    if (cfg.keep_best or cfg.early_stopping_patience) and not plan.evaluates:  # a stage's are refused before
        raise DataError("data.err.no_validation_rows", why=plan.held.why)


def follow(plan: DataPlan | PairPlan, cfg: DataSlice) -> None:
    """The data plan trains as `cfg` does: no packs where its rows train unpacked."""
    if getattr(plan, "packing", False) and not cfg.packing:
        plan.packing, plan.n_packs = False, None


def checked(run: ResolvedRun, plan: DataPlan | PairPlan, world: int) -> None:
    """The plan refused where the run cannot train it: more steps than public mode allows (core.checks), or nothing
    to train (plan.refusal())."""
    check_planned(run.cfg, plan, world)  # public mode: the steps it plans, within the limit
    if plan.refusal():
        raise DataError("data.err.refusal", why=plan.refusal())


def samples(plan: DataPlan | PairPlan, tokenizer: Any, cfg: TrainerSlice) -> list[dict[str, Any]]:
    """The validation rows whose answers each eval shows (eval_samples of them); none without validation rows."""
    return validation.samples(plan.validation, tokenizer, cfg.eval_samples) if plan.evaluates else []


def heldout_scorer(cfg: TrainerSlice) -> Any:
    """The held-out scorer bound with its options (core.scoring.bind: checked once, in this process, a user's
    function imported here), or a ConfigError naming heldout_options / heldout_scorer; None when scoring is off."""
    if cfg.heldout_scorer == "off" or cfg.heldout_rows <= 0:
        return None
    try:
        return bind(cfg.heldout_scorer, **heldout_options(cfg.heldout_options))
    except ValueError as exc:  # a ScorerError (keyed) or JSON that is no object
        name = "heldout_options" if cfg.heldout_options.strip() else "heldout_scorer"
        raise ConfigError([Problem.of(name, "problem.heldout_scorer", scorer=cfg.heldout_scorer,
                                      why=str(exc))]) from None
