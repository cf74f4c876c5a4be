"""README's Layout table names every file of the code's folders, and every file it names exists.

A row is a folder (`core/config/`) or a file (`app.py`); the folder's files are named in its row in backticks, by name
(`load.py`) or by their path from the repository (`bench/results/`). core/'s packages each have a row of their own.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ["ui", "core", "bench", "scripts"]  # each file directly inside, and core/'s packages, recursively
NOT_FILES = {"events.jsonl"}  # named in the table as what a run writes into its folder, not a file of the tree
FILE = re.compile(r"^\.?[\w./-]+(\.(py|md|json|jsonl|yaml|sh|txt)|/)$")


def layout_rows() -> dict[str, str]:
    """The Layout table: the path cell's text -> the row's other cell."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = "|".join(cells[1:])
    return rows


def named(row: str) -> set[str]:
    return {n for n in re.findall(r"`([^`]+)`", row) if FILE.match(n)}


def code_folders() -> list[Path]:
    folders = [ROOT / f for f in FOLDERS]
    folders += sorted(p.parent for p in (ROOT / "core").glob("*/__init__.py"))
    return folders


def test_every_file_of_the_code_is_in_its_folders_row():
    rows = layout_rows()
    assert "app.py" in rows and "core/levers/" in rows
    missing = []
    for folder in code_folders():
        key = folder.relative_to(ROOT).as_posix() + "/"
        assert key in rows, f"README's Layout table has no row for {key}"
        names = named(rows[key])
        for path in sorted(folder.iterdir()):
            if path.name in ("__init__.py", "__pycache__") or (path.is_dir() and (path / "__init__.py").exists()):
                continue  # a package's __init__ only says what it is for; a sub-package has its own row
            entry = path.name + ("/" if path.is_dir() else "")
            if entry not in names and path.relative_to(ROOT).as_posix() + ("/" if path.is_dir() else "") not in names:
                missing.append(f"{key}{entry}")
    assert missing == [], "name these in README's Layout table, in their folder's row"


def test_every_file_the_table_names_exists():
    absent = []
    for key, row in layout_rows().items():
        folder = ROOT / key if key.endswith("/") else ROOT
        for name in sorted(named(row) - NOT_FILES):
            if not ((folder / name).exists() or (ROOT / name).exists()):
                absent.append(f"{key}: {name}")
    assert absent == []
