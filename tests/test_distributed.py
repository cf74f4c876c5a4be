"""Past one GPU: validation and launch plans (pure), then real multi-process runs of the demo on the CPU (gloo)."""

from __future__ import annotations

import pytest

from core import distributed
from core.config import Hardware, TrainConfig, validate

CPU = Hardware(cuda=False, bf16=True, bitsandbytes=True)
TWO_GPUS = Hardware(cuda=True, bf16=True, bitsandbytes=True, gpus=2)


def fields(problems) -> set[str]:
    return {p.field for p in problems}


def test_one_gpu_is_the_default_and_needs_no_launcher():
    cfg = TrainConfig()
    assert cfg.num_gpus == "1" and not distributed.plan(cfg, n_gpus=2).distributed
    assert distributed.launch_command_text(cfg, n_gpus=2) == ""


def test_impossible_multi_gpu_settings_name_the_field_and_the_fix():
    bad = TrainConfig(num_gpus="4", num_machines=2, machine_rank=2, main_process_ip="", main_process_port=80)
    problems = validate(bad, TWO_GPUS)
    assert {"num_gpus", "machine_rank", "main_process_ip", "main_process_port"} <= fields(problems)
    text = "\n".join(str(p) for p in problems)
    assert "4 GPUs asked for but this machine shows 2" in text and "num_gpus: 2 or all" in text
    assert "outside 0..1" in text
    assert fields(validate(TrainConfig(num_gpus="two"), TWO_GPUS)) >= {"num_gpus"}
    assert fields(validate(TrainConfig(num_gpus="0"), TWO_GPUS)) >= {"num_gpus"}
    assert "distributed_strategy" in fields(validate(TrainConfig(distributed_strategy="zero3"), TWO_GPUS))


def test_fsdp_refuses_what_it_cannot_combine_with():
    cfg = TrainConfig(num_gpus="2", distributed_strategy="fsdp", offload_embeddings=True, optim="adamw_torch")
    assert "offload_embeddings" in fields(validate(cfg, TWO_GPUS))
    cpu = TrainConfig(num_gpus="2", distributed_strategy="fsdp", device="cpu", optim="adamw_torch")
    problems = [p for p in validate(cpu, CPU) if p.field == "distributed_strategy"]
    assert problems and "needs CUDA" in problems[0].message
    ok = TrainConfig(num_gpus="all", distributed_strategy="fsdp", optim="adamw_torch")
    assert not [p for p in validate(ok, TWO_GPUS) if p.field in ("num_gpus", "distributed_strategy")]


def test_auto_picks_ddp_when_the_model_fits_one_gpu_and_fsdp_otherwise_and_says_why():
    cfg = TrainConfig(num_gpus="all")
    fits = distributed.plan(cfg, n_gpus=2, fits_one_gpu=True)
    assert (fits.strategy, fits.world_size) == ("ddp", 2) and "fits one GPU" in fits.reason
    big = distributed.plan(cfg, n_gpus=2, fits_one_gpu=False)
    assert big.strategy == "fsdp" and "does not fit one GPU" in big.reason


def test_quant_storage_matches_the_compute_dtype_only_for_fsdp():
    cfg = TrainConfig(num_gpus="2", distributed_strategy="fsdp")
    assert distributed.quant_storage(cfg, distributed.plan(cfg, n_gpus=2)) == "bfloat16"
    ddp = cfg.replace(distributed_strategy="ddp")
    assert distributed.quant_storage(ddp, distributed.plan(ddp, n_gpus=2)) is None


def test_the_equivalent_accelerate_command_and_config_are_shown():
    cfg = TrainConfig(num_gpus="2", num_machines=2, machine_rank=0, main_process_ip="10.0.0.1",
                      main_process_port=29555, distributed_strategy="ddp")
    text = distributed.launch_command_text(cfg, "my.yaml", n_gpus=2)
    assert text.startswith("accelerate launch --num_processes 4 --num_machines 2 --machine_rank 0")
    assert "--main_process_ip 10.0.0.1 --main_process_port 29555" in text and "-m core.train --config my.yaml" in text
    conf = distributed.accelerate_config(distributed.plan(cfg, n_gpus=2), cfg)
    assert conf["distributed_type"] == "MULTI_GPU" and conf["num_processes"] == 4
    fsdp = cfg.replace(distributed_strategy="fsdp", num_machines=1)
    conf = distributed.accelerate_config(distributed.plan(fsdp, n_gpus=2), fsdp)
    assert conf["distributed_type"] == "FSDP" and conf["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] is True
