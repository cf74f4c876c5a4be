"""memtune's own definitions, copied verbatim into a generated script (core/codegen.py's Show code).

`helper_source(module, roots)` returns the source of `roots` in a memtune module and of every module-level name they
use, following imports into other memtune modules, read with `ast` without importing anything. The script then
formats data with the engine's own functions: one definition, no copy to keep in step.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path


@functools.lru_cache(maxsize=None)
def _parsed(module_name: str) -> tuple[list[str], dict[str, ast.stmt], dict[str, tuple[str | None, str, str | None]]]:
    """(source lines, top-level definitions by name, imports by bound name -> (from module, name, as)) of a module,
    read without importing it."""
    origin = importlib.util.find_spec(module_name).origin
    text = Path(origin).read_text(encoding="utf-8")
    defs: dict[str, ast.stmt] = {}
    imports: dict[str, tuple[str | None, str, str | None]] = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    defs[target.id] = node
        elif isinstance(node, ast.Import):
            for a in node.names:
                imports[a.asname or a.name.split(".")[0]] = (None, a.name, a.asname)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for a in node.names:
                imports[a.asname or a.name] = (node.module, a.name, a.asname)
    return text.splitlines(), defs, imports


def _defining_module(module_name: str, name: str) -> str:
    """The module that defines `name`: `module_name` or a memtune module it imports from (e.g. after a split)."""
    queue, seen = [module_name], set()
    while queue:
        module = queue.pop(0)
        if module in seen:
            continue
        seen.add(module)
        _, defs, imports = _parsed(module)
        if name in defs:
            return module
        queue += [source for source, _, _ in imports.values() if source and source.split(".")[0] == "core"]
    raise ValueError(f"No module reachable from {module_name} defines {name}: update codegen's entry points")


def _used_names(node: ast.AST) -> list[str]:
    """Names a definition reads, annotations left out (the script does not evaluate them)."""
    names, stack = [], [node]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.Name):
            names.append(item.id)
        for key, value in ast.iter_fields(item):
            if key not in ("annotation", "returns"):
                stack += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, ast.AST)]
    return names


@functools.lru_cache(maxsize=None)
def helper_source(module_name: str, roots: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """(import lines, source) of `roots` in a memtune module and of every module-level name they use.

    Names a definition imports from another memtune module (core.*) are followed into that module, so the script
    needs nothing of memtune. The script carries these definitions verbatim and so formats data exactly as the
    engine does (one definition, no copy to keep in step). Definitions keep their module's order, a module's
    dependencies come first; comments between definitions are left out.
    """
    todo = [(_defining_module(module_name, name), name) for name in roots]
    wanted: dict[str, str] = {}  # name -> defining module
    modules = list(dict.fromkeys([module_name] + [module for module, _ in todo]))  # in discovery order
    import_lines: set[str] = set()
    while todo:
        module, name = todo.pop()
        _, defs, imports = _parsed(module)
        if name in imports:
            source, real, alias = imports[name]
            memtune = (source or real).split(".")[0] == "core"
            if memtune and source and alias in (None, real):
                todo.append((source, real))  # memtune's own: copy its definition too
                modules += [source] if source not in modules else []
            elif memtune:
                raise ValueError(f"{module} uses {name} ({source or real}) in a way the script cannot copy")
            else:
                import_lines.add((f"from {source} import {real}" if source else f"import {real}")
                                 + (f" as {alias}" if alias else ""))
        elif name in defs:
            if name in wanted:
                if wanted[name] != module:
                    raise ValueError(f"{name} is defined in both {wanted[name]} and {module}: the script needs one")
                continue
            wanted[name] = module
            todo += [(module, used) for used in _used_names(defs[name])]
    blocks = []
    for module in reversed(modules):
        lines, defs, _ = _parsed(module)
        nodes = {id(defs[name]): defs[name] for name, where in wanted.items() if where == module}
        for node in sorted(nodes.values(), key=lambda n: n.lineno):
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            blocks.append("\n".join(lines[start - 1:node.end_lineno]))
    return tuple(sorted(import_lines)), "\n\n\n".join(blocks)
