"""Taking an adapter elsewhere: a zip of the adapter, a merged full model in bf16, a push to the Hugging Face Hub.

- `zip_adapter(adapter_dir)` zips the adapter folder (safetensors weights + adapter_config.json + tokenizer +
  memtune.yaml). Small: MiBs.
- `merge_adapter(adapter_dir, out_dir)` adds the adapter into its base model's weights (peft's merge_and_unload)
  and saves a plain bf16 transformers model folder that needs neither peft nor memtune. Big: ~2 bytes per
  parameter on disk and in memory, so `merge_memory_check` runs first. Which base weights (`merge_into`):
  - "dequantized" (default for adapters trained on a 4-bit base): the base is loaded in 4 bits with the run's own
    BitsAndBytesConfig (quant type, double quant, bitsandbytes' blocksize) and each 4-bit matrix is dequantized
    (bitsandbytes.functional.dequantize_4bit) before the delta is added: the weights the adapter was trained
    against, so the merged model answers as Try it does.
  - "original": the delta is added to the unrounded bf16 weights. The LoRA delta then meets weights it never saw,
    and answers can differ from Try it; the rounding is not baked in.
- `push_to_hub(folder, repo_id)` uploads a folder with the token from the argument or $HF_TOKEN (never stored,
  never logged, never put into an error message).

The adapter folder, its zip and the merged folder carry the run's model card as README.md (core.runs.card; a zip of an
adapter saved before cards gets one in place of peft's blank template), and their weights the mode of every other
file (safetensors writes 0600).

The same on the command line: `python -m core.export gguf|merge|zip` (core/export/cli.py).

Every folder or zip is written under a temporary name and renamed into place, so a crash or a full disk never
leaves something that looks finished but is not. A merged folder carries memtune's marker (kind "merged"):
Replace deletes only such a folder, after resolving `..` and links, never any other folder typed in.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import struct
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

from core.config.slices import ModelSlice
from core.files import (RefusedError, free_memory, make_tmp, marker, move_into_place, plain_mode, real, recover,
                        require_marker, storage_message, target, write_marker)
from core.messages import HandsOn, Said
from core.runs.card import adapter_card

GiB = 2**30
ZIP_KEEP_S = 3600  # download zips older than this are removed when the next one is made
MERGE_OVERHEAD = 1.15  # loading + merging peaks a little above the bf16 weights (LoRA deltas, buffers)
BF16_BYTES = 2
# merge_adapter's `merge_into`: the weights the LoRA delta is added to (the first is the default for 4-bit runs)
MERGE_TARGETS = ("dequantized", "original")
Progress = Callable[..., Any]  # progress(fraction, message): gr.Progress fits (its 2nd argument is desc)


def size_said(n: float) -> Said:
    """Bytes in the unit that shows the number: "1.5 GiB", "340.2 MiB", "12.0 KiB" (a tiny model's merge needs
    KiBs: "0.0 GiB" said nothing), as a message: a page writes the number and the unit in its language."""
    for unit, scale in ((Said("unit.gib"), GiB), (Said("unit.mib"), 2**20), (Said("unit.kib"), 2**10)):
        if abs(n) >= scale or scale == 2**10:
            return Said("unit.size1", n=n / scale, unit=unit)
    raise AssertionError("unreachable")


def size_text(n: float) -> str:
    """size_said's English: "1.5 GiB"."""
    return str(size_said(n))


class ExportError(HandsOn, RuntimeError):
    """An export could not be done; the message says why and what to do: an `export.err.*` locale key and its
    parameters (core.messages.Keyed), or a message handed on whole (a Said: core.infer.said), so the page says it in
    its language."""


# --- zip -------------------------------------------------------------------------------------------------------
def zip_dir() -> Path:
    """One folder of download zips per user (not one temporary folder per click): each run's zip replaces the last.

    It lives in the system temp folder because Gradio serves downloads from there. A folder of that name that
    memtune did not make (or a link to one) is refused rather than written into.
    """
    path = Path(tempfile.gettempdir()) / f"memtune-zips-{os.getuid()}"
    if path.is_symlink() or (path.exists() and (not path.is_dir() or marker(path) is None)):
        raise ExportError("export.err.zip_dir_foreign", path=str(path))
    if not path.exists():
        path.mkdir(mode=0o700)
        write_marker(path, "export")
    # A marker can be copied: in a shared temp folder only a folder this user owns, that no one else may write to,
    # is the one memtune made (another user could swap or read the zips in it).
    st = path.lstat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        owner = Said("export.owner.other" if st.st_uid != os.getuid() else "export.owner.you")
        raise ExportError("export.err.zip_dir_mode", path=str(path), owner=owner, mode=f"{st.st_mode & 0o777:o}")
    for old in path.glob("*.zip"):  # Gradio has long copied them to its own cache: don't let adapters pile up
        with contextlib.suppress(OSError):
            if time.time() - old.stat().st_mtime > ZIP_KEEP_S:
                old.unlink()
    return path


def _entry(name: str) -> zipfile.ZipInfo:
    """A zip entry unpacked as a plain 0644 file, whatever mode the file had here (safetensors writes 0600)."""
    info = zipfile.ZipInfo(name, time.localtime()[:6])
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (stat.S_IFREG | 0o644) << 16
    return info


def zip_adapter(adapter_dir: str | Path, dest_dir: str | Path | None = None, overwrite: bool = False) -> Path:
    """Zip the adapter folder's files (at the zip's root) into dest_dir/<run>-adapter.zip; return its path.

    dest_dir defaults to `zip_dir()`: repeated zips replace each other instead of piling up temporary folders. In
    a folder the user named, an existing zip of that name is the user's file: refused unless overwrite=True.
    """
    from core.infer import said

    adapter_dir = real(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise ExportError("export.err.not_adapter", path=str(adapter_dir))
    try:
        dest = target(dest_dir, Said("files.action.zip")) if dest_dir else zip_dir()
    except RefusedError as exc:
        raise ExportError(said(exc)) from None
    final = dest / f"{adapter_dir.parent.name or 'memtune'}-adapter.zip"
    if dest_dir and os.path.lexists(final) and not overwrite:
        raise ExportError("export.err.zip_exists", path=str(final))
    if os.path.lexists(final) and not final.is_file():
        raise ExportError("export.err.zip_in_way", path=str(final))
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        dest.mkdir(parents=True, exist_ok=True)
        card = adapter_card(adapter_dir, "adapter")  # an adapter saved before cards gets one in its zip too
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(adapter_dir.rglob("*")):
                if path.is_file() and not path.name.startswith("."):
                    name = path.relative_to(adapter_dir).as_posix()
                    if name == "README.md" and card is not None:
                        zf.writestr(_entry(name), card)
                    else:
                        with path.open("rb") as src, zf.open(_entry(name), "w") as dst:
                            shutil.copyfileobj(src, dst, 2**20)
        os.replace(tmp, final)
    except OSError as exc:
        message = storage_message(exc, dest) or Said("export.err.zip_write", path=str(dest), error=str(exc))
        raise ExportError(said(message)) from None
    finally:
        tmp.unlink(missing_ok=True)
    return final


# --- merge: how big, does it fit --------------------------------------------------------------------------------
def _local_model_dir(cfg: ModelSlice) -> Path | None:
    """The model's folder if it is on this machine (demo, local folder, Hub cache); never downloads."""
    from core.config.settings import DEMO_MODEL

    if cfg.model == DEMO_MODEL:
        from core.demo import ensure_demo_model

        return ensure_demo_model()
    local = Path(cfg.model).expanduser()
    if local.is_dir():
        return local
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(cfg.model, "config.json")
    except Exception:  # not a valid repo id
        return None
    return Path(found).parent if isinstance(found, str) else None


def safetensors_params(folder: Path) -> int:
    """Parameters in a folder's *.safetensors files, from their headers alone (no weights are read)."""
    total = 0
    for path in folder.glob("*.safetensors"):
        with path.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            n = 1
            for dim in info.get("shape", []):
                n *= int(dim)
            total += n
    return total


def parameter_count(cfg: ModelSlice) -> int | None:
    """The base model's parameter count: from its architecture (core.model.shapes), else its safetensors headers."""
    try:
        from core.model.shapes import get_shape

        return int(get_shape(cfg.model).total_params)
    except Exception:  # shapes unknown for this architecture, or core.model.shapes not there
        pass
    folder = _local_model_dir(cfg)
    if folder is not None:
        try:
            return safetensors_params(folder) or None
        except (OSError, ValueError, struct.error):
            return None
    return None


def _cuda_free() -> int | None:
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.mem_get_info()[0])
    except Exception:
        pass
    return None


def _ram_free() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def merge_plan(cfg: ModelSlice) -> dict[str, Any]:
    """Where the merge would run and whether it fits: device (cuda|cpu|None), needed, available, params."""
    params = parameter_count(cfg)
    needed = int(params * BF16_BYTES * MERGE_OVERHEAD) if params else 0
    ram, gpu = _ram_free(), _cuda_free()
    if params is None:
        return dict(device=None, params=None, needed=0, available=ram, gpu_free=gpu, ram_free=ram)
    # A GPU merges much faster; the CPU is fine too (one pass over the weights). Prefer what fits.
    if cfg.device != "cpu" and gpu is not None and gpu >= needed:
        device, available = "cuda", gpu
    elif ram >= needed:
        device, available = "cpu", ram
    else:
        device, available = None, max(ram, gpu or 0)
    return dict(device=device, params=params, needed=needed, available=available, gpu_free=gpu, ram_free=ram)


def merge_memory_check(cfg: ModelSlice) -> tuple[int, int, bool, Said]:
    """(needed_bytes, available_bytes, ok, message) for merging an adapter of `cfg` into its bf16 base."""
    plan = merge_plan(cfg)
    needed, available = plan["needed"], plan["available"]
    if plan["params"] is None:
        return 0, available, False, Said("export.check.unknown", model=cfg.model)
    if plan["device"] is None:
        where = (Said("export.where.ram", ram=size_said(plan["ram_free"])) if plan["gpu_free"] is None else
                 Said("export.where.ram_gpu", ram=size_said(plan["ram_free"]), gpu=size_said(plan["gpu_free"])))
        return needed, available, False, Said("export.check.too_big", size=size_said(needed), model=cfg.model,
                                              where=where)
    where = Said("export.mem.gpu" if plan["device"] == "cuda" else "export.mem.ram")
    return needed, available, True, Said("export.check.ok", size=size_said(needed), where=where,
                                         free=size_said(available))


def merge_size(cfg: ModelSlice) -> tuple[int, int, int] | None:
    """What a merge costs: (parameters, bytes on disk in bf16, bytes of RAM or GPU memory to merge), or None when
    the model's size cannot be told here. The page words it (ui.tryexport.merge_warning)."""
    params = parameter_count(cfg)
    if params is None:
        return None
    disk = params * BF16_BYTES
    return params, disk, int(disk * MERGE_OVERHEAD)


def default_merge_dir(adapter_dir: str | Path) -> Path:
    """run_dir/merged: next to the adapter it came from."""
    return real(adapter_dir).parent / "merged"


# --- merge ---------------------------------------------------------------------------------------------------------
def merge_destination(adapter_dir: str | Path, out_dir: str | Path | None = None, overwrite: bool = False) -> Path:
    """The folder a merge of `adapter_dir` writes (out_dir, by default run_dir/merged), resolved once
    (core.files.target: every check and the final rename act on this same folder), after tidying what a crashed
    merge into it left; ExportError when it may not be written. The page asks this before it starts the merge's
    child (a refusal costs no process start), and merge_adapter again in the child."""
    from core.infer import said

    adapter_dir = real(adapter_dir)
    try:
        out = target(out_dir or default_merge_dir(adapter_dir), Said("files.action.merged"))
    except RefusedError as exc:
        raise ExportError(said(exc)) from None
    recover(out)  # an earlier merge into `out` that crashed half-way
    if out.exists() and not out.is_dir():
        raise ExportError("export.err.merge_is_file", path=str(out))
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ExportError("export.err.not_empty", path=str(out))
        try:  # Replace deletes the folder: only ever a merged model memtune wrote
            require_marker(out, "merged", Said("files.action.replace"))
        except RefusedError as exc:
            raise ExportError(said(exc)) from None
    if out == adapter_dir or out in adapter_dir.parents:
        raise ExportError("export.err.merge_holds_adapter", path=str(out))
    return out


def merge_target(cfg: ModelSlice, merge_into: str | None = None) -> str:
    """The weights a merge adds the delta to: `merge_into` if given, else "dequantized" for a 4-bit run; an adapter
    trained on an unquantized base has only its original weights."""
    if merge_into is not None and merge_into not in MERGE_TARGETS:
        raise ExportError("export.err.merge_into", value=repr(merge_into), first=MERGE_TARGETS[0],
                          second=MERGE_TARGETS[1])
    if not cfg.load_in_4bit:
        return "original"
    return merge_into or "dequantized"


def dequantize_4bit_linears(model) -> list[dict[str, Any]]:
    """Replace every bitsandbytes Linear4bit of `model` by a plain nn.Linear holding its dequantized weight
    (bitsandbytes.functional.dequantize_4bit with the layer's own quant state: quant type, blocksize, nested
    absmax); return the distinct quantization settings met, for the merge's record."""
    import bitsandbytes as bnb
    import torch

    seen: dict[tuple, dict[str, Any]] = {}
    for name, module in list(model.named_modules()):
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        state = module.weight.quant_state
        weight = bnb.functional.dequantize_4bit(module.weight.data, state).to(state.dtype)
        linear = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                                 device="meta")
        linear.weight = torch.nn.Parameter(weight, requires_grad=False)
        if module.bias is not None:
            linear.bias = torch.nn.Parameter(module.bias.data, requires_grad=False)
        model.set_submodule(name, linear)
        key = (state.quant_type, int(state.blocksize), bool(state.nested))
        seen.setdefault(key, dict(quant_type=key[0], blocksize=key[1], double_quant=key[2]))
    if not seen:
        raise ExportError("export.err.no_4bit")
    if getattr(model, "hf_quantizer", None) is not None:  # a plain model now: save_pretrained writes no bnb config
        model.hf_quantizer = None
    for attr in ("is_quantized", "is_loaded_in_4bit"):
        if hasattr(model, attr):
            with contextlib.suppress(AttributeError):
                setattr(model, attr, False)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    return list(seen.values())


def merge_adapter(adapter_dir: str | Path, out_dir: str | Path | None = None, progress: Progress | None = None,
                  overwrite: bool = False, merge_into: str | None = None, trust_remote_code: bool = False) -> Path:
    """Merge the adapter into its base model's weights and save the result (bf16) into `out_dir`.

    merge_into: "dequantized" (default for a 4-bit run: the NF4-rounded weights it trained against) or "original"
    (the unrounded weights); see the module docstring. out_dir defaults to run_dir/merged. An existing out_dir is
    refused unless overwrite=True. Returns out_dir.
    trust_remote_code: the user's confirmation; an adapter whose settings ask for it is refused without it.
    Runs in the caller's process (the app's): a one-off load-merge-save with no optimizer or patched modules, and
    its memory is freed at the end (free_memory).
    """
    from core.infer import InferError, adapter_config, base_for, load_problem, said
    from core.model.load import ModelError, load_model, load_tokenizer

    adapter_dir = real(adapter_dir)
    out = merge_destination(adapter_dir, out_dir, overwrite)

    def step(fraction: float, message: Said) -> None:
        if progress is not None:
            progress(fraction, message)

    try:
        cfg = adapter_config(adapter_dir, trust_remote_code=trust_remote_code)
    except InferError as exc:
        raise ExportError(said(exc)) from None
    into = merge_target(cfg, merge_into)
    needed, _, ok, message = merge_memory_check(cfg)
    if not ok:
        raise ExportError(said(message))
    out.parent.mkdir(parents=True, exist_ok=True)
    disk_needed = int(needed / MERGE_OVERHEAD)
    free_disk = shutil.disk_usage(out.parent).free
    if free_disk < disk_needed * 1.05:
        raise ExportError("export.err.merge_disk", size=size_said(disk_needed), path=str(out.parent),
                          free=size_said(free_disk))

    device = merge_plan(cfg)["device"]
    # bf16 on the device that fits; no fp32 upcast: the merged weights are saved in bf16. "dequantized" loads in 4
    # bits with the run's own quantization settings (one process, one device: no FSDP storage, no offload).
    mcfg = cfg.replace(load_in_4bit=into == "dequantized", precision="bf16", upcast_to_fp32=False,
                       device=device or "cpu", offload_embeddings=False, num_gpus="1", distributed_strategy="auto")
    try:
        tmp = make_tmp(out, "merged")  # marked first: a crash leaves a folder the next start may remove
    except RefusedError as exc:
        raise ExportError(said(exc)) from None
    model = None
    try:
        quant: list[dict[str, Any]] = []
        path = base_for(adapter_dir, mcfg)  # the adapter's modules checked against the model's, before it loads
        if into == "dequantized":
            step(0.02, Said("export.step.load_4bit", model=cfg.model, quant=cfg.bnb_4bit_quant_type))
            model = load_model(mcfg, path)
            step(0.35, Said("export.step.dequantize"))
            quant = dequantize_4bit_linears(model)
            from core.levers.experts import dequantize_experts

            dequantize_experts(model)  # MoE: the 4-bit experts too (core/levers/experts.py)
        else:
            step(0.02, Said("export.step.load_bf16", model=cfg.model))
            model = load_model(mcfg, path)
        step(0.45, Said("export.step.adapter"))
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
        step(0.55, Said("export.step.merge"))
        model = model.merge_and_unload()
        model.config.use_cache = True  # load_model turned it off for training; a shipped model wants it on
        step(0.65, Said("export.step.save", path=str(out)))
        model.save_pretrained(tmp)
        tok_src = str(adapter_dir) if (adapter_dir / "tokenizer_config.json").is_file() else path
        load_tokenizer(cfg, tok_src).save_pretrained(tmp)
        plain_mode(tmp, "*.safetensors")
        if (card := adapter_card(adapter_dir, "merged")) is not None:
            (tmp / "README.md").write_text(card, encoding="utf-8")
        # the adapter as seen from the merged folder: a record that travels with the folder names no absolute path
        (tmp / "memtune-merge.json").write_text(json.dumps({
            "base_model": cfg.model, "adapter": Path(os.path.relpath(adapter_dir, out)).as_posix(), "dtype": "bfloat16",
            "merged_into": into, "quantization": quant,
            "note": ("LoRA adapter merged into the dequantized 4-bit base weights it was trained against"
                     if into == "dequantized" else "LoRA adapter merged into the original (unquantized) base")
            + "; load with AutoModelForCausalLM.from_pretrained",
        }, indent=2), encoding="utf-8")
        move_into_place(tmp, out)
        step(1.0, Said("export.step.saved", path=str(out)))
        return out
    except (ModelError, InferError) as exc:
        raise ExportError(said(exc)) from None
    except Exception as exc:
        import torch

        message = storage_message(exc, out.parent)
        if message:  # disk full while saving: the temporary folder goes (finally), an earlier merge stays
            raise ExportError(said(message)) from None

        if isinstance(exc, torch.OutOfMemoryError) or isinstance(exc, MemoryError):
            raise ExportError("export.err.merge_oom") from None
        if (problem := load_problem(exc, adapter_dir)) is not None:
            raise ExportError(said(problem)) from None
        raise
    finally:
        model = None
        shutil.rmtree(tmp, ignore_errors=True)
        free_memory()


# --- push to the Hub -------------------------------------------------------------------------------------------------
def _offline() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except ImportError:
        return False


def _scrub(text: str, token: str) -> str:
    return text.replace(token, "hf_***") if token else text


def push_to_hub(folder: str | Path, repo_id: str, token: str | None = None, private: bool = True) -> str:
    """Upload `folder` (an adapter or a merged model) to the model repo `repo_id`; return the repo's URL.

    The token comes from the argument or $HF_TOKEN; it is passed to huggingface_hub only and never stored.
    """
    from core.model.load import hf_token

    folder = Path(folder)
    if not folder.is_dir() or not ((folder / "config.json").is_file() or (folder / "adapter_config.json").is_file()):
        raise ExportError("export.err.push_folder", path=str(folder))
    repo_id = (repo_id or "").strip()
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(repo_id)
        if repo_id.count("/") != 1:
            raise ValueError(repo_id)
    except Exception:
        raise ExportError("export.err.repo_id", repo=repr(repo_id)) from None
    token = (token or "").strip() or hf_token()
    if not token:
        raise ExportError("export.err.no_token")
    if _offline():
        raise ExportError("export.err.offline")
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                          commit_message="Upload from memtune", ignore_patterns=[".*", "*.tmp"])
    except Exception as exc:  # every failure becomes one message, with the token scrubbed from it
        raise _push_error(exc, repo_id, token) from None
    return str(url)


def _push_error(exc: Exception, repo_id: str, token: str) -> ExportError:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    name = type(exc).__name__
    if status == 401:
        return ExportError("export.err.push_401")
    if status == 403:
        return ExportError("export.err.push_403", repo=repo_id)
    if name in ("OfflineModeIsEnabled",) or isinstance(exc, (ConnectionError, TimeoutError)) or any(
            k in name for k in ("Connect", "Timeout", "NameResolution")):
        return ExportError("export.err.push_network")
    return ExportError("export.err.push_failed", repo=repo_id, error=_scrub(f"{name}: {exc}", token))
