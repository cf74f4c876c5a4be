"""The configuration object: defaults are the chapter's recipe, YAML round-trips, validation reports everything."""

import pytest

from core.checks import validate
from core.config.settings import ConfigError, Hardware, TrainConfig, apply_overrides, demo_config

GPU = Hardware(cuda=True, bf16=True, bitsandbytes=True, liger=True)
OLD_GPU = Hardware(cuda=True, bf16=False, bitsandbytes=True)
CPU = Hardware(cuda=False, bf16=True, bitsandbytes=True)


def test_defaults_are_the_chapter_recipe():
    c = TrainConfig()
    assert c.model == "meta-llama/Llama-3.1-8B"
    assert (c.load_in_4bit, c.bnb_4bit_quant_type, c.bnb_4bit_use_double_quant, c.precision) == (True, "nf4", True, "bf16")
    assert (c.lora_r, c.lora_alpha, c.lora_dropout) == (16, 32, 0.05)
    assert c.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert (c.dataset, c.dataset_split) == ("databricks/databricks-dolly-15k", "train[:1000]")
    assert (c.num_train_epochs, c.per_device_train_batch_size, c.gradient_accumulation_steps) == (1.0, 1, 16)
    assert (c.learning_rate, c.optim, c.gradient_checkpointing, c.max_length) == (2e-4, "paged_adamw_8bit", True, 512)
    assert (c.logging_steps, c.save_strategy) == (10, "epoch")
    assert c.upcast_to_fp32 is True  # the chapter calls prepare_model_for_kbit_training
    assert validate(c, GPU) == []


def test_yaml_round_trip_is_exact(tmp_path):
    c = TrainConfig(lora_r=64, learning_rate=3.5e-5, lora_target_modules=["q_proj", "down_proj"],
                    num_train_epochs=2.5, run_name="my-run_1", dataset="data/my file.jsonl")
    assert TrainConfig.from_yaml(c.to_yaml()) == c
    path = c.save(tmp_path / "x" / "c.yaml")
    assert TrainConfig.load(path) == c
    assert TrainConfig.from_yaml(TrainConfig().to_yaml()) == TrainConfig()


def test_validation_reports_every_problem_at_once():
    c = TrainConfig(learning_rate=5.0, lora_r=0, optim="adam_of_my_dreams", max_length=4,
                    lora_target_modules=["q_proj", "w q"], run_name="bad name!", precision="fp8")
    problems = validate(c, GPU)
    fields = {p.field for p in problems}
    assert {"learning_rate", "lora_r", "optim", "max_length", "lora_target_modules", "run_name", "precision"} <= fields
    with pytest.raises(ConfigError) as err:
        from core.checks import check
        check(c, GPU)
    text = str(err.value)
    assert "7 problem" in text or f"{len(problems)} problem" in text
    assert "optim: 'adam_of_my_dreams' is not one of the choices -> pick one of: paged_adamw_8bit" in text
    assert "learning_rate: 5.0 is above the maximum 1.0 -> use a value <= 1.0" in text


def test_hardware_dependent_problems():
    assert [p.field for p in validate(TrainConfig(), OLD_GPU)] == ["precision"]
    assert "fp16" in validate(TrainConfig(), OLD_GPU)[0].fix
    no_bnb = Hardware(cuda=True, bf16=True, bitsandbytes=False)
    fields = [p.field for p in validate(TrainConfig(), no_bnb)]
    assert fields == ["load_in_4bit"]
    assert [p.field for p in validate(TrainConfig(device="cuda"), CPU)] == ["device"]
    assert [p.field for p in validate(TrainConfig(use_liger_kernel=True), CPU)] == ["use_liger_kernel"]
    assert [p.field for p in validate(TrainConfig(precision="fp16"), CPU)] == ["precision"]
    assert validate(demo_config(), CPU) == []


def test_overrides_coerce_and_report_all_errors():
    c = apply_overrides(TrainConfig(), ["lora_r=8", "learning_rate=1e-4", "gradient_checkpointing=false",
                                        "lora_target_modules=q_proj,v_proj", "run_name=abc"])
    assert (c.lora_r, c.learning_rate, c.gradient_checkpointing) == (8, 1e-4, False)
    assert c.lora_target_modules == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError) as err:
        apply_overrides(TrainConfig(), ["lora_r=eight", "nonsense=1", "noequals", "packing=maybe"])
    fields = [p.field for p in err.value.problems]
    assert fields == ["lora_r", "nonsense", "noequals", "packing"]


def test_bad_yaml_and_unknown_keys(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        TrainConfig.from_yaml("model: [unclosed")
    with pytest.raises(ConfigError, match="lora_rank: is not a memtune setting"):
        TrainConfig.from_yaml("lora_rank: 8\n")
    with pytest.raises(ConfigError, match="does not exist"):
        TrainConfig.load(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="lora_r: 'x' is not a whole number"):
        TrainConfig.from_yaml("lora_r: x\n")


def test_nan_seeds_and_folders_are_checked(tmp_path):
    problems = validate(TrainConfig(learning_rate=float("nan"), weight_decay=float("inf"), seed=2**32), GPU)
    assert [p.field for p in problems] == ["weight_decay", "learning_rate", "seed"] or \
        {p.field for p in problems} == {"weight_decay", "learning_rate", "seed"}
    assert validate(TrainConfig(seed=2**32 - 1), GPU) == []
    c = apply_overrides(TrainConfig(), ["learning_rate=nan"])
    assert [p.field for p in validate(c, GPU)] == ["learning_rate"]
    assert [p.field for p in validate(TrainConfig(output_dir="/proc/self"), GPU)] == ["output_dir"]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "config.yaml").write_text("x")
    resume = validate(TrainConfig(resume_from=str(tmp_path / "notes")), GPU)
    assert [p.field for p in resume] == ["resume_from"] and "not a memtune run folder" in resume[0].message


def test_saving_a_config_never_leaves_a_half_file(tmp_path):
    path = TrainConfig().save(tmp_path / "c.yaml")
    assert TrainConfig.load(path) == TrainConfig() and sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]
