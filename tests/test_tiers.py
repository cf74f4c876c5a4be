"""The two tiers (tests/tiers.py): how a test's category is found, and that the fast tier refuses a test that starts a
process or trains, in a pytest run of a small generated test file in a child process."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

from tests import tiers
from tests.helpers import Patience, load_factor

ROOT = Path(__file__).resolve().parent.parent


def test_a_browser_module_is_browser_whatever_it_starts_and_a_process_outranks_training():
    assert tiers.category_of(True, []) == "browser"
    assert tiers.category_of(True, [("subprocess", "chromium")]) == "browser"
    assert tiers.category_of(False, [("training", "t"), ("subprocess", "p")]) == "subprocess"
    assert tiers.category_of(False, [("training", "t")]) == "training"
    assert tiers.category_of(False, []) == "unit"
    assert tiers.in_browser_module(SimpleNamespace(path=Path("tests/test_browser_data.py")))
    assert not tiers.in_browser_module(SimpleNamespace(path=Path("tests/test_ui.py")))


def test_the_list_follows_what_passing_tests_did_and_a_failing_test_only_leaves_the_fast_tier(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("")
    listed = {"tests/test_a.py::now_unit": "training", "tests/test_a.py::failed_early": "subprocess",
              "tests/test_gone.py::t": "training", "tests/test_a.py::kept": "training"}
    ran = {"tests/test_a.py::now_unit": ("unit", True), "tests/test_a.py::failed_early": ("unit", False),
           "tests/test_a.py::new": ("subprocess", False), "tests/test_a.py::trains": ("training", True)}
    assert tiers.updated(listed, ran, tmp_path) == {
        "tests/test_a.py::failed_early": "subprocess", "tests/test_a.py::new": "subprocess",
        "tests/test_a.py::trains": "training", "tests/test_a.py::kept": "training"}
    path = tmp_path / "tiers.txt"
    tiers.write_list({"tests/test_a.py::x[a b]": "training"}, path)
    assert tiers.read_list(path) == {"tests/test_a.py::x[a b]": "training"}


def test_the_summary_names_every_category_with_its_cpu_seconds():
    lines = tiers.summary_lines({"unit": 12.4, "training": 30.0, "subprocess": 5.0, "browser": 100.6},
                                {"unit": 900, "training": 40, "subprocess": 60, "browser": 80}, 20.0)
    assert lines[0] == ("memtune: CPU seconds by category: unit 12 s (900 tests), training 30 s (40 tests), "
                        "subprocess 5 s (60 tests), browser 101 s (80 tests)")
    assert "168 CPU s in all" in lines[1]


def test_a_wait_is_stretched_by_the_load_per_core(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 0.0, 0.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert load_factor() == 4.0
    waiting = Patience(120)
    monkeypatch.setattr(waiting, "waited", lambda: 300.0)
    assert not waiting.over()  # 300 s of a 480 s bound at load 8 on 2 cores (a fixed 120 s failed here)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.0, 0.0))
    assert waiting.over() and load_factor() == 1.0  # an idle machine: never less than the idle bound


GENERATED = '''
import os
import subprocess

import pytest


def test_plain():
    assert sum([1, 2]) == 3


def test_starts_a_process():
    subprocess.run(["true"], check=True)


def test_forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0


def test_hides_the_refusal():
    try:
        subprocess.run(["true"], check=True)
    except Exception:
        pass


def test_trains():
    from transformers.trainer import Trainer

    Trainer().train()


@pytest.fixture(scope="session")
def started_once():
    return subprocess.run(["true"]).returncode


def test_first_user(started_once):
    assert started_once == 0


def test_second_user(started_once):
    assert started_once == 0
'''

# A stand-in for transformers' Trainer, imported only by the generated test (the real one takes seconds to import):
# tests/tiers.py wraps Trainer.train when transformers.trainer is first imported, whichever module that is.
FAKE_TRAINER = "class Trainer:\n    def train(self):\n        return 'trained'\n"


def run_pytest(tmp_path, *args: str, **env: str) -> tuple[int, str]:
    fake = tmp_path / "fake" / "transformers"
    if not fake.is_dir():
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text("")
        (fake / "trainer.py").write_text(FAKE_TRAINER)
        (tmp_path / "pytest.ini").write_text("[pytest]\n")
        (tmp_path / "test_gen.py").write_text(textwrap.dedent(GENERATED))
    outer = {k: v for k, v in os.environ.items() if k not in (tiers.RECORD_ENV, tiers.SUMMARY_ENV, "PYTEST_ADDOPTS")}
    env = dict(outer, PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), str(ROOT)]),
               MEMTUNE_TEST_TIERS=str(tmp_path / "tiers.txt"), **env)
    plugins = ["-p", "tests.tiers", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:hypothesispytest"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", *plugins, "test_gen.py", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_the_fast_tier_refuses_a_test_that_starts_a_process_or_trains_and_moves_it_out(tmp_path):
    code, said = run_pytest(tmp_path, "--fast")
    assert code == 1, said
    assert "test_gen.py::test_starts_a_process is in the fast tier but starts a process (subprocess true" in said
    assert "test_gen.py::test_trains is in the fast tier but trains (transformers.Trainer.train)" in said
    assert "FAILED test_gen.py::test_hides_the_refusal" in said  # caught as an Exception, and failed all the same
    assert "ERROR test_gen.py::test_first_user" in said and "ERROR test_gen.py::test_second_user" in said  # its fixture
    assert "test_gen.py::test_forks is in the fast tier but starts a process (os.fork" in said
    assert "1 passed" in said  # test_plain
    assert tiers.read_list(tmp_path / "tiers.txt") == {
        "test_gen.py::test_starts_a_process": "subprocess", "test_gen.py::test_hides_the_refusal": "subprocess",
        "test_gen.py::test_forks": "subprocess",
        "test_gen.py::test_trains": "training", "test_gen.py::test_first_user": "subprocess",
        "test_gen.py::test_second_user": "subprocess"}
    code, said = run_pytest(tmp_path, "-m", "fast")  # the same tier by its marker, now without them
    assert code == 0 and "1 passed, 6 deselected" in said, said


def test_the_full_suite_records_every_user_of_a_fixture_that_started_a_process_and_sums_cpu(tmp_path):
    summary = tmp_path / "summary.txt"
    code, said = run_pytest(tmp_path, MEMTUNE_TEST_RECORD="1", MEMTUNE_TEST_SUMMARY=str(summary))
    assert code == 0, said
    # the fixture's process started in the first user's setup; the second user shares it, so it is as slow to run alone
    assert tiers.read_list(tmp_path / "tiers.txt") == {
        "test_gen.py::test_starts_a_process": "subprocess", "test_gen.py::test_hides_the_refusal": "subprocess",
        "test_gen.py::test_forks": "subprocess", "test_gen.py::test_trains": "training",
        "test_gen.py::test_first_user": "subprocess", "test_gen.py::test_second_user": "subprocess"}
    lines = summary.read_text().splitlines()
    assert lines[0].startswith("memtune: CPU seconds by category: unit ") and "(1 tests)" in lines[0]
    assert "training " in lines[0] and "subprocess " in lines[0] and "(5 tests)" in lines[0]


def test_a_library_asking_ldconfig_for_itself_is_no_process_of_the_test():
    import ctypes.util

    before = len(tiers.STARTED)
    assert ctypes.util.find_library("m")  # runs `ldconfig -p` (or gcc) on Linux, for whichever test asks first
    assert tiers.STARTED[before:] == []
