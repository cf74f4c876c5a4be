"""Plain values (YAML scalars, command-line text, widget values) into a config field's type, and the type's name in
messages. core.config.settings.coerce applies it to a TrainConfig field by name."""

from __future__ import annotations

from typing import Any

from core.messages import Keyed


class ValueProblem(Keyed, ValueError):
    """A value that is not of its field's type: a `value.*` locale key and the value (core.messages.Keyed)."""

    def __init__(self, key: str, **params: Any) -> None:
        super().__init__(self._keyed(key, params))


def type_key(tp: Any) -> str:
    """The locale key of the type's name in messages ("give a whole number")."""
    names = {bool: "bool", int: "int", float: "float"}
    return "value.type." + (names.get(tp) or ("list" if tp == list[str] else "text"))


def coerce_to(tp: Any, value: Any) -> Any:
    """Turn a YAML or command-line value into the type `tp`, or raise ValueError saying why not."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1"):
            return True
        if isinstance(value, str) and value.strip().lower() in ("false", "no", "off", "0"):
            return False
        raise ValueProblem("value.not_bool", value=repr(value))
    if tp is int:
        if isinstance(value, bool):
            raise ValueProblem("value.not_int", value=repr(value))
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value).strip())
        except ValueError:
            raise ValueProblem("value.not_int", value=repr(value)) from None
    if tp is float:
        if isinstance(value, bool):
            raise ValueProblem("value.not_number", value=repr(value))
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueProblem("value.not_number", value=repr(value)) from None
    if tp == list[str]:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ValueProblem("value.not_list", value=repr(value))
    if value is None:
        return ""
    if isinstance(value, (list, tuple, dict, set)):  # `model: [a, b]` must not become the text "['a', 'b']"
        raise ValueProblem("value.not_single", value=repr(value), type=type(value).__name__)
    return str(value)
