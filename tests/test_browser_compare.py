"""History compares runs (issue 22): two short demo runs with validation, made by this test in its own folder,
picked in the page: both runs' training and validation curves on one chart, and only the differing setting listed."""

import pytest

from tests.browser_app import MISSING, REQUIRED, choose, point_at_runs
from tests.helpers import ms

pytestmark = pytest.mark.skipif(MISSING is not None and not REQUIRED, reason=MISSING or "")


@pytest.fixture
def two_runs(server, demo_model_path):
    from core.config.settings import demo_config
    from core.train.recipe import run_training

    folder = server["work"] / "compare-runs"  # not the app's default folder: no other test sees these runs
    runs = []
    for name, lr in (("cmp-a", 8e-3), ("cmp-b", 4e-3)):
        cfg = demo_config(output_dir=str(folder), run_name=name, max_steps=4, logging_steps=1, eval_steps=2,
                          eval_samples=1, dataset_split="train[:90]", validation_split="train[90:]", learning_rate=lr)
        result = run_training(cfg)
        assert result.status == "completed", result.message
        runs.append(result)
    return folder, runs


def test_history_compares_two_runs(page, two_runs):
    folder, _ = two_runs
    point_at_runs(page, folder)
    page.get_by_role("tab", name="History").click()
    page.click("#compare-acc button, #compare-acc .label-wrap")
    picker = page.locator("#compare-runs input").first
    chosen = ("[...document.querySelectorAll('#compare-runs .token')].map(t => t.innerText).join(' ')")
    for name in ("cmp-a", "cmp-b"):
        for _ in range(3):
            # On 2 busy cores the tab's and the accordion's choices can land while the list is open, which closes
            # it under the click: open it and pick again.
            try:
                picker.click()
                page.get_by_role("option", name=name).first.click(timeout=ms(15))
                page.wait_for_function(f"{chosen}.includes({name!r})", timeout=ms(15))
                break
            except Exception:  # noqa: BLE001 - not picked yet; the assert below says what the page holds
                page.keyboard.press("Escape")
        assert name in page.evaluate(chosen), page.evaluate(chosen)
    page.keyboard.press("Escape")
    page.click("#compare-btn")
    page.wait_for_selector("#mt-compare", timeout=ms(120))  # the first Compare on a server still warming up, on 2 busy cores
    settings = page.locator("#compare-settings-table")
    assert settings.locator("tr[data-field]").count() == 1  # only what differs
    assert "learning_rate" in settings.inner_text()
    figures = page.locator("#compare-figures-table").inner_text()
    assert "Final validation loss" in figures and "tokens/s" in figures and "Speed" in figures
    plot = page.locator("#compare-plot")
    page.wait_for_selector("#compare-plot canvas, #compare-plot svg")
    assert plot.is_visible()
    legend = plot.inner_text()
    for name in ("cmp-a", "cmp-b"):
        assert f"{name} · training" in legend and f"{name} · validation" in legend, legend
    drawn = "document.querySelectorAll('#compare-plot g.mark-line path').length === 4"
    page.wait_for_function(drawn)
    # Issue 37: after a switch to Português the legend still read "training"; the tables and chart follow now.
    choose(page, "#lang-select", "Português")
    page.wait_for_function("document.querySelector('#compare-plot')?.textContent.includes('cmp-b · validação')",
                           timeout=ms(60))
    page.wait_for_function(drawn)
    legend = plot.inner_text()
    assert "cmp-a · treino" in legend and "training" not in legend, legend
    assert "Velocidade" in page.locator("#compare-figures-table").inner_text()
    assert page.errors == []


LINES = "#loss-plot g.mark-line path"  # one per series the chart draws (Vega's SVG)


def test_a_run_with_validation_draws_both_curves_while_it_trains_and_after(page):
    """Issue 37: with validation the page's loss chart drew only the validation points, while the run trained and
    after it ended: the baseline eval came first, and Gradio's chart kept the series it was built with."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from tests.browser_app import PROGRESS, set_number, state, wait_idle

    wait_idle(page)
    page.get_by_role("tab", name="1 · Model & data").click()
    split = page.locator("#field-dataset_split input")
    split.fill("train[:90]")
    split.press("Tab")
    page.get_by_role("tab", name="3 · Training").click()
    page.click("#advanced-acc button, #advanced-acc .label-wrap")
    held = page.locator("#field-validation_split input")
    # The split's own change event can still be answered after the field is typed (its handler's outputs rewrite
    # the form): the field is typed again until the generated command holds it, as a user would see and retype.
    for attempt in range(3):
        held.fill("train[90:]")
        held.press("Tab")
        page.get_by_role("tab", name="4 · Settings & code").click()
        try:
            page.wait_for_function("document.querySelector('#code-cli')?.textContent.includes('train[90:]')",
                                   timeout=ms(40))  # 2 busy cores; never a timing assert
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
            page.get_by_role("tab", name="3 · Training").click()
    # A baseline eval at step 0, a training loss every 10 steps. 200 steps so the run cannot end before the page has
    # drawn both curves (a short run raced the poll); Stop once it has, and the stopped run's chart keeps them.
    set_number(page, "max_steps", 200)
    previous = page.locator(PROGRESS).get_attribute("data-run") or ""
    page.click("#start-btn")
    page.wait_for_function(f"(() => {{ const p = document.querySelector('{PROGRESS}'); return p && p.dataset.run"
                           f" && p.dataset.run !== {previous!r}; }})()", timeout=ms(120), polling=200)
    seen = []  # (state, lines drawn, both series in the legend) as the run goes
    stopped = False
    while True:
        st, step = state(page)
        legend = page.locator("#loss-plot").inner_text() if page.locator("#loss-plot").is_visible() else ""
        # a series outside the chart's colour domain still gets a path, without a colour: the legend tells
        seen.append((st, page.locator(LINES).count(), "training" in legend and "validation" in legend))
        if st not in ("running", "stopping"):
            break
        if seen[-1] == ("running", 2, True) and not stopped:  # one press: a second one ends the run at once
            page.click("#stop-btn")
            stopped = True
        page.wait_for_timeout(ms(0.3))
    assert st in ("stopped", "completed"), page.locator("#run-result").inner_text()
    assert ("running", 2, True) in seen, seen  # both curves while it trained
    page.wait_for_function(f"document.querySelectorAll({LINES!r}).length === 2", timeout=ms(30))  # and after
    legend = page.locator("#loss-plot").inner_text()
    assert "training" in legend and "validation" in legend, legend
    assert page.errors == []
