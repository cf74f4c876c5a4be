"""Validation on the page: the loss chart's two series, "what the model answers now", the preview's note on held-out
rows, and History's comparison of runs (core.runs.history.compare_runs), laid out by `build_compare` inside the History
tab. Plain HTML/DataFrames from core's data; tested without a browser, and in tests/test_browser_compare.py."""

from __future__ import annotations

import html
import json
import re
from functools import partial
from typing import Any

import gradio as gr
import pandas as pd

from core.config.settings import heldout_options
from core.i18n import DEFAULT_LANGUAGE, said, t
from core.runs.events import prompt_gist
from core.scoring.scorers import ScorerError, accepts
from ui.render import E, num, percent, verdict_words

PLOT_POINTS = 400


def _thin(points: list[tuple[int, float]], limit: int = PLOT_POINTS) -> list[tuple[int, float]]:
    if len(points) <= limit:
        return list(points)
    k = -(-len(points) // limit)
    return points[::k] + ([points[-1]] if (len(points) - 1) % k else [])


def curves_frame(losses: list[tuple[int, float]], eval_losses: list[tuple[int, float]] = (),
                 lang: str = DEFAULT_LANGUAGE) -> pd.DataFrame:
    """One run's loss chart: training and validation loss on one step axis (column `series`)."""
    rows = [(s, v, t("run.series_train", lang)) for s, v in _thin(list(losses))]
    rows += [(s, v, t("run.series_validation", lang)) for s, v in _thin(list(eval_losses))]
    return pd.DataFrame(rows, columns=["step", "loss", "series"])


# Vega's own "tableau10", the colours the charts had before they were named here.
PALETTE = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
           "#bab0ac")


def series_colors(value: Any) -> dict[str, str]:
    """{series: colour} for the series a chart's value holds (a DataFrame, or the page's copy of it), in order."""
    if value is None:
        return {}
    if isinstance(value, pd.DataFrame):
        names = value["series"].tolist() if "series" in value else []
    else:  # the browser's copy: Gradio's PlotData, {"columns": [...], "data": [[...], ...]}
        columns = value.get("columns") if isinstance(value, dict) else getattr(value, "columns", None)
        data = value.get("data") if isinstance(value, dict) else getattr(value, "data", None)
        if not columns or "series" not in columns:
            return {}
        i = list(columns).index("series")
        names = [row[i] for row in data or []]
    return {name: PALETTE[k % len(PALETTE)] for k, name in enumerate(dict.fromkeys(map(str, names)))}


def rekey(value: Any) -> Any:
    """The chart's colours named for exactly the series it now holds (see draw_every_series)."""
    colors = series_colors(value)
    return gr.update(color_map=colors) if colors else gr.skip()


def draw_every_series(plot: Any) -> None:
    """Gradio's LinePlot fixes which series it draws (its colour domain) when it builds its chart: when first shown and
    when a setting such as color_map changes; a new value only swaps the data. A series that appeared later (the
    training curve after the baseline eval), other runs, or the names in another language were not drawn.
    After each new value the page is sent a color_map of exactly the series it holds (read back from the page, so
    the value has landed), which rebuilds the chart with them; an unchanged map rebuilds nothing."""
    plot.change(rekey, inputs=[plot], outputs=[plot], show_progress="hidden", queue=False)


def answers_html(answers: list[dict[str, str]], step: int | None, lang: str = DEFAULT_LANGUAGE) -> str:
    """"What the model answers now": each validation prompt, its reference answer and the model's greedy answer."""
    if not answers:
        return ""
    head = "".join(f"<th>{E(t(k, lang))}</th>" for k in ("eval.prompt", "eval.reference", "eval.answer"))
    rows = "".join(
        f"<tr><td><code>{E(prompt_gist(a.get('prompt', ''), 200))}</code></td><td>{E(a.get('reference', ''))}</td>"
        f"<td class=\"{'mt-ok-text' if a.get('answer', '').strip() == a.get('reference', '').strip() else ''}\">"
        f"{E(a.get('answer', ''))}</td></tr>" for a in answers)
    when = t("eval.at_step", lang, step=step) if step else t("eval.baseline", lang)
    return (f'<div class="mt-answers" id="mt-answers" data-step="{E(str(step or 0))}">'
            f'<b>{E(t("eval.title", lang))}</b> <span class="mt-small">({E(when)})</span>'
            f'<table class="mt-table"><tr>{head}</tr>{rows}</table></div>')


def eval_line(summary: dict[str, Any], lang: str = DEFAULT_LANGUAGE) -> str:
    """The eval losses of a finished run, in one line (History's detail)."""
    ev = summary.get("eval") if isinstance(summary, dict) else None
    if not isinstance(ev, dict) or ev.get("final") is None:
        return ""
    base = num(ev["baseline"], 4, lang) if ev.get("baseline") is not None else "-"
    return ('<div class="mt-small" id="mt-eval-line">' + E(t(
        "eval.losses", lang, baseline=base, final=num(ev["final"], 4, lang), step=ev.get("final_step"),
        best=num(ev.get("best") or 0.0, 4, lang), best_step=ev.get("best_step"),
        adapter_step=ev.get("adapter_step"))) + "</div>")


def detail_extra(detail: Any, lang: str = DEFAULT_LANGUAGE) -> str:
    """What History's detail adds for a run with validation: its eval losses and its last answers."""
    step, answers = detail.answers[-1] if detail.answers else (None, [])
    return eval_line(detail.summary or {}, lang) + answers_html(answers, step, lang)


def split_note(held: Any, lang: str = DEFAULT_LANGUAGE) -> str:
    """The preview's line on validation: what is held out, or why every row trains."""
    from core.data.validation import MIN_ROWS_FOR_SHARE

    n_all = len(held.train_ids) + (len(held.val_ids) if held.mode == "share" else 0)
    if held.mode == "share":
        text = t("preview.val.share", lang, n=len(held.val_ids), total=n_all, train=len(held.train_ids))
    elif held.mode == "separate":
        text = t("preview.val.separate", lang, n=len(held.val_ids), source=held.source)
    elif n_all < MIN_ROWS_FOR_SHARE:
        text = t("preview.val.small", lang, rows=n_all, min=MIN_ROWS_FOR_SHARE)
    else:
        text = t("preview.val.off", lang)
    return f'<div class="mt-note mt-small" id="preview-validation">{E(text)}</div>'


# --- the held-out scorer's preview ----------------------------------------------------------------------------------
SAMPLE_ID = "preview-heldout-rows"  # the data preview's tag carrying the rows the scorer's preview shows


def sample_tag(sample: dict[str, Any] | None) -> str:
    """The held-out rows of a data preview's answer (core.jobs.preview.heldout_sample), kept in the preview's HTML:
    the scorer's preview beside heldout_scorer reads them there, whichever scorer is chosen later."""
    if not isinstance(sample, dict):
        return ""
    return f'<div id="{SAMPLE_ID}" hidden data-sample="{E(json.dumps(sample, ensure_ascii=False))}"></div>'


def sample_of(preview: Any) -> dict[str, Any] | None:
    """The held-out rows sample_tag kept in a data preview's HTML, or None (no preview yet, or a preference stage's)."""
    found = re.search(rf'id="{SAMPLE_ID}" hidden data-sample="([^"]*)"', str(preview or ""))
    if not found:
        return None
    try:
        sample = json.loads(html.unescape(found.group(1)))
    except ValueError:
        return None
    return sample if isinstance(sample, dict) and isinstance(sample.get("rows"), list) else None


def scorer_preview(sample: dict[str, Any] | None, scorer: str, options: str, lang: str = DEFAULT_LANGUAGE) -> str:
    """What the held-out scorer checks on three rows of the data: each prompt, its reference answer and what the
    scorer would accept (core.scoring.scorers.accepts), or why the options cannot be used; none when off."""
    if not scorer or scorer == "off":
        return ""
    if not sample:
        return f'<div class="mt-note mt-small" id="scorer-preview-empty">{E(t("score.preview.empty", lang))}</div>'
    try:
        opts = heldout_options(options or "")
    except ValueError as exc:
        why = t("problem.heldout_options", lang, value=options, why=str(exc))
        return f'<div class="mt-warn-text mt-small" id="scorer-preview-error">{E(why)}</div>'
    rows = []
    for row in sample.get("rows", []):
        try:
            what = accepts(scorer, str(row.get("reference", "")), **opts)
            cell, cls = said(what.key, what.params, lang), ""
        except (ScorerError, TypeError, ValueError) as exc:
            cell, cls = said(exc.key, exc.params, lang) if getattr(exc, "key", "") else str(exc), "mt-warn-text"
        rows.append(f'<tr><td><code>{E(prompt_gist(str(row.get("prompt", "")), 200))}</code></td>'
                    f'<td>{E(str(row.get("reference", "")))}</td><td class="{cls}">{E(cell)}</td></tr>')
    trained = sample.get("source") in ("train", "demo")
    title = t("score.preview.title_trained" if trained else "score.preview.title", lang,
              scorer=t(f"score.name.{scorer}", lang), n=len(rows))
    head = "".join(f"<th>{E(t(k, lang))}</th>" for k in ("eval.prompt", "eval.reference", "score.preview.accepts"))
    return (f'<div class="mt-answers" id="scorer-preview-box" data-source="{E(str(sample.get("source", "")))}">'
            f'<b>{E(title)}</b><table class="mt-table"><tr>{head}</tr>{"".join(rows)}</table></div>')


def on_scorer_preview(lang: str, preview: Any, scorer: str, options: str) -> str:
    """The scorer's preview for the form's scorer and options, on the rows the data preview holds."""
    return scorer_preview(sample_of(preview), scorer, options, lang)


# --- History: compare runs -----------------------------------------------------------------------------------------
def _value(x: Any, lang: str) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return num(x, 4 if abs(x) < 100 else 1, lang)
    if isinstance(x, list):
        return ", ".join(map(str, x))
    return str(x)


def _figure(key: str, x: Any, lang: str) -> str:
    """One of core.runs.history.FIGURES as the rest of the page writes it: time as History's 0:26, speed as the
    progress line's "3,512 tokens/s", counts grouped, losses with 4 decimals."""
    from core.runs.history import format_duration
    from ui.render import integer

    if x is None:
        return "-"
    if key == "runtime_s":
        return format_duration(x)
    if key == "tokens_per_s":
        return t("progress.tokens_per_s", lang, n=integer(x, lang))
    if key == "steps":
        return integer(x, lang)
    if key == "peak_gib":
        return num(x, 2, lang)
    if key == "final_reward_accuracy":
        return percent(x, lang)
    return num(x, 4, lang) if isinstance(x, (int, float)) else _value(x, lang)


LEGEND_CHARS = 26  # about what the chart's legend shows of a label before cutting it with "…" (Vega's 160 px)


def legend_names(names: list[str], longest_kind: int) -> dict[str, str]:
    """Each run's name as the legend shows it, beside its curve's kind: whole when it fits; otherwise without the part
    every picked run's name shares (`run-20261204-` of two runs of one day), then its end (which tells runs apart)."""
    import os.path

    room = LEGEND_CHARS - longest_kind - 3  # " · " between name and kind
    if max(map(len, names), default=0) <= room:
        return {n: n for n in names}
    common = os.path.commonprefix(names) if len(names) > 1 else ""
    cut = max(common.rfind(c) for c in "-_ ./") + 1
    short = {n: n[cut:] or n for n in names}
    short = {n: s if len(s) <= room else "…" + s[-(room - 1):] for n, s in short.items()}
    return short if len(set(short.values())) == len(names) else {n: n for n in names}


def compare_frame(cmp: Any, lang: str = DEFAULT_LANGUAGE) -> pd.DataFrame:
    """All picked runs' curves on one chart: one series per run and kind (training, validation), named to fit the
    legend (the tables above name the runs in full)."""
    kinds = {"train": t("run.series_train", lang), "validation": t("run.series_validation", lang)}
    shown = legend_names(list(cmp.names), max(map(len, kinds.values())))
    rows = [(step, loss, f"{shown.get(name, name)} · {kinds.get(kind, kind)}")
            for name, kind, step, loss in cmp.curves]
    return pd.DataFrame(rows, columns=["step", "loss", "series"])


def heldout_cell(scores: dict[str, Any] | None, lang: str = DEFAULT_LANGUAGE) -> str:
    """One run's held-out scores in Compare's column: the scorer, base · parent · adapter, where the rows came from
    when the run trained on them, and, when the adapter scored lower than its parent or the base, the verdict in
    the page's language, marked."""
    if not scores:
        return "-"
    parts = [(name, scores.get(name)) for name in ("base", "parent", "adapter")]
    cells = " &middot; ".join(f'{E(t(f"result.heldout.{name}", lang))} <b data-score="{name}">'
                              f"{E(percent(value, lang))}</b>" for name, value in parts if value is not None)
    scorer, source = scores.get("scorer"), scores.get("source")
    text = f'{E(t(f"score.name.{scorer}", lang))}: {cells}'
    if source in ("train", "demo"):
        text += f'<br><span class="mt-muted">{E(t(f"score.source.{source}", lang))}</span>'
    if scores.get("worse"):
        words = verdict_words(scores, source, lang)
        kind = E(str(scores.get("verdict", "")))
        text += f'<br><span class="mt-warn-text" data-worse="{kind}">&#9660; {E(words)}</span>'
    return text


def heldout_table(cmp: Any, lang: str = DEFAULT_LANGUAGE) -> str:
    """Did it help? One row per run: its held-out scores in a column of their own, and a GRPO run's final mean
    reward; none when no picked run has either."""
    held = list(getattr(cmp, "heldout", []) or [None] * len(cmp.names))
    rewards = list(getattr(cmp, "rewards", []) or [None] * len(cmp.names))
    if not any(held) and all(r is None for r in rewards):
        return ""
    head = "".join(f"<th>{E(t(k, lang))}</th>" for k in
                   ("history.compare.run", "history.compare.heldout", "history.compare.final_reward"))
    rows = "".join(
        f'<tr data-run="{E(name)}" data-worse="{int(bool(h and h.get("worse")))}"><td>{E(name)}</td>'
        f'<td class="mt-compare-heldout">{heldout_cell(h, lang)}</td>'
        f'<td>{"-" if r is None else E(num(r, 3, lang))}</td></tr>'
        for name, h, r in zip(cmp.names, held, rewards))
    return (f'<b>{E(t("history.compare.heldout_title", lang))}</b>'
            f'<table class="mt-table" id="compare-heldout-table"><tr>{head}</tr>{rows}</table>')


def compare_html(cmp: Any, lang: str = DEFAULT_LANGUAGE) -> str:
    """The settings that differ (only those), then the figures side by side."""
    head = f"<th>{E(t('history.compare.setting', lang))}</th>" + "".join(f"<th>{E(n)}</th>" for n in cmp.names)
    if cmp.settings:
        rows = "".join(f'<tr data-field="{E(k)}"><td><code>{E(k)}</code></td>'
                       + "".join(f"<td>{E(_value(v, lang))}</td>" for v in vals) + "</tr>" for k, vals in cmp.settings)
        settings = f'<table class="mt-table" id="compare-settings-table"><tr>{head}</tr>{rows}</table>'
    else:
        settings = f'<p>{E(t("history.compare.same", lang))}</p>'
    figs = "".join(f'<tr data-figure="{E(k)}"><td>{E(t(f"history.fig.{k}", lang))}</td>'
                   + "".join(f"<td>{E(_figure(k, v, lang))}</td>" for v in vals) + "</tr>" for k, vals in cmp.figures)
    results = f"<th>{E(t('history.compare.result', lang))}</th>" + "".join(f"<th>{E(n)}</th>" for n in cmp.names)
    return (f'<div class="mt-compare" id="mt-compare"><b>{E(t("history.compare.settings", lang))}</b>{settings}'
            f'<b>{E(t("history.compare.figures", lang))}</b>'
            f'<table class="mt-table" id="compare-figures-table"><tr>{results}</tr>{figs}</table>'
            f'{heldout_table(cmp, lang)}</div>')


def run_choices(output_dir: str | None, manager: Any) -> list[tuple[str, str]]:
    """(label, run folder) of every run, newest first: the comparison's picker."""
    from core.runs.history import list_runs
    from ui.notices import runs_folder

    return [(f"{r.name} ({r.date})", r.run_dir) for r in list_runs(runs_folder(output_dir), manager.is_running)]


def on_compare(manager: Any, lang: str, run_dirs: list[str] | None) -> tuple[Any, Any]:
    """The chart and the tables for the picked runs (two or more), or a notice."""
    from core.runs.history import HistoryError, compare_runs
    from ui.notices import public_refusal, warn

    picked = [d for d in (run_dirs or []) if d]
    if len(picked) < 2:
        return gr.update(visible=False), warn(t("history.compare.need_two", lang), "compare-note")
    try:
        for d in picked:
            if (refusal := public_refusal(lang, (d, "run"))):
                raise HistoryError(refusal)
        cmp = compare_runs(picked, manager.is_running)
    except HistoryError as exc:
        return gr.update(visible=False), warn(str(exc), "compare-note", "error")
    return gr.update(value=compare_frame(cmp, lang), visible=True), compare_html(cmp, lang)


def build_compare(tr: Any, lang0: str, lang: Any, output_dir: Any, history_tab: Any, refresh: Any,
                  manager: Any) -> dict[str, Any]:
    """History's "Compare runs" section (inside the History tab): pick runs, one chart, what differs."""
    L = partial(t, lang=lang0)  # noqa: N806
    with gr.Accordion(L("history.compare.title"), open=False, elem_id="compare-acc") as acc:
        tr.add(acc, label="history.compare.title")
        with gr.Row():
            picker = tr.add(gr.Dropdown(choices=[], value=[], multiselect=True, label=L("history.compare.pick"),
                                        elem_id="compare-runs", scale=4), label="history.compare.pick")
            button = tr.add(gr.Button(L("history.compare.button"), scale=1, elem_id="compare-btn"),
                            value="history.compare.button")
        plot = gr.LinePlot(curves_frame([], [], lang0), x="step", y="loss", color="series",
                           color_title=L("run.series_legend"), title=None, y_title=L("run.loss_axis"), x_title=L("run.step_axis"), height=300,
                           elem_id="compare-plot", show_label=False, visible=False)
        tr.add(plot, y_title="run.loss_axis", x_title="run.step_axis", color_title="run.series_legend")
        tables = gr.HTML(elem_id="compare-tables")
        draw_every_series(plot)

    def choices(out: str | None, current: list[str] | None):
        options = run_choices(out, manager)
        known = {d for _, d in options}
        kept = [d for d in (current or []) if d in known]
        if kept == list(current or []):  # the value read when the event fired: runs picked since must stay picked
            return gr.update(choices=options)
        return gr.update(choices=options, value=kept)  # a picked run was deleted

    quiet = dict(show_progress="hidden", queue=False)
    for event in (history_tab.select, refresh.click, acc.expand):
        event(choices, inputs=[output_dir, picker], outputs=[picker], **quiet)
    button.click(partial(on_compare, manager), inputs=[lang, picker], outputs=[plot, tables])
    return {"picker": picker, "button": button, "plot": plot, "tables": tables}
