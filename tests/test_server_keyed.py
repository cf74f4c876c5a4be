"""What the web server says and reads: the compile cache's and public mode's refusals carry a locale key (a pt page
says them in Portuguese), and the server finds the machine's GPUs through NVML without importing torch, with
CUDA_VISIBLE_DEVICES read as CUDA reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.i18n import STRINGS
from core.messages import Said, say
from core.nvml import Card, visible

ROOT = Path(__file__).resolve().parent.parent


def _said_everywhere(key: str, params: dict) -> str:
    """The Portuguese text of a keyed refusal, after checking its key (and every nested key) is in en/pt/fr."""
    assert all(key in STRINGS[lang] for lang in ("en", "pt", "fr")), key
    for value in params.values():
        if isinstance(value, dict) and "key" in value:
            _said_everywhere(value["key"], value.get("params") or {})
    from ui.render import said

    pt = said(key, params, "pt")
    assert pt != say(key, params, "en") and "{" not in pt
    return pt


# --- the compile cache's folder --------------------------------------------------------------------------------
def test_a_refused_compile_cache_folder_is_keyed(tmp_path, monkeypatch):
    from core.files import RefusedError
    from core.model import compile as compiling

    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    (tmp_path / "file").write_text("x")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    said = {}
    for path in (link, tmp_path / "file"):
        with pytest.raises(RefusedError) as caught:
            compiling._own_folder(path)
        said[caught.value.key] = _said_everywhere(caught.value.key, caught.value.params)
    monkeypatch.setattr(compiling.os, "getuid", lambda: os.lstat(theirs).st_uid + 1)  # as another user sees it
    with pytest.raises(RefusedError) as caught:
        compiling._own_folder(theirs)
    said[caught.value.key] = _said_everywhere(caught.value.key, caught.value.params)
    assert set(said) == {"files.refused.cache_link", "files.refused.cache_not_folder", "files.refused.cache_other_user"}
    assert "é um link" in said["files.refused.cache_link"] and "pertence a outro usuário" in said[
        "files.refused.cache_other_user"]


# --- public mode -------------------------------------------------------------------------------------------------
@pytest.fixture
def public(public_mode, monkeypatch, tmp_path):
    monkeypatch.setenv("MEMTUNE_HOME", str(tmp_path / "home"))
    return public_mode


def test_every_public_refusal_is_keyed_and_reads_in_portuguese(public, tmp_path):
    from core.config.settings import demo_config
    from core.runs.public import FOLDER_KINDS, dataset_problem, folder_refusal, model_path_problem, model_problem

    refusals = [dataset_problem("/etc/passwd"), dataset_problem("/etc/passwd", "eval_dataset"),
                model_path_problem(str(tmp_path)), model_problem(demo_config(trust_remote_code=True))]
    refusals += [folder_refusal(str(tmp_path / "elsewhere"), what) for what in FOLDER_KINDS]
    assert all(isinstance(r, Said) for r in refusals)
    texts = {r.key: _said_everywhere(r.key, r.params) for r in refusals}
    assert set(texts) == {"public.dataset_path", "public.data_path", "public.model_path", "public.trust",
                          "public.outside_runs"}
    assert "Neste servidor público, o adaptador precisa estar dentro de" in _said_everywhere(
        "public.outside_runs", folder_refusal(str(tmp_path), "adapter").params)
    assert folder_refusal(str(public / "mine"), "run") is None  # inside the app's folder: allowed


def test_a_pt_page_says_a_folder_outside_the_apps_runs_in_portuguese(public, tmp_path):
    from ui.notices import public_refusal

    text = public_refusal("pt", (str(public / "ok"), "run"), (str(tmp_path / "merged"), "merged"))
    assert text.startswith("Neste servidor público, a pasta do modelo mesclado precisa estar dentro de")
    assert public_refusal("en", (str(tmp_path), "run")).startswith("On this public server the run must be inside")
    assert public_refusal("pt", (str(public / "ok"), "run")) is None


# --- the GPUs, without torch ------------------------------------------------------------------------------------
A = Card("GPU-aaaa-1111", "NVIDIA H100 80GB HBM3", 80 * 2**30, (9, 0))
B = Card("GPU-aabb-2222", "NVIDIA H100 80GB HBM3", 80 * 2**30, (9, 0))
C = Card("GPU-cccc-3333", "Tesla T4", 15 * 2**30, (7, 5))
M = Card("MIG-dddd-4444", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10 * 2**30, (9, 0))


@pytest.mark.parametrize("value, seen", [
    (None, [A, B, C]),  # unset: every card
    ("", []),  # set but empty: none
    ("2,0", [C, A]),  # CUDA's order is the variable's
    ("1, 2", [B, C]),
    ("0,-1,2", [A]),  # -1 ends the list
    ("0,7,1", [A]),  # so does a card that does not exist
    ("1gpu,2", [B, C]),  # CUDA reads the leading digits
    ("0,0", []),  # a card named twice: none at all
    ("GPU-cccc", [C]),  # a UUID's unique prefix
    ("GPU-aa,GPU-cccc-3333", []),  # an ambiguous prefix ends the list at once
    ("GPU-cccc-3333,0", [C]),  # UUIDs and ordinals are not mixed: the ordinal ends it
    ("MIG-dddd-4444", [M]),  # a MIG instance, from the cards' MIG list
])
def test_cuda_visible_devices_as_cuda_reads_it(value, seen):
    assert visible([A, B, C], value, [M]) == seen


def test_a_card_computes_bf16_natively_from_ampere_on():
    assert A.bf16 and not C.bf16 and not Card("GPU-x", "unknown", 0).bf16


def _fresh(code: str, **env: str) -> str:
    """`code` run in a fresh interpreter (so sys.modules is its own), its last line of output."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={**os.environ, **env})
    return proc.stdout.strip().splitlines()[-1]


def test_the_servers_gpu_detection_never_imports_torch():
    """As on a machine with an NVIDIA driver (no_gpu_driver answers no) and CUDA_VISIBLE_DEVICES set: the server's
    Hardware, GPU count, validation and process plan come from NVML (absent here: no GPU), never from torch."""
    out = _fresh("import sys\n"
                 "from core.config import hardware\n"
                 "hardware.no_gpu_driver = lambda: False\n"
                 "from core.checks import validate\n"
                 "from core.config.settings import demo_config\n"
                 "from core.gpus.distributed import plan, visible_gpus\n"
                 "from core.nvml import cards\n"
                 "hw = hardware.Hardware.detect()\n"
                 "validate(demo_config())\n"
                 "print(hw.gpus, visible_gpus(), plan(demo_config()).processes_per_machine, len(cards()), "
                 "'torch' in sys.modules)", CUDA_VISIBLE_DEVICES="0")
    gpus, counted, processes, cards, imported_torch = out.split()
    assert imported_torch == "False"
    assert gpus == counted == cards and processes == "1" and int(cards) <= 1  # one card at most: "0" names one


# --- the browser tests' waits -----------------------------------------------------------------------------------
SCALES_ITSELF = {"wait_state", "wait_idle"}  # tests/browser_app.py's: given an idle machine's bound, they stretch it


def fixed_waits(source: str) -> list[int]:
    """Lines of `source` with a wait bound written as a number: a `timeout=` keyword, or set_default_timeout's or
    wait_for_timeout's argument, that does not go through tests.helpers' ms()/patient()."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        bounds = [k.value for k in node.keywords if k.arg == "timeout"] if name not in SCALES_ITSELF else []
        if name in ("set_default_timeout", "wait_for_timeout", "set_default_navigation_timeout"):
            bounds += node.args[:1]
        found += [node.lineno for value in bounds if isinstance(value, ast.Constant)]
    return found


def test_every_browser_wait_scales_with_the_machines_load():
    assert fixed_waits("pg.wait_for_selector('#x', timeout=30_000)\npg.wait_for_timeout(500)\n"
                       "pg.wait_for_selector('#x', timeout=ms(30))\nwait_state(pg, ['x'], timeout=60_000)") == [1, 2]
    fixed = {path.name: lines for path in sorted((ROOT / "tests").glob("test_browser*.py"))
             if (lines := fixed_waits(path.read_text(encoding="utf-8")))}
    assert fixed == {}
