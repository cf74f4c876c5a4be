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
visitor's folder is refused like any other server path. The training child the app starts for a visitor is told whose
run it is (VISITOR_ENV) and checks the same rules again, for that visitor. Outside a request and such a child (the
app's own retention, the CLI) the whole folders are allowed: that code is the app's, not a visitor's.

Every config field that can name a place on this machine is declared once, on its field (`path=` in
core/config/settings.py, `path_fields()` here): the page's `uploads/...` and `runs/...` forms (`shown`, `from_shown`)
and the checks (`public_problems`) go over that declaration, so a new path field is checked as soon as it is declared.

Outside public mode, a config loaded from a file or from History never switches trust_remote_code on by itself:
`without_remote_code(cfg)` turns it off and says so, and the user ticks it again to confirm.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from core.config.slices import DataSlice, ModelSlice, PlaceSlice, StageSlice, TrainerSlice
from core.files import real
from core.runs.identity import ID_PATTERN
from core.messages import Said

if TYPE_CHECKING:
    from core.config.settings import Problem


class _Steps(DataSlice, TrainerSlice, Protocol):
    """The rows' length and the batches, steps and epochs: how much a run computes."""


class _Visited(ModelSlice, DataSlice, StageSlice, TrainerSlice, PlaceSlice, Protocol):
    """Every part holding a path field (tests/test_slices.py checks path_fields() stays inside it), and the steps."""


V = TypeVar("V", bound=_Visited)
M = TypeVar("M", bound=ModelSlice)

PUBLIC_ENV = "MEMTUNE_PUBLIC"  # set by app.py --public (and implied by SPACE_ID)


def is_public() -> bool:
    return os.environ.get(PUBLIC_ENV, "").strip().lower() in ("1", "true", "yes", "on") or bool(
        os.environ.get("SPACE_ID"))


_visitor_source: Callable[[], str | None] = lambda: None  # the UI's: who is asking (None: no page request)
NOBODY = "unknown"  # the folder of a request without a valid visitor cookie: empty, never another visitor's
VISITOR_ENV = "MEMTUNE_VISITOR"  # set by core.jobs.manager for a visitor's training child: whose run it is
OWNER = re.compile(rf"visitor-(?:{ID_PATTERN.pattern}|{NOBODY})")
_address_source: Callable[[], str | None] = lambda: None  # the UI's: the network address of who is asking


def set_visitor_source(source: Callable[[], str | None]) -> None:
    """The UI registers how to tell the current page request's visitor (the id in its signed cookie)."""
    global _visitor_source
    _visitor_source = source


def visitor() -> str | None:
    """Public mode, while a page request is answered: the visitor's folder name; in a training child started for a
    visitor, that visitor's (VISITOR_ENV); None otherwise."""
    if not is_public():
        return None
    who = _visitor_source()
    if who is None:
        owner = os.environ.get(VISITOR_ENV)
        if owner is None:
            return None
        return owner if OWNER.fullmatch(owner) else f"visitor-{NOBODY}"  # a garbled one never means "everyone"
    return f"visitor-{who}" if ID_PATTERN.fullmatch(str(who)) else f"visitor-{NOBODY}"


def set_address_source(source: Callable[[], str | None]) -> None:
    """The UI registers how to tell the network address of the current page request (client_address)."""
    global _address_source
    _address_source = source


def address() -> str | None:
    """Public mode, while a page request is answered: the asker's network address (None when unknown)."""
    return _address_source() if is_public() else None


def behind_proxy() -> bool:
    """Whether requests reach the app through a proxy that names the client in X-Forwarded-For: a Hugging Face Space
    (SPACE_ID), or where the server's owner says so (MEMTUNE_BEHIND_PROXY=1)."""
    return bool(os.environ.get("SPACE_ID")) or os.environ.get("MEMTUNE_BEHIND_PROXY", "").strip() in ("1", "true")


def client_address(host: str | None, forwarded: str | None) -> str | None:
    """The client's address: behind a proxy, X-Forwarded-For's first hop (the client as the proxy saw it; the
    connection itself comes from the proxy); otherwise the connection's address, whatever the header says (a client
    could write any)."""
    if forwarded and behind_proxy():
        first = forwarded.split(",")[0].strip()
        if first:
            return first
    return host or None


@dataclass(frozen=True)
class SpaceLimits:
    """What one visitor may use on a public server; the Space owner sets each in the environment (0: no limit).
    The defaults suit a free Space: one GPU (or two CPU cores) shared by strangers."""

    jobs: int = 1  # MEMTUNE_SPACE_JOBS: runs one visitor may have queued or running at once
    minutes: float = 30.0  # MEMTUNE_SPACE_MINUTES: a run is Stopped (it saves its adapter) after this long
    steps: int = 1000  # MEMTUNE_SPACE_STEPS: the most optimizer steps a run may plan (max_steps, or from epochs)
    disk_gib: float = 2.0  # MEMTUNE_SPACE_DISK_GIB: a visitor's runs and uploads; an upload or Start past it is refused
    keep_hours: float = 48.0  # MEMTUNE_SPACE_KEEP_HOURS: a visitor's folders untouched this long are deleted
    queue: int = 8  # MEMTUNE_SPACE_QUEUE: runs waiting in the queue, everyone's together
    per_address: int = 2  # MEMTUNE_SPACE_PER_ADDRESS: runs queued or running from one network address
    # MEMTUNE_SPACE_TOKENS: the most tokens a run may plan (steps x rows per step x max_length): the step limit alone
    # lets a large batch or accumulation train without bound
    tokens: int = 16_000_000


LIMIT_ENV = {"jobs": "MEMTUNE_SPACE_JOBS", "minutes": "MEMTUNE_SPACE_MINUTES", "steps": "MEMTUNE_SPACE_STEPS",
             "disk_gib": "MEMTUNE_SPACE_DISK_GIB", "keep_hours": "MEMTUNE_SPACE_KEEP_HOURS",
             "queue": "MEMTUNE_SPACE_QUEUE", "per_address": "MEMTUNE_SPACE_PER_ADDRESS", "tokens": "MEMTUNE_SPACE_TOKENS"}


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


@cache
def path_fields() -> MappingProxyType:
    """Every TrainConfig field whose value can name a place on this machine -> its kind (core.config.settings
    PATH_KINDS), as declared on the field (`path=`): what the page maps and public mode checks."""
    from core.config.settings import TrainConfig

    return MappingProxyType({f.name: f.metadata["path"] for f in fields(TrainConfig) if f.metadata.get("path")})


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


def from_shown(value: str) -> str:
    """The inverse of `shown` for a path field's box: `uploads/x` -> the visitor's upload folder's x, `runs/x` -> the
    visitor's runs folder's x (`runs` alone: that folder). Still checked by public_problems afterwards: `uploads/../..`
    resolves outside the visitor's folder and is refused like any other server path."""
    if not (is_public() and visitor()):
        return value
    for name, root in ((UPLOADS, upload_root), (RUNS, public_root)):
        if value == name:
            return str(root())
        if value.startswith(name + "/"):
            return str(root() / value[len(name) + 1:])
    return value


def visitor_config(cfg: V) -> V:
    """Public mode: every path field as the page names it (`uploads/...`, `runs/...`) mapped to the visitor's own
    folders; a run the page starts goes into the visitor's own runs folder (the form's output_dir, e.g. the default
    `runs`, names the app's folder; a visitor cannot choose another)."""
    if not (is_public() and visitor()):
        return cfg
    changes = {name: from_shown(getattr(cfg, name)) for name in path_fields()}
    changes = {name: value for name, value in changes.items() if value != getattr(cfg, name)}
    cfg = cfg.replace(**changes) if changes else cfg
    if inside(cfg.output_dir, shared_public_root()):
        cfg = cfg.replace(output_dir=str(public_root()))
    return cfg


def inside(path: str | Path, root: Path) -> bool:
    p = real(path)
    return p == root or root in p.parents


def _looks_local(value: str) -> bool:
    return value.startswith((".", "/", "~")) or value.count("/") > 1 or Path(value).expanduser().exists()


def local_path_refusal(what: str, value: str) -> Said:
    if what == "model":
        return Said("public.model_path", value=value)
    return Said("public.dataset_path", value=value) if what == "dataset" else Said("public.data_path", value=value,
                                                                                    field=what)


def shipped(source: str) -> bool:
    """The demos' own data: the text demo's id, or the vision demo's shipped files (read-only, in memtune's folder)."""
    from core.config.settings import DEMO_DATASET, DEMO_VISION_DATA

    if source == DEMO_DATASET:
        return True
    demo = DEMO_VISION_DATA.resolve()
    return _looks_local(source) and Path(source).expanduser().resolve() in (demo, demo.with_name("heldout.jsonl"))


def dataset_problem(source: str, what: str = "dataset") -> Said | None:
    """Public mode: data (`what`: its field) that is a local path outside the visitor's upload folder is refused (the
    demos' own data is not)."""
    source = (source or "").strip()
    if not is_public() or not source or shipped(source):
        return None
    if _looks_local(source) and not inside(source, upload_root()):
        return local_path_refusal(what, source)
    return None


def model_path_problem(model: str) -> Said | None:
    """Public mode: a model that is a local folder is refused (the demo and Hub ids are not)."""
    from core.config.settings import DEMO_MODEL

    model = (model or "").strip()
    if is_public() and model and model != DEMO_MODEL and _looks_local(model):
        return local_path_refusal("model", model)
    return None


def model_problem(cfg: ModelSlice) -> Said | None:
    """Public mode: no trust_remote_code, no local model folder."""
    if not is_public():
        return None
    if cfg.trust_remote_code:
        return Said("public.trust")
    return model_path_problem(cfg.model)


def path_problem(name: str, kind: str, value: str) -> "Problem | None":
    """Public mode: the one rule for a path field of `kind`. A model: the demo or a Hub id; data: the demo, a Hub id
    or the visitor's upload; a run (`run`): empty or one of the visitor's runs; the runs folder (`runs`): the
    visitor's own."""
    from core.config.settings import Problem

    value = (value or "").strip()
    if kind == "model":
        why = model_path_problem(value)
        return Problem.of(name, "problem.public_model", why=why) if why else None
    if kind == "data":
        why = dataset_problem(value, name)
        return Problem.of(name, "problem.public_dataset", why=why) if why else None
    root = public_root()
    if kind == "run":
        ok = not value or inside(value, root)  # another visitor's run or a server path is refused
        if ok:
            return None
        return Problem.of(name, "problem.public_resume" if name == "resume_from"  # these two have fixes of their own
                          else "problem.public_init_adapter" if name == "init_adapter" else "problem.public_run",
                          root=root, setting=name)
    return None if inside(value, root) else Problem.of(name, "problem.public_output", root=root, name=root.name)


def planned_steps(cfg: TrainerSlice, rows: int, world: int = 1) -> tuple[int, int]:
    """(optimizer steps a run of `cfg` takes on `rows` training rows, or packed sequences, over `world` processes;
    steps per epoch): max_steps when set, else as transformers' Trainer counts them (set_initial_training_values):
    each process's batches per epoch, divided by the accumulation rounded up, times the epochs rounded up."""
    batches = math.ceil(max(0, rows) / (cfg.per_device_train_batch_size * max(1, world)))
    per_epoch = max(math.ceil(batches / cfg.gradient_accumulation_steps), 1)
    return (cfg.max_steps if cfg.max_steps > 0 else math.ceil(cfg.num_train_epochs * per_epoch)), per_epoch


def plan_problems(cfg: _Steps, rows: int | None = None, world: int = 1) -> list["Problem"]:
    """Public mode: a run planning more optimizer steps, or more tokens, than the Space owner's limits. max_steps is
    checked as it is; a run counted in epochs once its training `rows` are known (None: not yet; the page counts them
    before Start, the training child after planning them). Tokens are bounded from above: every row of every step
    at max_length."""
    from core.config.settings import Problem

    if not is_public():
        return []
    bound = limits()
    if cfg.max_steps > 0:
        steps, per_epoch = cfg.max_steps, 0
    elif rows is not None:
        steps, per_epoch = planned_steps(cfg, rows, world)
    else:
        return []
    per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * max(1, world)
    out = []
    if bound.steps and steps > bound.steps:
        out.append(Problem.of("max_steps", "problem.public_steps", limit=bound.steps) if cfg.max_steps > 0 else
                   Problem.of("num_train_epochs", "problem.public_planned_steps", steps=steps, limit=bound.steps,
                              rows=rows, per_epoch=per_epoch, epochs=f"{cfg.num_train_epochs:g}", batch=per_step))
    tokens = steps * per_step * cfg.max_length
    if bound.tokens and tokens > bound.tokens:
        out.append(Problem.of("max_length", "problem.public_tokens", tokens=tokens, steps=steps, batch=per_step,
                              max_length=cfg.max_length, limit=bound.tokens))
    return out


def public_problems(cfg: _Visited) -> list["Problem"]:
    """What validation adds in public mode (an empty list outside it): every path field by its kind, no remote code,
    the step limit as far as it is known without reading the data."""
    from core.config.settings import Problem

    if not is_public():
        return []
    out = []
    if cfg.trust_remote_code:
        out.append(Problem.of("trust_remote_code", "problem.public_trust", why=Said("public.trust")))
    out += [p for name, kind in path_fields().items() if (p := path_problem(name, kind, getattr(cfg, name)))]
    out += python_scorer_problems(cfg)
    return out + plan_problems(cfg)


def python_scorer_problems(cfg: _Visited) -> list["Problem"]:
    """Public mode: a scorer in the user's own Python (core.scoring.scorers.user_function), held-out or GRPO's reward,
    refused by its field before Start, not first in the run's child where it would be bound."""
    from core.config.settings import REWARD_SCORERS, Problem, reward_spec

    uses = []
    if cfg.heldout_scorer == "python" and cfg.heldout_rows > 0:
        uses.append("heldout_scorer")
    if cfg.stage == "grpo":
        try:
            if any(name == "python" for name, _ in reward_spec(cfg.grpo_rewards)):
                uses.append("grpo_rewards")
        except ValueError:  # rewards that cannot be read: validate()'s own problem names them
            pass
    builtin = ", ".join(n for n in REWARD_SCORERS if n != "python")
    return [Problem.of(name, "problem.public_python", setting=name, scorers=builtin) for name in uses]


FOLDER_KINDS = ("run", "adapter", "merged", "push")  # what folder_refusal's `what` may name: a public.what.* key each


def folder_refusal(path: str | Path | None, what: str) -> Said | None:
    """Public mode: why `path` (a `what` of FOLDER_KINDS) may not be used here, or None. The places are said as the
    visitor sees them (`shown`): never the server's own paths."""
    if not (path and is_public()) or inside(path, public_root()):
        return None
    return Said("public.outside_runs", what=Said(f"public.what.{what}"), root=shown(str(public_root())),
                path=shown(str(path)))


def without_remote_code(cfg: M) -> tuple[M, bool]:
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
