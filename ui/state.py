"""The app's state the page acts on, built once (app.py, or a test) and handed to ui.layout.build_ui, which gives it
to every handler (through the tab objects, or bound with functools.partial). No module imports a process-wide
manager by name: a test builds its own and passes it, instead of patching copies."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.jobs.manager import JobManager


@dataclass(eq=False)
class AppState:
    manager: JobManager = field(default_factory=JobManager)  # training runs and the model-running actions
