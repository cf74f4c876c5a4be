"""No dead functions: every module-level function and class in core/ and ui/ is used somewhere else in the repository.

Used means named outside its own body in any Python file of the repository (tests included): a call, a reference
handed on (Gradio's event wiring passes handlers by reference), an import, or a string that names it (getattr by
name, the lever registry's "module.function" texts). A docstring or a comment naming it does not count: prose keeps
nothing alive. A function only a test calls counts as used; a test that only tests dead code goes with the code.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("core", "ui")
SKIPPED_PARTS = {"__pycache__", "node_modules", ".git"}

# Defined and never named anywhere, on purpose: name -> why.
ENTRY_POINTS: dict[str, str] = {}


def python_files() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*.py")) if not SKIPPED_PARTS & set(parts := p.relative_to(ROOT).parts)
            and not any(part.startswith(".") for part in parts)]  # a hidden folder is no part of the repository


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def names_used(tree: ast.AST) -> list[tuple[str, str | None]]:
    """(name, the module-level def or class it is used inside, or None) for every use in a module."""
    docs = _docstrings(tree)
    out: list[tuple[str, str | None]] = []

    def visit(node: ast.AST, owner: str | None) -> None:
        if isinstance(node, ast.Name):
            out.append((node.id, owner))
        elif isinstance(node, ast.Attribute):
            out.append((node.attr, owner))
        elif isinstance(node, ast.alias):
            out.extend((part, owner) for part in node.name.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            out.extend((word, owner) for word in re.findall(r"[A-Za-z_]\w*", node.value))
        for child in ast.iter_child_nodes(node):
            visit(child, owner)

    for node in tree.body:
        owner = node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
        if owner:  # its decorators and default values are uses from outside it
            args = getattr(node, "args", None)
            annotations = [a.annotation for a in ([*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg,
                                                    args.kwarg] if args else []) if a is not None and a.annotation]
            for outer in [*node.decorator_list, *getattr(args, "defaults", []), *annotations,
                          *([node.returns] if getattr(node, "returns", None) else [])]:
                visit(outer, None)  # a slice or type named in a signature is used by the function
            for child in node.body:
                visit(child, owner)
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    visit(base, None)
        else:
            visit(node, None)
    return out


def unused(files: list[Path], checked: tuple[str, ...] = CHECKED) -> list[str]:
    """`path:line name` for each module-level function or class under `checked` that no file names elsewhere."""
    trees = {p: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in files}
    uses: dict[str, set[tuple[Path, str | None]]] = {}
    for path, tree in trees.items():
        for name, owner in names_used(tree):
            uses.setdefault(name, set()).add((path, owner))
    dead = []
    for path, tree in trees.items():
        if path.relative_to(ROOT).parts[0] not in checked:
            continue
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            name = node.name
            if name.startswith("__") or name in ENTRY_POINTS:
                continue
            if not any(not (where == path and owner == name) for where, owner in uses.get(name, ())):
                dead.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return dead


def test_every_function_in_core_and_ui_is_used():
    dead = unused(python_files())
    assert not dead, ("functions and classes nothing in the repository uses (remove them, with any test that only "
                      "tests them, or name the entry point in ENTRY_POINTS with why):\n" + "\n".join(dead))


def test_the_scan_finds_a_function_only_its_own_body_and_docstrings_name(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "m.py").write_text(
        '"""`lonely` is named here only."""\n'
        "def lonely(n):\n    return lonely(n - 1) if n else 0\n\n"
        "def called():\n    return 1\n\n"
        "def by_name():\n    return 2\n\n"
        "def wired():\n    return 3\n\n"
        "class Base:\n    pass\n\n"
        "class Child(Base):\n    pass\n", encoding="utf-8")
    (tmp_path / "ui.py").write_text(
        "from core.m import called\n"
        "import core.m as m\n"
        "called()\n"
        "getattr(m, 'by_name')()\n"
        "button_click(fn=m.wired)\n", encoding="utf-8")
    dead = unused(sorted(tmp_path.rglob("*.py")))
    assert [d.split()[-1] for d in dead] == ["lonely", "Child"]
