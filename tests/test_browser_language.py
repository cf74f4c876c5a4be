"""A Portuguese page says Try it's, the merge's and the GGUF export's refusals in Portuguese: each is raised in its
child process (core/jobs/act.py) with a locale key, and the page says that key, never the engine's English."""

import json

import pytest

from core.i18n import STRINGS, t
from tests.browser_app import MISSING, REQUIRED, choose, point_at_runs
from tests.helpers import ms

pytestmark = pytest.mark.skipif(MISSING is not None and not REQUIRED, reason=MISSING or "")

ENGLISH = "has no linear layer of that name"  # infer.err.targets' English


@pytest.fixture
def misfit_run(server):
    """A 3-step demo run of this test's own whose adapter_config.json names a layer the demo model does not have
    (an adapter put beside the wrong base): each action's child loads the settings, then refuses it by key."""
    from core.config.settings import demo_config
    from core.train.recipe import run_training

    folder = server["work"] / "language-runs"
    result = run_training(demo_config(output_dir=str(folder), run_name="idioma", max_steps=3))
    assert result.status == "completed", result.message
    config = f"{result.adapter_dir}/adapter_config.json"
    with open(config, encoding="utf-8") as fh:
        settings = json.load(fh)
    settings["target_modules"] = ["no_such_proj"]
    with open(config, "w", encoding="utf-8") as fh:
        json.dump(settings, fh)
    return folder


def wait_for(page, selector: str, words: str) -> str:
    page.wait_for_function(f"(document.querySelector({selector!r})?.textContent || '').includes({words!r})",
                           timeout=ms(180), polling=250)
    return page.locator(selector).inner_text()


def test_a_portuguese_page_says_try_it_merge_and_gguf_refusals_in_portuguese(page, misfit_run):
    point_at_runs(page, misfit_run)  # on the English page: its tab's name
    choose(page, "#lang-select", "Português")
    page.wait_for_function(f"document.querySelector('#start-btn')?.textContent.includes({t('run.start', 'pt')!r})")
    said = "não tem nenhuma camada linear com esse nome"
    assert said in STRINGS["pt"]["infer.err.targets"]

    page.get_by_role("tab", name=t("tab.try", "pt"), exact=True).click()
    choose(page, "#try-adapter", "idioma")
    page.locator("#try-prompt textarea").fill("Traduza a palavra 'gato' para o francês.")
    page.click("#try-send")
    notes = {"try": wait_for(page, "#try-status", said)}

    page.get_by_role("tab", name=t("tab.export", "pt"), exact=True).click()
    choose(page, "#export-adapter", "idioma")
    page.locator("#export-confirm input").check()
    page.click("#export-merge-btn")
    notes["merge"] = wait_for(page, "#export-merge-note", said)
    page.click("#gguf-export-btn")
    notes["gguf"] = wait_for(page, "#gguf-status", said)

    for what, note in notes.items():
        assert "no_such_proj" in note and ENGLISH not in note, (what, note)
        assert "Pick the base model" not in note and "so the adapter cannot be put on it" not in note, (what, note)
    assert t("export.failed", "pt", message="").strip() in notes["merge"]  # the page's own frame, in Portuguese too
    assert page.errors == []
