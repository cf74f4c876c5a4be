"""The "Try it" and "Export" tabs' handlers (tested without a browser; their layout is ui/after.py's). They take
the `TryExportTab` first and return (or, for Try it, stream) updates keyed by its components.

- Try it: base vs base + adapter side by side, streaming from a child process that keeps the model loaded between
  prompts (core/jobs/actions.py; the web server never loads a model); refused while a training run uses the machine.
  Stop ends that child; a child that dies is a message here, and the next prompt starts a fresh one.
- Export: the adapter as a zip; a merged bf16 model (warning, memory check, a confirmation tick, progress);
  a push to the Hub with a token from $HF_TOKEN or typed into a password box (used for that push only: never
  kept in the page state, written anywhere or logged).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from core.i18n import DEFAULT_LANGUAGE, t
from core.jobs.actions import ActionBusy
from ui.live import owner
from ui import render
from ui.notices import note, public_refusal, runs_folder, warn

Updates = dict[Any, Any]  # component -> new value or gr.update(...)
POLL_S = 0.1  # how often a handler reads its action's new events


@dataclass(eq=False)
class TryExportTab:
    """The components the Try it and Export handlers write (ui/after.py builds them); handlers key updates by them."""

    try_note: Any  # Try it's notice
    base: Any  # the base model's answer
    tuned: Any  # the base + adapter answer
    export_note: Any  # Export's notice
    zip_file: Any  # the zipped adapter to download
    merge_warning: Any  # what a merge costs
    merge_check: Any  # whether the memory is there
    merge_dir: Any  # the merged model's folder
    token: Any  # the typed Hub token (cleared after each push)
    merge_note: Any = None  # the merge's answer, under the Merge button (not Export's notice at the top of the tab)
    app: Any = None  # ui.state.AppState: the manager whose children run the models


# --- try it ---------------------------------------------------------------------------------------------------------
def adapter_dropdown(output_dir: str | None, current: str | None = None, lang: str = DEFAULT_LANGUAGE) -> dict:
    """The adapters of every run under output_dir, newest first; keeps the current pick if it is still there."""
    from core.runs.history import adapter_choices

    choices = adapter_choices(runs_folder(output_dir),
                              lambda loss: t("progress.loss", lang, loss=render.num(loss, 3, lang)))
    paths = [p for _, p in choices]
    value = current if current in paths else (paths[0] if paths else None)
    return gr.update(choices=choices, value=value,
                     info=None if choices else t("try.no_adapters", lang))


def said(event: dict[str, Any], lang: str) -> str:
    """An action's event in the page's language: its locale key when it has one (core.messages.keyed), its nested
    messages (what, how: Said parameters) said in that language too, the end of the child's log after it; else the
    child's own message (a library's words)."""
    if event.get("key"):
        text = render.said(event["key"], event.get("params"), lang)
    else:
        text = str(event.get("message") or "")
    return text + (f"\n{event['tail']}" if event.get("tail") else "")


def busy_text(exc: ActionBusy, lang: str) -> str:
    if exc.what == "try":
        return t("action.busy_try", lang)
    return t("action.busy", lang, what=t(f"action.what.{exc.what}", lang))


def failure(action: Any, lang: str, request: int | None = None) -> str:
    """Why an action (or one of a Try it child's requests) failed: its error event, else its `done` message."""
    events = action.events_since(0)
    error = next((e for e in reversed(events) if e.get("kind") == "error"
                  and (request is None or e.get("request") in (None, request))), None)
    if error is not None:
        return said(error, lang)
    done = action.result() or {}
    return said(done, lang) or t("action.died", lang, what=t(f"action.what.{action.kind}", lang), how="?")


def follow(action: Any, since: int = 0) -> Iterator[dict[str, Any]]:
    """The action's events as they arrive, until its child has ended and every event is read."""
    while True:
        ended = not action.running  # read before the events: after the end, the last events are in
        events = action.events_since(since)
        since += len(events)
        yield from events
        if ended:
            return
        time.sleep(POLL_S)


def with_progress(action: Any, progress: Any, lang: str) -> dict[str, Any]:
    """Follow a merge's or an export's child to its end, its phases on Gradio's progress bar; its `done` event."""
    for e in follow(action):
        if e.get("kind") == "phase" and progress is not None:
            progress(e.get("progress") or 0.0, desc=said(e, lang))
    return action.result() or {}


def on_try(x: TryExportTab, lang: str, adapter: str | None, prompt: str, max_new_tokens: float, temperature: float,
           top_p: float, seed: float, raw: bool, trust_remote_code: bool = False,
           image: str | None = None) -> Iterator[Updates]:
    """Stream the base answer and the base + adapter answer for one prompt; refusals and errors as the notice.
    An adapter trained with trust_remote_code loads only after the tab's own tick (trust_remote_code). The model
    runs in a child process (core/jobs/actions.py), loaded once per adapter; its death is a message here. `image`
    (the upload's file path) goes with the prompt to an image-text adapter only (the box is hidden for others); the
    child checks it as a dataset's images are checked."""
    from core.data.images import MAX_IMAGE_BYTES
    from core.infer import InferError, adapter_config, asks_remote_code, reads_images

    manager = x.app.manager

    def refused(text: str, kind: str = "warn") -> Updates:
        return {x.try_note: warn(text, "try-note", kind)}

    if manager.busy():
        yield refused(t("try.refused_training", lang))
        return
    if not adapter:
        yield refused(t("try.pick_adapter", lang))
        return
    if not (prompt or "").strip():
        yield refused(t("try.empty_prompt", lang))
        return
    try:
        model = adapter_config(adapter).model
    except InferError as exc:
        yield refused(render.error_text(exc, lang), "error")
        return
    if asks_remote_code(adapter) and not trust_remote_code:
        yield refused(t("try.remote_code_needed", lang, model=model))
        return
    image = image if image and reads_images(adapter) else None
    try:
        if image and Path(image).stat().st_size > MAX_IMAGE_BYTES:
            yield refused(t("try.image_too_large", lang, mib=round(Path(image).stat().st_size / 2**20, 1),
                            max=MAX_IMAGE_BYTES // 2**20))
            return
    except OSError:
        yield refused(t("try.image_gone", lang))
        return
    try:
        action = manager.actions.try_child(adapter, bool(trust_remote_code), owner())
    except ActionBusy as exc:
        yield refused(busy_text(exc, lang))
        return
    since = len(action.events_since(0))  # a loaded child's earlier answers are not this prompt's
    yield {x.base: "", x.tuned: "", x.try_note: note(t("try.loading", lang, model=model, path=adapter), "info",
                                                     "try-note")}
    try:
        n = action.ask(prompt=prompt, max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                       top_p=float(top_p), seed=int(seed or 0), template=not raw, image=image)
    except OSError as exc:  # its folder went with it: the child ended between the pick and the prompt
        yield refused(t("msg.error", lang, message=f"{failure(action, lang) if not action.running else exc}"), "error")
        return
    base = tuned = ""
    answered = None
    for e in follow(action, since):
        if e.get("request") != n:
            continue
        if e.get("kind") == "answer":
            base, tuned = e.get("base", ""), e.get("tuned", "")
            yield {x.base: base, x.tuned: tuned}
        elif e.get("kind") == "answered":
            answered = e
            break
    if answered is None or answered.get("status") != "completed":  # the child died or was stopped, or refused
        kind = "warn" if action.stopped else "error"
        yield {x.base: base, x.tuned: tuned, **refused(failure(action, lang, n), kind)}
        return
    base, tuned = answered.get("base", base), answered.get("tuned", tuned)
    empty = [t(k, lang) for k, text in (("try.tuned", tuned), ("try.base", base)) if not (text or "").strip()]
    if empty:  # "Done." beside an empty box read as a broken page: say what happened and why it can
        yield {x.base: base, x.tuned: tuned,
               x.try_note: note(t("try.empty_answer", lang, which=" / ".join(f"“{w}”" for w in empty)), "warn",
                                "try-note")}
        return
    yield {x.base: base, x.tuned: tuned, x.try_note: note(t("try.done", lang), "ok", "try-note")}


def on_try_adapter(adapter: str | None) -> dict:
    """The image box beside the prompt, shown for an adapter trained on images only (core.infer.reads_images)."""
    from core.infer import reads_images

    return gr.update(visible=reads_images(adapter))


def on_try_stop(x: TryExportTab, lang: str = DEFAULT_LANGUAGE) -> str:
    """Stop: the asker's Try it child is ended (the model loads again for the next prompt)."""
    x.app.manager.actions.stop(owner(), "try")
    return note(t("try.stopped", lang), "warn", "try-note")


def on_action_stop(x: TryExportTab, kind: str, lang: str = DEFAULT_LANGUAGE) -> str:
    """Stop a merge or a GGUF export: its child is ended; the running handler then says it was stopped."""
    action = x.app.manager.actions.stop(owner(), kind)
    if action is None:
        return ""
    return warn(t("action.stopped", lang, what=t(f"action.what.{kind}", lang)), "merge-note")


def free_try_model(manager: Any) -> None:
    """Before a GPU run: end the Try it child, so the run has the memory the gauge predicted for."""
    from ui.derive import hardware

    if hardware().cuda:  # the demo model in RAM costs nothing worth loading it again after the run
        manager.actions.free()


# --- export ---------------------------------------------------------------------------------------------------------
def _size(path: Path, lang: str = DEFAULT_LANGUAGE) -> str:
    total = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return render.size(total, lang)


def token_info(lang: str) -> str:
    from core.hub import hf_token

    return t("export.token_env_set" if hf_token() else "export.token_env_missing", lang)


def merge_warning(cfg: Any, lang: str) -> str:
    """What a merge costs (core.export.adapter.merge_size), in words, for the page to show before the user confirms."""
    from core.export.adapter import merge_size

    size = merge_size(cfg)
    if size is None:
        return t("export.merge_warning_unknown", lang, model=cfg.model)
    params, disk, memory = size
    # Human units: "8.03 billion parameters ... 15.0 GiB" for an 8B model, "189,000 parameters ... 352 KiB" for the
    # tiny demo (never "0.000189 billion ... 0.000352 GiB").
    return t("export.merge_warning", lang, model=cfg.model, params=parameter_count(params, lang),
             disk=render.size(disk, lang), mem=render.size(memory, lang))


def parameter_count(n: float, lang: str) -> str:
    if n >= 1e9:
        return t("count.params_billion", lang, n=render.num(n / 1e9, 2, lang))
    if n >= 1e6:
        return t("count.params_million", lang, n=render.num(n / 1e6, 1, lang))
    return t("count.params_thousand", lang, n=render.integer(n, lang))


def on_export_adapter(x: TryExportTab, lang: str, adapter: str | None) -> Updates:
    """An adapter was picked: the merge warning, the memory check, the default merged folder."""
    from core.export.adapter import default_merge_dir, merge_memory_check
    from core.infer import InferError, adapter_config

    cleared = {x.merge_note: ""} if x.merge_note is not None else {}  # a merge of the adapter picked before
    if not adapter:
        return {x.merge_warning: note(t("try.no_adapters", lang), "info"), x.merge_check: "", x.merge_dir: "",
                **cleared}
    try:
        cfg = adapter_config(adapter)
    except InferError as exc:
        return {x.merge_warning: note(render.error_text(exc, lang), "error"), x.merge_check: "", x.merge_dir: "",
                **cleared}
    try:
        needed, available, ok, message = merge_memory_check(cfg)
    except Exception as exc:  # noqa: BLE001 - psutil missing or the like: say so, keep the tab usable
        needed, available, ok, message = 0, 0, False, f"{type(exc).__name__}: {exc}"
    if needed:
        # the same units as the merge warning above it ("423.9 KiB", never "<0.01 GiB" of the same need)
        check = t("export.memory_ok" if ok else "export.memory_low", lang, needed=render.size(needed, lang),
                  available=render.size(available, lang))
        check = check if ok else f"{check}\n{render.log_text(message, lang)}"
    else:
        check = render.log_text(message, lang)
    target = default_merge_dir(adapter)
    if target.is_dir() and any(target.iterdir()):  # said before the click, not only as the refusal after it
        check += "\n" + t("export.merge_replaces", lang, path=target)
    return {x.merge_warning: note(merge_warning(cfg, lang), "warn", "merge-warning"),
            x.merge_check: note(check, "ok" if ok else "error", "merge-check"),
            x.merge_dir: str(default_merge_dir(adapter)), **cleared}


def on_zip(x: TryExportTab, lang: str, adapter: str | None) -> Updates:
    from core.export.adapter import ExportError, zip_adapter

    def refused(text: str, kind: str = "warn") -> Updates:
        return {x.zip_file: gr.update(value=None, visible=False), x.export_note: warn(text, "export-note", kind)}

    if not adapter:
        return refused(t("try.pick_adapter", lang))
    if (refusal := public_refusal(lang, (adapter, "adapter"))):
        return refused(t("export.failed", lang, message=refusal), "error")
    try:
        path = zip_adapter(adapter)
    except (ExportError, OSError) as exc:
        return refused(t("export.failed", lang, message=render.error_text(exc, lang)), "error")
    size = _size(path, lang)  # in the label: Gradio's own "148.8 KB" beside the link is hidden (ui/theme.py)
    return {x.zip_file: gr.update(value=str(path), visible=True, label=t("run.download_size", lang, size=size)),
            x.export_note: note(t("export.zip_ready", lang, path=path.name, size=size), "ok", "export-note")}


def merge_into_choices(lang: str) -> list[tuple[str, str]]:
    """The page's words for core.export.adapter.MERGE_TARGETS (which base weights the delta is added to)."""
    from core.export.adapter import MERGE_TARGETS

    return [(t(f"export.merge_into_{target}", lang), target) for target in MERGE_TARGETS]


def on_merge(x: TryExportTab, lang: str, adapter: str | None, out_dir: str, replace: bool, confirmed: bool,
             merge_into: str | None = None, trust_remote_code: bool = False, progress: Any = gr.Progress()) -> str:
    """Merge with a progress bar, after the confirmation tick, in a child process (core/jobs/actions.py); refused
    while a training run is going, and for an adapter trained with trust_remote_code, without the tab's
    trust_remote_code tick. merge_into: core.export.adapter.merge_adapter's (None: the dequantized 4-bit weights
    for a 4-bit run)."""
    from core.infer import adapter_config, asks_remote_code

    manager = x.app.manager
    if not adapter:
        return warn(t("try.pick_adapter", lang), "merge-note")
    if not confirmed:
        return warn(t("export.confirm_first", lang), "merge-note")
    if manager.busy():
        return warn(t("export.busy_training", lang), "merge-note")
    if asks_remote_code(adapter) and not trust_remote_code:
        return warn(t("try.remote_code_needed", lang, model=adapter_config(adapter).model), "merge-note")
    if (refusal := public_refusal(lang, (adapter, "adapter"), ((out_dir or "").strip() or None, "merged"))):
        return warn(t("export.failed", lang, message=refusal), "merge-note", "error")
    from core.export.adapter import ExportError, merge_destination

    try:  # a folder it may not write is refused here, before a child starts (the child checks it again)
        merge_destination(adapter, (out_dir or "").strip() or None, bool(replace))
    except ExportError as exc:
        return warn(t("export.failed", lang, message=render.error_text(exc, lang)), "merge-note", "error")
    try:
        action = manager.actions.start("merge", {
            "adapter": adapter, "out_dir": (out_dir or "").strip() or None, "overwrite": bool(replace),
            "merge_into": merge_into or None, "trust_remote_code": bool(trust_remote_code)}, owner())
    except ActionBusy as exc:
        return warn(busy_text(exc, lang), "merge-note")
    done = with_progress(action, progress, lang)
    if done.get("status") != "completed":
        if action.stopped:
            return warn(failure(action, lang), "merge-note")
        return warn(t("export.failed", lang, message=failure(action, lang)), "merge-note", "error")
    path = Path(done["path"])
    return note(t("export.merged", lang, path=path, size=_size(path, lang)), "ok", "merge-note")


def on_push(x: TryExportTab, lang: str, adapter: str | None, what: str, merged_dir: str, repo_id: str,
            private: bool, token: str | None) -> Updates:
    """Push the adapter or the merged folder; the typed token is used for this call only, then cleared."""
    from core.export.adapter import ExportError, push_to_hub
    from core.hub import hf_token

    def said(html: str) -> Updates:
        return {x.export_note: html, x.token: ""}

    if not adapter:
        return said(warn(t("try.pick_adapter", lang), "export-note"))
    folder = adapter if what != "merged" else ((merged_dir or "").strip())
    if what == "merged" and not (folder and Path(folder).is_dir()):
        return said(warn(t("export.merge_first", lang), "export-note"))
    if (refusal := public_refusal(lang, (folder, "push"))):
        return said(warn(t("export.failed", lang, message=refusal), "export-note", "error"))
    if not (token or "").strip() and not hf_token():  # point to the box on this page, not only to HF_TOKEN
        return said(warn(t("export.no_token", lang, field=t("export.token", lang)), "export-note", "error"))
    try:
        url = push_to_hub(folder, repo_id, token=(token or "").strip() or None, private=bool(private))
    except ExportError as exc:
        return said(warn(t("export.failed", lang, message=render.error_text(exc, lang)), "export-note", "error"))
    except Exception as exc:  # noqa: BLE001 - push_to_hub scrubs the token from its own messages; be safe here too
        message = f"{type(exc).__name__}: {exc}"
        if token:
            message = message.replace(token.strip(), "hf_***")
        return said(warn(t("export.failed", lang, message=message), "export-note", "error"))
    return said(note(t("export.pushed", lang, url=url), "ok", "export-note"))
