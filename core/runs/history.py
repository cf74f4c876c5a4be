"""Run history: every run folder under output_dir, read back from what the engine wrote.

A run folder (see core.runs.folders) holds .memtune.json (memtune's marker), config.yaml, events.jsonl, summary.json (at
the end), adapter/ and checkpoints/checkpoint-N/ (complete ones carry a COMPLETE marker). A folder without
memtune's marker (or, from an older memtune, events naming it) is not a memtune run: never listed or deleted.
Half-written files (a run still going, a crash, a foreign file) are read as far as they make sense; nothing here
raises for a damaged run folder, it shows what is known.

- `list_runs(output_dir)` -> [RunInfo], newest first: one row of the history table each.
- `load_run(run_dir)` -> RunDetail: settings, loss curve, eval losses and sample answers, summary.
- `compare_runs([run_dir, ...])` -> Comparison: curves of several runs, the settings that differ, their figures,
  their held-out scores and verdicts, and a GRPO run's final mean reward.
- `resume_config(run_dir)` -> the run's TrainConfig with resume_from set (training continues its step count).
- `preference_config(run_dir)` -> a new run's TrainConfig that continues the run's SFT adapter with DPO (init_adapter).
- `delete_run(run_dir, output_dir, is_running)` -> removes a run folder, after refusing anything risky.
- `tidy(output_dir)` -> at start-up, finishes or undoes what a crash left (core.files.recover) in memtune's runs.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from core.config.settings import (CONTINUED_STAGES, DEMO_DATASET, MOVES_BASE, PACKING_STAGES, SAFE_NAME, SCHEDULERS,
                                  ConfigError, TrainConfig)
from core.config.slices import DataSlice, PlaceSlice, TrainerSlice
from core.messages import Keyed, Said, said_of
from core.runs.events import read_events
from core.files import RefusedError, real, remove_tree, target
from core.runs.card import heldout_scores
from core.runs.folders import complete_checkpoints, is_memtune_run, resume_point, resume_problem, tidy_run_dir

RUNNING_GRACE_S = 300.0  # without a job manager's word: events written this recently mean "maybe still running"
IsRunning = Callable[[Path], bool]


class HistoryError(Keyed, RuntimeError):
    """A history action was refused; the message says why and what to do. Raised with a core.messages.Said, it is
    keyed (core.messages.Keyed: a page says it in its language), as it is when handed on from another keyed refusal
    (core.files.RefusedError); with plain English, as written."""

    def __init__(self, message: "str | Said | Keyed") -> None:
        key = getattr(message, "key", "")
        if key:
            super().__init__(self._keyed(key, getattr(message, "params", {})))
        else:
            self.params = {}
            super().__init__(str(message))


@dataclass
class RunInfo:
    run_dir: str
    name: str
    started: float | None  # Unix time of the first event (or of config.yaml)
    model: str = ""
    dataset: str = ""
    status: str = "unknown"  # completed | stopped | failed | running | interrupted | unknown
    final_loss: float | None = None
    first_loss: float | None = None
    steps: int | None = None
    max_steps: int | None = None
    peak_gib: float | None = None  # NVML peak (what nvidia-smi showed) if known, else torch's peak allocation
    duration_s: float | None = None
    adapter_dir: str | None = None  # only a complete adapter (adapter_config.json + weights)
    checkpoint: str | None = None  # newest complete checkpoint: resumable when set
    message: str = ""
    said: dict[str, Any] = field(default_factory=dict)  # a failed run's key + params (core.messages.said_of)
    heldout: float | None = None  # the adapter's held-out score (0-1, summary.json's heldout)
    heldout_worse: bool = False  # it scored lower than its parent or the base model

    @property
    def date(self) -> str:
        return datetime.fromtimestamp(self.started).strftime("%Y-%m-%d %H:%M") if self.started else ""

    @property
    def resumable(self) -> bool:
        return self.checkpoint is not None

    def row(self) -> list[Any]:
        """One table row, in HEADERS' order (plain values; the page formats them)."""
        return [self.date, self.name, self.model, self.dataset, self.status,
                None if self.final_loss is None else round(self.final_loss, 4),
                None if self.peak_gib is None else round(self.peak_gib, 2),
                format_duration(self.duration_s), self.steps, "yes" if self.resumable else "",
                None if self.heldout is None else round(self.heldout, 4)]


# i18n keys of the table's columns, in RunInfo.row's order: t(f"history.col.{c}", lang)
HEADERS = ("date", "name", "model", "dataset", "status", "final_loss", "peak", "duration", "steps", "resumable",
           "heldout")


@dataclass
class RunDetail:
    info: RunInfo
    config: TrainConfig | None  # None when config.yaml cannot be read as a TrainConfig
    config_text: str  # config.yaml as written
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss) from `metrics` events
    learning_rates: list[tuple[int, float]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    checkpoints: list[str] = field(default_factory=list)  # complete ones, oldest first
    log: list[str] = field(default_factory=list)  # log and error messages, in order
    eval_losses: list[tuple[int, float]] = field(default_factory=list)  # (step, eval loss) from `eval` events
    answers: list[tuple[int, list[dict[str, str]]]] = field(default_factory=list)  # (step, prompt/reference/answer)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


# --- reading one folder ----------------------------------------------------------------------------------------------
def is_run_dir(path: Path) -> bool:
    """A folder carrying memtune's run marker (only the marker counts). A run that died before writing config.yaml
    (a full disk) is one too: listed, so it can be deleted."""
    return not path.name.startswith(".") and is_memtune_run(path)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _config(run_dir: Path) -> tuple[TrainConfig | None, str]:
    try:
        text = (run_dir / "config.yaml").read_text(encoding="utf-8")
    except OSError:
        return None, ""
    try:
        return TrainConfig.from_yaml(text), text
    except (ConfigError, TypeError, ValueError):  # written by another memtune version, or edited by hand
        return None, text


def _first_event_time(path: Path) -> float | None:
    try:
        with path.open("r", encoding="utf-8") as fh:
            first = json.loads(fh.readline())
        return float(first["time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _adapter(run_dir: Path) -> str | None:
    a = run_dir / "adapter"
    return str(a) if (a / "adapter_config.json").is_file() and any(a.glob("adapter_model.*")) else None


def _looks_running(run_dir: Path, summary: dict[str, Any]) -> bool:
    """No job manager to ask: a run without a summary whose events file moved recently may still be going."""
    if summary:
        return False
    try:
        return time.time() - (run_dir / "events.jsonl").stat().st_mtime < RUNNING_GRACE_S
    except OSError:
        return False


def run_info(run_dir: str | Path, is_running: IsRunning | None = None) -> RunInfo:
    """What the history table shows about one run folder."""
    run_dir = Path(run_dir)
    cfg, text = _config(run_dir)
    summary = _json(run_dir / "summary.json")
    events_path = run_dir / "events.jsonl"
    started = _first_event_time(events_path)
    for name in ("config.yaml", ".memtune.json"):  # no events yet: when the folder was made
        if started is None:
            try:
                started = (run_dir / name).stat().st_mtime
            except OSError:
                started = None
    info = RunInfo(run_dir=str(run_dir), name=run_dir.name, started=started,
                   model=cfg.model if cfg else str(summary.get("model", "")),
                   dataset=cfg.dataset if cfg else str(summary.get("dataset", "")))
    running = is_running(run_dir) if is_running is not None else _looks_running(run_dir, summary)
    if running:
        info.status = "running"
    elif summary.get("status") in ("completed", "stopped", "failed"):
        info.status = summary["status"]
    else:
        info.status = "interrupted" if events_path.is_file() else "unknown"
    info.final_loss = _number(summary.get("final_loss"))
    info.first_loss = _number(summary.get("first_loss"))
    info.steps = int(summary["steps"]) if _number(summary.get("steps")) is not None else None
    info.max_steps = int(summary["max_steps"]) if _number(summary.get("max_steps")) is not None else None
    peaks = [_number(summary.get(k)) for k in ("nvml_peak_gib", "peak_allocated_gib")]
    info.peak_gib = next((p for p in peaks if p is not None), None)
    info.duration_s = _number(summary.get("runtime_s"))
    info.message = str(summary.get("message", "") or "")
    info.said = said_of(summary)
    scores = heldout_scores(summary)
    info.heldout = scores["adapter"] if scores else None
    info.heldout_worse = bool(scores and scores["worse"])
    if info.status in ("running", "interrupted") or info.final_loss is None or info.duration_s is None:
        _fill_from_events(info, read_events(events_path))
    info.adapter_dir = _adapter(run_dir)
    try:
        ckpt = resume_point(run_dir)[0] if cfg is not None else None  # None: Resume could only fail
    except OSError:
        ckpt = None
    info.checkpoint = str(ckpt) if ckpt else None
    return info


def _fill_from_events(info: RunInfo, events: list[dict[str, Any]]) -> None:
    """What a summary would say, from the events so far (a running or crashed run has no summary)."""
    last_step = last_metrics = None
    for e in events:
        if e.get("kind") == "step":
            last_step = e
        elif e.get("kind") == "metrics":
            last_metrics = e
            if info.first_loss is None:
                info.first_loss = _number(e.get("loss"))
    if last_metrics is not None and info.final_loss is None:
        info.final_loss = _number(last_metrics.get("loss"))
    if last_step is not None:
        info.steps = info.steps if info.steps is not None else int(last_step.get("step") or 0)
        info.max_steps = info.max_steps or last_step.get("total_steps")
        if info.peak_gib is None:
            info.peak_gib = _number(last_step.get("peak_gib"))
    if info.duration_s is None and events:
        t0, t1 = _number(events[0].get("time")), _number(events[-1].get("time"))
        if t0 is not None and t1 is not None:
            info.duration_s = max(0.0, t1 - t0)


# --- the public API ---------------------------------------------------------------------------------------------------
def list_runs(output_dir: str | Path, is_running: IsRunning | None = None) -> list[RunInfo]:
    """Every memtune run folder directly under output_dir, newest first. Unreadable folders are skipped."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    runs = []
    for path in root.iterdir():
        try:
            if is_run_dir(path):
                runs.append(run_info(path, is_running))
        except Exception:  # noqa: BLE001 - a damaged or foreign folder must not hide the others
            continue
    return sorted(runs, key=lambda r: (r.started or 0.0, r.name), reverse=True)


def adapter_choices(output_dir: str | Path, word_loss=lambda loss: f"loss {loss:.3f}") -> list[tuple[str, str]]:
    """(label, adapter folder) of every run with a saved adapter, newest first: a Dropdown's choices. `word_loss`
    writes the final loss (the page passes its language's word and decimals)."""
    out = []
    for r in list_runs(output_dir, is_running=lambda p: False):
        if r.adapter_dir:
            loss = f", {word_loss(r.final_loss)}" if r.final_loss is not None else ""
            out.append((f"{r.name} ({r.model}{loss})", r.adapter_dir))
    return out


def load_run(run_dir: str | Path, is_running: IsRunning | None = None) -> RunDetail:
    """One run in full: its settings, loss curve and summary."""
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise HistoryError(f"{run_dir} is not a memtune run folder (it has no config.yaml or no memtune marker).")
    cfg, text = _config(run_dir)
    losses: dict[int, float] = {}
    lrs: dict[int, float] = {}
    evals: dict[int, float] = {}
    answers: dict[int, list[dict[str, str]]] = {}
    log: list[str] = []
    for e in read_events(run_dir / "events.jsonl"):
        kind = e.get("kind")
        if kind == "metrics" and _number(e.get("step")) is not None:
            step = int(e["step"])
            if _number(e.get("loss")) is not None:
                losses[step] = float(e["loss"])  # a resumed run logs some steps again: the later value wins
            if _number(e.get("learning_rate")) is not None:
                lrs[step] = float(e["learning_rate"])
        elif kind == "eval" and _number(e.get("step")) is not None and _number(e.get("eval_loss")) is not None:
            evals[int(e["step"])] = float(e["eval_loss"])
            if isinstance(e.get("answers"), list) and e["answers"]:
                answers[int(e["step"])] = e["answers"]
        elif kind in ("log", "error") and e.get("message"):
            log.append(str(e["message"]))
    try:
        ckpts = [str(p) for p in complete_checkpoints(run_dir)]
    except OSError:
        ckpts = []
    return RunDetail(info=run_info(run_dir, is_running), config=cfg, config_text=text,
                     losses=sorted(losses.items()), learning_rates=sorted(lrs.items()),
                     summary=_json(run_dir / "summary.json"), checkpoints=ckpts, log=log,
                     eval_losses=sorted(evals.items()), answers=sorted(answers.items()))


# --- comparing runs -----------------------------------------------------------------------------------------------
# Settings that name a run rather than change what it learns: never listed as a difference.
NOT_SETTINGS = {"run_name", "output_dir", "resume_from"}
# The figures compared side by side: (key, where it is read) in this order; the page labels them history.fig.<key>.
FIGURES = ("peak_gib", "runtime_s", "tokens_per_s", "final_loss", "final_eval_loss", "best_eval_loss", "steps",
           "final_reward_accuracy", "final_eval_reward_accuracy")
# listed only when a picked run is a preference run: SFT runs have no reward
PREFERENCE_FIGURES = ("final_reward_accuracy", "final_eval_reward_accuracy")


@dataclass
class Comparison:
    names: list[str]  # the runs, in the order picked
    curves: list[tuple[str, str, int, float]]  # (run, "train" | "validation", step, loss): one chart
    settings: list[tuple[str, list[Any]]]  # only the settings that differ: (field, value per run)
    figures: list[tuple[str, list[Any]]]  # FIGURES: (key, value per run; None when unknown)
    heldout: list[dict[str, Any] | None] = field(default_factory=list)  # heldout_scores per run
    rewards: list[float | None] = field(default_factory=list)  # final_reward per run (GRPO runs)


def final_reward(summary: dict[str, Any]) -> float | None:
    """A GRPO run's final mean reward (summary.json's `grpo`, core/train/rewards.py grpo_summary), else None."""
    grpo = summary.get("grpo") if isinstance(summary, dict) else None
    return _number(grpo.get("final_reward")) if isinstance(grpo, dict) else None


def _figures(detail: RunDetail) -> dict[str, Any]:
    s, info = detail.summary or {}, detail.info
    ev = s.get("eval") if isinstance(s.get("eval"), dict) else {}
    pref = s.get("preference") if isinstance(s.get("preference"), dict) else {}
    final_eval = detail.eval_losses[-1][1] if detail.eval_losses else _number(ev.get("final"))
    best = min((loss for _, loss in detail.eval_losses), default=_number(ev.get("best")))
    return {"peak_gib": info.peak_gib, "runtime_s": info.duration_s, "tokens_per_s": _number(s.get("tokens_per_s")),
            "final_loss": info.final_loss, "final_eval_loss": final_eval, "best_eval_loss": best,
            "steps": info.steps,
            "final_reward_accuracy": _number(pref.get("final_reward_accuracy")),
            "final_eval_reward_accuracy": _number(pref.get("final_eval_reward_accuracy"))}


def compare_runs(run_dirs: list[str | Path], is_running: IsRunning | None = None) -> Comparison:
    """Two or more runs side by side: their training and validation curves, the settings that differ, their peak
    memory, time, tokens/s and final losses. A folder that is not a run raises HistoryError."""
    details = [load_run(d, is_running) for d in run_dirs]
    names = [d.info.name for d in details]
    curves = [(d.info.name, series, step, loss) for d in details
              for series, points in (("train", d.losses), ("validation", d.eval_losses)) for step, loss in points]
    configs = [(d.config.to_dict() if d.config else {}) for d in details]
    keys = [k for k in (configs[0] if configs else {}) if k not in NOT_SETTINGS]
    keys += [k for c in configs[1:] for k in c if k not in keys and k not in NOT_SETTINGS]
    settings = [(k, [c.get(k) for c in configs]) for k in keys
                if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]
    figs = [_figures(d) for d in details]
    return Comparison(names, curves, settings, [(k, [f[k] for f in figs]) for k in FIGURES
                                                if k not in PREFERENCE_FIGURES or any(f[k] is not None for f in figs)],
                      heldout=[heldout_scores(d.summary or {}) for d in details],
                      rewards=[final_reward(d.summary or {}) for d in details])


def resume_config(run_dir: str | Path) -> TrainConfig:
    """The run's saved settings, set to continue from its newest complete checkpoint (same folder, same steps).

    Change max_steps / num_train_epochs on the result to train further than the run was set to.
    """
    try:
        run_dir = target(run_dir, "resume into")
    except RefusedError as exc:
        raise HistoryError(str(exc)) from None
    if not is_run_dir(run_dir):
        raise HistoryError(f"{run_dir} is not a memtune run folder (it has no config.yaml or no memtune marker).")
    cfg, _ = _config(run_dir)
    if cfg is None:
        raise HistoryError(f"{run_dir / 'config.yaml'} cannot be read as memtune settings, so the run cannot be "
                           "resumed. Start a new run instead.")
    why = resume_problem(run_dir)
    if why:
        raise HistoryError(f"Cannot resume: {why}.")
    return cfg.replace(resume_from=str(run_dir))


PREFERENCE_START = "dpo"  # the stage History's "Continue with preference tuning" sets (the default preference stage)


def fresh_run_name(cfg: PlaceSlice, run_dir: Path, stage: str) -> str:
    """`<run>-<stage>`, numbered past any folder already in cfg.output_dir: never the earlier run's folder, and the
    name the form shows is the folder the run gets (core.runs.folders.new_run_dir would number it the same way)."""
    base = (cfg.run_name or run_dir.name)[: 63 - len(stage) - 3]
    name = f"{base}-{stage}" if SAFE_NAME.match(f"{base}-{stage}") else f"run-{stage}"
    root, suffix, free = Path(cfg.output_dir).expanduser(), 1, name
    while (root / free).exists() or free == run_dir.name:
        suffix += 1
        free = f"{name}-{suffix}"
    return free


def preference_config(run_dir: str | Path, is_running: IsRunning | None = None,
                      stage: str = PREFERENCE_START) -> TrainConfig:
    """A new run that continues an earlier SFT run's adapter with preference tuning: the run's saved
    settings with `stage`, init_adapter = the run's folder (core/train/stages.py loads its adapter as the start and,
    for DPO/KTO, keeps TRL's frozen copy of it as the reference), a fresh run name, no resume_from, and what a
    preference stage cannot use switched off: packing (the preset's levers for `stage`, presets.for_stage),
    keep_best and early stopping (they need a validation part the new pairs may lack: the user turns them back on),
    a lora_init that moves the base (the saved adapter is already plain LoRA on the original base, and its shape
    comes from its adapter_config.json). The dataset stays: the demo's is read as its preference pairs
    (core.data.pairs); any other must hold pairs, which the caller says. With `stage` grpo the run's own rows are the
    prompts and reference answers (core/train/grpo.py); the demo's run takes DEMO_GRPO, the settings README measured.

    Refused (HistoryError carrying a core.messages.Said) for a run that is running, has no saved adapter, or is
    itself a preference run. Every memtune run trains a LoRA adapter (there is no full fine-tune to refuse)."""
    from core.config.presets import apply_preset, matching

    detail = load_run(run_dir, is_running)
    info, cfg = detail.info, detail.config
    if cfg is None:
        raise HistoryError(Said("history.unreadable", name=info.name))
    if info.status == "running":
        raise HistoryError(Said("history.pref.running", name=info.name))
    folder = real(info.run_dir)  # absolute: what the training process reads, whatever its working folder
    if info.adapter_dir is None or not (folder / "adapter" / "memtune.yaml").is_file():
        raise HistoryError(Said("history.pref.no_adapter", name=info.name))
    if cfg.stage != "sft":
        raise HistoryError(Said("history.pref.from_preference", name=info.name, stage=cfg.stage))
    new = cfg.replace(stage=stage, init_adapter=str(folder), resume_from="",
                      run_name=fresh_run_name(cfg, folder, stage), keep_best=False, early_stopping_patience=0,
                      lora_init="default" if cfg.lora_init in MOVES_BASE else cfg.lora_init)
    new = new.replace(**stage_schedule(cfg, stage))  # the stage's own learning rate and schedule, never the parent's
    if stage == "grpo" and not needs_pairs(cfg):  # the demo: README's measured GRPO settings
        new = new.replace(**DEMO_GRPO)
    preset = matching(cfg)  # the run's preset (for sft) stays its preset, with that preset's levers for `stage`
    if preset:
        return apply_preset(new, preset, stage=stage)
    return new if stage in PACKING_STAGES else new.replace(packing=False)


# The demo's preference stages: from the demo SFT adapter (100/100 exact), DPO 40 steps at batch 20 kept 100/100 at
# 1e-4 (reward accuracy 97%); the SFT run's 8e-3 fell to 42/100 (reward accuracy 100%); 2e-5 and 5e-6 barely moved
# the rewards (accuracy 56%, 46%).
DEMO_STAGE_LR = 1e-4
# TRL's own default (learning_rate, lr_scheduler_type), the same in DPOConfig, KTOConfig, ORPOConfig and GRPOConfig,
# written here because the web server imports no torch (TRL does); tests/test_heldout_run.py checks it against TRL.
STAGE_SCHEDULE = (1e-6, "linear")
# The demo's GRPO (README's CPU command, measured there): from the demo SFT adapter, the answers sampled at a
# temperature the SFT run never answered at, rewarded for the right word (exact) and for being one lowercase word
# (regex), 8 answers per prompt, 4 prompts per step.
DEMO_GRPO = {"learning_rate": 1e-3, "grpo_rewards": "exact:1, regex:0.5",
             "grpo_reward_options": '{"regex": {"pattern": "[a-z]+"}}', "temperature": 2.0, "num_generations": 8,
             "max_completion_length": 8, "per_device_train_batch_size": 32, "gradient_accumulation_steps": 1,
             "grpo_beta": 0.6, "warmup_steps": 0, "max_steps": 200}


def stage_schedule(cfg: DataSlice, stage: str) -> dict[str, Any]:
    """The learning rate and schedule a run continued with `stage` starts with: the demo's measured rate (DEMO_STAGE_LR),
    else TRL's default for the stage; the schedule TRL's default. Empty where none is found (the parent's stay)."""
    default_lr, schedule = STAGE_SCHEDULE if stage in CONTINUED_STAGES else (None, None)
    demo = cfg.dataset.strip() == DEMO_DATASET
    lr = (DEMO_GRPO["learning_rate"] if stage == "grpo" else DEMO_STAGE_LR) if demo else default_lr
    out: dict[str, Any] = {}
    if isinstance(lr, (int, float)) and lr > 0:
        out["learning_rate"] = float(lr)
    if isinstance(schedule, str) and schedule in SCHEDULERS:
        out["lr_scheduler_type"] = schedule
    return out


def schedule_note(parent: TrainerSlice, new: TrainerSlice) -> Said | None:
    """What a continuation changed in the learning rate and schedule, said (None: nothing changed)."""
    if (parent.learning_rate, parent.lr_scheduler_type) == (new.learning_rate, new.lr_scheduler_type):
        return None
    return Said("history.pref.schedule", lr=f"{new.learning_rate:g}", parent_lr=f"{parent.learning_rate:g}",
                schedule=new.lr_scheduler_type, parent_schedule=parent.lr_scheduler_type)


def needs_pairs(cfg: DataSlice) -> bool:
    """Whether cfg's dataset must be changed to pairs by the user: every dataset but the demo's, which has its own."""
    return cfg.dataset.strip() != DEMO_DATASET


def delete_run(run_dir: str | Path, output_dir: str | Path, is_running: IsRunning | None = None) -> Path:
    """Delete a run folder; refuse anything outside output_dir, anything not a memtune run, and a running run.

    is_running(run_dir) is asked first (the job manager knows); without it, a run with no summary whose events
    were written in the last few minutes counts as running. Returns the deleted path.
    """
    raw = Path(run_dir)
    if raw.is_symlink():
        raise HistoryError(Said("history.refuse_link", path=str(raw)))
    try:  # resolved once: every check below and the removal act on this folder
        root, target_dir = target(output_dir, "delete runs in"), target(raw, "delete")
    except RefusedError as exc:
        raise HistoryError(exc) from None
    if target_dir.parent != root or target_dir == root:
        raise HistoryError(Said("history.refuse_outside", path=str(raw), root=str(root)))
    if not is_run_dir(target_dir):
        raise HistoryError(Said("history.refuse_not_run", path=str(target_dir)))
    summary = _json(target_dir / "summary.json")
    if (is_running(target_dir) if is_running is not None else _looks_running(target_dir, summary)):
        raise HistoryError(Said("history.refuse_running", name=target_dir.name))
    remove_tree(target_dir)  # gone from the list at once; a failure part-way leaves only a hidden folder
    return target_dir


def tidy(output_dir: str | Path, is_running: IsRunning | None = None) -> list[str]:
    """At start-up: finish what crashes left in memtune's run folders (interrupted adapter/merged replaces,
    temporary folders, half-written checkpoints, half-deleted runs). Returns what was done, for the log."""
    root = real(output_dir)
    done: list[str] = []
    if not root.is_dir():
        return done
    for path in root.iterdir():
        try:
            if path.name.endswith(".deleting") and path.is_dir() and is_memtune_run(path):
                shutil.rmtree(path, ignore_errors=True)
                done.append(f"removed the half-deleted {path.name}")
            elif is_run_dir(path) and not (is_running(path) if is_running else _looks_running(
                    path, _json(path / "summary.json"))):
                tidy_run_dir(path)
        except OSError as exc:
            done.append(f"{path}: {exc}")
    return done
