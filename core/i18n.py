"""One string table for the whole interface, in English and each language whose table core/locales/ holds.

The tables are data: core/locales/<code>.json, one JSON object per language (key -> text); a language of KNOWN whose
file is absent is simply not offered. English help texts
and checklist texts are not stored there: they are the config fields' own help (their `help` metadata) and
`core.config.checklist.ITEMS`, so they cannot drift. `t(key, lang, **fmt)` returns the text for `key` in `lang` with its
{placeholders} filled; a language or key that is missing falls back to English (then to the key itself), so a gap
shows as English text, never as a crash. Tests check that every key exists in every language with the same
placeholders, and that every key the page asks for exists.

Keys are dotted: `field.<TrainConfig field>` (widget label), `help.<field>` (its help), `checklist.<item key>.label`
/ `.tradeoff` (Portuguese and French in the course chapter's own wording), then one group per part of the page (tab.,
data., run., progress., result., gauge., try., export., history., msg., ...).

`detect_language(accept_language)` picks one of them from a browser's Accept-Language header (default en),
`environment_language()` from LC_ALL / LC_MESSAGES / LANG (the command line's). Numbers are written as each language
writes them by `decimal`, `integer`, `percent` and `byte_unit` (NUMBERS, BYTE_UNITS): the page and the CLI use them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

from core.messages import say

# code -> name shown in the picker, in its own language; the picker's order
KNOWN = {"en": "English", "pt": "Português", "fr": "Français", "es": "Español", "de": "Deutsch",
         "zh": "简体中文", "ja": "日本語", "ko": "한국어"}
DEFAULT_LANGUAGE = "en"
LOCALES = Path(__file__).resolve().parent / "locales"
LANGUAGES = {code: name for code, name in KNOWN.items() if (LOCALES / f"{code}.json").is_file()}
# Chinese written in traditional characters is not the table's: such a header falls through to its next language.
TRADITIONAL = {"hant", "tw", "hk", "mo"}


def _load(code: str) -> dict[str, str]:
    return json.loads((LOCALES / f"{code}.json").read_text(encoding="utf-8"))


def _english() -> dict[str, str]:
    """en.json plus what English takes from the engine itself: the settings' help and the checklist."""
    from dataclasses import fields

    from core.config.checklist import ITEMS
    from core.config.settings import TrainConfig

    table = _load("en")
    table.update({f"help.{f.name}": f.metadata.get("help", "") for f in fields(TrainConfig)})
    for item in ITEMS:
        table[f"checklist.{item.key}.label"], table[f"checklist.{item.key}.tradeoff"] = item.label, item.tradeoff
    return table


EN: dict[str, str] = _english()
STRINGS: dict[str, dict[str, str]] = {code: EN if code == "en" else _load(code) for code in LANGUAGES}


class _Keep(dict):
    """format_map helper: a placeholder without a value stays visible as {name} instead of raising."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def t(key: str, lang: str | None = DEFAULT_LANGUAGE, **fmt: Any) -> str:
    """The text for `key` in `lang` (falling back to English, then to the key), placeholders filled from fmt."""
    table = STRINGS.get(normalize(lang), EN)
    text = table.get(key)
    if text is None:
        text = EN.get(key, key)
    return text.format_map(_Keep(fmt)) if fmt else text


def _code(tag: str) -> str | None:
    """A language tag's table: 'pt-BR' -> 'pt', 'de_DE.UTF-8' -> 'de', 'zh-Hans-CN' -> 'zh'; None when there is none
    ('zh-TW', 'it')."""
    parts = tag.strip().lower().split(".", 1)[0].split("@", 1)[0].replace("_", "-").split("-")
    if parts[0] == "zh" and TRADITIONAL & set(parts[1:]):
        return None
    return parts[0] if parts[0] in STRINGS else None


def normalize(lang: str | None) -> str:
    """'pt-BR' -> 'pt', 'FR' -> 'fr'; anything unsupported -> 'en'."""
    return _code(lang or "") or DEFAULT_LANGUAGE


_TAG = re.compile(r"^\s*([A-Za-z]{1,8}(?:[-_][A-Za-z0-9]{1,8})*|\*)\s*(?:;\s*q\s*=\s*([0-9.]+))?\s*$")


def detect_language(accept_language: str | None) -> str:
    """The best of LANGUAGES for a browser's Accept-Language header ("pt-BR,pt;q=0.9,en;q=0.8"); default en."""
    best, best_q = DEFAULT_LANGUAGE, 0.0
    for order, part in enumerate((accept_language or "").split(",")):
        m = _TAG.match(part)
        if not m or m.group(1) == "*":
            continue
        try:
            q = float(m.group(2)) if m.group(2) is not None else 1.0
        except ValueError:
            continue
        code = _code(m.group(1))
        # Strictly greater: among equal weights the header's first language wins.
        if code and q > best_q and q > 0:
            best, best_q = code, q
    return best


def request_language(request: Any) -> str:
    """detect_language for a request object with .headers (gr.Request, starlette Request); en without one."""
    headers = getattr(request, "headers", None)
    if headers is None:
        return DEFAULT_LANGUAGE
    try:
        return detect_language(headers.get("accept-language"))
    except Exception:  # noqa: BLE001 - a strange request must never break the page
        return DEFAULT_LANGUAGE


def language_choices() -> list[tuple[str, str]]:
    """(name, code) pairs for a language picker."""
    return [(name, code) for code, name in LANGUAGES.items()]


def environment_language(environ: Mapping[str, str]) -> str:
    """The command line's language from the POSIX locale variables: the first set of LC_ALL, LC_MESSAGES, LANG
    ("de_DE.UTF-8" -> de); C, POSIX or a language without a table -> en."""
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        value = environ.get(name, "")
        if value:
            return _code(value) or DEFAULT_LANGUAGE
    return DEFAULT_LANGUAGE


# --- numbers ------------------------------------------------------------------------------------------------------
# (decimal mark, thousands separator) per language: 1,234.5 (en, zh, ja, ko), 1.234,5 (pt, es, de), 1 234,5 (fr,
# narrow no-break space). Spanish groups four-digit numbers too, as the page's tables need one rule per column.
NUMBERS = {"pt": (",", "."), "es": (",", "."), "de": (",", "."), "fr": (",", "\u202f")}
ENGLISH_NUMBERS = (".", ",")
# The binary units as each language writes them: French counts octets (Kio, Mio, Gio); the others write KiB...
BYTE_UNITS = {"fr": ("o", "Kio", "Mio", "Gio", "Tio")}
IEC_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
# a space before % in French, Spanish and German typography; none in English, Portuguese and the CJK languages
SPACED_PERCENT = {"fr", "es", "de"}


def _marks(text: str, lang: str | None) -> str:
    """Python's '1,234.5' with the language's decimal mark and thousands separator."""
    point, group = NUMBERS.get(normalize(lang), ENGLISH_NUMBERS)
    return text.translate({ord("."): point, ord(","): group}) if point != "." else text


def decimal(x: float, digits: int = 1, lang: str | None = DEFAULT_LANGUAGE) -> str:
    """A decimal number as the language writes it: 5.4 (en), 5,4 (pt, fr, es, de); no digit grouping."""
    return _marks(f"{x:.{digits}f}", lang)


def integer(n: int | float, lang: str | None = DEFAULT_LANGUAGE) -> str:
    """A count with the language's digit grouping: 1,698 (en), 1.698 (pt, es, de), 1 698 (fr)."""
    return _marks(f"{round(n):,}", lang)


def formatted(value: int | float, spec: str, lang: str | None = DEFAULT_LANGUAGE) -> str:
    """format(value, spec) ("{loss:.4f}", "{n:,}") with the language's marks; an int without a float spec grouped."""
    if isinstance(value, int) and not spec.endswith(("f", "e", "g", "%")):
        return integer(value, lang)
    try:
        return _marks(format(value, spec) if spec else str(value), lang)
    except ValueError:
        return _marks(str(value), lang)


def percent(x: float, lang: str | None = DEFAULT_LANGUAGE) -> str:
    """A fraction as a whole percentage: 57% (en, pt, zh, ja, ko), 57 % (fr, es, de)."""
    return f"{100 * x:.0f}" + (" %" if normalize(lang) in SPACED_PERCENT else "%")


# the colon between a heading and its text: French sets it off with spaces, Chinese and Japanese write it full-width
COLONS = {"fr": " : ", "zh": "：", "ja": "："}


def colon(lang: str | None = DEFAULT_LANGUAGE) -> str:
    """': ' as the language writes it between a name and what follows (a log line's phase and its message)."""
    return COLONS.get(normalize(lang), ": ")


def byte_units(lang: str | None = DEFAULT_LANGUAGE) -> tuple[str, ...]:
    """B, KiB, MiB, GiB, TiB as the language writes them."""
    return BYTE_UNITS.get(normalize(lang), IEC_UNITS)


def said(key: str, params: dict[str, Any] | None, lang: str | None) -> str:
    """An engine message by its locale key (core.messages.say) in `lang`: the user's values as they are, numbers as
    the language writes them (`formatted`)."""
    return say(key, params, normalize(lang), lookup=lambda k, lg: STRINGS[lg].get(k),
               number=lambda value, lg, spec: formatted(value, spec.replace(",", ""), lg))


def record_words(record: dict[str, Any] | None, english: str, lang: str | None) -> str:
    """A failed run's message (its error event's or summary.json's `key`/`params`/`problems`, core.messages.fields_of)
    in `lang`; `english` (the message as the engine wrote it) for English or a record without them."""
    record = record or {}
    if normalize(lang) == DEFAULT_LANGUAGE or not (record.get("key") or record.get("problems")):
        return english
    if record.get("key"):
        return said(record["key"], record.get("params"), lang)
    problems = record["problems"]
    lines = [t("problem.count", lang, n=integer(len(problems), lang))]
    for p in problems:
        lines.append(f'  - {p.get("field", "")}: {said(p["key"], p.get("params"), lang)} -> '
                     f'{said(p["key"] + ".fix", p.get("params"), lang)}')
    return "\n".join(lines)


def words(event: dict[str, Any], lang: str | None) -> str:
    """An event's (or a recorded message's) words in `lang`: by its key when it carries one, else its message."""
    if event.get("key") and normalize(lang) != DEFAULT_LANGUAGE:
        return said(event["key"], event.get("params"), lang)
    return str(event.get("message", ""))
