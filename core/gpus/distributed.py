"""Past one GPU: data-parallel (DDP) and FSDP-QLoRA through Hugging Face accelerate, from the same TrainConfig.

memtune launches no processes between GPUs and writes no collective code of its own. When a config asks for
more than one process, `python -m core.train` runs itself again through `accelerate launch` (core/jobs/launcher.py
starts and watches it; accelerate uses torch.distributed.run); each worker is an ordinary `core.train.recipe` process that
reads its rank from the environment torchrun sets, and the Trainer (through accelerate) wraps the model in DDP or FSDP.

- ddp: every GPU holds the whole 4-bit model; the data is split; LoRA gradients are averaged.
- fsdp: the 4-bit model is sharded across GPUs (FSDP-QLoRA: `bnb_4bit_quant_storage` equal to the compute dtype
  so the packed 4-bit weights can be flattened with the rest; peft's wrap policy so LoRA layers shard on their own).
- auto: ddp when the model fits one GPU, fsdp otherwise; `plan()` says which and why.

Several machines: every machine runs the same command with the same config, changing only `machine_rank`.
Only global rank 0 writes the run folder (events, checkpoints' COMPLETE markers, adapter, summary).
On a CPU-only machine `num_gpus` counts CPU processes (gloo backend): that is how the tests run it.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from core.messages import Said

MAX_MACHINES = 1024


@dataclass(frozen=True)
class Plan:
    """How many processes run where, and with which strategy."""

    processes_per_machine: int
    num_machines: int
    machine_rank: int
    strategy: str  # single | ddp | fsdp
    reason: str
    cpu: bool
    main_process_ip: str
    main_process_port: int

    @property
    def world_size(self) -> int:
        return self.processes_per_machine * self.num_machines

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def visible_gpus() -> int:
    """CUDA GPUs this process can use: torch's count where torch is loaded (the training child), else NVML's, so the
    web server counts them without importing torch."""
    if "torch" not in sys.modules:
        return nvml_gpu_count()
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver counts as no GPU; validation then says so
        return 0


def nvml_gpu_count() -> int:
    """Visible GPUs without initialising CUDA (NVML, CUDA_VISIBLE_DEVICES applied as CUDA reads it); 0 without NVML."""
    from core.nvml import cards

    return len(cards())


def pin_one_gpu(cfg) -> str | None:
    """A one-process run on a machine with several GPUs uses one of them: call before CUDA is initialised.

    Otherwise the Trainer wraps the model in nn.DataParallel over every visible GPU, which SFTTrainer refuses (and
    which would be slower than one GPU for QLoRA). Returns the device it pinned, or None when nothing was needed.
    """
    single = str(cfg.num_gpus).strip() == "1" and cfg.num_machines <= 1
    if not single or in_worker() or cfg.device == "cpu" or "CUDA_VISIBLE_DEVICES" in os.environ:
        return None
    if nvml_gpu_count() <= 1:
        return None
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    return "0"


def runs_on_cpu(cfg, n_gpus: int) -> bool:
    return cfg.device == "cpu" or (cfg.device == "auto" and n_gpus == 0)


def processes_per_machine(cfg, n_gpus: int) -> int | None:
    """The number of worker processes on this machine, or None when `num_gpus` is not understood."""
    value = str(cfg.num_gpus).strip().lower()
    if value == "all":
        return max(1, n_gpus) if not runs_on_cpu(cfg, n_gpus) else 1
    try:
        n = int(value)
    except ValueError:
        return None
    return n if n >= 1 else None


def plan(cfg, n_gpus: int | None = None, fits_one_gpu: bool | None = None) -> Plan:
    """Resolve the config's multi-GPU fields against this machine (call `problems()` first)."""
    n_gpus = visible_gpus() if n_gpus is None else n_gpus
    per_machine = processes_per_machine(cfg, n_gpus) or 1
    world = per_machine * max(1, cfg.num_machines)
    strategy, reason = "single", Said("log.reason.single")
    if world > 1:
        if cfg.distributed_strategy in ("ddp", "fsdp"):
            strategy, reason = cfg.distributed_strategy, Said("log.reason.configured", strategy=cfg.distributed_strategy)
        elif fits_one_gpu is False:
            strategy, reason = "fsdp", Said("log.reason.fsdp")
        elif fits_one_gpu is True:
            strategy, reason = "ddp", Said("log.reason.ddp")
        elif runs_on_cpu(cfg, n_gpus):
            strategy, reason = "ddp", Said("log.reason.ddp_cpu")
        else:
            strategy, reason = "ddp", Said("log.reason.ddp_unknown")
    return Plan(per_machine, max(1, cfg.num_machines), cfg.machine_rank, strategy, reason,
                runs_on_cpu(cfg, n_gpus), cfg.main_process_ip or "127.0.0.1", cfg.main_process_port)


def problems(cfg, n_gpus: int | None = None) -> list[tuple[str, str, str]]:
    """(field, what is wrong, how to fix) for multi-GPU settings that cannot work; checks.validate adds them."""
    n_gpus = visible_gpus() if n_gpus is None else n_gpus
    out: list[tuple[str, str, str]] = []
    per_machine = processes_per_machine(cfg, n_gpus)
    cpu = runs_on_cpu(cfg, n_gpus)
    if per_machine is None:
        out.append(("num_gpus", f"{cfg.num_gpus!r} is not a number of GPUs", "write a whole number >= 1, or all"))
        return out
    if not cpu and per_machine > max(1, n_gpus):  # no GPU at all is the `device` field's problem
        out.append(("num_gpus", f"{per_machine} GPUs asked for but this machine shows {n_gpus}",
                    f"use num_gpus: {max(1, n_gpus)} or all"))
    if cpu and per_machine > (os.cpu_count() or 1):
        out.append(("num_gpus", f"{per_machine} CPU processes asked for but this machine has {os.cpu_count()} cores",
                    "use fewer processes (on a CPU num_gpus counts processes, for testing)"))
    if not 1 <= cfg.num_machines <= MAX_MACHINES:
        out.append(("num_machines", f"{cfg.num_machines} is not a number of machines", "use 1 or more"))
    elif not 0 <= cfg.machine_rank < cfg.num_machines:
        out.append(("machine_rank", f"{cfg.machine_rank} is outside 0..{cfg.num_machines - 1}",
                    "give this machine's rank: 0 on the main machine, then 1, 2, ..."))
    if cfg.num_machines > 1 and not cfg.main_process_ip.strip():
        out.append(("main_process_ip", "is empty, but several machines must find the main one",
                    "give the main machine's address as the other machines reach it"))
    if not 1024 <= cfg.main_process_port <= 65535:
        out.append(("main_process_port", f"{cfg.main_process_port} is not a usable port", "use a free port in 1024-65535"))
    world = per_machine * max(1, cfg.num_machines)
    if cfg.distributed_strategy == "fsdp" and world > 1:
        if cpu:
            out.append(("distributed_strategy", "fsdp shards the model across GPUs and needs CUDA",
                        "use ddp on the CPU, or run on GPUs"))
        if cfg.offload_embeddings:
            out.append(("offload_embeddings", "cannot be combined with fsdp (FSDP shards the embedding itself)",
                        "turn offload_embeddings off"))
        if cfg.load_in_4bit and cfg.upcast_to_fp32:  # FSDP flattens each layer into one tensor of one dtype
            out.append(("upcast_to_fp32", "cannot be combined with fsdp: it makes the norms float32 next to the "
                        "4-bit weights FSDP stores in the compute dtype, and FSDP shards each layer as one dtype",
                        "turn upcast_to_fp32 off (the lowest_memory and fastest presets do)"))
    if cfg.resume_from and world > 1 and cfg.distributed_strategy == "fsdp":
        out.append(("resume_from", "memtune does not resume sharded (fsdp) checkpoints yet", "start a new run, or use ddp"))
    return out


# --- inside a worker --------------------------------------------------------------------------------------------
def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def in_worker() -> bool:
    """True in a process that torchrun (accelerate launch) started: it must not launch again."""
    return "LOCAL_RANK" in os.environ and world_size() > 1


def is_main() -> bool:
    """Global rank 0: the only process that writes the run folder."""
    return rank() == 0


def any_rank(flag: bool) -> bool:
    """True on every rank when it is True on any (a Stop seen by one rank ends all at the same step)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def gather(value: Any) -> list[Any]:
    """Every rank's value, in rank order (per-GPU peaks for the summary); [value] outside a distributed run."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


# --- library arguments --------------------------------------------------------------------------------------------
def quant_storage(cfg, p: Plan) -> str | None:
    """FSDP flattens parameters of one dtype: store the packed 4-bit weights in the compute dtype's width."""
    if p.strategy != "fsdp" or not cfg.load_in_4bit:
        return None
    return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[cfg.precision]


def accelerate_flags(p: Plan, cfg) -> list[str]:
    """`accelerate launch` flags for a plan: the same whether memtune launches or the user copies the command."""
    flags = ["--num_processes", str(p.world_size), "--num_machines", str(p.num_machines),
             "--machine_rank", str(p.machine_rank), "--main_process_ip", p.main_process_ip,
             "--main_process_port", str(p.main_process_port),
             "--mixed_precision", "no",  # the Trainer sets bf16/fp16 itself from the config
             "--dynamo_backend", "no"]
    if p.strategy == "fsdp":
        flags += ["--use_fsdp", "--fsdp_version", "1", "--fsdp_sharding_strategy", "FULL_SHARD",
                  "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
                  "--fsdp_backward_prefetch", "BACKWARD_PRE",
                  "--fsdp_state_dict_type", "SHARDED_STATE_DICT",
                  "--fsdp_offload_params", "false",
                  # rank 0 reads the weights, the others start empty and receive them: 1x, not Nx, CPU memory
                  "--fsdp_cpu_ram_efficient_loading", "true", "--fsdp_sync_module_states", "true",
                  "--fsdp_use_orig_params", "false"]
    else:
        flags += ["--multi_gpu"]  # torchrun launcher; on a CPU-only machine the workers use gloo
    return flags


def worker_argv(p: Plan, cfg, config_path: str, extra: list[str] | None = None) -> list[str]:
    """The command that starts this machine's workers: accelerate launch ... -m core.train --config F."""
    return [sys.executable, "-m", "accelerate.commands.launch", *accelerate_flags(p, cfg),
            "-m", "core.train", "--config", str(config_path), *(extra or [])]


def launch_command_text(cfg, config_path: str = "my.yaml", n_gpus: int | None = None) -> str:
    """What a user would type (shown by --dump-config and Show code); empty for a one-process run."""
    p = plan(cfg, n_gpus)
    if not p.distributed:
        return ""
    flags = " ".join(shlex.quote(f) for f in accelerate_flags(p, cfg))
    lines = [f"accelerate launch {flags} -m core.train --config {shlex.quote(config_path)}"]
    if p.num_machines > 1:
        lines.append(f"# on every machine, with --machine_rank 0..{p.num_machines - 1} "
                     f"(or: python -m core.train --config {config_path} --set machine_rank=R)")
    return "\n".join(lines)


def fsdp_wrap_policy(trainer) -> None:
    """FSDP-QLoRA: wrap LoRA layers on their own so frozen 4-bit and trainable weights are never one flat tensor."""
    plugin = getattr(getattr(trainer.accelerator, "state", None), "fsdp_plugin", None)
    if plugin is None:
        return
    from peft.utils.other import fsdp_auto_wrap_policy

    plugin.auto_wrap_policy = fsdp_auto_wrap_policy(trainer.model)
