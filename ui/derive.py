"""What the page derives from a config, without components: the machine, the memory prediction (core.estimate.predict),
the preset the settings match, and how many GPUs a run of them uses. Pure, so handlers and tests share it."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any, NamedTuple, Protocol, TypeVar

from core.config import presets
from core.config.settings import Hardware, TrainConfig, demo_config
from core.config.slices import DataSlice, ModelSlice, PlaceSlice, TrainerSlice, Training
from core.i18n import DEFAULT_LANGUAGE, EN, formatted, t
from ui.speed import preset_line

CUSTOM = "custom"  # the preset radio's value when the settings match no preset


class _Rows(ModelSlice, DataSlice, Protocol):
    """The data and the model that tokenizes it: what the measured longest row is kept under."""


class _Processes(ModelSlice, PlaceSlice, Protocol):
    """The device and the GPU count: how many processes a run starts here."""


class _Switched(ModelSlice, DataSlice, TrainerSlice, Protocol):
    """What the checklist's boxes switch: quantization and precision, the rows' length, batch and optimizer."""


class _Estimated(Training, PlaceSlice, Protocol):
    """What an estimate reads: the step's work and memory, and the processes it is spread over."""


C = TypeVar("C", bound=_Switched)
E = TypeVar("E", bound=_Estimated)


@lru_cache(maxsize=1)
def hardware() -> Hardware:
    return Hardware.detect()


def initial_config() -> TrainConfig:
    """With a CUDA GPU: the chapter's recipe. Without: the offline demo, so a visitor can train in a minute."""
    return TrainConfig() if hardware().cuda else demo_config()


def row_tokens(cfg: _Rows) -> int | None:
    """The dataset's longest row in tokens when the preview has measured it (estimates then use it), else None."""
    from core.data.plan import known_longest_row

    return None if cfg.packing else known_longest_row(cfg)


def run_gpus(cfg: _Processes | None) -> int:
    """How many of this machine's GPUs a run of `cfg` uses (0 on a CPU run): one process per GPU."""
    from core.gpus.distributed import processes_per_machine, runs_on_cpu

    n = hardware().n_gpus
    if cfg is None or runs_on_cpu(cfg, n):
        return 0
    return min(n, processes_per_machine(cfg, n) or 1)


def world_size(est: Any) -> int:
    """Processes of the run an estimate is for; the estimate's figures are per GPU (an older Estimate: one)."""
    return int(getattr(est, "world_size", 1) or 1)


def toggled(cfg: C, key: str, on: bool, memory: dict[str, Any] | None) -> C:
    """What ticking (on) or unticking a checklist box does: checklist.toggle, except that undoing this item's last
    tick or untick (its fields untouched since) gives back the user's values from before it: untick and re-tick
    "Reduce max_seq_length" and 384 stays 384. `memory`: the page's record of each box's last change."""
    from core.config import checklist

    last = (memory or {}).get(key)
    if last and all(getattr(cfg, f) == v for f, v in last["after"].items()):
        back = cfg.replace(**last["before"])
        if bool(checklist.BY_KEY[key].is_on(back)) == on:
            return back
    return checklist.toggle(cfg, key, on)


# --- the hypothetical card ("Fit to my GPU" without a GPU) -----------------------------------------------------------
DEFAULT_BUDGET_GIB = 8.0  # the hypothetical card "Fit to my GPU" aims at where there is no GPU
BUDGET_GIB = (1, 2048)  # the cards it may aim at. Checked here, not by the Number's own bounds: Gradio's check raises
# in preprocess, which fails every output of the event (the poll's gauge and log, the checklist) with an English toast


def budget_problem(budget: float | None, lang: str = DEFAULT_LANGUAGE) -> str | None:
    """What is wrong with the hypothetical card's GiB, in the page's language, or None."""
    import math

    if budget is None:
        return t("fit.no_budget", lang)
    lo, hi = BUDGET_GIB
    if not math.isfinite(budget) or not lo <= budget <= hi:
        return t("fit.budget_range", lang, gib=formatted(budget, "g", lang), min=lo, max=hi)
    return None


def valid_budget(budget: float | None) -> float | None:
    """The hypothetical card's GiB when usable (the gauge then falls back to the default card)."""
    return None if budget_problem(budget) else float(budget)

class Prediction(NamedTuple):
    gib: float | None  # predicted NVML peak per GPU
    saves: dict[str, float]  # checklist item -> GiB it saves here
    gpus: int = 1  # the run's processes (world size): >1 means the figures are per GPU
    floor: float | None = None  # the peak of the smallest settings "Fit to my GPU" may choose (GiB per GPU)
    measuring: str | None = None  # the inspect child the page waits for (its key), while the formula stands in
    failed: tuple[str, ...] = ()  # measurements that failed (their errors): the formula stands in, named
    changes: tuple[dict, ...] = ()  # what the resolved run changes from the settings (field, before, after, key)
    busy: bool = False  # the inspect queue was full: the formula stands in until the next change asks again
    cpu_gib: float | None = None  # CPU memory the run needs where it keeps weights or activations there


def inspect_base(settings: dict[str, Any], gpus: int) -> str:
    """The settings an inspection answers for (`settings`: the config's to_dict), and the machine's GPUs and the
    run's (`gpus`: run_gpus), which the resolution reads."""
    said = json.dumps([settings, hardware().cuda, gpus], sort_keys=True, default=str)
    return hashlib.sha256(said.encode()).hexdigest()[:24]


def resolved(cfg: E, changes: tuple[dict, ...]) -> E:
    """`cfg` with an inspection's resolved changes: what will train."""
    try:
        return cfg.replace(**{c["field"]: c["after"] for c in changes if c.get("field")}) if changes else cfg
    except (TypeError, ValueError):  # a field this config does not have: the settings as typed
        return cfg


def answered(action: Any) -> tuple[tuple[dict, ...], tuple[str, ...]]:
    """(the resolved changes, the failures) an inspect child answered."""
    done = action.result() if action is not None else None
    if not done:
        return (), ()
    if done.get("status") != "completed":
        error = next((e for e in reversed(action.events) if e.get("kind") == "error"), done)
        return (), (str(error.get("message") or done.get("message") or ""),)
    return tuple(done.get("changes") or ()), tuple(str(v) for v in (done.get("failed") or {}).values())


def _predicted(cfg: _Estimated, memory: dict[str, Any] | None) -> tuple[Any, dict[str, float], float]:
    from core.estimate.predict import estimate, fit_floor, savings

    rows = row_tokens(cfg)
    est = estimate(cfg, max_row_tokens=rows)
    switch = (lambda c, key, on: toggled(c, key, on, memory)) if memory else None
    saves = savings(cfg, max_row_tokens=rows, switch=switch)
    floor = fit_floor(cfg, max_row_tokens=rows).nvml_peak / 2**30
    return est, {s.key: s.saved_gib for s in saves}, floor


def prediction(cfg: _Estimated, memory: dict[str, Any] | None = None, inspections: Any = None,
               settings: dict[str, Any] | None = None) -> Prediction:
    """Predicted peak GPU memory (GiB, NVML) and the GiB each checklist item saves here; advice only. One estimate
    for the gauge and the checklist: an item's saving is the peak now minus the peak after its box is clicked
    (`memory`: the page's record of the boxes' last changes, which a click may undo).

    `inspections` (core.jobs.actions.Inspections): in the web server, which never builds a model
    (core.estimate.measure.measuring_here(False)), the estimate is the formula plus what is measured already, for
    the run an inspect child resolved; what it lacks is asked of a child, and `measuring` names the one to wait for.
    `settings`: cfg.to_dict(), what the child is asked about (with `inspections`; the caller holds the whole config)."""
    from core.estimate import measure
    from core.jobs.act import resolves

    if inspections is not None and settings is None:
        raise TypeError("prediction: `settings` (the config's to_dict) comes with `inspections`")
    base = inspect_base(settings, run_gpus(cfg)) if settings is not None and inspections is not None else ""
    answer = inspections.answer(base) if inspections is not None else None
    changes, failed = answered(answer)
    run = resolved(cfg, changes)
    with measure.collecting() as wants:
        try:
            est, saves, floor = _predicted(run, memory)
            pred = Prediction(est.nvml_peak / 2**30, saves, world_size(est), floor,
                              cpu_gib=est.cpu_needed / 2**30 or None)
        except Exception:  # unknown model shape, estimator missing: the page works without a prediction
            pred = Prediction(None, {})
    failed = tuple(dict.fromkeys((*failed, *wants.failed.values())))
    pred = pred._replace(failed=failed, changes=changes)
    if inspections is None or measure.measures_here() or not (wants.missing or (answer is None and resolves())):
        return pred  # nothing to measure, nor a run to resolve (an unknown model: the summary says why)
    from core.runs.public import visitor

    key = hashlib.sha256(json.dumps([base, sorted(wants.missing)]).encode()).hexdigest()[:24]
    params = {"base": base, "config": settings, "wanted": list(wants.missing.values()),
              "cuda": hardware().cuda, "world": run_gpus(cfg) or 1, "max_row_tokens": row_tokens(cfg)}
    action = inspections.request(key, params, owner=visitor())
    if action is None:
        return pred._replace(busy=True)
    return pred._replace(measuring=key if action.running else None)


@lru_cache(maxsize=1)
def chapter_savings() -> dict[str, float]:
    """What each checklist item saves at the chapter's own settings (TrainConfig(): Llama-3.1-8B), shown beside
    the figure for another model: on the tiny demo six of seven items save nothing, which hides the point."""
    return prediction(TrainConfig()).saves


def chapter_gib(cfg: ModelSlice, key: str) -> float | None:
    return None if cfg.model == TrainConfig().model else chapter_savings().get(key)


def predicted_peaks(cfg: _Estimated | None) -> dict[str, float] | None:
    """core.estimate.predict's peaks for a config, as the result panel compares them: allocated, reserved, nvml (GiB)."""
    if cfg is None:
        return None
    try:
        from core.estimate.predict import estimate

        est = estimate(cfg, max_row_tokens=row_tokens(cfg))
    except Exception:  # noqa: BLE001 - a model the estimator does not know: no prediction shown
        return None
    return {"allocated": est.peak_allocated_gib, "reserved": est.peak_reserved_gib, "nvml": est.total_gib}


# --- presets ---------------------------------------------------------------------------------------------------------
def preset_text(name: str, what: str, lang: str) -> str:
    """A preset's label or description: core/config/presets.py in English, core.i18n otherwise (English if missing)."""
    english = presets.PRESETS[name]["label" if what == "label" else "description"]
    key = f"preset.{name}.{what}"
    return english if lang == DEFAULT_LANGUAGE or key not in EN else t(key, lang)


def preset_choices(lang: str = DEFAULT_LANGUAGE) -> list[tuple[str, str]]:
    return [(preset_text(n, "label", lang), n) for n in presets.names()] + [(t("preset.custom", lang), CUSTOM)]


def preset_descriptions(lang: str = DEFAULT_LANGUAGE) -> str:
    """Each preset: what it does, then what it measured (assets/lever_facts.json, as README's tables)."""
    return "\n".join(f"- **{preset_text(n, 'label', lang)}**: {preset_text(n, 'description', lang)} "
                     f"{preset_line(n, lang)}".rstrip() for n in presets.names())


def preset_of(cfg: _Estimated) -> str:
    """The preset the form has, as this machine applies it (without CUDA, "fastest" minus its CUDA-only levers
    is still "fastest", not a custom mix)."""
    hw = hardware()
    from core.estimate.predict import fit_preset

    return presets.matching(cfg) or next((n for n in presets.PRESETS if presets.apply_preset(cfg, n, hw) == cfg
                                          or fit_preset(cfg, n, hw).cfg == cfg), CUSTOM)
