"""Each function reads only the part of the configuration it declares (core/config/slices.py).

Read with ast, nothing run: for every function of app.py, ui/, core/ and bench/ whose parameter is annotated with a
slice (a base slice, a slice made of base slices, or a TypeVar bound to one), every `param.name` it reads or sets, and
every field it changes through `param.replace(...)` or `dataclasses.replace(param, ...)`, is a field of that slice;
and where it hands the parameter on to a project function whose parameter is annotated, that function's slice needs no
field the caller's lacks (a TrainConfig parameter needs them all). Only a few files handle the whole config.
"""

from __future__ import annotations

import ast
import dataclasses
import tempfile
import typing
from pathlib import Path

import pytest

from core.config import slices
from core.config.settings import TrainConfig
from tests.test_imports import project_modules

ROOT = Path(__file__).resolve().parent.parent
WHOLE = "TrainConfig"
# The code that takes the whole config: defining and checking it, resolving the run, showing it as a script,
# mapping the page's widgets onto it and the recipe's entry. The job manager takes `Queued`: it writes the config's
# text for the child and reads only names.
WHOLE_FILES = {"core/config/settings", "core/checks", "core/model/resolve", "core/codegen", "ui/form",
               "core/train/recipe"}


def members(protocol: type) -> frozenset[str]:
    """The fields, properties and methods a slice protocol declares, its bases' included."""
    names = set()
    for klass in protocol.__mro__:
        if klass in (typing.Protocol, typing.Generic, object, slices.Slice):
            continue
        names |= set(vars(klass).get("__annotations__", {}))
        names |= {n for n, v in vars(klass).items() if isinstance(v, property) or (callable(v) and not n.startswith("_"))}
    return frozenset(names)


FIELDS = frozenset(f.name for f in dataclasses.fields(TrainConfig))
SLICES = {name: members(obj) for name, obj in vars(slices).items()
          if isinstance(obj, type) and slices.Slice in obj.__mro__ and obj is not slices.Slice}


def test_base_slices_split_the_fields_once_with_their_types():
    hints = typing.get_type_hints(TrainConfig)
    seen: dict[str, str] = {}
    for base in slices.BASE_SLICES:
        own = typing.get_type_hints(base)
        for name, tp in own.items():
            assert name in FIELDS, f"{base.__name__}.{name} is no TrainConfig field"
            assert name not in seen, f"{name} is in both {seen[name]} and {base.__name__}"
            assert tp == hints[name], f"{base.__name__}.{name} is {tp}, TrainConfig's is {hints[name]}"
            seen[name] = base.__name__
    assert set(seen) == FIELDS, f"fields in no slice: {sorted(FIELDS - set(seen))}"


def test_every_whole_config_property_a_slice_names_exists():
    for name, names in SLICES.items():
        assert names - FIELDS <= {n for n in dir(TrainConfig)
                                  if isinstance(getattr(TrainConfig, n), property) or callable(getattr(TrainConfig, n))}, name


# --- reading the code --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Module:
    name: str
    tree: ast.Module
    protocols: dict[str, frozenset[str]]  # slice names usable here (imported or defined) -> fields
    typevars: dict[str, str]  # TypeVar name -> its bound's name
    imports: dict[str, tuple[str, str | None]]  # local name -> (module, attribute or None for a module)
    functions: dict[str, ast.FunctionDef]  # top-level functions and methods by their local name (Class.method too)


def _annotation_name(node: ast.expr | None) -> str | None:
    """The type an annotation names: `X`, `"X"`, `mod.X`, and `X | None` / `Optional[X]` as X."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _annotation_name(ast.parse(node.value.strip(), mode="eval").body)
        except SyntaxError:
            return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        named = [n for n in (node.left, node.right) if not (isinstance(n, ast.Constant) and n.value is None)]
        return _annotation_name(named[0]) if len(named) == 1 else None
    if isinstance(node, ast.Subscript) and _annotation_name(node.value) == "Optional":
        return _annotation_name(node.slice)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _read(name: str, file: Path, modules: dict[str, Path]) -> Module:
    tree = ast.parse(file.read_text(), str(file))
    protocols = dict(SLICES) if name == "core.config.slices" else {}
    typevars, imports, functions = {}, {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                imports[alias.asname or alias.name] = (full, None) if full in modules else (node.module, alias.name)
                if node.module == "core.config.slices" and alias.name in SLICES:
                    protocols[alias.asname or alias.name] = SLICES[alias.name]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    imports[alias.asname or alias.name] = (alias.name, None)
    for node in tree.body:  # slices made of slices, defined here
        if isinstance(node, ast.ClassDef) and any(_annotation_name(b) == "Protocol" for b in node.bases):
            parts = [protocols.get(_annotation_name(b) or "") for b in node.bases]
            if any(p is not None for p in parts):
                own = [s for s in node.body if isinstance(s, ast.AnnAssign)]
                assert not own, f"{name}.{node.name} declares fields of its own: a slice is made of base slices"
                protocols[node.name] = frozenset().union(*(p for p in parts if p is not None))
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
              and _annotation_name(node.value.func) == "TypeVar"):
            bound = next((k.value for k in node.value.keywords if k.arg == "bound"), None)
            if bound is not None and isinstance(node.targets[0], ast.Name):
                typevars[node.targets[0].id] = _annotation_name(bound) or ""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    functions[f"{node.name}.{item.name}"] = item
    for qual, fn in list(functions.items()):  # functions defined inside functions, checked alike
        for node in ast.walk(fn):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not fn:
                functions[f"{qual}.<locals>.{node.name}"] = node
    return Module(name, tree, protocols, typevars, imports, functions)


MODULES = {name: _read(name, file, project_modules()) for name, file in project_modules().items()
           if not name.startswith("scripts")}


def _slice_of(module: Module, annotation: ast.expr | None) -> frozenset[str] | None:
    """The fields a parameter's annotation allows: a slice's, all for TrainConfig, None for anything else."""
    name = _annotation_name(annotation)
    name = module.typevars.get(name, name)
    if name == WHOLE:
        return FIELDS | members(slices.TrainerSlice) | {"to_dict", "to_yaml", "save"}
    return module.protocols.get(name or "")


def _params(fn: ast.FunctionDef) -> list[ast.arg]:
    return [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]


def _callee(module: Module, call: ast.Call) -> tuple[Module, ast.FunctionDef] | None:
    """The project function a call reaches, where the module says which: `f(...)`, `mod.f(...)`."""
    func = call.func
    if isinstance(func, ast.Name):
        if func.id in module.functions:
            return module, module.functions[func.id]
        target = module.imports.get(func.id)
        if target and target[1] and target[0] in MODULES:
            other = MODULES[target[0]]
            return (other, other.functions[target[1]]) if target[1] in other.functions else None
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        target = module.imports.get(func.value.id)
        if target and target[1] is None and target[0] in MODULES:
            other = MODULES[target[0]]
            return (other, other.functions[func.attr]) if func.attr in other.functions else None
    return None


def _passed_as(call: ast.Call, name: str, callee: ast.FunctionDef) -> list[ast.arg]:
    """The callee's parameters that receive `name` in this call."""
    params = [*callee.args.posonlyargs, *callee.args.args]
    if params and params[0].arg in ("self", "cls"):
        params = params[1:]
    by_name = {p.arg: p for p in _params(callee)}
    hits = [params[i] for i, a in enumerate(call.args) if isinstance(a, ast.Name) and a.id == name and i < len(params)]
    hits += [by_name[k.arg] for k in call.keywords
             if isinstance(k.value, ast.Name) and k.value.id == name and k.arg in by_name]
    return hits


def _violations(module: Module) -> list[str]:
    found = []
    for qual, fn in module.functions.items():
        for param in _params(fn):
            allowed = _slice_of(module, param.annotation)
            if allowed is None:
                continue
            where = f"{module.name}.{qual}({param.arg})"
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == param.arg:
                    if node.attr not in allowed | {"replace"}:
                        found.append(f"{where} reads {node.attr}, not in its slice")
                if not isinstance(node, ast.Call):
                    continue
                replaced = None
                if (isinstance(node.func, ast.Attribute) and node.func.attr == "replace"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == param.arg):
                    replaced = node.keywords
                elif (_annotation_name(node.func) == "replace" and node.args and isinstance(node.args[0], ast.Name)
                      and node.args[0].id == param.arg):
                    replaced = node.keywords
                for k in replaced or ():
                    if k.arg is not None and k.arg not in allowed:
                        found.append(f"{where} changes {k.arg}, not in its slice")
                reached = _callee(module, node)
                if reached is None:
                    continue
                other, callee = reached
                for target in _passed_as(node, param.arg, callee):
                    needs = _slice_of(other, target.annotation)
                    if needs is not None and not needs <= allowed:
                        found.append(f"{where} hands its slice to {other.name}.{callee.name}({target.arg}), which "
                                     f"reads {sorted(needs - allowed)[:4]} too")
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_functions_read_only_their_slice(name):
    assert _violations(MODULES[name]) == []


def test_few_files_take_the_whole_config():
    whole = sorted({str(Path(*m.name.split("."))) for m in MODULES.values() for fn in m.functions.values()
                    for p in _params(fn) if _annotation_name(p.annotation) == WHOLE and p.arg != "self"})
    assert set(whole) <= WHOLE_FILES, sorted(set(whole) - WHOLE_FILES)


def test_the_checker_sees_a_function_reading_outside_its_slice():
    source = ("from core.config.slices import LoraSlice, Loading\n"
              "def g(cfg: Loading):\n    return cfg.model\n"
              "def f(cfg: LoraSlice):\n    return cfg.lora_r + cfg.learning_rate + g(cfg) and cfg.replace(seed=1)\n"
              "def h(cfg: 'LoraSlice | None' = None):\n    return cfg.optim\n"
              "def outer():\n    def inner(cfg: LoraSlice):\n        return cfg.max_length\n    return inner\n")
    module = _read_source("probe", source)
    found = _violations(module)
    assert any("reads learning_rate" in v for v in found), found
    assert any("changes seed" in v for v in found), found
    assert any("hands its slice to probe.g(cfg)" in v for v in found), found
    assert not any("probe.g(cfg) reads" in v for v in found), found
    assert any("probe.h(cfg) reads optim" in v for v in found), found
    assert any("probe.outer.<locals>.inner(cfg) reads max_length" in v for v in found), found


def _read_source(name: str, source: str) -> Module:
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "probe.py"
        file.write_text(source)
        return _read(name, file, project_modules())


def test_public_modes_path_check_reads_fields_of_its_slice():
    """public_problems and visitor_config read every path field by name (getattr over path_fields()): the checker
    cannot follow that, so the fields themselves are checked against the slice those functions declare."""
    from core.runs import public

    assert set(public.path_fields()) <= members(public._Visited)
