"""The scorers: how well one answer (the prediction) matches what a held-out row or a GRPO prompt expects (the
reference), as a number from 0 to 1.

Each scorer is declared once, in SCORERS: its name, its function `score(prediction, reference, **options) -> float`,
the locale key of its label and the options it takes. Held-out evaluation (core/scoring/heldout.py) and GRPO's
rewards call the same functions. `bind(name, **options)` checks the options once (a pattern compiled, a schema read
and checked, a user's function imported) and returns `(prediction, reference) -> float`; every refusal is a
ScorerError with a locale key naming the problem, so the page says it in its language.

A user's own function (`python`, "path/to/file.py:function") is imported in the process that calls bind: the
training child, never the web server; it is refused in public mode, where it would run a visitor's code on the
owner's machine.
"""

from __future__ import annotations

import importlib.util
import json
import math
import numbers
import re
import unicodedata
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

from core.messages import HandsOn, Said
from core.runs.public import is_public

QUOTE = 80  # characters of an answer quoted in a message: enough to recognise it


class ScorerError(HandsOn, ValueError):
    """A scorer cannot be used as asked, or a user's scorer failed: a `score.err.*` key and the user's values."""


@dataclass(frozen=True)
class Scorer:
    name: str
    score: Callable[..., float]  # (prediction, reference, **options) -> float in [0, 1]
    label: str  # locale key of the scorer's name on the page
    options: tuple[str, ...] = ()
    prepare: Callable[..., dict[str, Any]] | None = None  # the options checked and made ready once (bind)


def _quote(text: str) -> str:
    text = str(text)
    return text if len(text) <= QUOTE else text[:QUOTE - 1] + "…"


# --- text ------------------------------------------------------------------------------------------------------------
def normalize(text: str) -> str:
    """NFKC, case folded, punctuation removed (Unicode's P* categories), whitespace collapsed: "  Chat! " -> "chat"."""
    text = unicodedata.normalize("NFKC", str(text)).casefold()
    text = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text)
    return " ".join(text.split())


def exact(prediction: str, reference: str) -> float:
    """The answer is the reference, surrounding whitespace aside (what core.infer.count_exact counts)."""
    return float(str(prediction).strip() == str(reference).strip())


def normalized(prediction: str, reference: str) -> float:
    """The same words once case, punctuation, whitespace and Unicode forms are set aside."""
    return float(normalize(prediction) == normalize(reference))


def contains(prediction: str, reference: str) -> float:
    """The reference appears in the answer (both normalized, on word boundaries: "cat" is not in "concatenate").
    An empty reference scores 0: it would be found in every answer."""
    want, have = normalize(reference), normalize(prediction)
    return float(bool(want) and f" {want} " in f" {have} ")


# --- format ----------------------------------------------------------------------------------------------------------
def pattern_of(pattern: str | re.Pattern) -> re.Pattern:
    """A user's regular expression compiled, or refused naming what is wrong and where."""
    if isinstance(pattern, re.Pattern):
        return pattern
    try:
        return re.compile(str(pattern))
    except re.error as exc:
        raise ScorerError("score.err.bad_regex", pattern=str(pattern), problem=exc.msg,
                          position=exc.pos if exc.pos is not None else "-") from None


def regex(prediction: str, reference: str, pattern: str | re.Pattern | None = None) -> float:
    """The whole answer (surrounding whitespace aside) matches `pattern`; without one, the row's reference is the
    pattern (a format per row)."""
    return float(pattern_of(reference if pattern is None else pattern).fullmatch(str(prediction).strip()) is not None)


def _prepare_regex(pattern: str | None = None) -> dict[str, Any]:
    return {} if pattern is None else {"pattern": pattern_of(pattern)}


# --- numbers ---------------------------------------------------------------------------------------------------------
_DECIMAL = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"  # 1,234.5  3  0.5  .5  1e3
# a sign only where it cannot be a hyphen ("1-2", "x-3"); a fraction: 3/4
NUMBER = re.compile(rf"((?:(?<![\w)])[-+−])?{_DECIMAL})(?:\s*/\s*([-+−]?{_DECIMAL}))?")


def last_number(text: str) -> float | None:
    """The last number written in `text` ("The answer is 1,234.5." -> 1234.5; "3/4" -> 0.75; "-3" -> -3.0;
    "1e3" -> 1000.0), or None (none, or a fraction over 0)."""
    found = NUMBER.findall(str(text))
    if not found:
        return None
    whole, over = found[-1]
    if not over:
        return _float(whole)
    return _float(whole) / _float(over) if _float(over) else None


def _float(text: str) -> float:
    return float(text.replace(",", "").replace("−", "-"))


def _tolerance(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0 or math.isinf(value):
        raise ScorerError("score.err.tolerance", option=name, value=value)
    return float(value)


def numeric(prediction: str, reference: str, abs_tol: float = 1e-6, rel_tol: float = 0.0) -> float:
    """The answer's last number equals the reference's last number within `abs_tol` or `rel_tol` (math.isclose).
    An answer without a number scores 0; a reference without one is refused (the row cannot be scored)."""
    want = last_number(reference)
    if want is None:
        raise ScorerError("score.err.no_reference_number", reference=_quote(reference))
    have = last_number(prediction)
    return float(have is not None and math.isclose(have, want, rel_tol=_tolerance("rel_tol", rel_tol),
                                                   abs_tol=_tolerance("abs_tol", abs_tol)))


def _prepare_numeric(abs_tol: float = 1e-6, rel_tol: float = 0.0) -> dict[str, Any]:
    return {"abs_tol": _tolerance("abs_tol", abs_tol), "rel_tol": _tolerance("rel_tol", rel_tol)}


# --- JSON ------------------------------------------------------------------------------------------------------------
# The subset of JSON Schema checked here (the jsonschema package is no dependency of memtune): structure, types and
# bounds. A keyword outside it is refused rather than ignored, so a schema never passes answers it would fail.
TYPES = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float), "boolean": bool,
         "null": type(None)}
KEYWORDS = ("type", "properties", "required", "additionalProperties", "items", "enum", "const", "minimum",
            "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems",
            "maxItems", "anyOf")
ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "default", "examples"}


def schema_of(schema: dict | str) -> dict:
    """A schema given as a dict, as JSON text, or as the path of a .json file: read and checked against the subset."""
    if isinstance(schema, str):
        text = schema.strip()
        if not text.startswith("{") and is_public():  # a file on the server's machine: never a visitor's to read
            raise ScorerError("score.err.public_schema_path", schema=_quote(text))
        try:
            schema = json.loads(text if text.startswith("{") else Path(text).expanduser().read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ScorerError("score.err.schema_unreadable", schema=_quote(text), problem=str(exc)) from None
    _check_schema(schema, "#")
    return schema


def _check_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise ScorerError("score.err.schema_not_object", where=where)
    for keyword, value in schema.items():
        if keyword not in KEYWORDS and keyword not in ANNOTATIONS:
            raise ScorerError("score.err.schema_keyword", keyword=keyword, where=where, items=list(KEYWORDS))
    for name in [schema["type"]] if isinstance(schema.get("type"), str) else schema.get("type", []):
        if name not in TYPES:
            raise ScorerError("score.err.schema_type", value=name, where=where, items=list(TYPES))
    for name, sub in schema.get("properties", {}).items():
        _check_schema(sub, f"{where}/properties/{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            _check_schema(schema[key], f"{where}/{key}")
    for i, sub in enumerate(schema.get("anyOf", [])):
        _check_schema(sub, f"{where}/anyOf/{i}")
    if "pattern" in schema:
        pattern_of(schema["pattern"])


def _is(value: Any, name: str) -> bool:
    if isinstance(value, bool) and name not in ("boolean",):
        return False  # JSON's true is no number
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, TYPES[name])


def conforms(value: Any, schema: dict) -> bool:
    """`value` (parsed JSON) satisfies `schema` (checked by schema_of)."""
    kinds = schema.get("type")
    if kinds is not None and not any(_is(value, k) for k in ([kinds] if isinstance(kinds, str) else kinds)):
        return False
    if "enum" in schema and value not in schema["enum"] or "const" in schema and value != schema["const"]:
        return False
    if "anyOf" in schema and not any(conforms(value, sub) for sub in schema["anyOf"]):
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not (schema.get("minimum", value) <= value <= schema.get("maximum", value)
                and ("exclusiveMinimum" not in schema or value > schema["exclusiveMinimum"])
                and ("exclusiveMaximum" not in schema or value < schema["exclusiveMaximum"])):
            return False
    if isinstance(value, str):
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
            return False
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return False  # JSON Schema's pattern is a search, not a full match
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            return False
        if isinstance(schema.get("items"), dict) and not all(conforms(v, schema["items"]) for v in value):
            return False
    if isinstance(value, dict):
        if any(name not in value for name in schema.get("required", [])):
            return False
        properties, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                if not conforms(item, properties[name]):
                    return False
            elif extra is False or isinstance(extra, dict) and not conforms(item, extra):
                return False
    return True


def parsed_json(text: str) -> tuple[bool, Any]:
    """(found, value): the JSON an answer holds, the whole answer or the first object or array in it (a model often
    wraps it in words or a ```json fence)."""
    text = str(text).strip()
    try:
        return True, json.loads(text)
    except ValueError:
        pass
    decoder = json.JSONDecoder()
    for start in [i for i, ch in enumerate(text) if ch in "{["][:20]:
        try:
            return True, decoder.raw_decode(text, start)[0]
        except ValueError:
            continue
    return False, None


def json_schema(prediction: str, reference: str, schema: dict | str | None = None) -> float:
    """The answer holds JSON that satisfies `schema` (a dict, JSON text or a .json file's path); without a schema,
    the row's reference is the schema."""
    found, value = parsed_json(prediction)
    return float(found and conforms(value, schema_of(reference if schema is None else schema)))


def _prepare_json(schema: dict | str | None = None) -> dict[str, Any]:
    return {} if schema is None else {"schema": schema_of(schema)}


# --- the user's own ---------------------------------------------------------------------------------------------------
def user_function(spec: str | Callable) -> Callable[[str, str], Any]:
    """"path/to/file.py:function" imported from the file (in this process), refused in public mode; each failure
    named: the spelling, a missing file, the import's own error, a missing or uncallable name."""
    if callable(spec):
        return spec
    if is_public():
        raise ScorerError("score.err.public_function")
    path, _, name = str(spec).rpartition(":")
    if not path.endswith(".py") or not name.isidentifier():
        raise ScorerError("score.err.function_spec", spec=str(spec))
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ScorerError("score.err.function_file", path=str(file))
    loader = importlib.util.spec_from_file_location(f"memtune_scorer_{file.stem}", file)
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except BaseException as exc:  # a user's file: a SyntaxError or a SystemExit is as much its error as a ValueError
        raise ScorerError("score.err.function_import", path=str(file), error=f"{type(exc).__name__}: {exc}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ScorerError("score.err.function_missing", path=str(file), function=name)
    return function


def python(prediction: str, reference: str, function: str | Callable | None = None) -> float:
    """The user's function(prediction, reference), which must return a number from 0 to 1."""
    if function is None:
        raise ScorerError("score.err.function_spec", spec="")
    call = user_function(function)
    label = getattr(call, "__name__", str(function))
    try:
        value = call(prediction, reference)
    except Exception as exc:
        raise ScorerError("score.err.function_raised", function=label, error=f"{type(exc).__name__}: {exc}",
                          prediction=_quote(prediction)) from None
    if not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:  # NaN fails the bounds too
        raise ScorerError("score.err.function_value", function=label, value=_quote(repr(value)),
                          prediction=_quote(prediction))
    return float(value)


def _prepare_python(function: str | Callable | None = None) -> dict[str, Any]:
    if function is None:
        raise ScorerError("score.err.function_spec", spec="")
    return {"function": user_function(function)}


# --- the registry --------------------------------------------------------------------------------------------------
SCORERS: dict[str, Scorer] = {s.name: s for s in (
    Scorer("exact", exact, "score.name.exact"),
    Scorer("normalized", normalized, "score.name.normalized"),
    Scorer("contains", contains, "score.name.contains"),
    Scorer("regex", regex, "score.name.regex", ("pattern",), _prepare_regex),
    Scorer("numeric", numeric, "score.name.numeric", ("abs_tol", "rel_tol"), _prepare_numeric),
    Scorer("json_schema", json_schema, "score.name.json_schema", ("schema",), _prepare_json),
    Scorer("python", python, "score.name.python", ("function",), _prepare_python),
)}


def bind(name: str, **options: Any) -> Callable[[str, str], float]:
    """The scorer `name` with its options checked and made ready once: `(prediction, reference) -> float`."""
    scorer = SCORERS.get(name)
    if scorer is None:
        raise ScorerError("score.err.unknown", name=name, items=list(SCORERS))
    for option in options:
        if option not in scorer.options:
            raise ScorerError("score.err.unknown_option", name=name, option=option,
                              items=list(scorer.options) or ["-"])
    ready = scorer.prepare(**options) if scorer.prepare else {}
    return partial(scorer.score, **ready)


def accepts(name: str, reference: str, **options: Any) -> Said:
    """What scorer `name` (with its options) accepts as the answer to a row whose reference is `reference`, said:
    the page's preview of the held-out scorer. Options that cannot be used raise ScorerError, as bind does. A user's
    function is named, never imported: the page's process runs no user code."""
    if name == "python":
        return Said("score.accepts.python", function=_quote(str(options.get("function", ""))))
    ready = bind(name, **options).keywords  # checked as the run checks them: a bad pattern is named here too
    ref = _quote(str(reference).strip())
    if name == "exact":
        return Said("score.accepts.exact", reference=ref)
    if name == "normalized":
        return Said("score.accepts.normalized", reference=_quote(normalize(reference)))
    if name == "contains":
        want = normalize(reference)
        return Said("score.accepts.contains", reference=_quote(want)) if want else Said("score.accepts.nothing")
    if name == "regex":
        pattern = ready["pattern"].pattern if "pattern" in ready else pattern_of(str(reference)).pattern
        return Said("score.accepts.regex", pattern=_quote(pattern))
    if name == "numeric":
        want = last_number(reference)
        if want is None:
            return Said("score.accepts.no_number", reference=ref)
        tolerance = max(ready["abs_tol"], ready["rel_tol"] * abs(want))
        return Said("score.accepts.numeric", number=f"{want:g}", tolerance=f"{tolerance:g}")
    schema = ready.get("schema") or schema_of(str(reference))  # json_schema: the option's, else the row's
    return Said("score.accepts.json_schema", schema=_quote(json.dumps(schema, ensure_ascii=False)))


def completion_text(completion: Any) -> str:
    """A TRL completion as text: a string as it is, a conversational one's last message's content."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


class Reward:
    """A scorer as GRPOTrainer's reward function: `(prompts, completions, **columns) -> [float]`, each completion
    scored against its row's `column` (a scorer that needs none, a pattern or a schema given, reads ""). Its
    `__name__` is the scorer's, so TRL logs rewards/<name>/mean; it pickles as its name and options (TRL's reward
    forms are picklable), bound again where it is unpickled."""

    def __init__(self, name: str, column: str = "reference", **options: Any) -> None:
        self.__name__, self.column, self.options = name, column, options
        self.score = bind(name, **options)

    def __call__(self, prompts: list, completions: list, **columns: Any) -> list[float]:
        references = columns.get(self.column) or [""] * len(completions)
        return [self.score(completion_text(c), str(r)) for c, r in zip(completions, references, strict=True)]

    def __reduce__(self) -> tuple:
        return _reward, (self.__name__, self.column, self.options)


def _reward(name: str, column: str, options: dict[str, Any]) -> Reward:
    return Reward(name, column, **options)
