"""Regenerate the README screenshots of memtune's main states into assets/screenshots/.

    python scripts/screenshots.py [--out assets/screenshots] [--width 1440]

Starts `python app.py` on a free port in a temporary working folder (offline, CPU demo), drives it with
Debian's chromium through Playwright, and saves: 01-idle.png (model & data with the data preview, the predicted
peak on the gauge), 02-checklist.png (the chapter's recipe: what each item saves and costs, Fit to my GPU),
03-running.png (mid-run: progress, loss curve, log), 04-finished.png (adapter ready, predicted vs measured peak),
05-code.png (the settings as a command and a script), 06-try-it.png (base vs fine-tuned answers),
07-history.png (the runs, one opened), 08-export.png, 09-checklist-pt.png (the checklist in Portuguese).

It also writes the tutorial, docs/tutorial/{en,pt,fr}.md with one screenshot per step in that language
(docs/tutorial/img/), and docs/tutorial/manifest.json (texts and rules: scripts/tutorial.py). It renders any of
the page's eight languages (en, pt, fr, es, de, zh, ja, ko); en/pt/fr are the committed ones:

    python scripts/screenshots.py                                # everything
    python scripts/screenshots.py --only tutorial --languages en # one language's tutorial
    python scripts/screenshots.py --only tutorial --languages de --tutorial-out /tmp/tut  # elsewhere
    python scripts/screenshots.py --only tutorial --pass-dir /tmp/pass  # and every tab, for a review
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
if str(ROOT) not in sys.path:  # scripts.tutorial and core.i18n, when run as a file
    sys.path.insert(0, str(ROOT))
from scripts.tutorial import COMMITTED, LANGUAGES as TUTORIAL_LANGUAGES, TUTORIAL_DIR  # noqa: E402

BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(workdir: Path, port: int) -> subprocess.Popen:
    env = dict(os.environ, MEMTUNE_HOME=str(workdir / "home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_HOME=str(workdir / "hf"), GRADIO_ANALYTICS_ENABLED="False", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=workdir, env=env,
                            stdout=open(workdir / "app.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 300  # a shared machine loaded past its cores starts the app slowly
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited early:\n{(workdir / 'app.log').read_text()}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("app.py did not start within 300 s")


RUNNING = ("(() => { const p = document.querySelector('#run-progress .mt-progress');"
           " return p && (+p.dataset.step >= 60 || ['completed','stopped','failed'].includes(p.dataset.state)); })()")


def open_demo(page, url: str, start_text: str = "") -> None:
    """Load the page (on the demo), wait until it is in the browser's language (Start reads `start_text`), and
    preview its data: a preview asked for before the language switch would be written in English."""
    page.goto(url)
    page.wait_for_selector("#start-btn")
    page.wait_for_selector("#mt-gauge-prediction", timeout=30_000)
    if start_text:
        page.wait_for_function(f"document.querySelector('#start-btn').textContent.includes({start_text!r})")
        page.wait_for_timeout(1500)  # the language switch's re-render lands
    page.click("#preview-btn")
    page.wait_for_selector("#mt-preview svg", timeout=60_000)


def start_run(page) -> None:
    """Start the demo run and wait until it is well under way (or over)."""
    page.click("#start-btn")
    page.wait_for_function(RUNNING, timeout=180_000, polling=250)


def try_it(page, prompt: str, done: str) -> None:
    """Ask the newest adapter `prompt` in Try it and wait for the status line saying `done`."""
    page.wait_for_selector("#try-adapter input")
    page.click("#try-adapter input")
    page.get_by_role("option").first.click()
    page.locator("#try-prompt textarea").fill(prompt)
    page.click("#try-send")
    done = done.rstrip(".")  # "Done." or "Done, but ... produced no text"
    page.wait_for_function(f"document.querySelector('#try-status')?.textContent.includes({done!r})",
                           timeout=180_000, polling=250)


def open_newest_run(page) -> None:
    """In History, open the newest run and wait for its curve."""
    page.wait_for_selector("#history-table [data-testid=cell-0-1]", timeout=30_000)
    page.click("#history-table [data-testid=cell-0-1]")
    page.wait_for_selector("#mt-history-detail")
    page.wait_for_selector("#history-plot canvas, #history-plot svg")


def readme_shots(browser, url: str, out: Path, width: int) -> None:
    """The README's screenshots (English)."""
    page = browser.new_page(viewport={"width": width, "height": 1000}, device_scale_factor=1)
    open_demo(page, url)
    page.wait_for_timeout(800)
    page.screenshot(path=str(out / "01-idle.png"), full_page=True)
    print("01-idle.png")

    # The checklist on the chapter's recipe (8B model): the per-item savings are worth reading there.
    page.click("#preset-chapter")
    page.wait_for_function("document.querySelector('#mt-summary [data-key=model]')"
                           ".textContent.includes('Llama-3.1-8B')")
    page.get_by_role("tab", name="2 · Memory checklist").click()
    page.wait_for_selector("#check-qlora")
    page.wait_for_function("+document.querySelector('#mt-gauge-prediction')?.dataset.predicted > 5")
    page.wait_for_timeout(800)
    page.screenshot(path=str(out / "02-checklist.png"), full_page=True)
    print("02-checklist.png")
    page.get_by_role("tab", name="1 · Model & data").click()
    page.click("#preset-demo")
    page.wait_for_function("document.querySelector('#mt-summary [data-key=model]')"
                           ".textContent.includes('demo-tiny-llama')")

    page.get_by_role("tab", name="1 · Model & data").click()
    start_run(page)
    page.wait_for_timeout(300)
    page.screenshot(path=str(out / "03-running.png"), full_page=True)
    print("03-running.png")

    page.wait_for_selector("#run-result .mt-result", timeout=300_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(out / "04-finished.png"), full_page=True)
    print("04-finished.png")

    page.get_by_role("tab", name="4 · Settings & code").click()
    page.wait_for_selector("#code-python")
    page.wait_for_timeout(800)
    page.screenshot(path=str(out / "05-code.png"), full_page=False)
    print("05-code.png")

    page.get_by_role("tab", name="Try it").click()
    try_it(page, "Translate the word 'cat' into French.", "Done")
    page.wait_for_timeout(500)
    page.screenshot(path=str(out / "06-try-it.png"), full_page=True)
    print("06-try-it.png")

    page.get_by_role("tab", name="History").click()
    open_newest_run(page)
    page.wait_for_timeout(1200)
    page.screenshot(path=str(out / "07-history.png"), full_page=True)
    print("07-history.png")

    page.get_by_role("tab", name="Export").click()
    page.wait_for_selector("#export-merge-warning .mt-note", timeout=30_000)
    page.wait_for_timeout(800)
    page.screenshot(path=str(out / "08-export.png"), full_page=True)
    print("08-export.png")

    # The checklist in Portuguese, on the chapter's recipe (as in 02).
    page.get_by_role("tab", name="Train", exact=True).click()
    page.get_by_role("tab", name="1 · Model & data").click()
    page.click("#preset-chapter")
    page.wait_for_function("document.querySelector('#mt-summary [data-key=model]')"
                           ".textContent.includes('Llama-3.1-8B')")
    page.get_by_role("tab", name="2 · Memory checklist").click()
    page.wait_for_selector("#check-qlora")
    page.click("#lang-select input")
    page.get_by_role("option", name="Português").click()
    page.wait_for_function("document.querySelector('#check-gradient_checkpointing')"
                           ".textContent.includes('Ative gradient checkpointing')")
    page.wait_for_function("+document.querySelector('#mt-gauge-prediction')?.dataset.predicted > 5")
    page.wait_for_timeout(1500)
    page.screenshot(path=str(out / "09-checklist-pt.png"), full_page=True)
    print("09-checklist-pt.png")
    page.close()


def tutorial_pass(browser, url: str, lang: str, width: int, pass_dir: Path | None = None,
                  out_dir: Path | None = None) -> None:
    """One language's tutorial: a fresh page whose browser asks for `lang`, the demo from start to GGUF export,
    written into `out_dir` (default docs/tutorial/)."""
    from core.i18n import t
    from scripts.tutorial import LOCALES, STEPS, TUTORIAL_DIR, DEMO_PROMPT, image_name, write_tutorial

    out_dir = out_dir or TUTORIAL_DIR
    img = out_dir / "img"
    img.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(locale=LOCALES[lang], viewport={"width": width, "height": 1000},
                                  device_scale_factor=1)
    page = context.new_page()

    def tab(key: str) -> None:
        page.get_by_role("tab", name=t(key, lang), exact=True).click()

    shown: dict[str, str] = {}

    def shot(step: str, full_page: bool = True) -> None:
        page.wait_for_timeout(800)
        name = image_name(lang, STEPS.index(step), step)
        page.screenshot(path=str(img / name), full_page=full_page)
        shown[step] = page.inner_text("body")  # what the picture shows, for tests/test_tutorial.py
        print(name, flush=True)

    def extra(name: str) -> None:  # --pass-dir: every tab, for a reviewer to look at (not part of the tutorial)
        if pass_dir is not None:
            page.wait_for_timeout(800)
            page.screenshot(path=str(pass_dir / f"{lang}-{name}.png"), full_page=True)
            (pass_dir / f"{lang}-{name}.txt").write_text(page.inner_text("body"), encoding="utf-8")

    open_demo(page, url, t("run.start", lang))
    shot("start")
    tab("tab.checklist")
    page.wait_for_selector("#check-qlora")
    shot("checklist")
    tab("tab.training")
    extra("settings-training")
    tab("tab.code")
    extra("settings-code")
    tab("tab.data")
    start_run(page)
    shot("training")
    page.wait_for_selector("#run-result .mt-result", timeout=300_000)
    shot("finished")
    if pass_dir is not None:
        tab("tab.data")
        page.click("#preset-chapter")  # the 8B recipe: GiB figures and Fit to my GPU's advice worth reading
        page.wait_for_function("document.querySelector('#mt-summary [data-key=model]')?.textContent.includes('8B')")
        tab("tab.checklist")
        page.click("#fit-btn")
        page.wait_for_selector("#fit-notice .mt-note", timeout=60_000)
        extra("checklist-chapter")
        tab("tab.data")
        page.click("#preset-demo")
        page.wait_for_function("document.querySelector('#mt-summary [data-key=model]')?.textContent.includes('demo')")
    tab("tab.try")
    try_it(page, DEMO_PROMPT, t("try.done", lang))
    shot("try")
    tab("tab.export")
    page.wait_for_selector("#export-merge-warning .mt-note", timeout=30_000)
    page.wait_for_selector("#gguf-plan .mt-note", timeout=30_000)
    page.click("#gguf-export-btn")
    page.wait_for_selector("#gguf-status .mt-note-ok", timeout=300_000)
    page.wait_for_selector("#gguf-commands")
    shot("export")
    tab("tab.history")
    open_newest_run(page)
    shot("history")
    context.close()
    print(write_tutorial(lang, shown, out_dir), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "assets" / "screenshots"))
    ap.add_argument("--width", type=int, default=1440)
    ap.add_argument("--only", choices=["readme", "tutorial"], default=None, help="only the README screenshots or "
                    "only the tutorial (default: both)")
    ap.add_argument("--languages", default=",".join(COMMITTED), help="tutorial languages, comma-separated, any of "
                    f"{', '.join(TUTORIAL_LANGUAGES)} (default: the committed ones, {', '.join(COMMITTED)})")
    ap.add_argument("--tutorial-out", default=str(TUTORIAL_DIR), help="where the tutorial's pages, screenshots, "
                    "texts and manifest go (default: docs/tutorial/)")
    ap.add_argument("--pass-dir", default=None, help="also save a screenshot (and its text) of every tab, in each "
                    "tutorial language, into this folder: a reviewer's pass over the whole page")
    args = ap.parse_args(argv)
    languages = [code.strip() for code in args.languages.split(",") if code.strip()]
    unknown = [code for code in languages if code not in TUTORIAL_LANGUAGES]
    if unknown:
        ap.error(f"--languages: {', '.join(unknown)} not among {', '.join(TUTORIAL_LANGUAGES)}")
    tutorial_out = Path(args.tutorial_out)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pass_dir = Path(args.pass_dir) if args.pass_dir else None
    if pass_dir is not None:
        pass_dir.mkdir(parents=True, exist_ok=True)

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="memtune-shots-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        proc = start_app(workdir, port)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
                if args.only != "tutorial":
                    readme_shots(browser, f"http://127.0.0.1:{port}/", out, args.width)
                if args.only != "readme":
                    for lang in languages:
                        tutorial_pass(browser, f"http://127.0.0.1:{port}/", lang, args.width, pass_dir,
                                      tutorial_out)
                browser.close()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
