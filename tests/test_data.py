"""core.data.plan: loading, format detection, SFT conversion, preview and every bad-input message.

Longer than ~400 lines: one test per bad input (each with its message) is the point of this file, and they
share the tokenizer and data fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.data import plan as data
from core.data.formats import default_prompt
from core.config.settings import DEMO_DATASET, TrainConfig, demo_config
from core.data.plan import DataError
from tests.helpers import rendered_rows, train_cli

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
DOLLY = {"instruction": "Say hi", "context": "to Bob", "response": "Hi Bob", "category": "x"}
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Name?"},
        {"role": "assistant", "content": "Ann"}]


# --- fixtures --------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory):
    """MEMTUNE_HOME and the datasets cache in a temp dir, and the demo model built there."""
    import datasets

    from core.demo import ensure_demo_model

    home = tmp_path_factory.mktemp("memtune_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMTUNE_HOME", str(home))
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(home / "datasets"))  # read at call time
        yield ensure_demo_model()


@pytest.fixture(scope="session")
def tok(demo_dir):
    """The demo tokenizer: no chat template, adds BOS itself, eos </s>. Do not mutate (shared)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_dir)


@pytest.fixture
def fresh_tok(demo_dir):
    """A private copy of the demo tokenizer that a test may give a chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_dir)


@pytest.fixture
def chat_tok(fresh_tok):
    fresh_tok.chat_template = CHATML
    return fresh_tok


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def sft_rows(tmp_path, rows, tokenizer, fmt="auto", name="d.jsonl"):
    cfg = TrainConfig(dataset=str(write_jsonl(tmp_path / name, rows)), dataset_split="train", dataset_format=fmt)
    ds, detected = rendered_rows(cfg, tokenizer)
    return list(ds), detected


def error_of(fn, *args) -> str:
    with pytest.raises(DataError) as info:
        fn(*args)
    return str(info.value)


# --- demo set --------------------------------------------------------------------------------------------
def test_demo_set_loads_as_dolly(tok):
    from core.demo import DEMO_DATA, demo_rows

    raw = data.load_raw(DEMO_DATASET, "train")
    n_lines = sum(1 for line in DEMO_DATA.read_text(encoding="utf-8").splitlines() if line.strip())
    # 2 phrasings x 50 words = 100 rows (core.demo)
    assert len(raw) == n_lines == len(demo_rows())
    assert data.detect_format(raw) == "dolly"
    rows, fmt = rendered_rows(demo_config(), tok)
    assert fmt == "dolly" and len(rows) == len(raw) and rows.column_names == ["prompt", "completion"]


# --- formats without a chat template (default Alpaca-style template) -------------------------------------
def test_dolly_default_template(tmp_path, tok):
    rows, fmt = sft_rows(tmp_path, [DOLLY, {**DOLLY, "context": ""}], tok)
    assert fmt == "dolly"
    assert rows[0] == {"prompt": "### Instruction:\nSay hi\n\n### Input:\nto Bob\n\n### Response:\n",
                       "completion": "Hi Bob</s>"}
    assert rows[1]["prompt"] == "### Instruction:\nSay hi\n\n### Response:\n"  # no Input section when empty


def test_alpaca_default_template(tmp_path, tok):
    rows, fmt = sft_rows(tmp_path, [{"instruction": "Add", "input": "2+2", "output": "4"},
                                    {"instruction": "Add", "input": None, "output": "4"}], tok)
    assert fmt == "alpaca"
    assert rows[0] == {"prompt": "### Instruction:\nAdd\n\n### Input:\n2+2\n\n### Response:\n", "completion": "4</s>"}
    assert rows[1]["prompt"] == "### Instruction:\nAdd\n\n### Response:\n"


def test_text_format(tmp_path, tok):
    rows, fmt = sft_rows(tmp_path, [{"text": "hello world"}, {"text": "done</s>"}, {"text": "  "}], tok)
    assert fmt == "text"
    assert rows == [{"text": "hello world</s>"}, {"text": "done</s>"}]  # EOS once; the blank row dropped


def test_prompt_completion_passes_through(tmp_path, tok, chat_tok):
    row = {"prompt": "The sky is", "completion": " blue"}
    for tokenizer in (tok, chat_tok):  # TRL's own format: never templated
        rows, fmt = sft_rows(tmp_path, [row], tokenizer)
        assert fmt == "prompt_completion" and rows == [{"prompt": "The sky is", "completion": " blue</s>"}]


def test_messages_multi_turn_default_template(tmp_path, tok):
    rows, fmt = sft_rows(tmp_path, [{"messages": CHAT}], tok)
    assert fmt == "messages"
    assert rows == [{"prompt": "### Instruction:\nName?\n\n### Input:\nSystem: Be brief.\nUser: Hi\nAssistant: Hello"
                               "\n\n### Response:\n", "completion": "Ann</s>"}]


def test_messages_single_turn_with_system_default_template(tmp_path, tok):
    rows, _ = sft_rows(tmp_path, [{"messages": CHAT[:3]}], tok)
    assert rows == [{"prompt": "### Instruction:\nHi\n\n### Input:\nBe brief.\n\n### Response:\n",
                     "completion": "Hello</s>"}]


def test_sharegpt_default_template(tmp_path, tok):
    conv = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]
    rows, fmt = sft_rows(tmp_path, [{"conversations": conv}], tok)
    assert fmt == "sharegpt"
    assert rows == [{"prompt": "### Instruction:\nHi\n\n### Response:\n", "completion": "Hello</s>"}]


# --- formats with a chat template ------------------------------------------------------------------------
def test_dolly_chat_template(tmp_path, chat_tok):
    rows, _ = sft_rows(tmp_path, [DOLLY], chat_tok)
    assert rows == [{"prompt": "<|im_start|>user\nSay hi\n\nto Bob<|im_end|>\n<|im_start|>assistant\n",
                     "completion": "Hi Bob<|im_end|>\n</s>"}]


def test_alpaca_chat_template(tmp_path, chat_tok):
    rows, _ = sft_rows(tmp_path, [{"instruction": "Add", "input": "", "output": "4"}], chat_tok)
    assert rows == [{"prompt": "<|im_start|>user\nAdd<|im_end|>\n<|im_start|>assistant\n",
                     "completion": "4<|im_end|>\n</s>"}]


def test_messages_multi_turn_chat_template(tmp_path, chat_tok):
    rows, _ = sft_rows(tmp_path, [{"messages": CHAT + [{"role": "user", "content": "trailing, ignored"}]}], chat_tok)
    assert rows == [{"prompt": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                               "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nName?<|im_end|>\n"
                               "<|im_start|>assistant\n",
                     "completion": "Ann<|im_end|>\n</s>"}]


def test_sharegpt_chat_template(tmp_path, chat_tok):
    conv = [{"from": "system", "value": "S"}, {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]
    rows, _ = sft_rows(tmp_path, [{"conversations": conv}], chat_tok)
    assert rows == [{"prompt": "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                               "<|im_start|>assistant\n", "completion": "Yo<|im_end|>\n</s>"}]


def test_conversational_prompt_completion_uses_template(tmp_path, chat_tok):
    row = {"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Yo"}]}
    rows, fmt = sft_rows(tmp_path, [row], chat_tok)
    assert fmt == "prompt_completion"
    assert rows == [{"prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                     "completion": "Yo<|im_end|>\n</s>"}]


def test_bos_from_template_is_stripped_only_when_tokenizer_adds_it(tmp_path, fresh_tok):
    from tokenizers.processors import TemplateProcessing

    fresh_tok.chat_template = "{{ bos_token }}" + CHATML
    rows, _ = sft_rows(tmp_path, [DOLLY], fresh_tok)
    assert rows[0]["prompt"].startswith("<|im_start|>user")  # the tokenizer adds <s> itself
    ids = fresh_tok(rows[0]["prompt"])["input_ids"]
    assert ids[0] == fresh_tok.bos_token_id and ids[1] != fresh_tok.bos_token_id

    fresh_tok.backend_tokenizer.post_processor = TemplateProcessing(single="$A", pair="$A $B")  # no auto BOS
    rows, _ = sft_rows(tmp_path, [DOLLY], fresh_tok, name="again.jsonl")
    assert rows[0]["prompt"].startswith("<s><|im_start|>user")


def test_template_ending_turns_with_eos_gets_no_second_eos(tmp_path, fresh_tok):
    fresh_tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    rows, _ = sft_rows(tmp_path, [DOLLY], fresh_tok)
    assert rows == [{"prompt": "<|user|>\nSay hi\n\nto Bob</s>\n<|assistant|>\n", "completion": "Hi Bob</s>"}]


def test_chat_template_error_names_the_row(tmp_path, fresh_tok):
    fresh_tok.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
                               "supported') }}{% endif %}" + CHATML)
    msg = error_of(sft_rows, tmp_path, [{"messages": CHAT[1:3]}, {"messages": CHAT}], fresh_tok)
    # one numbering (1-based, the preview's) and the file line: the second row is line 2 of d.jsonl
    assert "Row 2" in msg and "line 2 of the file" in msg and "System role not supported" in msg


# --- detection and forced formats ------------------------------------------------------------------------
def test_structured_format_wins_over_text_column(tmp_path, tok):
    ds = data.load_raw(str(write_jsonl(tmp_path / "a.jsonl", [{"instruction": "a", "input": "", "output": "b",
                                                                "text": "a b"}])), "train")
    assert data.detect_format(ds) == "alpaca"


def test_unknown_columns_are_listed_with_accepted_formats(tmp_path, tok):
    msg = error_of(sft_rows, tmp_path, [{"question": "q", "answer": "a"}], tok)
    assert "['answer', 'question']" in msg
    for expected in ("dolly (instruction, response; optional context)", "alpaca (instruction, output; optional input)",
                     "prompt_completion (prompt, completion)", "messages (messages", "sharegpt (conversations",
                     "text (text)"):
        assert expected in msg


def test_forced_format_must_fit_columns(tmp_path, tok):
    msg = error_of(sft_rows, tmp_path, [DOLLY], tok, "alpaca")
    assert "alpaca needs the columns instruction, output" in msg and "missing output" in msg
    assert "auto (it detects dolly)" in msg
    rows, fmt = sft_rows(tmp_path, [{**DOLLY, "text": "raw"}], tok, "text")  # forcing picks a non-default reading
    assert fmt == "text" and rows == [{"text": "raw</s>"}]


def test_unknown_speaker_is_reported(tmp_path, tok):
    msg = error_of(sft_rows, tmp_path, [{"conversations": [{"from": "bot", "value": "x"}]}], tok)
    assert "unknown speaker 'bot'" in msg and "human/gpt" in msg


# --- dropped and empty rows ------------------------------------------------------------------------------
def test_rows_with_empty_prompt_or_completion_are_dropped_and_counted(tmp_path, tok):
    rows = [DOLLY, {**DOLLY, "response": ""}, {**DOLLY, "instruction": "  "}, {**DOLLY, "response": None},
            {**DOLLY, "instruction": "Bye"}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    preview = data.plan_rows(TrainConfig(dataset=str(path), dataset_split="train"), tok, n_examples=3)
    assert (preview.n_train, preview.n_dropped) == (2, 3)


def test_conversation_without_assistant_reply_is_dropped(tmp_path, tok):
    rows, _ = sft_rows(tmp_path, [{"messages": CHAT[:2]}, {"messages": CHAT[:3]}], tok)
    assert len(rows) == 1


def test_every_row_empty_is_an_error(tmp_path, tok):
    msg = error_of(sft_rows, tmp_path, [{**DOLLY, "response": ""}, {**DOLLY, "response": " "}], tok)
    assert "in the 2 rows" in msg and "every row has an empty prompt and completion" in msg


def test_conversations_without_an_assistant_turn_say_so(tmp_path, tok):
    msg = error_of(sft_rows, tmp_path, [{"messages": CHAT[:2]}, {"messages": [CHAT[1]]}], tok)
    assert "no conversation has an assistant turn" in msg and "empty prompt" not in msg


def test_a_json_dict_of_lists_is_named_as_such(tmp_path, tok):
    path = tmp_path / "cols.json"
    path.write_text(json.dumps({"prompt": ["a", "b"], "completion": ["x", "y"]}), encoding="utf-8")
    msg = error_of(data.load_raw, str(path), "train")
    assert "one JSON object of columns" in msg and "list of rows" in msg


def test_empty_files(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n\n", encoding="utf-8")
    assert "is empty" in error_of(data.load_raw, str(tmp_path / "e.jsonl"), "train")
    (tmp_path / "h.csv").write_text("instruction,response\n", encoding="utf-8")
    assert "has no rows" in error_of(data.load_raw, str(tmp_path / "h.csv"), "train")
    (tmp_path / "l.json").write_text("[]", encoding="utf-8")
    assert "empty JSON list" in error_of(data.load_raw, str(tmp_path / "l.json"), "train")


# --- bad files -------------------------------------------------------------------------------------------
def test_invalid_jsonl_reports_line_number(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b"}\n{"text": "c",}\n{"text": "d"}\n', encoding="utf-8")
    msg = error_of(data.load_raw, str(path), "train")
    assert "line 4 is not valid JSON" in msg and str(path) in msg
    path.write_text('{"text": "a"}\n["b"]\n', encoding="utf-8")
    assert "line 2 is a JSON list, not an object" in error_of(data.load_raw, str(path), "train")


def test_invalid_json_document_reports_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"text": "a"},\n  {"text": b}\n]\n', encoding="utf-8")
    msg = error_of(data.load_raw, str(path), "train")
    assert "invalid JSON at line 3, column 12" in msg
    path.write_text('{"text": "a"}\n{"text": "b"\n', encoding="utf-8")  # JSON Lines named .json
    assert "line 2 is not valid JSON" in error_of(data.load_raw, str(path), "train")
    path.write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    assert len(data.load_raw(str(path), "train")) == 2


def test_non_utf8_file_reports_offset_and_line(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes('{"text": "ok"}\n'.encode() + b'{"text": "caf\xe9"}\n')
    msg = error_of(data.load_raw, str(path), "train")
    assert "not UTF-8" in msg and "byte 0xe9 at byte offset 28 (line 2)" in msg and "latin.jsonl" in msg
    csv = tmp_path / "latin.csv"
    csv.write_bytes(b"text\ncaf\xe9\n")
    assert "(line 2)" in error_of(data.load_raw, str(csv), "train")


def test_missing_file_and_unsupported_extension(tmp_path):
    assert "does not exist" in error_of(data.load_raw, str(tmp_path / "nope.jsonl"), "train")
    assert "does not exist" in error_of(data.load_raw, "./nope/data", "train")
    (tmp_path / "sheet.xlsx").write_bytes(b"PK")
    msg = error_of(data.load_raw, str(tmp_path / "sheet.xlsx"), "train")
    assert ".xlsx are not supported" in msg and "Accepted: .jsonl, .json, .csv, .parquet, .txt" in msg


def test_hub_dataset_offline_fails_fast_with_advice(monkeypatch):
    """Offline (conftest: HF_HUB_OFFLINE=1, an empty HF_HOME), a Hub dataset is refused at once: not one connection
    is tried (so no retries to wait for; a count, not a stopwatch), and the message says what to do."""
    import socket

    tried = []

    def refuse(*args, **kwargs):
        tried.append(args[:2])
        raise OSError("no network in the tests")

    for owner, name in ((socket, "getaddrinfo"), (socket, "create_connection"), (socket.socket, "connect")):
        monkeypatch.setattr(owner, name, refuse)
    with pytest.raises(DataError) as refused:
        data.load_raw("databricks/databricks-dolly-15k", "train[:10]")
    message = str(refused.value)
    assert "The dataset databricks/databricks-dolly-15k is not in the local cache" in message
    assert "Hub cannot be reached" in message and "local .jsonl" in message
    assert tried == []


# --- other file types and splits -------------------------------------------------------------------------
def test_csv_keeps_text_and_drops_empty_cells(tmp_path, tok):
    path = tmp_path / "d.csv"
    path.write_text("instruction,context,response\nCode?,,007\nNone,,\n", encoding="utf-8")
    rows, fmt = rendered_rows(TrainConfig(dataset=str(path), dataset_split="train"), tok)
    assert fmt == "dolly" and list(rows) == [{"prompt": "### Instruction:\nCode?\n\n### Response:\n",
                                              "completion": "007</s>"}]


def csv_file(tmp_path, text: str, name: str = "r.csv") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_csv_row_with_an_unquoted_comma_is_refused_naming_its_line(tmp_path):
    """The issue's file: the first data row has 3 fields; pandas made `List a` an index and shifted the rest."""
    first = csv_file(tmp_path, "prompt,completion\nList a, b,c\nSay hello,hello\nSay bye,bye\nSay yes,yes\n")
    msg = error_of(data.load_raw, first, "train")
    assert "line 2 has 3 fields" in msg and "(prompt, completion)" in msg and first in msg
    middle = csv_file(tmp_path, "prompt,completion\na,b\n\nc,d\n\"multi\nline\",e\nf,g,h\n", "m.csv")
    assert "line 7 has 3 fields" in error_of(data.load_raw, middle, "train")  # blank + 2-line record counted
    short = csv_file(tmp_path, "prompt,completion\na,b\nc\n", "s.csv")
    assert "line 3 has 1 fields" in error_of(data.load_raw, short, "train")


def test_csv_words_that_look_missing_are_text(tmp_path, tok):
    words = ["None", "NaN", "N/A", "NA", "null", "Na", "nan"]
    path = csv_file(tmp_path, "prompt,completion\n" + "".join(f"q{i},{w}\n" for i, w in enumerate(words))
                    + "q-empty,\n")
    raw = data.load_raw(path, "train")
    assert list(raw["completion"]) == words + [""]
    plan = data.plan_rows(TrainConfig(dataset=path, dataset_split="train"), tok)
    assert (plan.n_train, plan.n_dropped) == (7, 1)  # only the truly empty field is empty
    assert list(data.load_raw(path, "train[1:3]")["completion"]) == ["NaN", "N/A"]


def test_csv_duplicate_or_empty_column_names_are_refused(tmp_path):
    msg = error_of(data.load_raw, csv_file(tmp_path, "prompt,prompt,completion\na,b,c\n"), "train")
    assert "'prompt' appears twice" in msg
    assert "empty column name" in error_of(data.load_raw, csv_file(tmp_path, "prompt,,x\na,b,c\n", "e.csv"),
                                           "train")


def test_csv_row_errors_and_the_preview_count_alike(tmp_path, fresh_tok):
    """A row-level format error names the preview's row number (1-based) and the CSV line (header = line 1)."""
    fresh_tok.chat_template = ("{% if messages[0]['content'] == 'bad' %}{{ raise_exception('no') }}{% endif %}"
                               + CHATML)
    path = csv_file(tmp_path, "instruction,response\nfine,ok\nbad,x\n")
    with pytest.raises(DataError) as info:
        data.plan_rows(TrainConfig(dataset=path, dataset_split="train"), fresh_tok)
    assert "Row 2" in str(info.value) and "line 3 of the file" in str(info.value)


def test_a_folder_dataset_names_its_bad_file(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", [DOLLY])
    (folder / "b.csv").write_text("instruction,response\nx, y,z\n", encoding="utf-8")
    msg = error_of(data.load_raw, str(folder), "train")
    assert str(folder / "b.csv") in msg and "line 2 has 3 fields" in msg


def test_txt_and_parquet(tmp_path, tok):
    import datasets

    (tmp_path / "t.txt").write_text("first line\n\nsecond line\n", encoding="utf-8")
    rows, fmt = rendered_rows(TrainConfig(dataset=str(tmp_path / "t.txt"), dataset_split="train"), tok)
    assert fmt == "text" and list(rows["text"]) == ["first line</s>", "second line</s>"]
    datasets.Dataset.from_list([DOLLY] * 3).to_parquet(str(tmp_path / "d.parquet"))
    assert len(data.load_raw(str(tmp_path / "d.parquet"), "train[:2]")) == 2


def test_split_slicing(tmp_path):
    path = str(write_jsonl(tmp_path / "n.jsonl", [{"text": str(i)} for i in range(50)]))
    assert list(data.load_raw(path, "train[:5]")["text"]) == ["0", "1", "2", "3", "4"]
    assert list(data.load_raw(path, "train[45:]")["text"]) == ["45", "46", "47", "48", "49"]
    assert len(data.load_raw(path, "train[:10%]")) == 5
    assert len(data.load_raw(DEMO_DATASET, "train[:7]")) == 7


def test_split_errors(tmp_path):
    msg = error_of(data.load_raw, DEMO_DATASET, "train[5000:]")
    assert "selects no rows" in msg and "has 100 rows" in msg
    msg = error_of(data.load_raw, DEMO_DATASET, "validation")
    assert "no split 'validation'" in msg and "available splits: ['train']" in msg
    assert "not valid split syntax" in error_of(data.load_raw, DEMO_DATASET, "train[:")
    assert "selects no rows" in error_of(data.load_raw, DEMO_DATASET, "train[10:5]")


# --- preview and TRL compatibility -----------------------------------------------------------------------
def test_preview_on_demo_set(tok):
    preview = data.plan_rows(demo_config(max_length=22), tok, n_examples=2)
    assert preview.format == "dolly" and preview.n_train == 100 and preview.n_dropped == 0
    # the first 2 rows, then the first row of each other outcome
    assert [ex["row"] for ex in preview.examples[:2]] == [1, 2]
    assert [ex["reason"] for ex in preview.examples[2:]] == [r for r in data.REASONS if r in preview.reasons
                                                             and r not in {e["reason"] for e in preview.examples[:2]}]
    assert set(preview.examples[1]) == {"row", "reason", "tokens", "trained_tokens", "prompt", "completion"}
    ex = next(e for e in preview.examples if e["reason"] == "kept")  # a row that fits is shown whole
    assert preview.lengths[ex["row"] - 1] == len(tok(ex["prompt"] + ex["completion"])["input_ids"])
    assert len(preview.lengths) == 100 and preview.max_length == 22
    assert 0 < sum(n > 22 for n in preview.lengths) < 100
    s = preview.stats
    assert s["min"] == min(preview.lengths) and s["max"] == max(preview.lengths)
    assert s["min"] <= s["median"] <= s["p95"] <= s["max"] and s["min"] <= s["mean"] <= s["max"]
    assert max(data.plan_rows(demo_config(max_length=512), tok, n_examples=3).lengths) <= 512


class CountingTokenizer:
    """The tokenizer, counting its calls (texts per call): the proxy's attributes are the tokenizer's."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def __call__(self, text, *args, **kwargs):
        self.calls.append(1 if isinstance(text, str) else len(text))
        return self.tokenizer(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_preview_is_fast_for_thousands_of_rows(tmp_path, tok):
    """Fast = the rows are tokenized in batches, not one call per row (counted, not timed: the suite runs on busy
    machines too)."""
    rows = [{"instruction": f"Question number {i}?", "context": "", "response": f"Answer {i}"} for i in range(3000)]
    cfg = TrainConfig(dataset=str(write_jsonl(tmp_path / "big.jsonl", rows)), dataset_split="train[:2500]")
    counting = CountingTokenizer(tok)
    preview = data.plan_rows(cfg, counting, n_examples=3)
    assert preview.n_train == 2500 and len(preview.lengths) == 2500
    assert sum(counting.calls) >= 2 * 2500  # every row's prompt and prompt + response went through it...
    assert len(counting.calls) <= 20, counting.calls  # ...in a handful of batched calls


def test_prompt_tokens_are_a_prefix_of_prompt_plus_completion(tok):
    """TRL tokenizes prompt and prompt+completion separately and warns when the first is not a prefix."""
    rows, _ = rendered_rows(demo_config(), tok)
    prompts = tok(list(rows["prompt"]))["input_ids"]
    full = tok([p + c for p, c in zip(rows["prompt"], rows["completion"])])["input_ids"]
    assert all(f[:len(p)] == p for p, f in zip(prompts, full))
    assert all(p[0] == tok.bos_token_id and p[1] != tok.bos_token_id for p in prompts)  # exactly one BOS


def test_trl_trains_on_the_completion_only(demo_dir, tok, tmp_path):
    import trl
    from transformers import AutoModelForCausalLM

    rows, _ = rendered_rows(demo_config(dataset_split="train[:8]"), tok)
    args = trl.SFTConfig(output_dir=str(tmp_path / "out"), max_length=64, report_to=[], use_cpu=True)
    trainer = trl.SFTTrainer(model=AutoModelForCausalLM.from_pretrained(demo_dir), args=args,
                             train_dataset=rows, processing_class=tok)
    first = trainer.train_dataset[0]
    trained = [i for i, label in zip(first["input_ids"], first["labels"]) if label != -100]
    assert tok.decode(trained) == rows[0]["completion"]
    assert first["input_ids"] == tok(rows[0]["prompt"] + rows[0]["completion"])["input_ids"]


# --- every row accounted for: the plan, the preview, the run log, summary.json and the trainer agree ------------
LONG = "word " * 30  # 30+ tokens of prompt: with max_length 32 the prompt alone fills it


def mixed_rows() -> list[dict]:
    """Short rows, prompt-too-long rows, rows with a long answer, null/empty rows and one huge row."""
    rows = [{"instruction": f"Say {w}", "context": "", "response": f"{w} back"} for w in ("hi", "yo", "ok", "up")]
    rows += [{"instruction": "Summarise", "context": LONG + str(i), "response": "done"} for i in range(3)]
    rows += [{"instruction": "Tell more", "context": "", "response": "long " * 40}]
    rows += [{"instruction": None, "context": "", "response": "x"},
             {"instruction": "q", "context": "", "response": None},
             {"instruction": "  ", "context": "", "response": "y"}]
    rows += [{"instruction": "Huge", "context": "huge " * 4000, "response": "fine"}]
    return rows


def test_cut_row_keeps_truncates_cuts_or_drops():
    ids = list(range(100))  # 80 prompt tokens + 20 answer tokens

    def cut(n, prompt, max_length, mode, **kw):
        reason, spans, n_prompt = data.cut_row(n, prompt, max_length, mode, **kw)
        return reason, data.take(ids[:n], spans).tolist(), n_prompt

    assert cut(30, 20, 32, "drop") == ("kept", ids[:30], 20)
    assert cut(100, 20, 32, "drop") == ("truncated", ids[:32], 20)  # TRL's own cut: keep the start
    assert cut(100, 80, 32, "drop") == ("dropped_long", [], 0)  # TRL would drop it (no label left)
    reason, kept, n_prompt = cut(100, 80, 32, "truncate_middle")
    assert reason == "prompt_cut" and len(kept) == 32 and n_prompt == 24  # the answer keeps 32 // 4 tokens
    assert kept == ids[:12] + ids[68:80] + ids[80:88]  # prompt head + prompt tail (the answer header) + answer
    reason, kept, n_prompt = cut(100, 80, 32, "truncate_left", keep_first=True)
    assert kept == ids[:1] + ids[57:80] + ids[80:88] and n_prompt == 24  # BOS kept, the start of the prompt cut
    assert cut(100, 80, 32, "truncate_left")[1] == ids[56:88]
    # a short answer is kept whole; the prompt gives way
    reason, kept, n_prompt = cut(83, 80, 32, "truncate_middle")
    assert reason == "prompt_cut" and kept[-3:] == ids[80:83] and n_prompt == 29 and len(kept) == 32
    assert cut(100, 0, 32, "drop") == ("truncated", ids[:32], 0)  # plain text: the start trains


def test_plan_counts_each_row_once(tmp_path, tok):
    path = write_jsonl(tmp_path / "mixed.jsonl", mixed_rows())
    for mode, expected in (("truncate_middle", dict(kept=4, truncated=1, prompt_cut=4, dropped_long=0)),
                           ("drop", dict(kept=4, truncated=1, prompt_cut=0, dropped_long=4))):
        plan = data.plan_rows(TrainConfig(dataset=str(path), dataset_split="train", max_length=32,
                                          long_prompts=mode), tok)
        assert plan.counts == {**expected, "dropped_empty": 3}, mode
        assert plan.n_source == 12 and sum(plan.counts.values()) == 12 and plan.n_train == len(plan.input_ids)
        assert all(len(ids) <= 32 and len(ids) == len(lab) for ids, lab in zip(plan.input_ids, plan.labels))
        assert all(any(x != -100 for x in lab) for lab in plan.labels)  # every training row has answer tokens
        assert str(path) in plan.describe() and "3 dropped: empty or null" in plan.describe()
        assert "row 12" in plan.notes[0] and "tokens" in plan.notes[0]


def test_preview_sends_a_bounded_text_per_row(tmp_path, tok):
    rows = [{"instruction": "Huge", "context": "", "response": "é" * 9000}, DOLLY]
    path = write_jsonl(tmp_path / "huge.jsonl", rows)
    plan = data.plan_rows(TrainConfig(dataset=str(path), dataset_split="train", max_length=131072), tok, n_examples=3)
    huge = plan.examples[0]
    assert huge["row"] == 1 and huge["reason"] == "kept" and len(huge["completion"]) < 2 * data.PREVIEW_CHARS + 100
    assert huge["note"] == f"row 1 is {huge['tokens']:,} tokens; showing the first and last 2,000 characters"
    assert "note" not in plan.examples[1]


def test_nothing_to_train_is_explained_with_the_max_length_that_fits(tmp_path, tok):
    path = write_jsonl(tmp_path / "long.jsonl", [{"instruction": "Summarise", "context": LONG * (1 + i % 3),
                                                  "response": "ok"} for i in range(10)])
    plan = data.plan_rows(TrainConfig(dataset=str(path), dataset_split="train", max_length=32, long_prompts="drop"),
                          tok)
    fit = data.suggest_max_length(plan.lengths)
    assert plan.n_train == 0 and fit % 16 == 0 and sum(n <= fit for n in plan.lengths) >= 9
    msg = plan.refusal()
    assert f"Raise max_length to {fit}, which fits " in msg and "long_prompts to truncate_middle" in msg
    assert "all 10 non-empty rows" in msg and str(path) in msg
    assert data.plan_rows(TrainConfig(dataset=str(path), dataset_split="train", max_length=32), tok).n_train == 10


def test_run_trains_exactly_the_planned_rows_and_reports_the_counts(tmp_path, demo_model_path, capsys):
    from transformers import TrainerCallback

    from core.runs.events import read_events
    from core.train.recipe import run_training
    from core.train.cli import console_sink

    class Seen(TrainerCallback):
        def on_train_begin(self, args, state, control, train_dataloader=None, **kw):
            self.rows = [list(r["input_ids"]) for r in train_dataloader.dataset]

    path = write_jsonl(tmp_path / "mixed.jsonl", mixed_rows())
    for packing in (False, True):
        cfg = demo_config(dataset=str(path), max_length=32, max_steps=2, output_dir=str(tmp_path / "runs"),
                          packing=packing, run_name=f"mixed-{packing}")
        plan = data.plan_rows(cfg, AutoTokenizerOf(demo_model_path), n_examples=3)
        seen = Seen()
        result = run_training(cfg, console_sink(), callbacks=[seen])
        assert result.status == "completed", result.message
        counts = plan.to_dict()
        assert counts["train_rows"] == 9 and counts["prompt_cut"] == 4 and counts["dropped_empty"] == 3
        events = read_events(Path(result.run_dir) / "events.jsonl")
        (event,) = [e for e in events if e["kind"] == "data"]
        assert {k: event[k] for k in counts} == counts
        summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
        assert summary["data"] == counts == result.summary["data"]
        assert plan.describe() in capsys.readouterr().err  # the CLI prints the same line
        if packing:
            assert len(seen.rows) == plan.n_packs and sum(map(len, seen.rows)) == sum(map(len, plan.input_ids))
        else:
            planned = sorted(ids.tolist() for ids in plan.input_ids)
            assert sorted(seen.rows) == planned  # the trainer's rows are the plan's, token for token


def AutoTokenizerOf(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_run_refuses_before_loading_the_model_when_nothing_would_train(tmp_path, demo_model_path):
    from core.train.recipe import run_training

    path = write_jsonl(tmp_path / "long.jsonl", [{"instruction": "Summarise", "context": LONG, "response": "ok"}] * 4)
    events: list = []
    cfg = demo_config(dataset=str(path), max_length=32, long_prompts="drop", output_dir=str(tmp_path / "runs"))
    result = run_training(cfg, events.append)
    assert result.status == "failed" and result.error_type == "data"
    fit = data.suggest_max_length([len(AutoTokenizerOf(demo_model_path)(
        default_prompt("Summarise", LONG) + "ok</s>")["input_ids"])])
    assert f"Raise max_length to {fit}" in result.message and "truncate_middle" in result.message
    assert "loading_model" not in {e.get("phase") for e in events}
    assert result.summary["data"]["dropped_long"] == 4


def test_data_is_checked_before_the_model_is_looked_up(tmp_path):
    from core.train.recipe import run_training

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "response": "b"}\n{"instruction": "cut off\n', encoding="utf-8")
    events: list = []
    cfg = demo_config(model="nobody-has/this-model-cached", dataset=str(bad), output_dir=str(tmp_path / "runs"))
    result = run_training(cfg, events.append)
    assert result.error_type == "data", result.message
    assert "line 2 is not valid JSON" in result.message and "ends inside a string" in result.message
    assert "resolving" not in {e.get("phase") for e in events}


def test_cli_refuses_an_all_too_long_file_fast(tmp_path, capfd, monkeypatch):
    path = write_jsonl(tmp_path / "long.jsonl", [{"instruction": "Summarise", "context": LONG, "response": "ok"}] * 4)
    monkeypatch.setenv("MEMTUNE_HOME", str(tmp_path / "home"))
    code, _, err = train_cli(capfd, "--demo", "--set", f"dataset={path}", "--set", "max_length=32", "--set",
                             "long_prompts=drop", "--set", f"output_dir={tmp_path / 'runs'}")
    assert code != 0 and "Raise max_length to" in err


# --- messages --------------------------------------------------------------------------------------------
def test_bad_json_shows_the_failing_column_and_a_line_cut_inside_a_string(tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_text('{"instruction": "a", "response": "b"}\n{"instruction": "' + "x" * 150 + '\tz", "response": "q"}\n'
                    '{"instruction": "never closed\n', encoding="utf-8")
    msg = error_of(data.load_raw, str(path), "train")
    assert "line 2 is not valid JSON (Invalid control character at column 168)" in msg
    assert "xxx>>>\\tz" in msg  # the text around column 168, not the line's first 80 characters
    path.write_text('{"instruction": "a", "response": "b"}\n{"instruction": "never closed\n', encoding="utf-8")
    msg = error_of(data.load_raw, str(path), "train")
    assert "line 2" in msg and "ends inside a string" in msg and str(path) in msg


def test_wrong_columns_and_row_errors_name_the_file(tmp_path, tok):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a"}])
    msg = error_of(data.check_data, TrainConfig(dataset=str(path), dataset_split="train"))
    assert msg.startswith(f"{path}: The data has columns")
    path = write_jsonl(tmp_path / "who.jsonl", [{"conversations": [{"from": "bot", "value": "x"}]}])
    msg = error_of(data.plan_rows, TrainConfig(dataset=str(path), dataset_split="train"), tok)
    assert str(path) in msg and "unknown speaker" in msg


# --- the page: preview, upload, fit ----------------------------------------------------------------------
def widget_values(cfg):
    from ui.fields import FIELD_NAMES
    from ui.form import to_values

    v = to_values(cfg)
    return [v[n] for n in FIELD_NAMES]


def test_preview_checks_the_file_before_the_tokenizer(tmp_path):
    from ui.data import on_preview

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"instruction,response\ncaf\xe9,x\n")
    for path, expected in ((empty, "is empty"), (latin, "not UTF-8")):
        cfg = TrainConfig(model="nobody-has/this-model-cached", dataset=str(path), dataset_split="train")
        html = on_preview("en", *widget_values(cfg))
        assert "The data cannot be used as it is" in html and expected in html and str(path) in html
        assert "tokenizer could not be loaded" not in html


def test_preview_shows_the_plans_counts_and_a_bounded_page(tmp_path, demo_model_path):
    from ui.data import on_preview

    path = write_jsonl(tmp_path / "mixed.jsonl", mixed_rows() + [{"instruction": "Huge", "context": "",
                                                                  "response": "z" * 50_000}])
    cfg = demo_config(dataset=str(path), max_length=32)
    html = on_preview("en", *widget_values(cfg))
    assert "9 of 13 rows train" not in html and "10 of 13 rows train" in html
    for text in ("4 kept whole", "2 answer cut at max_length", "4 prompt shortened so the answer trains",
                 "3 dropped: empty or null", "max_length 32", 'data-reason="prompt_cut"'):
        assert text in html, text
    for share in ("<b>40%</b> fit", "<b>20%</b> answer cut", "<b>40%</b> prompt shortened"):  # of 10 non-empty rows
        assert share in html, share
    assert len(html) < 40_000  # the 50,000-character row is not sent whole
    assert "Nothing would train" not in html
    long = write_jsonl(tmp_path / "long.jsonl", [{"instruction": "Summarise", "context": LONG, "response": "ok"}] * 3)
    html = on_preview("en", *widget_values(cfg.replace(dataset=str(long), long_prompts="drop")))
    assert "0 of 3 rows train" in html and "3 dropped: the prompt alone fills max_length" in html
    assert "Nothing would train" in html and "Raise max_length to 64" in html and "<b>100%</b> dropped" in html


def test_a_rejected_upload_keeps_the_previous_dataset(tmp_path, monkeypatch, demo_model_path):
    from tests.helpers import upload_as_the_page_does
    from ui.layout import build_ui

    form = build_ui(demo_config().to_dict()).memtune_form
    monkeypatch.setenv("MEMTUNE_HOME", str(tmp_path / "home"))
    good = tmp_path / "in" / "rows.jsonl"
    good.parent.mkdir()
    write_jsonl(good, [DOLLY] * 3)
    out = upload_as_the_page_does(form, "en", str(good), widget_values(demo_config()))
    stored = out[form.fields["dataset"]]
    assert Path(stored).name == "rows.jsonl" and "Format: dolly" in out[form.preview]
    broken = tmp_path / "again" / "rows.jsonl"  # same name, broken: must not replace the stored good file
    broken.parent.mkdir()
    broken.write_text('{"instruction": "a", "response": "b"}\n{"instruction": "cut\n', encoding="utf-8")
    out = upload_as_the_page_does(form, "en", str(broken), widget_values(demo_config(dataset=stored)))
    assert list(out) == [form.preview]  # no field changes: the dataset stays the previous one
    note = out[form.preview]
    assert "Upload not used" in note and f"The dataset stays {stored}" in note and "rows.jsonl" in note
    assert "line 2 is not valid JSON" in note
    assert len(data.load_raw(stored, "train")) == 3  # the earlier upload is intact


def test_fit_uses_the_previewed_lengths_and_says_so(tmp_path, demo_model_path):
    from ui.data import on_preview
    from ui.derive import prediction
    from ui.handlers import on_fit
    from ui.layout import build_ui

    form = build_ui(demo_config().to_dict()).memtune_form
    cfg = demo_config(dataset=str(write_jsonl(tmp_path / "short.jsonl", [DOLLY] * 4)), max_length=2048)
    assert "as if every row reached max_length" in on_fit(form, "en", 8, *widget_values(cfg))[form.fit_note]
    peak_before = prediction(cfg).gib
    on_preview("en", *widget_values(cfg))
    longest = data.known_longest_row(cfg)
    assert longest and longest < 64
    assert f"real rows (the longest is {longest} tokens)" in on_fit(form, "en", 8, *widget_values(cfg))[form.fit_note]
    assert prediction(cfg).gib < peak_before


def test_the_trainers_dataset_holds_exactly_the_planned_rows(demo_tokenizer, tmp_path):
    """plan.train_dataset() builds its Arrow columns in one piece (Dataset.from_dict converted 57,000 rows one by
    one: 3.5 s): the same rows, ids and labels, in the same order and types as from_dict gave, and an empty plan too."""
    import dataclasses

    import datasets

    rows = [{**DOLLY, "response": "Hi " * (i % 7 + 1)} for i in range(40)]
    cfg = demo_config(dataset=str(write_jsonl(tmp_path / "rows.jsonl", rows)))
    plan = data.plan_rows(cfg, demo_tokenizer)
    built = plan.train_dataset()
    ids = datasets.Sequence(datasets.Value("int64"))
    expected = datasets.Dataset.from_dict({"input_ids": plan.input_ids, "labels": plan.labels},
                                          features=datasets.Features({"input_ids": ids, "labels": ids}))
    assert built.features == expected.features and built[:] == expected[:] and len(built) == 40
    assert any(-100 in row for row in built["labels"][:])  # the prompts' labels are masked
    empty = dataclasses.replace(plan, input_ids=[], labels=[]).train_dataset()
    assert len(empty) == 0 and empty.features == expected.features
