"""Engine messages that carry a key and their parameters, so a page can say them in its own language.

A `DataError`, `ModelError` or configuration `Problem` is raised with a locale key (core/locales/*.json) and the
user's values (file names, line numbers, column and field names). Its English text is en.json's, filled here, so
the engine's log and CLI say what they always said; the error event carries `key` + `params` next to that English
message, and the page renders the same key in pt or fr. A parameter may itself be a message ({"key", "params"}),
said in the same language (e.g. the reason a JSON line failed, inside the line's message).

This module is a leaf (json + pathlib only): core.config.settings and core.data.read import it, and core.i18n
(which imports the settings for their help texts) cannot be imported from there without a circle.
"""

from __future__ import annotations

import json
import string
from functools import cache
from pathlib import Path
from typing import Any, Callable

LOCALES = Path(__file__).resolve().parent / "locales"
# list parameters, by name, and their separator when said (msg.lines, msg.list, log.lora_more)
_JOIN = {"lines": "\n", "items": ", ", "parts": "; "}


@cache
def table(code: str) -> dict[str, str]:
    """core/locales/<code>.json as a dict (read once)."""
    return json.loads((LOCALES / f"{code}.json").read_text(encoding="utf-8"))


class Said(str):
    """English text (what the engine has always returned) that also carries its key + params: a helper that returns
    a reason as a string (e.g. output_problem) stays a string for its callers, and nests as a message in a keyed one."""

    key: str
    params: dict[str, Any]

    def __new__(cls, key: str, **params: Any) -> "Said":
        params = {k: plain(v, k) for k, v in params.items()}
        text = super().__new__(cls, say(key, params))
        text.key, text.params = key, params
        return text


def plain(value: Any, name: str = "") -> Any:
    """A parameter as the event file can hold it: numbers and text as they are, nested messages kept, a list of
    messages under a list parameter's name (msg.lines' `lines`, msg.list's `items`, `parts`) kept, else str() (a
    user's list of column names reads as it always has)."""
    if isinstance(value, (Keyed, Said)):
        return {"key": value.key, "params": value.params}
    if isinstance(value, dict) and "key" in value:
        return {"key": value["key"], "params": {k: plain(v, k) for k, v in (value.get("params") or {}).items()},
                **({"english": str(value["english"])} if value.get("english") else {})}
    if isinstance(value, (list, tuple)) and name in _JOIN:
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return str(value)
    return value if isinstance(value, (int, float, str)) else str(value)


class _Fill(string.Formatter):
    """str.format_map with a language's numbers: a placeholder's format spec ("{n:,}", "{loss:.4f}") is the locale
    text's, applied by `number(value, lang, spec)` when given (the page's digit grouping and decimal comma), else by
    Python's format(); a placeholder without a value stays visible as {name} instead of raising."""

    def __init__(self, lang: str, number: Callable[[int | float, str, str], str] | None) -> None:
        self.lang, self.number = lang, number

    def get_value(self, key: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        return kwargs[key] if key in kwargs else _Missing(key)

    def format_field(self, value: Any, spec: str) -> str:
        if isinstance(value, _Missing):
            return "{" + value.name + (":" + spec if spec else "") + "}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.number is not None:
                return self.number(value, self.lang, spec)
            try:
                return format(value, spec)
            except ValueError:  # a spec for another type ("{n:.1f}" given an int that cannot take it): as written
                return str(value)
        return format(str(value), spec if spec and not spec[-1:] in "df,%" else "")


class _Missing:
    def __init__(self, name: str) -> None:
        self.name = name


def say(key: str, params: dict[str, Any] | None = None, lang: str = "en",
        lookup: Callable[[str, str], str | None] | None = None,
        number: Callable[[int | float, str, str], str] | None = None, english: str | None = None) -> str:
    """The text of `key` in `lang` with `params` filled (nested messages said in `lang` too). `english`: the text
    when no locale file has the key (a name core.i18n declares from the code, as a checklist item's label: named()).

    `lookup(key, lang)` finds a language's text (default: the locale files; a missing key or language falls back to
    English, then to the key); `number(value, lang, spec)` writes a number as the language does, given the locale
    text's format spec (default: Python's format, so en.json's "{n:,}" writes 1,234). The page passes core.i18n's
    table and its own digit grouping, the engine neither."""
    find = lookup or (lambda k, lg: table(lg).get(k) if (LOCALES / f"{lg}.json").is_file() else None)
    text = find(key, lang) or table("en").get(key) or english or key
    values = {}
    for name, value in (params or {}).items():
        values[name] = _said(value, lang, lookup, number, _JOIN.get(name, ", "))
    try:
        return _Fill(lang, number).vformat(text, (), values)
    except (ValueError, IndexError, AttributeError, KeyError):  # a malformed locale text: say it unfilled, never raise
        return text


def _said(value: Any, lang: str, lookup: Any, number: Any, sep: str) -> Any:
    """A parameter in `lang`: a nested message said, a list said item by item and joined by `sep` (msg.lines' `lines`:
    a line each; msg.list's `items`: ", "; `parts`: "; "), anything else as is."""
    if isinstance(value, dict) and "key" in value:
        return say(value["key"], value.get("params"), lang, lookup, number, value.get("english"))
    if isinstance(value, list):
        return sep.join(str(_said(v, lang, lookup, number, sep)) for v in value)
    return value


def named(key: str, english: str) -> dict[str, Any]:
    """A name as a nested message: its key for a page (core.i18n's table holds it in every language) and its English
    for the engine's own text, where en.json lacks it (a checklist item's label comes from core.config.checklist)."""
    return {"key": key, "params": {}, "english": english}


def lines(*parts: Any) -> "Said":
    """Several messages (or texts quoted as they are: a log's last lines) as one, a line each: key msg.lines."""
    return Said("msg.lines", lines=[p for p in parts if p])


def said_again(key: str, params: dict[str, Any]) -> "Said":
    """A message recorded before (an error's, an event's, a resolved change's) said again as a Said: its key was
    checked where it was first said (tests/test_messages.py checks every other Said for a literal key)."""
    return Said(key, **params)


def words_of(text: str) -> dict[str, Any]:
    """An event's words for a text that may carry its key (a Said): keyed()'s fields, or the message alone (a text
    from outside memtune: an exception's str, a log's tail). `make_event("log", level="info", **words_of(note))`."""
    if isinstance(text, Said):
        return {"key": text.key, "params": text.params, "message": str(text)}
    return {"message": str(text)}


def keyed(key: str, **params: Any) -> dict[str, Any]:
    """An event's words: `key` and its `params` (what a page says in its language) and `message`, en.json's text
    filled (what the CLI prints and an events.jsonl reader sees). `make_event("log", level="info", **keyed(...))`."""
    values = {k: plain(v, k) for k, v in params.items()}
    return {"key": key, "params": values, "message": say(key, values)}


def english(key: str, **params: Any) -> str:
    """en.json's text for `key`, filled: what the engine writes to its log and the CLI."""
    return say(key, {k: plain(v, k) for k, v in params.items()})


class Keyed:
    """Mixin for exceptions whose message is a locale key + parameters; str() is the English text."""

    key: str = ""
    params: dict[str, Any]

    def _keyed(self, key: str, params: dict[str, Any]) -> str:
        self.key, self.params = key, {k: plain(v, k) for k, v in params.items()}
        return say(key, self.params)


class HandsOn(Keyed):
    """Mixin for a keyed exception made from a key and its parameters, or from a message handed on whole (a Said,
    e.g. core.infer.said(exc)): the key travels with the words either way."""

    def __init__(self, key: "str | Said", **params: Any) -> None:
        if isinstance(key, Said):
            key, params = key.key, key.params
        super().__init__(self._keyed(key, params))


def fields_of(exc: BaseException) -> dict[str, Any]:
    """What an error event and summary.json carry beside the English message so a page can say it in its language:
    {"key", "params"} for a keyed error, {"problems": [{"field", "key", "params"}, ...]} for a ConfigError whose
    problems are keyed; {} for anything else (the page then shows the English message)."""
    if isinstance(exc, Keyed) and exc.key:
        return {"key": exc.key, "params": exc.params}
    problems = getattr(exc, "problems", None)
    if problems and all(getattr(p, "key", "") for p in problems):
        return {"problems": [{"field": p.field, "key": p.key, "params": dict(p.params)} for p in problems]}
    return {}


class SaidLine(str):
    """A log line (English, as the engine wrote it) that also carries its message's key + params (`said`, from
    fields_of) and the event kind, so a page can say it in its language without matching the English text."""

    said: dict[str, Any]
    kind: str
    head: dict[str, Any]  # what frames the message: level, error_type, status, phase, seconds (core.jobs.view)
    english: str  # the message alone, as the engine wrote it (the line without its time and frame)

    def __new__(cls, text: str, said: dict[str, Any], kind: str, english: str = "", **head: Any) -> "SaidLine":
        line = super().__new__(cls, text)
        line.said, line.kind, line.english, line.head = said, kind, english, head
        return line


def said_of(record: dict[str, Any]) -> dict[str, Any]:
    """The key/params/problems an event or a failed summary.json carries ({} for old runs without them)."""
    return {k: record[k] for k in ("key", "params", "problems") if k in record}
