"""The data preview is worked out in a child (core/jobs/actions.py Actions.preview, core/jobs/act.py kind "preview",
core/jobs/preview.py) and rendered by the web server (ui/data.py): its progress on the bar in the page's language, the
child run as the public Space's visitor, a child that dies said in the page's language, the longest row kept for the
estimates, and the same preview as one made in-process."""

from __future__ import annotations

import json
import sys
import textwrap

from core.config.settings import demo_config
from core.jobs.actions import Actions
from core.runs.public import VISITOR_ENV
from ui import data

CHILD = """
import json, os, sys
folder = sys.argv[sys.argv.index("--dir") + 1]
with open(os.path.join(folder, "events.jsonl"), "a") as out:
    def emit(**e):
        out.write(json.dumps(e) + "\\n")
        out.flush()
{body}
"""


def fake(tmp_path, body: str) -> Actions:
    """Actions whose children run `body` (emit(**event) writes one event) instead of core.jobs.act."""
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(body=textwrap.indent(textwrap.dedent(body), "    ")), encoding="utf-8")
    return Actions(program=[sys.executable, str(script)])


def rows(tmp_path, n: int = 3):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"instruction": f"Say {i}", "response": str(i)}) + "\n" for i in range(n)),
                    encoding="utf-8")
    return demo_config(dataset=str(path))


def test_the_childs_progress_is_on_the_bar_and_it_reads_as_its_visitor(tmp_path, monkeypatch):
    monkeypatch.setenv(VISITOR_ENV, "visitor-theAppsOwn")  # never handed on to another visitor's child
    actions = fake(tmp_path, """
        emit(kind="phase", phase="previewing", progress=0.5, key="preview.tokenizing", params={}, message="Tokenizing")
        who = os.environ.get("MEMTUNE_VISITOR", "nobody")
        emit(kind="done", status="completed", message="", preview={"error": "data", "words": {"message": who}})
    """)
    monkeypatch.setattr(data, "visitor", lambda: "visitor-abc")
    bar = []
    html = data.preview(rows(tmp_path).to_dict(), "pt", lambda f, desc: bar.append((f, desc)), actions=actions)
    assert (0.5, "A tokenizar cada linha como o treino fará") in bar
    assert "visitor-abc" in html and "mt-data-error" in html
    monkeypatch.setattr(data, "visitor", lambda: None)  # the app's own user: no visitor in the child's environment
    assert "nobody" in data.preview(rows(tmp_path).to_dict(), "pt", actions=actions)


def test_a_preview_child_that_dies_is_said_in_the_pages_language(tmp_path):
    actions = fake(tmp_path, "sys.exit(3)")
    html = data.preview(rows(tmp_path).to_dict(), "pt", actions=actions)
    assert "Não foi possível ler os dados" in html and "A pré-visualização dos dados terminou inesperadamente" in html


def test_the_longest_row_a_childs_preview_measured_is_kept_for_the_estimate(tmp_path, monkeypatch):
    from core.data import plan
    from core.jobs.preview import answer
    from core.data.read import PREVIEW_LIMIT

    cfg = rows(tmp_path)
    found = answer(cfg.to_dict(), PREVIEW_LIMIT)  # what a child answers
    monkeypatch.setattr(plan, "_LONGEST", {})  # this process planned nothing
    assert plan.known_longest_row(cfg) is None
    html = data.preview_from(found, cfg, "en")
    assert "3 of 3 rows train" in html and plan.known_longest_row(cfg) == found["longest"] > 0


def test_a_real_preview_child_shows_what_an_in_process_preview_shows(tmp_path):
    cfg = rows(tmp_path, 5)
    actions = Actions()
    try:
        bar = []
        child = data.preview(cfg.to_dict(), "fr", lambda f, desc: bar.append(f), actions=actions)
    finally:
        actions.shutdown()
    assert child == data.preview(cfg.to_dict(), "fr")
    assert "mt-preview" in child and bar and bar[-1] == 1.0
