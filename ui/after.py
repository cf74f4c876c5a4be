"""After training: the "Try it", "Export" and "History" tabs' layout and events (`build_tabs`, called by
ui.layout.build_ui inside its top-level gr.Tabs). Their handlers are ui/tryexport.py's and ui/history.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import gradio as gr

from core.i18n import t
from ui.form import FORM_QUEUE, Form, confirm_box
from ui.validation import build_compare, curves_frame, draw_every_series, on_compare
from ui.history import (HistoryTab, history_frame, history_open, on_history_delete, on_history_delete_yes,
                        on_history_load, on_history_prefer, on_history_refresh, on_history_resume, on_history_select)
from ui.tryexport import (TryExportTab, adapter_dropdown, merge_into_choices, on_action_stop, on_export_adapter,
                          on_merge, on_push, on_try, on_try_adapter, on_try_stop, on_zip, token_info)


@dataclass
class AfterTabs:
    """What build_ui needs for a language switch: extra inputs, outputs and a function giving their updates."""

    language_inputs: list[Any] = field(default_factory=list)
    language_outputs: list[Any] = field(default_factory=list)
    update: Callable[..., dict[Any, Any]] | None = None
    history: HistoryTab | None = None  # the History tab's components (for tests)
    try_export: TryExportTab | None = None  # the Try it and Export tabs' (for tests)

    def language_updates(self, lang: str, *values: Any) -> dict[Any, Any]:
        return self.update(lang, *values) if self.update else {}


def adapter_picker(tr: Any, L: Callable[..., str], label: str, prefix: str) -> tuple[Any, Any, Any]:
    """A tab's adapter dropdown with its refresh button (Try it, Export), and the trust_remote_code tick that
    loading an adapter trained with it asks for (the training form's confirmation; none in public mode)."""
    from core.runs.public import is_public

    with gr.Row(equal_height=False, elem_classes=["mt-bottom-row"]):
        dropdown = tr.add(gr.Dropdown(choices=[], value=None, label=L(label), scale=5, elem_id=f"{prefix}-adapter",
                                      interactive=True), label=label)
        refresh = tr.add(gr.Button(L("try.refresh"), size="sm", scale=1, elem_id=f"{prefix}-refresh"),
                         value="try.refresh")
    remote = tr.add(gr.Checkbox(value=False, label=L("try.remote_code"), elem_id=f"{prefix}-remote-code",
                                visible=not is_public()), label="try.remote_code")
    return dropdown, refresh, remote


def build_tabs(lang0: str, tr: Any, main_tabs: gr.Tabs, lang: gr.Dropdown, output_dir: gr.components.Component,
               form: Form, app: Any) -> AfterTabs:
    """The three tabs, inside build_ui's top-level gr.Tabs; their texts registered with `tr`. `app`: the
    ui.state.AppState every handler acts on."""
    L = lambda key, **kw: t(key, lang0, **kw)  # noqa: E731
    quiet = dict(show_progress="hidden")

    # ---------------- try it ----------------
    with gr.Tab(L("tab.try"), id="tab-try", elem_id="tab-try") as try_tab:
        tr.add(try_tab, label="tab.try")
        tr.add(gr.Markdown(f"### {L('try.title')}\n{L('try.intro')}", elem_id="try-intro"),
               value=lambda lg: f"### {t('try.title', lg)}\n{t('try.intro', lg)}")
        try_adapter, try_refresh, try_remote = adapter_picker(tr, L, "try.adapter", "try")
        with gr.Row(equal_height=True):
            prompt = tr.add(gr.Textbox(label=L("try.prompt"), placeholder=L("try.prompt_placeholder"), lines=3,
                                       elem_id="try-prompt", scale=3), label="try.prompt",
                            placeholder="try.prompt_placeholder")
            # an image-text adapter's question is about an image: shown only for one (on_try_adapter)
            image = tr.add(gr.Image(type="filepath", label=L("try.image"), sources=["upload", "clipboard"],
                                    elem_id="try-image", visible=False, height=180, scale=1), label="try.image")
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
        exp_adapter, exp_refresh, exp_remote = adapter_picker(tr, L, "export.adapter", "export")
        export_note = gr.HTML(elem_id="export-status")
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=320):
                tr.add(gr.Markdown(f"#### {L('export.zip')}"), value=lambda lg: f"#### {t('export.zip', lg)}")
                zip_btn = tr.add(gr.Button(L("export.zip"), elem_id="export-zip-btn"), value="export.zip")
                zip_file = gr.File(visible=False, interactive=False, elem_id="export-zip-file")
                tr.add(gr.Markdown(f"#### {L('export.push_title')}"),
                       value=lambda lg: f"#### {t('export.push_title', lg)}")
                repo_id = tr.add(gr.Textbox(label=L("export.repo_id"), placeholder=L("export.repo_placeholder"),
                                            max_lines=1, elem_id="export-repo"), label="export.repo_id",
                                 placeholder="export.repo_placeholder")
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
                merge_into = tr.add(gr.Radio(choices=merge_into_choices(lang0), value="dequantized",
                                             label=L("export.merge_into"), elem_id="export-merge-into"),
                                    label="export.merge_into", choices=merge_into_choices)
                replace = tr.add(gr.Checkbox(value=False, label=L("export.replace"), elem_id="export-replace"),
                                 label="export.replace")
                confirm = tr.add(gr.Checkbox(value=False, label=L("export.merge_confirm"), elem_id="export-confirm"),
                                 label="export.merge_confirm")
                with gr.Row():
                    merge_btn = tr.add(gr.Button(L("export.merge"), variant="primary", elem_id="export-merge-btn",
                                                 scale=3), value="export.merge")
                    merge_stop = tr.add(gr.Button(L("try.stop"), variant="stop", elem_id="export-merge-stop-btn",
                                                  scale=1), value="try.stop")
                merge_note = gr.HTML(elem_id="export-merge-note")  # the merge's answer, under its button
        from ui.gguf import build_section as gguf_section  # GGUF files for llama.cpp / Ollama (ui/gguf.py)

        gguf_section(lang0, tr, lang, exp_adapter, app, remote=exp_remote)

    # ---------------- history ----------------
    with gr.Tab(L("tab.history"), id="tab-history", elem_id="tab-history") as history_tab:
        tr.add(history_tab, label="tab.history")
        with gr.Row(equal_height=False, elem_classes=["mt-bottom-row"]):
            tr.add(gr.Markdown(f"### {L('history.title')}"), value=lambda lg: f"### {t('history.title', lg)}")
            hist_refresh = tr.add(gr.Button(L("history.refresh"), size="sm", scale=0, min_width=140,
                                            elem_id="history-refresh"), value="history.refresh")
        history_note = gr.HTML(elem_id="history-status")
        # No copy / fullscreen buttons: Gradio words their tooltips in English whatever the language.
        table = gr.Dataframe(history_frame([], lang0), interactive=False, elem_id="history-table", wrap=True,
                             max_height=360, show_label=False, buttons=[],
                             column_widths=["11%", "15%", "15%", "11%", "9%", "8%", "9%", "7%", "6%", "9%"])
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
                    prefer_btn = tr.add(gr.Button(L("history.prefer"), interactive=False, elem_id="history-prefer"),
                                        value="history.prefer")
                    grpo_btn = tr.add(gr.Button(L("history.grpo"), interactive=False, elem_id="history-grpo"),
                                      value="history.grpo")
                    delete_btn = tr.add(gr.Button(L("history.delete"), variant="stop", interactive=False,
                                                  elem_id="history-delete"), value="history.delete")
                confirm_row, confirm_text, yes_btn, cancel_btn = confirm_box(
                    tr, lang0, "history-confirm", "history.delete_yes", "history-delete-yes", "history-delete-cancel")
            with gr.Column(scale=3, min_width=420):
                hist_plot = gr.LinePlot(curves_frame([], [], lang0), x="step", y="loss", color="series", title=None,
                                        color_title=L("run.series_legend"), y_title=L("run.loss_axis"),
                                        x_title=L("run.step_axis"), height=240, elem_id="history-plot",
                                        show_label=False, visible=False)
                tr.add(hist_plot, y_title="run.loss_axis", x_title="run.step_axis", color_title="run.series_legend")
                draw_every_series(hist_plot)
                settings = tr.add(gr.Code("", language="yaml", label=L("history.settings"), interactive=False,
                                          elem_id="history-settings", max_lines=18, visible=False),
                                  label="history.settings")  # shown once a run is picked
        compare = build_compare(tr, lang0, lang, output_dir, history_tab, hist_refresh,  # ui/validation.py
                                        app.manager)

    # ---------------- events ----------------
    def refresh_adapters(current, out, lg):
        return adapter_dropdown(out, current, lg)

    for tab, dd, btn in ((try_tab, try_adapter, try_refresh), (export_tab, exp_adapter, exp_refresh)):
        tab.select(refresh_adapters, inputs=[dd, output_dir, lang], outputs=[dd], **quiet)
        btn.click(refresh_adapters, inputs=[dd, output_dir, lang], outputs=[dd], **quiet)
    x = TryExportTab(try_note=try_note, base=base_box, tuned=tuned_box, export_note=export_note, zip_file=zip_file,
                     merge_warning=merge_warning, merge_check=merge_check, merge_dir=merge_dir, token=token,
                     merge_note=merge_note, app=app)
    try_adapter.change(on_try_adapter, inputs=[try_adapter], outputs=[image], **quiet)
    asked = [lang, try_adapter, prompt, max_new, temperature, top_p, seed, raw, try_remote, image]
    for event in (send.click, prompt.submit):
        event(partial(on_try, x), inputs=asked, outputs=[base_box, tuned_box, try_note], show_progress="hidden")
    stop.click(partial(on_try_stop, x), inputs=[lang], outputs=[try_note], concurrency_limit=None, **quiet)

    exp_adapter.change(partial(on_export_adapter, x), inputs=[lang, exp_adapter],
                       outputs=[merge_warning, merge_check, merge_dir, merge_note],
                       **quiet)
    zip_btn.click(partial(on_zip, x), inputs=[lang, exp_adapter], outputs=[zip_file, export_note])
    merge_btn.click(partial(on_merge, x), inputs=[lang, exp_adapter, merge_dir, replace, confirm, merge_into,
                                                  exp_remote], outputs=[merge_note])
    # not queued behind the merge it stops; the merge's own handler then says it was stopped
    merge_stop.click(partial(on_action_stop, x, "merge"), inputs=[lang], outputs=[merge_note],
                     concurrency_limit=None, **quiet)
    push_btn.click(partial(on_push, x), inputs=[lang, exp_adapter, what, merge_dir, repo_id, private, token],
                   outputs=[export_note, token])

    h = HistoryTab(table=table, runs=runs_state, selected=selected, note=history_note, detail=detail,
                   plot=hist_plot, settings=settings, load=load_btn, resume=resume_btn, delete=delete_btn,
                   confirm_row=confirm_row, confirm_text=confirm_text, main_tabs=main_tabs, app=app, prefer=prefer_btn,
                   grpo=grpo_btn)
    refresh_out = [table, runs_state, history_note]
    detail_out = [detail, hist_plot, settings, load_btn, resume_btn, delete_btn, prefer_btn, grpo_btn]
    history_tab.select(partial(on_history_refresh, h), inputs=[lang, output_dir], outputs=refresh_out, **quiet)
    hist_refresh.click(partial(on_history_refresh, h), inputs=[lang, output_dir], outputs=refresh_out, **quiet)
    def select(lg: str, runs: list[str], evt: gr.SelectData):  # not a partial: Gradio finds SelectData by annotation
        return on_history_select(h, lg, runs, evt)

    table.select(select, inputs=[lang, runs_state],
                 outputs=[selected, *detail_out, confirm_row, history_note], **quiet)
    to_form = form.outputs + [history_note, main_tabs]
    load_btn.click(partial(on_history_load, form, h), inputs=[lang, selected], outputs=to_form, **FORM_QUEUE)
    resume_btn.click(partial(on_history_resume, form, h), inputs=[lang, selected], outputs=to_form, **FORM_QUEUE)
    prefer_btn.click(partial(on_history_prefer, form, h), inputs=[lang, selected], outputs=to_form, **FORM_QUEUE)
    grpo_btn.click(partial(on_history_prefer, form, h, stage="grpo"), inputs=[lang, selected], outputs=to_form,
                   **FORM_QUEUE)
    delete_btn.click(partial(on_history_delete, h), inputs=[lang, selected],
                     outputs=[confirm_row, confirm_text, history_note], **quiet)
    cancel_btn.click(lambda: (gr.update(visible=False), ""), outputs=[confirm_row, confirm_text], **quiet)
    yes_btn.click(partial(on_history_delete_yes, h), inputs=[lang, selected, output_dir],
                  outputs=[confirm_row, *refresh_out, selected, *detail_out])

    # ---------------- language ----------------
    def language_updates(lg: str, out_dir: str | None, sel: str | None, exp: str | None, compared: list[str] | None,
                         shown: str | None) -> dict[Any, Any]:
        refreshed = on_history_refresh(h, lg, out_dir)
        out = {table: refreshed[table], runs_state: refreshed[runs_state]}
        if sel:
            opened = history_open(h, lg, sel)
            out[detail], out[hist_plot] = opened[detail], opened[hist_plot]  # the chart's legend too
        if exp:
            picked = on_export_adapter(x, lg, exp)
            out[merge_warning], out[merge_check] = picked[merge_warning], picked[merge_check]
        if 'id="mt-compare"' in (shown or ""):  # a comparison on screen: said again, legend included
            out[compare["plot"]], out[compare["tables"]] = on_compare(app.manager, lg, compared)
        return out

    return AfterTabs(language_inputs=[output_dir, selected, exp_adapter, compare["picker"], compare["tables"]],
                     language_outputs=[table, runs_state, detail, hist_plot, merge_warning, merge_check,
                                       compare["plot"], compare["tables"]],
                     update=language_updates, history=h, try_export=x)
