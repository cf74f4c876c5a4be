"""Public mode (a Hugging Face Space, or `python app.py --public`) and the trust_remote_code confirmation.

In public mode anyone on the internet may use the page, without a password. So the server reads no local path a
visitor typed: datasets come from uploads (memtune's own upload folder), the Hub or the demo; models from the Hub
or the demo; runs stay in the app's own folder (`public_root()`), and History/Export act only inside it.
trust_remote_code is unavailable. The checks live here and are called from config validation and from the
loaders themselves (core.model.load.resolve_model_path, core.data.plan.load_raw), so Preview cannot get round them.

Each visitor (one browser, known by the id the server issued it in a signed cookie: core.runs.identity) has folders
of their own: `public_root()` and `upload_root()` name the visitor's sub-folder while a page request is being answered
(the UI registers who is asking: `set_visitor_source`), so
History, Try it, Export and Preview see only that visitor's runs and uploads, and a path typed into another
visitor's folder is refused like any other server path. Outside a request (the training child the app started, the
CLI) the whole folders are allowed: that code is the app's, not a visitor's.

Outside public mode, a config loaded from a file or from History never switches trust_remote_code on by itself:
`without_remote_code(cfg)` turns it off and says so, and the user ticks it again to confirm.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from core.files import real
from core.runs.identity import ID_PATTERN
from core.messages import Said

if TYPE_CHECKING:
    from core.config.settings import Problem, TrainConfig

PUBLIC_ENV = "MEMTUNE_PUBLIC"  # set by app.py --public (and implied by SPACE_ID)


def is_public() -> bool:
    return os.environ.get(PUBLIC_ENV, "").strip().lower() in ("1", "true", "yes", "on") or bool(
        os.environ.get("SPACE_ID"))


_visitor_source: Callable[[], str | None] = lambda: None  # the UI's: who is asking (None: no page request)
NOBODY = "unknown"  # the folder of a request without a valid visitor cookie: empty, never another visitor's


def set_visitor_source(source: Callable[[], str | None]) -> None:
    """The UI registers how to tell the current page request's visitor (the id in its signed cookie)."""
    global _visitor_source
    _visitor_source = source


def visitor() -> str | None:
    """Public mode, while a page request is answered: the visitor's folder name; None otherwise."""
    if not is_public():
        return None
    who = _visitor_source()
    if who is None:
        return None
    return f"visitor-{who}" if ID_PATTERN.fullmatch(str(who)) else f"visitor-{NOBODY}"


@dataclass(frozen=True)
class SpaceLimits:
    """What one visitor may use on a public server; the Space owner sets each in the environment (0: no limit).
    The defaults suit a free Space: one GPU (or two CPU cores) shared by strangers."""

    jobs: int = 1  # MEMTUNE_SPACE_JOBS: runs one visitor may have queued or running at once
    minutes: float = 30.0  # MEMTUNE_SPACE_MINUTES: a run is Stopped (it saves its adapter) after this long
    steps: int = 1000  # MEMTUNE_SPACE_STEPS: the largest max_steps a visitor may set
    disk_gib: float = 2.0  # MEMTUNE_SPACE_DISK_GIB: a visitor's runs and uploads; above it, Start is refused
    keep_hours: float = 48.0  # MEMTUNE_SPACE_KEEP_HOURS: a visitor's folders untouched this long are deleted


LIMIT_ENV = {"jobs": "MEMTUNE_SPACE_JOBS", "minutes": "MEMTUNE_SPACE_MINUTES", "steps": "MEMTUNE_SPACE_STEPS",
             "disk_gib": "MEMTUNE_SPACE_DISK_GIB", "keep_hours": "MEMTUNE_SPACE_KEEP_HOURS"}


def limits() -> SpaceLimits:
    """The limits in force (an unreadable or negative value keeps the default: a typo never lifts a limit)."""
    values = {}
    for name, env in LIMIT_ENV.items():
        default = getattr(SpaceLimits, name)
        try:
            value = type(default)(float(os.environ.get(env, default)))
        except ValueError:
            value = default
        values[name] = value if value >= 0 else default
    return SpaceLimits(**values)


def _size(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def disk_used() -> int:
    """Bytes the current visitor's runs and uploads take (0 outside public mode or a request)."""
    if not visitor():
        return 0
    return _size(public_root()) + _size(upload_root())


def _mine(base: Path) -> Path:
    who = visitor()
    return base / who if who else base


def shared_public_root() -> Path:
    """The app's own runs folder, every visitor's sub-folder inside it."""
    return real(os.environ.get("MEMTUNE_PUBLIC_RUNS") or "runs")


def public_root() -> Path:
    """The only place public mode writes runs, lists History from and exports from: the visitor's own folder in
    the app's runs folder (the whole of it outside a page request)."""
    return _mine(shared_public_root())


def upload_root() -> Path:
    """Where uploads are kept: public mode, the visitor's own folder under the shared one."""
    from core.config.settings import cache_root

    base = real(cache_root() / "uploads")
    return _mine(base) if is_public() else base


UPLOADS = "uploads"  # what a visitor sees of their upload folder: `uploads/mine.jsonl`
RUNS = "runs"


def _places() -> list[tuple[str, str]]:
    from core.config.settings import cache_root

    return [(str(public_root()), RUNS), (str(upload_root()), UPLOADS), (str(shared_public_root()), RUNS),
            (str(real(cache_root())), "memtune-home"), (str(Path.cwd()), ".")]


def shown(text: str) -> str:
    """Public mode, a visitor's request: `text` with the server's folders named relative to the visitor's own space
    (`runs/...`, `uploads/...`): a visitor never sees the server's paths. Elsewhere as is."""
    if not text or not is_public() or not visitor():
        return text
    for place, name in _places():
        text = text.replace(place, name)
    return text


def from_shown(value: str, run: bool = False) -> str:
    """The inverse of `shown` for a dataset box: `uploads/x` -> the visitor's upload folder's x (still checked by
    dataset_problem: `uploads/../..` resolves outside it and is refused); for a box naming a run (`run`:
    init_adapter, resume_from), `runs/x` -> the visitor's runs folder's x (checked by public_problems alike)."""
    if is_public() and visitor() and value.startswith(UPLOADS + "/"):
        return str(upload_root() / value[len(UPLOADS) + 1:])
    if run and is_public() and visitor() and value.startswith(RUNS + "/"):
        return str(public_root() / value[len(RUNS) + 1:])
    return value


def visitor_config(cfg: "TrainConfig") -> "TrainConfig":
    """Public mode: a run the page starts goes into the visitor's own runs folder (the form's output_dir, e.g. the
    default `runs`, names the app's folder; a visitor cannot choose another), on their upload as the page names it."""
    if not (is_public() and visitor()):
        return cfg
    if inside(cfg.output_dir, shared_public_root()):
        cfg = cfg.replace(output_dir=str(public_root()))
    dataset = from_shown(cfg.dataset)
    return cfg.replace(dataset=dataset) if dataset != cfg.dataset else cfg


def inside(path: str | Path, root: Path) -> bool:
    p = real(path)
    return p == root or root in p.parents


def local_path_refusal(what: str, value: str) -> str:
    return Said("public.dataset_path" if what == "dataset" else "public.model_path", value=value)


def dataset_problem(source: str) -> str | None:
    """Public mode: a dataset that is a local path outside the upload folder is refused."""
    from core.config.settings import DEMO_DATASET

    source = (source or "").strip()
    if not is_public() or not source or source == DEMO_DATASET:
        return None
    looks_local = source.startswith((".", "/", "~")) or source.count("/") > 1 or Path(source).expanduser().exists()
    if looks_local and not inside(source, upload_root()):
        return local_path_refusal("dataset", source)
    return None


def model_problem(cfg: "TrainConfig") -> str | None:
    """Public mode: no trust_remote_code, no local model folder."""
    from core.config.settings import DEMO_MODEL

    if not is_public():
        return None
    if cfg.trust_remote_code:
        return Said("public.trust")
    model = cfg.model.strip()
    if model != DEMO_MODEL and (model.startswith((".", "/", "~")) or model.count("/") > 1
                                or Path(model).expanduser().exists()):
        return local_path_refusal("model", model)
    return None


def public_problems(cfg: "TrainConfig") -> list["Problem"]:
    """What validation adds in public mode (an empty list outside it)."""
    from core.config.settings import Problem

    if not is_public():
        return []
    out = []
    root = public_root()
    why = model_problem(cfg)
    if why:
        field = "trust_remote_code" if cfg.trust_remote_code else "model"
        out.append(Problem.of(field, "problem.public_trust" if cfg.trust_remote_code else "problem.public_model", why=why))
    why = dataset_problem(cfg.dataset)
    if why:
        out.append(Problem.of("dataset", "problem.public_dataset", why=why))
    if not inside(cfg.output_dir, root):
        out.append(Problem.of("output_dir", "problem.public_output", root=root, name=root.name))
    if cfg.resume_from and not inside(cfg.resume_from, root):
        out.append(Problem.of("resume_from", "problem.public_resume", root=root))
    if cfg.init_adapter.strip() and not inside(cfg.init_adapter.strip(), root):  # another visitor's or a server path
        out.append(Problem.of("init_adapter", "problem.public_init_adapter", root=root))
    steps = limits().steps
    if steps and cfg.max_steps > steps:
        out.append(Problem.of("max_steps", "problem.public_steps", limit=steps))
    return out


def check_folder(path: str | Path | None, what: str) -> Path | None:
    """Public mode: refuse (ValueError) a History/Export folder outside the app's runs folder; else the path."""
    if path and is_public() and not inside(path, public_root()):
        raise ValueError(f"On this public server {what} must be inside {public_root()}; {path} is not.")
    return Path(path) if path else None


def without_remote_code(cfg: "TrainConfig") -> tuple["TrainConfig", bool]:
    """A loaded config never turns trust_remote_code on by itself: (cfg with it off, whether it had asked for it)."""
    return (cfg.replace(trust_remote_code=False), True) if cfg.trust_remote_code else (cfg, False)


def _newest(path: Path) -> float:
    """The latest change anywhere under `path` (a visitor's run or upload was last used then)."""
    newest = path.lstat().st_mtime
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
    return newest


def prune_visitors(keep_hours: float, is_running: Callable[[Path], bool], now: float | None = None) -> list[str]:
    """Public mode's retention: each visitor's runs and uploads untouched for `keep_hours` are deleted (runs through
    core.runs.history.delete_run: memtune's own, never a running one; uploads only as files in the visitor's upload
    folder). Called outside any request (the whole folders). Returns what was deleted, for the log."""
    import time

    from core.config.settings import cache_root
    from core.files import target
    from core.runs.history import HistoryError, delete_run

    if not keep_hours:
        return []
    cutoff = (now if now is not None else time.time()) - keep_hours * 3600
    done: list[str] = []
    runs, uploads = shared_public_root(), real(cache_root() / "uploads")
    for base in (runs, uploads):
        for folder in sorted(base.glob("visitor-*")) if base.is_dir() else []:
            if folder.is_symlink() or not folder.is_dir():
                continue
            for item in sorted(folder.iterdir()):
                try:
                    if _newest(item) >= cutoff:
                        continue
                    if base == runs:
                        done.append(str(delete_run(item, folder, is_running=is_running)))
                    elif (item.is_file() and not item.is_symlink()
                          and target(item, "delete", folder=False).parent == folder):
                        item.unlink()
                        done.append(str(item))
                except (HistoryError, OSError):
                    continue  # not a memtune run, running, or gone meanwhile: left alone
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
    return done
