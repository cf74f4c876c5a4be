"""The GGUF part of the Export tab: pick formats, see the RAM and disk it needs, export with a progress bar, then the
written files and the exact `ollama` / `llama-cli` commands (core.export.gguf_export does the work; this is Gradio only).
`build_section` is called by ui.after.build_tabs inside the Export tab.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import gradio as gr

from core.i18n import t
from core.jobs.actions import ActionBusy
from ui import render

FORMAT_KEYS = {"f16": "gguf.format_f16", "bf16": "gguf.format_bf16", "q8_0": "gguf.format_q8_0",
               "q6_k": "gguf.format_q6_k", "q5_k_m": "gguf.format_q5_k_m", "q4_k_m": "gguf.format_q4_k_m"}
DEFAULT_FORMATS = ["f16", "q8_0"]


def _note(text: str, kind: str = "info", elem_id: str = "gguf-plan-note") -> str:
    return render.message_html(text, kind, elem_id)


def _warn(text: str, kind: str = "warn") -> str:
    gr.Warning(text)
    return _note(text, kind, "gguf-status-note")


def _size(n_bytes: int, lang: str = "en") -> str:
    return render._bytes(n_bytes, lang)  # the language's units and decimals (fr: "1,2 Gio")


def format_choices(lang: str) -> list[tuple[str, str]]:
    return [(t(key, lang), fmt) for fmt, key in FORMAT_KEYS.items()]


def on_gguf_formats(lang: str, adapter: str | None) -> str:
    """The formats with their planned file sizes (core.export.gguf_export.format_rows) and when to pick each, before
    anything is written; a k-quant this machine cannot write says why and how to get llama.cpp's quantizer."""
    from html import escape

    from core.export.gguf_export import format_rows

    if not adapter:
        return ""
    try:
        rows = format_rows(adapter_dir=adapter)
    except Exception:  # noqa: BLE001 - the plan below says what is wrong with this adapter
        return ""
    head = "".join(f"<th>{escape(t(k, lang))}</th>" for k in ("gguf.table.format", "gguf.table.size",
                                                              "gguf.table.pick"))
    body = []
    for row in rows:
        pick = escape(t(f"gguf.pick.{row.format}", lang))
        if row.missing is not None:
            pick += ('<br><span class="mt-gguf-missing">'
                     + escape(t("gguf.table.missing", lang, why=render.log_text(row.missing, lang))) + "</span>")
        body.append(f'<tr data-format="{row.format}"><td><code>{row.format.upper()}</code></td>'
                    f"<td>{escape(_size(row.bytes, lang))}</td><td>{pick}</td></tr>")
    return (f'<table class="mt-gguf-formats" id="gguf-format-table"><caption>{escape(t("gguf.table.caption", lang))}'
            f"</caption><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def on_gguf_plan(lang: str, adapter: str | None, formats: list[str] | None) -> str:
    """What the export would need (RAM, disk, each file's size) and whether this machine has it."""
    from core.export.gguf import GGUFError
    from core.export.gguf_export import plan_gguf

    if not adapter:
        return ""
    if not formats:
        return _note(t("gguf.no_format", lang), "warn")
    try:
        plan = plan_gguf(adapter_dir=adapter, formats=formats)
    except GGUFError as exc:
        return _note(render.error_text(exc, lang), "error")
    except Exception as exc:  # noqa: BLE001 - an unreadable adapter or the like: say so, keep the tab usable
        return _note(f"{type(exc).__name__}: {exc}", "error")
    files = ", ".join(f"{fmt} {_size(n, lang)}" for fmt, n in plan.file_bytes.items())
    disk = plan.merge_bytes + sum(plan.file_bytes.values())
    text = t("gguf.plan", lang, ram=_size(plan.ram_bytes, lang), disk=_size(disk, lang), files=files,
             ram_free=_size(plan.ram_free, lang), disk_free=_size(plan.disk_free, lang), path=plan.out_dir)
    if plan.foreign:  # the export refuses a folder memtune did not make, Replace or not
        return _note(text + "\n" + t("gguf.foreign", lang, path=plan.out_dir), "error")
    if not plan.ok:
        text += "\n" + t("gguf.not_enough", lang, message=render.log_text(plan.message, lang))
    elif plan.replaces:  # said before the click, not only as the refusal after it
        return _note(text + "\n" + t("gguf.replaces", lang, path=plan.out_dir), "warn")
    return _note(text, "ok" if plan.ok else "error")


def on_gguf_export(app: Any, lang: str, adapter: str | None, formats: list[str] | None, replace: bool,
                   trust_remote_code: bool = False, progress: Any = gr.Progress()) -> tuple[str, Any]:
    """Export with a progress bar, in a child process (core/jobs/actions.py); (notice with the files written, the
    commands to run them). A child that dies or is stopped is a message here; the page keeps serving."""
    from pathlib import Path

    from ui.live import owner
    from ui.tryexport import busy_text, failure, with_progress

    no_commands = gr.update(value="", visible=False)
    if not adapter:
        return _warn(t("try.pick_adapter", lang)), no_commands
    if not formats:
        return _warn(t("gguf.no_format", lang)), no_commands
    if app.manager.busy():
        return _warn(t("export.busy_training", lang)), no_commands
    from core.infer import adapter_config, asks_remote_code

    if asks_remote_code(adapter) and not trust_remote_code:  # said here, before any process starts
        return _warn(t("try.remote_code_needed", lang, model=adapter_config(adapter).model)), no_commands
    from core.export.gguf import GGUFError
    from core.export.gguf_export import plan_gguf

    try:  # a refused folder or a machine without the room is said here, before a child starts (it checks again)
        plan = plan_gguf(adapter_dir=adapter, formats=formats)
    except GGUFError as exc:
        return _warn(t("export.failed", lang, message=render.error_text(exc, lang)), "error"), no_commands
    except Exception:  # noqa: BLE001 - anything else (an unreadable file...): the child's failure record says it
        plan = None
    if plan is not None and not plan.ok:
        return _warn(t("export.failed", lang, message=render.log_text(plan.message, lang)), "error"), no_commands
    try:
        action = app.manager.actions.start("gguf", {"adapter": adapter, "formats": list(formats),
                                                    "overwrite": bool(replace),
                                                    "trust_remote_code": bool(trust_remote_code)}, owner())
    except ActionBusy as exc:
        return _warn(busy_text(exc, lang)), no_commands
    done = with_progress(action, progress, lang)
    if done.get("status") != "completed":
        if action.stopped:
            return _warn(failure(action, lang)), no_commands
        return _warn(t("export.failed", lang, message=failure(action, lang)), "error"), no_commands
    files = [*map(Path, done["files"].values()), Path(done["modelfile"]), Path(done["readme"])]
    listing = ", ".join(f"{p.name} ({_size(p.stat().st_size, lang)})" for p in files)
    return (_note(t("gguf.done", lang, path=done["out_dir"], files=listing), "ok", "gguf-status-note"),
            gr.update(value="\n".join(done["commands"]), visible=True))


def on_gguf_stop(app: Any, lang: str) -> str:
    """Stop the asker's GGUF export: its child is ended (the export handler then says so)."""
    from ui.live import owner

    if app.manager.actions.stop(owner(), "gguf") is None:
        return ""
    return _note(t("action.stopped", lang, what=t("action.what.gguf", lang)), "warn", "gguf-status-note")


def build_section(lang0: str, tr: Any, lang: gr.Dropdown, adapter: gr.Dropdown, app: Any,
                  remote: Any = None) -> list[Any]:
    """The GGUF widgets and their events; returns the components a language switch re-renders."""
    tr.add(gr.Markdown(f"#### {t('gguf.title', lang0)}\n{t('gguf.intro', lang0)}", elem_id="gguf-title"),
           value=lambda lg: f"#### {t('gguf.title', lg)}\n{t('gguf.intro', lg)}")
    table = gr.HTML(elem_id="gguf-format-sizes")
    with gr.Row(equal_height=False):
        formats = tr.add(gr.CheckboxGroup(choices=format_choices(lang0), value=DEFAULT_FORMATS,
                                          label=t("gguf.formats", lang0), elem_id="gguf-formats", scale=3),
                         label="gguf.formats", choices=format_choices)
        replace = tr.add(gr.Checkbox(value=False, label=t("gguf.replace", lang0), elem_id="gguf-replace", scale=1),
                         label="gguf.replace")
    plan = gr.HTML(elem_id="gguf-plan")
    with gr.Row():
        button = tr.add(gr.Button(t("gguf.export", lang0), variant="primary", elem_id="gguf-export-btn", scale=3),
                        value="gguf.export")
        stop = tr.add(gr.Button(t("try.stop", lang0), variant="stop", elem_id="gguf-stop-btn", scale=1),
                      value="try.stop")
    status = gr.HTML(elem_id="gguf-status")
    commands = tr.add(gr.Code("", language="shell", label=t("gguf.commands", lang0), interactive=False,
                              visible=False, elem_id="gguf-commands"), label="gguf.commands")
    for trigger in (adapter.change, lang.change):
        trigger(on_gguf_formats, inputs=[lang, adapter], outputs=[table], show_progress="hidden")
    for trigger in (adapter.change, formats.change, lang.change):  # a language switch re-writes the plan too
        trigger(on_gguf_plan, inputs=[lang, adapter, formats], outputs=[plan], show_progress="hidden")
    asked = [lang, adapter, formats, replace] + ([remote] if remote is not None else [])
    button.click(partial(on_gguf_export, app), inputs=asked,
                 outputs=[status, commands])  # remote: the tab's trust_remote_code tick (ui/after.py)
    # not queued behind the export it stops (Gradio's default concurrency of one per event would wait for it)
    stop.click(partial(on_gguf_stop, app), inputs=[lang], outputs=[status], concurrency_limit=None,
               show_progress="hidden")
    return [formats, plan, table]
