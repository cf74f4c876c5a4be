"""Ollama's own Modelfile parser and TEMPLATE semantics for the Modelfile tests: tests/go (Ollama's parser/parser.go
and template/template.go, copied) built once per test session with Debian's Go, then run once per Modelfile.

Missing Go skips the tests with the command that installs it, unless MEMTUNE_REQUIRE_GO=1 (CI): then they fail,
so CI cannot pass by skipping.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "go"
REQUIRED = os.environ.get("MEMTUNE_REQUIRE_GO") == "1"
# Go builds offline: the program uses the standard library only
GO_ENV = dict(GOTOOLCHAIN="local", GOPROXY="off", GOFLAGS="-mod=mod", CGO_ENABLED="0")


def require() -> None:
    """Skip (or fail, with MEMTUNE_REQUIRE_GO=1) when Go is not installed."""
    if shutil.which("go") is not None:
        return
    why = "Go is not installed (Debian/Ubuntu: sudo apt-get install golang-go)"
    if REQUIRED:
        pytest.fail(f"MEMTUNE_REQUIRE_GO=1 but {why}", pytrace=False)
    pytest.skip(f"Ollama template tests skipped: {why}; set MEMTUNE_REQUIRE_GO=1 to make this a failure")


@functools.lru_cache(maxsize=1)
def _binary() -> str:
    out = Path(tempfile.mkdtemp(prefix="memtune-ollama-go-")) / "ollama-template"
    env = dict(os.environ, **GO_ENV)
    env.setdefault("GOCACHE", str(out.parent / "cache"))
    proc = subprocess.run(["go", "build", "-o", str(out), "."], cwd=HERE, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(out)


def render(modelfile: str | Path, conversations: list[list[dict[str, str]]]) -> dict:
    """Ollama reading `modelfile` and rendering its TEMPLATE for each conversation:
    {"commands": [[name, args]...], "template": str, "renders": [{"text": ...} or {"error": ...}]}, or
    {"parse_error": ...} / {"template_error": ...} when Ollama would refuse the file at `ollama create`."""
    require()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"modelfile": str(modelfile), "conversations": conversations}, fh)
    try:
        proc = subprocess.run([_binary(), fh.name], capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(fh.name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def texts(result: dict) -> list[str | None]:
    """Each conversation's rendered text (None where rendering failed)."""
    return [r.get("text") for r in result["renders"]]


def render_template(template: str, conversations: list[list[dict[str, str]]]) -> list[str | None]:
    """`template` as a Modelfile's TEMPLATE, rendered by Ollama for each conversation (None where it fails)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "Modelfile"
        path.write_text(f'FROM ./model.gguf\nTEMPLATE """{template}"""\n', encoding="utf-8")
        result = render(path, conversations)
    assert "parse_error" not in result and "template_error" not in result, result
    return texts(result)
