"""An adapter is checked against its base model before any model loads (its peft type, its target modules on the
model's tree on the meta device), every action's failure is said from its key in the page's language (a Try it child
killed mid-answer included), and the command line sizes torch's threads by the app's rule and says so first.
Real adapters saved by peft on the demo model, real action children."""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.test_faults import tiny_adapter  # noqa: F401 - the fixture: a real LoRA adapter of the demo model

SETTINGS = dict(temperature=0.0, top_p=0.9, seed=0, template=True)


def edited(tiny_adapter: Path, where: Path, **change) -> Path:
    """A copy of the adapter whose adapter_config.json has `change`."""
    folder = where / "run" / "adapter"
    shutil.copytree(tiny_adapter, folder)
    settings = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    (folder / "adapter_config.json").write_text(json.dumps({**settings, **change}), encoding="utf-8")
    return folder


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any load of a model's weights fails the test: the refusals come before."""
    from core.model import load

    def loads(*args, **kwargs):
        raise AssertionError("a model was loaded before the adapter was checked")

    monkeypatch.setattr(load, "load_model", loads)
    monkeypatch.setattr(load, "load_with_adapter", loads)


def said_in(exc, lang: str) -> str:
    from ui.render import error_text

    return error_text(exc, lang)


# --- the adapter against its base model ------------------------------------------------------------------------
def test_an_adapter_of_another_peft_type_is_refused_by_name(tiny_adapter, tmp_path, no_model_loads, capsys):
    """peft_type LOHA: peft merged it silently into a model it does not fit; now refused, keyed, by every path."""
    from core.export.cli import main
    from core.infer import Comparer, InferError, adapter_config

    folder = edited(tiny_adapter, tmp_path, peft_type="LOHA")
    with pytest.raises(InferError) as refused:
        adapter_config(folder)  # what the page and the GGUF export ask first
    assert refused.value.key == "infer.err.peft_type" and '"LOHA"' in str(refused.value)
    assert "LoRA adapters only" in said_in(refused.value, "en")
    assert "só carrega adaptadores LoRA" in said_in(refused.value, "pt") and '"LOHA"' in said_in(refused.value, "pt")
    with pytest.raises(InferError, match="LoRA adapters only"):
        Comparer(wait_s=5).load(folder)  # Try it's load
    assert main(["merge", str(folder), "--out", str(tmp_path / "merged")]) == 2  # an error line, no traceback
    err = capsys.readouterr().err
    assert err.startswith("error: ") and '"peft_type": "LOHA"' in err and "Traceback" not in err
    assert not (tmp_path / "merged").exists()


def test_dora_and_rslora_adapters_are_lora(tiny_adapter, tmp_path, demo_model_path):
    from core.infer import adapter_config, adapter_problem

    folder = edited(tiny_adapter, tmp_path, use_dora=True, use_rslora=True)
    assert adapter_problem(folder, adapter_config(folder), str(demo_model_path)) is None


def test_target_modules_the_model_lacks_are_refused_before_it_loads(tiny_adapter, tmp_path, demo_model_path,
                                                                   no_model_loads, capsys):
    """target_modules ["qq_proj"]: merge ended in peft's NoMatchingPeftModuleError traceback. Now Try it, merge and
    the GGUF export refuse it, naming the module and the model's own layers, before any weight is read."""
    from core.export.cli import main
    from core.export.gguf import GGUFError
    from core.export.gguf_export import export_gguf
    from core.infer import Comparer, InferError, adapter_config, adapter_problem

    folder = edited(tiny_adapter, tmp_path, target_modules=["qq_proj"])
    cfg = adapter_config(folder)  # its own files are sound: only the base tells
    problem = adapter_problem(folder, cfg, str(demo_model_path))
    assert problem is not None and problem.key == "infer.err.targets"
    assert "names qq_proj" in str(problem) and "q_proj, k_proj, v_proj, o_proj" in str(problem)
    assert "não tem nenhuma camada linear" in said_in(problem, "pt") and "qq_proj" in said_in(problem, "pt")
    with pytest.raises(InferError, match="qq_proj"):
        Comparer(wait_s=5).load(folder)
    assert main(["merge", str(folder), "--out", str(tmp_path / "merged")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "names qq_proj" in err and "Traceback" not in err
    with pytest.raises(GGUFError) as gguf:
        export_gguf(adapter_dir=folder, formats=["f16"], out_dir=tmp_path / "gguf")
    assert gguf.value.key == "infer.err.targets" and not (tmp_path / "gguf").exists()
    sound = edited(tiny_adapter, tmp_path / "sound")
    assert adapter_problem(sound, adapter_config(sound), str(demo_model_path)) is None


# --- every action's failure said from its key --------------------------------------------------------------------
@pytest.fixture
def manager():
    from core.jobs.manager import JobManager

    m = JobManager()
    yield m
    m.shutdown()


def test_a_try_it_child_killed_mid_answer_is_said_in_the_pages_language(tiny_adapter, tmp_path, manager):
    """The page showed `{'key': 'log.exit_signal', ...}` inside the message: the nested reason is said too."""
    from ui.tryexport import failure

    adapter = shutil.copytree(tiny_adapter, tmp_path / "run" / "adapter")
    action = manager.actions.try_child(str(adapter))
    n = action.ask(prompt="Hello", max_new_tokens=4000, **SETTINGS)
    deadline = time.monotonic() + 300  # a guard against a hang only; nothing asserts on time
    while not any(e.get("kind") in ("answer", "answered") and e.get("request") == n for e in action.events_since(0)):
        assert action.running and time.monotonic() < deadline, action.events_since(0)[-3:]
        time.sleep(0.02)
    os.kill(action.pid, signal.SIGKILL)  # mid-answer, as the kernel's OOM killer does
    assert action.wait(60)
    english, portuguese = failure(action, "en", n), failure(action, "pt", n)
    for text in (english, portuguese):
        assert "{" not in text.split("\n")[0] and "'key'" not in text, text
    assert english.startswith("Try it ended unexpectedly (killed by signal SIGKILL)"), english
    assert portuguese.startswith("Experimentar terminou inesperadamente (encerrado pelo sinal SIGKILL)"), portuguese


def test_a_merge_child_refusal_is_said_in_the_pages_language(tiny_adapter, tmp_path, manager):
    from ui.tryexport import failure

    folder = edited(tiny_adapter, tmp_path, target_modules=["qq_proj"])
    merge = manager.actions.start("merge", {"adapter": str(folder), "out_dir": str(tmp_path / "merged")})
    assert merge.wait(300)
    error = next(e for e in merge.events_since(0) if e["kind"] == "error")
    assert merge.result()["status"] == "failed" and error["key"] == "infer.err.targets", error
    assert "não tem nenhuma camada linear" in failure(merge, "pt") and "qq_proj" in failure(merge, "pt")
    assert "has no linear layer of that name" in failure(merge, "en")


# --- the command line's threads ----------------------------------------------------------------------------------
@pytest.mark.parametrize("env, cores, expected", [
    ({}, 2, (1, "")),
    ({}, 16, (15, "")),
    ({}, 1, (1, "")),
    ({"OMP_NUM_THREADS": "3"}, 2, (3, "OMP_NUM_THREADS")),
    ({"MEMTUNE_NUM_THREADS": "2", "OMP_NUM_THREADS": "3"}, 8, (2, "MEMTUNE_NUM_THREADS")),
    ({"MEMTUNE_NUM_THREADS": "0", "OMP_NUM_THREADS": "many"}, 4, (3, "")),
])
def test_torch_threads_leave_a_core_unless_a_setting_says(monkeypatch, env, cores, expected):
    from core.jobs import supervise

    monkeypatch.setattr(supervise, "cores", lambda: cores)
    threads = supervise.torch_threads(env)
    assert (threads.n, threads.setting) == expected and threads.cores == cores


def test_the_threads_line_in_each_language(monkeypatch):
    from core.jobs import supervise
    from ui.render import said

    monkeypatch.setattr(supervise, "cores", lambda: 2)
    line = supervise.torch_threads({}).said()
    assert str(line) == ("torch CPU threads: 1 of the 2 cores this process may use, 1 left for the rest of the "
                         "machine (OMP_NUM_THREADS or MEMTUNE_NUM_THREADS sets another number)")
    assert said(line.key, line.params, "pt").startswith("threads de CPU do torch: 1 dos 2 núcleos")
    assert said(line.key, line.params, "fr").startswith("threads CPU de torch : 1 des 2 cœurs")
    assert str(supervise.torch_threads({"OMP_NUM_THREADS": "4"}).said()) == (
        "torch CPU threads: 4, as OMP_NUM_THREADS says (2 cores here)")


def test_the_cli_says_its_threads_first_and_uses_them(monkeypatch, capfd, tmp_path):
    """A run refused at once (its output_dir is a file): before that, its first line and torch's thread count."""
    import torch

    from core.jobs import supervise
    from tests.helpers import train_cli

    monkeypatch.setattr(supervise, "cores", lambda: 3)
    for name in supervise.THREAD_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    before = torch.get_num_threads()
    try:
        code, _, err = train_cli(capfd, "--demo", "--set", f"output_dir={tmp_path / 'a-file'}")
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert code == 1 and "is a file" in err
    assert err.splitlines()[0] == ("[memtune] torch CPU threads: 2 of the 3 cores this process may use, 1 left for "
                                   "the rest of the machine (OMP_NUM_THREADS or MEMTUNE_NUM_THREADS sets another "
                                   "number)")
    assert used == 2
