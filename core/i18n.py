"""One string table for the whole interface, in English, Portuguese and French.

The tables are data: core/locales/{en,pt,fr}.json, one JSON object per language (key -> text). English help texts
and checklist texts are not stored there: they are the config fields' own help (their `help` metadata) and
`core.config.checklist.ITEMS`, so they cannot drift. `t(key, lang, **fmt)` returns the text for `key` in `lang` with its
{placeholders} filled; a language or key that is missing falls back to English (then to the key itself), so a gap
shows as English text, never as a crash. Tests check that every key exists in every language with the same
placeholders, and that every key the page asks for exists.

Keys are dotted: `field.<TrainConfig field>` (widget label), `help.<field>` (its help), `checklist.<item key>.label`
/ `.tradeoff` (Portuguese and French in the course chapter's own wording), then one group per part of the page (tab.,
data., run., progress., result., gauge., try., export., history., msg., ...).

`detect_language(accept_language)` picks en/pt/fr from a browser's Accept-Language header (default en).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

LANGUAGES = {"en": "English", "pt": "Português", "fr": "Français"}  # code -> name shown in the picker
DEFAULT_LANGUAGE = "en"
LOCALES = Path(__file__).resolve().parent / "locales"


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
PT: dict[str, str] = _load("pt")
FR: dict[str, str] = _load("fr")
STRINGS: dict[str, dict[str, str]] = {"en": EN, "pt": PT, "fr": FR}


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


def normalize(lang: str | None) -> str:
    """'pt-BR' -> 'pt', 'FR' -> 'fr'; anything unsupported -> 'en'."""
    code = (lang or "").strip().lower().replace("_", "-").split("-", 1)[0]
    return code if code in STRINGS else DEFAULT_LANGUAGE


_TAG = re.compile(r"^\s*([A-Za-z]{1,8}(?:[-_][A-Za-z0-9]{1,8})*|\*)\s*(?:;\s*q\s*=\s*([0-9.]+))?\s*$")


def detect_language(accept_language: str | None) -> str:
    """The best of en/pt/fr for a browser's Accept-Language header ("pt-BR,pt;q=0.9,en;q=0.8"); default en."""
    best, best_q = DEFAULT_LANGUAGE, 0.0
    for order, part in enumerate((accept_language or "").split(",")):
        m = _TAG.match(part)
        if not m or m.group(1) == "*":
            continue
        try:
            q = float(m.group(2)) if m.group(2) is not None else 1.0
        except ValueError:
            continue
        code = m.group(1).lower().replace("_", "-").split("-", 1)[0]
        # Strictly greater: among equal weights the header's first language wins.
        if code in STRINGS and q > best_q and q > 0:
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
