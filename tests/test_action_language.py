"""Try it, the merge, the zip, the push and the GGUF export say their refusals in the page's language: every error
they raise carries a locale key (tests/test_messages.py checks each raise site), their children's `error` and `done`
events carry it, the page says it by that key, and no ui/ module recognises an engine message by its English."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tests.test_log_language import english_left

ROOT = Path(__file__).resolve().parent.parent
DAMAGED_EN = "so the adapter cannot be loaded"
DAMAGED = {"pt": "não é um JSON válido", "fr": "n'est pas du JSON valide"}


def damaged_adapter(tmp_path: Path) -> Path:
    """An adapter folder whose adapter_config.json is cut short (a copy interrupted half-way)."""
    folder = tmp_path / "run-cut" / "adapter"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "r": ', encoding="utf-8")
    return folder


def test_a_damaged_adapter_is_refused_by_key_and_said_in_the_pages_language(tmp_path):
    from core.export.adapter import ExportError, zip_adapter
    from core.infer import InferError, adapter_config
    from ui.render import error_text

    adapter = damaged_adapter(tmp_path)
    with pytest.raises(InferError) as caught:
        adapter_config(adapter)
    assert caught.value.key == "infer.err.damaged" and caught.value.params["why"]["key"] == "infer.damaged.json"
    assert DAMAGED_EN in str(caught.value)  # the engine's English, as the CLI and the log have always said it
    for lang, words in DAMAGED.items():
        text = error_text(caught.value, lang)
        assert words in text and str(adapter / "adapter_config.json") in text and DAMAGED_EN not in text
    with pytest.raises(ExportError) as refused:
        zip_adapter(tmp_path / "nothing-here")
    assert refused.value.key == "export.err.not_adapter"
    assert "não é uma pasta de adaptador" in error_text(refused.value, "pt")


class Recorded:
    """What ui/tryexport.py's failure() reads of an action: its events and its `done` (core/jobs/actions.py's)."""

    def __init__(self, kind: str, events: list[dict]) -> None:
        self.kind, self.events = kind, events

    def events_since(self, n: int) -> list[dict]:
        return self.events[n:]

    def result(self) -> dict | None:
        return next((e for e in reversed(self.events) if e.get("kind") == "done"), None)


@pytest.mark.parametrize("kind", ["try", "merge", "gguf"])
def test_an_action_childs_refusal_is_keyed_in_its_events_and_said_in_the_pages_language(tmp_path, kind):
    """core/jobs/act.py's child, run in this process on a damaged adapter: its `error` and `done` events carry the
    refusal's key; the page's notice (ui.tryexport.failure) says it in pt and fr, not the engine's English."""
    from core.jobs import act
    from core.runs.events import read_events
    from ui.tryexport import failure

    adapter = damaged_adapter(tmp_path)
    folder = tmp_path / f"memtune-{kind}-1"
    folder.mkdir()
    params = {"adapter": str(adapter), "formats": ["f16"], "overwrite": False, "trust_remote_code": False}
    (folder / act.SPEC).write_text(json.dumps({"kind": kind, "params": params}), encoding="utf-8")
    assert act.main(["--dir", str(folder)]) == 1
    events = read_events(folder / "events.jsonl")
    (error,) = [e for e in events if e["kind"] == "error"]
    (done,) = [e for e in events if e["kind"] == "done"]
    assert error["key"] == done["key"] == "infer.err.damaged" and error["error_type"] == "refused"
    recorded = Recorded(kind, events)
    assert DAMAGED_EN in failure(recorded, "en")
    for lang, words in DAMAGED.items():
        said = failure(recorded, lang)
        assert words in said and DAMAGED_EN not in said, said
        assert words in failure(Recorded(kind, [done]), lang)  # a child that wrote its `done` only


def test_the_merge_check_and_the_gguf_plan_are_said_in_the_pages_language(tmp_path, demo_model_path):
    from core.config.settings import demo_config
    from core.export.adapter import merge_memory_check
    from core.export.gguf_export import plan_gguf
    from ui.render import log_text

    _, _, ok, message = merge_memory_check(demo_config())
    assert ok and message.startswith("Merging needs about") and "KiB of RAM; " in message
    fr = log_text(message, "fr")
    assert fr.startswith("La fusion demande environ") and "Kio" in fr and not english_left(fr), fr
    taken = tmp_path / "gguf"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine", encoding="utf-8")
    plan = plan_gguf(model_dir=demo_model_path, formats=["f16"], out_dir=taken)
    assert not plan.ok and "was not made by memtune" in plan.message
    pt = log_text(plan.message, "pt")
    assert pt.startswith("Precisa de cerca de") and "não foi criada pelo memtune" in pt and str(taken) in pt
    assert not english_left(pt), english_left(pt)


def test_the_gauge_says_why_there_is_no_gpu_in_the_pages_language(monkeypatch):
    from core.gpus import vram
    from core.i18n import t
    from ui import render
    from ui.live import read_gpus

    gpus, message = read_gpus()  # no NVIDIA driver on the machines the suite runs on
    assert gpus == [] and message.key == "gpu.none"
    assert t("gauge.no_gpu", "pt") in render.gauge_html(gpus, message, lang="pt")

    def broken():
        raise RuntimeError("NVML went away")

    monkeypatch.setattr(vram, "snapshot", broken)
    gpus, message = read_gpus()
    assert message == "GPU monitor unavailable (RuntimeError: NVML went away)"
    html = render.gauge_html(gpus, message, lang="fr")
    assert "Surveillance du GPU indisponible" in html and "GPU monitor unavailable" not in html


ENGLISH_PHRASE = re.compile(r"[A-Za-z]{2,} [A-Za-z]{2,}")  # two words: a sentence's piece, not a code or a tag


def _english_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(ENGLISH_PHRASE.search(node.value))


def engine_english_matched() -> list[tuple[str, int, str]]:
    """Where a ui/ module recognises a text by English words: `"words" in x`, x.startswith/endswith("words"), a
    regular expression of words, `x == "words"`."""
    found = []
    for path in sorted(ROOT.glob("ui/*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = (path.name, getattr(node, "lineno", 0))
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn, ast.Eq, ast.NotEq))
                                                     for op in node.ops):
                if any(_english_literal(n) for n in [node.left, *node.comparators]):
                    found.append((*where, ast.unparse(node)))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                method, args = node.func.attr, node.args
                texts = [e for a in args for e in (a.elts if isinstance(a, ast.Tuple) else [a])]  # ("a b", "c d")
                if method in ("startswith", "endswith") and any(_english_literal(a) for a in texts):
                    found.append((*where, ast.unparse(node)))
                if (method in ("search", "match", "fullmatch", "findall", "sub", "compile")
                        and getattr(node.func.value, "id", "") == "re" and args and _english_literal(args[0])):
                    found.append((*where, ast.unparse(node)))
    return found


def test_no_ui_module_recognises_an_engine_message_by_its_english():
    assert engine_english_matched() == []


def test_the_scan_finds_a_message_matched_by_its_english(tmp_path, monkeypatch):
    """The scan above is not vacuous: the gauge's old test of "no nvidia gpu" is one it reports."""
    import tests.test_action_language as me

    (tmp_path / "ui").mkdir()
    (tmp_path / "ui" / "old.py").write_text(
        'def f(message):\n    return message.lower().startswith("no nvidia gpu")\n', encoding="utf-8")
    monkeypatch.setattr(me, "ROOT", tmp_path)
    assert [hit[:2] for hit in engine_english_matched()] == [("old.py", 2)]
