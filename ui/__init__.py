"""memtune's Gradio interface. `build_ui()` returns the Blocks; app.py launches it."""

from ui.early import EarlyScript
from ui.layout import build_ui
from ui.theme import CSS, make_theme

__all__ = ["EarlyScript", "build_ui", "CSS", "make_theme"]
