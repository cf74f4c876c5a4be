"""Small helpers several test files share (not fixtures: plain functions)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import psutil


def load_factor() -> float:
    """How many times slower than on an idle machine a process runs now: the 1-minute load average per core this
    process may use, at least 1 (load 8 on 2 cores: 4)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1.0, os.getloadavg()[0] / cores)


def patient(seconds: float) -> float:
    """A bound given for an idle machine (a start-up, a page's answer), stretched by the machine's load now. A bound
    on a wait, never a timing assert."""
    return seconds * load_factor()


def ms(seconds: float) -> float:
    """A browser wait's bound in milliseconds (Playwright's `timeout=`): `seconds` on an idle machine, stretched by
    the load now, as `patient`."""
    return patient(seconds) * 1000


class Patience:
    """A wait's bound for an idle machine, stretched by the load as it is while waiting (a machine that gets busier
    during a start-up gives it longer)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.began = seconds, time.monotonic()

    def waited(self) -> float:
        return time.monotonic() - self.began

    def over(self) -> bool:
        return self.waited() > patient(self.seconds)

    def __str__(self) -> str:
        return (f"{self.waited():.0f} s (the bound: {self.seconds:.0f} s on an idle machine, times the load per core, "
                f"{load_factor():.1f} now)")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group: what a run left behind."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def checkpointed_run(out: Path, name: str, max_steps: int, save_steps: int):
    """A real demo run in `out`, logging every step and checkpointing every `save_steps` (its RunResult)."""
    from core.config.settings import demo_config
    from core.train.recipe import run_training

    result = run_training(demo_config(output_dir=str(out), run_name=name, max_steps=max_steps,
                                      save_strategy="steps", save_steps=save_steps, logging_steps=1))
    assert result.status == "completed", result.message
    return result


def train_cli(capfd, *argv: str) -> tuple[int, str, str]:
    """`python -m core.train ARGV` run in this process (a fresh one spends seconds importing torch and the training
    libraries): its exit code and what it wrote to stdout and stderr, caught at the file descriptors. Puts back the
    SIGTERM/SIGINT handlers main() installs for a run."""
    import signal

    from core.train.cli import main

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    capfd.readouterr()
    try:
        code = main(list(argv))
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    out, err = capfd.readouterr()
    return code, out, err


def rendered_rows(cfg, tokenizer):
    """(rows, format): the strings core.data.plan renders for `cfg`'s data (prompt/completion or text, every non-empty
    row, before any max_length cut), after the engine's own checks of the data (plan_rows: its DataError)."""
    import datasets

    from core.data import plan as data

    raw, fmt = data.check_data(cfg)
    data.plan_rows(cfg, tokenizer, raw, fmt, n_examples=0)
    columns, _ = data.render_rows(raw, fmt, tokenizer)
    columns.pop("turns", None)  # the strings only (plan_rows turns the turn spans into labels)
    return datasets.Dataset.from_dict(columns), fmt


def checklist_texts(lang: str) -> list[tuple[str, str, str]]:
    """(item key, label, trade-off) of the seven checklist items, in the chapter's order, in `lang`."""
    from core.config.checklist import ITEMS
    from core.i18n import t

    return [(item.key, t(f"checklist.{item.key}.label", lang), t(f"checklist.{item.key}.tradeoff", lang))
            for item in ITEMS]


def tree_hash(path: Path) -> str:
    """Every file's relative name and bytes, every link's target, every folder's name: one digest."""
    h = hashlib.sha256()
    for p in sorted(Path(path).rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_symlink():
            h.update(b"L" + os.readlink(p).encode())
        elif p.is_file():
            h.update(b"F" + p.read_bytes())
        else:
            h.update(b"D")
    return h.hexdigest()


def upload_as_the_page_does(form, lang: str, file_path, values: list) -> dict:
    """An upload through the steps the page chains (ui/layout.py wire_form): the file checked (ui.data.on_upload),
    the form told (on_uploaded), the preview made for the form as it then is (preview_upload) and put on screen when
    it still describes it (shown_if_current). {component: what the page ends up showing} for what the form's step
    wrote, the preview's last word included."""
    from ui.data import on_upload, on_uploaded, preview_upload
    from ui.fields import FIELD_NAMES
    from ui.form import shown_if_current

    arrived = on_upload(lang, file_path, *values)
    told = on_uploaded(form, lang, arrived, *values)
    now = [told.get(form.fields[n], v) for n, v in zip(FIELD_NAMES, values)]
    now = [v["value"] if isinstance(v, dict) and "value" in v else v for v in now]
    shown = shown_if_current(lang, preview_upload(lang, arrived, None, *now), *now)  # None: no progress bar
    return {**told, form.preview: shown} if isinstance(shown, str) else told


def tiny_model_folder(config, folder: Path) -> Path:
    """A model of `config` (a transformers config) with seed-0 random weights, saved in bf16 beside the demo's
    tokenizer: a folder the product loads as it would a Hub download."""
    import shutil
    import warnings

    import torch
    from transformers import AutoModelForCausalLM

    from core.demo import ensure_demo_model

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config)
    model.config.use_cache = False
    model.to(torch.bfloat16).save_pretrained(folder)
    for f in ensure_demo_model().iterdir():
        if "token" in f.name or f.name == "chat_template.jinja":
            shutil.copy(f, folder / f.name)
    return folder
