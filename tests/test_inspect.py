"""The estimate in the web server: the formula plus what inspect children measured (core.estimate.measure's disk
cache), never a model built in the server; what it lacks asked of one child per settings, bounded per owner and in
all; a failed measurement named on the page."""

from __future__ import annotations

import json
import sys
import textwrap
import time

import pytest

from core.config.settings import TrainConfig
from core.estimate import inspect as inspecting
from core.estimate import known, measure
from core.estimate.predict import estimate
from core.jobs.actions import Inspections
from core.model.shapes import get_shape

TINY = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "tie_word_embeddings": False}


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measure, "_DISK", None)
    monkeypatch.setattr(measure, "_MEMO", {})
    monkeypatch.setattr(measure, "_HERE", True)
    return tmp_path / "cache" / "layer_saved.json"


@pytest.fixture()
def tiny(tmp_path):
    folder = tmp_path / "tiny-qwen2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    return TrainConfig(model=str(folder), precision="bf16", upcast_to_fp32=False)  # a layer the CPU can stand in for


def _server(monkeypatch):
    """This process as the web server: building a model or a layer to measure it fails the test."""
    monkeypatch.setattr(measure, "_HERE", False)

    def built(*a, **k):
        raise AssertionError("the server built a model")

    monkeypatch.setattr(measure, "_measure", built)
    monkeypatch.setattr(known, "get_shape", built)


def test_the_server_estimates_from_the_formula_and_names_what_it_lacks(cache, tiny, monkeypatch):
    _server(monkeypatch)
    with measure.collecting() as wants:
        est = estimate(tiny)
    assert est.nvml_peak > 0  # the formula: config.json's own keys, no layer measured
    kinds = sorted(spec["kind"] for spec in wants.missing.values())
    assert kinds == ["shape"], kinds  # the layers follow from the counted shape: the child estimates it whole
    assert not cache.exists()  # nothing measured, nothing written


def test_what_the_child_measures_the_server_then_reads(cache, tiny, monkeypatch):
    with measure.collecting() as lacking:
        monkeypatch.setattr(measure, "_HERE", False)
        estimate(tiny)
    monkeypatch.setattr(measure, "_HERE", True)
    answer = inspecting.inspect(tiny.to_dict(), list(lacking.missing.values()))  # the child's work, in-process
    assert answer == {"changes": [], "failed": {}}
    assert any("saved" in v for v in json.loads(cache.read_text()).values())  # a decoder layer, measured
    measured = estimate(tiny)  # where models may be built: get_shape and the layer measured
    monkeypatch.setattr(measure, "_DISK", None)
    monkeypatch.setattr(measure, "_MEMO", {})  # the server's own process has only the file
    _server(monkeypatch)
    with measure.collecting() as wants:
        served = estimate(tiny)
    assert not wants.missing and not wants.failed
    assert served.nvml_peak == measured.nvml_peak
    assert known.shape_of(tiny.model) == get_shape(tiny.model)


def test_a_failed_measurement_is_named_on_the_page_not_silently_the_formula(cache, tiny, monkeypatch):
    from ui.derive import prediction
    from ui.form import inspect_note

    monkeypatch.setattr(measure, "_measure", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no such kernel")))
    known.remember_shape(tiny.model)
    estimate(tiny)  # the layer's measurement raised: kept as failed in the cache
    assert any("failed" in v for v in json.loads(cache.read_text()).values())
    monkeypatch.setattr(measure, "_DISK", None)
    monkeypatch.setattr(measure, "_MEMO", {})
    _server(monkeypatch)
    pred = prediction(tiny)
    assert pred.gib is not None and any("no such kernel" in f for f in pred.failed)
    assert "RuntimeError: no such kernel" in inspect_note(pred, "pt") and "Uma medição falhou" in inspect_note(pred, "pt")


SLOW_CHILD = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    folder = Path(sys.argv[sys.argv.index("--dir") + 1])
    spec = json.loads((folder / "action.json").read_text())
    time.sleep(float(spec["params"].get("sleep", 0)))
    with open(folder / "events.jsonl", "a") as f:
        f.write(json.dumps({"kind": "done", "status": "completed", "message": "", "changes": [], "failed": {}}) + "\\n")
""")


@pytest.fixture()
def program(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(SLOW_CHILD)
    return [sys.executable, str(script)]


def test_one_child_per_settings_a_newer_request_supersedes_and_the_queue_is_bounded(program):
    inspections = Inspections(program, running=1, queued=2)
    try:
        first = inspections.request("a", {"base": "A", "sleep": 30}, owner="v1")
        assert inspections.request("a", {"base": "A", "sleep": 30}, owner="v2") is first  # deduplicated
        newer = inspections.request("b", {"base": "B", "sleep": 0}, owner="v1")  # v1's newer settings
        assert first.wait(30) and first.stopped and inspections.get("a") is None
        assert newer.wait(30) and newer.result()["status"] == "completed"
        assert inspections.answer("B") is newer and inspections.answer("A") is None
        hold = inspections.request("c", {"base": "C", "sleep": 30}, owner="v1")
        for _ in range(500):  # started: out of the queue (by the starter thread)
            if hold.pid is not None:
                break
            time.sleep(0.01)
        waiting = [inspections.request(k, {"base": k, "sleep": 0}, owner=k) for k in ("d", "e")]
        assert all(w is not None and w.running for w in waiting)
        assert inspections.request("f", {"base": "F", "sleep": 0}, owner="f") is None  # the queue is full
        assert inspections.request("d2", {"base": "D2", "sleep": 0}, owner="d") is not None  # d's one pending, replaced
        assert waiting[0].finished and waiting[0].stopped
        assert hold.running
    finally:
        inspections.shutdown()


class _Answered:
    """An Inspections whose child has answered `done` for every settings (no process: what the page reads)."""

    def __init__(self, done: dict) -> None:
        self.done = done

    def answer(self, base):
        return self

    def result(self):
        return self.done

    def request(self, *a, **k):
        raise AssertionError("asked again although answered")


def test_the_page_shows_the_resolved_run_a_conv_mixer_trains_unpacked(cache, tmp_path, monkeypatch):
    """lfm2's conv mixer turns packing off: the child's answer names the change, and the page's estimate is the
    unpacked run's, with the reason in the page's language."""
    from core.config.presets import apply_preset
    from core.jobs.act import resolver
    from tests import families_any
    from ui.derive import prediction
    from ui.form import inspect_note

    folder = tmp_path / "lfm2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(families_any.hf_config("lfm2").to_dict()))
    asked = apply_preset(TrainConfig(model=str(folder)), "fastest").replace(
        compile_layers="off", lora_target_modules=["in_proj", "out_proj", "w1", "w2", "w3"])  # lfm2's linears
    assert asked.packing
    answer = inspecting.inspect(asked.to_dict(), [], resolve=resolver(), cuda=False)
    assert ("packing", True, False, "log.adapt.unpacked_mixer") in [
        (c["field"], c["before"], c["after"], c["key"]) for c in answer["changes"]]
    trains = asked.replace(**{c["field"]: c["after"] for c in answer["changes"]})
    expected = estimate(trains).nvml_peak / 2**30
    monkeypatch.setattr(measure, "_DISK", None)
    monkeypatch.setattr(measure, "_MEMO", {})
    _server(monkeypatch)
    pred = prediction(asked, inspections=_Answered({"kind": "done", "status": "completed", **answer}),
                      settings=asked.to_dict())
    assert pred.gib == pytest.approx(expected) and not pred.measuring and not pred.failed
    note = inspect_note(pred, "en")
    assert "packing: on → off: lfm2 has" in note and "rows train unpacked" in note
