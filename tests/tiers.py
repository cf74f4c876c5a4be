"""The suite's two tiers and what each test costs (a pytest plugin: tests/conftest.py loads it).

Every test falls in one category, found at run time rather than by a marker someone must remember:
- browser: its module is tests/test_browser*.py;
- subprocess: it starts a process (subprocess, fork, posix_spawn, multiprocessing and the warm fork server's
  children), in its own body or in a fixture it uses, however long that fixture is kept;
- training: it runs a Trainer (transformers.Trainer.train, which run_training and TRL's trainers call);
- unit: none of these.

The fast tier is every unit test not marked slow: `python -m pytest -m fast` (tests/run.sh --fast). A test knows its
category only once it has run, so the categories of the others are kept in tests/tiers.txt, which a run through
tests/run.sh (full or fast) rewrites from what its tests did: a new test that starts a process lands there after
the first full run. In a fast run, a test that starts a process or trains fails, naming what it started, and is
moved to tests/tiers.txt at once, so that the fast tier stays free of them.

Each test's CPU seconds (this process and the children it waited for, over setup, call and teardown) travel with its
teardown report to the process that prints the summary (xdist's controller); MEMTUNE_TEST_SUMMARY names the file
that gets the per-category totals (tests/run.sh prints it). Not counted: processes the test process never reaps,
such as a fork server's children (the warm start's, whose server outlives the test) and orphans init reaps.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import multiprocessing.process
import multiprocessing.util
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LIST_ENV = "MEMTUNE_TEST_TIERS"  # another list than tests/tiers.txt (tests/test_tiers.py's own runs)
CATEGORIES = ("unit", "training", "subprocess", "browser")
SLOW = ("training", "subprocess")  # the categories tests/tiers.txt keeps (browser goes by module name)
RECORD_ENV = "MEMTUNE_TEST_RECORD"  # "1": this run rewrites tests/tiers.txt (tests/run.sh sets it)
SUMMARY_ENV = "MEMTUNE_TEST_SUMMARY"

# What every test process has started so far, in order: ("subprocess" | "training", what). A test's (or a fixture's)
# share is the slice added while it ran.
STARTED: list[tuple[str, str]] = []

# The fast-tier test running now, if any: what it starts is stopped before it starts (the test fails at once,
# instead of after paying for it), and code that catches Exception cannot hide it (pytest's Failed is not one).
ENFORCING: list[str] = []


# Processes a library starts for itself, once per interpreter, for whichever test first needs them: ctypes'
# find_library asks ldconfig (or gcc), multiprocessing starts its resource tracker with its first lock (tqdm's). They
# cost milliseconds, and counting them would put one test or another out of the fast tier by the order they ran in.
LIBRARY_OWN = (os.path.join("ctypes", "util.py"), os.path.join("multiprocessing", "resource_tracker.py"))


def library_own() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(LIBRARY_OWN):
            return True
        frame = frame.f_back
    return False


def _note(kind: str, what: str) -> None:
    if kind == "subprocess" and library_own():
        return
    STARTED.append((kind, what))
    if ENFORCING:
        pytest.fail(refusal(ENFORCING[0], kind, what), pytrace=False)


def refusal(nodeid: str, cat: str, what: str) -> str:
    does = "trains" if cat == "training" else "starts a process"
    return (f"{nodeid} is in the fast tier but {does} ({what}), itself or in a fixture. The fast tier runs none: "
            f"this run moves it to tests/tiers.txt ({cat}), so that only the full suite runs it (commit the change).")


def _short(what) -> str:
    text = " ".join(map(str, what)) if isinstance(what, (list, tuple)) else str(what)
    return text if len(text) <= 120 else text[:117] + "..."


def _wrap(owner, name: str, kind: str, what) -> None:
    """owner.name, noting `what` (or what(*its arguments)) each time it is called."""
    original = getattr(owner, name)
    if getattr(original, "_memtune_noted", False):
        return

    @functools.wraps(original)
    def noted(*args, **kwargs):
        _note(kind, what(*args) if callable(what) else what)
        return original(*args, **kwargs)

    noted._memtune_noted = True
    setattr(owner, name, noted)


class _NoteTrainer(importlib.abc.MetaPathFinder):
    """Wraps transformers.Trainer.train when transformers.trainer is first imported, whenever that is."""

    def find_spec(self, name, path, target=None):
        if name != "transformers.trainer":
            return None
        sys.meta_path.remove(self)  # find the real module's spec without coming back here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _wrap(module.Trainer, "train", "training", "transformers.Trainer.train")

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Record every process this interpreter starts and every Trainer it runs (once per process)."""
    if getattr(install, "done", False):
        return
    install.done = True
    # The functions that start a process, not sys.addaudithook: a Python audit hook runs on every audited event,
    # inside torch.compile'd code too, where dynamo compiles the hook's own frame (a test that counts compiles sees
    # one more). subprocess (asyncio's too) starts its children in _execute_child; os.spawn* fork.
    _wrap(subprocess.Popen, "_execute_child", "subprocess", lambda popen, args, *_: f"subprocess {_short(args)}")
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            _wrap(os, name, "subprocess", lambda *args, name=name: f"os.{name} {_short(args[:2])}")
    # multiprocessing's forkserver (the warm start's) forks at a socket's request: its Process.start is the start
    _wrap(multiprocessing.process.BaseProcess, "start", "subprocess", "multiprocessing Process.start")
    _wrap(multiprocessing.util, "spawnv_passfds", "subprocess", lambda path, argv, *_: f"{_short(argv)}")
    trainer = sys.modules.get("transformers.trainer")
    if trainer is not None:
        _wrap(trainer.Trainer, "train", "training", "transformers.Trainer.train")
    else:
        sys.meta_path.insert(0, _NoteTrainer())


def cpu_seconds() -> float:
    """User + system CPU of this process and of the children it has waited for."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def category_of(browser: bool, started: list[tuple[str, str]]) -> str:
    """The category of a test that is (or is not) in a browser module and started what `started` lists."""
    if browser:
        return "browser"
    kinds = {kind for kind, _ in started}
    return "subprocess" if "subprocess" in kinds else "training" if "training" in kinds else "unit"


def list_path() -> Path:
    return Path(os.environ.get(LIST_ENV) or HERE / "tiers.txt")


def read_list(path: Path) -> dict[str, str]:
    """tests/tiers.txt: {test id: category} for the tests that start a process or train."""
    found = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                cat, _, nodeid = line.partition(" ")
                found[nodeid.strip()] = cat
    return found


HEADER = ("# Tests that start a process or train, found at run time (tests/tiers.py); tests/run.sh rewrites it.\n"
          "# The fast tier (bash tests/run.sh --fast) leaves them out, and the tests/test_browser*.py modules.\n")


def write_list(entries: dict[str, str], path: Path) -> None:
    text = HEADER + "".join(f"{entries[n]} {n}\n" for n in sorted(entries))
    if not path.is_file() or path.read_text() != text:  # unchanged: left alone
        path.write_text(text)


def updated(entries: dict[str, str], ran: dict[str, tuple[str, bool]], root: Path) -> dict[str, str]:
    """The list after a run: a test that passed is where it now belongs; one that failed can only move out of the
    fast tier (it may have failed before it reached its process); one whose file is gone leaves the list."""
    out = dict(entries)
    for nodeid, (cat, passed) in ran.items():
        if cat in SLOW:
            if passed or CATEGORIES.index(cat) > CATEGORIES.index(out.get(nodeid, "unit")):
                out[nodeid] = cat
        elif passed:
            out.pop(nodeid, None)
    return {n: c for n, c in out.items() if (root / n.partition("::")[0]).is_file()}


def summary_lines(cpu: dict[str, float], counts: dict[str, int], overhead: float | None) -> list[str]:
    total = sum(cpu.values()) + (overhead or 0.0)
    parts = ", ".join(f"{c} {cpu.get(c, 0.0):.0f} s ({counts.get(c, 0)} tests)" for c in CATEGORIES)
    lines = [f"memtune: CPU seconds by category: {parts}"]
    if overhead is not None:
        lines.append(f"memtune: plus {overhead:.0f} CPU s starting the test processes and collecting; "
                     f"{total:.0f} CPU s in all")
    return lines


# --- the plugin ---------------------------------------------------------------------------------------------------

_BEGIN = pytest.StashKey[tuple[int, float]]()  # where STARTED stood, and the CPU seconds, when the test began
_SKIPPED = pytest.StashKey[bool]()
_FAILED = pytest.StashKey[bool]()
_FIXTURES: dict[object, list[tuple[str, str]]] = {}  # fixture definition -> what its setup started


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="the fast tier: unit tests only (no process, browser or training), enforced at run time")


def is_fast_run(config) -> bool:
    return config.getoption("fast") or (config.getoption("markexpr") or "").strip() == "fast"


def pytest_configure(config):
    if config.getoption("fast"):
        config.option.markexpr = "fast"
    install()


class Tally:
    """The summing process's view of the run: CPU seconds and tests per category, and the tests that ran."""

    def __init__(self):
        self.cpu = dict.fromkeys(CATEGORIES, 0.0)
        self.counts = dict.fromkeys(CATEGORIES, 0)
        self.ran: dict[str, tuple[str, bool]] = {}
        self.worker_cpu: float | None = None  # xdist: the workers' own totals, added as each ends


TALLY: list[Tally] = []  # one in the summing process from session start; none in an xdist worker


def in_browser_module(item) -> bool:
    return Path(str(item.path)).name.startswith("test_browser")


def known_category(item, listed: dict[str, str]) -> str:
    return "browser" if in_browser_module(item) else listed.get(item.nodeid, "unit")


@pytest.hookimpl(tryfirst=True)  # before pytest's own `-m` deselects by the markers
def pytest_collection_modifyitems(config, items):
    listed = read_list(list_path())
    for item in items:
        if known_category(item, listed) == "unit" and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.fast)


def fixture_started(item) -> list[tuple[str, str]]:
    """What the fixtures this test uses started when they were set up (in this process, by whichever test)."""
    found = []
    for defs in item._fixtureinfo.name2fixturedefs.values():
        for fixturedef in defs:
            found.extend(_FIXTURES.get(fixturedef, ()))
    return found


def started_by(item) -> list[tuple[str, str]]:
    return STARTED[item.stash[_BEGIN][0]:] + fixture_started(item)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    begin = len(STARTED)
    try:
        return (yield)
    finally:
        if len(STARTED) > begin:
            _FIXTURES.setdefault(fixturedef, []).extend(STARTED[begin:])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_BEGIN] = (len(STARTED), cpu_seconds())
    if is_fast_run(item.config) and item.get_closest_marker("fast") is not None:
        ENFORCING[:] = [item.nodeid]
    try:
        return (yield)
    finally:
        ENFORCING.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped:
        item.stash[_SKIPPED] = True
    if report.failed:
        item.stash[_FAILED] = True
    cat = category_of(in_browser_module(item), started_by(item))
    if (is_fast_run(item.config) and cat != "unit" and report.passed and not item.stash.get(_FAILED, False)
            and item.get_closest_marker("fast") is not None):  # started, though refused: caught and let go?
        item.stash[_FAILED] = True
        what = next(w for k, w in started_by(item) if k == cat)
        report.outcome = "failed"
        report.longrepr = refusal(item.nodeid, cat, what)
    if call.when == "teardown":
        begin_cpu = item.stash[_BEGIN][1]
        report.user_properties.append(("memtune_category", cat))
        report.user_properties.append(("memtune_cpu", cpu_seconds() - begin_cpu))
        report.user_properties.append(("memtune_ran", not item.stash.get(_SKIPPED, False)))
        report.user_properties.append(("memtune_passed", not item.stash.get(_FAILED, False)))
    return report


def pytest_runtest_logreport(report):
    """In the summing process (the only one, or xdist's controller): each test's category and CPU."""
    props = dict(report.user_properties) if report.when == "teardown" else {}
    if not TALLY or "memtune_category" not in props:
        return
    tally, cat = TALLY[0], props["memtune_category"]
    tally.cpu[cat] += props["memtune_cpu"]
    tally.counts[cat] += 1
    if props["memtune_ran"]:
        tally.ran[report.nodeid] = (cat, props["memtune_passed"])


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):
        TALLY[:] = [Tally()]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: a worker's own CPU total, to tell what its start and collection cost."""
    total = getattr(node, "workeroutput", {}).get("memtune_cpu")
    if TALLY and total is not None:
        TALLY[0].worker_cpu = (TALLY[0].worker_cpu or 0.0) + total


def pytest_sessionfinish(session):
    config = session.config
    if hasattr(config, "workerinput"):
        config.workeroutput["memtune_cpu"] = cpu_seconds()
        return
    if not TALLY:
        return
    tally = TALLY.pop()
    if os.environ.get(RECORD_ENV) == "1" or is_fast_run(config):
        write_list(updated(read_list(list_path()), tally.ran, config.rootpath), list_path())
    out = os.environ.get(SUMMARY_ENV)
    if out:
        if tally.worker_cpu is None:  # one process: its own total holds the tests
            everything = cpu_seconds()
        else:  # the controller's own, and each worker's (the controller may not have reaped them yet)
            me = resource.getrusage(resource.RUSAGE_SELF)
            everything = me.ru_utime + me.ru_stime + tally.worker_cpu
        overhead = max(0.0, everything - sum(tally.cpu.values()))
        Path(out).write_text("\n".join(summary_lines(tally.cpu, tally.counts, overhead)) + "\n")
