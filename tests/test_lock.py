"""The version locks (requirements.lock, requirements-dev.lock; scripts/lockfile.py): the suite runs on exactly the
versions they name, they satisfy requirements*.txt's ranges, and a Space installs them too."""

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from scripts import lockfile

ROOT = Path(__file__).resolve().parent.parent


def ranges(path: Path) -> list[Requirement]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.append(Requirement(line))
    return out


def test_this_suite_runs_on_the_locked_versions():
    # CI and a newcomer install through scripts/install.sh, which installs the locks: a difference here means a
    # package moved without scripts/lock.sh (which writes the locks first, then runs this suite on them)
    assert lockfile.differences() == [], "run `bash scripts/install.sh requirements-dev.txt` (or scripts/lock.sh)"


@pytest.mark.parametrize("reqs, lock", [("requirements.txt", "requirements.lock"),
                                        ("requirements-dev.txt", "requirements-dev.lock")])
def test_each_lock_pins_every_requirement_inside_its_range(reqs, lock):
    pins = lockfile.read(ROOT / lock)
    for req in ranges(ROOT / reqs):
        version = pins.get(lockfile.canonical(req.name))
        assert version is not None, f"{req.name} ({reqs}) has no pin in {lock}"
        assert req.specifier.contains(version, prereleases=True), f"{lock}: {req.name}=={version} is outside {req}"


def test_the_locks_leave_the_platform_builds_to_torch_and_name_each_package_once():
    runtime, dev = (lockfile.read(path) for path in lockfile.LOCKS)
    assert not set(runtime) & set(dev)
    assert "torch" in runtime and "+" not in runtime["torch"]  # the CPU and the CUDA wheel share the release
    assert not [n for n in {**runtime, **dev} if lockfile.PLATFORM_OWN.match(n)]


def test_a_space_installs_the_locked_versions():
    # a Space installs pre-requirements.txt before requirements.txt, and gradio at README's sdk_version
    assert "-r requirements.lock" in (ROOT / "pre-requirements.txt").read_text(encoding="utf-8").splitlines()
    sdk = re.search(r"^sdk_version: (\S+)$", (ROOT / "README.md").read_text(encoding="utf-8"), re.M).group(1)
    assert lockfile.read(ROOT / "requirements.lock")["gradio"] == sdk


def test_a_lock_is_written_from_what_is_installed_without_the_platform_builds(tmp_path):
    runtime = tmp_path / "runtime.lock"
    runtime.write_text("torch==2.13.0\n", encoding="utf-8")
    out = tmp_path / "out.lock"
    lockfile.freeze(out, [runtime], "a test")
    pins = lockfile.read(out)
    assert "torch" not in pins and "pip" not in pins  # left to the other lock, and the installer's own
    assert pins["pytest"] == lockfile.installed()["pytest"]
