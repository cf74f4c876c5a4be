"""Every event the engine emits carries a locale key and its values (issue 39): each kind (run, phase, log, data,
error, done, a kill) renders from its key in en, pt and fr, and every key an event may carry (log.*, phase.*, the
data plan's words) exists in the three locale files with its placeholders, said in pt and fr without English."""

from __future__ import annotations

import string

import pytest

from core.i18n import STRINGS
from core.jobs.view import format_event
from core.messages import Said, keyed, lines, say
from core.runs.events import make_event
from tests.test_log_language import english_left
from ui.render import log_line, said

LANGS = ("en", "pt", "fr")
# what the run log can say: every key a log, phase, error or done event's message may name
EVENT_PREFIXES = ("log.", "phase.", "preview.reason.", "preview.turns", "preview.lora_fused", "msg.lines", "msg.list",
                  "msg.two", "msg.text", "unit.",  # errors (data.err., model.err.): tests/test_messages.py
                  # Try it's, the merge's and the GGUF export's events: their phases, errors and done, the refusals
                  # they hand on (core/files.py's), and the gauge's reason for no GPU
                  "action.", "infer.err.", "infer.damaged.", "export.err.", "export.check.", "export.where.",
                  "export.mem.", "export.owner.", "export.step.", "gguf.err.", "gguf.what.", "gguf.plan.", "gguf.step.",
                  "files.refused.", "files.action.", "gpu.")
# keys the recipe, callbacks.py and core/estimate/advice.py emit (by their owner): named so they cannot go missing
RECIPE_KEYS = ("log.lora", "log.val_rows", "log.val_share", "log.val_none_fit", "log.not_resuming", "log.eval",
               "log.eval_baseline", "log.answer", "log.checkpoint", "log.stop_ack", "log.stop_after",
               "log.summary_unwritten", "log.oom_ended", "log.oom", "log.oom_tip", "log.oom_tip_saves",
               "log.oom_liger", "log.oom_all_on", "log.config_problems", "log.processes", "log.refusal", "log.step",
               "log.done.completed", "log.done.completed_one", "log.done.stopped", "log.done.stopped_one",
               *(f"log.phase.{p}" for p in ("loading_4bit", "loading", "tokenizing", "warming_up", "warmed_up",
                                            "training", "saving", "formatting", "reading", "finding")))


def names(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def event_keys() -> list[str]:
    return sorted(k for k in STRINGS["en"] if k.startswith(EVENT_PREFIXES) and not k.endswith(".fix"))


def test_every_event_key_is_in_the_three_languages_with_its_placeholders():
    missing = [k for k in RECIPE_KEYS if k not in STRINGS["en"]]
    assert missing == []
    for key in event_keys():
        for lang in ("pt", "fr"):
            assert key in STRINGS[lang], (lang, key)
            assert names(STRINGS[lang][key]) == names(STRINGS["en"][key]), (lang, key)


@pytest.mark.parametrize("lang", ("pt", "fr"))
def test_every_event_key_is_said_without_english_or_a_placeholder_left(lang):
    """Each key filled with neutral values (numbers, a path) reads in the language: no {name} left, no English word
    outside the settings' names and the tools' own terms."""
    for key in event_keys():
        text = said(key, {name: 7 for name in names(STRINGS["en"][key])}, lang)
        assert "{" not in text.replace("{}", ""), (lang, key, text)
        assert not english_left(text), (lang, key, text, english_left(text))


def _events() -> list[dict]:
    """One event of each kind that makes a log line, each by its key (as core/ writes them)."""
    why = Said("log.ckpt_damaged", path="/r/c-2/trainer_state.json", why=Said("log.ckpt.json"))
    death = Said("msg.two", first=Said("log.kill.no_answer", s=30, how=Said("log.exit_signal", signal="SIGKILL")),
                 second=Said("log.kill.checkpoints_remain"))
    return [
        make_event("run", run_dir="/r/a"),
        make_event("phase", phase="tokenizing", progress=None, **keyed("log.phase.formatting", n=1200, format="alpaca")),
        make_event("log", level="info", **keyed("log.step", step=3, total=40, loss=1.5, lr=2e-4, grad_norm=0.25)),
        make_event("log", level="warning", **keyed("log.not_resuming", why=why)),
        make_event("error", error_type="oom", **keyed("msg.lines", lines=[
            Said("log.oom"), Said("log.oom_tip", label=Said("log.oom_liger")),
            Said("log.oom_tip_saves", label=Said("log.oom_all_on"), gib=1.25, unit=Said("unit.gib"))])),
        make_event("error", error_type="other", **keyed("log.died", how=Said("log.exit_code", code=3))),
        make_event("done", status="failed", summary={}, **{**keyed("log.lost_track")}),
        make_event("done", status="stopped", summary={}, message=str(death), key=death.key, params=death.params),
        make_event("done", status="completed", **keyed("log.done.completed", steps=40, path="/r/a/adapter", mib=2.5,
                                                       unit=Said("unit.mib"))),
    ]


def test_every_event_kind_renders_from_its_key_in_en_pt_and_fr():
    events = _events()
    assert {e["kind"] for e in events} == {"run", "phase", "log", "error", "done"}
    for e in events:
        line = format_event(e)
        assert line.said.get("key"), e
        assert log_line(line, "en") == line and e.get("message", "") in line  # English: the CLI's words, as ever
        for lang in ("pt", "fr"):
            rendered = log_line(line, lang)
            assert rendered != line and not english_left(rendered), (lang, rendered, english_left(rendered))
    fr = "\n".join(log_line(format_event(e), "fr") for e in events)
    assert "pas 3/40  perte 1,5000  lr 2,00e-04  grad_norm 0,250" in fr and "(économise ~1,2 Gio ici)" in fr
    assert "ce n'est pas du JSON valide" in fr and "2,5 Mio" in fr


def test_a_data_event_carries_the_plans_key():
    """The data event (no log line of its own: the log event after it says the plan) carries describe()'s key."""
    from core.messages import words_of

    plan = Said("log.data", rows=3, dataset="d (text)", train=3, max_length="64",
                outcomes=Said("msg.list", items=[Said("preview.reason.kept", n=3)]), packs="")
    event = make_event("data", **words_of(plan))
    assert format_event(event) is None and event["message"] == say(event["key"], event["params"])
    assert said(event["key"], event["params"], "pt").startswith("Dados: 3 linhas em d (text)")


def test_an_old_runs_line_without_a_key_shows_as_written():
    line = format_event({"kind": "log", "time": 0, "level": "warning", "message": "Something the engine said"})
    assert log_line(line, "fr").endswith("AVERTISSEMENT Something the engine said")  # the frame's words only
    assert log_line("12:00:00  a plain string", "pt") == "12:00:00  a plain string"


def test_several_lines_and_a_log_tail_travel_as_one_message():
    text = lines(Said("log.died", how=Said("log.exit_none")), Said("log.last_lines", path="/r/train.log"),
                 "Traceback (most recent call last):\nValueError: x")
    assert text.splitlines()[0] == "The training process died unexpectedly (no exit status)."
    pt = said(text.key, text.params, "pt").splitlines()
    assert pt[-1] == "ValueError: x" and "inesperadamente" in pt[0]


def test_an_actions_phase_error_and_done_events_carry_their_keys(tmp_path):
    """A merge's step, its refusal and its end as core/jobs/act.py writes them: each carries its key, and the page's
    log says it in pt and fr with the user's path as it is."""
    from core.export.adapter import ExportError
    from core.infer import said as handed_on
    from core.jobs import act

    events: list[dict] = []
    act._phase(events.append, "merging", 0.55, Said("export.step.merge"))
    refusal = ExportError(handed_on(ExportError("export.err.not_empty", path=str(tmp_path / "merged"))))
    events.append(make_event("error", error_type=act.error_type(refusal), message=str(refusal),
                             **act.fields_of(refusal)))
    events.append(make_event("done", status="failed", message=str(refusal), **act.fields_of(refusal)))
    for e in events:
        line = format_event(e)
        assert line.said.get("key"), e
        for lang in ("pt", "fr"):
            rendered = log_line(line, lang)
            assert not english_left(rendered), (lang, rendered, english_left(rendered))
    assert str(tmp_path / "merged") in log_line(format_event(events[1]), "pt")
    assert "já existe e não está vazia" in log_line(format_event(events[2]), "pt")
