"""memtune only deletes or overwrites what it made; faults end in a plain message, never a half-written file.

Every path attack below points a memtune action (History Delete, resume_from, merge Replace) at a folder memtune
did not make, spelled plainly, with `..`, or through a symlink, and checks that the victim's files are
byte-for-byte the same afterwards (a hash of the whole tree) and that the refusal names the folder.
A full disk is a real tmpfs of a few hundred KiB when this process may mount one (root); otherwise the test
simulates ENOSPC at memtune's own write call and says so in its skip/notes.

Longer than ~400 lines: each attack is its own test, spelled out, so a failure names the attack.
"""

import contextlib
import errno
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import checkpointed_run, train_cli, tree_hash

from core import files
from core.checks import validate
from core.config.settings import ConfigError, demo_config
from core.runs.events import read_events
from core.export.adapter import ExportError, merge_adapter, zip_adapter, zip_dir
from core.files import RefusedError, move_into_place, recover, write_marker
from core.runs.history import HistoryError, delete_run, list_runs, resume_config, run_info, tidy
from core.runs.folders import checkpoint_problem, finish_run, resume_point, resume_problem, save_adapter
from core.train.recipe import run_training

ROOT = Path(__file__).resolve().parents[1]




def victim(base: Path, name: str = "victim") -> Path:
    """Somebody's folder that happens to look a bit like a run: a config.yaml, a summary.json, an adapter/."""
    v = base / name
    (v / "adapter").mkdir(parents=True)
    (v / "config.yaml").write_text("my: precious settings\n")
    (v / "summary.json").write_text('{"mine": true}')
    (v / "adapter" / "weights.bin").write_bytes(os.urandom(256))
    return v


@pytest.fixture(scope="module")
def run(tmp_path_factory, demo_model_path):
    """A real memtune run with complete checkpoints at steps 2 and 4."""
    return Path(checkpointed_run(tmp_path_factory.mktemp("runs"), "ok", max_steps=4, save_steps=2).run_dir)


def copy_run(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    return dest


# --- markers ---------------------------------------------------------------------------------------------------------
def test_every_folder_memtune_makes_carries_its_marker(run):
    assert files.marker(run)["kind"] == "run"
    assert files.marker(run / "adapter")["kind"] == "adapter"
    assert {"created", "memtune"} <= set(files.marker(run))
    assert not list(run.glob(".*.tmp")) and not list(run.glob(".*.old"))


# --- History → Delete ------------------------------------------------------------------------------------------------
def test_delete_refuses_every_folder_memtune_did_not_make(run, tmp_path):
    out = tmp_path / "v"
    out.mkdir()
    proj = victim(out, "proj")  # the issue's case: a folder with a config.yaml under the output folder
    outside = victim(tmp_path, "outside")
    (out / "link").symlink_to(outside)
    copy_run(run, out / "mine")
    before = {p: tree_hash(p) for p in (proj, outside)}
    attacks = [proj, out / "mine" / ".." / "proj", out / "link", out / "link" / ".." / "outside",
               tmp_path / "v" / "." / "proj", outside, out]
    for target in attacks:
        with pytest.raises(HistoryError) as err:
            delete_run(target, out, is_running=lambda p: False)
        assert "memtune" in str(err.value) or "link" in str(err.value)
    assert {p: tree_hash(p) for p in (proj, outside)} == before
    assert [r.name for r in list_runs(out)] == ["mine"]  # the look-alike is not even listed
    delete_run(out / "link" / ".." / "v" / "mine", out, is_running=lambda p: False)  # resolved: it is ours
    assert not (out / "mine").exists() and sorted(p.name for p in out.iterdir()) == ["link", "proj"]


# --- resume_from -----------------------------------------------------------------------------------------------------
def test_resume_from_a_foreign_folder_writes_nothing(tmp_path):
    v = victim(tmp_path)
    (tmp_path / "alias").symlink_to(v)
    before = tree_hash(v)
    for spelling in (v, tmp_path / "alias", v / ".." / "victim", v / "adapter" / ".."):
        events = []
        result = run_training(demo_config(resume_from=str(spelling), max_steps=3), events.append)
        assert result.status == "failed" and result.error_type == "config"
        assert "not a memtune run folder" in result.message and str(v) in result.message
        assert [e["kind"] for e in events] == ["error"]
    assert tree_hash(v) == before
    assert sorted(p.name for p in v.iterdir()) == ["adapter", "config.yaml", "summary.json"]


def test_cli_resume_from_a_foreign_folder_exits_nonzero_and_changes_nothing(tmp_path, demo_model_path, capfd):
    v = victim(tmp_path)
    before = tree_hash(v)
    code, _, err = train_cli(capfd, "--demo", "--set", f"resume_from={v}", "--set", "max_steps=3")
    assert code != 0
    assert "not a memtune run folder" in err and "Traceback" not in err
    assert tree_hash(v) == before


def test_resume_refuses_a_run_without_a_complete_checkpoint(run, tmp_path):
    mine = copy_run(run, tmp_path / "mine")
    shutil.rmtree(mine / "checkpoints")
    before = tree_hash(mine)
    result = run_training(demo_config(resume_from=str(mine), max_steps=6))
    assert result.status == "failed" and "no complete checkpoint" in result.message and str(mine) in result.message
    assert tree_hash(mine) == before  # not silently retrained from step 0
    with pytest.raises(HistoryError, match="no complete checkpoint"):
        resume_config(mine)


def test_a_run_without_its_marker_is_not_memtunes_whatever_its_events_say(run, tmp_path):
    """The legacy rule (an events.jsonl naming the folder made it memtune's) is gone: only the marker counts."""
    old = copy_run(run, tmp_path / "ok")  # same name as its `run` event names
    (old / ".memtune.json").unlink()
    before = tree_hash(old)
    assert list_runs(tmp_path) == []
    assert "not a memtune run" in resume_problem(old)
    with pytest.raises(HistoryError, match="no .memtune.json marker"):
        delete_run(old, tmp_path, is_running=lambda p: False)
    result = run_training(demo_config(resume_from=str(old), max_steps=5))
    assert result.status == "failed" and tree_hash(old) == before


def test_a_run_folder_holding_only_its_marker_is_listed_and_deletable(tmp_path):
    """A disk-full leftover: the marker was written, config.yaml never was."""
    left = tmp_path / "run-full"
    left.mkdir()
    write_marker(left, "run")
    assert [r.name for r in list_runs(tmp_path)] == ["run-full"]
    delete_run(left, tmp_path, is_running=lambda p: False)
    assert not left.exists()


def test_a_job_manager_can_prepare_the_run_folder(tmp_path):
    from core.runs.folders import create_run_dir

    cfg = demo_config(output_dir=str(tmp_path), run_name="job")
    run_dir = create_run_dir(cfg, cfg.to_yaml())
    assert files.marker(run_dir)["kind"] == "run" and (run_dir / "config.yaml").is_file()
    assert create_run_dir(cfg, cfg.to_yaml(), prepared=run_dir) == run_dir  # the child continues in it
    assert create_run_dir(cfg, cfg.to_yaml()).name == "job-2"  # a second run never reuses the folder
    v = victim(tmp_path)
    before = tree_hash(v)
    with pytest.raises(ConfigError, match="not a fresh run folder"):
        create_run_dir(cfg, cfg.to_yaml(), prepared=v)
    assert tree_hash(v) == before


# --- merge → Replace ---------------------------------------------------------------------------------------------------
def test_merge_replace_refuses_folders_memtune_did_not_merge(run, tmp_path):
    adapter = run / "adapter"
    v = victim(tmp_path)
    runs_root = run.parent
    (tmp_path / "alias").symlink_to(v)
    before = {p: tree_hash(p) for p in (v, runs_root)}
    for target in (v, v / ".." / "victim", tmp_path / "alias", runs_root, run, adapter):
        with pytest.raises(ExportError) as err:
            merge_adapter(adapter, target, overwrite=True)
        assert "memtune will not replace it" in str(err.value) and str(Path(os.path.realpath(target))) in str(err.value)
    assert {p: tree_hash(p) for p in (v, runs_root)} == before


def test_merge_replace_works_for_any_spelling_of_its_own_folder(run, tmp_path):
    base = tmp_path / "x"
    first = merge_adapter(run / "adapter", base)
    assert files.marker(first)["kind"] == "merged"
    again = merge_adapter(run / "adapter", tmp_path / "x" / ".." / "x", overwrite=True)  # the issue's spelling
    assert again == base and (base / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]  # no .x.old / .x.tmp left


# --- the atomic move ---------------------------------------------------------------------------------------------------
def _folder(path: Path, text: str, kind: str | None = "merged") -> Path:
    path.mkdir(parents=True)
    (path / "f.txt").write_text(text)
    if kind:
        write_marker(path, kind)
    return path


def test_move_into_place_through_dotdot_and_crash_recovery(tmp_path):
    final = _folder(tmp_path / "x", "old")
    _folder(tmp_path / ".x.tmp", "new")
    assert move_into_place(tmp_path / ".x.tmp", tmp_path / "x" / ".." / "x") == final
    assert (final / "f.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["x"]

    # A crash between the two renames: .x.old holds the last good folder, x is gone, .x.tmp half written.
    os.replace(final, tmp_path / ".x.old")
    _folder(tmp_path / ".x.tmp", "half")
    assert "restored" in recover(tmp_path / "x")
    assert (final / "f.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["x"]
    # A crash after the second rename: only the .old is left over.
    _folder(tmp_path / ".x.old", "older")
    recover(tmp_path / "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]


def test_a_failed_second_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    final = _folder(tmp_path / "x", "old")
    _folder(tmp_path / ".x.tmp", "new")
    real_replace, calls = os.replace, []

    def flaky(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", flaky)
    with pytest.raises(OSError):
        move_into_place(tmp_path / ".x.tmp", final)
    assert (final / "f.txt").read_text() == "old"


def test_recovery_never_touches_unmarked_lookalikes(tmp_path):
    final = _folder(tmp_path / "x", "mine")
    foreign_old = _folder(tmp_path / ".x.old", "theirs", kind=None)
    foreign_tmp = _folder(tmp_path / ".x.tmp", "theirs too", kind=None)
    before = {p: tree_hash(p) for p in (foreign_old, foreign_tmp)}
    assert recover(final) is None
    with pytest.raises(RefusedError, match="not made by memtune"):
        move_into_place(tmp_path / ".x.tmp", final)
    assert {p: tree_hash(p) for p in (foreign_old, foreign_tmp)} == before


def test_startup_tidy_restores_an_adapter_a_crash_left_aside(run, tmp_path):
    mine = copy_run(run, tmp_path / "mine")
    os.replace(mine / "adapter", mine / ".adapter.old")  # died between the renames of an adapter save
    (mine / "checkpoints" / "checkpoint-9").mkdir()  # a checkpoint whose save never completed
    assert run_info(mine, is_running=lambda p: False).adapter_dir is None
    tidy(tmp_path, is_running=lambda p: False)
    assert run_info(mine, is_running=lambda p: False).adapter_dir == str(mine / "adapter")
    assert not (mine / ".adapter.old").exists() and not (mine / "checkpoints" / "checkpoint-9").exists()


# --- damaged checkpoints -----------------------------------------------------------------------------------------------
def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_used(run, tmp_path):
    mine = copy_run(run, tmp_path / "mine")
    bad = mine / "checkpoints" / "checkpoint-4" / "adapter_model.safetensors"
    _truncate(bad)
    assert str(bad) in checkpoint_problem(bad.parent)
    ckpt, skipped = resume_point(mine)
    assert ckpt.name == "checkpoint-2" and str(bad) in skipped[0]
    events = []
    result = run_training(demo_config(resume_from=str(mine), max_steps=5, logging_steps=1), events.append)
    assert result.status == "completed", result.message
    assert result.summary["resumed_from"].endswith("checkpoint-2")
    assert any(e["kind"] == "log" and str(bad) in e["message"] for e in events)
    assert [e["step"] for e in events if e["kind"] == "step"] == [3, 4, 5]


def test_no_usable_checkpoint_means_no_resume_button(run, tmp_path):
    mine = copy_run(run, tmp_path / "mine")
    for n in (2, 4):
        _truncate(mine / "checkpoints" / f"checkpoint-{n}" / "optimizer.pt")
    assert not run_info(mine, is_running=lambda p: False).resumable
    with pytest.raises(HistoryError, match="optimizer.pt is damaged"):
        resume_config(mine)


# --- full disk -------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def small_disk(path: Path, size: str, *options: str):
    """A real tmpfs of `size` at path, or None where this process may not mount (not root, no CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join((f"size={size}", *options))
    may_mount = os.geteuid() == 0 and not os.environ.get("MEMTUNE_TEST_NO_MOUNT")  # the latter tests the fallback
    mounted = may_mount and subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                                           capture_output=True).returncode == 0
    try:
        yield path if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(disk: Path, leave: int, name: str = "filler") -> None:
    """Fill the disk so that only about `leave` bytes stay free."""
    free = shutil.disk_usage(disk).free
    with open(disk / name, "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))


def test_disk_full_while_saving_keeps_the_previous_adapter(run, tmp_path, monkeypatch, demo_model_path):
    from core.model.load import load_tokenizer, load_with_adapter

    cfg = demo_config()
    with small_disk(tmp_path / "disk", "2m") as disk:
        mine = (disk or tmp_path) / "mine"
        shutil.copytree(run, mine, ignore=shutil.ignore_patterns("checkpoints"))
        before = {n: tree_hash(mine / n) if (mine / n).is_dir() else (mine / n).read_bytes()
                  for n in ("adapter", "summary.json", "config.yaml")}
        model = load_with_adapter(cfg, mine / "adapter")
        tokenizer = load_tokenizer(cfg)
        if disk:
            _fill(disk, 16 * 1024)
        else:  # no tmpfs here: the disk "fills up" at memtune's own write call, after the weights were written
            import core.runs.folders

            def full(path):
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(core.runs.folders, "dir_size", full)
            monkeypatch.setattr(core.runs.folders, "atomic_write_text", lambda path, text: full(path))
        with pytest.raises(OSError) as err:
            save_adapter(model, tokenizer, cfg.to_yaml(), mine, {"status": "completed"})
        assert str(err.value).startswith(f"No space left in {mine}")
        if disk:
            _fill(disk, 0, "filler2")  # the failed save freed its temporary folder: full again
        problem = finish_run(mine, {"status": "completed", "final_loss": 1.0})
        if disk:  # the config file too: no 0-byte config.yaml
            with pytest.raises(OSError, match="No space left"):
                cfg.save(mine / "config.yaml")
            assert problem and "No space left" in problem
        after = {n: tree_hash(mine / n) if (mine / n).is_dir() else (mine / n).read_bytes()
                 for n in ("adapter", "summary.json", "config.yaml")}
        assert after == before  # previous adapter, summary and settings intact, none 0 bytes
        assert sorted(p.name for p in mine.iterdir() if p.name.startswith(".")) == [".memtune.json"]


def test_disk_full_during_a_run_ends_in_a_plain_message_and_a_done_event(tmp_path, demo_model_path):
    with small_disk(tmp_path / "disk", "160k") as disk:
        if disk is None:
            pytest.skip("cannot mount a tmpfs here (needs root); the save path is covered by the simulated test above")
        result = run_training(demo_config(output_dir=str(disk), run_name="full", max_steps=2))
        assert result.status == "failed" and result.error_type == "disk", result.message
        assert result.message.startswith(f"No space left in {disk / 'full'}")
        run_dir = disk / "full"
        assert not (run_dir / "adapter").exists() and not list(run_dir.glob(".*.tmp"))
        events = read_events(run_dir / "events.jsonl")
        assert events[-1]["kind"] == "done" and events[-1]["status"] == "failed"
        assert json.loads((run_dir / "summary.json").read_text())["error_type"] == "disk"


# --- unwritable output, bad numbers ------------------------------------------------------------------------------------
def test_an_output_folder_that_cannot_be_written_fails_before_loading(tmp_path, capfd):
    (tmp_path / "file").write_text("x")
    for bad in ("/proc/self", "/proc/self/runs", str(tmp_path / "file"), str(tmp_path / "file" / "runs")):
        events = []
        result = run_training(demo_config(output_dir=bad, max_steps=2), events.append)
        assert result.status == "failed" and result.error_type == "config" and "output_dir" in result.message
        assert [e["kind"] for e in events] == ["error"]  # nothing loaded, nothing written
    with small_disk(tmp_path / "ro", "64k", "ro") as ro:
        if ro is not None:
            assert "read-only" in str(validate(demo_config(output_dir=str(ro / "runs")))[0])
    code, _, err = train_cli(capfd, "--demo", "--set", "output_dir=/proc/self")
    assert code != 0 and "output_dir" in err and "Traceback" not in err


def test_nan_and_infinity_are_refused_for_every_float_field():
    from dataclasses import fields

    from core.config.settings import TrainConfig

    float_fields = [f.name for f in fields(TrainConfig) if f.type in ("float", float)]
    assert {"learning_rate", "lora_dropout", "num_train_epochs", "weight_decay", "max_grad_norm"} <= set(float_fields)
    for name in float_fields:
        for value in (float("nan"), float("inf"), float("-inf")):
            problems = validate(demo_config(**{name: value}))
            assert [p.field for p in problems] == [name], (name, value)
            assert "not a finite number" in problems[0].message
    for seed, ok in ((0, True), (2**32 - 1, True), (2**32, False), (-1, False)):
        assert (validate(demo_config(seed=seed)) == []) is ok


def test_every_whole_number_field_has_an_upper_bound_refused_by_name():
    from dataclasses import fields

    from core.config.settings import TrainConfig

    int_fields = [f for f in fields(TrainConfig) if f.type in ("int", int)]
    assert {"max_steps", "warmup_steps", "save_steps", "logging_steps"} <= {f.name for f in int_fields}
    for f in int_fields:
        assert f.metadata.get("max") is not None, f"{f.name} has no upper bound"
        problems = validate(demo_config(**{f.name: 99999999999999999999999999999}))
        mine = [p for p in problems if p.field == f.name]  # others may follow from it (num_machines: an address)
        assert mine and "above the maximum" in mine[0].message, problems


def test_yaml_list_for_text_and_duplicate_keys_are_refused_by_name(tmp_path, monkeypatch):
    from core.config.settings import TrainConfig

    with pytest.raises(ConfigError) as err:
        TrainConfig.from_yaml("model: [a, b]\n")
    assert err.value.problems[0].field == "model" and "is a list" in str(err.value)
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_yaml("lora_r: 8\nmax_steps: 3\nlora_r: 16\n")
    assert err.value.problems[0].field == "lora_r" and "lines 1 and 3" in str(err.value)
    with pytest.raises(ConfigError, match="run_name: .* is a dict"):
        TrainConfig.from_yaml("lora_target_modules: q_proj\nrun_name: {a: 1}\n")


def test_the_apps_load_shows_a_huge_number_as_a_message(tmp_path, monkeypatch):
    from ui.handlers import on_load_config
    from ui.layout import build_ui

    form = build_ui(demo_config().to_dict()).memtune_form
    monkeypatch.setenv("MEMTUNE_CONFIG_DIR", str(tmp_path))
    (tmp_path / "huge.yaml").write_text("max_steps: 99999999999999999999999999999\n")
    (tmp_path / "twice.yaml").write_text("lora_r: 8\nlora_r: 16\n")
    for name, expected in (("huge", "max_steps"), ("twice", "set twice")):
        res = on_load_config(form, "en", name)
        assert list(res) == [form.config_notice] and expected in res[form.config_notice]  # the form is untouched


# --- exports leave nothing in /tmp ---------------------------------------------------------------------------------
def test_zips_replace_each_other_instead_of_piling_up_temp_folders(run, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's own temp folder
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("memtune-export-*"))
    first = zip_adapter(run / "adapter")
    second = zip_adapter(run / "adapter")
    assert first == second and first.parent == zip_dir()
    assert set(tmp.glob("memtune-export-*")) == before
    assert sorted(p.name for p in zip_dir().iterdir()) == [".memtune.json", "ok-adapter.zip"]
    old = time.time() - 2 * 3600  # served long ago (Gradio keeps its own copy): removed with the next zip
    os.utime(first, (old, old))
    zip_dir()
    assert not first.exists()


def test_the_zip_folder_refuses_a_lookalike(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    squat = tmp_path / f"memtune-zips-{os.getuid()}"
    victim(tmp_path, squat.name)
    before = tree_hash(squat)
    with pytest.raises(ExportError, match="not made by memtune"):
        zip_dir()
    assert tree_hash(squat) == before


def test_config_error_names_the_refused_resume_folder(tmp_path):
    v = victim(tmp_path)
    with pytest.raises(ConfigError, match="resume_from"):
        from core.checks import check

        check(demo_config(resume_from=str(v)))


# --- login -----------------------------------------------------------------------------------------------------
def test_auth_refuses_blank_passwords_and_pauses_after_a_wrong_login(monkeypatch):
    import asyncio

    import app

    for bad in ("me:", "me:   ", ":pw", "me"):
        with pytest.raises(ValueError):
            app.parse_auth(bad)
    pauses = []

    async def sleep(seconds):
        pauses.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    check = app.auth_check(("me", "s3cret:x"))
    assert asyncio.run(check("me", "s3cret:x")) is True and pauses == []
    assert asyncio.run(check("me", "wrong")) is False and pauses == [app.FAILED_LOGIN_DELAY_S]
    assert asyncio.run(check("you", "s3cret:x")) is False and len(pauses) == 2


# --- trust_remote_code needs the user's own tick ---------------------------------------------------------------------
def _form(form, res):
    """The config a handler's {component: update} puts into the settings form."""
    from ui.fields import FIELD_NAMES, collect

    cfg, problems = collect({n: res[form.fields[n]] for n in FIELD_NAMES})
    assert cfg is not None, problems
    return cfg


def test_a_loaded_config_never_turns_trust_remote_code_on_by_itself(run, tmp_path, monkeypatch):
    from core.jobs.manager import JobManager
    from ui import history
    from ui.handlers import on_load_config
    from ui.layout import build_ui

    page = build_ui(demo_config().to_dict())
    form, h = page.memtune_form, page.memtune_history
    monkeypatch.setenv("MEMTUNE_CONFIG_DIR", str(tmp_path / "configs"))
    demo_config(trust_remote_code=True).save(tmp_path / "configs" / "remote.yaml")
    res = on_load_config(form, "en", "remote")
    notice = res[form.config_notice]
    assert _form(form, res).trust_remote_code is False and "trust_remote_code" in notice and "OFF" in notice

    mine = copy_run(run, tmp_path / "mine")
    cfg = demo_config(output_dir=str(tmp_path), run_name="mine", max_steps=4, trust_remote_code=True)
    cfg.save(mine / "config.yaml")
    res = history.on_history_load(form, h, "en", str(mine))
    assert _form(form, res).trust_remote_code is False and "OFF" in res[h.note]
    manager = JobManager()
    monkeypatch.setattr(page.memtune_app, "manager", manager)
    res = history.on_history_resume(form, h, "fr", str(mine))
    assert manager.current() is None  # nothing started: the user confirms by ticking, then presses Start
    cfg = _form(form, res)
    assert cfg.trust_remote_code is False and cfg.resume_from == str(mine) and "DÉSACTIVÉ" in res[h.note]


@pytest.fixture
def remote_code_adapter(run, tmp_path, monkeypatch, demo_model_path):
    """An adapter whose memtune.yaml has trust_remote_code: true and whose base model's config.json maps AutoConfig
    to a class of its own that writes a file when its code runs (the issue's repro)."""
    from core.config.settings import TrainConfig

    evil = Path(shutil.copytree(demo_model_path, tmp_path / "evil-model"))
    config = json.loads((evil / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    (evil / "config.json").write_text(json.dumps(config))
    ran = tmp_path / "the-model-code-ran"
    (evil / "configuration_evil.py").write_text(
        f"from pathlib import Path\nPath({str(ran)!r}).write_text('ran')\n"
        "from transformers import LlamaConfig\n\n\nclass EvilConfig(LlamaConfig):\n    model_type = 'llama'\n")
    adapter = Path(shutil.copytree(run / "adapter", tmp_path / "r" / "adapter"))
    write_marker(adapter.parent, "run")
    TrainConfig.load(adapter / "memtune.yaml").replace(model=str(evil), trust_remote_code=True).save(
        adapter / "memtune.yaml")
    return adapter, ran


def test_no_model_code_runs_without_the_users_own_tick(remote_code_adapter, tmp_path, capsys):
    from core.export.cli import main as export_main
    from core.infer import Comparer, InferError
    from ui import gguf, tryexport
    from ui.state import AppState

    adapter, ran = remote_code_adapter
    x = tryexport.TryExportTab(*(object() for _ in range(9)), app=AppState())
    notes = [u.get(x.try_note) for u in tryexport.on_try(x, "en", str(adapter), "Hi", 4, 0.0, 0.9, 0, False)]
    assert "trust_remote_code" in str(notes[-1])
    with pytest.raises(InferError, match="--trust-remote-code"):
        list(Comparer().compare(adapter, "Hi", max_new_tokens=2))
    with pytest.raises(ExportError, match="trust_remote_code: true"):
        merge_adapter(adapter, tmp_path / "m")
    assert "trust_remote_code" in tryexport.on_merge(x, "en", str(adapter), "", False, True, progress=None)
    status, _ = gguf.on_gguf_export(x.app, "en", str(adapter), ["f16"], False, progress=None)
    assert "trust_remote_code" in status
    for argv in (["merge", str(adapter)], ["gguf", str(adapter), "--formats", "f16"]):
        assert export_main(argv) == 2 and "--trust-remote-code" in capsys.readouterr().err
    assert not ran.exists() and not (tmp_path / "m").exists() and not (adapter.parent / "gguf").exists()
    try:  # with the confirmation the model's own code does run: the trap is real
        merge_adapter(adapter, tmp_path / "m", trust_remote_code=True)
    except Exception:  # noqa: BLE001 - the custom class may not load as a model; it has run by then
        pass
    assert ran.read_text() == "ran"


def test_start_is_free_as_soon_as_the_page_says_completed(tmp_path, demo_model_path):
    """The child writes `done` and then takes ~0.7 s to exit: a Start in that moment waits for it, not JobBusy."""
    from core.jobs.manager import JobManager
    from core.jobs.view import job_view

    mgr = JobManager()
    first = mgr.start(demo_config(max_steps=1, output_dir=str(tmp_path), run_name="a"))
    deadline = time.monotonic() + 240
    while not first.said_done() and first.running and time.monotonic() < deadline:
        time.sleep(0.005)
    assert job_view(first).state == "completed", job_view(first).message  # what the page shows now
    second = mgr.start(demo_config(max_steps=100000, output_dir=str(tmp_path), run_name="b"))  # not refused
    assert second is not first and not first.running
    mgr.end_now()  # ends it at once
    assert second.wait(240)


def test_a_short_run_says_why_no_loss_was_logged(tmp_path, demo_model_path, capfd):
    code, out, _ = train_cli(capfd, "--demo", "--set", "max_steps=2", "--set", "logging_steps=50",
                             "--set", f"output_dir={tmp_path}")
    assert code == 0 and "None" not in out
    assert "no loss was logged" in out and "logging_steps" in out and "2 optimizer step" in out


def _dtypes(path: Path) -> tuple[set[str], int]:
    import struct

    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}, path.stat().st_size


def test_a_resumed_run_keeps_the_adapters_dtype(run, tmp_path):
    mine = copy_run(run, tmp_path / "mine")
    before = _dtypes(mine / "adapter" / "adapter_model.safetensors")
    assert before[0] == {"BF16"}  # TRL keeps QLoRA adapters in bf16
    result = run_training(demo_config(resume_from=str(mine), max_steps=5, save_strategy="steps", save_steps=5))
    assert result.status == "completed", result.message
    assert _dtypes(mine / "adapter" / "adapter_model.safetensors") == before  # same dtype, same size
    assert _dtypes(mine / "checkpoints" / "checkpoint-5" / "adapter_model.safetensors") == before


# --- public mode -----------------------------------------------------------------------------------------------------
@pytest.fixture
def public(public_mode):
    return public_mode


def test_public_mode_reads_no_server_path_a_visitor_types(public, run, tmp_path, demo_model_path):
    from core.data.plan import DataError, load_raw
    from core.model.load import ModelError, load_tokenizer
    from core.runs.public import upload_root

    secret = victim(tmp_path, "secret")
    bad = demo_config(dataset=str(secret / "config.yaml"), output_dir=str(tmp_path), trust_remote_code=True)
    fields = {p.field for p in validate(bad)}
    assert {"dataset", "output_dir", "trust_remote_code"} <= fields
    assert [p.field for p in validate(demo_config(model=str(demo_model_path), output_dir=str(public)))] == ["model"]
    assert validate(demo_config(output_dir=str(public))) == []  # the demo, the app's own folder: fine
    assert validate(demo_config(output_dir=str(public / ".." / "app-runs" / "sub"))) == []
    with pytest.raises(DataError, match="path on the server"):
        load_raw(str(secret / "config.yaml"))
    with pytest.raises(DataError, match="path on the server"):
        load_raw("../../etc/passwd")
    with pytest.raises(ModelError, match="path on the server"):
        load_tokenizer(demo_config(model=str(demo_model_path)))  # what Preview calls
    with pytest.raises(ModelError, match="trust_remote_code is not available"):
        load_tokenizer(demo_config(trust_remote_code=True))
    from core.runs.public import dataset_problem

    assert dataset_problem(str(upload_root() / "mine.jsonl")) is None  # uploads are the way in


def test_public_history_and_export_act_only_inside_the_apps_folder(public, run, tmp_path, monkeypatch):
    from core.jobs.manager import JobManager
    from ui import history, tryexport
    from ui.layout import build_ui, header_html

    page = build_ui(demo_config().to_dict())
    form, h = page.memtune_form, page.memtune_history
    copy_run(run, public / "visitor-run")
    outside = copy_run(run, tmp_path / "elsewhere")  # a memtune run, but not in the app's folder
    before = tree_hash(outside)
    dirs = history.on_history_refresh(h, "en", str(tmp_path))[h.runs]  # the typed folder is ignored
    assert dirs == [str(public / "visitor-run")]
    res = history.on_history_delete_yes(h, "en", str(outside), str(tmp_path))
    assert "not a run folder inside" in res[h.note]
    assert "public server" in history.on_history_load(form, h, "en", str(outside))[h.note]
    assert "public server" in history.on_history_resume(form, h, "en", str(outside))[h.note]
    x = page.memtune_try_export
    assert "public server" in tryexport.on_zip(x, "en", str(outside / "adapter"))[x.export_note]
    assert "public server" in tryexport.on_merge(x, "en", str(public / "visitor-run" / "adapter"), str(tmp_path / "m"),
                                             False, True, progress=None)
    assert tree_hash(outside) == before and not (tmp_path / "m").exists()
    assert 'id="mt-public"' in header_html("pt") and "Modo público" in header_html("pt")


def test_public_uploads_work_and_each_visitor_sees_only_their_own(public, tmp_path, monkeypatch, demo_model_path):
    """SPACE_ID set: an upload is used (it was refused as "a path on the server"), kept in the visitor's own
    folder; another visitor's typed path to it, or to the shared folder, is refused; runs are per visitor too."""
    from core.runs import public as pub
    from tests.helpers import upload_as_the_page_does
    from ui.data import on_preview
    from ui.fields import FIELD_NAMES
    from ui.form import read_config
    from ui.layout import build_ui
    from ui.notices import runs_folder

    monkeypatch.delenv("MEMTUNE_PUBLIC")
    monkeypatch.setenv("SPACE_ID", "someone/memtune")
    who = {"now": "visitorAAAA1xxxxxxxxxx"}
    monkeypatch.setattr(pub, "_visitor_source", lambda: who["now"])
    form = build_ui(demo_config().to_dict()).memtune_form
    values = [getattr(demo_config(output_dir=str(public)), n) for n in FIELD_NAMES]  # the app's runs folder
    data = tmp_path / "gradio-tmp" / "pairs.jsonl"  # where Gradio puts an upload: outside memtune's folders
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"instruction": f"Say {w}", "response": w}) + "\n" for w in "abc"))
    res = upload_as_the_page_does(form, "en", str(data), values)
    box = res[form.fields["dataset"]]["value"] if isinstance(res[form.fields["dataset"]], dict) \
        else res[form.fields["dataset"]]
    assert box == "uploads/pairs.jsonl"  # the page names it in the visitor's space, never the server's path
    mine = Path(pub.from_shown(box))
    assert mine.parent == pub.upload_root() and mine.parent.name == "visitor-visitorAAAA1xxxxxxxxxx" and mine.is_file()
    assert "3 of 3 rows train" in res[form.preview] and "path on the server" not in res[form.preview]
    assert not list(mine.parent.glob(".incoming-*"))
    cfg, problems = read_config(values)
    assert problems == [] and Path(cfg.output_dir) == public / "visitor-visitorAAAA1xxxxxxxxxx"  # the run goes there
    cfg, _ = read_config([box if n == "dataset" else v for n, v in zip(FIELD_NAMES, values)])
    assert cfg.dataset == str(mine)  # `uploads/pairs.jsonl` is the visitor's own file
    assert runs_folder("runs") == str(public / "visitor-visitorAAAA1xxxxxxxxxx")

    who["now"] = "visitorBBBB2yyyyyyyyyy"  # another visitor types A's path, the shared folder, or A's folder
    for typed in (mine, mine.parent, mine.parent.parent, mine.parent / ".." / mine.parent.name / mine.name,
                  "uploads/../visitor-visitorAAAA1xxxxxxxxxx/pairs.jsonl"):
        values_b = [str(typed) if n == "dataset" else getattr(demo_config(), n) for n in FIELD_NAMES]
        html = on_preview("en", *values_b)
        assert "path on the server" in html and "Say a" not in html, typed
    assert runs_folder("runs") == str(public / "visitor-visitorBBBB2yyyyyyyyyy")
    who["now"] = "../../etc"  # an id the server never issued names no one's folder
    assert pub.upload_root().name == "visitor-unknown"


def test_public_limits_and_retention_of_visitors_runs_and_uploads(public, run, tmp_path, monkeypatch):
    """The Space owner's limits come from the environment (a typo keeps the default); a visitor's runs and uploads
    untouched for MEMTUNE_SPACE_KEEP_HOURS are deleted, never a running run, a fresh one, or anything not memtune's."""
    import os

    from core.config.settings import cache_root
    from core.runs import public as pub

    monkeypatch.setenv("MEMTUNE_SPACE_JOBS", "2")  # the others unset: their defaults
    monkeypatch.setenv("MEMTUNE_SPACE_MINUTES", "many")  # unreadable: the default, never "no limit"
    monkeypatch.setenv("MEMTUNE_SPACE_STEPS", "50")
    assert pub.limits() == pub.SpaceLimits(jobs=2, minutes=30.0, steps=50, disk_gib=2.0, keep_hours=48.0)
    monkeypatch.setattr(pub, "_visitor_source", lambda: "retentionVisitor1xxxxx")  # this test's own visitor
    problems = pub.public_problems(demo_config(output_dir=str(pub.public_root()), max_steps=51))
    assert [p.field for p in problems] == ["max_steps"] and "at most 50 steps" in problems[0].message
    assert pub.disk_used() == 0
    monkeypatch.setattr(pub, "_visitor_source", lambda: None)  # retention runs outside any request

    old, running, fresh = (copy_run(run, public / f"visitor-{who}" / "r") for who in ("old", "busy", "new"))
    stray = public / "visitor-old" / "not-memtune"
    stray.mkdir()
    uploads = cache_root() / "uploads" / "visitor-old"
    uploads.mkdir(parents=True, exist_ok=True)
    (uploads / "mine.jsonl").write_text("{}\n")
    import time

    now = time.time()  # other tests' uploads in the shared home are minutes old: kept
    for path in (old, running, stray, uploads):
        for dirpath, _, files in os.walk(path):
            for name in files + [""]:
                os.utime(os.path.join(dirpath, name), (now - 49 * 3600, now - 49 * 3600))
    for dirpath, _, files in os.walk(fresh):
        for name in files + [""]:
            os.utime(os.path.join(dirpath, name), (now - 3600, now - 3600))
    done = pub.prune_visitors(48, lambda p: p == running, now=now)
    assert sorted(done) == sorted([str(old), str(uploads / "mine.jsonl")])
    assert not old.exists() and running.is_dir() and fresh.is_dir() and stray.is_dir()
    assert not uploads.exists()  # emptied, so removed
    assert pub.prune_visitors(0, lambda p: False, now=now) == []  # 0: kept for ever


def test_a_visitor_is_the_id_the_server_signed_and_a_session_hash_stays_with_its_first_visitor():
    """Issue 38: the visitor was whoever sent a session hash. Now: an id in a cookie this server signed (a forged,
    edited or foreign cookie is a new visitor), set HttpOnly and SameSite=Lax; a session hash another visitor used
    first is refused (403), in a JSON body, the query or the path."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from core.runs import identity
    from ui.visitors import VisitorCookie, request_visitor

    visitor_id, value = identity.issue()
    assert identity.verified(value) == visitor_id and len(visitor_id) == 22
    _, issued, signature = value.split(".")
    forged = [f"{visitor_id}.{issued}.{'0' * 64}", value[:-1] + ("0" if value[-1] != "0" else "1"), visitor_id, "",
              f"{'A' * 22}.{issued}.{signature}", f"../../etc.{issued}.{signature}",
              f"{visitor_id}.{int(issued) + 1}.{signature}", f"{visitor_id}.{signature}"]
    assert [identity.verified(v) for v in forged] == [None] * len(forged)

    def who(request):  # the id the middleware verified or issued, as a handler reads it
        return PlainTextResponse(request_visitor(request) or "nobody")

    app = VisitorCookie(Starlette(routes=[Route("/who", who, methods=["GET", "POST"]),
                                          Route("/gradio_api/heartbeat/{h}", who)]))
    a, b = TestClient(app), TestClient(app)
    first = a.get("/who")
    header = first.headers["set-cookie"]
    assert "HttpOnly" in header and "SameSite=Lax" in header and "Path=/" in header and "Secure" not in header
    # over https (a Space, shown inside huggingface.co's frame): kept there, and only under that top-level site
    assert identity.set_cookie_header(value, True).endswith("; HttpOnly; Secure; SameSite=None; Partitioned")
    assert TestClient(app, base_url="https://space.example").get("/who").headers["set-cookie"].endswith("Partitioned")
    a_id = first.text
    assert a.get("/who").text == a_id and "set-cookie" not in a.get("/who").headers  # kept, not issued again
    assert b.get("/who").text not in (a_id, "nobody")  # another browser, another visitor
    forger = TestClient(app, cookies={identity.COOKIE: f"{a_id}.{issued}.{'0' * 64}"})  # A's id, a made-up signature
    assert forger.get("/who").text not in (a_id, "nobody")  # a new visitor
    assert a.post("/who", json={"session_hash": "page-of-a-1"}).status_code == 200
    for request in (lambda c: c.post("/who", json={"session_hash": "page-of-a-1"}),
                    lambda c: c.post("/who", content=b'{"session_hash": "page-of-a-1"}'),  # no content type
                    lambda c: c.post("/who", content=b'{"session_hash": "page-of-a-1"}',
                                     headers={"content-type": "text/plain"}),
                    lambda c: c.get("/who?session_hash=page-of-a-1"),
                    lambda c: c.get("/gradio_api/heartbeat/page-of-a-1")):
        assert request(b).status_code == 403 and request(a).status_code == 200
    padded = b'{"session_hash": "page-of-a-1", "pad": "' + b"x" * 2048 + b'"}'
    with pytest.MonkeyPatch.context() as mp:  # a body too large to read is refused, not passed on unchecked
        mp.setattr("ui.requests_guard.MAX_BODY", 1024)
        assert b.post("/who", content=padded).status_code == 413
    assert request_visitor(None) is None


def test_only_public_mode_listens_on_all_interfaces_without_a_password(monkeypatch):
    import app

    monkeypatch.delenv("SPACE_ID", raising=False)
    args = app.parse_args(["--public"])
    assert args.public and args.host == "0.0.0.0"
    assert app.exposure_problem("0.0.0.0", False, None, space=args.public) is None
    plain = app.parse_args([])
    assert not plain.public and plain.host == "127.0.0.1"
    assert app.exposure_problem("0.0.0.0", False, None, space=plain.public) is not None
    assert app.exposure_problem("127.0.0.1", True, None, space=plain.public) is not None
    monkeypatch.setenv("SPACE_ID", "someone/memtune")
    assert app.parse_args([]).public


def test_disk_full_while_writing_a_checkpoint(tmp_path, demo_model_path):
    with small_disk(tmp_path / "disk", "400k") as disk:
        if disk is None:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        result = run_training(demo_config(output_dir=str(disk), run_name="ck", max_steps=3, save_strategy="steps",
                                          save_steps=1))
        assert result.status == "failed" and result.error_type == "disk", result.message
        run_dir = disk / "ck"
        assert result.message.startswith(f"No space left in {run_dir}")
        assert not any((run_dir / "checkpoints").glob("checkpoint-*"))  # the half-written one is removed
        events = read_events(run_dir / "events.jsonl")
        assert events[-1]["kind"] == "done" and json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


def test_only_the_space_owner_stops_any_job_running_or_queued(public, monkeypatch, tmp_path):
    """Issue 38: the Space owner (logged in: no visitor id) sees every job in their own row and stops any one by its
    id, a queued one (it leaves the queue) or the running one; a visitor sees no such row, and the same request from
    them is refused and stops nothing. Real child processes."""
    from core.jobs.manager import JobManager
    from core.jobs.view import job_view
    from core.runs import public as pub
    from ui import handlers

    from ui.state import AppState

    mgr = JobManager()
    app = AppState(mgr)  # the page's state, built by the test as app.py builds it
    a = mgr.start(demo_config(max_steps=100000, output_dir=str(tmp_path / "a")), owner="visitor-a", queue=True)
    b = mgr.start(demo_config(max_steps=3, output_dir=str(tmp_path / "b")), owner="visitor-b", queue=True)
    try:
        assert a.running and b.waiting
        monkeypatch.setattr(pub, "_visitor_source", lambda: "visitorBBBB1xxxxxxxxxx")  # a visitor asks
        row, jobs = handlers.owner_jobs(app, "en")
        assert row["visible"] is False and jobs["choices"] == []
        said, _, _ = handlers.on_owner_stop(app, b.id, "en")
        assert "Only the Space owner" in said and b.waiting and a.running and not a.stop_event.is_set()
        monkeypatch.setattr(pub, "_visitor_source", lambda: None)  # the owner: logged in, no visitor id
        row, jobs = handlers.owner_jobs(app, "pt")
        assert row["visible"] is True and [v for _, v in jobs["choices"]] == [a.id, b.id]
        assert "em execução" in jobs["choices"][0][0] and "na fila" in jobs["choices"][1][0]
        said, _, jobs = handlers.on_owner_stop(app, b.id, "en")
        assert f"#{b.id}" in said and not b.active and job_view(b).state == "stopped" and a.running
        assert [v for _, v in jobs["choices"]] == [a.id]
        handlers.on_owner_stop(app, a.id, "en")
        assert a.stop_event.is_set()  # ends after its current step, saving its adapter
    finally:
        mgr.end_now(owner=a.owner)  # ends the process group now
        assert a.wait(120)
