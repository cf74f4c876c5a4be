"""Small helpers the after-training tabs share: notices in place (and as toasts), and the runs folder they act on
(public mode: only the app's own)."""

from __future__ import annotations

import gradio as gr

from ui import render


def note(text: str, kind: str = "info", elem_id: str | None = None) -> str:
    return render.message_html(text, kind, elem_id)


def warn(text: str, elem_id: str | None = None, kind: str = "warn") -> str:
    """A notice in place and a toast: what every refusal and error here does."""
    gr.Warning(text)
    return note(text, kind, elem_id)


def runs_folder(output_dir: str | None) -> str:
    """The folder whose runs History, Try it and Export list: the form's output folder (public mode: the app's)."""
    from core.runs.public import is_public, public_root

    if is_public():  # a visitor's typed folder is never listed, loaded or deleted from
        return str(public_root())
    return (output_dir or "").strip() or "runs"


def public_refusal(lang: str, *folders: tuple[str | None, str]) -> str | None:
    """Public mode: why one of these (folder, what: core.runs.public.FOLDER_KINDS) lies outside the app's runs
    folder, in the page's language, or None."""
    from core.runs.public import folder_refusal

    for folder, what in folders:
        if (why := folder_refusal(folder, what)):
            return render.said(why.key, why.params, lang)
    return None
