"""Issue 43's faults (items 7-13): each case that lost work, trusted a folder it should not, or said a library's error
or a traceback instead of what is wrong and what to do. Cheap: no training (a tiny adapter is made by peft itself)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from core.config.settings import demo_config

WEIGHTS = "adapter_model.safetensors"


# --- 8: zip --out never overwrites the user's own file --------------------------------------------------------------
def _bare_adapter(root: Path) -> Path:
    adapter = root / "myrun" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}", encoding="utf-8")
    return adapter


def test_zip_out_refuses_the_users_own_zip_unless_replace(tmp_path, capsys):
    from core.export.cli import main

    adapter, out = _bare_adapter(tmp_path), tmp_path / "out"
    out.mkdir()
    mine = out / "myrun-adapter.zip"
    mine.write_bytes(b"the user's own file")
    assert main(["zip", str(adapter), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(mine) in err and "--replace" in err and "Traceback" not in err
    assert mine.read_bytes() == b"the user's own file"
    assert main(["zip", str(adapter), "--out", str(out), "--replace"]) == 0
    assert mine.read_bytes().startswith(b"PK")  # now the adapter's zip


# --- 9: the temporary zip folder must be this user's own, closed to others -----------------------------------------
def test_zip_folder_open_to_others_is_refused_even_with_a_marker(tmp_path, monkeypatch):
    from core.export.adapter import ExportError, zip_adapter, zip_dir
    from core.files import write_marker

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"memtune-zips-{os.getuid()}"
    planted.mkdir()
    write_marker(planted, "export")  # a copied marker
    planted.chmod(0o777)
    with pytest.raises(ExportError, match="777"):
        zip_dir()
    with pytest.raises(ExportError):
        zip_adapter(_bare_adapter(tmp_path))
    assert not list(planted.glob("*.zip"))
    planted.chmod(0o700)  # the folder memtune itself makes
    assert zip_dir() == planted


# --- 10: deleting RUN never removes a user's own .RUN.deleting ------------------------------------------------------
def test_delete_run_keeps_an_unmarked_deleting_folder(tmp_path):
    from core.files import write_marker
    from core.runs.history import delete_run, tidy

    run = tmp_path / "run-1"
    run.mkdir()
    write_marker(run, "run")
    (run / "summary.json").write_text(json.dumps({"status": "completed"}), encoding="utf-8")
    users = tmp_path / ".run-1.deleting"
    users.mkdir()
    (users / "notes.txt").write_text("mine", encoding="utf-8")
    delete_run(run, tmp_path, is_running=lambda _: False)
    assert not run.exists()
    assert (users / "notes.txt").read_text(encoding="utf-8") == "mine"
    tidy(tmp_path, is_running=lambda _: False)
    assert (users / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert not [p for p in tmp_path.iterdir() if p != users]  # the run's own trash went


# --- 11: a damaged adapter is named before any library loads it ------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_adapter(tmp_path_factory, demo_model_path) -> Path:
    """A real (untrained) LoRA adapter of the demo model, saved by peft, with the memtune.yaml it would have."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("adapter") / "run" / "adapter"
    model = AutoModelForCausalLM.from_pretrained(demo_model_path)
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(folder)
    demo_config(lora_r=4, lora_alpha=8, lora_target_modules=["q_proj"]).save(folder / "memtune.yaml")
    return folder


def _rank_8(folder: Path) -> None:
    settings = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    (folder / "adapter_config.json").write_text(json.dumps({**settings, "r": 8}), encoding="utf-8")


DAMAGE = {
    "truncated": (WEIGHTS, lambda f: (f / WEIGHTS).write_bytes((f / WEIGHTS).read_bytes()[:1000])),
    "empty": (WEIGHTS, lambda f: (f / WEIGHTS).write_bytes(b"")),
    "garbage": (WEIGHTS, lambda f: (f / WEIGHTS).write_bytes(b"not a tensor file " * 20)),
    "missing": (WEIGHTS, lambda f: (f / WEIGHTS).unlink()),
    "bad json": ("adapter_config.json", lambda f: (f / "adapter_config.json").write_text("{", encoding="utf-8")),
    "rank mismatch": ("r = 8", _rank_8),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_adapter_is_named_for_try_it_and_merge(tiny_adapter, tmp_path, damage, capsys):
    from core.export.cli import main
    from core.infer import Comparer, InferError, adapter_config

    named, harm = DAMAGE[damage]
    folder = tmp_path / "run" / "adapter"
    shutil.copytree(tiny_adapter, folder)
    assert adapter_config(folder).model  # sound before the damage
    harm(folder)
    with pytest.raises(InferError) as said:
        Comparer(wait_s=5).load(folder)  # Try it's load
    assert named in str(said.value) and "Copy the adapter folder again" in str(said.value)
    with pytest.raises(InferError):
        adapter_config(folder)  # what the GGUF export and the page ask first
    assert main(["merge", str(folder), "--out", str(tmp_path / "merged")]) == 2  # an error line, no traceback
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err and "Traceback" not in err
    assert not (tmp_path / "merged").exists()


# --- 13: names no run can start from are refused before a folder is made; sizes in a unit that shows them ----------
@pytest.mark.parametrize("change, field", [
    (dict(model="meta-llama/Llama-3.1-8B\nrm -rf /"), "model"),
    (dict(dataset="/etc/passwd"), "dataset"),
    (dict(dataset="data\x00.jsonl"), "dataset"),
    (dict(validation_data="/dev/null"), "validation_data"),
    (dict(model="not a model id"), "model"),
])
def test_start_refuses_unusable_model_or_data_names_before_a_folder(tmp_path, change, field):
    from core.checks import validate
    from core.jobs.manager import JobManager

    cfg = demo_config(output_dir=str(tmp_path / "runs"), **change)
    problems = validate(cfg)
    assert [p.field for p in problems] == [field], problems
    job = JobManager().start(cfg)  # the engine refuses it too, before any folder or child
    assert job.wait(10)
    assert job.events[-1]["status"] == "failed" and job.folder is None
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_tiny_merge_sizes_show_their_number():
    from core.export.adapter import merge_memory_check, size_text

    assert size_text(434_092) == "423.9 KiB" and size_text(5 * 2**20) == "5.0 MiB" and size_text(3 * 2**30) == "3.0 GiB"
    message = merge_memory_check(demo_config())[3]
    # "0.0 GiB" as a figure of its own: the free RAM may read "20.0 GiB" (the suite on 2026-12-04 failed on it)
    assert not re.search(r"(?<![\d.])0\.0 GiB", message) and "KiB" in message


# --- 7: a validation split overlapping the training split ------------------------------------------------------------
def test_validation_rows_never_train_when_the_splits_overlap():
    from core.data import validation
    from core.data.plan import check_data
    from core.data.read import DataError

    cfg = demo_config(dataset_split="train[:90]", validation_split="train[50:]")
    raw, fmt = check_data(cfg)
    held = validation.split(cfg, raw, fmt)
    assert (len(held.train), len(held.val)) == (50, 50)
    assert not {json.dumps(r, sort_keys=True) for r in held.train} & {json.dumps(r, sort_keys=True) for r in held.val}
    assert held.why.key == "msg.two" and held.why.params["second"]["key"] == "log.val_overlap"
    assert "40 of the 90 training rows" in held.why and "50 rows train" in held.why

    cfg = demo_config(dataset_split="train", validation_split="train")
    raw, fmt = check_data(cfg)
    with pytest.raises(DataError, match="nothing would be left to train on") as said:
        validation.split(cfg, raw, fmt)
    assert said.value.key == "data.err.val_is_train"

    cfg = demo_config(dataset_split="train[:50]", validation_split="train[50:]")  # apart: nothing dropped
    raw, fmt = check_data(cfg)
    assert len(validation.split(cfg, raw, fmt).train) == 50


# --- 12: tracebacks and library words where a message belongs --------------------------------------------------------
DATA = {
    "deep.jsonl": ('{"prompt": "a", "completion": ' + "[" * 100_000 + "]" * 100_000 + "}\n", "data.err.json_too_deep"),
    "twice.jsonl": ('{"prompt": "a", "prompt": "b", "completion": "c"}\n', "data.err.json_key_twice"),
    "scalar.json": ("42\n", "data.err.json_scalar"),
    "object.jsonl": ('{"prompt": {"a": 1}, "completion": "x"}\n' * 2, "data.err.not_text"),
    "list.jsonl": ('{"prompt": "p", "completion": [1, 2]}\n' * 2, "data.err.not_text"),
    "nan.jsonl": ('{"prompt": "p", "completion": 1.5}\n{"prompt": "q", "completion": NaN}\n', "data.err.nan_text"),
    "utf16.csv": ("prompt,completion\na,b\n".encode("utf-16"), "data.err.utf16"),
}


@pytest.mark.parametrize("name", list(DATA))
def test_data_problems_are_named_with_their_fix(tmp_path, name):
    from core.data.plan import check_data
    from core.data.read import DataError

    content, key = DATA[name]
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    with pytest.raises(DataError) as said:
        check_data(demo_config(dataset=str(path)))
    assert key in (said.value.key, said.value.params.get("error", {}).get("key")), str(said.value)  # or nested
    assert "DatasetGenerationError" not in str(said.value) and "latin1" not in str(said.value)


def test_message_lists_stay_a_valid_prompt_completion(tmp_path):
    from core.data.plan import check_data

    path = tmp_path / "chat.jsonl"
    path.write_text('{"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", '
                    '"content": "yo"}]}\n', encoding="utf-8")
    assert check_data(demo_config(dataset=str(path)))[1] == "prompt_completion"


@pytest.mark.parametrize("text, key", [("a: " + "[" * 5000 + "]" * 5000, "problem.yaml_too_deep"),
                                       ("max_steps: " + "9" * 5000, "problem.yaml_number")])
def test_train_config_too_deep_or_too_long_is_a_message(tmp_path, capfd, text, key):
    from core.config.settings import ConfigError, TrainConfig
    from core.i18n import t
    from tests.helpers import train_cli

    config = tmp_path / "config.yaml"
    config.write_text(text, encoding="utf-8")
    with shallow_stack():
        with pytest.raises(ConfigError) as said:
            TrainConfig.load(config)
        assert [p.key for p in said.value.problems] == [key]
        code, out, err = train_cli(capfd, "--config", str(config))
    assert code != 0 and "Traceback" not in out + err
    assert t(key, "en") in out + err  # this problem, not another error met on the way


@contextlib.contextmanager
def shallow_stack(frames: int = 250):
    """Python's recursion limit a few hundred frames above this one while inside: PyYAML reaches it after ~100
    nested [ instead of ~450, and its scanner's cost grows with the depth reached (seconds per load at the default
    limit). The RecursionError and memtune's handling of it are the same."""
    import inspect
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + frames)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.parametrize("command", ["merge", "gguf"])
def test_export_out_with_a_name_too_long_is_a_message(tiny_adapter, tmp_path, capsys, command):
    from core.export.cli import main

    assert main([command, str(tiny_adapter), "--out", str(tmp_path / ("x" * 300))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "300 bytes" in err and "shorter name" in err
