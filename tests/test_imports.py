"""The project's imports go one way: no module imports, at any depth and from any function, one that imports it back.

Every .py of app.py, ui/, core/, bench/ and scripts/ is read with ast (nothing is imported or run), and every import in
it counts, the ones inside functions included: a circle hidden in a function body is still a circle for whoever has to
move a file. A package's __init__ counts only where it is imported as such (`from ui import build_ui`), not as the
parent of every `from ui.x import ...`, as Python's own import order would have it, since __init__ files here only
re-export their package.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLACES = ["app.py", "ui", "core", "bench", "scripts"]


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of PLACES (a package's __init__ is the package's name)."""
    modules = {}
    for place in PLACES:
        path = ROOT / place
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            parts = file.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return modules


def imported_modules(name: str, file: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that `name` imports anywhere in its file."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from . import x`, `from .x import y`
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from core import config` imports the submodule core.config.settings; `from core.config.settings import X`, core.config.settings
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import core.config.settings.x` -> core.config.settings
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_modules(name, file, modules) for name, file in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules, as one closed path through it (Tarjan, iterative)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root), on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt), on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(_closed_path(sorted(group)[0], group, graph))
    return groups


def _closed_path(start: str, group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path start -> ... -> start inside the group (breadth first), to name the circle in the failure."""
    came_from, frontier = {start: None}, [start]
    while frontier:
        following = []
        for node in frontier:
            for dep in sorted(graph[node] & group):
                if dep == start:
                    path = [node]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if dep not in came_from:
                    came_from[dep] = node
                    following.append(dep)
        frontier = following
    return [start]


def test_the_walk_sees_the_project_and_its_function_level_imports(tmp_path):
    graph = import_graph()
    assert {"app", "ui.layout", "core.config.settings", "core.train.recipe", "bench.product", "scripts.tutorial"} <= set(graph)
    assert "core.config.slices" in graph["core.data.plan"]  # a module-level import
    assert "ui.layout" in graph["app"] or "ui" in graph["app"]  # app builds the page
    # an import inside a function body counts, relative and `from package import module` forms resolve
    source = tmp_path / "x.py"
    source.write_text("import os\nfrom . import y\n\ndef f():\n    from core.config.settings import TrainConfig\n"
                      "    from ui import layout\n")
    known = {"pkg.x": source, "pkg.y": source, "core.config.settings": source, "ui": source, "ui.layout": source}
    assert imported_modules("pkg.x", source, known) == {"pkg.y", "core.config.settings", "ui.layout"}
    fake = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(fake) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    found = circles(import_graph())
    assert found == [], "import circles (each module imports the next, the last the first):\n" + "\n".join(
        " -> ".join(path) for path in found)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same imports between core/'s packages (core.config, core.runs, ...; a top-level module is its own node)."""
    def package(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:2]) if parts[0] == "core" else parts[0]
    packages: dict[str, set[str]] = {}
    for name, deps in graph.items():
        if name.startswith("core."):
            packages.setdefault(package(name), set()).update(
                package(dep) for dep in deps if dep.startswith("core.") and package(dep) != package(name))
    return packages


def test_core_packages_import_downwards_only():
    """core/'s folders stack: no package imports one that imports it back, through any of their modules."""
    packages = package_graph(import_graph())
    assert {"core.config", "core.runs", "core.data", "core.model", "core.train", "core.jobs", "core.scoring"} <= set(packages)
    # the scorers read answers, rows and public mode only: the recipe (core.train) and GRPO's rewards call them
    assert packages["core.scoring"] <= {"core.messages", "core.runs", "core.data", "core.config", "core.files"}
    found = circles(packages)
    assert found == [], "packages of core/ that import each other:\n" + "\n".join(" -> ".join(path) for path in found)
    assert package_graph({"core.a.x": {"core.b.y"}, "core.b.y": {"core.a.z"}, "core.a.z": set()}) == {
        "core.a": {"core.b"}, "core.b": {"core.a"}}  # the walk itself sees a circle of two packages


def test_the_page_is_built_by_ui_layout_and_nothing_below_it_imports_it():
    graph = import_graph()
    ui = {name: deps for name, deps in graph.items() if name.startswith("ui.")}
    assert "ui.blocks" not in graph and ui["ui.layout"]
    assert not [name for name, deps in ui.items() if "ui.layout" in deps]


def test_config_is_a_floor_and_the_levers_sit_just_above_it():
    """core.config imports nothing of memtune but the leaves below every package (it names what it cannot import as
    text: tests/test_registry.py imports those names); the levers' own modules (core/levers/) need only config and
    are used by the loader above them."""
    packages = package_graph(import_graph())
    # the single modules below every package (core/messages.py, core/files.py, ...): each imports only the others
    modules = {name for name in packages if (Path(__file__).resolve().parent.parent / (name.replace(".", "/") + ".py")).is_file()}
    leaves: set[str] = set()
    while grown := {m for m in modules - leaves if packages[m] <= leaves}:
        leaves |= grown
    assert "core.messages" in leaves and packages["core.config"] <= leaves
    assert packages["core.levers"] == {"core.config"} and "core.levers" in packages["core.model"]
