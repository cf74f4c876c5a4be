"""The memtune page: `build_ui()` returns the Blocks (app.py launches it): the layout, and the events wired to the
handlers (ui/handlers.py and ui/data.py for the settings, ui/live.py for the 1 s poller, ui/after.py for the tabs
after training).

Layout: a header with the language picker, then four top-level tabs. "Train" holds the settings tabs on the
left (model and data, the memory checklist, training, settings and code) and the run panel on the right (GPU
gauge with the predicted peak, "Fit to my GPU", summary, Start/Stop, progress, loss curve, log, result).
"Try it", "Export" and "History" (ui/after.py) work on the runs under the form's output folder.

Every TrainConfig field has exactly one widget (`Form.fields[name]`), and every handler reads the config from the
widgets, so what is on screen is what trains. Live parts are driven by one gr.Timer per page polling the
process-wide job manager; nothing about the run lives in the page, so reloading it reattaches.

Every text comes from core.i18n in the page's language (the `lang` dropdown, first input of every handler that
writes text); switching it relabels every component (`Translations`) and re-renders the derived parts.
"""

from __future__ import annotations

from functools import partial
from collections.abc import Mapping
from typing import Any, Callable

import gradio as gr

from core.config import checklist, levers
from core.codegen import cli_command, python_script
from core.checks import validate
from core.config.settings import TrainConfig, field_meta
from core.i18n import DEFAULT_LANGUAGE, language_choices, request_language, t
from core.jobs.view import job_view
from ui import handlers, render
from ui.after import build_tabs
from ui.data import DATA_TYPES, app_actions, make_preview, on_upload, on_uploaded, preview_upload
from ui.derive import (DEFAULT_BUDGET_GIB, hardware, initial_config, prediction, preset_choices, preset_descriptions,
                       preset_of)
from ui.fields import FIELD_NAMES, dataset_choices, help_text, label, make_widget, model_choices
from ui.form import (FORM_QUEUE, MODEL_CHECK_QUEUE, PREVIEW_QUEUE, Form, confirm_box, derived, facts_for,
                     inspect_note, inspections, merged, prediction_state, read_config, shown_if_current,
                     still_describes, to_values)
from ui.live import LivePanel, live_update, loss_frame, read_gpus, reward_frame
from ui.state import AppState
from ui.theme import GRADIO_LOCALE_JS, GRADIO_LOCALES, TABS_KW
from ui.validation import draw_every_series, on_scorer_preview

# Where the levers are shown comes from their declarations (core/config/levers.py); the other fields are placed
# below by hand, and every field not placed by the time the Advanced accordion is built goes there.
GOVERNS = {item.key: levers.beside(item.key) for item in checklist.ITEMS}  # item -> fields shown beside its box
BEYOND = levers.placed("beyond")  # "Beyond the chapter", in order
EN_LANGS = {code for _, code in language_choices()}


class Translations:
    """Components whose texts follow the language: (component, {property: i18n key or fn(lang) -> text})."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, dict[str, str | Callable[[str], Any]]]] = []

    def add(self, component: Any, **props: str | Callable[[str], Any]) -> Any:
        self.items.append((component, props))
        return component

    @property
    def components(self) -> list[Any]:
        return [c for c, _ in self.items]

    def updates(self, lang: str) -> dict[Any, Any]:
        return {c: gr.update(**{p: (v(lang) if callable(v) else t(v, lang)) for p, v in props.items()})
                for c, props in self.items}


# --- the page -------------------------------------------------------------------------------------------------------
def browser_language(request: gr.Request):
    """On page load: the language picker follows the browser's Accept-Language (core.i18n.LANGUAGES)."""
    return gr.update(value=request_language(request))


def gradio_differs(request: gr.Request | None, lang: str) -> bool:
    """Whether Gradio's frontend took another language from the browser (its first Accept-Language) than the
    page's `lang`, as ui/theme.py GRADIO_LOCALES names it for Gradio."""
    header = (request.headers.get("accept-language", "") if request is not None else "") or ""
    first = header.split(",")[0].split(";")[0].strip().lower()
    return not first.startswith(GRADIO_LOCALES.get(lang, "en").lower())


def header_html(lang: str = DEFAULT_LANGUAGE) -> str:
    hw = hardware()
    if hw.cuda:
        gpus, _ = read_gpus()
        where = ", ".join(f"{g['name']} ({g['total_gib']:.0f} GiB)" for g in gpus) or "CUDA GPU"
        line = render.E(t("app.gpu_line", lang, gpus=where))
    else:
        line = render.E(t("app.no_gpu_line", lang))
    from core.runs.public import RUNS, is_public

    # h2: public mode says so on every page; the runs folder by the name visitors see, never the server's path
    banner = (f'<p id="mt-public" class="mt-warn"><b>{render.E(t("public.banner", lang, root=RUNS))}</b></p>'
              if is_public() else "")
    return (f'<div id="mt-header"><h1>memtune</h1><p>{render.E(t("app.tagline", lang))}</p>'
            f'<p id="mt-hw">{line}</p>{banner}</div>')


def gpus_note(lang: str = DEFAULT_LANGUAGE) -> str:
    """Beside the GPUs control: how many GPUs this machine has, and what the control does with that many."""
    n = hardware().n_gpus
    return t("training.gpus_many", lang, n=n) if n > 1 else t("training.gpus_one" if n else "training.gpus_none", lang)


STAGE_FIELDS = tuple(n for n in FIELD_NAMES if "stages" in field_meta(n))  # beta, dpo_loss_type, init_adapter, GRPO's
GRPO_FIELDS = tuple(n for n in STAGE_FIELDS if field_meta(n)["stages"] == ("grpo",))  # in a row of their own


def stage_fields_shown(stage: str) -> list[Any]:
    """Each stage-specific field shown only when `stage` is one of its stages (TrainConfig metadata `stages`)."""
    return [gr.update(visible=stage in field_meta(n)["stages"]) for n in STAGE_FIELDS]


def build_ui(initial: Mapping[str, Any] | None = None, app: AppState | None = None) -> gr.Blocks:
    """Build the page without launching it. `app`: the state every handler acts on (its job manager), built once by
    app.py (None: a fresh one, for a test). For tests it carries `memtune_app` (ui.state.AppState), `memtune_form`
    (ui.form.Form), `memtune_live` (ui.live.LivePanel), `memtune_history` (ui.history.HistoryTab), `memtune_fields`
    (field name -> widget) and `memtune_translations`. `initial`: the settings the page opens with, as a saved
    config holds them (`TrainConfig.to_dict()`); None: the chapter's recipe with a GPU, else the demo."""
    app = app or AppState()
    cfg0 = TrainConfig.from_dict(dict(initial)) if initial is not None else initial_config()
    v0 = to_values(cfg0)
    lang0 = DEFAULT_LANGUAGE
    L = partial(t, lang=lang0)
    FIELDS: dict[str, gr.components.Component] = {}
    tr = Translations()

    def w(name: str, **kw: Any) -> gr.components.Component:
        assert name not in FIELDS, name
        FIELDS[name] = tr.add(make_widget(name, v0[name], **kw),
                              label=partial(label, name), info=partial(help_text, name))
        return FIELDS[name]

    with gr.Blocks(title=L("app.title"), analytics_enabled=False) as demo:
        with gr.Row(equal_height=False, elem_id="mt-top"):
            tr.add(gr.HTML(header_html(lang0), elem_id="mt-header-box"), value=header_html)
            lang = gr.Dropdown(choices=language_choices(), value=lang0, label=L("app.language"), scale=0,
                               min_width=170, elem_id="lang-select", interactive=True)
            tr.add(lang, label="app.language")
        tab_state = gr.State({})
        check_memory = gr.State({})  # per page: what each checklist box changed last, so unticking can undo it
        pred0 = prediction(cfg0, inspections=app.manager.actions.inspections, settings=cfg0.to_dict())
        peak0 = pred0.gib
        pred_state = gr.State(prediction_state(cfg0, pred0))
        # While an inspect child measures (prediction_state's `measuring`), a cheap check each second (the timer is
        # active only then: ui.form.derived); its answer re-derives the form once, in the form's queue.
        measured = gr.State(None)
        measuring = gr.Timer(1.0, active=bool(pred0.measuring))
        with gr.Tabs(elem_id="main-tabs", **TABS_KW) as main_tabs:
            with gr.Tab(L("tab.train"), id="tab-train", elem_id="tab-train") as train_tab:
                tr.add(train_tab, label="tab.train")
                with gr.Row(equal_height=False):
                    # ---------------- settings ----------------
                    with gr.Column(scale=3, min_width=480):
                        with gr.Tabs(elem_id="settings-tabs", **TABS_KW):
                            with gr.Tab(L("tab.data"), id="tab-data", elem_id="tab-data") as tab_data:
                                tr.add(tab_data, label="tab.data")
                                with gr.Row():
                                    demo_btn = tr.add(gr.Button(L("preset.demo"), size="sm", elem_id="preset-demo"),
                                                      value="preset.demo")
                                    vision_btn = tr.add(gr.Button(L("preset.demo_vision"), size="sm",
                                                                  elem_id="preset-demo-vision"),
                                                        value="preset.demo_vision")
                                    chapter_btn = tr.add(gr.Button(L("preset.chapter"), size="sm",
                                                                   elem_id="preset-chapter"), value="preset.chapter")
                                with gr.Row():
                                    w("model", choices=model_choices(cfg0.model), scale=4)
                                    refresh_btn = tr.add(gr.Button(L("data.rescan"), size="sm", scale=1,
                                                                   elem_id="rescan-btn"), value="data.rescan")
                                w("dataset", choices=dataset_choices(cfg0.dataset))
                                with gr.Row():  # a row of their own: four columns left long_prompts' box too narrow
                                    w("dataset_split", scale=1)
                                    w("dataset_format", scale=1)
                                    w("long_prompts", scale=1)
                                with gr.Row(elem_id="stage-row"):
                                    w("stage")
                                # a stage's own fields only for it, in a row of their own (beside the stage they
                                # would be four narrow columns, the adapter's box a word wide)
                                with gr.Row(elem_id="stage-fields-row"):
                                    for name in STAGE_FIELDS:
                                        if name not in GRPO_FIELDS:
                                            w(name, scale=1, visible=cfg0.stage in field_meta(name)["stages"])
                                with gr.Row(elem_id="grpo-fields-row"):  # the rewards and the sampling
                                    for name in GRPO_FIELDS:
                                        w(name, scale=1, visible=cfg0.stage == "grpo")
                                types = ", ".join(DATA_TYPES)
                                upload = tr.add(gr.File(label=t("data.upload", lang0, types=types),
                                                        file_types=DATA_TYPES, type="filepath", elem_id="data-upload",
                                                        height=120),
                                                label=lambda lg: t("data.upload", lg, types=types))
                                preview_btn = tr.add(gr.Button(L("data.preview"), elem_id="preview-btn"),
                                                     value="data.preview")
                                preview_out = gr.HTML(elem_id="data-preview")

                            with gr.Tab(L("tab.checklist"), id="tab-checklist", elem_id="tab-checklist") as tab_check:
                                tr.add(tab_check, label="tab.checklist")
                                tr.add(gr.Markdown(L("checklist.intro"), elem_id="checklist-intro"),
                                       value="checklist.intro")
                                with gr.Row():
                                    preset = gr.Radio(choices=preset_choices(lang0), value=preset_of(cfg0),
                                                      label=L("preset.label"), info=L("preset.info"),
                                                      elem_id="preset-radio")
                                tr.add(gr.Markdown(preset_descriptions(lang0), elem_classes=["mt-small"],
                                                   elem_id="preset-descriptions"), value=preset_descriptions)
                                on0 = checklist.active(cfg0)
                                checks: dict[str, gr.Checkbox] = {}
                                facts: dict[str, gr.HTML] = {}
                                for item in checklist.ITEMS:
                                    with gr.Row(elem_classes=["mt-check-row"], equal_height=False):
                                        with gr.Column(scale=3, min_width=260):
                                            checks[item.key] = gr.Checkbox(
                                                value=on0[item.key], label=L(f"checklist.{item.key}.label"),
                                                info=L(f"checklist.{item.key}.tradeoff"),
                                                elem_id=f"check-{item.key}", elem_classes=["mt-check"])
                                            facts[item.key] = gr.HTML(facts_for(cfg0, item.key, pred0.saves, lang0),
                                                                      elem_id=f"check-facts-{item.key}", padding=False)
                                        with gr.Column(scale=2, min_width=220):
                                            for name in GOVERNS.get(item.key, []):
                                                w(name)
                                with gr.Accordion(L("checklist.beyond"), open=False, elem_id="beyond-acc") as beyond:
                                    tr.add(beyond, label="checklist.beyond")
                                    for name in BEYOND:
                                        if name in v0:
                                            w(name)

                            with gr.Tab(L("tab.training"), id="tab-training", elem_id="tab-training") as tab_train:
                                tr.add(tab_train, label="tab.training")
                                # LoRA's fields and the training levers (dropout, the variants), three to a row: eight
                                # in one row squeezed each checkbox's label to a word per line
                                lora = ["lora_r", "lora_alpha", *levers.placed("training")]
                                for i in range(0, len(lora), 3):
                                    with gr.Row():
                                        for name in lora[i:i + 3]:
                                            w(name)
                                w("lora_target_modules")
                                with gr.Row():
                                    w("learning_rate")
                                    w("num_train_epochs")
                                    w("max_steps")
                                with gr.Row():
                                    w("save_strategy")
                                    w("save_steps")
                                with gr.Row():
                                    w("output_dir")
                                    w("run_name")
                                with gr.Row(elem_id="gpus-row"):  # always shown, with what this machine has
                                    w("num_gpus")
                                    w("distributed_strategy")
                                tr.add(gr.Markdown(gpus_note(lang0), elem_id="gpus-note", elem_classes=["mt-small"]),
                                       value=gpus_note)
                                with gr.Accordion(L("training.advanced"), open=False, elem_id="advanced-acc") as adv:
                                    tr.add(adv, label="training.advanced")
                                    with gr.Row(elem_id="heldout-row"):  # the scorer, with what it checks below
                                        for name in ("heldout_scorer", "heldout_options", "heldout_rows"):
                                            w(name)
                                    scorer_box = gr.HTML(elem_id="scorer-preview")
                                    # Every field not shown elsewhere, so a new TrainConfig field always gets a widget.
                                    rest = [n for n in FIELD_NAMES if n not in FIELDS]
                                    for i in range(0, len(rest), 3):
                                        with gr.Row():
                                            for name in rest[i:i + 3]:
                                                w(name, **({"placeholder": L("training.resume_placeholder")}
                                                           if name == "resume_from" else {}))

                            with gr.Tab(L("tab.code"), id="tab-code", elem_id="tab-code") as tab_code:
                                tr.add(tab_code, label="tab.code")
                                with gr.Row():
                                    shown_dir = handlers.config_dir_shown()  # public mode: `configs`, no server path
                                    cfg_name = gr.Textbox(label=L("config.name"), placeholder=L("config.name_placeholder"),
                                                          max_lines=1, scale=2, elem_id="config-name",
                                                          info=t("config.name_info", lang0, dir=shown_dir))
                                    tr.add(cfg_name, label="config.name", placeholder="config.name_placeholder",
                                           info=lambda lg: t("config.name_info", lg, dir=handlers.config_dir_shown()))
                                    save_btn = tr.add(gr.Button(L("config.save"), scale=1, elem_id="save-config-btn"),
                                                      value="config.save")
                                with gr.Row():
                                    cfg_list = tr.add(gr.Dropdown(choices=handlers.saved_configs(), value=None,
                                                                  label=L("config.saved_list"), scale=2,
                                                                  elem_id="config-list"), label="config.saved_list")
                                    load_btn = tr.add(gr.Button(L("config.load"), scale=1, elem_id="load-config-btn"),
                                                      value="config.load")
                                cfg_notice = gr.HTML(elem_id="config-notice")
                                tr.add(gr.Markdown(L("code.intro"), elem_id="code-intro"), value="code.intro")
                                # Long lines wrap: the settings tab is narrower than a script's lines, which were
                                # clipped at its right edge.
                                code_cli = tr.add(gr.Code(cli_command(cfg0), language="shell", label=L("code.cli"),
                                                          interactive=False, elem_id="code-cli", lines=2,
                                                          wrap_lines=True), label="code.cli")
                                code_py = tr.add(gr.Code(python_script(cfg0), language="python", label=L("code.python"),
                                                         interactive=False, elem_id="code-python", max_lines=40,
                                                         wrap_lines=True), label="code.python")

                    # ---------------- run panel ----------------
                    with gr.Column(scale=2, min_width=380, elem_id="mt-run-panel"):
                        gauge = gr.HTML(render.gauge_html(*read_gpus(), predicted_gib=peak0, lang=lang0,
                                                          budget_gib=DEFAULT_BUDGET_GIB,
                                                          run_gpus=prediction_state(cfg0, pred0)["gpus"]),
                                        elem_id="vram-gauge")
                        with gr.Row(equal_height=False, elem_id="fit-row"):
                            # No minimum/maximum: handlers.budget_info checks the value and says what is wrong
                            # beside the box, in the page's language (ui/derive.py BUDGET_GIB says why).
                            budget = gr.Number(value=DEFAULT_BUDGET_GIB, step=1, label=L("fit.budget"),
                                               info=L("fit.budget_info"), scale=3, min_width=200,
                                               visible=not hardware().cuda, elem_id="fit-budget")
                            tr.add(budget, label="fit.budget")  # its info: on_language, from the value
                            fit_btn = tr.add(gr.Button(L("fit.button"), scale=2, min_width=150, elem_id="fit-btn"),
                                             value="fit.button")
                        fit_note = gr.HTML(elem_id="fit-notice")
                        summary = gr.HTML(render.summary_html(cfg0, validate(cfg0, hardware()), on0, predicted_gib=peak0,
                                                              lang=lang0, gpus=pred0.gpus, cpu_gib=pred0.cpu_gib)
                                          + inspect_note(pred0, lang0), elem_id="config-summary")
                        with gr.Row():
                            start_btn = tr.add(gr.Button(L("run.start"), variant="primary", elem_id="start-btn"),
                                               value="run.start")
                            stop_btn = tr.add(gr.Button(L("run.stop"), variant="stop", elem_id="stop-btn",
                                                        interactive=False), value="run.stop")
                            # Ending at once (no adapter) is its own control, asked to confirm: Stop pressed twice,
                            # or ten times, is one Stop.
                            end_btn = tr.add(gr.Button(L("run.end_now"), variant="secondary", elem_id="end-now-btn",
                                                       interactive=False, scale=0, min_width=120), value="run.end_now")
                        end_confirm, end_text, end_yes, end_cancel = confirm_box(
                            tr, lang0, "end-now-confirm", "run.end_now_yes", "end-now-yes", "end-now-cancel")
                        # The Space owner (public mode, logged in) stops any job, running or queued: shown to them only
                        with gr.Row(visible=False, elem_id="owner-queue-row") as owner_row:
                            owner_job = tr.add(gr.Dropdown(choices=[], label=L("queue.owner_pick"), scale=3,
                                                           elem_id="owner-job"), label="queue.owner_pick")
                            owner_stop = tr.add(gr.Button(L("queue.owner_stop"), variant="stop", scale=1,
                                                          elem_id="owner-stop"), value="queue.owner_stop")
                        notice = gr.HTML(elem_id="run-notice")
                        progress = gr.HTML(render.progress_html(job_view(None), lang0), elem_id="run-progress")
                        loss_plot = gr.LinePlot(loss_frame([]), x="step", y="loss", color="series",
                                                color_title=L("run.series_legend"),
                                                title=None, y_title=L("run.loss_axis"), x_title=L("run.step_axis"),
                                                height=230, elem_id="loss-plot", label=L("run.loss_curve"),
                                                show_label=False, visible=False)
                        tr.add(loss_plot, y_title="run.loss_axis", x_title="run.step_axis", label="run.loss_curve",
                               color_title="run.series_legend")
                        draw_every_series(loss_plot)  # the training curve too, not only validation's
                        # a preference run's reward accuracy and margin (ui/live.py), hidden for SFT
                        reward_plot = gr.LinePlot(reward_frame([]), x="step", y="value", color="series",
                                                  color_title=L("run.series_legend"), title=None,
                                                  y_title=L("run.reward_axis"), x_title=L("run.step_axis"),
                                                  height=230, elem_id="reward-plot", label=L("run.reward_curve"),
                                                  show_label=False, visible=False)
                        tr.add(reward_plot, y_title="run.reward_axis", x_title="run.step_axis",
                               label="run.reward_curve", color_title="run.series_legend")
                        draw_every_series(reward_plot)
                        log = gr.HTML(render.log_html([], lang0), elem_id="run-log", padding=False)
                        result = gr.HTML(elem_id="run-result")
                        # Its label (with the zip's size) is ui.live's, which re-sends it in a new language.
                        download = gr.File(label=L("run.download"), visible=False, interactive=False,
                                           elem_id="adapter-download")

            assert set(FIELDS) == set(FIELD_NAMES), set(FIELD_NAMES) ^ set(FIELDS)
            # No component is created here: one more child of the top-level Tabs (even a gr.State) shifts the tab
            # labels the browser shows ("Try it" over "Export").
            form = Form(fields=FIELDS, summary=summary, prediction=pred_state, checks=checks, facts=facts,
                        preset=preset, code_py=code_py, code_cli=code_cli, fit_note=fit_note, preview=preview_out,
                        run_notice=notice, config_notice=cfg_notice, config_list=cfg_list, start=start_btn,
                        stop=stop_btn, check_memory=check_memory, budget=budget, app=app, measuring=measuring)
            tabs = build_tabs(lang0, tr, main_tabs, lang, FIELDS["output_dir"], form, app)
        wire_form(form, lang, budget, (demo_btn, vision_btn), chapter_btn, refresh_btn, preview_btn, upload, save_btn,
                  cfg_name, load_btn, fit_btn)
        wire_measuring(form, lang, measuring, measured)
        wire_scorer_preview(form, lang, scorer_box)
        # The saved settings, listed again each time their tab opens: the page was built once, for everybody (public
        # mode: no one's), and the list is the visitor's own (ui/handlers.config_dir).
        tab_code.select(lambda: gr.update(choices=handlers.saved_configs()), inputs=None, outputs=[cfg_list],
                        show_progress="hidden")

        def on_page_load(request: gr.Request, *values):
            # The page was built once, at start-up; what the process knows now (a preview's row lengths) may differ.
            # Re-derived on every load, so a fresh page and a ticked box show one estimate of the same settings.
            cfg, problems = read_config(values)
            return derived(form, cfg, problems, request_language(request))

        # The page's FIRST load listener: Gradio's page runs a load's listeners one after another, each once the one
        # before has finished, so registered last (after the poll and the language) it joined the form's queue a
        # second or more after the page showed, behind a box clicked meanwhile, and put the estimate of the settings
        # from before that click back on screen (summary, ticks, facts, gauge).
        demo.load(on_page_load, inputs=form.inputs, outputs=form.derived_outputs, show_progress="hidden", **FORM_QUEUE)
        live = LivePanel(gauge=gauge, progress=progress, plot=loss_plot, log=log, result=result, download=download,
                         start=start_btn, stop=stop_btn, state=tab_state, notice=notice, app=app, end_now=end_btn,
                         reward_plot=reward_plot)
        end_btn.click(handlers.on_end_now_ask, inputs=[lang], outputs=[end_confirm, end_text], show_progress="hidden")
        end_cancel.click(lambda: (gr.update(visible=False), ""), outputs=[end_confirm, end_text],
                         show_progress="hidden")
        end_yes.click(partial(handlers.on_end_now, app), inputs=[lang], outputs=[notice, end_confirm, end_text],
                      show_progress="hidden")
        poll = partial(live_update, live, output_dir=cfg0.output_dir)
        timer = gr.Timer(1.0)
        polled = [tab_state, lang, pred_state, budget, notice]
        # show_progress_on: without it, each poll puts all nine outputs' status trackers in "pending" and back, a
        # second's redraw of the run panel for nothing; the state has no tracker. Named: scripts drive the app.
        # queue=False: one plain request a second instead of a queue join and its event stream (a third of an idle
        # page's main-thread time), and no queue to wait in behind the form's edits.
        polling = dict(inputs=polled, outputs=live.outputs, show_progress="hidden", show_progress_on=[tab_state],
                       queue=False)
        timer.tick(poll, api_name="poll", **polling)
        # the owner's row: shown on load to the Space owner only, its jobs re-read whenever the list is opened
        owner_jobs = partial(handlers.owner_jobs, app)
        demo.load(owner_jobs, inputs=[lang], outputs=[owner_row, owner_job], show_progress="hidden",
                  queue=False)
        owner_job.focus(owner_jobs, inputs=[lang], outputs=[owner_row, owner_job], show_progress="hidden",
                        queue=False)
        owner_stop.click(partial(handlers.on_owner_stop, app), inputs=[owner_job, lang], outputs=[notice, owner_row, owner_job])
        demo.load(lambda s, lg, p, b, n: poll({}, lg, p, b, n), inputs=polled, outputs=live.outputs,
                  show_progress="hidden")
        # New settings, new predicted peak: the gauge follows at once, not at the next tick (a checklist click moved it
        # up to a second later). The same poll, so what the page was sent stays one record.
        pred_state.change(poll, **polling)

        # Language: the browser's on load, the picker afterwards; everything written re-renders.
        one_off = [notice, fit_note, cfg_notice, preview_out, scorer_box]  # written in the old language: cleared
        lang_out = tr.components + form.derived_outputs + tabs.language_outputs + one_off
        n = len(FIELD_NAMES)

        def on_language(lg: str, memory: dict, card: float | None, *values):
            lg = lg if lg in EN_LANGS else DEFAULT_LANGUAGE
            cfg, problems = read_config(values[:n])
            return merged(tr.updates(lg), derived(form, cfg, problems, lg, memory), handlers.on_budget(form, lg, card),
                          tabs.language_updates(lg, *values[n:]), dict.fromkeys(one_off, ""))

        lang.change(on_language, inputs=[lang, form.check_memory, budget, *form.inputs, *tabs.language_inputs],
                    outputs=lang_out, show_progress="hidden", **FORM_QUEUE)
        # Gradio's own strings follow the picker too (ui/theme.py GRADIO_LOCALE_JS); a component already on screen
        # keeps Gradio's words until it is drawn again, so the upload box is hidden and shown once more: after each
        # switch, and on load only where Gradio took another language from the browser (a German browser: the page
        # is in English), so that a fresh page's box is not redrawn under the visitor's first click.
        def redraw(visible: bool, always: bool) -> Callable[..., Any]:
            def update(lg: str, request: gr.Request):
                return gr.update(visible=visible) if always or gradio_differs(request, lg) else gr.skip()
            return update

        loaded = demo.load(browser_language, inputs=None, outputs=[lang], show_progress="hidden")
        for event, always in ((lang.change, True), (loaded.then, False)):
            event(None, inputs=[lang], outputs=None, js=GRADIO_LOCALE_JS, show_progress="hidden").then(
                redraw(False, always), inputs=[lang], outputs=[upload], show_progress="hidden").then(
                redraw(True, always), inputs=[lang], outputs=[upload], show_progress="hidden")

    for fn in demo.fns.values():
        if fn.api_name not in PUBLIC_API:
            # The page's own plumbing, as Gradio's api_name=False makes it: left public, each of ~140 listeners is a
            # documented endpoint whose description (2.3 MB in all) every page load copies and embeds in its HTML.
            fn.api_visibility = "private"
    demo.memtune_app = app
    demo.memtune_form = form
    demo.memtune_live = live
    demo.memtune_history = tabs.history
    demo.memtune_try_export = tabs.try_export
    demo.memtune_fields = FIELDS  # for tests: field name -> component
    demo.memtune_translations = tr
    return demo


def measured_now(inspections: Any, pred: dict | None) -> Any:
    """The measuring timer's check: the key of the inspection the page waited for once it has answered (the state
    then changes, and the form is derived again); nothing while it runs or when there is none."""
    key = (pred or {}).get("measuring")
    if not key or inspections is None:
        return gr.skip()
    action = inspections.get(key)
    return key if action is None or not action.running else gr.skip()


def wire_measuring(form: Form, lang: Any, timer: Any, measured: Any) -> None:
    """An inspect child's answer on the page: the timer's check (a queue of its own: a state changed by a queued
    event is what fires the state's `change`); the form is derived again once, in the form's queue, from the
    settings on screen (an edit made meanwhile asked its own inspection)."""
    timer.tick(partial(measured_now, inspections(form)), inputs=[form.prediction], outputs=[measured],
               show_progress="hidden", concurrency_id="measuring", concurrency_limit=None)

    shown_only = [form.summary, form.prediction, *form.facts.values(), form.code_py, form.code_cli] + \
        ([form.measuring] if form.measuring is not None else [])

    def again(lg: str, key: str | None, pred: dict | None, memory: dict, *values):
        # `pred` is the session's state as the form's queue reaches this event: an edit queued before it has moved
        # the page on (another inspection, or none), and these values, read when the timer fired, are then stale
        if not key or (pred or {}).get("measuring") != key:
            return gr.skip()
        cfg, problems = read_config(values)
        if cfg is None:
            return gr.skip()
        # only what the measurement changes, never a widget's value (the checklist boxes, the preset)
        updates = derived(form, cfg, problems, lg, memory)
        return {comp: update for comp, update in updates.items() if comp in shown_only}

    measured.change(again, inputs=[lang, measured, form.prediction, form.check_memory, *form.inputs],
                    outputs=form.derived_outputs,
                    show_progress="hidden", **FORM_QUEUE)


PUBLIC_API = ("poll", "start", "stop")  # the endpoints scripts drive (bench/app_gpu.py): the rest is the page's own
STALE_WHEN_EDITED = ("model", "dataset", "dataset_split", "dataset_format", "max_length")  # the preview, Fit's note...


def wire_scorer_preview(form: Form, lang: Any, box: Any) -> None:
    """The held-out scorer's preview, again whenever the data preview, the scorer or its options change."""
    scorer, options = form.fields["heldout_scorer"], form.fields["heldout_options"]
    for comp in (form.preview, scorer, options):
        comp.change(on_scorer_preview, inputs=[lang, form.preview, scorer, options], outputs=[box],
                    show_progress="hidden", queue=False)


def wire_form(form: Form, lang: Any, budget: Any, demo_btns: tuple[Any, Any], chapter_btn: Any, refresh_btn: Any,
              preview_btn: Any, upload: Any, save_btn: Any, cfg_name: Any, load_btn: Any, fit_btn: Any) -> None:
    """The settings' events: each handler bound to the form, the fields' values as its last inputs."""
    inputs, FIELDS = form.inputs, form.fields
    quiet = dict(show_progress="hidden", queue=True, **FORM_QUEUE)  # every listener below writes the form
    # An edit made while the same box's previous event still waits in the queue is sent once that one ends, not
    # dropped (Gradio's default for `input`, "once"): the summary and the estimate describe the last value typed.
    typed = dict(quiet, trigger_mode="always_last")
    def changed(lg: str, memory: dict, *values):  # the boxes' memory too: the checklist's savings depend on it
        return handlers.on_fields_changed(form, lg, *values, memory=memory)

    def edited(lg: str, memory: dict, preview: str, *values):  # a user's edit (not a handler's own update, e.g. Fit)
        gone = [c for c in form.stale if c is not form.preview or not still_describes(preview, values, lg)]
        return {**changed(lg, memory, *values), **dict.fromkeys(gone, "")}  # what described the old value goes

    asked = [lang, form.check_memory, *inputs]
    for name, comp in FIELDS.items():
        # ONE listener per event: Gradio's page sends an event's listeners one after another, each once the one before
        # has finished, so a second listener here would reach the form's queue after a Preview clicked meanwhile and
        # clear that newer preview.
        if name in STALE_WHEN_EDITED:
            comp.input(edited, inputs=[lang, form.check_memory, form.preview, *inputs],
                       outputs=form.derived_outputs + form.stale, **typed)
        else:
            comp.input(changed, inputs=asked, outputs=form.derived_outputs, **typed)
        if isinstance(comp, (gr.Textbox, gr.Dropdown)):  # a paste may not fire `input`; leaving the box does
            comp.blur(changed, inputs=asked, outputs=form.derived_outputs, **typed)
            if isinstance(comp, gr.Textbox):
                comp.submit(changed, inputs=asked, outputs=form.derived_outputs, **typed)
    FIELDS["stage"].change(stage_fields_shown, inputs=[FIELDS["stage"]], outputs=[FIELDS[n] for n in STAGE_FIELDS],
                           **quiet)  # .change: a loaded config or the demo button shows or hides them too
    checked = gr.State(None)  # the model check's verdict, and the model and language it describes
    FIELDS["model"].change(handlers.check_model, inputs=[lang, FIELDS["model"]], outputs=[checked],
                           show_progress="hidden", trigger_mode="always_last", **MODEL_CHECK_QUEUE).success(
        handlers.model_note_if_current, inputs=[lang, checked, FIELDS["model"]], outputs=[FIELDS["model"]], **quiet)
    for key, box in form.checks.items():
        box.input(partial(handlers.on_checklist, form, key), inputs=[lang, box, form.check_memory, *inputs],
                  outputs=form.outputs, **typed)
    form.preset.input(partial(handlers.on_preset_lever, form), inputs=[lang, form.preset, *inputs],
                      outputs=form.outputs + form.stale, **typed)
    for btn, kind in ((demo_btns[0], "demo"), (demo_btns[1], "demo_vision"), (chapter_btn, "chapter")):
        btn.click(partial(handlers.on_start_from, form, kind), inputs=[lang], outputs=form.outputs + form.stale,
                  **quiet)
    refresh_btn.click(lambda m, d: (gr.update(choices=model_choices(m)), gr.update(choices=dataset_choices(d))),
                      inputs=[FIELDS["model"], FIELDS["dataset"]], outputs=[FIELDS["model"], FIELDS["dataset"]],
                      **FORM_QUEUE)
    # Made in its own queue (PREVIEW_QUEUE: no page's edits wait behind it), kept in the session's state, then put on
    # screen from the form's queue, where the edits are: only if it still describes the form (shown_if_current).
    made = gr.State("")
    preview_btn.click(partial(make_preview, actions=app_actions(form)), inputs=[lang, *inputs], outputs=[made], show_progress_on=[form.preview],
                      **PREVIEW_QUEUE
                      ).success(shown_if_current, inputs=[lang, made, *inputs], outputs=[form.preview], **quiet)
    # An upload likewise: read and checked in the preview's queue, told to the form in the form's, then previewed.
    arrived = gr.State(None)
    upload.upload(on_upload, inputs=[lang, upload, *inputs], outputs=[arrived], show_progress_on=[form.preview],
                  **PREVIEW_QUEUE
                  ).success(partial(on_uploaded, form), inputs=[lang, arrived, *inputs],
                            outputs=form.outputs + [form.preview], **quiet
                  ).success(partial(preview_upload, actions=app_actions(form)), inputs=[lang, arrived, *inputs], outputs=[made],
                            show_progress_on=[form.preview], **PREVIEW_QUEUE
                  ).success(shown_if_current, inputs=[lang, made, *inputs], outputs=[form.preview], **quiet)
    save_btn.click(partial(handlers.on_save_config, form), inputs=[lang, cfg_name, *inputs],
                   outputs=[form.config_notice, form.config_list])
    load_btn.click(partial(handlers.on_load_config, form), inputs=[lang, form.config_list],
                   outputs=form.outputs + [form.config_notice], **FORM_QUEUE)
    fit_btn.click(partial(handlers.on_fit, form), inputs=[lang, budget, *inputs],
                  outputs=form.outputs + [form.fit_note, budget], **FORM_QUEUE)
    # What is wrong with the card's GiB, beside the box as it is typed (only its info changes: no queue to wait in).
    budget.input(partial(handlers.on_budget, form), inputs=[lang, budget], outputs=[budget], show_progress="hidden",
                 queue=False)
    form.start.click(partial(handlers.on_start, form), inputs=[lang, *inputs],
                     outputs=[form.run_notice, form.start, form.stop], api_name="start")
    form.stop.click(partial(handlers.on_stop, form.app), inputs=[lang], outputs=[form.run_notice], api_name="stop")
