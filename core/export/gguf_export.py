"""The GGUF export as users run it (Export tab, `python -m core.export gguf`): plan (RAM and disk, said before
anything starts), merge the adapter into its base (core.export.adapter.merge_adapter), convert to each chosen format
(core.export.gguf), write an Ollama Modelfile and a README with the exact commands, rename the folder into place.

Layout of the result (default: the run's folder/gguf):
    <name>-f16.gguf, <name>-q8_0.gguf, ...   one file per format
    Modelfile                                 Ollama: FROM the smallest file, TEMPLATE, stop tokens
    README.md                                 the run's model card (core.runs.card), then ollama create / ollama run /
                                              llama-cli commands, run in this folder (relative paths only)
    .memtune.json                             memtune's marker (kind export): formats, files, source
The files carry llama.cpp's naming keys (general.name, basename, finetune, base_model.*: gguf.naming) and the mode of
every other file; the Ollama name keeps to Ollama's rules (ollama_name), and the plan says when it was shortened.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.files import plain_mode
from core.messages import Said
from core.runs.card import adapter_card
from core.export.gguf import (FORMATS, KQUANTS, GiB, MiB, GGUFError, Progress, architecture, file_bytes,
                       metadata_bytes, naming, parse_formats, read_config, tensor_plan,
                       tokenizer_metadata, write_gguf)
from core.export.kquant import kquant_library, planned_bytes, quantize

DEMO_PROMPT = "Translate the word 'cat' into French."
# Ollama's model names (its types/model/name.go): at most 80 characters, a letter, digit or underscore first, then
# those, "-" and "."; _slug gives the characters, ollama_name the length.
OLLAMA_NAME_MAX = 80
# The llama.cpp release the printed commands and the tests were checked against: the one node-llama-cpp bundles
# (tests/llama/package.json pins it; tests/test_llama.py checks the harness reports this same release).
LLAMA_CPP_VERSION = "v0.4.0"
# Trimming in Go's text/template, which has no trim function nor loops over a string: templates that call themselves
# on the string less one whitespace character at either end (index gives a byte; len (slice . N) is len - N). The
# whitespace is Python's str.strip's (Jinja's trim, memtune's prompt): ASCII, U+0085, U+00A0 and the 3-byte spaces.
_WS2 = ("\u0085", "\u00a0")
_WS3 = ("\u1680", *(chr(c) for c in range(0x2000, 0x200B)), "\u2028", "\u2029", "\u202f", "\u205f", "\u3000")


def _whitespace_at(end: bool) -> str:
    """Go template actions setting $n to the byte length of the whitespace character at the start (or end) of the
    string in dot, 0 when there is none."""
    def at(k: int) -> str:
        return f"(slice . (len (slice . {k})))" if end else f"(slice . 0 {k})"

    def lits(chars) -> str:
        return " ".join(f'"\\u{ord(c):04x}"' for c in chars)

    first = "(index . (len (slice . 1)))" if end else "(index . 0)"
    return ('{{ $n := 0 }}{{ if . }}{{ if eq ' + first + ' 9 10 11 12 13 28 29 30 31 32 }}{{ $n = 1 }}'
            '{{ else if and (ge (len .) 2) (eq ' + at(2) + ' ' + lits(_WS2) + ') }}{{ $n = 2 }}'
            '{{ else if and (ge (len .) 3) (eq ' + at(3) + ' ' + lits(_WS3) + ') }}{{ $n = 3 }}{{ end }}{{ end }}')


# {{ template "memtune-trim" X }} prints X stripped; "memtune-input" prints memtune's Input section for X, stripped,
# or nothing when X is blank (core.data.formats.default_prompt)
GO_TRIM = ('{{- define "memtune-trim-right" }}' + _whitespace_at(True) +
           '{{ if $n }}{{ template "memtune-trim-right" (slice . 0 (len (slice . $n))) }}{{ else }}{{ . }}{{ end }}'
           '{{ end }}'
           '{{- define "memtune-trim" }}' + _whitespace_at(False) +
           '{{ if $n }}{{ template "memtune-trim" (slice . $n) }}{{ else }}{{ template "memtune-trim-right" . }}'
           '{{ end }}{{ end }}')
GO_INPUT = ('{{- define "memtune-input" }}' + _whitespace_at(False) +
            '{{ if $n }}{{ template "memtune-input" (slice . $n) }}'
            '{{ else if . }}### Input:\n{{ template "memtune-trim-right" . }}\n\n{{ end }}{{ end }}')
# Without a chat template memtune trained on its Alpaca-style prompt (core.data.formats._render_default, which
# gguf.MEMTUNE_CHAT_TEMPLATE, the GGUF's own chat template, writes in Jinja): the last user turn is the instruction; a
# lone system turn, or every other turn as "Role: content" lines, the Input section. The same rules over Ollama's
# .Messages in Go's text/template, which has no arithmetic: the first range finds the last message (and the one
# before it), the second the last user turn. A trailing assistant message is Ollama's prefill, written after the
# Response header. The instruction and the Input section are stripped as in training; an earlier turn of whitespace
# only is kept as a "Role: " line (training leaves it out: a Go template cannot test a string for blankness).
# tests/test_modelfile.py renders it with Ollama's own template code.
PLAIN_TEMPLATE = GO_TRIM + GO_INPUT + (
    '{{- $last := -1 }}{{- $prev := -1 }}{{- $lastRole := "" }}'
    '{{- range $i, $m := .Messages }}{{ $prev = $last }}{{ $last = $i }}{{ $lastRole = $m.Role }}{{ end }}'
    '{{- $end := $last }}{{- if eq $lastRole "assistant" }}{{ $end = $prev }}{{ end }}'
    '{{- $at := -1 }}'
    '{{- range $i, $m := .Messages }}{{ if and (le $i $end) (eq $m.Role "user") }}{{ $at = $i }}{{ end }}{{ end }}'
    '{{- if or (eq $at -1) (eq $end 0) }}{{ $at = $end }}{{ end }}'
    '{{- $context := "" }}{{- $lone := false }}'
    '{{- if eq $end 1 }}{{ range $i, $m := .Messages }}'
    '{{ if and (le $i $end) (ne $i $at) (eq $m.Role "system") }}{{ $context = $m.Content }}{{ $lone = true }}{{ end }}'
    '{{ end }}{{ end }}'
    '{{- if not $lone }}{{ range $i, $m := .Messages }}{{ if and (le $i $end) (ne $i $at) $m.Content }}'
    '{{ $role := $m.Role }}{{ if eq $role "user" }}{{ $role = "User" }}{{ else if eq $role "assistant" }}'
    '{{ $role = "Assistant" }}{{ else if eq $role "system" }}{{ $role = "System" }}{{ else if eq $role "tool" }}'
    '{{ $role = "Tool" }}{{ end }}'
    '{{ if $context }}{{ $context = printf "%s\\n%s: %s" $context $role $m.Content }}'
    '{{ else }}{{ $context = printf "%s: %s" $role $m.Content }}{{ end }}'
    '{{ end }}{{ end }}{{ end }}'
    '{{- if ge $at 0 }}### Instruction:\n{{ template "memtune-trim" (index .Messages $at).Content }}\n\n'
    '{{ template "memtune-input" $context }}### Response:\n{{ end }}'
    '{{- if and (eq $lastRole "assistant") (ge $end 0) }}{{ (index .Messages $last).Content }}{{ end }}')
# Try it answers greedily without a repetition penalty (Ollama's defaults: temperature 0.8, repeat_penalty 1.1)
OLLAMA_SAMPLING = {"temperature": 0, "top_k": 1, "top_p": 1, "repeat_penalty": 1}
# Sentinel contents for reading a chat template's pieces: no whitespace, so templates that trim contents show them
# unchanged.
_SENTINELS = {"system": "SYS\u2063S1", "user": "USR\u2063U1", "assistant": "AST\u2063A1", "user2": "USR\u2063U2"}


def chat_pieces(render) -> dict[str, str]:
    """The text a chat template puts around messages, read off `render(messages, add_generation_prompt)`:
    start_user (no system turn: the template's default system turn, if any, + the user header), start_system,
    system_user, user_assistant, assistant_user and user_end (end of turn + the generation prompt), and where the
    system text goes (fold): None, a turn of its own; "last", inside the last message when it is the user's
    (Mistral's [INST] templates); "next", inside the next user turn (llama.cpp's folding for templates without a
    system role, Gemma's: the template's refusal is kept in system_error).
    GGUFError when the template renders messages in an order none of these express."""
    S = _SENTINELS
    u = render([{"role": "user", "content": S["user"]}], True)
    uau = render([{"role": "user", "content": S["user"]}, {"role": "assistant", "content": S["assistant"]},
                  {"role": "user", "content": S["user2"]}], True)
    system_error = None
    try:
        su = render([{"role": "system", "content": S["system"]}, {"role": "user", "content": S["user"]}], True)
    except Exception as exc:  # noqa: BLE001 - Gemma's templates raise on a system turn: llama.cpp folds it instead
        su, system_error = None, f"{type(exc).__name__}: {exc}"

    def cut(text: str, *marks: str) -> list[str]:
        parts, rest = [], text
        for mark in marks:
            if rest.count(mark) != 1:
                raise GGUFError("gguf.err.template_order")
            head, rest = rest.split(mark)
            parts.append(head)
        return parts + [rest]

    start_user, user_end = cut(u, S["user"])
    uau_start, user_assistant, assistant_user, uau_end = cut(uau, S["user"], S["assistant"], S["user2"])
    if uau_start != start_user or uau_end != user_end:
        raise GGUFError("gguf.err.template_follows")
    base = dict(start_user=start_user, user_assistant=user_assistant, assistant_user=assistant_user,
                user_end=user_end, system_error=system_error, trim=[])
    if su is None:  # llama.cpp's folding: the system text, a blank line, then the first user message
        candidates = [dict(base, start_system=None, system_user=FOLD_SEPARATOR, fold="next")]
    else:
        start_system, system_user, su_end = cut(su, S["system"], S["user"])
        if su_end != user_end:
            raise GGUFError("gguf.err.template_follows")
        candidates = [dict(base, start_system=start_system, system_user=system_user, fold=None)]
        if start_system == start_user:  # the system text inside a user turn: the next one, or only the last
            candidates += [dict(base, start_system=start_system, system_user=system_user, fold=fold)
                           for fold in ("next", "last")]
    pieces = next((c for c in candidates if _rebuilds(c, render)), None)
    if pieces is None:
        raise GGUFError("gguf.err.template_conversation")
    # Which roles' content the template strips (Llama-3.1's and Gemma-2's `| trim`): the Ollama template does too.
    # A role rendered neither stripped nor as sent (Qwen3 drops reasoning) is left as sent.
    pad = " \n\u00a0"
    padded = {"user": [{"role": "user", "content": pad + S["user"] + pad}],
              "assistant": [{"role": "user", "content": S["user"]},
                            {"role": "assistant", "content": pad + S["assistant"] + pad},
                            {"role": "user", "content": S["user2"]}]}
    if su is not None:
        padded["system"] = [{"role": "system", "content": pad + S["system"] + pad},
                            {"role": "user", "content": S["user"]}]
    trim = []
    for role, messages in padded.items():
        if render(messages, True) == render_pieces(dict(pieces, trim=[role]), messages):
            trim.append(role)
    if su is None and "user" in trim:  # llama.cpp trims the folded system text as it trims the turns (Gemma)
        trim.append("system")
    pieces["trim"] = trim
    return pieces


# Between the system text and the user's where a template without a system role gets it folded in (llama.cpp's
# llm_chat_apply_template for Gemma and Mistral v1-v3, and Ollama's own Mistral template)
FOLD_SEPARATOR = "\n\n"
CHECK_CONVERSATIONS = [
    [{"role": "system", "content": "SYS"}, {"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"},
     {"role": "user", "content": "U2"}],
    [{"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"},
     {"role": "assistant", "content": "A2"}, {"role": "user", "content": "U3"}],
    [{"role": "system", "content": "SYS"}, {"role": "user", "content": "U1"}],
]


def folded(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """llama.cpp's folding for a template without a system role: the system text, stripped, and a blank line
    start the first user message after it."""
    out, system = [], None
    for m in messages:
        if m["role"] == "system":
            system = m["content"].strip()
        elif m["role"] == "user" and system is not None:
            out.append(dict(m, content=(system + FOLD_SEPARATOR if system else "") + m["content"].strip()))
            system = None
        else:
            out.append(dict(m))
    return out


def _rebuilds(pieces: dict[str, Any], render) -> bool:
    """Whether `pieces` rebuild longer conversations as the template renders them (or, where it refuses system
    turns, as it renders them folded)."""
    for messages in CHECK_CONVERSATIONS:
        expected = render(folded(messages) if pieces["system_error"] else messages, True)
        if render_pieces(pieces, messages) != expected:
            return False
    return True


def render_pieces(pieces: dict[str, str | None], messages: list[dict[str, str]]) -> str:
    """What go_chat_template's TEMPLATE renders for `messages` (the same rules, in Python)."""
    out, prev, fold, system = [], "", pieces.get("fold"), None
    trim = pieces.get("trim") or ()
    for i, m in enumerate(messages):
        role, content = m["role"], m["content"].strip() if m["role"] in trim else m["content"]
        if role == "system":
            if fold:
                system = content
                continue
            if pieces["start_system"] is None:
                raise GGUFError("gguf.err.template_system")
            out.append(pieces["start_system"])
        elif role == "user":
            out.append(pieces["system_user"] if prev == "system" else
                       pieces["assistant_user"] if prev == "assistant" else pieces["start_user"])
            if system is not None and (fold == "next" or i == len(messages) - 1):
                if system or fold == "last":  # llama.cpp folds no empty system text; Mistral's template does
                    content = system + pieces["system_user"] + content
                system = None
        elif role == "assistant":
            out.append(pieces["user_assistant"])
        out.append(content)
        prev = role
    return "".join(out) + pieces["user_end"]


def _go(text: str) -> str:
    """Literal text inside a Go template that Ollama's Modelfile parser reads back unchanged: "{{" would start an
    action; a third double quote in a row could end the TEMPLATE's triple-quoted value early (Ollama's parser stops
    at three quotes then a space or newline, and reads what follows as Modelfile commands: SYSTEM, ADAPTER...);
    characters the parser drops (it keeps only printable ones, tab and newlines) would vanish. Each becomes a Go
    string action that prints it."""
    def escape(m: re.Match) -> str:
        piece = m.group(0)
        if piece == "{{":
            return '{{ "{{" }}'
        if piece == '"':
            return '{{ "\\"" }}'
        if piece in "\n\t" or piece.isprintable():
            return piece
        code = ord(piece)
        return '{{ "' + (f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}") + '" }}'

    return re.sub(r'\{\{|(?<="")"|.', escape, text, flags=re.S)


def _go_error(text: str) -> str:
    """A Go template action that stops rendering with an error quoting `text` (slicing a string past its end):
    Ollama answers the request with that error, as the chat template raises it in transformers."""
    literal = json.dumps(" ".join(text.split()))  # a valid Go string literal: no newline, quotes escaped
    return "{{ slice " + literal + f" {len(literal.encode('utf-8')) + 1} }}}}"


def go_chat_template(pieces: dict[str, str], bos: str | None) -> str:
    """An Ollama TEMPLATE over .Messages that renders what the chat template renders (pieces: chat_pieces), less
    the leading BOS text when llama.cpp's tokenizer adds BOS itself (bos = that text). A system text that the chat
    template folds into a user turn (pieces["fold"]) is held in $sys until that turn."""
    p = {k: _go(v[len(bos):] if bos and k.startswith("start_") and v.startswith(bos) else v)
         for k, v in pieces.items() if isinstance(v, str) and k not in ("system_error", "fold")}
    trim = pieces.get("trim") or ()
    fold = pieces.get("fold")
    content = {role: '{{ template "memtune-trim" .Content }}' if role in trim else "{{ .Content }}"
               for role in ("system", "user", "assistant")}
    if fold:
        system = '{{ $sys = .Content }}{{ $held = true }}'
        here = "true" if fold == "next" else "(eq (len (slice $.Messages $i)) 1)"
        # llama.cpp folds no empty system text (Gemma); Mistral's template writes even an empty one
        when = "(and $held $sys)" if fold == "next" else "$held"
        held = ('{{ if and ' + when + ' ' + here + ' }}' +
                ('{{ template "memtune-trim" $sys }}' if "system" in trim else "{{ $sys }}") +
                p["system_user"] + '{{ $held = false }}{{ end }}')
        after = '{{ if ne .Role "system" }}{{ $prev = .Role }}{{ end }}'
        declare, over = '{{- $sys := "" }}{{- $held := false }}', "{{- range $i, $m := .Messages }}"
    else:
        system = p["start_system"] + content["system"] if "start_system" in p else \
            _go_error(pieces.get("system_error") or "this model's chat template takes no system message")
        held, after = "", "{{ $prev = .Role }}"
        declare, over = "", "{{- range .Messages }}"
    return ((GO_TRIM if trim else "") + '{{- $prev := "" }}' + declare + over +
            '{{- if eq .Role "system" }}' + system +
            '{{- else if eq .Role "user" }}{{ if eq $prev "system" }}' + p.get("system_user", p["start_user"])
            + '{{ else if eq $prev "assistant" }}' + p["assistant_user"] + '{{ else }}' + p["start_user"]
            + '{{ end }}' + held + content["user"] +
            '{{- else if eq .Role "assistant" }}' + p["user_assistant"] + content["assistant"] +
            '{{- end }}' + after + '{{- end }}' + p["user_end"])


@dataclass
class GGUFPlan:
    source: Path  # the model folder whose weights are converted (the base model when an adapter is merged first)
    out_dir: Path
    name: str
    formats: list[str]
    file_bytes: dict[str, int]
    merge_bytes: int  # disk for the merged bf16 model while converting (0 when no merge is needed)
    ram_bytes: int
    ram_free: int
    disk_free: int
    adapter_dir: Path | None = None
    ok: bool = True
    message: str = ""
    replaces: bool = False  # out_dir already holds files: the export needs overwrite=True (--replace, Replace)
    model_name: str = ""  # GGUF general.name: what the model is (gguf.general_name), not the run folder's name
    foreign: bool = False  # out_dir holds files memtune did not make: the export refuses it, with or without Replace
    names: dict[str, Any] = field(default_factory=dict)  # the general.* keys (gguf.naming)
    long_name: str = ""  # the Ollama name before ollama_name shortened it ("" when it fits)


@dataclass
class GGUFResult:
    out_dir: Path
    files: dict[str, Path]
    modelfile: Path
    readme: Path
    commands: list[str] = field(default_factory=list)
    notes: list[Said] = field(default_factory=list)  # what llama.cpp's quantizer did differently (fallbacks)


def default_gguf_dir(adapter_dir: str | Path | None = None, model_dir: str | Path | None = None) -> Path:
    """run_dir/gguf next to an adapter; <folder>-gguf next to a model folder."""
    if adapter_dir:
        return Path(adapter_dir).resolve().parent / "gguf"
    model = Path(model_dir).resolve()
    return model.parent / f"{model.name}-gguf"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._") or "memtune"


def ollama_name(text: str) -> str:
    """`text` as an Ollama model name: slugged; past OLLAMA_NAME_MAX characters, its start and a hash of the whole
    (two long runs of one base stay two names)."""
    name = _slug(text)
    if len(name) <= OLLAMA_NAME_MAX:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{name[:OLLAMA_NAME_MAX - 9].rstrip('-._')}-{digest}"


def _quote(text: str) -> str:
    """Double quotes where the shell leaves the text alone inside them (readable: 'cat' stays as typed)."""
    return f'"{text}"' if not re.search(r'["$`\\!]', text.replace("\\n", "")) else shlex.quote(text)


def _gib(n: int) -> Said:
    """"1.50 GiB", or "340.2 MiB" below a tenth of a GiB, as a message: a page writes it in its language."""
    if n >= GiB / 10:
        return Said("unit.size2", n=n / GiB, unit=Said("unit.gib"))
    return Said("unit.size1", n=n / MiB, unit=Said("unit.mib"))


def _source(adapter_dir: str | Path | None, model_dir: str | Path | None) -> tuple[Path, Any]:
    """(the model folder whose weights are converted, the adapter's settings or None); GGUFError when there is
    none on this machine."""
    from core.export.adapter import _local_model_dir

    if bool(adapter_dir) == bool(model_dir):
        raise GGUFError("gguf.err.source")
    if not adapter_dir:
        return Path(model_dir), None
    from core.infer import InferError, adapter_config, said

    try:
        cfg = adapter_config(adapter_dir)
    except InferError as exc:
        raise GGUFError(said(exc)) from None
    source = _local_model_dir(cfg)
    if source is None or not (source / "config.json").is_file():
        raise GGUFError("gguf.err.base_missing", model=cfg.model)
    return source, cfg


def _sizes(config: dict[str, Any], tplan: list, fmts: list[str], extra: int) -> dict[str, int]:
    """Each format's file size in bytes: its tensors as written (the k-quants as llama.cpp's mix writes them) and
    the metadata, `extra` (metadata_bytes: vocabulary, merges, chat template, names)."""
    layers = int(config["num_hidden_layers"])
    return {f: (planned_bytes(tplan, f, layers) if f in KQUANTS else file_bytes(tplan, f)) + extra for f in fmts}


# The formats the Export tab lists, smallest last, each with its size and when to pick it (gguf.pick.<format>)
LISTED_FORMATS = ("f16", "q8_0", "q6_k", "q5_k_m", "q4_k_m")


@dataclass
class FormatRow:
    format: str
    bytes: int  # the planned file size
    missing: Said | None = None  # why this machine cannot write it (a k-quant without llama.cpp's library), and how


def format_rows(adapter_dir: str | Path | None = None, model_dir: str | Path | None = None) -> list[FormatRow]:
    """The formats an export can write, each with its planned size (plan_gguf's own) and, for the k-quants where
    llama.cpp's library is missing, why and how to get it: said before anything is written."""
    source, _ = _source(adapter_dir, model_dir)
    config = read_config(source)
    architecture(config)
    tplan = tensor_plan(source, config)
    sizes = _sizes(config, tplan, list(LISTED_FORMATS), metadata_bytes(source, tplan, int(config["vocab_size"])))
    _, why = kquant_library()
    return [FormatRow(f, sizes[f], why if f in KQUANTS else None) for f in LISTED_FORMATS]


def plan_gguf(adapter_dir: str | Path | None = None, model_dir: str | Path | None = None,
              formats: Any = ("f16", "q8_0"), out_dir: str | Path | None = None) -> GGUFPlan:
    """How much RAM and disk the export needs and whether this machine has it (message says both); GGUFError for
    inputs that cannot be exported at all (no model, unsupported architecture, unknown format)."""
    import psutil

    from core.export.adapter import merge_plan

    fmts = parse_formats(formats)
    source, cfg = _source(adapter_dir, model_dir)
    if adapter_dir:
        run = Path(adapter_dir).resolve().parent.name
        full = _slug(f"{Path(cfg.model).name}-{run}")
    else:
        full, run = _slug(source.resolve().name), None
    name = ollama_name(full)
    config = read_config(source)
    architecture(config)  # refuses unsupported models (and windows llama.cpp ignores) before anything is merged
    from core.runs.card import hub_id

    names = naming(config, cfg.model if cfg else str(source.resolve()), run, hub_id(cfg.model) if cfg else None)
    model_name = names["name"]  # general_name's
    tplan = tensor_plan(source, config)
    kquants = [f for f in fmts if f in KQUANTS]
    if kquants:  # refused by name before anything is merged or written
        lib, why = kquant_library()
        if lib is None:
            raise GGUFError("gguf.err.kquant_missing", formats=", ".join(kquants), why=why)
    extra = metadata_bytes(source, tplan, int(config["vocab_size"]))  # parses tokenizer.json: once
    sizes = _sizes(config, tplan, fmts, extra)
    params = sum(_count(shape) for _, src, shape in tplan if src)
    biggest = max(_count(shape) for _, _, shape in tplan) * 4 * 3  # one tensor in f32, permuted, encoded
    merge_bytes = params * 2 if adapter_dir else 0
    ram = max(merge_plan(cfg)["needed"] if cfg else 0, biggest)
    from core.files import RefusedError, has_marker, target
    from core.infer import said

    try:  # resolved once (core.files.target): the checks and the final rename act on this same folder
        out = target(out_dir or default_gguf_dir(adapter_dir, model_dir), Said("files.action.gguf"))
    except RefusedError as exc:
        raise GGUFError(said(exc)) from None
    parent = _existing_parent(out)
    disk_free, ram_free = shutil.disk_usage(parent).free, int(psutil.virtual_memory().available)
    # k-quants are written from an F16 file: a temporary one when f16 itself is not asked for
    f16_scratch = file_bytes(tplan, "f16") + extra if kquants and "f16" not in fmts else 0
    disk = merge_bytes + sum(sizes.values()) + f16_scratch
    what = Said("msg.list", items=[Said("gguf.plan.file", format=f, size=_gib(b)) for f, b in sizes.items()])
    message = Said("gguf.plan.needs_merge" if merge_bytes else "gguf.plan.needs", ram=_gib(ram), disk=_gib(disk),
                   path=str(parent), sizes=what, merge=_gib(merge_bytes), ram_free=_gib(ram_free),
                   disk_free=_gib(disk_free))

    def plus(more: Said) -> Said:
        return Said("msg.two", first=message, second=more)

    if name != full:
        message = plus(Said("gguf.plan.name_short", name=name, n=OLLAMA_NAME_MAX, full=full))
    ok = True
    replaces = out.exists() and (not out.is_dir() or any(out.iterdir()))
    foreign = replaces and not has_marker(out, "export")
    if foreign:  # what export_gguf does with it: refuse, whatever --replace says
        ok, message = False, plus(Said("gguf.plan.foreign", path=str(out)))
    elif replaces:
        message = plus(Said("gguf.plan.replaces", path=str(out)))
    if ram > ram_free and not (cfg is not None and merge_plan(cfg)["device"] == "cuda"):
        ok, message = False, plus(Said("gguf.plan.no_ram"))
    if disk * 1.05 > disk_free:
        ok, message = False, plus(Said("gguf.plan.no_disk"))
    return GGUFPlan(source=source, out_dir=out, name=name, formats=fmts, file_bytes=sizes, merge_bytes=merge_bytes,
                    ram_bytes=ram, ram_free=ram_free, disk_free=disk_free, ok=ok, message=message, replaces=replaces,
                    adapter_dir=Path(adapter_dir) if adapter_dir else None, model_name=model_name,
                    foreign=foreign, names=names, long_name=full if name != full else "")


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def export_gguf(adapter_dir: str | Path | None = None, model_dir: str | Path | None = None,
                formats: Any = ("f16", "q8_0"), out_dir: str | Path | None = None,
                progress: Progress | None = None, overwrite: bool = False,
                merge_into: str | None = None, trust_remote_code: bool = False) -> GGUFResult:
    """Export an adapter (merged into its base: core.export.adapter.merge_adapter's `merge_into`, by default the
    dequantized 4-bit weights it was trained against) or a model folder to GGUF files + Modelfile + README.
    trust_remote_code: the user's confirmation, for an adapter whose settings ask for it (merge_adapter)."""
    from core.export.adapter import ExportError, merge_adapter
    from core.files import RefusedError, make_tmp, move_into_place, recover, require_marker
    from core.infer import InferError, adapter_config, adapter_problem, said

    plan = plan_gguf(adapter_dir, model_dir, formats, out_dir)

    def step(fraction: float, message: Said) -> None:
        if progress is not None:
            progress(min(max(fraction, 0.0), 1.0), message)

    step(0.0, plan.message)
    if not plan.ok:
        raise GGUFError(said(plan.message))
    if plan.adapter_dir is not None:  # refused before anything is written (merge_adapter checks it again)

        try:  # with the base's modules: plan_gguf found its folder on this machine
            cfg = adapter_config(plan.adapter_dir, trust_remote_code=trust_remote_code)
            problem = adapter_problem(plan.adapter_dir, cfg, str(plan.source))
        except InferError as exc:
            problem = exc
        if problem is not None:
            raise GGUFError(said(problem)) from None
    out = plan.out_dir
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise GGUFError("export.err.not_empty", path=str(out))
        try:
            require_marker(out, "export", Said("files.action.replace"))  # memtune only replaces what it made
        except RefusedError as exc:
            raise GGUFError(said(exc)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    recover(out)  # what an interrupted earlier export left
    try:
        tmp = make_tmp(out, "export")  # marked first: a crash leaves a folder a later start may remove
    except RefusedError as exc:
        raise GGUFError(said(exc)) from None
    try:
        source, start = plan.source, 0.0
        if plan.adapter_dir is not None:
            def merge_step(fraction: float, message: str) -> None:
                step(0.5 * fraction, message)

            try:
                source = merge_adapter(plan.adapter_dir, tmp / "merged", progress=merge_step, merge_into=merge_into,
                                       trust_remote_code=trust_remote_code)
            except ExportError as exc:
                raise GGUFError(said(exc)) from None
            start = 0.5
        meta = tokenizer_metadata(source, int(read_config(source)["vocab_size"]))
        template, stops, differs = ollama_template(source, meta)
        written: dict[str, Path] = {}
        notes: list[Said] = []
        # memtune's own formats first: the k-quants are quantized from the F16 file by llama.cpp
        order = sorted(plan.formats, key=lambda f: f in KQUANTS)
        share = (1.0 - start) / len(order)
        for i, fmt in enumerate(order):
            begin = start + i * share

            def file_step(fraction: float, message: str, begin: float = begin) -> None:
                step(begin + share * fraction * 0.98, message)

            path = tmp / f"{plan.name}-{fmt}.gguf"
            if fmt in KQUANTS:
                f16 = written.get("f16") or written.setdefault(
                    "scratch", write_gguf(source, tmp / "scratch-f16.gguf", "f16", plan.names or plan.model_name,
                                          file_step))
                step(begin, Said("gguf.step.quantizing", file=path.name, type=KQUANTS[fmt][0]))
                done = quantize(f16, path, fmt)
                if done.note is not None:
                    notes.append(done.note)
                    step(begin + share * 0.98, done.note)
                written[fmt] = path
            else:
                step(begin, Said("gguf.step.writing", file=path.name, type=FORMATS[fmt][0]))
                written[fmt] = write_gguf(source, path, fmt, plan.names or plan.model_name, file_step)
        if "scratch" in written:
            written.pop("scratch").unlink()
        files = {fmt: written[fmt] for fmt in plan.formats}
        shutil.rmtree(tmp / "merged", ignore_errors=True)
        if differs is not None:
            notes.append(differs)
        result = _write_extras(tmp, out, plan, files, meta, template, stops, notes)
        move_into_place(tmp, out)
        step(1.0, Said("gguf.step.done", files=", ".join(p.name for p in result.files.values()), path=str(out)))
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# Ollama's own library templates (ollama.com/library: llama3.1, qwen2.5, gemma2, mistral, phi3; tools left out), for
# a chat template memtune cannot express: the family's, found by its markers, else by llama.cpp's architecture.
# (markers in the chat template, architectures, TEMPLATE, stops)
LIBRARY_TEMPLATES = {
    "llama3": (("<|start_header_id|>",), ("llama",), (
        '{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>'
        '{{- end }}<|start_header_id|>assistant<|end_header_id|>\n\n'), ["<|eot_id|>"]),
    "chatml": (("<|im_start|>",), ("qwen2", "qwen3", "smollm3"), (
        '{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n'),
        ["<|im_end|>"]),
    "gemma2": (("<start_of_turn>",), ("gemma2", "gemma3"), (
        '{{- range $i, $_ := .Messages }}{{- $last := eq (len (slice $.Messages $i)) 1 }}'
        '{{- if or (eq .Role "user") (eq .Role "system") }}<start_of_turn>user\n{{ .Content }}<end_of_turn>\n'
        '{{ if $last }}<start_of_turn>model\n{{ end }}'
        '{{- else if eq .Role "assistant" }}<start_of_turn>model\n{{ .Content }}{{ if not $last }}<end_of_turn>\n'
        '{{ end }}{{- end }}{{- end }}'), ["<end_of_turn>"]),
    "mistral": (("[INST]",), (), (
        '{{- range $i, $_ := .Messages }}{{- if eq .Role "user" }}[INST] '
        '{{ if and $.System (eq (len (slice $.Messages $i)) 1) }}{{ $.System }}\n\n{{ end }}{{ .Content }}[/INST]'
        '{{- else if eq .Role "assistant" }} {{ .Content }}</s>{{- end }}{{- end }}'), ["[INST]"]),
    "phi3": (("<|user|>",), ("phi3",), (
        '{{- range .Messages }}<|{{ .Role }}|>\n{{ .Content }}<|end|>\n{{ end }}<|assistant|>\n'), ["<|end|>"]),
}


def library_template(chat_template: str, arch: str) -> str:
    """The name of Ollama's library template closest to `chat_template` (LIBRARY_TEMPLATES)."""
    for name, (marks, _, _, _) in LIBRARY_TEMPLATES.items():
        if any(m in chat_template for m in marks):
            return name
    return next((n for n, (_, archs, _, _) in LIBRARY_TEMPLATES.items() if arch in archs), "chatml")


def ollama_template(model_dir: Path, meta: dict[str, Any]) -> tuple[str, list[str], Said | None]:
    """(Ollama TEMPLATE, stop strings, what it does differently from the chat template) for a converted model
    folder: memtune's plain prompt for a model without a chat template, else a .Messages template read off the
    model's own chat template (chat_pieces), which renders the same text for the same messages, the template's
    default system turn included, a system text folded into a user turn where the template takes none (llama.cpp's
    folding, said). A chat template that cannot be expressed that way gets Ollama's own library template for its
    family, and the reason."""
    from transformers import AutoTokenizer

    eos = [meta["eos_text"]] if meta.get("eos_text") else []
    if not meta.get("has_chat_template"):
        return PLAIN_TEMPLATE, eos + ["### Instruction:"], None
    tok = AutoTokenizer.from_pretrained(str(model_dir))

    def render(messages, generation):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)

    try:
        pieces = chat_pieces(render)
    except Exception as exc:  # noqa: BLE001 - GGUFError, or a template that refuses even a plain conversation
        from core.infer import said

        name = library_template(str(tok.chat_template or ""), architecture(read_config(model_dir))[0])
        _, _, template, stops = LIBRARY_TEMPLATES[name]
        return template, list(dict.fromkeys(stops + eos)), Said("gguf.template.library", family=name, why=said(exc))
    specials = {t for t in tok.all_special_tokens if t} | {a.content for a in tok.added_tokens_decoder.values()
                                                           if a.special}
    specials = sorted(specials, key=len, reverse=True)
    end_of_turn = [t for t in specials if pieces["assistant_user"].startswith(t)][:1]  # <|im_end|>, <|eot_id|>...
    note = Said("gguf.template.folded") if pieces.get("system_error") else None
    return (go_chat_template(pieces, meta.get("bos_text") if meta.get("add_bos") else None),
            list(dict.fromkeys(end_of_turn + eos)), note)


def _commands(name: str, files: dict[str, Path], primary: Path, meta: dict[str, Any], prompt: str,
              folder: Path | None) -> list[str]:
    """ollama create / ollama run, llama-cli per file (llama-completion for a raw prompt), llama-server: with the
    files' paths in `folder`, or their bare names (folder None: run in the export's folder)."""
    def at(file: str) -> str:
        return shlex.quote(str(folder / file) if folder else file)

    commands = [f"ollama create {name} -f {at('Modelfile')}", f"ollama run {name} {_quote(prompt)}"]
    chat, raw = [], []
    for path in files.values():
        # llama-cli and llama-server prompt through the chat template stored in the file (memtune's own prompt
        # format for a base model); --temp 0 answers greedily, as Try it does.
        chat.append(f"llama-cli -m {at(path.name)} --temp 0 -st -p {_quote(prompt)}")
        if not meta.get("has_chat_template"):  # a raw prompt in the format the adapter was trained on
            text = "### Instruction:\\n" + prompt + "\\n\\n### Response:\\n"
            raw.append(f"llama-completion -m {at(path.name)} -no-cnv -e -n 32 --temp 0 -p {_quote(text)}")
    return commands + chat + raw + [f"llama-server -m {at(primary.name)} --temp 0 --port 8080"]


def _modelfile_safe(template: str) -> bool:
    """Whether Ollama's Modelfile parser reads `template` back whole from TEMPLATE's triple quotes: no three double
    quotes in a row (the value would end there) and only characters it keeps (printable, tab, newline). _go writes every
    template so; this is the last check before the file is written."""
    return '"""' not in template and all(c in "\n\t" or c.isprintable() for c in template)


def _write_extras(tmp: Path, out: Path, plan: GGUFPlan, files: dict[str, Path], meta: dict[str, Any],
                  template: str, stops: list[str], notes: list[Said] = ()) -> GGUFResult:
    """Modelfile, README.md and the marker, inside `tmp`; paths in the result and commands point into `out`."""
    primary = min(files.values(), key=lambda p: p.stat().st_size)  # Ollama gets the smallest file
    lines = [f"# Ollama Modelfile written by memtune: ollama create {plan.name} -f Modelfile", f"FROM ./{primary.name}"]
    if not _modelfile_safe(template):  # _go escapes every chat template's text: a library template is plain
        raise GGUFError("gguf.err.template_quotes")
    lines.append(f'TEMPLATE """{template}"""')
    # what the TEMPLATE does differently from the chat template, as a comment of one line: a newline in it would
    # end the comment, and the next line would be read as a Modelfile command
    lines += [f"# {' '.join(str(note).split())}" for note in notes if note.key.startswith("gguf.template.")]
    for stop in stops:
        if '"' not in stop and stop.isprintable() and stop.strip() == stop:  # Ollama's parser unescapes nothing
            lines.append(f'PARAMETER stop "{stop}"')
        else:
            lines.append(f"# No stop for the end token {ascii(stop)}: a Modelfile cannot hold it as written.")
    lines.append("# Greedy, as memtune's Try it answers (Ollama's defaults sample at temperature 0.8)")
    lines += [f"PARAMETER {k} {v}" for k, v in OLLAMA_SAMPLING.items()]
    (tmp / "Modelfile").write_text("\n".join(lines) + "\n", encoding="utf-8")

    from core.config.settings import DEMO_MODEL

    base = ""
    if plan.adapter_dir is not None:
        from core.infer import adapter_config

        base = adapter_config(plan.adapter_dir).model
    prompt = DEMO_PROMPT if base == DEMO_MODEL else "Hello! Who are you?"
    commands = _commands(plan.name, files, primary, meta, prompt, out)
    here = _commands(plan.name, files, primary, meta, prompt, None)  # the README's: run in its own folder
    plain_mode(tmp, "*.gguf")
    sizes = "\n".join(f"| {p.name} | {fmt} | {p.stat().st_size / MiB:,.1f} MiB |" for fmt, p in files.items())
    run = plan.adapter_dir.resolve().parent.name if plan.adapter_dir else ""
    source = (f"the adapter of the run {run} merged into {Path(base).name}" if plan.adapter_dir else
              plan.source.resolve().name)
    card = adapter_card(plan.adapter_dir, "gguf") if plan.adapter_dir else None
    shortened = (f"The Ollama name is {plan.name}: Ollama takes at most {OLLAMA_NAME_MAX} characters "
                 f"(the full name was {plan.long_name}).\n\n" if plan.long_name else "")
    readme = ((card + "\n" if card else "") +
              f"{'##' if card else '#'} {plan.name} (GGUF)\n\n"
              f"Written by memtune on {_dt.date.today().isoformat()} from {source}. "
              "Run the commands below in this folder.\n\n"
              f"| file | format | size |\n|---|---|---|\n{sizes}\n\n"
              + "".join(f"{note}.\n\n" for note in notes) +
              "## Ollama\n\nThe Modelfile points at the smallest file; edit its FROM line to use another.\n\n"
              f"{shortened}```sh\n{here[0]}\n{here[1]}\n```\n\n"
              f"## llama.cpp\n\nChecked with llama.cpp {LLAMA_CPP_VERSION}: `llama-cli` chats through the chat template "
              "stored in the file (`-st`: one turn, then exit), `llama-completion -no-cnv` completes a raw prompt, "
              "`llama-server` serves the chat template over HTTP (http://127.0.0.1:8080).\n\n"
              "```sh\n" + "\n".join(here[2:]) + "\n```\n\n"
              "## LM Studio\n\nCopy or import a .gguf file (`lms import <file>`), then load it in the chat tab.\n")
    (tmp / "README.md").write_text(readme, encoding="utf-8")
    from core.files import write_marker

    write_marker(tmp, "export", what="gguf", source=source, formats=list(files),
                 files=[p.name for p in files.values()], ollama_name=plan.name)
    return GGUFResult(out_dir=out, files={f: out / p.name for f, p in files.items()}, modelfile=out / "Modelfile",
                      readme=out / "README.md", commands=commands, notes=list(notes))
