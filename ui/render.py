"""HTML for the page's live parts: VRAM gauge, progress, result, config summary, checklist facts, data preview,
history details, problems and notices.

Pure functions from data to HTML strings (every user-supplied string escaped), so they are tested without a
browser. Every text comes from core.i18n in the page's language (`lang`); the engine's English lines (the run log,
the preview's notes, a failed run's message) carry their locale key and values (core.messages) and are said by it
(`said`, `log_line`, `log_text`); a text without a key (an old run's line, a Python error) stays as the engine wrote
it. Styling lives in ui/theme.py's CSS (classes prefixed `mt-`).
"""

from __future__ import annotations

import functools
import html
import math
from pathlib import Path
from typing import Any, Iterable, Protocol

from core.config.settings import ConfigError, Problem, TrainConfig
from core.config.slices import DataSlice, LoraSlice, ModelSlice, TrainerSlice
from core.estimate.advice import oom_advice
from core.estimate.predict import FIT_MARGIN
from core.i18n import byte_units, colon, decimal, formatted, normalize, record_words, t
from core.i18n import said as say_in
from core.i18n import integer as grouped, percent as whole_percent
from core.jobs.view import BY_SCORER, JobView
from core.messages import SaidLine, fields_of
from core.runs.card import heldout_scores
from core.scoring.heldout import verdict_key

NO_GPU_KEYS = ("gpu.none", "gpu.none_why")  # core.gpus.vram's "no NVIDIA GPU found": the gauge's own title says it

E = html.escape


def num(x: float, digits: int = 1, lang: str = "en") -> str:
    """A decimal number as the language writes it: 5.4 (en), 5,4 (pt, fr, es, de): core.i18n.decimal."""
    return decimal(x, digits, lang)


def _duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def integer(n: int | float | None, lang: str = "en") -> str:
    """A count as the language groups digits (core.i18n.integer): 1,698 (en), 1.698 (pt), 1 698 (fr)."""
    return "-" if n is None else grouped(n, lang)


# One unit system for sizes: binary (KiB, MiB, GiB), as the GPU memory figures everywhere on the page, each
# language's spelling (core.i18n.byte_units). A tiny model's size reads 352 KiB, never 0.000352 GiB.
def size(n: int | float | None, lang: str = "en") -> str:
    if n is None:
        return "-"
    units = byte_units(lang)
    value, i = float(n), 0
    while value >= 1024 and i < len(units) - 1:
        value /= 1024
        i += 1
    return f"{value:.0f} {units[0]}" if i == 0 else f"{num(value, 1, lang)} {units[i]}"


def _bytes(n: int | None, lang: str = "en") -> str:
    return size(n, lang)


# --- VRAM gauge -------------------------------------------------------------------------------------------------
def band(fraction: float) -> str:
    """The gauge's CSS band: core.gpus.vram's thresholds (one definition), named as the page's style sheet names them."""
    from core.gpus import vram

    return {"green": "ok", "amber": "warn"}.get(vram.band(fraction), "high")


def _pct(x: float) -> float:
    return max(0.0, min(100.0, 100.0 * x))


def _prediction_bar(base: float, pred: float, total: float, lang: str, fits: bool) -> str:
    """The predicted run drawn on a bar: a hatched segment from `base` (memory already used) to base + pred."""
    left, width = _pct(base / total), _pct(pred / total)
    width = min(width, 100.0 - left)
    cls = "mt-pred-seg" + ("" if fits else " mt-pred-over")
    title = E(t("gauge.predicted", lang, gib=num(pred, 1, lang)))
    return (f'<div class="{cls}" style="left:{left:.1f}%;width:{max(width, 0.6):.1f}%" title="{title}"></div>'
            f'<div class="mt-predicted" style="left:{min(100.0, left + width):.1f}%" title="{title}"></div>')


def gauge_html(gpus: list[dict[str, Any]], message: str = "", run_peak_gib: float | list[float | None] | None = None,
               predicted_gib: float | None = None, lang: str = "en", running: bool = False,
               budget_gib: float | None = None, run_gpus: int = 1, floor_gib: float | None = None) -> str:
    """gpus: [{index, name, used_gib, total_gib}]: one bar each.

    The first `run_gpus` bars are the run's (or, before a run, the settings on screen's: one process per GPU) and
    say so when there are several GPUs. predicted_gib (core.estimate.predict's NVML peak of the settings, per GPU) is drawn
    on each of them: before a run as a segment on top of the memory already in use (does it fit in what is free?),
    during a run as a marker. run_peak_gib marks the run's highest use: one figure (GPU 0) or one per run GPU.
    Without a GPU the prediction is drawn against a hypothetical card of `budget_gib` (the "Fit to my GPU" budget),
    saying that there is no GPU here. floor_gib: the peak of the smallest settings "Fit to my GPU" may choose; when
    even that does not fit, the gauge says so instead of sending the user to Fit.
    """
    if not gpus:
        return _no_gpu_html(message, predicted_gib, lang, budget_gib, floor_gib)
    peaks = run_peak_gib if isinstance(run_peak_gib, list) else [run_peak_gib]
    per_gpu = " " + t("gauge.per_gpu", lang) if run_gpus > 1 else ""
    parts = ['<div class="mt-gauges">']
    for i, g in enumerate(gpus):
        used, total = float(g.get("used_gib") or 0.0), float(g.get("total_gib") or 0.0)
        frac = used / total if total > 0 else 0.0
        free = max(0.0, total - used)
        marks, foot = [], []
        ours = i < max(1, run_gpus)
        peak = peaks[i] if ours and i < len(peaks) else None
        if peak and total:
            text = E(t("gauge.run_peak", lang, gib=num(peak, 1, lang)))
            marks.append(f'<div class="mt-peak" style="left:{_pct(peak / total):.1f}%" title="{text}"></div>')
            foot.append(f'<span class="mt-peak-key"></span>{text}')
        if ours and predicted_gib and total:
            said = t("gauge.predicted", lang, gib=num(predicted_gib, 1, lang)) + per_gpu
            if running:  # the run's own memory is in `used` already: mark where it should peak
                marks.append(f'<div class="mt-predicted" style="left:{_pct(predicted_gib / total):.1f}%" '
                             f'title="{E(said)}"></div>')
                foot.append(f'<span class="mt-pred-key"></span>{E(said)}')
            else:
                fits = predicted_gib <= free
                marks.append(_prediction_bar(used, predicted_gib, total, lang, fits))
                key = "gauge.fits_free" if fits else "gauge.over_free"
                if not fits and floor_gib and floor_gib > free * (1 - FIT_MARGIN):
                    key = "gauge.over_free_nofit"  # Fit to my GPU cannot help: do not send the user there
                need = num((floor_gib or 0) / (1 - FIT_MARGIN), 1, lang)
                ident = ' id="mt-gauge-prediction"' if i == 0 else ""
                foot.append(f'<span class="mt-pred-key"></span><span{ident} class="mt-gauge-pred" '
                            f'data-predicted="{predicted_gib:.3f}" data-fits="{str(fits).lower()}">'
                            f'{E(t(key, lang, gib=num(predicted_gib, 1, lang), free=num(free, 1, lang), need=need))}'
                            f'{E(" (" + per_gpu.strip() + ")" if per_gpu else "")}</span>')
        usage = t("gauge.usage", lang, used=num(used, 1, lang), total=num(total, 1, lang), percent=f"{100 * frac:.0f}")
        name = t("gauge.gpu", lang, index=g.get("index", i), name=g.get("name", "GPU"))
        mine = (f' <span class="mt-run-gpu-tag">{E(t("gauge.run_gpu" if running else "gauge.settings_gpu", lang))}'
                '</span>' if ours and len(gpus) > 1 else "")
        parts.append(
            f'<div class="mt-gauge{" mt-run-gpu" if ours else ""}" data-band="{band(frac)}" '
            f'data-run="{str(ours).lower()}"><div class="mt-gauge-head"><b>{E(name)}</b>{mine}<span>{E(usage)}</span>'
            f'</div><div class="mt-bar mt-bands"><div class="mt-fill mt-{band(frac)}" style="width:{100 * frac:.1f}%">'
            "</div>" + "".join(marks) + "</div>"
            + (f'<div class="mt-gauge-foot">{" &nbsp; ".join(foot)}</div>' if foot else "")
            + "</div>")
    parts.append("</div>")
    return "".join(parts)


def _no_gpu_html(message: str, predicted_gib: float | None, lang: str, budget_gib: float | None,
                 floor_gib: float | None = None) -> str:
    no_gpu = not message or getattr(message, "key", "") in NO_GPU_KEYS
    text = t("gauge.no_gpu", lang) if no_gpu else log_text(message, lang)
    out = [f'<div class="mt-gauge mt-nogpu" id="mt-gauge-none"><span class="mt-dot"></span><b>{E(text)}</b>'
           f'<div class="mt-muted">{E(t("gauge.cpu_note", lang))}</div>']
    if predicted_gib:
        budget = budget_gib if budget_gib and budget_gib > 0 else 8.0
        fits = predicted_gib <= budget
        key = "gauge.fits_budget" if fits else "gauge.over_budget"
        if not fits and floor_gib and floor_gib > budget * (1 - FIT_MARGIN):
            key = "gauge.over_budget_nofit"  # Fit to my GPU cannot help: do not send the user there
        fit_text = t(key, lang, gib=num(budget, 0, lang), need=num((floor_gib or 0) / (1 - FIT_MARGIN), 1, lang))
        out.append(
            f'<div class="mt-cpu-pred" id="mt-gauge-prediction" data-predicted="{predicted_gib:.3f}">'
            f'<div class="mt-gauge-head"><span>{E(t("gauge.cpu_prediction", lang, gib=num(predicted_gib, 1, lang)))}'
            f'</span><span class="mt-muted">{E(t("gauge.hypothetical", lang, gib=num(budget, 0, lang)))}</span></div>'
            f'<div class="mt-bar mt-bands">{_prediction_bar(0.0, predicted_gib, budget, lang, fits)}</div>'
            f'<div class="mt-gauge-foot"><span class="mt-pred-key"></span>{E(fit_text)}</div></div>')
    out.append("</div>")
    return "".join(out)


# --- progress and result --------------------------------------------------------------------------------------------
def progress_html(v: JobView, lang: str = "en") -> str:
    if v.state == "idle":
        return ('<div class="mt-progress" data-state="idle" data-step="0"><div class="mt-progress-top">'
                f'<span class="mt-badge mt-badge-idle">{E(t("state.idle", lang))}</span><span class="mt-muted">'
                f'{E(t("progress.idle", lang))}</span></div><div class="mt-bar"><div class="mt-fill" style="width:0%">'
                '</div></div></div>')
    frac = v.fraction
    label = t(f"state.{v.state}", lang)
    if v.state in ("running", "stopping") and v.phase and v.phase != "training" and not v.step:
        # the engine's own message in English; in another language the phase's name, then its message by its key
        # (a phase's locale text is what follows the name: "Carregando o modelo: carregando ... em 4 bits")
        words = said_text(v.phase_said, "", lang) if v.phase_said.get("key") else ""
        detail = E(v.phase_message if normalize(lang) == "en" and v.phase_message else
                   t(f"phase.{v.phase}", lang) + (_colon(lang) + words if words else "")
                   + (f" ({percent(v.phase_progress, lang)})" if v.phase_progress is not None else ""))
    elif v.state in ("failed", "interrupted") and not v.step:
        detail = E(t("progress.no_steps", lang))  # not "step 0 / ?": it ended before its first step
    else:
        step = t("progress.step", lang, step="\x00", total=integer(v.total_steps, lang) if v.total_steps else "?")
        detail = E(step).replace("\x00", f"<b class='mt-step'>{E(integer(v.step, lang))}</b>")
        if frac is not None:
            detail += f" &middot; {100 * frac:.0f}%"
    width = f"{100 * frac:.1f}%" if frac is not None else "100%"
    indeterminate = " mt-indeterminate" if frac is None and v.state in ("running", "stopping") else ""
    stats = []
    if v.state in ("running", "stopping") and v.eta_s is not None:
        stats.append(t("progress.eta", lang, eta=_duration(v.eta_s)))
    if v.elapsed_s is not None:
        stats.append(t("progress.elapsed", lang, elapsed=_duration(v.elapsed_s)))
    if v.tokens_per_s:
        stats.append(t("progress.tokens_per_s", lang, n=integer(v.tokens_per_s, lang)))
    if v.epoch is not None:
        stats.append(t("progress.epoch", lang, epoch=num(v.epoch, 2, lang)))
    if v.last_loss is not None:
        stats.append(t("progress.loss", lang, loss=num(v.last_loss, 4, lang)))
    return (f'<div class="mt-progress" data-state="{E(v.state)}" data-step="{v.step}" data-total="{v.total_steps or 0}" '
            f'data-run="{E(v.run_dir or "")}">'
            f'<div class="mt-progress-top"><span class="mt-badge mt-badge-{E(v.state)}">{E(label)}</span>'
            f'<span>{detail}</span></div>'
            f'<div class="mt-bar"><div class="mt-fill mt-run{indeterminate}" style="width:{width}"></div></div>'
            f'<div class="mt-stats">{E(" · ".join(stats))}</div></div>')


def queue_html(position: int, wait_s: float | None, lang: str = "en") -> str:
    """A queued run's place and predicted wait (public mode: strangers share the GPU, one run at a time)."""
    wait = t("progress.wait_unknown", lang) if wait_s is None else f"~{_duration(wait_s)}"
    return (f'<div class="mt-progress" data-state="queued" data-step="0" data-position="{position}">'
            f'<div class="mt-progress-top"><span class="mt-badge mt-badge-idle">{E(t("state.queued", lang))}</span>'
            f'<span id="mt-queue">{E(t("progress.queued", lang, position=position, wait=wait))}</span></div>'
            '<div class="mt-bar"><div class="mt-fill" style="width:0%"></div></div></div>')


def queue_list_html(running: list[Any], waiting: list[Any], lang: str = "en") -> str:
    """The Space owner's view of the whole queue: each job's id, owner and model."""
    def who(job: Any) -> str:
        return f"#{job.id} {job.owner or '-'} ({job.config.model})"

    jobs = ": " + ", ".join(who(j) for j in running + waiting) if running or waiting else ""
    return (f'<p id="mt-owner-queue" class="mt-small">'
            f'{E(t("queue.owner", lang, running=len(running), waiting=len(waiting), jobs=jobs))}</p>')


def peaks_html(summary: dict[str, Any], predicted: dict[str, float] | None, lang: str = "en",
               elem_id: str = "mt-peaks") -> str:
    """Predicted (core.estimate.predict) vs measured peak memory, side by side: torch allocated, torch reserved, NVML."""
    measured = {"allocated": summary.get("peak_allocated_gib"), "reserved": summary.get("peak_reserved_gib"),
                "nvml": summary.get("nvml_peak_gib")}
    on_gpu = any(isinstance(x, (int, float)) for x in measured.values())
    rows = []
    for key in ("allocated", "reserved", "nvml"):
        p = (predicted or {}).get(key)
        m = measured[key]
        unit = t("unit.gib", lang)
        pred_cell = f"{num(p, 2, lang)} {unit}" if isinstance(p, (int, float)) else "-"
        if isinstance(m, (int, float)):
            meas_cell = f"<b>{num(m, 2, lang)} {unit}</b>"
            if isinstance(p, (int, float)) and m > 0:
                meas_cell += f' <span class="mt-muted">({100 * (p - m) / m:+.0f}%)</span>'
        elif on_gpu:
            meas_cell = f'<span class="mt-muted">{E(t("peaks.not_measured", lang))}</span>'
        elif key == "allocated":  # a CPU run: one cell for the three rows
            meas_cell = f'<span class="mt-muted">{E(t("peaks.not_measured_cpu", lang))}</span>'
        else:
            meas_cell = None
        cell = ("" if meas_cell is None else
                f'<td rowspan="3" class="mt-peaks-cpu">{meas_cell}</td>' if not on_gpu else f"<td>{meas_cell}</td>")
        rows.append(f'<tr><th>{E(t(f"peaks.{key}", lang))}</th><td>{pred_cell}</td>{cell}</tr>')
    return (f'<table class="mt-peaks" id="{elem_id}"><thead><tr><th></th><th>{E(t("peaks.predicted", lang))}</th>'
            f'<th>{E(t("peaks.measured", lang))}</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def percent(x: float, lang: str = "en") -> str:
    """A fraction as a whole percentage (core.i18n.percent): 57% (en, pt), 57 % (fr)."""
    return whole_percent(x, lang)


def reward_rows(rewards: list[tuple[int, dict[str, float]]], lang: str = "en",
                elem_id: str = "mt-reward-accuracy", label: str = "result.reward_accuracy") -> list[tuple[str, str]]:
    """A preference run's result row, from its logged steps (the `metrics` events, or summary.json's
    preference.steps): reward accuracy first -> last, the best and its step, the last margin. Nothing for an SFT
    run, or a KTO run (it logs no accuracy). The same of its evals on validation pairs (the `eval` events, or
    preference.eval_steps) with label result.eval_reward_accuracy."""
    acc = [(step, r["reward_accuracy"]) for step, r in rewards if "reward_accuracy" in r]
    if not acc:
        return []
    best = max(acc, key=lambda sa: (sa[1], -sa[0]))
    text = (f'<span id="{E(elem_id)}" data-value="{acc[-1][1]:.6g}">{E(percent(acc[0][1], lang))} &rarr; '
            f'<b>{E(percent(acc[-1][1], lang))}</b></span> ('
            + E(t("result.reward_best", lang, best=percent(best[1], lang), step=best[0])) + ")")
    margin = rewards[-1][1].get("reward_margin")
    if margin is not None:
        text += " &middot; " + E(t("result.reward_margin", lang, margin=num(margin, 3, lang)))
    return [(t(label, lang), text)]


def grpo_rows(rewards: list[tuple[int, dict[str, float]]], lang: str = "en",
              elem_id: str = "mt-grpo-reward") -> list[tuple[str, str]]:
    """A GRPO run's result row, from its logged steps (the `metrics` events, or summary.json's grpo.steps): the mean
    reward first -> last and the best with its step, each scorer's last, the answers' mean length and the KL.
    Nothing for other stages."""
    mean = [(step, r["reward_mean"]) for step, r in rewards if "reward_mean" in r]
    if not mean:
        return []
    best = max(mean, key=lambda sm: (sm[1], -sm[0]))
    last = rewards[-1][1]
    text = (f'<span id="{E(elem_id)}" data-value="{mean[-1][1]:.6g}">{E(num(mean[0][1], 3, lang))} &rarr; '
            f'<b>{E(num(mean[-1][1], 3, lang))}</b></span> ('
            + E(t("result.reward_best", lang, best=num(best[1], 3, lang), step=best[0])) + ")")
    scorers = [(k[len(BY_SCORER):], v) for k, v in last.items() if k.startswith(BY_SCORER)]
    if len(scorers) > 1:
        text += " &middot; " + E(", ".join(f"{name} {num(v, 3, lang)}" for name, v in scorers))
    if last.get("completion_length") is not None:
        text += " &middot; " + E(t("result.grpo_length", lang, n=num(last["completion_length"], 1, lang)))
    if last.get("kl") is not None:
        text += " &middot; " + E(t("result.grpo_kl", lang, kl=num(last["kl"], 4, lang)))
    return [(t("result.grpo_reward", lang), text)]


def heldout_worse(summary: dict[str, Any] | None) -> bool:
    """The adapter scored lower on the held-out prompts than its parent or the base model."""
    return bool((heldout_scores(summary or {}) or {}).get("worse"))


def verdict_words(verdict: dict[str, Any], source: str | None, lang: str = "en") -> str:
    """A held-out verdict (core.runs.history.heldout_scores' key, params and message) in the page's language, by its
    key: rows the run trained on are never called held-out (core.scoring.heldout.verdict_key), whatever memtune wrote the summary."""
    if not verdict.get("key"):
        return str(verdict.get("message", ""))
    return said(verdict_key(verdict["key"], source), verdict.get("params"), lang)


def heldout_rows(summary: dict[str, Any] | None, lang: str = "en", elem_id: str = "mt-heldout") -> list[tuple[str, str]]:
    """Did it help? Base · Parent · Adapter on the held-out prompts, and the verdict said plainly (a warning when
    the adapter scored lower); that the rows were training rows where the run held none out."""
    held = heldout_scores(summary or {})
    if not held:
        return []
    names = [("base", held["base"]), ("parent", held["parent"]), ("adapter", held["adapter"])]
    cells = " &middot; ".join(
        f'{E(t(f"result.heldout.{name}", lang))} <b data-score="{name}">{E(percent(mean, lang))}</b>'
        for name, mean in names if mean is not None)
    words = verdict_words(held, held["source"], lang)
    text = (f'<span id="{E(elem_id)}" data-verdict="{E(held["verdict"])}">{cells}</span><br>'
            f'<span class="{"mt-warn-text" if held["worse"] else "mt-muted"}" id="{E(elem_id)}-verdict">'
            f'{E(words)}</span>')
    trained = {"train": "result.heldout.on_train", "demo": "result.heldout.on_demo"}.get(held.get("source"))
    if trained:  # scored on rows it trained on: never called held-out
        text += f'<br><span class="mt-muted">{E(t(trained, lang))}</span>'
    scorer = t(f"score.name.{held['scorer']}", lang)
    title = "result.heldout.title_trained" if trained else "result.heldout.title"
    return [(t(title, lang, scorer=scorer, n="-" if held["rows"] is None else held["rows"]), text)]


def result_html(v: JobView, lang: str = "en", predicted: dict[str, float] | None = None) -> str:
    if v.state in ("idle", "running", "stopping"):
        return ""
    s = v.summary or {}
    if v.state in ("failed", "interrupted") or not v.adapter_dir:
        title = t("result.failed" if v.state == "failed" else "result.interrupted", lang)
        advice = _run_advice(v.run_dir) if v.error_type == "oom" else None  # what would help, at the run's settings
        msg = (log_text(advice, lang) if advice else said_text(v.said, v.message, lang)) or (
            t("result.interrupted_message", lang, path=v.run_dir) if v.state == "interrupted"
            else t("result.no_adapter", lang))
        kind = f" ({E(t(f'log.error_type.{v.error_type}', lang))})" if v.error_type else ""
        return (f'<div class="mt-result mt-result-failed" id="mt-result-failed"><b>{E(title)}{kind}</b>'
                f'<pre class="mt-pre">{E(msg)}</pre>'
                + (f'<div class="mt-muted">{E(t("result.run_folder", lang, path=v.run_dir))}</div>' if v.run_dir else "")
                + "</div>")
    head = (t("result.finished", lang) if v.state == "completed"
            else t("result.stopped", lang, step=s.get("steps", v.step)))
    steps = integer(s.get("steps", v.step), lang)
    if s.get("max_steps"):
        steps = t("result.steps_of", lang, steps=steps, total=integer(s["max_steps"], lang))
    rows = [
        (t("result.adapter", lang), f'<code id="mt-adapter-path">{E(str(v.adapter_dir))}</code>'),
        (t("result.size", lang), size(s.get("adapter_bytes"), lang)),
        (t("result.loss", lang), (f"{num(s['first_loss'], 4, lang)} &rarr; " if s.get("first_loss") is not None else "")
         + (f"<b>{num(s['final_loss'], 4, lang)}</b>" if s.get("final_loss") is not None else "-")),
        (t("result.steps", lang), E(steps)),
        (t("result.time", lang), _duration(s.get("runtime_s"))
         + (" &middot; " + E(t("progress.tokens_per_s", lang, n=integer(s["tokens_per_s"], lang)))
            if s.get("tokens_per_s") else "")),
    ]
    rows += reward_rows(v.rewards, lang)
    rows += grpo_rows(v.rewards, lang)
    rows += reward_rows(v.eval_rewards, lang, "mt-eval-reward-accuracy", "result.eval_reward_accuracy")
    rows += heldout_rows(s, lang)
    table = "".join(f'<div class="mt-k">{E(k)}</div><div class="mt-v">{val}</div>' for k, val in rows)
    # never green when the held-out score fell, whatever the loss or the reward accuracy say
    cls = ("mt-result-worse" if heldout_worse(s) else "mt-result-ok") if v.state == "completed" else "mt-result-stopped"
    return (f'<div class="mt-result {cls}" id="mt-result-{E(v.state)}"><b>{E(head)}</b>'
            f'<div class="mt-kv">{table}</div>'
            f'<div class="mt-peaks-title">{E(t("result.peak", lang))}</div>{peaks_html(s, predicted, lang)}</div>')


def _colon(lang: str) -> str:
    return colon(lang)  # French typography, as fr.json's own lines; the full-width colon in zh and ja


def log_text(text: str, lang: str = "en") -> str:
    """Engine text (a note of the preview, a reason) in the page's language: by its key when it carries one
    (core.messages.Said), else as the engine wrote it."""
    if isinstance(text, str) and getattr(text, "key", "") and normalize(lang) != "en":
        return said(text.key, text.params, lang)
    return text


def log_line(line: str, lang: str = "en") -> str:
    """One run-log line (core.jobs.view.format_event) in the page's language: its message by its key, framed by
    the page's words for a warning, an error, a phase or the end. English, and an old run's line without a key
    (its message then stays English), show as the engine wrote them."""
    if normalize(lang) == "en" or not isinstance(line, SaidLine):
        return line
    when, head = line[:8], line.head
    body = said_text(line.said, line.english, lang)
    if line.kind == "run":
        return f"{when}  {body}"
    if line.kind == "phase":
        name = t(f"phase.{head.get('phase')}", lang)
        name = head.get("phase") or "" if name.startswith("phase.") else name  # a phase without words: its id
        tail = [f"{head['seconds']} s"] if head.get("seconds") is not None else []
        if tail and head.get("progress") is not None:  # how far the phase is: the data's tokenizing
            tail.append(percent(head["progress"], lang))
        tail_text = f" ({', '.join(tail)})" if tail else ""
        return f"{when}  {name}{_colon(lang) + body if body else ''}{tail_text}"
    if line.kind == "log":
        return f"{when}  {t('log.warning', lang) + ' ' if head.get('warning') else ''}{body}"
    if line.kind == "error":
        kind = t("log.error", lang, type=t(f"log.error_type.{head.get('error_type')}", lang))
        return f"{when}  {kind}{_colon(lang)}{body}"
    if line.kind == "done":
        status = t(f"state.{head.get('status')}", lang)
        return f"{when}  {t('log.finished', lang, status=status)} - {body}"
    return line


def said(key: str, params: dict[str, Any] | None, lang: str) -> str:
    """An engine message by its locale key (core.messages.say) in the page's language: the user's values as they
    are, numbers as the language writes them (a byte unit is a nested message: unit.gib): core.i18n.said."""
    return say_in(key, params, lang)


def error_text(exc: BaseException, lang: str) -> str:
    """An engine exception's message in the page's language: by its key when it has one (DataError, ModelError,
    a keyed ConfigError), else as str(exc) through the log rules."""
    return said_text(fields_of(exc), str(exc), lang)


def problem_text(field: str, key: str, params: dict[str, Any], lang: str) -> str:
    """A configuration problem on one line, "field: message -> fix", by its key in the page's language."""
    return f"{field}{_colon(lang)}{said(key, params, lang)} -> {said(key + '.fix', params, lang)}"


def _run_advice(run_dir: str | None) -> str | None:
    """What would help a run that ran out of memory (core/estimate/advice.py), from its folder's config.yaml (the
    run records only that it did); None without readable settings."""
    path = Path(run_dir or "") / "config.yaml"
    try:
        return _advice_of(str(path), path.stat().st_mtime_ns) if run_dir else None
    except OSError:
        return None


@functools.lru_cache(maxsize=32)
def _advice_of(config_yaml: str, stamp: int) -> str | None:
    """Once per version of the file (`stamp`: its mtime; a resume writes it again): the page asks at every poll."""
    try:
        return oom_advice(TrainConfig.load(config_yaml))
    except (OSError, ConfigError, TypeError, ValueError):  # written by another memtune, or edited by hand
        return None


def said_text(record: dict[str, Any] | None, english: str, lang: str) -> str:
    """A failed run's message (its error event's or summary.json's `key`/`params`/`problems`, core.messages.said_of)
    in the page's language (core.i18n.record_words); a record without them (an older run, an unexpected error) as its
    English through the log rules."""
    record = record or {}
    if normalize(lang) == "en" or not (record.get("key") or record.get("problems")):
        return log_text(english, lang)
    return record_words(record, english, lang)


def log_html(lines: list[str], lang: str = "en") -> str:
    """The run log, newest line at the bottom; the box stays scrolled to the end (CSS column-reverse)."""
    body = (E("\n".join(log_line(x, lang) for x in lines)) if lines
            else f'<span class="mt-muted">{E(t("run.log_empty", lang))}</span>')
    return f'<div class="mt-log" id="mt-log"><pre class="mt-pre">{body}</pre></div>'


# --- config summary, checklist facts and problems ------------------------------------------------------------------
class _Summary(ModelSlice, LoraSlice, DataSlice, TrainerSlice, Protocol):
    """What the summary's chips show: the model and its quantization, the data, the adapter and the step."""


def summary_html(cfg: _Summary | None, problems: list[Problem], checklist_on: dict[str, bool] | None = None,
                 predicted_gib: float | None = None, lang: str = "en", gpus: int = 1,
                 cpu_gib: float | None = None) -> str:
    """The settings at a glance, with every problem. `gpus`: the run's processes; above 1 the peak is per GPU.
    `cpu_gib`: the CPU memory the run needs, shown beside the GPU figure where it keeps weights or activations there
    (stream_layers, the offloads)."""
    if cfg is None:
        return problems_html(problems, t("summary.unreadable", lang), lang)
    quant = (t("summary.quant", lang, type=cfg.bnb_4bit_quant_type)
             + (" " + t("summary.double_quant", lang) if cfg.bnb_4bit_use_double_quant else "")
             if cfg.load_in_4bit else t("summary.no_quant", lang))
    modules = ",".join(m.replace("_proj", "") for m in cfg.lora_target_modules)
    chips = [
        ("model", cfg.model),
        ("data", f"{cfg.dataset} [{cfg.dataset_split}]"),
        ("quant", quant),
        ("precision", cfg.precision),
        ("lora", t("summary.lora", lang, r=cfg.lora_r, alpha=cfg.lora_alpha, modules=modules)),
        ("batch", t("summary.batch", lang, batch=cfg.per_device_train_batch_size,
                    accum=cfg.gradient_accumulation_steps, effective=cfg.effective_batch_size)),
        ("length", t("summary.max_length", lang, n=cfg.max_length)),
        ("optim", cfg.optim),
        ("checkpointing", t("summary.checkpointing_on" if cfg.gradient_checkpointing else "summary.checkpointing_off",
                            lang)),
        ("schedule", t("summary.steps", lang, n=cfg.max_steps) if cfg.max_steps > 0
         else t("summary.epochs", lang, n=f"{cfg.num_train_epochs:g}")),
        ("lr", t("summary.lr", lang, lr=formatted(cfg.learning_rate, "g", lang))),
    ]
    if cfg.packing:
        chips.append(("packing", t("summary.packing", lang)))
    if predicted_gib:
        chips.append(("predicted", t("summary.predicted", lang, gib=num(predicted_gib, 1, lang))
                      + (" " + t("summary.per_gpu", lang, n=gpus) if gpus > 1 else "")))
    if predicted_gib and cpu_gib:
        chips.append(("cpu-memory", t("summary.cpu_memory", lang, gib=num(cpu_gib, 1, lang))))
    out = ['<div class="mt-summary" id="mt-summary">']
    if checklist_on is not None:
        n = sum(checklist_on.values())
        out.append(f'<span class="mt-chip mt-chip-strong" data-key="checklist">'
                   f'{E(t("summary.checklist", lang, n=n, total=len(checklist_on)))}</span>')
    for key, text in chips:
        out.append(f'<span class="mt-chip" data-key="{key}">{E(text)}</span>')
    out.append("</div>")
    if problems:
        out.append(problems_html(problems, t("summary.fix_before", lang), lang))
    return "".join(out)


def saving_text(saved_gib: float | None, lang: str = "en") -> str:
    """What a checklist item saves at the current settings (core.estimate.predict), in words."""
    if saved_gib is None:
        return t("facts.no_estimate", lang)
    if saved_gib <= -0.05:  # the item raises the peak here (bf16 beside upcast_to_fp32, say): say so
        return t("facts.costs", lang, gib=num(-saved_gib, 1, lang))
    if saved_gib < 0.05:  # as core.estimate.predict.ItemSaving.text: below the estimate's resolution
        return t("facts.saves_nothing", lang)
    return t("facts.saves", lang, gib=num(saved_gib, 1, lang))


def facts_html(key: str, saved_gib: float | None, speed: list[tuple[str, str]], lang: str = "en",
               chapter_gib: float | None = None) -> str:
    """Beside a checklist item: what it saves here (GiB, predicted) and what it costs in speed (measured lines
    of (text, source), from ui.speed). `chapter_gib`: what it saves at the chapter's 8B settings, shown as a
    second, labelled line when the form is on another model (on the tiny demo most items save nothing)."""
    zero = " mt-fact-zero" if saved_gib is None or saved_gib < 0.05 else ""
    chapter = ""
    if chapter_gib is not None:
        text = (t("facts.at_chapter", lang, gib=num(chapter_gib, 1, lang)) if chapter_gib >= 0.05
                else t("facts.at_chapter_nothing", lang))
        chapter = f'<span class="mt-fact-line mt-fact-chapter">{E(text)}</span>'
    lines = "".join(f'<span class="mt-fact-line">{E(text)}'
                    + (f' <span class="mt-src">{E(source)}</span>' if source else "") + "</span>"
                    for text, source in speed)
    saves = f' data-saves="{saved_gib:.3f}"' if saved_gib is not None else ""  # for tests: the unrounded figure
    return (f'<div class="mt-facts" id="facts-{E(key)}"{saves}>'
            f'<div class="mt-fact mt-fact-mem{zero}"><span class="mt-fact-k">{E(t("facts.memory", lang))}</span>'
            f'<span class="mt-fact-v"><span class="mt-fact-line">{E(saving_text(saved_gib, lang))}</span>{chapter}'
            '</span></div>'
            f'<div class="mt-fact mt-fact-speed"><span class="mt-fact-k">{E(t("facts.speed", lang))}</span>'
            f'<span class="mt-fact-v">{lines}</span></div></div>')


def problems_html(problems: Iterable[Problem | str], title: str = "Problems", lang: str = "en") -> str:
    items = list(problems)
    if not items:
        return ""
    lis = []
    for p in items:
        if isinstance(p, Problem):
            message, fix = ((said(p.key, p.params, lang), said(p.key + ".fix", p.params, lang)) if p.key
                            else (p.message, p.fix))
            lis.append(f"<li><code>{E(p.field)}</code> {E(message)} &rarr; <i>{E(fix)}</i></li>")
        else:
            lis.append(f"<li>{E(str(p))}</li>")
    return (f'<div class="mt-problems" id="mt-problems"><b>{E(title)} ({len(items)})</b>'
            f'<ul>{"".join(lis)}</ul></div>')


def message_html(text: str, kind: str = "info", elem_id: str | None = None) -> str:
    """A one-off notice in place (kind: info | ok | warn | error)."""
    if not text:
        return ""
    ident = f' id="{E(elem_id)}"' if elem_id else ""
    return f'<div class="mt-note mt-note-{E(kind)}"{ident}><pre class="mt-pre">{E(text)}</pre></div>'


# --- history ------------------------------------------------------------------------------------------------------------
def run_detail_html(detail: Any, lang: str = "en", predicted: dict[str, float] | None = None) -> str:
    """One run of the history (core.runs.history.RunDetail): status, loss, steps, time, adapter, checkpoint, peaks."""
    info, s = detail.info, detail.summary or {}
    status = t(f"history.status.{info.status}", lang)
    loss = ((f"{num(info.first_loss, 4, lang)} &rarr; " if info.first_loss is not None else "")
            + (f"<b>{num(info.final_loss, 4, lang)}</b>" if info.final_loss is not None else "-"))
    steps = str(info.steps if info.steps is not None else "-")
    if info.max_steps:
        steps = t("result.steps_of", lang, steps=steps, total=info.max_steps)
    rows = [
        (t("history.col.status", lang), f'<span class="mt-badge mt-badge-{E(info.status)}">{E(status)}</span>'),
        (t("history.col.model", lang), E(info.model or "-")),
        (t("history.col.dataset", lang), E(info.dataset or "-")),
        (t("result.loss", lang), loss),
        (t("result.steps", lang), E(steps)),
        (t("history.col.duration", lang), E(_duration(info.duration_s))),
        (t("result.adapter", lang), f"<code>{E(info.adapter_dir)}</code>" if info.adapter_dir else "-"),
        (t("history.checkpoint", lang), f"<code>{E(info.checkpoint)}</code>" if info.checkpoint else "-"),
    ]
    pref = s.get("preference") if isinstance(s.get("preference"), dict) else {}
    rows += reward_rows([(int(x["step"]), x) for x in pref.get("steps") or [] if isinstance(x, dict) and "step" in x],
                        lang, "mt-history-reward-accuracy")
    rows += reward_rows([(int(x["step"]), x) for x in pref.get("eval_steps") or []
                         if isinstance(x, dict) and "step" in x],
                        lang, "mt-history-eval-reward-accuracy", "result.eval_reward_accuracy")
    grpo = s.get("grpo") if isinstance(s.get("grpo"), dict) else {}
    rows += grpo_rows([(int(x["step"]), x) for x in grpo.get("steps") or [] if isinstance(x, dict) and "step" in x],
                      lang, "mt-history-grpo-reward")
    rows += heldout_rows(s, lang, "mt-history-heldout")
    if info.message and info.status == "failed":
        oom = s.get("error_type") == "oom" and detail.config is not None  # what would help, at the run's settings
        text = log_text(oom_advice(detail.config), lang) if oom else said_text(info.said, info.message, lang)
        rows.append((t("history.message", lang), f'<span class="mt-warn-text">{E(text)}</span>'))
    table = "".join(f'<div class="mt-k">{E(k)}</div><div class="mt-v">{v}</div>' for k, v in rows)
    return (f'<div class="mt-result mt-history-detail" id="mt-history-detail" data-run="{E(info.name)}">'
            f'<b>{E(info.name)}</b><div class="mt-kv">{table}</div>'
            f'<div class="mt-peaks-title">{E(t("result.peak", lang))}</div>{peaks_html(s, predicted, lang, "mt-history-peaks")}</div>')
