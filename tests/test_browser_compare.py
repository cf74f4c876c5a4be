"""History compares runs (issue 22): two short demo runs with validation, made by this test in its own folder,
picked in the page: both runs' training and validation curves on one chart, and only the differing setting listed."""

import pytest

from tests.browser_app import MISSING, REQUIRED

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
    page.get_by_role("tab", name="3 · Training").click()
    box = page.locator("#field-output_dir input, #field-output_dir textarea").first
    box.fill(str(folder))
    box.press("Tab")
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
                page.get_by_role("option", name=name).first.click(timeout=15_000)
                page.wait_for_function(f"{chosen}.includes({name!r})", timeout=15_000)
                break
            except Exception:  # noqa: BLE001 - not picked yet; the assert below says what the page holds
                page.keyboard.press("Escape")
        assert name in page.evaluate(chosen), page.evaluate(chosen)
    page.keyboard.press("Escape")
    page.click("#compare-btn")
    page.wait_for_selector("#mt-compare", timeout=120_000)  # the first Compare on a server still warming up, on 2 busy cores
    settings = page.locator("#compare-settings-table")
    assert settings.locator("tr[data-field]").count() == 1  # only what differs
    assert "learning_rate" in settings.inner_text()
    figures = page.locator("#compare-figures-table").inner_text()
    assert "Final validation loss" in figures and "Tokens/s" in figures
    plot = page.locator("#compare-plot")
    page.wait_for_selector("#compare-plot canvas, #compare-plot svg")
    assert plot.is_visible()
    legend = plot.inner_text()
    for name in ("cmp-a", "cmp-b"):
        assert f"{name} · training" in legend and f"{name} · validation" in legend, legend
    assert page.errors == []
