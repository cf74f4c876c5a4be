"""Every destructive entry point against every path spelling: the victim folder stays byte-for-byte intact.

The spellings (core.files.target must resolve each one exactly as the OS acts on it): a missing folder followed by
`..`, a symlink, a symlink to `missing/..`, a chain of symlinks, a file where a folder is expected, a trailing `/`
and `/.`, and a relative path taken from another working folder. The entry points: the export CLI (gguf, merge,
zip with --out, with and without --replace, in this process: a fresh one costs seconds of imports), History
Delete and Resume, resume_from, the Export tab's Merge and GGUF handlers called as functions, and the default
outputs of merge and GGUF with RUN/merged or RUN/gguf planted as a link.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.config.settings import demo_config
from core.export.cli import main as export_main
from core.runs.history import HistoryError, delete_run, list_runs, resume_config
from core.runs.folders import resume_problem
from tests.helpers import tree_hash

ROOT = Path(__file__).resolve().parents[1]




def make_victim(base: Path) -> Path:
    """Somebody's project that looks like a run, down to an events.jsonl naming it (the dropped legacy rule)."""
    v = base / "victim"
    (v / "src").mkdir(parents=True)
    (v / "NOTES.md").write_text("my notes\n")
    (v / "src" / "main.py").write_text("print('mine')\n")
    (v / "checkpoint-1").mkdir()  # looks like a half-written checkpoint to a tidy that follows a planted link
    (v / "checkpoint-1" / "results.txt").write_text("mine too\n")
    (v / "config.yaml").write_text("model: mine\n")
    (v / "events.jsonl").write_text(f'{{"kind": "run", "run_dir": "{v}", "config": {{}}}}\n')
    return v


def spellings(base: Path, v: Path) -> dict[str, str]:
    """name -> a path that names the victim (or a file in it), links created under base."""
    (base / "link").symlink_to(v)
    (base / "link_missing").symlink_to(f"{base}/nothere/../victim")
    (base / "chain3").symlink_to(f"{base}/nothere/../victim")
    (base / "chain2").symlink_to("chain3")
    (base / "chain1").symlink_to(base / "chain2")
    return {"missing/..": f"{base}/nothere/../victim", "symlink": str(base / "link"),
            "symlink to missing/..": str(base / "link_missing"), "symlink chain": str(base / "chain1"),
            "file": str(v / "NOTES.md"), "trailing /": f"{v}/", "trailing /.": f"{v}/.",
            "relative": "../nothere/../victim"}


@pytest.fixture(scope="module")
def run(tmp_path_factory, demo_model_path):
    """A real demo run with an adapter and a checkpoint (copied per test: tests plant links in their copy)."""
    from tests.helpers import checkpointed_run

    return Path(checkpointed_run(tmp_path_factory.mktemp("runs"), "ok", max_steps=2, save_steps=2).run_dir)


@pytest.fixture
def place(tmp_path, run, monkeypatch):
    """(base, victim, spellings, a copy of the run) with the working folder set to base/elsewhere."""
    base = tmp_path / "base"
    base.mkdir()
    v = make_victim(base)
    names = spellings(base, v)
    mine = shutil.copytree(run, tmp_path / "runs" / "ok", symlinks=True)
    (base / "elsewhere").mkdir()
    monkeypatch.chdir(base / "elsewhere")  # "relative" is taken from here
    return base, v, names, Path(mine)


def cli(*argv: str) -> int:
    return export_main(list(argv))


def explicit_entry_points(adapter: Path, root: Path):
    """name -> f(path): each destructive action pointed at `path`."""
    from ui.state import AppState
    from ui.tryexport import TryExportTab, on_merge  # (ui.gguf's on_gguf_export takes no path: see the planted-link test)

    x = TryExportTab(*(object() for _ in range(9)), app=AppState())  # the merge runs in this manager's child

    def try_delete(p):
        with pytest.raises(HistoryError):
            delete_run(p, root, is_running=lambda _: False)

    def try_resume(p):
        assert resume_problem(p) is not None
        with pytest.raises(HistoryError):
            resume_config(p)

    def try_train_resume(p):
        from core.train.recipe import run_training

        result = run_training(demo_config(resume_from=p, max_steps=3))
        assert result.status == "failed" and result.error_type == "config"

    return {
        "cli gguf --out": lambda p: cli("gguf", str(adapter), "--formats", "f16", "--out", p),
        "cli gguf --out --replace": lambda p: cli("gguf", str(adapter), "--formats", "f16", "--out", p, "--replace"),
        "cli merge --out": lambda p: cli("merge", str(adapter), "--out", p),
        "cli merge --out --replace": lambda p: cli("merge", str(adapter), "--out", p, "--replace"),
        "cli zip --out": lambda p: cli("zip", str(adapter), "--out", p),
        "ui merge": lambda p: on_merge(x, "en", str(adapter), p, True, True, progress=None),
        "history delete": try_delete,
        "history resume": try_resume,
        "resume_from": try_train_resume,
    }


def test_every_destructive_entry_point_against_every_spelling(place, capsys):
    base, v, names, mine = place
    before = tree_hash(v)
    zips = {}
    for entry, act in explicit_entry_points(mine / "adapter", base).items():
        for spelling, path in names.items():
            result = act(path)
            out = capsys.readouterr()
            if entry.startswith("cli") and not (entry == "cli zip --out" and spelling != "file"):
                assert result == 2, (entry, spelling, result, out.out)
                assert "error:" in out.err and "Traceback" not in out.err, (entry, spelling, out.err)
            elif entry == "ui merge":
                assert "merge-note" in result and str(v) in result, (entry, spelling, result)
            if entry == "cli zip --out":  # a zip is a new file in the folder asked for: nothing in it is replaced
                zips[spelling] = sorted(p.name for p in v.iterdir() if p.suffix == ".zip")
                for z in v.glob("*.zip"):
                    z.unlink()
            assert tree_hash(v) == before, f"{entry} against {spelling!r} ({path}) changed the victim"
    assert zips["missing/.."] == ["ok-adapter.zip"] and zips["file"] == []  # zip into victim = victim, not a file


def test_cli_out_existing_file_says_so(place, capsys):
    base, v, names, mine = place
    for command in ("gguf", "zip", "merge"):
        code = cli(command, str(mine / "adapter"), "--out", str(v / "NOTES.md"))
        err = capsys.readouterr().err
        assert code == 2 and "is a file, not a folder" in err and "Traceback" not in err, (command, err)


@pytest.mark.parametrize("where", ["merged", "gguf", "adapter", "checkpoints"])
def test_a_link_planted_in_the_run_folder_is_refused(place, capsys, where):
    """RUN/merged, RUN/gguf (default outputs), RUN/adapter or RUN/checkpoints planted as a link to each victim
    spelling: refused, and the start-up tidy does not delete through it."""
    from ui.gguf import on_gguf_export
    from ui.state import AppState
    from ui.tryexport import TryExportTab, on_merge

    x = TryExportTab(*(object() for _ in range(9)), app=AppState())  # merge and export run in this manager's children

    base, v, names, mine = place
    before = tree_hash(v)
    adapter, link = mine / "adapter", mine / where
    if where in ("adapter", "checkpoints"):  # what a resumed run or a tidy writes: a link in place of the real one
        moved = Path(shutil.move(link, mine.parent / f"kept-{where}"))
        adapter = moved if where == "adapter" else adapter
    for spelling in ("missing/..", "symlink", "symlink to missing/..", "symlink chain", "trailing /"):
        if link.is_symlink():
            link.unlink()
        link.symlink_to(f"{v}/" if spelling == "trailing /" else names[spelling])
        if where == "merged":
            assert cli("merge", str(adapter)) == 2
            assert "link inside memtune's folder" in capsys.readouterr().err
            assert "link inside" in on_merge(x, "en", str(adapter), "", True, True, progress=None)
        elif where == "gguf":
            assert cli("gguf", str(adapter), "--formats", "f16", "--replace") == 2
            assert "link inside memtune's folder" in capsys.readouterr().err
            status, _ = on_gguf_export(x.app, "en", str(adapter), ["f16"], True, progress=None)
            assert "link inside" in status
        else:
            from core.runs.history import tidy

            why = resume_problem(mine)
            assert why is not None and "link inside" in why, why
            tidy(mine.parent, is_running=lambda _: False)  # at start-up: removes half-written checkpoints
        assert tree_hash(v) == before, f"RUN/{where} -> {spelling} changed the victim"


def test_only_the_marker_makes_a_folder_memtunes(place):
    """The legacy rule is gone: a folder whose events.jsonl names it is not deletable without the marker."""
    base, v, names, mine = place
    assert [r.name for r in list_runs(base)] == []
    with pytest.raises(HistoryError, match="no .memtune.json marker"):
        delete_run(v, base, is_running=lambda _: False)
    assert "no .memtune.json marker" in resume_problem(v)


def test_the_issue_repro_in_a_fresh_process(place):
    """`python -m core.export gguf RUN/adapter --formats f16 --out /tmp/x/nothere/../victim`: exit 2, intact. One
    fresh process (seconds of imports): the same spelling with --replace, and every other, run in this process above."""
    base, v, names, mine = place
    before = tree_hash(v)
    proc = subprocess.run([sys.executable, "-m", "core.export", "gguf", str(mine / "adapter"), "--formats", "f16",
                           "--out", f"{base}/nothere/../victim"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and str(v) in proc.stderr
    assert tree_hash(v) == before
