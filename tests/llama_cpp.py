"""The real llama.cpp for the GGUF tests: node-llama-cpp's prebuilt CPU binaries (tests/llama/package.json pins
them; tests/run.sh installs them with `npm ci`, never downloading or compiling llama.cpp), driven by
tests/llama/harness.mjs, one node process per call.

Missing node or packages skip the tests with the command that installs them, unless MEMTUNE_REQUIRE_LLAMA=1 (CI):
then they fail, so CI cannot pass by skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "llama"
REQUIRED = os.environ.get("MEMTUNE_REQUIRE_LLAMA") == "1"
INSTALL = "cd tests/llama && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --omit=optional"


def missing() -> str | None:
    """Why llama.cpp cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed (Debian/Ubuntu: sudo apt-get install nodejs npm; then bash tests/run.sh)"
    if not (HERE / "node_modules" / "node-llama-cpp" / "package.json").is_file():
        return f"the npm packages are not installed (run: {INSTALL})"
    return None


def require() -> None:
    """Skip (or fail, with MEMTUNE_REQUIRE_LLAMA=1) when llama.cpp cannot run."""
    why = missing()
    if why is None:
        return
    if REQUIRED:
        pytest.fail(f"MEMTUNE_REQUIRE_LLAMA=1 but {why}", pytrace=False)
    pytest.skip(f"llama.cpp round trip skipped: {why}; set MEMTUNE_REQUIRE_LLAMA=1 to make this a failure")


def run(requests: list[dict]) -> dict:
    """Answer the requests (see harness.mjs) in ONE node process: {"llama_cpp": release, "answers": [...]}."""
    require()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(requests, fh)
    try:
        proc = subprocess.run(["node", str(HERE / "harness.mjs"), fh.name], cwd=HERE, capture_output=True,
                              text=True, timeout=300, env=dict(os.environ, NODE_LLAMA_CPP_SKIP_DOWNLOAD="true"))
    finally:
        os.unlink(fh.name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)
