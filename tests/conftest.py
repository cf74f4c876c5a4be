"""Shared test set-up: everything offline, the demo model cached once per session in a temporary folder."""

import gc
import os
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import patient

# Set before any test imports transformers/datasets/huggingface_hub: no test may reach the network.
_HOME = Path(tempfile.mkdtemp(prefix="memtune-test-home-"))
# A MEMTUNE_HOME given by the user is kept. One this file set in pytest-xdist's controller (MEMTUNE_TEST_HOME) is not:
# each worker gets its own, so no test sees another worker's runs, configs or half-built demo model.
if os.environ.get("MEMTUNE_HOME", os.environ.get("MEMTUNE_TEST_HOME")) == os.environ.get("MEMTUNE_TEST_HOME"):
    os.environ["MEMTUNE_HOME"] = os.environ["MEMTUNE_TEST_HOME"] = str(_HOME)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HOME"] = str(_HOME / "hf")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
# The command line speaks the terminal's language (LC_ALL > LC_MESSAGES > LANG): the suite's checks of its words are
# English's whatever the developer's terminal says; a test of another language sets the variables itself.
for _name in ("LC_ALL", "LC_MESSAGES"):
    os.environ.pop(_name, None)
os.environ["LANG"] = "C.UTF-8"

# The browser tests' app server and chromium: one per process for every browser module. Its fixtures (server, browser,
# page) reach every module as a pytest plugin, after the environment above is set (imported by pytest, not here first,
# so that its asserts are rewritten). tests/tiers.py: each test's category (unit, training, subprocess, browser), the
# fast tier (-m fast) and the CPU seconds per category.
pytest_plugins = ["tests.browser_app", "tests.tiers"]


def pytest_configure(config):
    """tests/run.sh runs the suite in pytest-xdist workers, one per core (up to 4). Each worker then trains with one
    torch thread, and so does every process it starts (OMP_NUM_THREADS), instead of each asking for every core."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        gc.disable()  # while the test modules import the libraries (the process that collects: pytest_collection_finish)
    if hasattr(config, "workerinput"):  # an xdist worker (not a pytest that a test starts, which inherits the env)
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


# Tests that must run in one worker, in file order: a module's tests that share a module-scoped fixture costing
# seconds (one build per module, not one per worker), and the browser modules (every tests/test_browser*.py), which
# share their worker's app server and chromium (tests/browser_app.py). Every other test is scheduled on its own
# (--dist loadgroup).
XDIST_GROUPS = {"test_infer": "infer", "test_export": "export", "test_gguf": "gguf", "test_history": "history",
                "test_safety": "safety", "test_data": "data", "test_ui": "ui"}
# The browser modules in three groups of about the same length, so that two workers each drive their own app server
# and chromium: test_browser (the page's main flows and their demo runs); test_browser_public (its own public and
# login servers: only chromium is shared); every other browser module (compare, children, data, layout, truth). Each
# test asks for what it needs (trained_run), so any group may run anywhere, after any other.
BROWSER_GROUPS = {"test_browser": "browser", "test_browser_public": "browser-public"}
BROWSER_REST = "browser-2"


def module_name(item) -> str:
    module = getattr(item, "module", None)
    return module.__name__.rpartition(".")[2] if module else ""


def xdist_group(item) -> str | None:
    name = module_name(item)
    if name.startswith("test_browser"):
        return BROWSER_GROUPS.get(name, BROWSER_REST)
    return XDIST_GROUPS.get(name)


def is_browser(item) -> bool:
    return item is not None and module_name(item).startswith("test_browser")


# In xdist workers the longest chains go first (tests/run.sh keeps this order: --no-loadscope-reorder): the browser
# groups first (one per worker, the third to whichever finishes first), then the long groups and slow multi-process
# tests, so that no worker starts one of them while the other has nothing left to do; the many short tests come last
# and even the load out.
FIRST = ("test_browser", "test_browser_public", "<browser>", "test_llama", "test_ui", "test_distributed", "test_child",
         "test_safety", "test_data", "test_codegen", "test_warm", "test_gguf", "test_infer")


def rank(item) -> int:
    name = module_name(item)
    if name in FIRST:
        return FIRST.index(name)
    return FIRST.index("<browser>") if is_browser(item) else len(FIRST)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks
def pytest_collection_modifyitems(config, items):
    # pytest.ini's timeout is for an idle machine: a loaded one gets it times its load (tests/helpers.py)
    timeout = config.getini("timeout")
    scaled = patient(float(timeout)) if timeout else None
    for item in items:
        group = xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
        if scaled and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(scaled))
    if hasattr(config, "workerinput"):  # every worker sorts alike: they must report the same collection
        items.sort(key=rank)  # stable: file order within a rank


_modules_at_freeze = [0]


def _freeze() -> None:
    gc.collect()
    gc.freeze()
    _modules_at_freeze[0] = len(sys.modules)


def pytest_collection_finish(session):
    """The libraries the test modules imported live as long as this process: into gc's permanent generation
    (core.files.long_lived, as the app and the CLI do), so that the tests' collections skip them."""
    _freeze()
    gc.enable()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Likewise after a test that imported more of them (a model family's modules, peft's tuners...): a full
    collection walks every unfrozen object (~0.4 s over a worker's ~600k), and each training run makes two."""
    if len(sys.modules) > _modules_at_freeze[0] + 50:
        _freeze()


@pytest.hookimpl(trylast=True)  # after the test's own fixtures (its page) are torn down
def pytest_runtest_teardown(item, nextitem):
    """The last of a run of browser tests (of one group or, in one process, of all) stops the app server and chromium."""
    if is_browser(item) and not is_browser(nextitem):
        from tests.browser_app import SHARED

        SHARED.close()


def pytest_unconfigure(config):
    """This process's test home goes with it (each suite run left ~1.5 MB per process in the temporary folder)."""
    import shutil

    shutil.rmtree(_HOME, ignore_errors=True)


def pytest_sessionfinish(session):
    """A session cut short (Ctrl-C, -x) still stops the app server and chromium; a normal one has already."""
    from tests.browser_app import SHARED

    SHARED.close()


@pytest.fixture(scope="session")
def demo_model_path() -> Path:
    from core.demo import ensure_demo_model

    return ensure_demo_model()


@pytest.fixture(scope="session")
def demo_tokenizer(demo_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model_path)


class FinishedRun:
    """A short real demo run: its config, RunResult, events, and the model before and after training."""

    def __init__(self, cfg, result, events, before, model):
        self.cfg, self.result, self.events, self.before, self.model = cfg, result, events, before, model
        self.out = Path(cfg.output_dir)

    @property
    def losses(self):
        return [e["loss"] for e in self.events if e["kind"] == "metrics"]


def snapshot(model) -> dict:
    """Every parameter by name, copied (4-bit weights as their packed bytes), with whether it trains."""
    return {name: (p.detach().clone(), p.requires_grad) for name, p in model.named_parameters()}


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, demo_model_path) -> FinishedRun:
    """ONE real demo run (20 steps, a loss every step, checkpoints at 10 and 20) shared by every test that only
    needs "a finished run". Tests must not write into its folder: copy it first."""
    from transformers import TrainerCallback

    from core.config.settings import demo_config
    from core.train.recipe import run_training

    class Keep(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            self.before = snapshot(model)

        def on_train_end(self, args, state, control, model=None, **kw):
            self.model = model

    keep, events = Keep(), []
    cfg = demo_config(output_dir=str(tmp_path_factory.mktemp("finished")), run_name="finished", max_steps=20,
                      logging_steps=1, save_strategy="steps", save_steps=10)
    result = run_training(cfg, events.append, callbacks=[keep])
    assert result.status == "completed", result.message
    return FinishedRun(cfg, result, events, keep.before, keep.model)


@pytest.fixture
def public_mode(monkeypatch, tmp_path) -> Path:
    """Public mode (a Space) with the app's runs folder in tmp_path; returns that folder."""
    root = tmp_path / "app-runs"
    root.mkdir()
    monkeypatch.setenv("MEMTUNE_PUBLIC", "1")
    monkeypatch.setenv("MEMTUNE_PUBLIC_RUNS", str(root))
    return root
