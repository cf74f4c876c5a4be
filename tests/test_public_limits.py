"""Public mode's one path rule and its limits: every path field checked against the visitor's own folders, in the page
and again in the training child; the page's `uploads/...` and `runs/...` forms mapped both ways for every path field;
the steps a run plans (not only max_steps) against MEMTUNE_SPACE_STEPS; uploads against MEMTUNE_SPACE_DISK_GIB at
upload time; a cap on the queue and on the runs from one network address."""

import json
import secrets
from dataclasses import fields
from pathlib import Path

import pytest

from core.checks import validate
from core.config.settings import PATH_KINDS, TrainConfig, demo_config

# Every free-text field of TrainConfig that is not a path, and why: a new text field must be declared a path (`path=`
# in core/config/settings.py) or named here, so none can be missed by the public rule.
NOT_PATHS = {
    "dataset_split": "a split expression of the dataset (train[:1000])",
    "validation_split": "a split expression, likewise",
    "run_name": "one folder name inside output_dir (SAFE_NAME: no separator)",
    "num_gpus": "a count, or all",
    "main_process_ip": "a network address",
    "heldout_options": "the scorer's JSON options: a schema file or a function's file in them is refused in public mode",
    "grpo_rewards": "scorer names with their weights",
    "grpo_reward_options": "the reward scorers' JSON options: refused in public mode as heldout_options' are",
}


class Visitors:
    """Two visitors of this test alone (their upload folders sit in the session's shared MEMTUNE_HOME); `asks(id)`
    makes one of them (None: nobody, no page request) the one asking."""

    def __init__(self) -> None:
        self.a, self.b = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
        self.now: str | None = self.a

    def asks(self, who: str | None) -> None:
        self.now = who


@pytest.fixture
def public(public_mode, monkeypatch, tmp_path):
    """Public mode with its runs in tmp_path, visitor a asking."""
    import ui.data  # noqa: F401 - registers the page's visitor source at import: replaced below, for this test
    from core.runs import public as pub

    monkeypatch.delenv(pub.VISITOR_ENV, raising=False)
    visitors = Visitors()
    monkeypatch.setattr(pub, "_visitor_source", lambda: visitors.now)
    return visitors


def _rows(path: Path, n: int, word: str = "a") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"instruction": f"Say {word}{i}", "response": f"{word}{i}"}) + "\n"
                            for i in range(n)))
    return path


def _a_has(tmp_path):
    """Visitor A's upload and run folder, made as A (their folders under the server's)."""
    from core.runs import public as pub

    upload = _rows(pub.upload_root() / "secret.jsonl", 3, "secret")
    run = pub.public_root() / "r1"
    run.mkdir(parents=True)
    return upload, run


# --- one rule for every path field --------------------------------------------------------------------------------
def test_every_config_field_that_can_name_a_path_is_declared():
    from core.runs.public import path_fields

    text = {f.name for f in fields(TrainConfig) if f.type in ("str", str) and not f.metadata.get("choices")}
    assert set(NOT_PATHS) <= text, set(NOT_PATHS) - text  # a stale name here would hide nothing
    assert set(path_fields()) == text - set(NOT_PATHS), "declare the field's path kind, or say here why it is none"
    assert {"dataset", "validation_data", "init_adapter", "resume_from", "output_dir", "model"} <= set(path_fields())
    assert set(path_fields().values()) <= set(PATH_KINDS)


def test_another_visitors_path_is_refused_in_every_path_field(public, tmp_path):
    """B names A's upload or A's run in each path field: refused by name (validation_data trained on A's rows)."""
    from core.runs import public as pub

    upload, run = _a_has(tmp_path)
    public.asks(public.b)
    own = demo_config(output_dir=str(pub.public_root()))
    assert validate(own) == []
    theirs = {"data": str(upload), "model": str(run), "run": str(run), "runs": str(run)}
    for name, kind in pub.path_fields().items():
        refused = [p.field for p in validate(own.replace(**{name: theirs[kind]}))]
        assert name in refused, (name, refused)
    problem = next(p for p in validate(own.replace(validation_data=str(upload))) if p.field == "validation_data")
    assert "path on the server" in problem.message and "validation_data" in problem.message
    public.asks(public.a)  # the same file is A's own
    assert validate(demo_config(output_dir=str(pub.public_root()), validation_data=str(upload))) == []


def test_the_page_form_of_every_path_field_maps_both_ways(public, tmp_path):
    """`uploads/NAME` and `runs/NAME` in any path field name the visitor's own file or run (validation_data's
    `uploads/val.jsonl` used to reach the child as is and fail there with a server path), and go back on screen as
    they were typed; `..` out of the visitor's folder is still refused."""
    from core.runs import public as pub
    from ui.fields import FIELD_NAMES, collect
    from ui.form import to_values
    from ui.form import Form, field_updates, read_config

    public.asks(public.b)
    val = _rows(pub.upload_root() / "val.jsonl", 4, "val")
    assert pub.from_shown("uploads/val.jsonl") == str(val)
    assert pub.shown(pub.from_shown("uploads/val.jsonl")) == "uploads/val.jsonl"
    assert pub.shown(pub.from_shown("runs/r1")) == "runs/r1" and pub.from_shown("runs") == str(pub.public_root())
    values = to_values(demo_config(output_dir="runs"))
    for name in pub.path_fields():  # through the form: each field collected, then shown again
        cfg, problems = collect({**values, name: "uploads/val.jsonl"})
        assert problems == [] and getattr(cfg, name) == str(val), name
        form = Form(**{f.name: None for f in fields(Form)} | {"fields": {n: n for n in FIELD_NAMES}})
        assert field_updates(form, cfg)[name] == "uploads/val.jsonl", name
    cfg, problems = read_config([values[n] if n != "validation_data" else "uploads/val.jsonl" for n in FIELD_NAMES])
    assert problems == [] and cfg.validation_data == str(val) and cfg.output_dir == str(pub.public_root())
    _, problems = read_config([f"uploads/../visitor-{public.a}/x.jsonl" if n == "validation_data" else values[n]
                               for n in FIELD_NAMES])
    assert [p.field for p in problems] == ["validation_data"]


def test_the_child_refuses_another_visitors_validation_data_by_name_before_loading(public, tmp_path, monkeypatch):
    """The training child the app starts for B is told so (VISITOR_ENV) and checks the path rule again as B: a
    config that reached it with A's upload is refused there, naming the field, before any model loads."""
    from core.jobs.manager import child_env
    from core.runs import public as pub
    from core.train.recipe import run_training

    upload, _ = _a_has(tmp_path)
    public.asks(None)  # the child answers no page request
    monkeypatch.setenv(pub.VISITOR_ENV, "visitor-someoneElse")
    assert child_env(f"visitor-{public.b}")[pub.VISITOR_ENV] == f"visitor-{public.b}"
    assert pub.VISITOR_ENV not in child_env(None)  # the app's own user's run: not someone else's left in the env
    monkeypatch.setenv(pub.VISITOR_ENV, f"visitor-{public.b}")
    out = pub.shared_public_root() / f"visitor-{public.b}"
    events = []
    cfg = demo_config(output_dir=str(out), validation_data=str(upload), max_steps=1)
    result = run_training(cfg, sink=events.append)
    assert result.status == "failed" and result.error_type == "config"
    assert "validation_data" in result.message and "path on the server" in result.message
    assert not [e for e in events if e.get("phase") == "loading_model"]
    monkeypatch.setenv(pub.VISITOR_ENV, "not-a-visitor")  # a garbled owner is nobody's folder, never the whole of them
    assert pub.visitor() == "visitor-unknown"


# --- the steps a run plans ----------------------------------------------------------------------------------------
def test_planned_steps_count_as_the_trainer_does():
    from core.runs.public import planned_steps

    demo = demo_config()  # 100 rows in batches of 20, 40 epochs: 200 steps (its own comment)
    assert planned_steps(demo, 100) == (200, 5)
    assert planned_steps(demo.replace(max_steps=7), 100) == (7, 5)
    odd = demo.replace(per_device_train_batch_size=3, gradient_accumulation_steps=4, num_train_epochs=2.5)
    assert planned_steps(odd, 100) == (23, 9)  # 34 batches -> 9 steps an epoch (the last one short), x2.5 rounded up
    assert planned_steps(odd, 100, world=2) == (13, 5)  # 17 batches per process


def test_epochs_over_the_step_limit_are_refused_before_start_and_in_the_child(public, monkeypatch, demo_model_path):
    """max_steps -1 with 100 epochs on the demo's 100 rows, one row a step: 10,000 steps, past the 1,000 allowed.
    It was checked only as max_steps (-1: nothing to refuse)."""
    from core.runs import public as pub
    from core.train.recipe import run_training
    from ui import handlers
    from ui.fields import FIELD_NAMES
    from ui.form import Form

    cfg = demo_config(output_dir=str(pub.public_root()), max_steps=-1, num_train_epochs=100.0,
                      per_device_train_batch_size=1)
    assert validate(cfg) == []  # nothing known of the rows yet
    [problem] = handlers.planned_step_problems(cfg)
    assert problem.field == "num_train_epochs" and "10,000" in problem.message and "1,000" in problem.message
    assert handlers.planned_step_problems(cfg.replace(num_train_epochs=10.0)) == []  # 1,000: allowed
    form = Form(**{f.name: None for f in fields(Form)} | {"fields": {n: n for n in FIELD_NAMES},
                                                          "run_notice": "notice"})
    said = handlers.on_start(form, "pt", *[getattr(cfg, n) for n in FIELD_NAMES])["notice"]
    assert "num_train_epochs" in said and "10.000" in said  # not started: nothing queued (form.app is None)

    public.asks(None)  # the child, for A
    monkeypatch.setenv(pub.VISITOR_ENV, f"visitor-{public.a}")
    events = []
    result = run_training(cfg, sink=events.append)
    assert result.status == "failed" and "num_train_epochs" in result.message and "10,000" in result.message
    assert not [e for e in events if e.get("phase") == "loading_model"]


def test_a_large_batch_cannot_walk_round_the_step_limit(public, monkeypatch):
    """Steps alone let a run within 1,000 steps train without bound through its batch and accumulation: the tokens
    a run plans (steps x rows per step x max_length, from above) have a limit too, checked with max_steps before any
    data is read and, for a run counted in epochs, once its rows are known."""
    from core.runs import public as pub

    monkeypatch.setenv("MEMTUNE_SPACE_TOKENS", "1000000")
    ok = demo_config(output_dir=str(pub.public_root()), max_steps=100, per_device_train_batch_size=4,
                     gradient_accumulation_steps=4, max_length=512)  # 819,200 tokens at most
    assert validate(ok) == []
    big = ok.replace(per_device_train_batch_size=64, gradient_accumulation_steps=64, max_length=4096)
    [problem] = validate(big)
    assert problem.field == "max_length" and "1,677,721,600" in problem.message and "1,000,000" in problem.message
    epochs = ok.replace(max_steps=-1, num_train_epochs=3.0)  # 100 rows, 16 a step: 7 steps an epoch, 21 in all
    assert pub.plan_problems(epochs, rows=100) == []
    [problem] = pub.plan_problems(epochs.replace(max_length=8192), rows=100)  # 21 x 16 x 8,192 = 2,752,512
    assert problem.field == "max_length" and "2,752,512" in problem.message
    monkeypatch.setenv("MEMTUNE_SPACE_TOKENS", "0")  # the owner lifts it
    assert validate(big) == []


# --- uploads within the disk budget -------------------------------------------------------------------------------
def test_an_upload_over_the_disk_limit_is_refused_at_upload_time_and_nothing_is_kept(public, tmp_path, monkeypatch):
    """An upload that takes the visitor past MEMTUNE_SPACE_DISK_GIB is refused before it is copied (it was kept, and
    only the next Start refused); Gradio's temporary copy goes either way, once memtune has stored or refused it."""
    from core.runs import public as pub
    from ui.data import on_upload
    from ui.fields import FIELD_NAMES

    gradio_tmp = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(gradio_tmp))
    monkeypatch.setenv("MEMTUNE_SPACE_DISK_GIB", str(4000 / 2**30))  # 4,000 bytes
    values = [getattr(demo_config(), n) for n in FIELD_NAMES]
    big = _rows(gradio_tmp / "h1" / "big.jsonl", 200)  # ~9 KB
    said = on_upload("en", str(big), *values)
    assert "refused" in said and "4000" not in said["refused"] and "nothing of it was kept" in said["refused"]
    assert not pub.upload_root().is_dir() or not any(pub.upload_root().iterdir())
    assert not big.exists() and not big.parent.exists()

    small = _rows(gradio_tmp / "h2" / "small.jsonl", 3)
    assert on_upload("en", str(small), *values) == {"dataset": "uploads/small.jsonl"}
    assert (pub.upload_root() / "small.jsonl").is_file() and not small.parent.exists()
    again = _rows(gradio_tmp / "h3" / "small.jsonl", 60)  # replaces the first: only the difference counts
    assert "dataset" in on_upload("en", str(again), *values)
    over = _rows(gradio_tmp / "h4" / "more.jsonl", 60)  # beside it: past the budget
    assert "refused" in on_upload("pt", str(over), *values)
    assert sorted(p.name for p in pub.upload_root().iterdir()) == ["small.jsonl"]
    elsewhere = _rows(tmp_path / "mine" / "x.jsonl", 2)  # not Gradio's: never removed
    on_upload("en", str(elsewhere), *values)
    assert elsewhere.is_file()


# --- the queue: a cap, and one per address ------------------------------------------------------------------------
def test_the_queue_admits_within_its_cap_and_each_addresss_limit():
    """24 throw-away cookies from one address filled the one queue ahead of an honest visitor: now the address's
    limit refuses the third, the queue's cap the ninth waiting run, each by name with the queue as it stands."""
    from core.jobs.manager import admission
    from ui.live import busy_message

    active: list[tuple[str, str]] = [("visitor-0", "6.6.6.6")]  # running
    refused = []
    for i in range(1, 24):
        why = admission(active, len(active) - 1, True, f"visitor-{i}", "6.6.6.6", per_owner=1, per_address=2,
                        queue_cap=8)
        if why is None:
            active.append((f"visitor-{i}", "6.6.6.6"))
        else:
            refused.append(why)
    assert len(active) == 2 and {w.reason for w in refused} == {"address"}
    assert admission(active, 1, True, "visitor-honest", "1.2.3.4", 1, 2, 8) is None  # an honest visitor still joins
    assert busy_message(refused[0], "fr", None).startswith("Entraînement non mis en file : 2 entraînements")
    many = [("visitor-0", "10.0.0.0")] + [(f"visitor-{i}", f"10.0.0.{i}") for i in range(1, 9)]  # 1 running, 8 wait
    full = admission(many, 8, True, "visitor-9", "10.0.0.9", 1, 2, 8)
    assert full.reason == "full" and full.params["place"] == 9 and "number 9" in str(full)
    assert "número 9" in busy_message(full, "pt", None)
    assert admission(many, 8, False, "visitor-9", "10.0.0.9", 1, 2, 8) is None  # a free slot: it does not wait
    assert admission(many, 8, True, "visitor-9", "10.0.0.9", 1, None, None) is None  # 0 in the env: no limit
    assert admission([("visitor-1", None)], 0, True, "visitor-1", None, 1, 2, 8).reason == "yours"


def test_a_real_manager_refuses_past_the_address_and_queue_limits(tmp_path):
    from core.jobs.manager import JobBusy, JobManager
    from tests.tiny_child import GO_FILE, TINY_CHILD

    mgr = JobManager(program=TINY_CHILD)
    limits = dict(queue=True, per_owner=1, per_address=2, queue_cap=1)
    a = mgr.start(demo_config(output_dir=str(tmp_path / "a")), owner="visitor-a", address="6.6.6.6", **limits)
    b = mgr.start(demo_config(output_dir=str(tmp_path / "b")), owner="visitor-b", address="6.6.6.6", **limits)
    try:
        assert a.running and b.waiting and b.address == "6.6.6.6"
        with pytest.raises(JobBusy) as same_address:
            mgr.start(demo_config(output_dir=str(tmp_path / "c")), owner="visitor-c", address="6.6.6.6", **limits)
        with pytest.raises(JobBusy) as full:
            mgr.start(demo_config(output_dir=str(tmp_path / "d")), owner="visitor-d", address="1.2.3.4", **limits)
        assert (same_address.value.reason, full.value.reason) == ("address", "full")
        assert [j.id for j in mgr.queue()[1]] == [b.id]  # neither joined
    finally:
        mgr.stop(job_id=b.id)
        (Path(a.run_dir) / GO_FILE).write_text("")
        assert a.wait(60)
    mgr.shutdown()


def test_the_address_is_the_connections_unless_a_proxy_names_the_client(monkeypatch):
    from types import SimpleNamespace

    from ui.data import request_address

    def request(host, forwarded=None):
        return SimpleNamespace(client=SimpleNamespace(host=host),
                               headers={"x-forwarded-for": forwarded} if forwarded else {})

    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("MEMTUNE_BEHIND_PROXY", raising=False)
    assert request_address(request("10.1.2.3", "7.7.7.7")) == "10.1.2.3"  # a header anyone could write: ignored
    monkeypatch.setenv("SPACE_ID", "someone/memtune")
    assert request_address(request("10.1.2.3", "7.7.7.7, 10.0.0.1")) == "7.7.7.7"
    assert request_address(request("10.1.2.3")) == "10.1.2.3" and request_address(None) is None


# --- a preview within its bound -----------------------------------------------------------------------------------
def test_the_preview_and_a_public_upload_check_read_within_their_bound(public, tmp_path, monkeypatch, demo_model_path):
    """The page's Preview reads and plans at most core.data.read.PREVIEW_LIMIT (a small file of 200,000 rows held its
    queue for 13 minutes): past it, a refusal naming the rows, the limit and the slice that fits; within it (the
    slice), the plan as before. A public upload is checked within the same bound."""
    from core.data import read
    from ui.data import on_preview, on_upload
    from ui.fields import FIELD_NAMES

    monkeypatch.setattr(read, "PREVIEW_LIMIT", read.Limit(rows=20, bytes=read.PREVIEW_LIMIT.bytes))
    rows = _rows(tmp_path / "rows.jsonl", 30)
    cfg = demo_config(dataset=str(rows), dataset_split="train", max_length=32)
    monkeypatch.delenv("MEMTUNE_PUBLIC")  # the bound is the Preview's, whoever asks; local files are allowed here
    html = on_preview("en", *[getattr(cfg, n) for n in FIELD_NAMES])
    assert "30 rows" in html and "20 rows a preview" in html and "train[:20]" in html and "rows train" not in html
    html = on_preview("en", *[getattr(cfg.replace(dataset_split="train[:20]"), n) for n in FIELD_NAMES])
    assert "20 of 20 rows train" in html
    monkeypatch.setenv("MEMTUNE_PUBLIC", "1")
    said = on_upload("en", str(rows), *[getattr(demo_config(), n) for n in FIELD_NAMES])
    assert "refused" in said and "20 rows" in said["refused"]


def test_a_python_scorer_is_refused_by_its_field_before_start(public, monkeypatch):
    """Public mode: the held-out scorer or a GRPO reward in the user's own Python is a validation problem naming its
    field (the run's child refused it only once started); off or unused, nothing is said."""
    from core.runs import public as pub
    from core.i18n import t

    base = demo_config(output_dir=str(pub.public_root()))
    assert validate(base.replace(heldout_scorer="python")) != []
    problems = validate(base.replace(heldout_scorer="python"))
    assert [(p.field, p.key) for p in problems] == [("heldout_scorer", "problem.public_python")]
    assert "python" not in problems[0].params["scorers"].split(", ") and "exact" in problems[0].params["scorers"]
    grpo = base.replace(stage="grpo", packing=False, per_device_train_batch_size=4, grpo_rewards="exact:1, python:0.5")
    assert [(p.field, p.key) for p in validate(grpo)] == [("grpo_rewards", "problem.public_python")]
    assert validate(base.replace(heldout_scorer="python", heldout_rows=0)) == []  # not bound: nothing to refuse
    assert validate(grpo.replace(grpo_rewards="exact")) == []
    monkeypatch.delenv("MEMTUNE_PUBLIC")
    assert validate(grpo) == [] and validate(base.replace(heldout_scorer="python")) == []
    assert "{" not in t("problem.public_python", "fr", setting="grpo_rewards", scorers="exact")
