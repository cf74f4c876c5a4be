"""HTML for the page's live parts: VRAM gauge, progress, result, config summary, checklist facts, data preview,
history details, problems and notices.

Pure functions from data to HTML strings (every user-supplied string escaped), so they are tested without a
browser. Every text comes from core.i18n in the page's language (`lang`); the engine's English lines (the run log,
the preview's notes, a failed run's message) are said in it by `_LOG_RULES` (`log_line`, `log_text`), and a line no
rule knows (a user's data error, a Python error) stays as the engine wrote it. Styling lives in ui/theme.py's CSS (classes prefixed `mt-`).
"""

from __future__ import annotations

import html
import math
import re
from typing import Any, Iterable

from core.config.settings import Problem, TrainConfig
from core.estimate.predict import FIT_MARGIN
from core.i18n import STRINGS, normalize, t
from core.jobs.view import JobView
from core.messages import SaidLine, fields_of, say

E = html.escape


def num(x: float, digits: int = 1, lang: str = "en") -> str:
    """A decimal number as the language writes it: 5.4 (en), 5,4 (pt, fr)."""
    text = f"{x:.{digits}f}"
    return text.replace(".", ",") if normalize(lang) in ("pt", "fr") else text


def _duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def integer(n: int | float | None, lang: str = "en") -> str:
    """A count as the language groups digits: 1,698 (en), 1.698 (pt), 1 698 (fr, narrow no-break space)."""
    if n is None:
        return "-"
    text = f"{round(n):,}"
    return text.replace(",", {"pt": ".", "fr": "\u202f"}.get(normalize(lang), ","))


# One unit system for sizes: binary (KiB, MiB, GiB), as the GPU memory figures everywhere on the page; French
# writes the octet (Kio, Mio, Gio). A tiny model's size reads 352 KiB, never 0.000352 GiB.
BYTE_UNITS = {"fr": ("o", "Kio", "Mio", "Gio", "Tio")}
IEC_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def size(n: int | float | None, lang: str = "en") -> str:
    if n is None:
        return "-"
    units = BYTE_UNITS.get(normalize(lang), IEC_UNITS)
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
    text = t("gauge.no_gpu", lang) if (not message or message.lower().startswith("no nvidia gpu")) else message
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
        # the engine's own message (English) in English; the phase's name in the other languages
        detail = E((v.phase_message if normalize(lang) == "en" else "") or t(f"phase.{v.phase}", lang))
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


def result_html(v: JobView, lang: str = "en", predicted: dict[str, float] | None = None) -> str:
    if v.state in ("idle", "running", "stopping"):
        return ""
    s = v.summary or {}
    if v.state in ("failed", "interrupted") or not v.adapter_dir:
        title = t("result.failed" if v.state == "failed" else "result.interrupted", lang)
        msg = said_text(v.said, v.message, lang) or (t("result.interrupted_message", lang, path=v.run_dir)
                                            if v.state == "interrupted" else t("result.no_adapter", lang))
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
    table = "".join(f'<div class="mt-k">{E(k)}</div><div class="mt-v">{val}</div>' for k, val in rows)
    cls = "mt-result-ok" if v.state == "completed" else "mt-result-stopped"
    return (f'<div class="mt-result {cls}" id="mt-result-{E(v.state)}"><b>{E(head)}</b>'
            f'<div class="mt-kv">{table}</div>'
            f'<div class="mt-peaks-title">{E(t("result.peak", lang))}</div>{peaks_html(s, predicted, lang)}</div>')


_LOG_TIME = re.compile(r"^(\d\d:\d\d:\d\d|--:--:--)  (.*)$", re.S)
_N = r"\d[\d,]*"  # a count as the engine writes it: 1234 or 1,234
_LOG_RULES: tuple[tuple[re.Pattern, Any], ...] = (  # the engine's English log lines -> the page's language
    # prefixes first: what follows them is said by the other rules
    (re.compile(r"finished: (\w+) - (?:Finished|Stopped) after (\d+) steps?; adapter saved to (.+) \(([\d.]+) MiB\)"),
     lambda m, lg: f'{t("log.finished", lg, status=t(f"state.{m[1]}", lg))} - '
                   + t("log.saved_one" if m[2] == "1" else "log.saved", lg, steps=_int(m[2], lg), path=m[3],
                       size=_mib(m[4], lg))),
    (re.compile(r"finished: (\w+) - (.*)", re.S),
     lambda m, lg: f'{t("log.finished", lg, status=t(f"state.{m[1]}", lg))} - {_say(m[2], lg)}'),
    (re.compile(r"ERROR \((\w+)\): (.*)", re.S),
     lambda m, lg: f'{t("log.error", lg, type=t(f"log.error_type.{m[1]}", lg))}{_colon(lg)}{_say(m[2], lg)}'),
    (re.compile(r"WARNING (.*)", re.S), lambda m, lg: f'{t("log.warning", lg)} {_say(m[1], lg)}'),
    (re.compile(r"run folder (.+)"), lambda m, lg: t("log.run_folder", lg, path=m[1])),
    (re.compile(r"\[(\w+)\] ?(.*?)(?: \((\d+ s)\))?"), lambda m, lg: _phase_line(m, lg)),
    (re.compile(r"step (\d+)/(\d+)  loss (\S+)  lr (\S+)  grad_norm (\S+)"),
     lambda m, lg: t("log.step", lg, step=_int(m[1], lg), total=_int(m[2], lg), loss=_dec(m[3], lg),
                     lr=_dec(m[4], lg), grad_norm=_dec(m[5], lg))),
    (re.compile(r"eval step (\d+)/(\d+)  (?:validation loss|eval_loss) (\S+)"),  # eval_loss: older runs
     lambda m, lg: t("log.eval", lg, step=_int(m[1], lg), total=_int(m[2], lg), loss=_dec(m[3], lg))),
    (re.compile(r"eval baseline \(before training\)  (?:validation loss|eval_loss) (\S+)"),
     lambda m, lg: t("log.eval_baseline", lg, loss=_dec(m[1], lg))),
    # core/train/callbacks.py on_evaluate: a held-out prompt, the model's answer, the reference (the texts as is)
    (re.compile(r"  (.*) \(reference (.*)\)", re.S),
     lambda m, lg: "  " + t("log.answer", lg, answer=m[1], reference=m[2])),
    (re.compile(r"Checkpoint saved: (.+)"), lambda m, lg: t("log.checkpoint", lg, path=m[1])),
    (re.compile(rf"LoRA: ({_N}) trainable parameters of ({_N})"),
     lambda m, lg: t("log.lora", lg, n=_int(m[1], lg), total=_int(m[2], lg))),
    (re.compile(rf"(Data|Validation rows): ({_N}) rows in (.+?), ({_N}) train at max_length (\d+)(?:: (.*?))?"
                rf"(?:; packed into ({_N}) sequences of up to \d+ tokens)?"), lambda m, lg: _data_line(m, lg)),
    (re.compile(rf"({_N}) assistant turns: ({_N}) trained whole, ({_N}) cut at max_length, ({_N}) dropped"),
     lambda m, lg: t("preview.turns", lg, n=_int(m[1], lg), trained=_int(m[2], lg), cut=_int(m[3], lg),
                     dropped=_int(m[4], lg))),
    (re.compile(rf"LoRA on (.+?): ({_N}) layers, ({_N}) trainable parameters((?:; .*)?)"),
     lambda m, lg: _lora_targets_line(m, lg)),
    # core/data/plan.py's notes
    (re.compile(rf"The longest row \(row ({_N})\) is ({_N}) tokens; (.+) \(max_length (\d+)\)\."),
     lambda m, lg: t("log.longest", lg, row=_int(m[1], lg), tokens=_int(m[2], lg), what=_reason(m[3], lg),
                     max_length=m[4])),
    (re.compile(r"Only the last assistant turn of each conversation trains: .*"),
     lambda m, lg: t("log.last_turn_only", lg)),
    (re.compile(r"Model type (\S+) is not in memtune's support matrix \(README\).*"),  # core/model/families.py
     lambda m, lg: t("log.family_unverified", lg, model_type=m[1])),
    # core/data/validation.py's Split.why, and the validation part's lines (core/train/recipe.py)
    (re.compile(rf"Validation: ({_N}) of ({_N}) rows held out \((\d+)%, seed (\d+)\), never trained on"),
     lambda m, lg: t("log.val_share", lg, n=_int(m[1], lg), total=_int(m[2], lg), share=m[3], seed=m[4])),
    (re.compile(rf"Validation: ({_N}) rows of (.+), never trained on"),
     lambda m, lg: t("preview.val.separate", lg, n=_int(m[1], lg), source=m[2])),
    (re.compile(r"Validation: off \(validation_share is 0\)"), lambda m, lg: t("preview.val.off", lg)),
    (re.compile(rf"Validation: off, every row trains: the split has ({_N}) rows and a hold-out needs ({_N}) .*"),
     lambda m, lg: t("preview.val.small", lg, rows=_int(m[1], lg), min=_int(m[2], lg))),
    (re.compile(r"No validation row fits max_length: no eval"), lambda m, lg: t("log.val_none_fit", lg)),
    (re.compile(r"keep_best / early_stopping_patience need validation rows, and there are none\. (.+)\. Give .*"),
     lambda m, lg: t("log.needs_validation", lg, why=_say(m[1], lg).rstrip("."))),
    # a config error (core.config.settings.ConfigError), and the LoRA targets' (core/model/load.py lora_targets)
    (re.compile(r"(\d+) problem\(s\) in the configuration:"), lambda m, lg: t("log.config_problems", lg, n=m[1])),
    (re.compile(r"(  - )?lora_target_modules: (.+) match no linear layer of (.+) -> use attention, mlp or all_linear, "
                r"or some of its linear layers: (.+)"),
     lambda m, lg: (m[1] or "") + t("log.no_target", lg, names=m[2], model=m[3], linear=m[4])),
    (re.compile(r"(.+) is not a causal \(decoder-only\) language model that transformers can load with "
                r"AutoModelForCausalLM, so memtune cannot fine-tune it\."),
     lambda m, lg: t("log.not_causal", lg, model=m[1])),
    # resume (core/runs/folders.py's checkpoint_problem)
    (re.compile(r"Not resuming from it: (.+)"), lambda m, lg: t("log.not_resuming", lg, why=_say(m[1], lg))),
    (re.compile(r"(.+) is incomplete \(no (\S+) marker: its save was interrupted\)"),
     lambda m, lg: t("log.ckpt_incomplete", lg, path=m[1], marker=m[2])),
    (re.compile(r"(.+) is damaged \((.+)\)"), lambda m, lg: t("log.ckpt_damaged", lg, path=m[1], why=_say(m[2], lg))),
    (re.compile(r"(.+) has no trainer_state\.json"), lambda m, lg: t("log.ckpt_no_state", lg, path=m[1])),
    (re.compile(r"it is not a complete torch file"), lambda m, lg: t("log.ckpt.torch", lg)),
    (re.compile(r"it is not valid JSON"), lambda m, lg: t("log.ckpt.json", lg)),
    (re.compile(r"its header is cut off"), lambda m, lg: t("log.ckpt.header_cut", lg)),
    (re.compile(r"its header cannot be read"), lambda m, lg: t("log.ckpt.header_unreadable", lg)),
    (re.compile(r"it has (\d+) bytes where its header promises (\d+)"),
     lambda m, lg: t("log.ckpt.size", lg, size=_int(m[1], lg), promised=_int(m[2], lg))),
    # Stop (core/train/callbacks.py)
    (re.compile(r"Stop requested: finishing the current step, then saving the adapter\."),
     lambda m, lg: t("log.stop_ack", lg)),
    (re.compile(r"Stop requested: ending after step (\d+)"), lambda m, lg: t("log.stop_after", lg, step=_int(m[1], lg))),
    (re.compile(r"summary\.json could not be written in (.+?): (.*)"),
     lambda m, lg: t("log.summary_unwritten", lg, path=m[1], error=m[2])),
    # several processes (core/jobs/launcher.py, core/gpus/distributed.py's plan reasons)
    (re.compile(r"(\d+) processes \((\d+) per machine, (\d+) machine\(s\)\), strategy (\w+): (.+)"),
     lambda m, lg: t("log.processes", lg, n=m[1], per=m[2], machines=m[3], strategy=m[4], reason=_say(m[5], lg))),
    (re.compile(r"one process"), lambda m, lg: t("log.reason.single", lg)),
    (re.compile(r"(\w+) as configured"), lambda m, lg: t("log.reason.configured", lg, strategy=m[1])),
    (re.compile(r"the model does not fit one GPU at these settings, so it is sharded \(fsdp\)"),
     lambda m, lg: t("log.reason.fsdp", lg)),
    (re.compile(r"the model fits one GPU, so each GPU holds a copy and the data is split \(ddp\)"),
     lambda m, lg: t("log.reason.ddp", lg)),
    (re.compile(r"CPU processes: data-parallel \(ddp\) over gloo"), lambda m, lg: t("log.reason.ddp_cpu", lg)),
    (re.compile(r"GPU memory unknown here: data-parallel \(ddp\), which needs the model to fit one GPU"),
     lambda m, lg: t("log.reason.ddp_unknown", lg)),
    # failures: core/train/recipe.py's oom_message and refusal, core/jobs/supervise.py's death message
    (re.compile(r"The GPU ran out of memory\. .*"), lambda m, lg: t("log.oom", lg)),
    (re.compile(r"- (.+?)(?: \(saves ~([\d.]+) GiB here\))?"), lambda m, lg: _oom_tip(m, lg)),
    (re.compile(rf"Nothing would train: in all ({_N}) non-empty rows of (.+) the prompt alone fills max_length (\d+) "
                rf"\(long_prompts is drop\)(?:, and ({_N}) are empty)?\. Raise max_length to (\d+), which fits (\d+)% "
                rf"of the rows whole \(the longest is ({_N}) tokens\), .*"),
     lambda m, lg: t("log.refusal", lg, rows=_int(m[1], lg), source=m[2], max_length=m[3], fit=m[5], share=m[6],
                     longest=_int(m[7], lg))
     + (" " + t("log.refusal_empty", lg, n=_int(m[4], lg)) if m[4] else "")),
    (re.compile(r"The training process died unexpectedly \((.+?)\)\.( SIGKILL often means .*)?"),
     lambda m, lg: t("log.died", lg, how=_say(m[1], lg)) + (" " + t("log.sigkill", lg) if m[2] else "")),
    (re.compile(r"A training process of this (\d+)-process run ended without finishing \(launcher (.+)\); .*"),
     lambda m, lg: t("log.worker_died", lg, n=m[1], how=_say(m[2], lg))),
    # core/jobs/supervise.py's KILL_REASONS: why a run was ended
    (re.compile(r"(?:Ended at once by a second Stop \((?P<second_stop>.+)\); this run saved no adapter\.|"
                r"The training process did not answer Stop within (?P<ack>\d+) s and was ended \((?P<no_answer>.+)\)\.|"
                r"The training process did not finish within (?P<fin>\d+) s of Stop and was ended \((?P<no_end>.+)\)\.|"
                r"The app was shut down during the run, which was ended \((?P<shutdown>.+)\)\.|"
                r"The run folder could not be written, so the run was ended \((?P<unwritable>.+)\)\.)"
                r"(?P<remain> Complete checkpoints, if any, remain for Resume in History\.)?"),
     lambda m, lg: _killed(m, lg)),
    # core/files.py's storage_message (error_type disk)
    (re.compile(r"No space left in (.+): free some disk space \(or choose another output folder\) and try again\."),
     lambda m, lg: t("log.disk_full", lg, path=m[1])),
    (re.compile(r"(.+) is on a read-only file system: choose an output folder you can write to\."),
     lambda m, lg: t("log.read_only", lg, path=m[1])),
    (re.compile(r"No permission to write in (.+): choose an output folder you can write to\."),
     lambda m, lg: t("log.no_permission", lg, path=m[1])),
    (re.compile(r"exit code (-?\d+)"), lambda m, lg: t("log.exit_code", lg, code=m[1])),
    (re.compile(r"killed by signal (\w+)"), lambda m, lg: t("log.exit_signal", lg, signal=m[1])),
    (re.compile(r"no exit status"), lambda m, lg: t("log.exit_none", lg)),
    (re.compile(r"Last lines of (.+):"), lambda m, lg: t("log.last_lines", lg, path=m[1])),
)


_PHASE_RULES: tuple[tuple[re.Pattern, Any], ...] = (  # a phase's message (core/train/, core/model/load.py, the manager)
    (re.compile(r"Reading (.+)"), lambda m, lg: t("log.phase.reading", lg, source=m[1])),
    (re.compile(r"Finding (.+)"), lambda m, lg: t("log.phase.finding", lg, model=m[1])),
    (re.compile(rf"Formatting and tokenizing ({_N}) rows \((\w+)\)"),
     lambda m, lg: t("log.phase.formatting", lg, n=_int(m[1], lg), format=m[2])),
    (re.compile(r"Loading and quantizing to 4-bit (.+)"), lambda m, lg: t("log.phase.loading_4bit", lg, model=m[1])),
    (re.compile(r"Loading (.+)"), lambda m, lg: t("log.phase.loading", lg, model=m[1])),
    (re.compile(rf"Warming up on the first micro-batch \(({_N}) tokens\): one forward \+ backward, no optimizer step"),
     lambda m, lg: t("log.phase.warming_up", lg, tokens=_int(m[1], lg))),
    (re.compile(r"Warm-up done in ([\d.]+) s"), lambda m, lg: t("log.phase.warmed_up", lg, seconds=_dec(m[1], lg))),
    (re.compile(r"Tokenizing"), lambda m, lg: t("log.phase.tokenizing", lg)),
    (re.compile(rf"Training: ({_N}) optimizer steps"), lambda m, lg: t("log.phase.training", lg, n=_int(m[1], lg))),
    (re.compile(r"Saving the adapter to (.+)"), lambda m, lg: t("log.phase.saving", lg, path=m[1])),
    (re.compile(r"Downloading (.+) from the Hub"), lambda m, lg: t("log.phase.downloading", lg, repo=m[1])),
    (re.compile(r"Downloading (.+): ([\d.]+) / ([\d.]+) GiB"),
     lambda m, lg: t("log.phase.download_progress", lg, repo=m[1], done=_dec(m[2], lg), total=_dec(m[3], lg),
                     unit=BYTE_UNITS.get(normalize(lg), IEC_UNITS)[3])),
    (re.compile(r"Starting the training process: (.+)"), lambda m, lg: t("log.phase.starting", lg, command=m[1])),
)


def _phase_line(m: re.Match, lang: str) -> str:
    """A phase (core.train.callbacks.phase): its name, then its message when a rule knows it (else the name alone:
    never English words), then how long it has run."""
    found = next((words(x, lang) for pattern, words in _PHASE_RULES if (x := pattern.fullmatch(m[2]))), None)
    name = t(f"phase.{m[1]}", lang)
    name = m[1] if name == f"phase.{m[1]}" else name  # a phase without words of its own: its id
    return name + (_colon(lang) + found if found else "") + (f" ({m[3]})" if m[3] else "")


def _data_line(m: re.Match, lang: str) -> str:
    """core.data.plan's DataPlan.describe() (and the validation part's, "Validation rows: ..."): the rows, then each
    outcome's count in the preview's words."""
    from core.data.plan import REASON_TEXT

    words = {text: reason for reason, text in REASON_TEXT.items()}
    head = "log.data" if m[1] == "Data" else "log.val_rows"
    parts = [t(head, lang, rows=_int(m[2], lang), dataset=m[3], train=_int(m[4], lang), max_length=m[5])]
    for piece in (m[6] or "").split(", "):
        n, _, text = piece.partition(" ")
        if text in words:
            parts.append(t(f"preview.reason.{words[text]}", lang, n=_int(n, lang)))
    if m[7]:
        parts.append(t("preview.packs", lang, n=_int(m[7], lang), max_length=m[5]))
    return parts[0] + (_colon(lang) + ", ".join(parts[1:]) if len(parts) > 1 else "")


def _colon(lang: str) -> str:
    return " : " if normalize(lang) == "fr" else ": "  # French typography, as fr.json's own lines


def _reason(text: str, lang: str) -> str:
    """A row's outcome in core.data.plan's words (REASON_TEXT) -> the preview's short word for it."""
    from core.data.plan import REASON_TEXT

    found = next((r for r, said in REASON_TEXT.items() if said == text), None)
    return t(f"preview.one.{found}", lang) if found else text


def _lora_targets_line(m: re.Match, lang: str) -> str:
    """core.model.lora_targets' Targets.describe(): the preview's LoRA line, then renamed and fused layers."""
    from core.model.lora_targets import PARTS

    parts = [t("preview.lora", lang, modules=m[1], layers=_int(m[2], lang), params=_int(m[3], lang))]
    words = {text: key for key, text in PARTS.items()}
    for piece in filter(None, m[4].split("; ")):
        fused = re.fullmatch(r"(\w+) trains whole: one fused layer holds (.+)", piece)
        shared = re.fullmatch(r"(\w+): the attention and MLP output projections share this name", piece)
        if fused:
            held = t(f"log.lora_parts.{words[fused[2]]}", lang) if fused[2] in words else fused[2]
            parts.append(t("preview.lora_fused", lang, fused=fused[1], parts=held))
        else:  # "q_proj -> qkv_proj" (names only) stays as it is
            parts.append(t("log.lora_shared", lang, name=shared[1]) if shared else piece)
    return "; ".join(parts)


def _oom_tip(m: re.Match, lang: str) -> str:
    """One line of core.train.recipe.oom_message's advice: a checklist item (its label in the page's language) and
    what it would save, or the fused-kernel / every-item-on line."""
    from core.config.checklist import ITEMS

    key = next((item.key for item in ITEMS if item.label == m[1]), None)
    if key:
        text = t(f"checklist.{key}.label", lang)
    elif m[1].startswith("Fused kernels (use_liger_kernel, CUDA)"):
        text = t("log.oom_liger", lang)
    elif m[1].startswith("Every checklist item is already on"):
        text = t("log.oom_all_on", lang)
    else:
        return m[0]
    return "- " + text + (" " + t("log.oom_saves", lang, gib=num(float(m[2]), 1, lang),
                                   unit=BYTE_UNITS.get(normalize(lang), IEC_UNITS)[3]) if m[2] else "")


def _killed(m: re.Match, lang: str) -> str:
    """core.jobs.supervise's death message for a run it ended (KILL_REASONS), the exit said by its own rule."""
    reason = next(k for k in ("second_stop", "no_answer", "no_end", "shutdown", "unwritable") if m[k] is not None)
    text = t(f"log.kill.{reason}", lang, how=_say(m[reason], lang), s=m["ack"] or m["fin"] or "")
    return text + (" " + t("log.kill.checkpoints_remain", lang) if m["remain"] else "")


def _mib(text: str, lang: str) -> str:
    return f"{num(float(text), 1, lang)} {BYTE_UNITS.get(normalize(lang), IEC_UNITS)[2]}"  # "0,2 Mio"


def _dec(text: str, lang: str) -> str:
    return text.replace(".", ",") if normalize(lang) in ("pt", "fr") else text


def _int(text: str, lang: str) -> str:
    """A count the engine wrote (1234 or 1,234) grouped as the language groups digits."""
    return integer(int(text.replace(",", "")), lang)


def log_rule(text: str, lang: str) -> str | None:
    """One line of engine text (no time) in `lang` by the first rule that matches it whole, or None: no rule knows it
    (it is then shown as the engine wrote it)."""
    for pattern, words in _LOG_RULES:
        if (found := pattern.fullmatch(text)):
            return words(found, lang)
    return None


def _say(text: str, lang: str) -> str:
    """Engine text of one or more lines in `lang`: each line by its rule, a line no rule knows (a quoted log line,
    a Python error) as it is."""
    return "\n".join(log_rule(line, lang) or line for line in text.split("\n"))


def log_text(text: str, lang: str = "en") -> str:
    """Engine text (a log line without its time, a note of the preview) in the page's language; English as is."""
    return text if normalize(lang) == "en" else _say(text, lang)


def log_line(line: str, lang: str = "en") -> str:
    """One run-log line in the page's language (the engine writes English; English lines are left as they are).
    An error line that carries its message's key (core.messages.SaidLine) is said by that key, not by the rules."""
    if normalize(lang) == "en" or not (m := _LOG_TIME.match(line)):
        return line
    if isinstance(line, SaidLine) and (head := re.match(r"(?:ERROR \((\w+)\):|finished: (\w+) -) ", m[2])):
        said = said_text(line.said, "", lang)
        if head[1]:
            return f'{m[1]}  {t("log.error", lang, type=t(f"log.error_type.{head[1]}", lang))}{_colon(lang)}{said}'
        return f'{m[1]}  {t("log.finished", lang, status=t(f"state.{head[2]}", lang))} - {said}'
    return f"{m[1]}  {log_rule(m[2], lang) or _say(m[2], lang)}"


def _number(value: int | float, lang: str, spec: str = "") -> str:
    """A number parameter of an engine message as the language writes it (ints grouped, decimal comma), to the
    locale text's format spec ("{loss:.4f}")."""
    if isinstance(value, int) and not spec.endswith(("f", "e", "g", "%")):
        return integer(value, lang)
    try:
        return _dec(format(value, spec.replace(",", "")) if spec else str(value), lang)
    except ValueError:
        return _dec(str(value), lang)


def said(key: str, params: dict[str, Any] | None, lang: str) -> str:
    """An engine message by its locale key (core.messages.say) in the page's language: the user's values as they
    are, numbers as the language writes them; a parameter that is an English sentence from elsewhere in the engine
    (`why`) goes through the log rules, and stays English when none knows it."""
    params = {k: (log_text(v, lang) if k == "why" and isinstance(v, str) else v) for k, v in (params or {}).items()}
    return say(key, params, lang, lookup=lambda k, lg: STRINGS[normalize(lg)].get(k), number=_number)


def error_text(exc: BaseException, lang: str) -> str:
    """An engine exception's message in the page's language: by its key when it has one (DataError, ModelError,
    a keyed ConfigError), else as str(exc) through the log rules."""
    return said_text(fields_of(exc), str(exc), lang)


def said_text(record: dict[str, Any] | None, english: str, lang: str) -> str:
    """A failed run's message (its error event's or summary.json's `key`/`params`/`problems`, core.messages.said_of)
    in the page's language; a record without them (an older run, an unexpected error) as its English through the log
    rules."""
    record = record or {}
    if normalize(lang) == "en" or not (record.get("key") or record.get("problems")):
        return log_text(english, lang)
    if record.get("key"):
        return said(record["key"], record.get("params"), lang)
    problems = record["problems"]
    lines = [t("problem.count", lang, n=integer(len(problems), lang))]
    for p in problems:
        lines.append(f'  - {p.get("field", "")}: {said(p["key"], p.get("params"), lang)} -> '
                     f'{said(p["key"] + ".fix", p.get("params"), lang)}')
    return "\n".join(lines)


def log_html(lines: list[str], lang: str = "en") -> str:
    """The run log, newest line at the bottom; the box stays scrolled to the end (CSS column-reverse)."""
    body = (E("\n".join(log_line(x, lang) for x in lines)) if lines
            else f'<span class="mt-muted">{E(t("run.log_empty", lang))}</span>')
    return f'<div class="mt-log" id="mt-log"><pre class="mt-pre">{body}</pre></div>'


# --- config summary, checklist facts and problems ------------------------------------------------------------------
def summary_html(cfg: TrainConfig | None, problems: list[Problem], checklist_on: dict[str, bool] | None = None,
                 predicted_gib: float | None = None, lang: str = "en", gpus: int = 1) -> str:
    """The settings at a glance, with every problem. `gpus`: the run's processes; above 1 the peak is per GPU."""
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
        ("lr", t("summary.lr", lang, lr=_dec(f"{cfg.learning_rate:g}", lang))),
    ]
    if cfg.packing:
        chips.append(("packing", t("summary.packing", lang)))
    if predicted_gib:
        chips.append(("predicted", t("summary.predicted", lang, gib=num(predicted_gib, 1, lang))
                      + (" " + t("summary.per_gpu", lang, n=gpus) if gpus > 1 else "")))
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
    if info.message and info.status == "failed":
        rows.append((t("history.message", lang), f'<span class="mt-warn-text">{E(said_text(info.said, info.message, lang))}</span>'))
    table = "".join(f'<div class="mt-k">{E(k)}</div><div class="mt-v">{v}</div>' for k, v in rows)
    return (f'<div class="mt-result mt-history-detail" id="mt-history-detail" data-run="{E(info.name)}">'
            f'<b>{E(info.name)}</b><div class="mt-kv">{table}</div>'
            f'<div class="mt-peaks-title">{E(t("result.peak", lang))}</div>{peaks_html(s, predicted, lang, "mt-history-peaks")}</div>')
