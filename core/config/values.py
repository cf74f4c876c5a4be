"""Plain values (YAML scalars, command-line text, widget values) into a config field's type, and the type's name in
messages. core.config.settings.coerce applies it to a TrainConfig field by name."""

from __future__ import annotations

from typing import Any


def type_label(tp: Any) -> str:
    if tp is bool:
        return "true/false"
    if tp is int:
        return "whole number"
    if tp is float:
        return "number"
    if tp == list[str]:
        return "list of names (comma separated on the command line)"
    return "text"


def coerce_to(tp: Any, value: Any) -> Any:
    """Turn a YAML or command-line value into the type `tp`, or raise ValueError saying why not."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1"):
            return True
        if isinstance(value, str) and value.strip().lower() in ("false", "no", "off", "0"):
            return False
        raise ValueError(f"{value!r} is not true or false")
    if tp is int:
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not a whole number")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value).strip())
        except ValueError:
            raise ValueError(f"{value!r} is not a whole number") from None
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{value!r} is not a number") from None
    if tp == list[str]:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ValueError(f"{value!r} is not a list of names")
    if value is None:
        return ""
    if isinstance(value, (list, tuple, dict, set)):  # `model: [a, b]` must not become the text "['a', 'b']"
        raise ValueError(f"{value!r} is a {type(value).__name__}, not a single text value")
    return str(value)
