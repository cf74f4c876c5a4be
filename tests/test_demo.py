"""The offline demo: its data, its scorer and the cheap no-GPU check that keeps torch out of the app's start-up.

The demo's speed and final score are bars for scripts/demo_bench.py (they depend on the machine), not tests.
"""

import json
import subprocess
import sys
from pathlib import Path

import torch

from core.demo import DEMO_DATA, TEMPLATES, WORDS, demo_rows
from core.infer import demo_answers, score_adapter

ROOT = Path(__file__).resolve().parent.parent


def test_the_shipped_data_is_what_the_builder_makes():
    rows = [json.loads(line) for line in DEMO_DATA.read_text(encoding="utf-8").splitlines()]
    assert rows == demo_rows() and len(rows) == 100
    assert {r["response"] for r in rows} == set(WORDS.values())
    assert {r["instruction"] for r in rows} == {t.format(w=w) for t in TEMPLATES[:2] for w in WORDS}


def test_score_counts_exact_greedy_answers(finished_run):
    adapter = finished_run.result.adapter_dir
    rows = demo_rows()[:6]
    answers = demo_answers(adapter, rows)
    assert len(answers) == 6 and all(isinstance(a, str) for a in answers)
    # The same prompts, once with the model's own answers as the expected responses, once with impossible ones.
    own = [dict(r, response=f" {a} ") for r, a in zip(rows, answers)]
    assert score_adapter(adapter, own) == (6, 6)
    assert score_adapter(adapter, [dict(r, response="§never§") for r in rows]) == (0, 6)


def test_no_gpu_driver_never_hides_a_gpu_torch_can_use():
    proc = subprocess.run([sys.executable, "-c", "import sys; from core.config.hardware import no_gpu_driver; "
                           "print(no_gpu_driver(), 'torch' in sys.modules)"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    no_gpu, imported_torch = proc.stdout.split()
    assert imported_torch == "False"  # the check itself is cheap
    if no_gpu == "True":
        assert not torch.cuda.is_available()
