"""The version locks: requirements.lock (what the app runs with) and requirements-dev.lock (what the tests add).

requirements*.txt keep the ranges a library user needs; the locks name the exact versions the whole suite passed
with, and scripts/install.sh installs through them (`pip install -c requirements.lock -c requirements-dev.lock`).
One lock serves every platform: torch is pinned by version only (`torch==2.13.0` takes the CPU wheel from the CPU
index and the CUDA one from PyPI), and the packages that differ by platform (nvidia-*, triton, cuda-*) are left
out, because each torch wheel pins its own exactly.

    python scripts/lockfile.py freeze requirements.lock            # what this interpreter has installed
    python scripts/lockfile.py freeze requirements-dev.lock --minus requirements.lock
    python scripts/lockfile.py check                               # installed == locked (exit 1 and the list if not)

scripts/lock.sh refreshes both files to the newest releases and keeps them only if the suite passes.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKS = (ROOT / "requirements.lock", ROOT / "requirements-dev.lock")
# pinned by the torch wheel itself, per platform (the CUDA build's libraries; the CPU build has none)
PLATFORM_OWN = re.compile(r"^(nvidia-(?!ml-py$).*|triton|cuda-.*|pytorch-triton.*)$")  # nvidia-ml-py is ours
# the installer's own tools: never part of what memtune runs
TOOLS = {"pip", "setuptools", "wheel"}
HEADER = ("# Exact versions the whole suite passed with ({what}). Written by scripts/lock.sh; do not edit by hand.\n"
          "# scripts/install.sh installs through it: pip install -c requirements.lock -c requirements-dev.lock ...\n")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    """`2.13.0+cpu` -> `2.13.0`: the local label names the wheel's build, not the release."""
    return version.split("+", 1)[0]


def read(path: Path) -> dict[str, str]:
    """name -> version of a lock file's `name==version` lines."""
    pins: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonical(name)] = version.strip()
    return pins


def installed() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            # the first on sys.path is what an import gets (setuptools' vendored copies join sys.path later)
            found.setdefault(canonical(name), public(dist.version))
    return found


def freeze(path: Path, minus: list[Path], what: str) -> int:
    skip: set[str] = set(TOOLS)
    for other in minus:
        skip |= set(read(other))
    pins = {n: v for n, v in installed().items() if n not in skip and not PLATFORM_OWN.match(n)}
    body = "".join(f"{name}=={pins[name]}\n" for name in sorted(pins))
    path.write_text(HEADER.format(what=what) + body, encoding="utf-8")
    return len(pins)


def differences(locks: tuple[Path, ...] = LOCKS) -> list[str]:
    """Every locked package that is missing here or installed at another version."""
    have = installed()
    out = []
    for lock in locks:
        for name, version in read(lock).items():
            if have.get(name) != version:
                out.append(f"{name}: locked {version}, installed {have.get(name, 'nothing')} ({lock.name})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("freeze", help="write a lock of what this interpreter has installed")
    f.add_argument("path", type=Path)
    f.add_argument("--minus", type=Path, action="append", default=[], help="leave out what this lock holds")
    sub.add_parser("check", help="exit 1 unless every locked package is installed at its locked version")
    args = parser.parse_args(argv)
    if args.command == "freeze":
        what = "the app" if not args.minus else "what the tests add to " + ", ".join(p.name for p in args.minus)
        count = freeze(args.path, args.minus, what)
        print(f"memtune: {args.path.name}: {count} packages")
        return 0
    problems = differences()
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
