"""Show code's script trains what the engine trains: the same library arguments, the same rows, the same losses."""

import dataclasses
import os
import re
import subprocess
import sys
import warnings

import pytest

from core import codegen, recipe
from core.config import TrainConfig, demo_config
from core.train import build_sft_config, run_training

# "path/transformers/x.py:12: FutureWarning: message" as Python prints a warning.
LIBRARY_WARNING = re.compile(r"/(transformers|trl)/\S+:\d+: (FutureWarning|DeprecationWarning): (.*)")
# peft 0.21's PeftModel.__init__ reads model.is_gradient_checkpointing, which transformers 5.2x deprecated: raised
# inside get_peft_model for the engine as well, from nothing the script passes. Everything else fails the test.
NOT_OURS = ("`is_gradient_checkpointing` is deprecated",)


def short_run(model_path, tmp_path, **changes) -> TrainConfig:
    return demo_config(model=str(model_path), max_steps=3, logging_steps=1, device="cpu",
                       output_dir=str(tmp_path / "runs"), **changes)


def test_generated_script_trains_like_the_engine(demo_model_path, tmp_path):
    # Checkpointing on: its argument is the one transformers renamed, and the script must speak the new name.
    cfg = short_run(demo_model_path, tmp_path, gradient_checkpointing=True)
    script = tmp_path / "train.py"
    script.write_text(codegen.python_script(cfg), encoding="utf-8")
    assert "sys.path" not in script.read_text()  # a local model + data file: nothing of memtune is imported
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONWARNINGS="default")  # show DeprecationWarnings too
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    deprecations = [m.group(0) for m in LIBRARY_WARNING.finditer(proc.stderr)
                    if not any(known in m.group(3) for known in NOT_OURS)]
    assert deprecations == []
    found = re.search(r"first loss (\S+), last loss (\S+)", proc.stdout)
    assert found, proc.stdout[-2000:]
    script_first, script_last = float(found.group(1)), float(found.group(2))
    assert (tmp_path / "runs" / "qlora-output" / "adapter" / "adapter_model.safetensors").is_file()

    result = run_training(cfg)
    assert result.status == "completed", result.message
    # Same rows in the same order through the same model: the first loss is equal to the last bit.
    assert script_first == result.summary["first_loss"]
    # After two updates, equal too: same LoRA init (seeded), optimizer, schedule and checkpointing.
    assert script_last == pytest.approx(result.summary["final_loss"], rel=1e-5)
    assert script_first != pytest.approx(script_last, rel=1e-3)  # it did train


def generated_namespace(cfg: TrainConfig) -> dict:
    """The script's module namespace (its helpers), without running main()."""
    namespace = {"__name__": "generated_script"}
    exec(compile(codegen.python_script(cfg), "generated.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("rows", [
    {"instruction": ["Say hi", "Add"], "context": ["", "2 and 3"], "response": ["hi", "5"]},
    {"instruction": ["Say hi"], "input": ["to Bob"], "output": ["hi Bob"]},
    {"conversations": [[{"from": "system", "value": "Be brief"}, {"from": "human", "value": "hi"},
                        {"from": "gpt", "value": "hello"}]]},
    {"messages": [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]]},
    {"prompt": ["Q: 1+1\nA:"], "completion": [" 2"]},
    {"text": ["plain text", "  "]},
])
def test_script_formats_rows_as_the_engine_does(rows, demo_model_path, demo_tokenizer, tmp_path):
    import datasets

    from core import data

    ns = generated_namespace(short_run(demo_model_path, tmp_path))
    raw = datasets.Dataset.from_dict(rows)
    fmt = data.detect_format(raw)
    assert ns["detect_format"](raw) == fmt
    assert ns["to_sft"](raw, fmt, demo_tokenizer).to_list() == data.to_sft(raw, fmt, demo_tokenizer).to_list()


def test_engine_and_script_take_the_same_trainer_arguments(tmp_path):
    from trl import SFTConfig

    cfg = TrainConfig(device="cpu", packing=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecated argument name on the installed version
        args = build_sft_config(cfg, tmp_path)
    kwargs = recipe.installed_names(recipe.sft_kwargs(cfg, tmp_path, cuda=False, console=False), SFTConfig)
    normalised = ("output_dir", "report_to")  # TrainingArguments turns "none" into [] and expands the path
    assert {k: getattr(args, k) for k in kwargs if k not in normalised} == {k: v for k, v in kwargs.items()
                                                                            if k not in normalised}
    assert (args.data_seed, args.include_num_input_tokens_seen, args.save_only_model) == (42, "non_padding", False)
    known = {f.name for f in dataclasses.fields(SFTConfig)}
    name = "activation_checkpointing" if "activation_checkpointing" in known else "gradient_checkpointing"
    assert getattr(args, name) is True and getattr(args, f"{name}_kwargs") == {"use_reentrant": False}
    code = codegen.python_script(cfg)
    for key, value in recipe.sft_kwargs(cfg, "x", cuda=False).items():
        if key != "output_dir":
            assert f"{key}={codegen._py(value)}," in code, key
    assert f"bnb_4bit_compute_dtype={codegen._py(recipe.bnb_kwargs(cfg)['bnb_4bit_compute_dtype'])}," in code


def test_old_name_is_renamed_only_where_the_new_one_exists():
    @dataclasses.dataclass
    class Old:
        gradient_checkpointing: bool = False
        gradient_checkpointing_kwargs: dict | None = None

    @dataclasses.dataclass
    class New(Old):
        activation_checkpointing: bool = False
        activation_checkpointing_kwargs: dict | None = None

    kwargs = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}, "nope": 1}
    assert recipe.installed_names(kwargs, Old) == {"gradient_checkpointing": True,
                                                   "gradient_checkpointing_kwargs": {"use_reentrant": False}}
    assert recipe.installed_names(kwargs, New) == {"activation_checkpointing": True,
                                                   "activation_checkpointing_kwargs": {"use_reentrant": False}}


def test_device_auto_chooses_at_run_time():
    code = codegen.python_script(TrainConfig(device="auto"))
    assert "CUDA = torch.cuda.is_available()" in code
    assert 'device_map={"": 0} if CUDA else "cpu",' in code and "use_cpu=not CUDA," in code
    cpu = codegen.python_script(TrainConfig(device="cpu"))
    assert "CUDA" not in cpu and 'device_map="cpu",' in cpu and "use_cpu=True," in cpu


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


@pytest.mark.parametrize("name, content", [
    ("rows.csv", "instruction,response\nCode?,007\nNumber?,3\nMissing?,None\n"),  # text stays text: "007", "None"
    ("rows.jsonl", '{"instruction": "a", "response": "b"}\n{"instruction": "c", "response": "d"}\n'),
    ("notes.txt", "first line\nsecond line\n"),
])
def test_script_loads_files_as_the_engine_does(name, content, demo_model_path, tmp_path):
    from core import data

    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    cfg = short_run(demo_model_path, tmp_path, dataset=str(path))
    code = codegen.python_script(cfg)
    load = re.search(r"^    dataset = ((?:load_dataset|_sliced)\(.*)$", code, re.M).group(1)
    ns = generated_namespace(cfg)
    assert eval(load, ns).to_list() == data.load_raw(str(path), "train").to_list()
