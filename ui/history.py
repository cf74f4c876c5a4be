"""The History tab's handlers: every run under the form's output folder (core.runs.history); pick one to see its loss
curve, settings and predicted vs measured peak; load its settings into the form, resume it (a job through
core.jobs.manager), continue its SFT adapter with preference tuning (a new DPO run in the form), delete it
after a confirmation. Tested without a browser; the layout is ui/after.py's.

Handlers take the `HistoryTab` (and, for those that fill the settings, the `Form`) first and return updates keyed
by component.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from core.i18n import t
from core.jobs.manager import JobBusy
from ui import render
from ui.derive import predicted_peaks
from ui.form import Form, Updates, apply_config
from ui.live import busy_message, loss_frame, start_run
from ui.notices import note, public_refusal, runs_folder, warn
from ui.tryexport import free_try_model
from ui.validation import curves_frame, detail_extra

COLUMNS = ("date", "name", "model", "dataset", "status", "final_loss", "peak", "duration", "steps", "resumable",
           "heldout")


@dataclass(eq=False)
class HistoryTab:
    table: Any  # gr.Dataframe of the runs
    runs: Any  # gr.State: run folders in table order
    selected: Any  # gr.State: the picked run's folder
    note: Any  # the tab's notice
    detail: Any  # the picked run, in HTML
    plot: Any  # its loss curve
    settings: Any  # its config.yaml
    load: Any  # buttons: load settings, resume, delete
    resume: Any
    delete: Any
    confirm_row: Any  # the delete confirmation (hidden until asked)
    confirm_text: Any
    main_tabs: Any  # the page's top-level tabs (load and resume show the Train tab)
    app: Any = None  # ui.state.AppState: the manager that says which run is running, and resumes one
    prefer: Any = None  # button: continue with preference tuning (the run's adapter as init_adapter of a DPO run)
    grpo: Any = None  # button: continue with GRPO (the run's adapter as init_adapter of a GRPO run)


def history_rows(output_dir: str | None, manager: Any) -> list[Any]:
    """core.runs.history.RunInfo of every run, newest first; the running job (if any) asked through the job manager."""
    from core.runs.history import list_runs

    return list_runs(runs_folder(output_dir), is_running=manager.is_running)


def history_frame(runs: list[Any], lang: str) -> pd.DataFrame:
    from core.runs.history import format_duration

    rows = [[r.date, r.name, r.model, r.dataset, t(f"history.status.{r.status}", lang),
             "" if r.final_loss is None else render.num(r.final_loss, 4, lang),  # as the Train tab writes it
             render.num(r.peak_gib, 2, lang) if r.peak_gib is not None else
             t("history.peak_cpu", lang) if r.status in ("completed", "stopped") else "",  # a finished run without
             # a GPU peak trained on the CPU, where GPU memory is not measured: say so rather than leave it blank
             format_duration(r.duration_s), "" if r.steps is None else str(r.steps),
             t("history.yes", lang) if r.resumable else "",
             "" if r.heldout is None else render.percent(r.heldout, lang) + (" ▼" if r.heldout_worse else "")]
            for r in runs]
    return pd.DataFrame(rows, columns=[t(f"history.col.{c}", lang) for c in COLUMNS])


def on_history_refresh(h: HistoryTab, lang: str, output_dir: str | None) -> Updates:
    """The table, the run folders in table order, and a notice when there is nothing to show."""
    runs = history_rows(output_dir, h.app.manager)
    empty = note(t("history.empty", lang, dir=runs_folder(output_dir)), "info", "history-note") if not runs else ""
    return {h.table: history_frame(runs, lang), h.runs: [r.run_dir for r in runs], h.note: empty}


def history_open(h: HistoryTab, lang: str, run_dir: str | None) -> Updates:
    """One run's detail, loss plot and settings, and whether load / resume / delete apply to it."""
    from core.runs.history import HistoryError, load_run

    off = gr.update(interactive=False)
    closed = {h.plot: gr.update(value=loss_frame([]), visible=False), h.settings: gr.update(value="", visible=False),
              h.load: off, h.resume: off, h.delete: off, h.prefer: off, h.grpo: off}
    if not run_dir:
        return {h.detail: "", **closed}
    try:
        if (refusal := public_refusal(lang, (run_dir, "run"))):
            raise HistoryError(refusal)
        detail = load_run(run_dir, is_running=h.app.manager.is_running)
    except HistoryError as exc:
        return {h.detail: warn(render.error_text(exc, lang), "history-note"), **closed}
    running = detail.info.status == "running"
    html = render.run_detail_html(detail, lang, predicted_peaks(detail.config)) + detail_extra(detail, lang)
    if not detail.info.resumable and not running:  # a greyed-out Resume says why
        html += note(t("history.no_resume", lang), "info", "history-no-resume")
    return {h.detail: html,
            h.plot: gr.update(value=curves_frame(detail.losses, detail.eval_losses, lang),
                              visible=bool(detail.losses or detail.eval_losses)),
            h.settings: gr.update(value=detail.config_text, visible=True),
            h.load: gr.update(interactive=detail.config is not None),
            h.resume: gr.update(interactive=detail.info.resumable and not running and detail.config is not None),
            # on for any readable run that is not running: a click on one it cannot continue says why (no adapter, a
            # preference run already), which a greyed-out button would not
            h.prefer: gr.update(interactive=detail.config is not None and not running),
            h.grpo: gr.update(interactive=detail.config is not None and not running),
            h.delete: gr.update(interactive=not running)}


def on_history_select(h: HistoryTab, lang: str, runs: list[str], evt: gr.SelectData) -> Updates:
    row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
    run_dir = runs[row] if runs and isinstance(row, int) and 0 <= row < len(runs) else None
    return {h.selected: run_dir, **history_open(h, lang, run_dir), h.confirm_row: gr.update(visible=False),
            h.note: ""}


def _picked(h: HistoryTab, lang: str, run_dir: str | None, read):
    """What History's form buttons check first: a run is picked, allowed here (public mode), and `read` takes it.
    Returns (what read returned, None) or (None, the refusal: the notice alone; the form stays as it is)."""
    from core.runs.history import HistoryError

    if not run_dir:
        return None, {h.note: warn(t("history.pick", lang), "history-note")}
    if (refusal := public_refusal(lang, (run_dir, "run"))):
        return None, {h.note: warn(refusal, "history-note", "error")}
    try:
        return read(run_dir), None
    except HistoryError as exc:
        return None, {h.note: warn(render.error_text(exc, lang), "history-note", "error")}


def to_train_tab(form: Form, h: HistoryTab, cfg: Any, lang: str, text: str, kind: str) -> Updates:
    return {**apply_config(form, cfg, lang), h.note: note(text, kind, "history-note"),
            h.main_tabs: gr.Tabs(selected="tab-train")}


def on_history_load(form: Form, h: HistoryTab, lang: str, run_dir: str | None) -> Updates:
    """The run's settings into the form, then the Train tab is shown."""
    from core.runs.history import load_run

    detail, refusal = _picked(h, lang, run_dir, load_run)
    if refusal:
        return refusal
    if detail.config is None:
        return {h.note: warn(t("history.unreadable", lang, name=detail.info.name), "history-note", "error")}
    from core.runs.public import without_remote_code

    cfg, asked = without_remote_code(detail.config.replace(resume_from=""))  # the user ticks it to confirm
    text = t("history.settings_loaded", lang, name=detail.info.name)
    if asked:
        text += " " + t("config.trust_off", lang, model=cfg.model)
    return to_train_tab(form, h, cfg, lang, text, "warn" if asked else "ok")


def on_history_resume(form: Form, h: HistoryTab, lang: str, run_dir: str | None) -> Updates:
    """Resume from the newest complete checkpoint: a job through core.jobs.manager; the form shows what trains."""
    from core.runs.history import resume_config

    cfg, refusal = _picked(h, lang, run_dir, resume_config)
    if refusal:
        return refusal
    if cfg.trust_remote_code:  # never run a model's code without the user's own tick: the form asks, Start resumes
        from core.runs.public import without_remote_code

        cfg, _ = without_remote_code(cfg)
        msg = t("history.trust_confirm", lang, name=Path(run_dir).name, model=cfg.model)
        return to_train_tab(form, h, cfg, lang, msg, "warn")
    from core.runs.folders import latest_checkpoint

    checkpoint = latest_checkpoint(Path(run_dir))
    manager = h.app.manager
    free_try_model(manager)
    try:
        start_run(cfg, manager)  # public mode: into the queue, as Start does
    except JobBusy as exc:
        return {h.note: warn(busy_message(exc, lang, manager), "history-note")}
    msg = t("history.resuming", lang, name=Path(run_dir).name, checkpoint=checkpoint.name if checkpoint else "-")
    return to_train_tab(form, h, cfg, lang, msg, "ok")


def on_history_prefer(form: Form, h: HistoryTab, lang: str, run_dir: str | None, stage: str = "dpo") -> Updates:
    """"Continue with preference tuning" (`stage` dpo) or "Continue with GRPO" (grpo): the run's settings into the
    form as a new run of that stage that starts from its adapter (init_adapter; core.runs.history.preference_config),
    then the Train tab; nothing starts until Start. Refused by name: no run picked, another visitor's run (public
    mode), a running run, no saved adapter, a preference or GRPO run already. GRPO reads the run's own data (prompts
    and their answers): only preference tuning asks for pairs."""
    from core.runs.history import load_run, needs_pairs, preference_config, schedule_note
    from core.runs.public import shown, without_remote_code

    cfg, refusal = _picked(h, lang, run_dir,
                           lambda d: preference_config(d, is_running=h.app.manager.is_running, stage=stage))
    if refusal:
        return refusal
    cfg, asked = without_remote_code(cfg)  # the user ticks it to confirm, as after Load
    name = Path(run_dir).name
    adapter = shown(str(Path(cfg.init_adapter) / "adapter"))
    pairs = needs_pairs(cfg) and stage != "grpo"
    parts = ([t("history.grpo.loaded", lang, name=name, adapter=adapter, run=cfg.run_name, n=cfg.num_generations,
                rewards=cfg.grpo_rewards)] if stage == "grpo" else
             [t("history.pref.loaded", lang, name=name, adapter=adapter, stage=cfg.stage.upper(), run=cfg.run_name),
              t("history.pref.change_data", lang, dataset=shown(cfg.dataset), stage=cfg.stage.upper()) if pairs
              else t("history.pref.demo_pairs", lang)])
    parent = load_run(run_dir).config
    if parent is not None and (changed := schedule_note(parent, cfg)) is not None:
        parts.append(t(changed.key, lang, **changed.params))
    if asked:
        parts.append(t("config.trust_off", lang, model=cfg.model))
    return to_train_tab(form, h, cfg, lang, " ".join(parts), "warn" if asked or pairs else "ok")


def on_history_delete(h: HistoryTab, lang: str, run_dir: str | None) -> Updates:
    """First step of deleting: show the confirmation (its text, and the row with Yes / Cancel)."""
    if not run_dir:
        return {h.confirm_row: gr.update(visible=False), h.confirm_text: "",
                h.note: warn(t("history.pick", lang), "history-note")}
    msg = note(t("history.delete_confirm", lang, name=Path(run_dir).name), "warn", "history-confirm-text")
    return {h.confirm_row: gr.update(visible=True), h.confirm_text: msg, h.note: ""}


def on_history_delete_yes(h: HistoryTab, lang: str, run_dir: str | None, output_dir: str | None) -> Updates:
    """Delete for real; the table is read again and the detail closed."""
    from core.runs.history import HistoryError, delete_run

    hide = {h.confirm_row: gr.update(visible=False)}
    if not run_dir:
        return {**hide, h.note: warn(t("history.pick", lang), "history-note")}
    try:
        path = delete_run(run_dir, runs_folder(output_dir), is_running=h.app.manager.is_running)
    except HistoryError as exc:
        return {**hide, **on_history_refresh(h, lang, output_dir),
                h.note: warn(t("history.delete_refused", lang, message=render.error_text(exc, lang)), "history-note",
                             "error")}
    return {**hide, **on_history_refresh(h, lang, output_dir), h.selected: None, **history_open(h, lang, None),
            h.note: note(t("history.deleted", lang, path=path), "ok", "history-note")}
