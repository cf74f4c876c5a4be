"""The child side of the app's model-running actions: `python -m core.jobs.act --dir DIR` (started by
core/jobs/actions.py, never by hand). DIR/action.json says what to do ({"kind": "try"|"merge"|"gguf"|"inspect",
"params"}; "preview" too);
the child writes its progress to DIR/events.jsonl (the same events and sink as a training run), so the app's process
never loads a model: an out-of-memory merge or a crash in a library ends this process, not the web server.

- merge, gguf: phase events (loading, merging/converting with the library's own progress), then `done`
  (completed with the result's paths, or failed after an `error` event with error_type and message).
- inspect: the run resolved on the meta device and the layers its estimate needs measured into the disk cache
  (core/estimate/inspect.py), then `done` with the resolved changes and any failed measurement.
- preview: the data read, the tokenizer loaded and the rows planned as the run will (core/jobs/preview.py), with
  phase events for the preview's bar (reading, then how much of the tokenizing is done), then `done` with what the
  page renders. Started for a public Space's visitor, it reads as that visitor (core.runs.public.VISITOR_ENV).
- try: loads base + adapter once (phase loading, then `ready`), then answers the requests the app writes as
  DIR/requests/NNNNNN.json, in order, one `answer` event per streamed step and an `answered` event at the end of
  each, all carrying the request's number. It stays loaded between prompts; the app ends it (SIGTERM) to stop it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from core.messages import Said, fields_of, words_of
from core.jobs.warm import START_ENV
from core.runs.events import JsonlSink, make_event

REQUESTS = "requests"
SPEC = "action.json"
POLL_S = 0.05  # how often an idle Try it child looks for the next prompt


def error_type(exc: BaseException) -> str:
    """The failure record's kind: what the page can say beyond the message."""
    name = type(exc).__name__
    if name == "OutOfMemoryError" or isinstance(exc, MemoryError):
        return "oom"
    if name in ("ExportError", "GGUFError", "InferError"):
        return "refused"
    return "other"


def _loading(emit: Callable[[dict], None], p: dict[str, Any], progress: float | None) -> None:
    """The child's first phase; `start` says how it started, as a training run's first event does (core/jobs/warm.py:
    "warm", forked from the libraries already imported, or "cold: why"; "" when not started by the app)."""
    _phase(emit, "loading", progress, Said("action.loading", path=p["adapter"]), start=os.environ.get(START_ENV, ""))


def _phase(emit: Callable[[dict], None], phase: str, progress: float | None, message: str, **extra: Any) -> None:
    """A phase event; its words keyed when `message` is (a Said): the page says them in its language."""
    emit(make_event("phase", phase=phase, progress=progress, **words_of(message), **extra))


def run_merge(p: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    from core.export.adapter import merge_adapter

    _loading(emit, p, 0.0)
    path = merge_adapter(p["adapter"], p.get("out_dir"), overwrite=bool(p.get("overwrite")),
                         merge_into=p.get("merge_into"), trust_remote_code=bool(p.get("trust_remote_code")),
                         progress=lambda fraction, message: _phase(emit, "merging", float(fraction), message))
    return {"path": str(path)}


def run_gguf(p: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    from core.export.gguf_export import export_gguf

    _loading(emit, p, 0.0)
    result = export_gguf(adapter_dir=p["adapter"], formats=p["formats"], overwrite=bool(p.get("overwrite")),
                         trust_remote_code=bool(p.get("trust_remote_code")),
                         progress=lambda fraction, message: _phase(emit, "converting", float(fraction), message))
    return {"out_dir": str(result.out_dir), "files": {k: str(v) for k, v in result.files.items()},
            "modelfile": str(result.modelfile), "readme": str(result.readme), "commands": list(result.commands)}


def run_inspect(p: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    from core.estimate.inspect import inspect

    _phase(emit, "measuring", None, Said("inspect.measuring"), start=os.environ.get(START_ENV, ""))
    return inspect(p["config"], p.get("wanted", []), resolve=resolver(), cuda=bool(p.get("cuda")),
                   world=int(p.get("world") or 1), max_row_tokens=p.get("max_row_tokens"))


def run_preview(p: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    from core.jobs.preview import answer
    from core.data.read import PREVIEW_LIMIT

    shown: list[float] = []

    def phase(words: Said, progress: float | None) -> None:
        step = None if progress is None else round(float(progress), 2)  # the bar moves by hundredths: no flood
        if shown and shown[-1] == step:
            return
        shown.append(step)
        _phase(emit, "previewing", step, words, **({"start": os.environ.get(START_ENV, "")} if len(shown) == 1 else {}))

    return {"preview": answer(p["config"], PREVIEW_LIMIT, phase)}  # bounded: a preview never holds its queue long


def resolves() -> bool:
    """Whether this checkout has the resolver (found without importing it: the web server asks)."""
    import importlib.util

    return importlib.util.find_spec("core.model.resolve") is not None


def resolver() -> Callable[..., Any] | None:
    """The one place that decides what will train (`resolve(cfg, tree, plan=None, *, cuda, world)`), where this
    checkout has it; None: the run is the config as typed."""
    try:
        from core.model.resolve import resolve
    except ImportError:
        return None
    return resolve


def serve_try(p: dict[str, Any], emit: Callable[[dict], None], folder: Path) -> dict[str, Any]:
    """Load once, then answer each request file in order until the app ends this process (or dies: PDEATHSIG)."""
    from core.infer import Comparer, InferError
    from core.jobs.supervise import parent_gone

    comparer = Comparer()
    _loading(emit, p, None)
    comparer.load(p["adapter"], trust_remote_code=bool(p.get("trust_remote_code")))
    _phase(emit, "ready", None, Said("action.ready"))
    inbox = folder / REQUESTS
    inbox.mkdir(exist_ok=True)
    done: set[str] = set()
    while not parent_gone():
        todo = sorted(f for f in inbox.glob("*.json") if f.name not in done)
        if not todo:
            time.sleep(POLL_S)
            continue
        file = todo[0]
        done.add(file.name)
        ask = json.loads(file.read_text(encoding="utf-8"))
        n = int(ask.pop("request"))
        _phase(emit, "generating", None, Said("action.generating"), request=n)
        base = tuned = ""
        try:
            for base, tuned in comparer.compare(p["adapter"], trust_remote_code=bool(p.get("trust_remote_code")),
                                                **ask):
                emit(make_event("answer", request=n, base=base, tuned=tuned))
        except InferError as exc:  # this prompt only (an empty prompt, an OOM while generating): the model stays
            emit(make_event("error", request=n, error_type=error_type(exc), message=str(exc), **fields_of(exc)))
            emit(make_event("answered", request=n, status="failed", base=base, tuned=tuned))
            continue
        finally:  # the request's own copy of its image (Action.ask's), read: a long session keeps no pile of them
            if ask.get("image") and Path(ask["image"]).parent == inbox:
                Path(ask["image"]).unlink(missing_ok=True)
        emit(make_event("answered", request=n, status="completed", base=base, tuned=tuned))
    return {}


def main(argv: list[str]) -> int:
    folder = Path(argv[argv.index("--dir") + 1])
    spec = json.loads((folder / SPEC).read_text(encoding="utf-8"))
    emit = JsonlSink(folder / "events.jsonl")
    kind, params = spec["kind"], spec["params"]
    work = {"merge": run_merge, "gguf": run_gguf, "inspect": run_inspect, "preview": run_preview}.get(kind)
    try:
        result = serve_try(params, emit, folder) if kind == "try" else work(params, emit)
    except Exception as exc:  # noqa: BLE001 - recorded for the page: the app shows the message, this process ends
        emit(make_event("error", error_type=error_type(exc), message=f"{exc}" if error_type(exc) == "refused"
                        else f"{type(exc).__name__}: {exc}", **fields_of(exc)))  # the key: said in the page's language
        emit(make_event("done", status="failed", message=str(exc), **fields_of(exc)))
        return 1
    emit(make_event("done", status="completed", message="", **result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
