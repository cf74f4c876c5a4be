"""The run panel's live parts, polled every second by one gr.Timer per page: the GPUs' memory (the gauge) and the
job manager's current job (progress, loss curve, a preference run's reward curve, log, result, download,
Start/Stop). Nothing about the run lives in the page, so a reload reattaches; what is computed once per job is
cached here, process-wide, by job id.

Public mode: the job is the visitor's own (core.jobs.manager's owner: the id the server issued them), queued or
running; another visitor's job is never read here, so it shows in no form. The Space owner (logged in) sees the
running job and the whole queue."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from core.i18n import DEFAULT_LANGUAGE, t
from core.jobs.manager import Job, JobBusy, latest_run_dir
from core.jobs.view import BY_SCORER, job_view, predicted_wait
from core.messages import Said
from ui import render
from ui.derive import predicted_peaks, run_gpus, valid_budget

LOG_LINES = 400
PLOT_POINTS = 400
# A chart with nothing to draw stays in the page, out of sight: gradio's LinePlot keeps a ResizeObserver on its element,
# and a chart removed by visible=False threw "Cannot read properties of null (reading 'offsetWidth')" from it.
OUT_OF_SIGHT = "hidden"
_zips: dict[int, str] = {}
_job_predictions: dict[int, dict[str, float] | None] = {}
_gpu_peaks: dict[int, dict[int, float]] = {}  # job id -> GPU index -> highest "used" seen while it ran


def read_gpus() -> tuple[list[dict[str, Any]], str]:
    """([{index, name, used_gib, total_gib}], message). An empty list and a plain message when there is no GPU."""
    from core.gpus import vram

    try:
        snap = vram.snapshot()
    except Exception as exc:  # the gauge is informational: never break the page
        return [], Said("gauge.unavailable", error=f"{type(exc).__name__}: {exc}")
    gpus = [{"index": g.index, "name": g.name, "used_gib": g.used_gib, "total_gib": g.total_gib} for g in snap.gpus]
    return gpus, (getattr(snap, "message", "") or ("" if gpus else vram.NO_GPU))


def thin(points: list[tuple[int, float]], limit: int = PLOT_POINTS) -> list[tuple[int, float]]:
    """At most ~limit points for the plot (every k-th, always the last): a long run must not slow the page."""
    if len(points) <= limit:
        return points
    k = -(-len(points) // limit)
    return points[::k] + ([points[-1]] if (len(points) - 1) % k else [])


def loss_frame(losses: list[tuple[int, float]], eval_losses: list[tuple[int, float]] = (),
               lang: str = DEFAULT_LANGUAGE) -> pd.DataFrame:
    """Training and validation loss (column `series`) for the loss chart (ui/validation.py)."""
    from ui.validation import curves_frame

    return curves_frame(thin(losses), eval_losses, lang)


REWARD_SERIES = (("reward_accuracy", "run.series_reward_accuracy"), ("reward_margin", "run.series_reward_margin"),
                 ("reward_mean", "run.series_reward_mean"), ("completion_share", "run.series_completion_share"),
                 ("kl", "run.series_kl"))


def reward_frame(rewards: list[tuple[int, dict[str, float]]], lang: str = DEFAULT_LANGUAGE,
                 eval_rewards: list[tuple[int, dict[str, float]]] = ()) -> pd.DataFrame:
    """A preference run's reward chart (column `series`): reward accuracy (a fraction, 0-1) and the mean reward
    margin of each logged step, as the run's `metrics` events carry them (core/train/rewards.py; KTO logs no
    accuracy, so only its margin is drawn; GRPO: its mean reward, each scorer's when there are several, the answers'
    length as a share of max_completion_length and the KL to the reference), and the reward accuracy on the validation pairs at each eval (its
    `eval` events). Empty for an SFT run."""
    rows = [(step, r[name], t(label, lang)) for name, label in REWARD_SERIES
            for step, r in thin(rewards) if name in r]
    scorers = sorted({k for _, r in rewards for k in r if k.startswith(BY_SCORER)})  # GRPO: each scorer's reward
    if len(scorers) > 1:
        rows += [(step, r[k], t("run.series_reward_by", lang, scorer=k[len(BY_SCORER):]))
                 for k in scorers for step, r in thin(rewards) if k in r]
    rows += [(step, r["reward_accuracy"], t("run.series_eval_reward_accuracy", lang))
             for step, r in eval_rewards if "reward_accuracy" in r]
    return pd.DataFrame(rows, columns=["step", "value", "series"])


def adapter_zip(job_id: int, adapter_dir: str) -> str | None:
    from core.export.adapter import ExportError, zip_adapter

    if job_id not in _zips or not Path(_zips[job_id]).is_file():  # h2: zips older than an hour are pruned
        try:
            _zips[job_id] = str(zip_adapter(adapter_dir))
        except (OSError, ExportError):
            return None
    return _zips[job_id]


def job_prediction(job) -> dict[str, float] | None:
    """What core.estimate.predict predicted for a job's settings (computed once per job)."""
    if job.id not in _job_predictions:
        _job_predictions[job.id] = predicted_peaks(job.config)
    return _job_predictions[job.id]


def run_peaks(job, gpus: list[dict[str, Any]], n_run: int) -> list[float]:
    """The highest memory use seen on each of the run's GPUs while it ran (sampled by this poll)."""
    peaks = _gpu_peaks.setdefault(job.id, {})
    for g in gpus[:n_run]:
        if job.running:
            peaks[g["index"]] = max(peaks.get(g["index"], 0.0), g["used_gib"])
    if gpus and job.running:
        job.note_gpu_used(gpus[0]["used_gib"])
    return [peaks.get(g["index"], 0.0) for g in gpus[:n_run]]


@dataclass(eq=False)
class LivePanel:
    gauge: Any
    progress: Any
    plot: Any
    log: Any
    result: Any
    download: Any
    start: Any
    stop: Any
    state: Any  # gr.State: what this page was last sent (fingerprints), so unchanged parts are not re-sent
    notice: Any = None  # Start / Stop's notice ("Run 2 started", "Stopping"): cleared once that run has ended
    app: Any = None  # ui.state.AppState: the manager whose jobs this panel shows
    end_now: Any = None  # End now (confirmed): usable while a run of this page's owner is running
    reward_plot: Any = None  # a preference run's reward accuracy and margin (hidden for an SFT run)

    @property
    def outputs(self) -> list[Any]:
        return [self.gauge, self.progress, self.plot, self.log, self.result, self.download, self.start, self.stop,
                self.state] + [c for c in (self.notice, self.end_now, self.reward_plot) if c is not None]


def owner() -> str | None:
    """Whose jobs this request sees and acts on: public mode, the visitor; None: the app's user or the Space owner."""
    from core.runs.public import visitor

    return visitor()


def start_run(cfg, manager) -> Job:
    """Start `cfg` for whoever asks: public mode, in the queue, within the Space owner's limits (JobBusy beyond);
    otherwise at once, or JobBusy while a run goes on."""
    from core.runs.public import address, disk_used, is_public, limits, prune_visitors

    who = owner()
    if not (is_public() and who):
        return manager.start(cfg)
    lim = limits()
    prune_visitors(lim.keep_hours, manager.is_running)  # every visitor's runs past the owner's retention
    used = disk_used()
    if lim.disk_gib and used > lim.disk_gib * 2**30:
        raise JobBusy("over the disk limit", "disk", lim.disk_gib)
    return manager.start(cfg, owner=who, queue=True, per_owner=lim.jobs or None, max_s=lim.minutes * 60 or None,
                         address=address(), per_address=lim.per_address or None, queue_cap=lim.queue or None)


def busy_message(exc: JobBusy, lang: str, manager) -> str:
    """Why a Start was refused, in the page's language (never naming another visitor's run)."""
    from core.runs.public import disk_used

    if exc.reason == "yours":
        return t("msg.own_limit", lang, n=exc.limit)
    if exc.reason == "disk":
        return t("msg.disk_limit", lang, used=f"{disk_used() / 2**30:.2f}", limit=exc.limit)
    if exc.key:  # the queue's own limits (core.jobs.manager.admission), said by key
        return t(exc.key, lang, **exc.params)
    running = manager.current()
    return t("msg.one_job", lang, model=running.config.model if running else "?")


RUN_NOTE = "mt-run-note"  # the element id of Start / Stop's notice about a run (handlers.on_start, on_stop)


def live_update(panel: LivePanel, state: dict | None, lang: str = DEFAULT_LANGUAGE, pred: dict | None = None,
                budget: float | None = None, shown_notice: str | None = None,
                output_dir: str | None = None) -> dict[Any, Any]:
    """One poll: {component: update} for the run panel.

    Each part is sent only when it changed since this page's last poll (the state keeps a fingerprint of each,
    including the language), so a long run costs the browser one small progress update a second, not a redraw.
    `pred` is the page's prediction state ({"gib": predicted NVML peak per GPU of the settings on screen}).
    `shown_notice`: what the page's run notice shows now (an input of the poll, so the page's own copy decides).
    The gauge draws one bar per GPU and marks those the run (or the settings on screen) uses.
    """
    from core.runs.public import is_public, shown
    from ui.notices import runs_folder

    state = dict(state or {})
    sent = dict(state.get("sent") or {})
    who = owner()
    manager = panel.app.manager
    job = manager.current(who)
    if job is not None and not job.active and job.run_dir and not Path(job.run_dir).is_dir():
        job = None  # its folder was deleted (History): its adapter and zip are no longer offered
    if job is None and output_dir and not state.get("looked_for_old"):
        state["looked_for_old"] = True
        last = latest_run_dir(runs_folder(output_dir))  # public mode: the visitor's own folder
        job = manager.load_run(last, who) if last else None
    gpus, message = read_gpus()
    running = job is not None and job.running
    predicted = (pred or {}).get("gib")
    if running:  # during a run, mark what was predicted for the run, not for whatever the form shows now
        predicted = (job_prediction(job) or {}).get("nvml")
    n_run = (run_gpus(job.config) if running else (pred or {}).get("gpus", 1)) if gpus else 0
    n_run = max(1, n_run) if gpus else 0  # the prediction is drawn on GPU 0 at least
    peaks = run_peaks(job, gpus, n_run) if job is not None else []
    v = job_view(job)
    outputs: dict[Any, tuple[Any, Any]] = {
        panel.gauge: (render.gauge_html(gpus, message, run_peak_gib=[p or None for p in peaks] or None,
                                        predicted_gib=predicted, lang=lang, running=running,
                                        budget_gib=valid_budget(budget),
                                        run_gpus=n_run, floor_gib=(pred or {}).get("floor")), None)}
    outputs[panel.plot] = (gr.update(value=loss_frame(v.losses, v.eval_losses, lang), visible=True)
                           if v.losses or v.eval_losses else gr.update(visible=OUT_OF_SIGHT),
                           (job.id if job else None, len(v.losses), v.losses[-1] if v.losses else None,
                            len(v.eval_losses), lang))
    if panel.reward_plot is not None:  # a preference run's learning signal, beside its loss
        outputs[panel.reward_plot] = (gr.update(value=reward_frame(v.rewards, lang, v.eval_rewards), visible=True)
                                      if v.rewards or v.eval_rewards else gr.update(visible=OUT_OF_SIGHT),
                                      (job.id if job else None, len(v.rewards), v.rewards[-1] if v.rewards else None,
                                       len(v.eval_rewards), lang))
    tail = v.log[-LOG_LINES:]
    place = manager.position(job) if job is not None and job.waiting else None
    progress = (render.queue_html(place[0], predicted_wait(place[1], manager.seconds_per_step), lang) if place
                else render.progress_html(v, lang))
    if is_public() and who is None:  # the Space owner: the whole queue
        progress += render.queue_list_html(*manager.queue(), lang)
    outputs[panel.progress] = (shown(progress), None)
    from ui.validation import answers_html  # what the model answers now, as evals land

    outputs[panel.log] = (shown(render.log_html(tail, lang) + answers_html(v.answers, v.answers_step, lang)),
                          (lang, job.id if job else None, len(v.log), tail[-1] if tail else None, v.answers_step))
    done = v.state in ("completed", "stopped", "failed", "interrupted")
    outputs[panel.result] = (shown(render.result_html(v, lang, job_prediction(job) if done and job else None)), None)
    download = gr.update(value=None, visible=False)
    if job is not None and v.adapter_dir and v.state in ("completed", "stopped") and Path(v.adapter_dir).is_dir():
        path = adapter_zip(job.id, v.adapter_dir)
        if path:  # the size in the page's units, in the label: Gradio's own "148.8 KB" is hidden (ui/theme.py)
            download = gr.update(value=path, visible=True,
                                 label=t("run.download_size", lang, size=render.size(Path(path).stat().st_size, lang)))
    outputs[panel.download] = (download, (job.id if job else None, v.state, v.adapter_dir, lang))
    clear_notice = panel.notice is not None and done and job is not None and f'id="{RUN_NOTE}"' in (shown_notice or "")
    active = job is not None and job.active  # a queued run can leave the queue with Stop
    outputs[panel.start] = (gr.update(interactive=not active), ("start", active))
    outputs[panel.stop] = (gr.update(interactive=active), ("stop", active))
    if panel.end_now is not None:  # a queued run has no process to end: Stop takes it out of the queue
        running = job is not None and job.running
        outputs[panel.end_now] = (gr.update(interactive=running), ("end_now", running))

    result: dict[Any, Any] = {}
    for comp, (value, fingerprint) in outputs.items():
        key = comp.elem_id or str(comp._id)
        fingerprint = repr(fingerprint if fingerprint is not None else value)
        if sent.get(key) != fingerprint:
            result[comp] = value
        sent[key] = fingerprint
    if clear_notice:
        # "Run 2 started" / "Stopping ..." described a run that has now ended: the result says how it ended. Read
        # from the page, not remembered: Stop's answer can reach the page after a poll that saw the run end.
        result[panel.notice] = ""
    state["sent"] = sent
    return {**result, panel.state: state}
