"""docs/CONTRACTS.md describes today's code: every code name it cites exists where it says.

The document is read, not imported: each backticked span that reads as code (`core.x.name`, `alias.name(args)`,
`Class.member`, `name(args)`, `NAME`, `--flag`, `python -m module`) and every repository path in its text
(core/x/y.py, ui/z.py, app.py) is checked against an AST index of the repository's code, so no test imports torch to
find a name. A bare name is looked up in the modules its section heading and its paragraph name (the doc's own
convention: `phase(...)` in a bullet that names core.train.callbacks is core.train.callbacks' phase), a call's
parameter names against the definition's, and a lowercase word that no code defines (an event field, a config
field) must at least occur in the code. The failure lists every stale name at once.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "CONTRACTS.md"
CODE_DIRS = ("core", "ui", "bench", "scripts")
REPO_DIRS = CODE_DIRS + ("tests", "docs", "assets")
# the libraries a span may name (`trl.SFTConfig`, `datasets.Dataset`): not memtune's to check
EXTERNAL = {"trl", "transformers", "peft", "torch", "datasets", "gradio", "accelerate", "bitsandbytes", "os", "json"}
FILE_EXTENSIONS = {"py", "json", "jsonl", "md", "sh", "txt", "yaml", "yml", "lock", "csv", "html", "css", "js",
                   "safetensors", "zip", "gguf", "toml", "ini", "ico", "png", "old", "tmp", "log"}
IDENT = r"[A-Za-z_]\w*"


# ---------------------------------------------------------------- the code, indexed


@dataclass
class Module:
    name: str
    path: Path
    top: set[str] = field(default_factory=set)  # defined at module level (def, class, assignment)
    imported: set[str] = field(default_factory=set)  # imported at module level: importable from it
    uses: set[str] = field(default_factory=set)  # imported anywhere in it (a library's function it calls)
    members: set[str] = field(default_factory=set)  # defined anywhere in it: methods, class fields, self.x


@dataclass
class Index:
    modules: dict[str, Module]
    defs: dict[str, set[str]]  # function or class name -> modules defining it (def/class statements)
    consts: dict[str, set[str]]  # UPPER_CASE module-level assignment -> modules
    classes: dict[str, set[str]]  # class name -> its members (methods, fields, self.x), over every such class
    params: dict[str, list[set[str]]]  # def name -> parameter names of each definition (a class: __init__/fields)
    words: set[str]  # identifiers and the words of string literals, anywhere in the code
    string_words: set[str]  # the words of string literals (event kinds, dict keys, field names as text)
    strings: str  # every string literal, joined (for command-line flags)


def _code_files() -> list[Path]:
    files = [ROOT / "app.py"]
    for top in CODE_DIRS:
        files += [p for p in sorted((ROOT / top).rglob("*.py")) if "__pycache__" not in p.parts]
    return files


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return set(names) | ({"**"} if a.kwarg else set())


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


def _flat(target: ast.AST) -> list[ast.AST]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for e in target.elts for t in _flat(e)]
    return [target]


def _class_members(node: ast.ClassDef) -> tuple[set[str], set[str]]:
    """A class's members (methods, class-level fields, self.x assigned in its methods) and its constructor's
    parameters (__init__'s or __new__'s, else the dataclass fields)."""
    members, init, fields = set(), set(), set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members.add(item.name)
            if item.name in ("__init__", "__new__"):
                init |= _params(item) - {"self", "cls"}
            elif any(isinstance(d, ast.Name) and d.id == "classmethod" for d in item.decorator_list):
                members.add(item.name)
        for t in _targets(item):
            for n in _flat(t):
                if isinstance(n, ast.Name):
                    members.add(n.id)
                    fields.add(n.id)
    for sub in ast.walk(node):
        for t in _targets(sub):
            for n in _flat(t):
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                    members.add(n.attr)
    return members, (init or fields)


@cache
def index() -> Index:
    modules: dict[str, Module] = {}
    defs: dict[str, set[str]] = {}
    consts: dict[str, set[str]] = {}
    classes: dict[str, set[str]] = {}
    params: dict[str, list[set[str]]] = {}
    words: set[str] = set()
    string_words: set[str] = set()
    strings: list[str] = []
    for path in _code_files():
        name = _module_name(path)
        mod = modules[name] = Module(name, path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                mod.top.add(node.name)
            for t in _targets(node):
                for n in _flat(t):
                    if isinstance(n, ast.Name):
                        mod.top.add(n.id)
                        if n.id.isupper():
                            consts.setdefault(n.id, set()).add(name)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mod.imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(node.name, set()).add(name)
                params.setdefault(node.name, []).append(_params(node))
                mod.members.add(node.name)
                words.add(node.name)
                words |= _params(node)
            elif isinstance(node, ast.ClassDef):
                defs.setdefault(node.name, set()).add(name)
                members, init = _class_members(node)
                classes.setdefault(node.name, set()).update(members)
                params.setdefault(node.name, []).append(init)
                mod.members |= members | {node.name}
                words.add(node.name)
            elif isinstance(node, ast.Name):
                words.add(node.id)
            elif isinstance(node, ast.Attribute):
                words.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                words.add(node.arg)
            elif isinstance(node, ast.alias):
                words |= set((node.asname or node.name).split(".")) | set(node.name.split("."))
                mod.uses.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in docstrings:
                value = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
                strings.append(value)
                string_words |= set(re.findall(IDENT, value))
        mod.members |= mod.top
    return Index(modules, defs, consts, classes, params, words | string_words, string_words, "\n".join(strings))


def _submodules(ix: Index, name: str) -> set[str]:
    """A module, or a package and every module under it."""
    return {m for m in ix.modules if m == name or m.startswith(name + ".")}


def _aliases(ix: Index, alias: str) -> set[str]:
    """Modules a short name may mean (`vram` core.gpus.vram, `history` core.runs.history or ui.history), packages
    with their submodules."""
    found = set()
    for m in ix.modules:
        if m.split(".")[-1] == alias:
            found |= _submodules(ix, m)
    return found


@cache
def locale_keys() -> set[str]:
    return set(json.loads((ROOT / "core" / "locales" / "en.json").read_text(encoding="utf-8")))


# ---------------------------------------------------------------- the document, read


@dataclass
class Citation:
    text: str  # the span as written
    where: str  # the section heading and line
    context: set[str]  # modules the heading and the paragraph name


PATH_RE = re.compile(r"(?<![\w/.-])((?:%s)/(?:[\w.*-]+/?)*|app\.py)(?![\w/])" % "|".join(REPO_DIRS))
DOTTED_MODULE_RE = re.compile(r"(?<![\w.])((?:core|ui|bench|scripts)(?:\.%s)+)" % IDENT)


def _path_module(ix: Index, path: str) -> tuple[set[str], str | None]:
    """The modules a written path means, and the attribute after it (`ui/handlers.config_dir`)."""
    path = path.rstrip(".")
    attr = None
    stem, dot, tail = path.rpartition(".")
    if dot and "/" not in tail and tail not in FILE_EXTENSIONS:
        path, attr = stem, tail
    dotted = path.rstrip("/").removesuffix(".py").replace("/", ".")
    return _submodules(ix, dotted), attr


def _mentioned_modules(ix: Index, text: str) -> set[str]:
    found = set()
    for path in PATH_RE.findall(text):
        found |= _path_module(ix, path)[0]
    for dotted in DOTTED_MODULE_RE.findall(text):
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in ix.modules:
                found |= _submodules(ix, ".".join(parts[:n]))
                break
    for span in re.findall(r"`([^`]+)`", text):
        head = re.match(IDENT, span.lstrip("."))
        if head and "." in span and span.split(".")[0] == head.group() and head.group() not in CODE_DIRS:
            found |= _aliases(ix, head.group())
    return found


def paragraphs() -> list[tuple[str, int, str]]:
    """(heading, first line number, text) per paragraph: a bullet with its continuation lines, or a run of lines."""
    out, heading, start, lines = [], "", 0, []
    for number, line in enumerate(DOC.read_text(encoding="utf-8").splitlines() + [""], 1):
        if line.startswith("#") or line.startswith("- ") or not line.strip():
            if lines:
                out.append((heading, start, "\n".join(lines)))
            lines, start = [], number
            if line.startswith("#"):
                heading = line.lstrip("# ").strip()
                continue
            if not line.strip():
                continue
        if not lines:
            start = number
        lines.append(line)
    return out


def citations() -> tuple[list[Citation], list[tuple[str, str]]]:
    """The code spans, each with its context, and every repository path written anywhere (path, where)."""
    ix = index()
    spans, paths = [], []
    for heading, line, text in paragraphs():
        where = f"{heading or 'top'} (line {line})"
        context = _mentioned_modules(ix, heading) | _mentioned_modules(ix, text)
        for span in text.split("`")[1::2]:
            spans.append(Citation(" ".join(span.split()), where, context))
        paths += [(p, where) for p in PATH_RE.findall(text)]
    return spans, paths


# ---------------------------------------------------------------- a span, checked


def _split_top(text: str, sep: str) -> list[str]:
    """text split on sep outside brackets and quotes."""
    parts, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return parts + [cur]


def parse_chain(text: str) -> list[tuple[str, str | None]] | None:
    """`a.b(x, y).c` -> [("a", None), ("b", "x, y"), ("c", None)]; None when the text is not such a chain."""
    chain, pos = [], 0
    if text.startswith("."):
        chain.append(("", None))
        pos = 1
    while True:
        m = re.compile(IDENT).match(text, pos)
        if not m:
            return None
        name, pos, args = m.group(), m.end(), None
        if pos < len(text) and text[pos] == "(":
            depth = 0
            for end in range(pos, len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            else:
                return None
            args, pos = text[pos + 1:end], end + 1
        chain.append((name, args))
        if pos == len(text):
            return chain
        if text[pos] != ".":
            return None
        pos += 1


def _arg_names(args: str) -> list[tuple[str, bool]]:
    """The parameter names a written call shows (`x`, `x=...`, `*x`, `**x`), each with whether it is passed by
    keyword (which a def taking **kwargs accepts); literals, `...` and `a|b` say nothing."""
    names = []
    for arg in _split_top(args, ","):
        arg = arg.strip().lstrip("*")
        m = re.fullmatch(r"(%s)\s*(=.*)?" % IDENT, arg, re.S)
        if m:
            names.append((m.group(1), m.group(2) is not None))
    return names


class Checker:
    def __init__(self) -> None:
        self.ix = index()
        self.stale: list[str] = []

    def fail(self, cite: Citation, why: str) -> None:
        self.stale.append(f"`{cite.text}` in {cite.where}: {why}")

    def check(self, cite: Citation) -> None:
        text = cite.text
        if text.startswith("python "):
            return self.command(cite)
        if text.startswith("--"):
            for flag in re.findall(r"--[\w-]+", text):
                if flag not in self.ix.strings:
                    self.fail(cite, f"no code has the flag {flag}")
            return None
        text = re.sub(r"^class\s+", "", text.split(" -> ")[0].strip())
        text = re.sub(r"^(%s)\s*=\s*(\"[^\"]*\"|\d+)?$" % IDENT, r"\1", text)  # NAME = "value", ENV=1, path=
        text = re.sub(r"^%s=(?=%s\()" % (IDENT, IDENT), "", text)  # field=Lever(...): the call
        declared = cite.text.startswith("class ")
        if PATH_RE.fullmatch(text.rstrip(".")) or re.fullmatch(r"(%s)/[\w/.-]*\.%s" % ("|".join(REPO_DIRS), IDENT),
                                                                   text):
            return self.path(cite, text)
        alternatives = _split_top(text, "/")
        if len(alternatives) > 1:  # `Class.a/b/c`, `vram.x/y`: each alternative under the first one's prefix
            prefix = alternatives[0].rpartition(".")[0]
            if not prefix or not all(parse_chain(a) for a in alternatives):
                return None  # a path a run writes (`RUN/STOP`), a URL: not code
            texts = [alternatives[0]] + [f"{prefix}.{a}" if prefix else a for a in alternatives[1:]]
        else:
            texts = [text]
        for one in texts:
            chain = parse_chain(one)
            if chain is not None and not self.file_name(one):
                self.chain(cite, one, [(chain[0][0], None)] if declared else chain)  # class X(Base): X
        return None

    def file_name(self, text: str) -> bool:
        """`summary.json`, `events.jsonl`: a file a run writes, not code."""
        return "." in text and text.rpartition(".")[2] in FILE_EXTENSIONS

    def command(self, cite: Citation) -> None:
        m = re.match(r"python (?:-m (\S+)|(\S+\.py))", cite.text)
        if not m:
            return
        if m.group(2):
            if not (ROOT / m.group(2)).is_file():
                self.fail(cite, f"{m.group(2)} does not exist")
            return
        base = ROOT.joinpath(*m.group(1).split("."))
        if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
            self.fail(cite, f"no module {m.group(1)} to run")

    def path(self, cite: Citation, text: str) -> None:
        self.path_exists(text, cite.where)

    def path_exists(self, text: str, where: str) -> None:
        text = text.rstrip(".")
        mods, attr = _path_module(self.ix, text)
        if attr is not None:
            if not mods:
                self.stale.append(f"{text} in {where}: no such module")
            elif not any(attr in self.ix.modules[m].top | self.ix.modules[m].imported for m in mods):
                self.stale.append(f"{text} in {where}: {attr} is not in {sorted(mods)[0]}")
            return
        if not any(ROOT.glob(text.rstrip("/"))):
            self.stale.append(f"{text} in {where}: no such file or folder")

    def chain(self, cite: Citation, text: str, chain: list[tuple[str, str | None]]) -> None:
        ix = self.ix
        if text in locale_keys() or chain[0][0] in EXTERNAL:
            return
        names = [n for n, _ in chain]
        if names[0] == "":  # `.start(cfg)`: a method of a class in the paragraph's modules
            name, args = chain[1]
            homes = {m for m in cite.context if name in ix.modules[m].members}
            if not homes:
                return self.fail(cite, f"no class in {self.say(cite.context)} has {name}")
            return self.signature(cite, name, args)
        # the longest prefix that is a module (core.x.y) or a short name of one (vram, history, export)
        for n in range(len(names), 0, -1):
            prefix = ".".join(names[:n])
            if prefix in ix.modules:
                mods, rest, strict = _submodules(ix, prefix), chain[n:], True
                break
        else:
            mods, rest, strict = _aliases(ix, names[0]), chain[1:], False
        if mods:
            if not rest:
                return None
            name, args = rest[0]
            subs = {m.split(".")[-1] for m in mods}
            found = {m for m in mods if name in (ix.modules[m].top | ix.modules[m].imported
                                                 | (set() if strict else ix.modules[m].members))} or (
                {name} & subs)
            if not found:
                return self.fail(cite, f"{name} is not in {self.say(mods)}" + self.elsewhere(name))
            self.signature(cite, name, args, found)
            if len(rest) > 1 and name in ix.classes:
                return self.member(cite, name, rest[1])
            return None
        if len(chain) == 1:
            return self.bare(cite, chain[0])
        if names[0] in ix.classes:  # `TrainConfig.save`, `Child.spawn`
            return self.member(cite, names[0], chain[1])
        # an instance (`job.events`, `plan.turns`, `action.ask(...)`): a member of some class
        name, args = chain[-1]
        if not any(name in members for members in ix.classes.values()):
            return self.fail(cite, f"no class has a member {name}")
        return self.signature(cite, name, args)

    def member(self, cite: Citation, cls: str, link: tuple[str, str | None]) -> None:
        name, args = link
        if name not in self.ix.classes[cls]:
            return self.fail(cite, f"{cls} has no member {name}")
        self.signature(cite, name, args)

    def bare(self, cite: Citation, link: tuple[str, str | None]) -> None:
        ix = self.ix
        name, args = link
        if name in ix.defs or (name.isupper() and name in ix.consts):
            homes = ix.defs.get(name, set()) | ix.consts.get(name, set())
            context = cite.context or set(ix.modules)
            defined_here = {m for m in context if name in ix.modules[m].top | ix.modules[m].members}
            # a lowercase word that is also text in the code (an event kind, a dict key: `error`, `step`) is that
            if not defined_here and not (args is None and name.islower() and name in ix.string_words):
                return self.fail(cite, f"defined in {self.say(homes)}, not in {self.say(cite.context)}")
            return self.signature(cite, name, args, defined_here)
        if args is not None and not any(name in ix.modules[m].uses for m in cite.context):
            return self.fail(cite, "no such function or class" + self.elsewhere(name))
        if name not in ix.words:
            self.fail(cite, "no code has this name")
        return None

    def signature(self, cite: Citation, name: str, args: str | None, modules: set[str] | None = None) -> None:
        if not args or name not in self.ix.params:
            return
        known = set().union(*self.ix.params[name])
        missing = [a for a, keyword in _arg_names(args) if a not in known and not (keyword and "**" in known)]
        if missing:
            self.fail(cite, f"{name} has no parameter {', '.join(missing)}")

    def elsewhere(self, name: str) -> str:
        homes = self.ix.defs.get(name, set()) | self.ix.consts.get(name, set())
        return f" (it is in {self.say(homes)})" if homes else " (defined nowhere)"

    @staticmethod
    def say(mods: set[str]) -> str:
        return ", ".join(sorted(mods)[:4]) + (", ..." if len(mods) > 4 else "") if mods else "no module"


def stale_citations() -> list[str]:
    spans, paths = citations()
    checker = Checker()
    for cite in spans:
        checker.check(cite)
    for path, where in paths:
        checker.path_exists(path, where)
    return sorted(set(checker.stale))


# ---------------------------------------------------------------- tests


def test_every_name_contracts_cites_exists_where_it_says():
    stale = stale_citations()
    assert not stale, f"docs/CONTRACTS.md cites {len(stale)} names the code does not have there:\n" + "\n".join(stale)


def test_the_checker_finds_stale_names(tmp_path, monkeypatch):
    """A made-up doc with one stale name of each kind: every one is reported, the true ones are not."""
    doc = tmp_path / "CONTRACTS.md"
    doc.write_text(
        "## core/runs/events.py\n"
        "- `JsonlSink`, `read_events(path, start_line)`, `core.runs.folders.STOP_FILE`, `events.JsonlSink`,\n"
        "  `read_events(path, nowhere)`, `core.train.callbacks.make_callback`, `STOP_FILE`, `gone_function(x)`,\n"
        "  `datafiles.row_line(source)`, core/runs/nothing.py, `python -m core.nothing`, `--no-such-flag`,\n"
        "  `TrainConfig.no_member`, `a_word_no_code_has`.\n"
        "## core/train/callbacks.py\n"
        "- `phase(sink, name, key)`, `STOP_FILE` (a name cited beside a module that does not define it).\n",
        encoding="utf-8")
    monkeypatch.setitem(globals(), "DOC", doc)
    stale = "\n".join(stale_citations())
    for name in ("read_events(path, nowhere)", "make_callback", "`STOP_FILE`", "gone_function", "datafiles",
                 "core/runs/nothing.py", "core.nothing", "--no-such-flag", "no_member", "a_word_no_code_has"):
        assert name in stale, name
    for name in ("`JsonlSink`", "read_events(path, start_line)`", "core.runs.folders.STOP_FILE", "events.JsonlSink",
                 "phase(sink, name, key)"):
        assert name not in stale, name


# ---------------------------------------------------------------- no diary in the code's comments and docstrings

DIARY_DIRS = ("core", "ui", "scripts")
# "issue 44", "run 19's rows", "Run 17 (H200", "2026-12-01": history, not why. A measurement cited as its section of
# bench/RESULTS.md ("bench/RESULTS.md run 24", "RESULTS.md, runs 24-25") is evidence and stays; so does a dated file
# name under bench/results/.
DIARY = re.compile(r"\b[Ii]ssues? #?\d+|(?<!RESULTS\.md )(?<!RESULTS\.md, )(?<!--)\bruns? r?\d+(?:-\d+)?\b|\bRuns? \d+(?: \(|'s)"
                   r"|(?<![/\w-])20\d\d-\d\d-\d\d\b")


def diary_lines(path: Path) -> list[str]:
    """`path:line: text` for each comment or docstring line of a Python file that narrates history."""
    import io
    import tokenize

    source = path.read_text(encoding="utf-8")
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and DIARY.search(tok.string):
            found.append((tok.start[0], tok.string.strip()))
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
                and isinstance(node.body[0].value.value, str)):
            doc = node.body[0].value
            found += [(doc.lineno + i, line.strip()) for i, line in enumerate(doc.value.splitlines())
                      if DIARY.search(line)]
    return [f"{path.relative_to(ROOT)}:{line}: {text}" for line, text in sorted(found)]


def test_no_diary_comments_in_the_code():
    files = [ROOT / "app.py"] + [p for top in DIARY_DIRS for p in sorted((ROOT / top).rglob("*.py"))]
    diary = [line for path in files for line in diary_lines(path)]
    assert not diary, (f"{len(diary)} comment or docstring lines narrate history (say why, in the present tense; a "
                       "measurement is cited as its bench/RESULTS.md section):\n" + "\n".join(diary))


def test_the_diary_pattern(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    code = tmp_path / "m.py"
    code.write_text('"""Measured in bench/RESULTS.md run 24 and RESULTS.md, runs 24-25 (bench/results/2026-11-29-run3.txt).\n\n'
                    'Run 2 started is what the notice says."""\n'
                    "x = 1  # issue 44: a stage\n"
                    "y = 2  # run 19's rows failed here\n"
                    "z = 3  # measured before 2026-12-01\n"
                    "w = 4  # Run 17 (H200) peaked\n"
                    "v = 5  # python m.py --runs 2\n", encoding="utf-8")
    assert [line.split(":")[1] for line in diary_lines(code)] == ["4", "5", "6", "7"]
