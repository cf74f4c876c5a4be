"""Data read as meant, and inputs bounded: preference cells checked by type (KTO labels, chosen/rejected), identical
pairs and KTO's rows given to SFT said before Start, pairs without a prompt named as such; a preview's or an upload
check's read bounded in rows and decoded bytes; a NUL byte, UTF-16 and long CSV fields each told apart."""

import json
from pathlib import Path

import pytest

from core.config.settings import TrainConfig, demo_config
from core.data import read
from core.data.pairs import check_pairs, plan_pairs
from core.data.plan import check_data
from core.data.read import PREVIEW_LIMIT, DataError, Limit, load_raw
from core.data.upload import check_upload
from core.data.validation import split


def _write(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _refused(fn, *args, **kwargs) -> DataError:
    with pytest.raises(DataError) as said:
        fn(*args, **kwargs)
    return said.value


def _keys(exc: DataError) -> set[str]:
    """The error's key and its nested message's (Naming wraps a row's error with the file and line)."""
    return {exc.key, (exc.params.get("error") or {}).get("key") if isinstance(exc.params.get("error"), dict) else None}


# --- KTO labels -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("label", ["no", -1, 2, "yes", 0.5, {"v": 1}])
def test_kto_labels_other_than_true_false_1_0_are_refused_naming_row_and_line(tmp_path, label):
    rows = [{"prompt": "a", "completion": "x", "label": True}, {"prompt": "b", "completion": "y", "label": label}]
    path = _write(tmp_path / "kto.jsonl", rows)
    said = _refused(check_pairs, demo_config(stage="kto", dataset=path))
    assert "data.err.kto_label" in _keys(said) and said.row == 1
    assert path in str(said) and "Row 2: label" in str(said) and "line 2 of the file" in str(said)


def test_kto_labels_are_read_as_written_in_json_and_csv(tmp_path, demo_tokenizer):
    values = [True, False, 1, 0, "true", "FALSE", "1", "0"]
    rows = [{"prompt": f"p{i}", "completion": "x", "label": v} for i, v in enumerate(values)]
    plan = plan_pairs(demo_config(stage="kto", dataset=_write(tmp_path / "kto.jsonl", rows)), demo_tokenizer)
    assert [r["label"] for r in plan.rows] == [True, False, True, False, True, False, True, False]
    csv = tmp_path / "kto.csv"  # a CSV's fields are text: "false" is false, never bool("false")
    csv.write_text("prompt,completion,label\na,x,true\nb,y,false\nc,z,0\nd,w,\n", encoding="utf-8")
    plan = plan_pairs(demo_config(stage="kto", dataset=str(csv)), demo_tokenizer)
    assert [r["label"] for r in plan.rows] == [True, False, False] and plan.counts["dropped_empty"] == 1


# --- chosen / rejected / prompt / completion --------------------------------------------------------------------------
@pytest.mark.parametrize("value, kind", [(3, "a number"), ({"text": "x"}, "an object"), (["a", "b"], "a list that")])
def test_a_number_or_object_in_a_pair_is_refused_before_any_model(tmp_path, value, kind):
    rows = [{"prompt": "a", "chosen": "x", "rejected": "y"}, {"prompt": "a", "chosen": "x", "rejected": "y"},
            {"prompt": "a", "chosen": value, "rejected": "y"}]
    path = _write(tmp_path / "pairs.jsonl", rows)
    said = _refused(check_pairs, demo_config(stage="dpo", dataset=path))  # no tokenizer, no model
    assert "data.err.pair_cell" in _keys(said) and said.row == 2
    assert "Row 3: column 'chosen' holds " + kind in str(said) and "line 3 of the file" in str(said)
    kto = _write(tmp_path / "kto.jsonl", [{"prompt": 7, "completion": "x", "label": True}])
    assert "column 'prompt' holds a number" in str(_refused(check_pairs, demo_config(stage="kto", dataset=kto)))


def test_text_beside_messages_is_refused_unless_it_is_ultrafeedbacks_prompt(tmp_path, demo_tokenizer):
    user = {"role": "user", "content": "Translate 'cat' into French."}
    mixed = [{"prompt": "a", "chosen": "chat", "rejected": [user, {"role": "assistant", "content": "chien"}]}]
    said = _refused(check_pairs, demo_config(stage="dpo", dataset=_write(tmp_path / "mixed.jsonl", mixed)))
    assert "data.err.pair_mixed" in _keys(said) and "'chosen' is text but 'rejected' is a list of messages" in str(said)
    # a text prompt beside conversations that hold it (HuggingFaceH4/ultrafeedback_binarized): TRL's own reading
    tok = demo_tokenizer.__class__.from_pretrained(demo_tokenizer.name_or_path)
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    ultra = [{"prompt": user["content"], "chosen": [user, {"role": "assistant", "content": "chat"}],
              "rejected": [user, {"role": "assistant", "content": "chien"}]}] * 2
    plan = plan_pairs(demo_config(stage="dpo", dataset=_write(tmp_path / "ultra.jsonl", ultra)), tok)
    assert plan.n_train == 2 and plan.rows[0]["prompt"] == [user]


# --- identical pairs, KTO rows as SFT, pairs without a prompt ---------------------------------------------------------
def test_identical_pairs_are_refused_when_all_and_counted_when_some(tmp_path, demo_tokenizer):
    same = [{"prompt": f"q{i}", "chosen": "x", "rejected": "x"} for i in range(4)]
    said = _refused(check_pairs, demo_config(stage="dpo", dataset=_write(tmp_path / "same.jsonl", same)))
    assert said.key == "data.err.pairs_identical" and "every one of its 4 pairs" in str(said)
    some = same[:1] + [{"prompt": f"q{i}", "chosen": "x", "rejected": "y"} for i in range(3)]
    for stage in ("dpo", "kto"):
        plan = plan_pairs(demo_config(stage=stage, dataset=_write(tmp_path / "some.jsonl", some)), demo_tokenizer)
        notes = [n for n in plan.notes if getattr(n, "key", "") == "log.pairs_identical"]
        assert len(notes) == 1 and notes[0].params == {"n": 1, "total": 4}, stage
        assert any(line is notes[0] for _, line in plan.log_lines())  # said in the run log and the preview


def test_kto_rows_given_to_sft_are_refused_with_the_fix(tmp_path):
    path = _write(tmp_path / "kto.jsonl", [{"prompt": "a", "completion": "x", "label": False}] * 2)
    said = _refused(check_data, TrainConfig(dataset=path))
    assert said.key == "data.err.sft_label" and "Set stage to kto, or drop the label column" in str(said)
    assert check_upload(path)[1] == "unpaired"  # an upload is checked by its own columns, whatever the stage
    classified = _write(tmp_path / "imdb.jsonl", [{"text": "a film", "label": 1}] * 2)  # a classifier's label
    assert check_data(TrainConfig(dataset=classified))[1] == "text"


def test_pairs_without_a_prompt_are_told_so_not_to_raise_max_length(tmp_path, demo_tokenizer):
    nothing_shared = [{"chosen": "Paris.", "rejected": "Lyon."}] * 3
    path = _write(tmp_path / "pairs.jsonl", nothing_shared)
    said = _refused(check_pairs, demo_config(stage="dpo", dataset=path))
    assert said.key == "data.err.pair_no_prompt" and "columns chosen, rejected" in str(said)
    assert "Add a prompt column" in str(said) and "max_length" not in str(said)
    shared = [{"chosen": "Q: capital? A: Paris.", "rejected": "Q: capital? A: Lyon."}] * 3  # HH-RLHF's form
    assert plan_pairs(demo_config(stage="dpo", dataset=_write(tmp_path / "hh.jsonl", shared)), demo_tokenizer).n_train == 3
    empty = [{"prompt": "", "chosen": "x", "rejected": "y"}] * 3
    plan = plan_pairs(demo_config(stage="dpo", dataset=_write(tmp_path / "empty.jsonl", empty)), demo_tokenizer)
    refusal = plan.refusal()
    assert refusal.key == "log.pairs_refusal_empty" and "Raise max_length" not in refusal and "3 rows" in refusal


# --- bounded reads ----------------------------------------------------------------------------------------------------
def _parquet(path: Path, rows: int, width: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = pa.array(["x" * width] * rows)  # one value, dictionary-encoded: a few KB of zstd
    pq.write_table(pa.table({"prompt": text, "completion": pa.array(["y"] * rows)}), path, compression="zstd")
    return path


def test_a_parquet_past_the_row_limit_is_refused_from_its_metadata(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    path = _parquet(tmp_path / "many.parquet", 200_000, 100)
    assert path.stat().st_size < 64 * 1024
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", lambda *a, **k: pytest.fail("rows read past the limit"))
    said = _refused(load_raw, str(path), "train", PREVIEW_LIMIT)
    assert said.key == "data.err.limit_rows" and said.params["rows"] == 200_000 and said.params["max"] == 50_000
    assert "train[:50000]" in str(said)
    whole = TrainConfig(dataset=str(path), dataset_split="train")
    for check in (lambda: check_data(whole, PREVIEW_LIMIT), lambda: check_upload(path)):
        assert _refused(check).key == "data.err.limit_rows"


def test_a_parquet_that_decodes_past_the_byte_limit_is_refused_while_decoding(tmp_path):
    path = _parquet(tmp_path / "wide.parquet", 2_000, 4096)  # 8 MiB decoded from a few KB
    limit = Limit(rows=10_000, bytes=1 * read.MIB)
    said = _refused(load_raw, str(path), "train", limit)
    assert said.key == "data.err.limit_decoded" and "once decompressed" in str(said)
    assert len(load_raw(str(path), "train[:100]", limit)) == 100  # a slice within the limit reads
    assert len(load_raw(str(path), "train")) == 2_000  # training is not bounded


def test_text_files_and_validation_data_are_bounded_too(tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "completion": "a"} for i in range(30)])
    said = _refused(check_data, TrainConfig(dataset=path, dataset_split="train"), Limit(rows=20, bytes=read.MIB))
    assert said.key == "data.err.limit_rows" and "train[:20]" in str(said)
    assert _refused(load_raw, path, "train", Limit(rows=100, bytes=100)).key == "data.err.limit_file"
    small = _write(tmp_path / "small.jsonl", [{"prompt": "q", "completion": "a"}] * 5)
    cfg = TrainConfig(dataset=small, validation_data=path)
    raw, fmt = check_data(cfg)
    assert _refused(split, cfg, raw, fmt, limit=Limit(rows=20, bytes=read.MIB)).key == "data.err.limit_rows"
    assert len(split(cfg, raw, fmt).val) == 30


# --- NUL bytes, UTF-16, long CSV fields -------------------------------------------------------------------------------
def test_a_nul_byte_is_named_as_such_and_utf16_still_recognised(tmp_path):
    path = tmp_path / "nul.jsonl"
    path.write_bytes(b'{"text": "a\x00b"}\n{"text": "c"}\n')
    said = _refused(load_raw, str(path))
    assert said.key == "data.err.nul_byte" and said.params["line"] == 1 and said.params["column"] == 12
    assert "binary or damaged" in str(said) and "iconv" not in str(said)
    path.write_bytes(b'{"text": "a"}\n{"text": "b\x00"}\n')  # on a later line too (it was read as text)
    assert _refused(load_raw, str(path)).params["line"] == 2
    for encoding in ("utf-16", "utf-16-le", "utf-16-be"):  # with a byte-order mark, and without one
        path.write_bytes('{"text": "hello"}\n{"text": "bye"}\n'.encode(encoding))
        assert _refused(load_raw, str(path)).key == "data.err.utf16", encoding


def test_a_long_csv_field_reads_and_one_past_the_limit_says_its_size(tmp_path, monkeypatch):
    path = tmp_path / "long.csv"
    path.write_text('prompt,completion\na,b\n"' + "x" * 200_000 + '",y\n', encoding="utf-8")
    assert len(load_raw(str(path))[1]["prompt"]) == 200_000
    monkeypatch.setattr(read, "CSV_FIELD_LIMIT", 1000)
    path.write_text('prompt,completion\na,b\n"' + "x" * 4998 + '""q""",y\n', encoding="utf-8")
    said = _refused(load_raw, str(path))
    assert said.key == "data.err.csv_field_large" and said.params["line"] == 3
    assert said.params["size"] == 5001 and said.params["max"] == 1000 and "5,001 characters" in str(said)
