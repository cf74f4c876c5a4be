"""Engine messages said by locale key (core/messages.py): every DataError, ModelError and configuration Problem of
core/ (and ui/'s own Problems) names a key that en/pt/fr have with the placeholders its call fills; the English is
en.json's; a Portuguese or French page says a bad CSV line, a missing model folder, a value below its minimum and a
failed run's error in its own words, with the user's file names and line numbers as they are."""

from __future__ import annotations

import ast
import json
import string
from html import escape
from pathlib import Path

import pytest

from core.i18n import STRINGS
from core.messages import english, fields_of, say

ROOT = Path(__file__).resolve().parent.parent
# first argument: the key; keyword arguments: its parameters (an error's row aside: the line it names)
RAISED = {"DataError", "ModelError", "ValueProblem", "Said", "keyed", "english", "InferError", "ExportError",
          "GGUFError"}
NOT_PARAMS = {"row"}
ERRORS = {"DataError", "ModelError"}
# Try it's, the merge's and the GGUF export's errors: a literal key, or a keyed message handed on whole (said(exc):
# the key it was raised with, checked where it was raised)
ACTION_ERRORS = {"InferError", "ExportError", "GGUFError"}


def placeholders(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def _keys(node: ast.AST) -> list[str] | None:
    """The key(s) an argument can be: a literal, either literal of `"a" if cond else "b"`, or every key of the family
    f"prefix.{name}" names (log.kill.*: one level below the prefix); None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if (isinstance(node, ast.JoinedStr) and len(node.values) == 2 and isinstance(node.values[0], ast.Constant)
            and str(node.values[0].value).endswith(".")):
        prefix = node.values[0].value
        family = sorted(k for k in STRINGS["en"] if k.startswith(prefix) and "." not in k[len(prefix):])
        return family or [prefix + "?"]
    if isinstance(node, ast.IfExp):
        a, b = _keys(node.body), _keys(node.orelse)
        return a + b if a is not None and b is not None else None
    return None


def _name(func: ast.AST) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def keyed_calls() -> list[tuple[str, int, str, list[str] | None, set[str], bool]]:
    """(file, line, what, keys, keyword names, has **kwargs) of every DataError(...), ModelError(...), Problem(...)
    and Problem.of(...) call in core/ and ui/."""
    out = []
    for path in sorted([*ROOT.glob("core/**/*.py"), *ROOT.glob("ui/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name, where = _name(node.func), str(path.relative_to(ROOT))
            kwargs = {k.arg for k in node.keywords if k.arg} - (NOT_PARAMS if name in ERRORS else set())
            star = any(k.arg is None for k in node.keywords)
            if name in ACTION_ERRORS and node.args and _name(getattr(node.args[0], "func", None)) == "said":
                continue
            if name in RAISED:
                out.append((where, node.lineno, name, _keys(node.args[0]) if node.args else None, kwargs, star))
            elif (name == "of" and _name(getattr(node.func, "value", None)) == "Problem"
                  or name == "bad" and where == "core/config/settings.py"):  # config_problems' bad(field, key, ...)
                out.append((where, node.lineno, "Problem.of", _keys(node.args[1]) if len(node.args) > 1 else None,
                            kwargs, star))
            elif name == "phase" and len(node.args) >= 3:  # core.train.callbacks.phase(sink, name, key, **params)
                out.append((where, node.lineno, "phase", _keys(node.args[2]), kwargs, star))
            elif name == "Problem":
                out.append((where, node.lineno, "Problem", None, kwargs, star))
    return out


def test_every_engine_message_names_a_key_of_every_language_with_its_placeholders():
    calls = keyed_calls()
    assert len([c for c in calls if c[2] == "DataError"]) >= 40 and len([c for c in calls if c[2] == "ModelError"]) >= 9
    assert len([c for c in calls if c[2] == "Problem.of"]) >= 40
    assert [len([c for c in calls if c[2] == name]) >= 14 for name in sorted(ACTION_ERRORS)] == [True] * 3
    wrong = []
    for where, line, what, keys, kwargs, star in calls:
        if keys is None and (where, what, star) == ("core/config/settings.py", "Problem.of", True):
            continue  # the body of config_problems' bad(field, key, **params): its calls are checked
        if keys is None and (where, what, star) in {("core/train/callbacks.py", "keyed", True),
                                                     ("core/train/callbacks.py", "phase", True)}:
            continue  # phase(sink, name, key, **params)'s body, and the warm-up's phase saying keyed() words
        if keys is None and (where, what, star) == ("core/jobs/supervise.py", "Said", True):
            continue  # death_message's `unexpected`: record_death's callers name log.died, log.worker_died
        if keys is None and (where, what, star) == ("core/messages.py", "Said", True):
            continue  # said_again(key, params): a key recorded before, checked where it was first said
        if keys is None:  # Problem("field", "English", "fix") or a computed key: nothing a page could translate
            wrong.append((where, line, what, "no literal key"))
            continue
        for key in keys:
            texts = [key] + ([key + ".fix"] if what == "Problem.of" else [])
            for k in texts:
                missing = [lang for lang in ("en", "pt", "fr") if k not in STRINGS[lang]]
                if missing:
                    wrong.append((where, line, k, "missing in", missing))
            if star or any(k not in STRINGS["en"] for k in texts):
                continue
            needed = set().union(*(placeholders(STRINGS["en"][k]) for k in texts))
            # the call fills every placeholder of its key; it passes nothing that none of its keys says (a call
            # choosing between two keys, `"a" if cond else "b"`, fills the union of both)
            said = set().union(*(placeholders(STRINGS["en"][k]) for k in keys if k in STRINGS["en"]),
                               *(placeholders(STRINGS["en"].get(k + ".fix", "")) for k in keys if what == "Problem.of"))
            if not needed <= kwargs or not kwargs <= said:
                wrong.append((where, line, key, "placeholders", sorted(needed), "given", sorted(kwargs)))
            for lang in ("pt", "fr"):
                for k in texts:
                    if placeholders(STRINGS[lang][k]) != placeholders(STRINGS["en"][k]):
                        wrong.append((where, line, k, lang, "placeholders differ"))
    assert wrong == []


def test_nested_message_keys_exist():
    """A parameter that is itself a message ({"key": "data.err....", "params": ...}) names a key of every language."""
    found = set()
    for path in ROOT.glob("core/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if isinstance(k, ast.Constant) and k.value == "key" and (keys := _keys(v)):
                        found |= set(keys)
    assert {"data.err.json_hint", "data.err.json_hint_open", "data.err.hint_auto", "data.err.hint_rename"} <= found
    for key in found:
        assert all(key in STRINGS[lang] for lang in ("en", "pt", "fr")), key


def test_english_is_en_json_and_unchanged(tmp_path):
    """The engine's English comes from en.json and reads as it always did (log, CLI, existing tests)."""
    from core.config.settings import ConfigError, TrainConfig, field_problems
    from core.data.read import DataError, load_raw

    bad = tmp_path / "pairs.csv"
    bad.write_text("prompt,completion\nhello,bonjour\na,b,c\n", encoding="utf-8")
    with pytest.raises(DataError) as caught:
        load_raw(str(bad))
    assert str(caught.value) == (f"{bad}: line 3 has 3 fields where the header (line 1) has 2 (prompt, completion): "
                                 'a comma inside a field must be quoted, e.g. "a, b". Fix or delete line 3.')
    assert caught.value.row == 1 and caught.value.key == "data.err.csv_more"
    assert str(caught.value) == english(caught.value.key, **caught.value.params)
    (problem,) = field_problems(TrainConfig(lora_r=0))
    assert str(problem) == "lora_r: 0 is below the minimum 1 -> use a value >= 1"
    said = fields_of(ConfigError([problem]))
    assert said == {"problems": [{"field": "lora_r", "key": "problem.below_min", "params": {"value": 0, "min": 1}}]}
    assert json.loads(json.dumps(said)) == said  # what the error event carries is plain JSON
    # a nested message is said in the page's language too; a missing key falls back to English, then the key
    nested = {"hint": {"key": "data.err.hint_auto", "params": {"format": "dolly"}}}
    assert say("data.err.format_columns", {**nested, "format": "alpaca"}, "fr").endswith(
        "Soit réglez dataset_format sur auto (il détecte dolly).")
    assert say("no.such.key", {}, "pt") == "no.such.key"


def _csv(tmp_path: Path, name: str = "meus-dados.csv") -> Path:
    path = tmp_path / name
    path.write_text("prompt,completion\nhello,bonjour\nwhite,blanc\nred, dark,rouge\n", encoding="utf-8")
    return path


WORDS = {  # what the page must say (Portuguese/French of the course chapter: linha/ligne, coluna/colonne, campos/champs)
    "csv": {"pt": "a linha 4 tem 3 campos, e o cabeçalho (linha 1) tem 2",
            "fr": "la ligne 4 a 3 champs alors que l'en-tête (ligne 1) en a 2"},
    "model": {"pt": "não existe. Verifique o caminho", "fr": "n'existe pas. Vérifiez le chemin"},
    "minimum": {"pt": "0 está abaixo do mínimo 1", "fr": "0 est sous le minimum 1"},
}


@pytest.mark.parametrize("lang", ["pt", "fr"])
def test_the_preview_says_a_csv_line_with_a_wrong_field_count_in_the_pages_language(tmp_path, lang):
    from core.config.settings import demo_config
    from ui.data import preview

    path = _csv(tmp_path)
    html = preview(demo_config(dataset=str(path)).to_dict(), lang)
    assert escape(WORDS["csv"][lang]) in html and "meus-dados.csv" in html
    assert "fields where the header" not in html and "Fix or delete" not in html
    assert "has 3 fields where the header (line 1) has 2" in preview(demo_config(dataset=str(path)).to_dict(),
                                                                        "en")


@pytest.mark.parametrize("lang", ["pt", "fr"])
def test_the_preview_says_a_missing_model_folder_in_the_pages_language(tmp_path, lang):
    from core.config.settings import demo_config
    from ui.data import preview

    good = tmp_path / "ok.csv"
    good.write_text("prompt,completion\nhello,bonjour\n", encoding="utf-8")
    missing = tmp_path / "modelos" / "meu-modelo"
    html = preview(demo_config(dataset=str(good), model=str(missing)).to_dict(), lang)
    assert escape(str(missing)) in html and escape(WORDS["model"][lang]) in html
    assert "does not exist" not in html


@pytest.mark.parametrize("lang", ["pt", "fr"])
def test_a_value_below_its_minimum_reads_in_the_pages_language(lang):
    from core.checks import validate
    from core.config.settings import demo_config
    from ui.render import summary_html

    cfg = demo_config(lora_r=0)
    html = summary_html(cfg, validate(cfg), lang=lang)
    assert "<code>lora_r</code>" in html and escape(WORDS["minimum"][lang]) in html
    assert "below the minimum" not in html and "use a value" not in html
    assert "below the minimum 1" in summary_html(cfg, validate(cfg), lang="en")


def test_a_value_of_the_wrong_type_reads_in_the_pages_language():
    """--set / a YAML / a widget value that is not of the field's type: the value's own message nests in the
    problem's, both said in the page's language."""
    from core.config.settings import ConfigError, TrainConfig, apply_overrides
    from ui.render import problems_html

    with pytest.raises(ConfigError) as caught:
        apply_overrides(TrainConfig(), ["lora_r=abc"])
    assert str(caught.value).endswith("lora_r: 'abc' is not a whole number -> give a whole number")
    html = problems_html(caught.value.problems, "x", "pt")
    assert escape("'abc' não é um número inteiro") in html and "informe um valor do tipo número inteiro" in html


def test_a_failed_runs_error_event_reads_in_the_pages_language(tmp_path):
    """A real run on a CSV with a bad line: events.jsonl's error event carries key + params beside the English message;
    the page's log, result and History say it in pt and fr; an old run's event without a key stays its English."""
    from core.config.settings import demo_config
    from core.jobs.view import _Fold
    from core.runs.events import read_events
    from core.runs.history import load_run
    from core.train.recipe import run_training
    from ui.render import log_html, result_html, run_detail_html

    path = _csv(tmp_path, "pares.csv")
    result = run_training(demo_config(dataset=str(path), output_dir=str(tmp_path / "runs")))
    assert result.status == "failed" and result.error_type == "data"
    events = read_events(Path(result.run_dir) / "events.jsonl")
    (error,) = [e for e in events if e["kind"] == "error"]
    assert error["key"] == "data.err.csv_more" and error["params"]["line"] == 4
    assert error["params"]["path"] == str(path) and "line 4 has 3 fields" in error["message"]
    fold = _Fold()
    fold.add(events)
    view = fold.result(running=False, stopping=False, from_disk=True)
    detail = load_run(result.run_dir)
    assert escape(error["message"]) in log_html(view.log, "en")
    for lang, error_word in (("pt", "ERRO"), ("fr", "ERREUR")):
        log = log_html(view.log, lang)
        assert escape(WORDS["csv"][lang]) in log and "pares.csv" in log and error_word in log
        assert "fields where the header" not in log
        assert escape(WORDS["csv"][lang]) in result_html(view, lang)
        assert escape(WORDS["csv"][lang]) in run_detail_html(detail, lang)
    old = dict(error)
    for k in ("key", "params"):
        old.pop(k)
    fold = _Fold()
    fold.add([old])
    (line,) = fold.result(running=False, stopping=False, from_disk=True).log
    assert escape(error["message"]) in log_html([line], "fr")  # no key: the English as it was written


def test_a_config_error_event_reads_in_the_pages_language(tmp_path):
    """run_training refusing a config: the error event lists each problem's key; the log says them in pt."""
    from core.config.settings import demo_config
    from core.jobs.view import format_event
    from core.train.recipe import run_training
    from ui.render import log_line

    events: list[dict] = []
    result = run_training(demo_config(lora_r=0, output_dir=str(tmp_path / "runs")), sink=events.append)
    assert result.status == "failed" and result.error_type == "config"
    (error,) = [e for e in events if e["kind"] == "error"]
    assert [p["key"] for p in error["problems"]] == ["problem.below_min"]
    line = log_line(format_event(error), "pt")
    assert "1 problema(s) na configuração:" in line and "lora_r: 0 está abaixo do mínimo 1 -> use um valor >= 1" in line


def test_a_reason_from_a_helper_nests_in_the_problem_and_reads_in_the_pages_language(tmp_path):
    """output_problem returns its reason as a string (messages.Said) that also carries its key: the output_dir problem
    built from it says both parts in fr."""
    from core.config.settings import config_problems, demo_config
    from ui.render import problems_html

    taken = tmp_path / "un-fichier.txt"
    taken.write_text("x", encoding="utf-8")
    (problem,) = [p for p in config_problems(demo_config(output_dir=str(taken))) if p.field == "output_dir"]
    assert problem.message == f"{taken} is a file, not a folder"
    assert problem.params["why"] == {"key": "output.is_file", "params": {"path": str(taken)}}
    html = problems_html([problem], "x", "fr")
    assert escape(f"{taken} est un fichier, pas un dossier") in html and "choisissez un dossier" in html


def test_every_problem_key_is_named_by_the_code():
    """A configuration problem's key that no code names is a translation nobody reads (in eight languages): each
    problem.* key of en.json (its .fix goes with it) is written out in core/ or ui/."""
    code = "\n".join(p.read_text(encoding="utf-8") for folder in ("core", "ui") for p in (ROOT / folder).rglob("*.py"))
    unused = [k for k in STRINGS["en"] if k.startswith("problem.") and not k.endswith(".fix")
              and f'"{k}"' not in code and f"'{k}'" not in code]
    assert unused == []
    assert all(k[:-len(".fix")] in STRINGS["en"] for k in STRINGS["en"] if k.startswith("problem.") and k.endswith(".fix"))
