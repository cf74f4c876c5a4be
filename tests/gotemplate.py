"""A Go text/template evaluator for the subset memtune writes into Ollama Modelfiles (core/export/gguf_export.py), so
tests can render an Ollama TEMPLATE and compare it with the Hugging Face chat template it stands for.

Supported: literal text, {{- and -}} trimming, {{ .Field }}, {{ "string" }}, {{ $v := "x" }} / {{ $v = .Role }},
{{ if .Field }}, {{ if eq A B }}, {{ else if ... }}, {{ else }}, {{ range .Messages }}, {{ end }}. Anything else
raises, so a template using more than this fails its test instead of rendering wrongly. Ollama's variables:
.Messages (system turns included, as Ollama's collate keeps them), .System (every system turn joined by a blank
line), .Prompt and .Response (the legacy single-turn variables).
"""

from __future__ import annotations

import re

_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


def _tokens(template: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    for m in _ACTION.finditer(template):
        text = template[pos:m.start()]
        if m.group(1):
            text = text.rstrip()
        out.append(("text", text))
        out.append(("action", m.group(2)))
        if m.group(3):
            out.append(("trim", ""))
        pos = m.end()
    out.append(("text", template[pos:]))
    cleaned, trim = [], False
    for kind, value in out:
        if kind == "trim":
            trim = True
            continue
        if kind == "text" and trim:
            value = value.lstrip()
        trim = False
        cleaned.append((kind, value))
    return cleaned


def _parse(tokens, i=0, stop=("end",)):
    """-> (nodes, index of the stopping action, its text)"""
    nodes = []
    while i < len(tokens):
        kind, value = tokens[i]
        if kind == "text":
            nodes.append(("text", value))
            i += 1
            continue
        word = value.split(" ", 1)[0]
        if word in ("end", "else"):
            return nodes, i, value
        if word == "if":
            branches, cond = [], value[3:]
            while True:
                body, i, closing = _parse(tokens, i + 1)
                branches.append((cond, body))
                if closing == "end":
                    break
                cond = closing[8:] if closing.startswith("else if ") else None
                if closing != "else" and not closing.startswith("else if "):
                    raise ValueError(closing)
            nodes.append(("if", branches))
            i += 1
        elif word == "range":
            body, i, closing = _parse(tokens, i + 1)
            if closing != "end":
                raise ValueError("range with else is not supported")
            nodes.append(("range", value[6:], body))
            i += 1
        else:
            nodes.append(("action", value))
            i += 1
    return nodes, i, None


def _value(expr: str, dot, variables):
    expr = expr.strip()
    if expr.startswith('"'):
        return bytes(expr[1:-1], "utf-8").decode("unicode_escape") if "\\" in expr else expr[1:-1]
    if expr.startswith("$"):
        return variables[expr]
    if expr.startswith("."):
        return dot.get(expr[1:], "") if isinstance(dot, dict) else getattr(dot, expr[1:])
    if expr.startswith("eq "):
        a, b = _split(expr[3:])
        return _value(a, dot, variables) == _value(b, dot, variables)
    raise ValueError(f"unsupported expression {expr!r}")


def _split(args: str) -> tuple[str, str]:
    parts = re.findall(r'"(?:[^"\\]|\\.)*"|\S+', args)
    if len(parts) != 2:
        raise ValueError(args)
    return parts[0], parts[1]


def _run(nodes, dot, root, variables, out):
    for node in nodes:
        if node[0] == "text":
            out.append(node[1])
        elif node[0] == "action":
            expr = node[1]
            if m := re.fullmatch(r"(\$\w+)\s*:?=\s*(.+)", expr):
                variables[m.group(1)] = _value(m.group(2), dot, variables)
            else:
                out.append(str(_value(expr, dot, variables)))
        elif node[0] == "if":
            for cond, body in node[1]:
                if cond is None or _value(cond, dot, variables):
                    _run(body, dot, root, variables, out)
                    break
        elif node[0] == "range":
            for item in _value(node[1], root, variables):
                _run(node[2], item, root, variables, out)


def render(template: str, messages: list[dict[str, str]] | None = None, **fields) -> str:
    """Render like Ollama: messages -> .Messages (consecutive turns of one role merged, as collate does) + .System."""
    data = dict(fields)
    if messages is not None:
        merged: list[dict[str, str]] = []
        for m in messages:
            if merged and merged[-1]["role"] == m["role"]:
                merged[-1] = dict(merged[-1], content=merged[-1]["content"] + "\n\n" + m["content"])
            else:
                merged.append(dict(m))
        data["Messages"] = [{"Role": m["role"], "Content": m["content"]} for m in merged]
        data.setdefault("System", "\n\n".join(m["content"] for m in messages if m["role"] == "system"))
    nodes, _, _ = _parse(_tokens(template))
    out: list[str] = []
    _run(nodes, data, data, {}, out)
    return "".join(out)
