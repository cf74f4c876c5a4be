"""Row formats: recognise a dataset's format and render each row as the strings TRL's SFTTrainer trains on.

Every format becomes string columns `prompt` + `completion` (TRL then computes the loss on the completion only)
or, for plain text, one `text` column. Formatting happens here, not inside TRL, so the preview shows exactly
the strings that are trained on and every problem surfaces up front as a `DataError` that says what to do.

How rows are rendered:
- With a chat template (tokenizer.chat_template), a row becomes a conversation: instruction (+ context/input,
  after a blank line) is the user turn, the response the assistant turn. prompt = the template applied to every
  message before the last assistant turn with add_generation_prompt=True; completion = the full rendering minus
  that prompt. Multi-turn conversations: the last assistant turn is the completion; earlier turns are inside the
  prompt, and with TrainConfig.train_turns = "all" (the default, as Unsloth's train_on_responses_only and
  LLaMA-Factory do) every earlier assistant answer trains too: `render_rows` returns their character spans in the
  prompt (column "turns"), which core/data/plan.py turns into labels; "last" trains the last answer only (the rest is
  context). Messages after the last assistant turn are ignored.
- Without one, DEFAULT_TEMPLATE (Alpaca style). Conversations map onto it too: the last user turn is the
  instruction, the system message and earlier turns (as "User: ..."/"Assistant: ..." lines) the input.
- prompt_completion string rows are already TRL's own format and pass through verbatim (no template), like
  plain text; prompt/completion given as message lists are rendered like `messages`.
- The completion and text end with the tokenizer's EOS token (TRL would append it anyway; here it shows in the
  preview and in the token counts), and a leading BOS text is removed where the tokenizer adds BOS itself.
Rows with an empty prompt or completion (or empty text) are dropped and counted, never trained on.
"""

from __future__ import annotations

from typing import Any

from core.data.read import DataError


# Format -> (required columns, optional columns), in detection order: structured formats win over a `text`
# column, since e.g. tatsu-lab/alpaca carries both and only the structure allows completion-only loss.
FORMATS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "messages": (("messages",), ()),
    "sharegpt": (("conversations",), ()),
    "prompt_completion": (("prompt", "completion"), ()),
    "alpaca": (("instruction", "output"), ("input",)),
    "dolly": (("instruction", "response"), ("context",)),
    "text": (("text",), ()),
}
FORMAT_NOTES = {"messages": "a list of {role, content}", "sharegpt": "a list of {from, value}"}

# ShareGPT speaker names (and the OpenAI ones, which some ShareGPT dumps use) -> chat-template roles.
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "model": "assistant", "bard": "assistant", "bing": "assistant", "system": "system", "tool": "tool"}

DEFAULT_TEMPLATE = "### Instruction:\n{instruction}\n\n{input_section}### Response:\n"
INPUT_SECTION = "### Input:\n{input}\n\n"


def format_help() -> str:
    parts = []
    for name, (need, optional) in FORMATS.items():
        cols = ", ".join(need) + (f"; optional {', '.join(optional)}" if optional else "")
        note = f": {FORMAT_NOTES[name]}" if name in FORMAT_NOTES else ""
        parts.append(f"{name} ({cols}{note})")
    return "; ".join(parts)



# --- formats ---------------------------------------------------------------------------------------------
def detect_format(dataset: Any) -> str:
    """The first format in FORMATS whose required columns the dataset has, or DataError listing them all."""
    columns = set(dataset.column_names)
    for name, (need, _) in FORMATS.items():
        if set(need) <= columns:
            return name
    raise DataError("data.err.no_format", columns=sorted(columns), formats=format_help())


def check_format(dataset: Any, fmt: str) -> None:
    if fmt not in FORMATS:
        raise DataError("data.err.unknown_format", format=repr(fmt), formats=", ".join(FORMATS))
    need, optional = FORMATS[fmt]
    missing = [c for c in need if c not in dataset.column_names]
    if missing:
        try:
            hint = {"key": "data.err.hint_auto", "params": {"format": detect_format(dataset)}}
        except DataError:
            hint = {"key": "data.err.hint_rename", "params": {"formats": format_help()}}
        raise DataError("data.err.format_columns_optional" if optional else "data.err.format_columns", format=fmt,
                        need=", ".join(need), optional=", ".join(optional), columns=sorted(dataset.column_names),
                        missing=", ".join(missing), hint=hint)
    _check_text_columns(dataset, fmt)


def _check_text_columns(dataset: Any, fmt: str) -> None:
    """Columns that must hold text, by their datasets feature (the type datasets inferred for the whole column): an
    object or a list where text belongs (prompt_completion's message lists aside), or NaN in a number column, would
    each read as an empty cell, and the run would refuse "every row is empty" without saying why."""
    import datasets

    if fmt in ("messages", "sharegpt"):
        return
    lists = tuple(getattr(datasets, name) for name in ("List", "LargeList", "Sequence") if hasattr(datasets, name))
    need, optional = FORMATS[fmt]
    for column in (c for c in need + optional if c in dataset.column_names):
        feature = dataset.features[column]
        kind = None
        if isinstance(feature, (dict, datasets.Features)):
            kind = "an object ({...})"
        elif isinstance(feature, (list, *lists)):
            inner = feature[0] if isinstance(feature, list) else getattr(feature, "feature", None)
            if not (fmt == "prompt_completion" and isinstance(inner, dict)):
                kind = "a list ([...])"
        if kind is not None:
            row = next((i for i, v in enumerate(column_values(dataset, column)) if v is not None), 0)
            raise DataError("data.err.not_text", row=row, n=row + 1, column=repr(column), kind=kind)
        if isinstance(feature, datasets.Value) and feature.dtype.startswith("float"):
            cells = column_values(dataset, column)
            row = next((i for i, v in enumerate(cells) if isinstance(v, float) and v != v), None)
            if row is not None:
                raise DataError("data.err.nan_text", row=row, n=row + 1, column=repr(column))


def column_values(dataset: Any, column: str) -> list[Any]:
    """Every value of one column, as a list, read in one slice. datasets >= 4 answers `dataset[column]` with a lazy
    Column that iterates row by row (300,000 rows: 12 s after a split, against 0.9 s for the slice)."""
    return dataset[column][:]


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN: an empty cell
        return ""
    if isinstance(value, list):  # multimodal-style content parts: keep the text ones
        return "".join(p.get("text") or "" for p in value if isinstance(p, dict))
    return value if isinstance(value, str) else str(value)


def _messages(turns: Any, row: int, column: str) -> list[dict[str, str]]:
    """Normalise a role/content or from/value list into chat-template messages."""
    if not isinstance(turns, list):
        raise DataError("data.err.not_messages", row=row, n=row + 1, column=repr(column), type=type(turns).__name__)
    out = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise DataError("data.err.turn_not_object", row=row, n=row + 1, column=repr(column),
                            shape='{"role": "user", "content": "..."}', turn=f"{turn!r:.60}")
        speaker = turn.get("role") if turn.get("role") is not None else turn.get("from")
        role = ROLES.get(str(speaker).strip().lower())
        if role is None:
            raise DataError("data.err.unknown_speaker", row=row, n=row + 1, speaker=repr(speaker), column=repr(column))
        content = turn.get("content") if "content" in turn and turn.get("content") is not None else turn.get("value")
        out.append({"role": role, "content": _text(content)})
    return out


def _fields(row: dict[str, Any], fmt: str) -> tuple[str, str, str]:
    """(instruction, context, response) of a dolly or alpaca row."""
    extra = row.get("context" if fmt == "dolly" else "input")
    return (_text(row["instruction"]).strip(), _text(extra).strip(),
            _text(row["response" if fmt == "dolly" else "output"]))


def _conversation(row: dict[str, Any], fmt: str, index: int) -> list[dict[str, str]] | None:
    """The row as messages ending on the assistant turn to train on, or None when it has nothing to train on."""
    if fmt in ("dolly", "alpaca"):
        user, extra, answer = _fields(row, fmt)
        messages = [{"role": "user", "content": f"{user}\n\n{extra}" if extra else user},
                    {"role": "assistant", "content": answer}]
    elif fmt == "prompt_completion":
        messages = _messages(row["prompt"], index, "prompt") + _messages(row["completion"], index, "completion")
    else:
        column = FORMATS[fmt][0][0]
        messages = _messages(row[column], index, column)
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None or not messages[last]["content"].strip():
        return None
    if not any(m["content"].strip() for m in messages[:last]):
        return None
    return messages[: last + 1]


def nothing_to_train(dataset: Any, fmt: str) -> str:
    """Why no row of `dataset` has anything to train on, in words (for the every-row-empty refusal)."""
    if fmt in ("messages", "sharegpt") or (fmt == "prompt_completion" and dataset.num_rows
                                           and isinstance(dataset[0]["prompt"], list)):
        column = "completion" if fmt == "prompt_completion" else FORMATS[fmt][0][0]
        for index in range(min(len(dataset), 1000)):
            messages = _conversation(dataset[index], fmt, index)
            if messages is not None:
                break
        else:
            return (f"no conversation has an assistant turn with text (role assistant, or ShareGPT's gpt) after a "
                    f"user turn, so there is no answer to train on: each conversation in {column!r} must end with "
                    "the reply the model should learn")
    need = " and ".join(("text",) if fmt == "text" else ("prompt", "completion"))
    return f"every row has an empty {need}"


def default_prompt(instruction: str, context: str = "") -> str:
    section = INPUT_SECTION.format(input=context.strip()) if context.strip() else ""
    return DEFAULT_TEMPLATE.format(instruction=instruction.strip(), input_section=section)


def _find_turns(prompt: str, answers: list[str], marker: str = "") -> list[tuple[int, int]]:
    """Character spans of `answers` (earlier assistant turns, in order) in `prompt`, each found after the last."""
    spans, at = [], 0
    for answer in answers:
        if not answer.strip():
            continue
        i = prompt.find(marker + answer, at)
        if i < 0:
            continue
        spans.append((i + len(marker), i + len(marker) + len(answer)))
        at = spans[-1][1]
    return spans


def _render_default(messages: list[dict[str, str]]) -> tuple[str, str]:
    """Alpaca-style prompt/completion: the last user turn is the instruction, everything before it the input."""
    *history, answer = messages
    user_at = max((i for i, m in enumerate(history) if m["role"] == "user"), default=None)
    if user_at is None or len(history) == 1:
        instruction, before = history[-1]["content"], history[:-1]
    else:
        instruction, before = history[user_at]["content"], history[:user_at] + history[user_at + 1:]
    names = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
    if len(before) == 1 and before[0]["role"] == "system":
        context = before[0]["content"]
    else:
        context = "\n".join(f"{names[m['role']]}: {m['content']}" for m in before if m["content"].strip())
    return default_prompt(instruction, context), answer["content"]


def _chat_turns(messages: list[dict[str, str]], tokenizer: Any, prompt: str) -> list[tuple[int, int]]:
    """Character spans in `prompt` of each earlier assistant turn as the template renders it (its answer and its
    end-of-turn text): where the rendering up to that turn extends the one before it, as chat templates do. A
    template that renders earlier turns differently (e.g. drops reasoning) falls back to finding the answer text."""
    spans, missing = [], []
    for i, m in enumerate(messages[:-1]):
        if m["role"] != "assistant" or not m["content"].strip():
            continue
        try:
            before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
            through = tokenizer.apply_chat_template(messages[:i + 1], tokenize=False)
        except Exception:  # noqa: BLE001 - a template that refuses the partial conversation
            before = through = ""
        if before and through.startswith(before) and prompt.startswith(through):
            spans.append((len(before), len(through)))
        else:
            missing.append(m["content"])
    if missing:  # the answer text itself, wherever the template put it
        spans = sorted(spans + _find_turns(prompt, missing))
    return spans


def _render_chat(messages: list[dict[str, str]], tokenizer: Any, index: int) -> tuple[str, str]:
    try:
        prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as exc:  # e.g. templates that refuse a system turn or non-alternating roles
        raise DataError("data.err.template_rejected", row=index, n=index + 1,
                        error=f"{type(exc).__name__}: {exc}") from None
    if not full.startswith(prompt):  # the template renders the prompt differently alone: split where they differ
        common = 0
        while common < min(len(prompt), len(full)) and prompt[common] == full[common]:
            common += 1
        prompt = full[:common]
    return prompt, full[len(prompt):]


def _adds_bos(tokenizer: Any) -> bool:
    """Does encoding a string (as TRL does, with the default add_special_tokens) put BOS in front?"""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None:
        return False
    with_special = tokenizer("a")["input_ids"]
    without = tokenizer("a", add_special_tokens=False)["input_ids"]
    return len(with_special) > len(without) and with_special[0] == bos_id


def to_sft(dataset: Any, fmt: str, tokenizer: Any = None) -> Any:
    """Turn `dataset` (of format `fmt`) into string columns prompt + completion, or text for plain text.

    Rows with nothing to train on are dropped (len(result) < len(dataset) tells how many).
    """
    import datasets

    columns, _ = render_rows(dataset, fmt, tokenizer)
    columns.pop("turns", None)  # TRL's own columns only (it trains the last turn of a conversation)
    return datasets.Dataset.from_dict(columns)


def render_rows(dataset: Any, fmt: str, tokenizer: Any = None,
                turns: str = "all") -> tuple[dict[str, list[Any]], list[int]]:
    """({"prompt": [...], "completion": [...], "turns": [...]} or {"text": [...]}, the index in `dataset` of each
    rendered row). "turns": per row, the character spans of the prompt that train too (earlier assistant turns of
    a conversation; none with `turns` = "last" or a single-turn row).

    Rows with nothing to train on (an empty or null prompt, completion or text) are left out.
    """
    check_format(dataset, fmt)
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    eos = getattr(tokenizer, "eos_token", None) or ""
    # TRL tokenizes prompt strings with add_special_tokens on: a BOS rendered by the template would double it.
    bos = tokenizer.bos_token if tokenizer is not None and _adds_bos(tokenizer) else ""

    def finish(text: str) -> str:
        # Ending exactly on EOS makes TRL skip its own EOS, so the template's end-of-turn is not followed by a
        # second one (ChatML renders "<|im_end|>\n").
        if eos and text.rstrip().endswith(eos):
            return text.rstrip()
        return text + eos

    def strip_bos(text: str) -> str:
        return text[len(bos):] if bos and text.startswith(bos) else text

    columns = [c for c in dataset.column_names if c in FORMATS[fmt][0] + FORMATS[fmt][1]]
    data = {c: column_values(dataset, c) for c in columns}  # column-wise reads are much faster than row dicts
    rows = (dict(zip(columns, values)) for values in zip(*data.values()))
    kept: list[int] = []

    if fmt == "text":
        texts = []
        for index, row in enumerate(rows):
            text = _text(row["text"])
            if text.strip():
                texts.append(finish(strip_bos(text)))
                kept.append(index)
        return {"text": texts}, kept

    verbatim = fmt == "prompt_completion" and not any(isinstance(p, list) for p in data["prompt"][:1])
    prompts, completions, trained = [], [], []
    for index, row in enumerate(rows):
        spans: list[tuple[int, int]] = []
        if verbatim:  # already TRL's format: trained exactly as written
            prompt, completion = _text(row["prompt"]), _text(row["completion"])
            if not prompt.strip() or not completion.strip():
                continue
        elif fmt in ("dolly", "alpaca") and not template:  # keeps the Input section the conversation would merge
            instruction, context, completion = _fields(row, fmt)
            if not instruction or not completion.strip():
                continue
            prompt = default_prompt(instruction, context)
        else:
            messages = _conversation(row, fmt, index)
            if messages is None:
                continue
            prompt, completion = (_render_chat(messages, tokenizer, index) if template
                                  else _render_default(messages))
            if turns == "all" and sum(m["role"] == "assistant" for m in messages) > 1:
                spans = (_chat_turns(messages, tokenizer, prompt) if template else
                         _find_turns(prompt, [m["content"] for m in messages[:-1] if m["role"] == "assistant"],
                                     "Assistant: "))
        shown = strip_bos(prompt)
        shift = len(prompt) - len(shown)
        prompts.append(shown)
        completions.append(finish(completion))
        trained.append([(a - shift, b - shift) for a, b in spans if a >= shift])
        kept.append(index)
    return {"prompt": prompts, "completion": completions, "turns": trained}, kept
