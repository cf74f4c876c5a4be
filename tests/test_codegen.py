"""Show code trains what the engine trains: the generated script runs memtune's recipe on the settings it holds."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core import codegen
from core.config.settings import TrainConfig, demo_config
from core.train.recipe import run_training

ROOT = Path(__file__).resolve().parent.parent


def long_prompt_rows(path: Path) -> Path:
    """Demo-like rows, half of them with a prompt far over max_length: the engine cuts those (long_prompts)."""
    words = ["friend", "night", "horse", "window", "apple", "river", "house", "bread"]
    french = ["ami", "nuit", "cheval", "fenetre", "pomme", "riviere", "maison", "pain"]
    with path.open("w", encoding="utf-8") as f:
        for i, (en, fr) in enumerate(zip(words * 2, french * 2)):
            context = " ".join(f"Some context about the word {en} number {k}." for k in range(30)) if i % 2 else ""
            f.write(json.dumps({"instruction": f"What is the French word for '{en}'?", "context": context,
                                "response": fr}) + "\n")
    return path


def losses(run_dir: str | Path) -> list[float]:
    lines = (Path(run_dir) / "events.jsonl").read_text().splitlines()
    return [e["loss"] for e in map(json.loads, lines) if e["kind"] == "metrics"]


def test_generated_script_trains_like_the_engine(demo_model_path, tmp_path):
    data = long_prompt_rows(tmp_path / "long.jsonl")
    # Over-long prompts (the row plan's cuts), varlen attention over packed rows, checkpointing: what a standalone
    # copy of the recipe got wrong.
    cfg = demo_config(model=str(demo_model_path), dataset=str(data), max_steps=3, logging_steps=1, device="cpu",
                      per_device_train_batch_size=4, output_dir=str(tmp_path / "script-runs"), attention="varlen",
                      packing=True, long_prompts="truncate_middle", gradient_checkpointing=True)
    script = tmp_path / "train.py"
    script.write_text(codegen.python_script(cfg), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script finds memtune on its own
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = re.search(r"^run folder: (.+)$", proc.stdout, re.M)
    assert found, proc.stdout[-2000:]
    script_run = Path(found.group(1))
    assert (script_run / "adapter" / "adapter_model.safetensors").is_file()
    script_summary = json.loads((script_run / "summary.json").read_text())
    # The over-long prompts were cut by the engine's row plan, not left to TRL's truncation.
    assert script_summary["data"]["prompt_cut"] >= 4, script_summary["data"]
    assert TrainConfig.load(script_run / "config.yaml") == cfg

    engine = run_training(cfg.replace(output_dir=str(tmp_path / "engine-runs")))
    assert engine.status == "completed", engine.message
    assert engine.summary["data"] == script_summary["data"]  # the same rows, cut the same way
    ours, theirs = losses(script_run), losses(engine.run_dir)
    assert len(ours) == len(theirs) == 3
    assert ours[0] == theirs[0]  # the same first batch through the same model: equal to the last bit
    assert ours == pytest.approx(theirs, rel=1e-5)  # other thread counts may reorder a sum after an update
    assert ours[0] != pytest.approx(ours[-1], rel=1e-3)  # it did train


@pytest.mark.parametrize("cfg", [
    demo_config(run_name='it\'s """quoted""" \\ and more'),
    TrainConfig(num_gpus="2", attention="varlen", long_prompts="drop"),
    TrainConfig(dataset="notes.txt", dataset_format="sharegpt", resume_from="runs/old"),
])
def test_the_script_holds_exactly_the_settings(cfg):
    code = codegen.python_script(cfg)
    namespace = {"__name__": "generated_script"}  # run the module body, not main()
    exec(compile(code, "generated.py", "exec"), namespace)
    assert TrainConfig.from_yaml(namespace["SETTINGS"]) == cfg
    assert namespace["run_training"] is run_training  # memtune's recipe, not a copy of it
    assert f"sys.path.insert(0, {str(ROOT)!r})" in code
    for line in codegen.cli_command(cfg).splitlines():  # the headless command, in comments
        assert f"#     {line}" in code
    assert codegen.config_yaml(cfg) in namespace["SETTINGS"]


def test_cli_prints_the_script(capsys, tmp_path):
    assert codegen.main(["--demo", "--set", "max_steps=3"]) == 0
    out = capsys.readouterr().out
    assert out == codegen.python_script(demo_config(max_steps=3))
    saved = tmp_path / "c.yaml"
    TrainConfig(lora_r=8).save(saved)
    assert codegen.main(["--config", str(saved), "--cli"]) == 0
    assert capsys.readouterr().out == f"python -m core.train --config {saved}\n"
    assert codegen.main(["--demo", "--set", "lora_r=x"]) == 2
    assert "lora_r" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        codegen.main(["--help"])
    assert exit_.value.code == 0 and "--config" in capsys.readouterr().out
