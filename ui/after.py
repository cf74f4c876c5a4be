"""After training: the "Try it", "Export" and "History" tabs (handlers first, tested without a browser; then
`build_tabs`, called by ui.blocks.build_ui inside its top-level gr.Tabs).

- Try it: base vs base + adapter side by side, streaming (a generator over core.infer.COMPARER.compare). One
  model for the process; refused while a training run uses the machine. Stop ends the answer at the next token.
- Export: the adapter as a zip; a merged bf16 model (warning, memory check, a confirmation tick, progress);
  a push to the Hub with a token from $HF_TOKEN or typed into a password box (used for that push only: never
  kept in the page state, written anywhere or logged).
- History: every run under the form's output folder (core.history); pick one to see its loss curve, settings
  and predicted vs measured peak; load its settings into the form, resume it (a job through core.jobs), delete
  it after a confirmation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr
import pandas as pd

from core.i18n import DEFAULT_LANGUAGE, t
from core.jobs import MANAGER, JobBusy
from ui import render

PLOT_COLUMNS = ("step", "loss")


def _output_dir(output_dir: str | None) -> str:
    from core.public import is_public, public_root

    if is_public():  # a visitor's typed folder is never listed, loaded or deleted from
        return str(public_root())
    return (output_dir or "").strip() or "runs"


def _public_refusal(*folders: tuple[str | None, str]) -> str | None:
    """Public mode: why one of these (folder, what) lies outside the app's runs folder, or None."""
    from core.public import check_folder

    try:
        for folder, what in folders:
            check_folder(folder, what)
    except ValueError as exc:
        return str(exc)
    return None


def _empty_plot() -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in PLOT_COLUMNS})


def note(text: str, kind: str = "info", elem_id: str | None = None) -> str:
    return render.message_html(text, kind, elem_id)


def warn(text: str, elem_id: str | None = None, kind: str = "warn") -> str:
    """A notice in place and a toast: what every refusal and error here does."""
    gr.Warning(text)
    return note(text, kind, elem_id)


# --- try it ---------------------------------------------------------------------------------------------------------
def adapter_dropdown(output_dir: str | None, current: str | None = None, lang: str = DEFAULT_LANGUAGE) -> dict:
    """The adapters of every run under output_dir, newest first; keeps the current pick if it is still there."""
    from core.history import adapter_choices

    choices = adapter_choices(_output_dir(output_dir))
    paths = [p for _, p in choices]
    value = current if current in paths else (paths[0] if paths else None)
    return gr.update(choices=choices, value=value,
                     info=None if choices else t("try.no_adapters", lang))


def on_try(lang: str, adapter: str | None, prompt: str, max_new_tokens: float, temperature: float, top_p: float,
           seed: float, raw: bool) -> Iterator[tuple[Any, Any, str]]:
    """Stream (base answer, base + adapter answer, status) for one prompt; refusals and errors as messages."""
    from core.infer import COMPARER, InferError, adapter_config

    if MANAGER.busy():
        yield gr.skip(), gr.skip(), warn(t("try.refused_training", lang), "try-note")
        return
    if not adapter:
        yield gr.skip(), gr.skip(), warn(t("try.pick_adapter", lang), "try-note")
        return
    if not (prompt or "").strip():
        yield gr.skip(), gr.skip(), warn(t("try.empty_prompt", lang), "try-note")
        return
    try:
        model = adapter_config(adapter).model
    except InferError as exc:
        yield gr.skip(), gr.skip(), warn(str(exc), "try-note", "error")
        return
    yield "", "", note(t("try.loading", lang, model=model, path=adapter), "info", "try-note")
    base = tuned = ""
    try:
        for base, tuned in COMPARER.compare(adapter, prompt, max_new_tokens=int(max_new_tokens),
                                            temperature=float(temperature), top_p=float(top_p), seed=int(seed or 0),
                                            template=not raw):
            yield base, tuned, gr.skip()
    except InferError as exc:
        yield base, tuned, warn(str(exc), "try-note", "error")
        return
    except Exception as exc:  # noqa: BLE001 - a crash in generation must not take the page with it
        yield base, tuned, warn(t("msg.error", lang, message=f"{type(exc).__name__}: {exc}"), "try-note", "error")
        return
    yield base, tuned, note(t("try.done", lang), "ok", "try-note")


def on_try_stop(lang: str = DEFAULT_LANGUAGE) -> str:
    from core.infer import COMPARER

    COMPARER.stop()
    return note(t("try.stopped", lang), "warn", "try-note")


# --- export ---------------------------------------------------------------------------------------------------------
def _size(path: Path) -> str:
    total = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return render._bytes(total)


def _gib(n_bytes: int, lang: str) -> str:
    """GiB with the precision a small model needs too: 12.3, 0.04, <0.01."""
    gib = n_bytes / 2**30
    if gib >= 1:
        return render.num(gib, 1, lang)
    return render.num(gib, 2, lang) if gib >= 0.01 else "<" + render.num(0.01, 2, lang)


def token_info(lang: str) -> str:
    from core.model import hf_token

    return t("export.token_env_set" if hf_token() else "export.token_env_missing", lang)


def on_export_adapter(lang: str, adapter: str | None) -> tuple[str, str, Any]:
    """An adapter was picked: (the merge warning, the memory check, the default merged folder)."""
    from core.export import default_merge_dir, merge_memory_check, merge_warning
    from core.infer import InferError, adapter_config

    if not adapter:
        return note(t("try.no_adapters", lang), "info"), "", gr.update(value="")
    try:
        cfg = adapter_config(adapter)
    except InferError as exc:
        return note(str(exc), "error"), "", gr.update(value="")
    try:
        needed, available, ok, message = merge_memory_check(cfg)
    except Exception as exc:  # noqa: BLE001 - psutil missing or the like: say so, keep the tab usable
        needed, available, ok, message = 0, 0, False, f"{type(exc).__name__}: {exc}"
    if needed:
        check = t("export.memory_ok" if ok else "export.memory_low", lang, needed=_gib(needed, lang),
                  available=_gib(available, lang))
        check = check if ok else f"{check}\n{message}"
    else:
        check = message
    return (note(merge_warning(cfg, lang), "warn", "merge-warning"), note(check, "ok" if ok else "error", "merge-check"),
            gr.update(value=str(default_merge_dir(adapter))))


def on_zip(lang: str, adapter: str | None) -> tuple[Any, str]:
    from core.export import ExportError, zip_adapter

    if not adapter:
        return gr.update(value=None, visible=False), warn(t("try.pick_adapter", lang), "export-note")
    if (refusal := _public_refusal((adapter, "the adapter"))):
        return gr.update(value=None, visible=False), warn(t("export.failed", lang, message=refusal), "export-note",
                                                          "error")
    try:
        path = zip_adapter(adapter)
    except (ExportError, OSError) as exc:
        return gr.update(value=None, visible=False), warn(t("export.failed", lang, message=exc), "export-note", "error")
    return (gr.update(value=str(path), visible=True),
            note(t("export.zip_ready", lang, path=path.name, size=_size(path)), "ok", "export-note"))


def on_merge(lang: str, adapter: str | None, out_dir: str, replace: bool, confirmed: bool,
             progress: Any = gr.Progress()) -> str:
    """Merge with a progress bar, after the confirmation tick; refused while a training run is going."""
    from core.export import ExportError, merge_adapter

    if not adapter:
        return warn(t("try.pick_adapter", lang), "export-note")
    if not confirmed:
        return warn(t("export.confirm_first", lang), "export-note")
    if MANAGER.busy():
        return warn(t("export.busy_training", lang), "export-note")
    if (refusal := _public_refusal((adapter, "the adapter"), ((out_dir or "").strip() or None, "the merged folder"))):
        return warn(t("export.failed", lang, message=refusal), "export-note", "error")

    def report(fraction: float, message: str) -> None:
        if progress is not None:
            progress(fraction, desc=message)

    try:
        path = merge_adapter(adapter, (out_dir or "").strip() or None, progress=report, overwrite=bool(replace))
    except ExportError as exc:
        return warn(t("export.failed", lang, message=exc), "export-note", "error")
    except Exception as exc:  # noqa: BLE001 - nothing crashes the page
        return warn(t("export.failed", lang, message=f"{type(exc).__name__}: {exc}"), "export-note", "error")
    return note(t("export.merged", lang, path=path, size=_size(path)), "ok", "export-note")


def on_push(lang: str, adapter: str | None, what: str, merged_dir: str, repo_id: str, private: bool,
            token: str | None) -> tuple[str, Any]:
    """Push the adapter or the merged folder; the typed token is used for this call only, then cleared."""
    from core.export import ExportError, push_to_hub

    clear = gr.update(value="")
    if not adapter:
        return warn(t("try.pick_adapter", lang), "export-note"), clear
    folder = adapter if what != "merged" else ((merged_dir or "").strip())
    if what == "merged" and not (folder and Path(folder).is_dir()):
        return warn(t("export.merge_first", lang), "export-note"), clear
    if (refusal := _public_refusal((folder, "the folder to push"))):
        return warn(t("export.failed", lang, message=refusal), "export-note", "error"), clear
    try:
        url = push_to_hub(folder, repo_id, token=(token or "").strip() or None, private=bool(private))
    except ExportError as exc:
        return warn(t("export.failed", lang, message=exc), "export-note", "error"), clear
    except Exception as exc:  # noqa: BLE001 - push_to_hub scrubs the token from its own messages; be safe here too
        message = f"{type(exc).__name__}: {exc}"
        if token:
            message = message.replace(token.strip(), "hf_***")
        return warn(t("export.failed", lang, message=message), "export-note", "error"), clear
    return note(t("export.pushed", lang, url=url), "ok", "export-note"), clear


# --- history --------------------------------------------------------------------------------------------------------
COLUMNS = ("date", "name", "model", "dataset", "status", "final_loss", "peak", "duration", "steps", "resumable")


def history_rows(output_dir: str | None) -> list[Any]:
    """core.history.RunInfo of every run, newest first; the running job (if any) asked through the job manager."""
    from core.history import list_runs

    return list_runs(_output_dir(output_dir), is_running=MANAGER.is_running)


def history_frame(runs: list[Any], lang: str) -> pd.DataFrame:
    from core.history import format_duration

    rows = [[r.date, r.name, r.model, r.dataset, t(f"history.status.{r.status}", lang),
             "" if r.final_loss is None else f"{r.final_loss:.4f}",
             "" if r.peak_gib is None else render.num(r.peak_gib, 2, lang),
             format_duration(r.duration_s), "" if r.steps is None else str(r.steps),
             t("history.yes", lang) if r.resumable else ""] for r in runs]
    return pd.DataFrame(rows, columns=[t(f"history.col.{c}", lang) for c in COLUMNS])


def on_history_refresh(lang: str, output_dir: str | None, selected: str | None = None):
    """(table, run folders in table order, history notice): the notice says when there is nothing to show."""
    runs = history_rows(output_dir)
    empty = note(t("history.empty", lang, dir=_output_dir(output_dir)), "info", "history-note") if not runs else ""
    return history_frame(runs, lang), [r.run_dir for r in runs], empty


def history_open(lang: str, run_dir: str | None):
    """(detail html, loss plot, settings YAML, load/resume/delete buttons' interactivity) of one run."""
    from core.history import HistoryError, load_run

    off = gr.update(interactive=False)
    if not run_dir:
        return "", gr.update(value=_empty_plot(), visible=False), gr.update(value=""), off, off, off
    try:
        if (refusal := _public_refusal((run_dir, "the run"))):
            raise HistoryError(refusal)
        detail = load_run(run_dir, is_running=MANAGER.is_running)
    except HistoryError as exc:
        return warn(str(exc), "history-note"), gr.update(visible=False), gr.update(value=""), off, off, off
    from ui.blocks import predicted_peaks, thin

    points = thin(detail.losses)
    plot = (gr.update(value=pd.DataFrame({"step": [p[0] for p in points], "loss": [p[1] for p in points]}),
                      visible=True) if points else gr.update(value=_empty_plot(), visible=False))
    running = detail.info.status == "running"
    return (render.run_detail_html(detail, lang, predicted_peaks(detail.config)), plot,
            gr.update(value=detail.config_text), gr.update(interactive=detail.config is not None),
            gr.update(interactive=detail.info.resumable and not running and detail.config is not None),
            gr.update(interactive=not running))


def on_history_select(lang: str, runs: list[str], evt: gr.SelectData):
    row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
    run_dir = runs[row] if runs and isinstance(row, int) and 0 <= row < len(runs) else None
    return (run_dir, *history_open(lang, run_dir), gr.update(visible=False), "")


def _form_refusal(text: str, kind: str = "warn"):
    """History buttons that fill the form: leave the form as it is, say why, stay on this tab."""
    from ui.blocks import skip_form

    return skip_form() + [warn(text, "history-note", kind), gr.skip()]


def _picked(lang: str, run_dir: str | None, read):
    """What History's form buttons check first: a run is picked, allowed here (public mode), and `read` takes it.
    Returns (what read returned, None) or (None, the refusal to return)."""
    from core.history import HistoryError

    if not run_dir:
        return None, _form_refusal(t("history.pick", lang))
    if (refusal := _public_refusal((run_dir, "the run"))):
        return None, _form_refusal(refusal, "error")
    try:
        return read(run_dir), None
    except HistoryError as exc:
        return None, _form_refusal(str(exc), "error")


def on_history_load(lang: str, run_dir: str | None):
    """The run's settings into the form (then the Train tab is shown): form outputs + notice + tab switch."""
    from core.history import load_run
    from ui.blocks import apply_config

    detail, refusal = _picked(lang, run_dir, load_run)
    if refusal:
        return refusal
    if detail.config is None:
        return _form_refusal(t("history.unreadable", lang, name=detail.info.name), "error")
    from core.public import without_remote_code

    cfg, asked = without_remote_code(detail.config.replace(resume_from=""))  # the user ticks it to confirm
    text = t("history.settings_loaded", lang, name=detail.info.name)
    if asked:
        text += " " + t("config.trust_off", lang, model=cfg.model)
    return apply_config(cfg, lang) + [note(text, "warn" if asked else "ok", "history-note"),
                                      gr.Tabs(selected="tab-train")]


def on_history_resume(lang: str, run_dir: str | None):
    """Resume from the newest complete checkpoint: a job through core.jobs; the form shows what trains."""
    from core.history import resume_config
    from ui.blocks import apply_config, free_try_model

    cfg, refusal = _picked(lang, run_dir, resume_config)
    if refusal:
        return refusal
    if cfg.trust_remote_code:  # never run a model's code without the user's own tick: the form asks, Start resumes
        from core.public import without_remote_code

        cfg, _ = without_remote_code(cfg)
        msg = t("history.trust_confirm", lang, name=Path(run_dir).name, model=cfg.model)
        return apply_config(cfg, lang) + [note(msg, "warn", "history-note"), gr.Tabs(selected="tab-train")]
    from core.train import latest_checkpoint

    checkpoint = latest_checkpoint(Path(run_dir))
    free_try_model()
    try:
        MANAGER.start(cfg)
    except JobBusy:
        running = MANAGER.current()
        return _form_refusal(t("msg.one_job", lang, model=running.config.model if running else "?"))
    msg = t("history.resuming", lang, name=Path(run_dir).name, checkpoint=checkpoint.name if checkpoint else "-")
    return apply_config(cfg, lang) + [note(msg, "ok", "history-note"), gr.Tabs(selected="tab-train")]


def on_history_delete(lang: str, run_dir: str | None):
    """First step of deleting: show the confirmation (its text, and the row with Yes / Cancel)."""
    if not run_dir:
        return gr.update(visible=False), "", warn(t("history.pick", lang), "history-note")
    msg = note(t("history.delete_confirm", lang, name=Path(run_dir).name), "warn", "history-confirm-text")
    return gr.update(visible=True), msg, ""


def on_history_delete_yes(lang: str, run_dir: str | None, output_dir: str | None):
    """Delete for real: (confirm row, table, runs, selected, detail..., notice)."""
    from core.history import HistoryError, delete_run

    hide = gr.update(visible=False)
    if not run_dir:
        return (hide, gr.skip(), gr.skip(), gr.skip(), *[gr.skip()] * 6, warn(t("history.pick", lang), "history-note"))
    try:
        path = delete_run(run_dir, _output_dir(output_dir), is_running=MANAGER.is_running)
    except HistoryError as exc:
        table, runs, _ = on_history_refresh(lang, output_dir)
        return (hide, table, runs, gr.skip(), *[gr.skip()] * 6,
                warn(t("history.delete_refused", lang, message=exc), "history-note", "error"))
    table, runs, _ = on_history_refresh(lang, output_dir)
    return (hide, table, runs, None, *history_open(lang, None),
            note(t("history.deleted", lang, path=path), "ok", "history-note"))


# --- building -------------------------------------------------------------------------------------------------------
@dataclass
class AfterTabs:
    """What build_ui needs for a language switch: extra inputs, outputs and a function giving their updates."""

    language_inputs: list[Any] = field(default_factory=list)
    language_outputs: list[Any] = field(default_factory=list)
    update: Callable[..., list[Any]] | None = None

    def language_updates(self, lang: str, *values: Any) -> list[Any]:
        return self.update(lang, *values) if self.update else []


def build_tabs(lang0: str, tr: Any, main_tabs: gr.Tabs, lang: gr.Dropdown, output_dir: gr.components.Component,
               inputs: list[Any], form_out: list[Any], cfg0: Any) -> AfterTabs:
    """The three tabs, inside build_ui's top-level gr.Tabs; their texts registered with `tr`."""
    L = lambda key, **kw: t(key, lang0, **kw)  # noqa: E731
    quiet = dict(show_progress="hidden")

    # ---------------- try it ----------------
    with gr.Tab(L("tab.try"), id="tab-try", elem_id="tab-try") as try_tab:
        tr.add(try_tab, label="tab.try")
        tr.add(gr.Markdown(f"### {L('try.title')}\n{L('try.intro')}", elem_id="try-intro"),
               value=lambda lg: f"### {t('try.title', lg)}\n{t('try.intro', lg)}")
        with gr.Row(equal_height=False, elem_classes=["mt-bottom-row"]):
            try_adapter = tr.add(gr.Dropdown(choices=[], value=None, label=L("try.adapter"), scale=5,
                                             elem_id="try-adapter", interactive=True), label="try.adapter")
            try_refresh = tr.add(gr.Button(L("try.refresh"), size="sm", scale=1, elem_id="try-refresh"),
                                 value="try.refresh")
        prompt = tr.add(gr.Textbox(label=L("try.prompt"), placeholder=L("try.prompt_placeholder"), lines=3,
                                   elem_id="try-prompt"), label="try.prompt", placeholder="try.prompt_placeholder")
        with gr.Row(equal_height=True):
            max_new = tr.add(gr.Slider(1, 512, value=48, step=1, label=L("try.max_new_tokens"), elem_id="try-max-new"),
                             label="try.max_new_tokens")
            temperature = tr.add(gr.Slider(0.0, 2.0, value=0.0, step=0.05, label=L("try.temperature"),
                                           elem_id="try-temperature"), label="try.temperature")
            top_p = tr.add(gr.Slider(0.05, 1.0, value=0.9, step=0.05, label=L("try.top_p"), elem_id="try-top-p"),
                           label="try.top_p")
        with gr.Accordion(L("try.settings"), open=False, elem_id="try-more") as try_more:
            tr.add(try_more, label="try.settings")
            with gr.Row():
                seed = tr.add(gr.Number(value=0, minimum=0, maximum=2**31 - 1, precision=0, label=L("try.seed"),
                                        elem_id="try-seed"), label="try.seed")
                raw = tr.add(gr.Checkbox(value=False, label=L("try.raw"), elem_id="try-raw"), label="try.raw")
        with gr.Row():
            send = tr.add(gr.Button(L("try.send"), variant="primary", elem_id="try-send"), value="try.send")
            stop = tr.add(gr.Button(L("try.stop"), variant="stop", elem_id="try-stop"), value="try.stop")
        try_note = gr.HTML(elem_id="try-status")
        with gr.Row(equal_height=True):
            base_box = tr.add(gr.Textbox(label=L("try.base"), lines=6, max_lines=24, interactive=False,
                                         elem_id="try-base", elem_classes=["mt-answer"]), label="try.base")
            tuned_box = tr.add(gr.Textbox(label=L("try.tuned"), lines=6, max_lines=24, interactive=False,
                                          elem_id="try-tuned", elem_classes=["mt-answer", "mt-answer-tuned"]),
                               label="try.tuned")

    # ---------------- export ----------------
    with gr.Tab(L("tab.export"), id="tab-export", elem_id="tab-export") as export_tab:
        tr.add(export_tab, label="tab.export")
        tr.add(gr.Markdown(f"### {L('export.title')}", elem_id="export-title"),
               value=lambda lg: f"### {t('export.title', lg)}")
        with gr.Row(equal_height=False, elem_classes=["mt-bottom-row"]):
            exp_adapter = tr.add(gr.Dropdown(choices=[], value=None, label=L("export.adapter"), scale=5,
                                             elem_id="export-adapter", interactive=True), label="export.adapter")
            exp_refresh = tr.add(gr.Button(L("try.refresh"), size="sm", scale=1, elem_id="export-refresh"),
                                 value="try.refresh")
        export_note = gr.HTML(elem_id="export-status")
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=320):
                tr.add(gr.Markdown(f"#### {L('export.zip')}"), value=lambda lg: f"#### {t('export.zip', lg)}")
                zip_btn = tr.add(gr.Button(L("export.zip"), elem_id="export-zip-btn"), value="export.zip")
                zip_file = gr.File(visible=False, interactive=False, elem_id="export-zip-file")
                tr.add(gr.Markdown(f"#### {L('export.push_title')}"),
                       value=lambda lg: f"#### {t('export.push_title', lg)}")
                repo_id = tr.add(gr.Textbox(label=L("export.repo_id"), placeholder="your-name/my-adapter",
                                            max_lines=1, elem_id="export-repo"), label="export.repo_id")
                with gr.Row():
                    private = tr.add(gr.Checkbox(value=True, label=L("export.private"), elem_id="export-private"),
                                     label="export.private")
                    what = gr.Radio(choices=[(L("export.what_adapter"), "adapter"), (L("export.what_merged"), "merged")],
                                    value="adapter", label=L("export.what"), elem_id="export-what")
                    tr.add(what, label="export.what", choices=lambda lg: [(t("export.what_adapter", lg), "adapter"),
                                                                         (t("export.what_merged", lg), "merged")])
                token = tr.add(gr.Textbox(label=L("export.token"), type="password", max_lines=1,
                                          placeholder="hf_…", info=token_info(lang0), elem_id="export-token"),
                               label="export.token", info=token_info)
                push_btn = tr.add(gr.Button(L("export.push"), elem_id="export-push-btn"), value="export.push")
            with gr.Column(scale=1, min_width=320):
                tr.add(gr.Markdown(f"#### {L('export.merge')}"), value=lambda lg: f"#### {t('export.merge', lg)}")
                merge_warning = gr.HTML(elem_id="export-merge-warning")
                merge_check = gr.HTML(elem_id="export-merge-check")
                merge_dir = tr.add(gr.Textbox(label=L("export.merge_dir"), max_lines=1, elem_id="export-merge-dir"),
                                   label="export.merge_dir")
                replace = tr.add(gr.Checkbox(value=False, label=L("export.replace"), elem_id="export-replace"),
                                 label="export.replace")
                confirm = tr.add(gr.Checkbox(value=False, label=L("export.merge_confirm"), elem_id="export-confirm"),
                                 label="export.merge_confirm")
                merge_btn = tr.add(gr.Button(L("export.merge"), variant="primary", elem_id="export-merge-btn"),
                                   value="export.merge")
        from ui.gguf import build_section as gguf_section  # GGUF files for llama.cpp / Ollama (ui/gguf.py)

        gguf_section(lang0, tr, lang, exp_adapter)

    # ---------------- history ----------------
    with gr.Tab(L("tab.history"), id="tab-history", elem_id="tab-history") as history_tab:
        tr.add(history_tab, label="tab.history")
        with gr.Row(equal_height=False, elem_classes=["mt-bottom-row"]):
            tr.add(gr.Markdown(f"### {L('history.title')}"), value=lambda lg: f"### {t('history.title', lg)}")
            hist_refresh = tr.add(gr.Button(L("history.refresh"), size="sm", scale=0, min_width=140,
                                            elem_id="history-refresh"), value="history.refresh")
        history_note = gr.HTML(elem_id="history-status")
        table = gr.Dataframe(history_frame([], lang0), interactive=False, elem_id="history-table", wrap=True,
                             max_height=360, show_label=False,
                             column_widths=["12%", "15%", "17%", "12%", "9%", "8%", "8%", "7%", "6%", "6%"])
        runs_state = gr.State([])
        selected = gr.State(None)
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=380):
                detail = gr.HTML(elem_id="history-detail")
                with gr.Row():
                    load_btn = tr.add(gr.Button(L("history.load_settings"), interactive=False, elem_id="history-load"),
                                      value="history.load_settings")
                    resume_btn = tr.add(gr.Button(L("history.resume"), interactive=False, elem_id="history-resume"),
                                        value="history.resume")
                    delete_btn = tr.add(gr.Button(L("history.delete"), variant="stop", interactive=False,
                                                  elem_id="history-delete"), value="history.delete")
                with gr.Group(visible=False, elem_id="history-confirm") as confirm_row:
                    confirm_text = gr.HTML(elem_id="history-confirm-box")
                    with gr.Row():
                        yes_btn = tr.add(gr.Button(L("history.delete_yes"), variant="stop", elem_id="history-delete-yes"),
                                         value="history.delete_yes")
                        cancel_btn = tr.add(gr.Button(L("history.cancel"), elem_id="history-delete-cancel"),
                                            value="history.cancel")
            with gr.Column(scale=3, min_width=420):
                hist_plot = gr.LinePlot(_empty_plot(), x="step", y="loss", title=None, y_title=L("run.loss_axis"),
                                        x_title=L("run.step_axis"), height=240, elem_id="history-plot",
                                        show_label=False, visible=False)
                tr.add(hist_plot, y_title="run.loss_axis", x_title="run.step_axis")
                settings = tr.add(gr.Code("", language="yaml", label=L("history.settings"), interactive=False,
                                          elem_id="history-settings", max_lines=18), label="history.settings")

    # ---------------- events ----------------
    def refresh_adapters(current, out, lg):
        return adapter_dropdown(out, current, lg)

    for tab, dd, btn in ((try_tab, try_adapter, try_refresh), (export_tab, exp_adapter, exp_refresh)):
        tab.select(refresh_adapters, inputs=[dd, output_dir, lang], outputs=[dd], **quiet)
        btn.click(refresh_adapters, inputs=[dd, output_dir, lang], outputs=[dd], **quiet)
    send.click(on_try, inputs=[lang, try_adapter, prompt, max_new, temperature, top_p, seed, raw],
               outputs=[base_box, tuned_box, try_note], show_progress="hidden")
    prompt.submit(on_try, inputs=[lang, try_adapter, prompt, max_new, temperature, top_p, seed, raw],
                  outputs=[base_box, tuned_box, try_note], show_progress="hidden")
    stop.click(on_try_stop, inputs=[lang], outputs=[try_note], concurrency_limit=None, **quiet)

    exp_adapter.change(on_export_adapter, inputs=[lang, exp_adapter], outputs=[merge_warning, merge_check, merge_dir],
                       **quiet)
    zip_btn.click(on_zip, inputs=[lang, exp_adapter], outputs=[zip_file, export_note])
    merge_btn.click(on_merge, inputs=[lang, exp_adapter, merge_dir, replace, confirm], outputs=[export_note])
    push_btn.click(on_push, inputs=[lang, exp_adapter, what, merge_dir, repo_id, private, token],
                   outputs=[export_note, token])

    detail_out = [detail, hist_plot, settings, load_btn, resume_btn, delete_btn]
    refresh_out = [table, runs_state, history_note]
    history_tab.select(on_history_refresh, inputs=[lang, output_dir, selected], outputs=refresh_out, **quiet)
    hist_refresh.click(on_history_refresh, inputs=[lang, output_dir, selected], outputs=refresh_out, **quiet)
    table.select(on_history_select, inputs=[lang, runs_state],
                 outputs=[selected, *detail_out, confirm_row, history_note], **quiet)
    load_btn.click(on_history_load, inputs=[lang, selected], outputs=form_out + [history_note, main_tabs])
    resume_btn.click(on_history_resume, inputs=[lang, selected], outputs=form_out + [history_note, main_tabs])
    delete_btn.click(on_history_delete, inputs=[lang, selected], outputs=[confirm_row, confirm_text, history_note],
                     **quiet)
    cancel_btn.click(lambda: (gr.update(visible=False), ""), outputs=[confirm_row, confirm_text], **quiet)
    yes_btn.click(on_history_delete_yes, inputs=[lang, selected, output_dir],
                  outputs=[confirm_row, table, runs_state, selected, *detail_out, history_note])

    # ---------------- language ----------------
    def language_updates(lg: str, out_dir: str | None, sel: str | None, exp: str | None):
        table_value, runs, empty = on_history_refresh(lg, out_dir, sel)
        warning, check, _ = on_export_adapter(lg, exp) if exp else (gr.skip(), gr.skip(), None)
        return [table_value, runs, *(history_open(lg, sel)[:1] if sel else [gr.skip()]), warning, check]

    return AfterTabs(language_inputs=[output_dir, selected, exp_adapter],
                     language_outputs=[table, runs_state, detail, merge_warning, merge_check],
                     update=language_updates)
