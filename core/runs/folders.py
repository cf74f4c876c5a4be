"""Run folders: creating them (with memtune's marker), their checkpoints, the final adapter and summary writes.

A run folder `output_dir/NAME/` holds `.memtune.json` (kind "run", written first), config.yaml, events.jsonl,
checkpoints/checkpoint-N/ (a `COMPLETE` file written last), adapter/ (its own marker, kind "adapter") and
summary.json. Only a folder that is memtune's (see `is_memtune_run`) is ever resumed into or deleted.

- `create_run_dir(cfg, config_yaml)`: a fresh, marked folder (or the checked resume folder) with config.yaml written.
- `resume_problem(folder)`: why `resume_from=folder` cannot work (None when it can); checks.validate uses it.
- `resume_point(run_dir)`: the newest usable checkpoint and what was skipped (damaged ones, named).
- `save_adapter(...)`, `finish_run(run_dir, summary)`: atomic writes; a full disk gives a plain message.

Only the marker counts: a folder without `.memtune.json` is never resumed into or deleted, whatever it holds.
Every folder path is resolved by core.files.target before it is checked or written.
"""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from core.levers import variants
from core.messages import Said, words_of
from core.files import (RefusedError, StorageError, atomic_write_text, has_marker, make_tmp, move_into_place,
                        plain_mode, recover, storage_error, storage_message, target, write_marker)
from core.runs.card import base_license, model_card, portable_base

from core.config.settings import TrainConfig
from core.config.slices import DataSlice, ModelSlice, PlaceSlice


class _Folder(ModelSlice, DataSlice, PlaceSlice, Protocol):
    """Where a run goes, and the model and data names a folder must not be made for (source_problems)."""

STOP_FILE = "STOP"  # in a run folder: asks the run to end after its current step and save the adapter
COMPLETE_MARKER = "COMPLETE"  # written last into a checkpoint folder: only these are offered for resume


# --- is it memtune's? ---------------------------------------------------------------------------------------------
def is_memtune_run(path: str | Path) -> bool:
    """Only the run marker counts (an older rule also trusted an events.jsonl naming the folder: anyone can write
    one). A copied `.memtune.json` makes memtune treat a folder as its own: the README says so."""
    path = Path(path)
    return path.is_dir() and has_marker(path, "run")


def planted_link(run_dir: Path) -> Path | None:
    """A link inside a run folder (RUN/adapter, RUN/merged, RUN/gguf, a checkpoint...): memtune makes none, and
    writing through one would replace whatever it points at."""
    for place in (run_dir, run_dir / "checkpoints"):
        try:
            for p in place.iterdir():
                if p.is_symlink():
                    return p
        except OSError:
            continue
    return None


# --- checkpoints -----------------------------------------------------------------------------------------------------
def checkpoint_step(p: Path) -> int:
    """The optimizer step a checkpoint-N folder was saved at (-1 for another name)."""
    tail = p.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoints whose COMPLETE marker exists, oldest first (whether their files are intact: `resume_point`)."""
    found = [p for p in (Path(run_dir) / "checkpoints").glob("checkpoint-*") if (p / COMPLETE_MARKER).is_file()]
    return sorted(found, key=checkpoint_step)


def _safetensors_problem(path: Path) -> str | None:
    """A safetensors file is its 8-byte header length, a JSON header, then exactly the tensors' bytes."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > size:
                return Said("log.ckpt.header_cut")
            header = json.loads(fh.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return Said("log.ckpt.header_unreadable")
    return None if size == 8 + n + end else Said("log.ckpt.size", size=size, promised=8 + n + end)


def checkpoint_problem(ckpt: str | Path) -> Said | None:
    """Why this checkpoint cannot be resumed from (names the file; keyed: log.ckpt_*), or None when its files are
    intact."""
    ckpt = Path(ckpt)
    if not (ckpt / COMPLETE_MARKER).is_file():
        return Said("log.ckpt_incomplete", path=str(ckpt), marker=COMPLETE_MARKER)
    for path in sorted(ckpt.iterdir()):
        if path.suffix == ".safetensors":
            why = _safetensors_problem(path)
        elif path.suffix in (".pt", ".pth", ".bin"):  # torch.save files are zip archives
            why = None if zipfile.is_zipfile(path) else Said("log.ckpt.torch")
        elif path.name == "trainer_state.json":
            try:
                json.loads(path.read_text(encoding="utf-8"))
                why = None
            except (OSError, ValueError):
                why = Said("log.ckpt.json")
        else:
            continue
        if why:
            return Said("log.ckpt_damaged", path=str(path), why=why)
    if not (ckpt / "trainer_state.json").is_file():
        return Said("log.ckpt_no_state", path=str(ckpt))
    return None


def resume_point(run_dir: str | Path) -> tuple[Path | None, list[str]]:
    """(newest checkpoint whose files are intact, [why each newer one was skipped])."""
    skipped = []
    for ckpt in reversed(complete_checkpoints(run_dir)):
        why = checkpoint_problem(ckpt)
        if why is None:
            return ckpt, skipped
        skipped.append(why)
    return None, skipped


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest checkpoint a resume can use (complete and intact), or None."""
    return resume_point(run_dir)[0]


def resume_problem(folder: str | Path) -> str | None:
    """Why `resume_from=folder` is refused (naming the folder and what is missing), or None when it can resume."""
    try:
        path = target(folder, "resume into")
    except RefusedError as exc:
        return str(exc)
    if not path.is_dir():
        return f"{path} is not a folder"
    if not is_memtune_run(path):
        return (f"{path} is not a memtune run folder (no .memtune.json marker): memtune resumes only into folders "
                "it made, and never writes into other folders")
    link = planted_link(path)
    if link is not None:
        return (f"{link} is a link inside the run folder {path}: memtune makes no links there and will not write "
                "through one; remove it")
    ckpt, skipped = resume_point(path)
    if ckpt is None:
        damaged = f" ({'; '.join(skipped)})" if skipped else ""
        return (f"{path} has no complete checkpoint to resume from{damaged}; checkpoints are written when "
                "save_strategy is steps or epoch, so this run can only be started again as a new run")
    return None


# --- creating a run folder -----------------------------------------------------------------------------------------
def new_run_dir(cfg: "PlaceSlice") -> Path:
    """Where a run with these settings would go (nothing is created): the resume folder, or a free name."""
    if cfg.resume_from:
        return target(cfg.resume_from, "resume into")
    root = target(cfg.output_dir, "create a run in")
    name = cfg.run_name or datetime.now().strftime("run-%Y%m%d-%H%M%S")
    run_dir = root / name
    suffix = 1
    while run_dir.exists():  # never write into an earlier run's folder
        suffix += 1
        run_dir = root / f"{name}-{suffix}"
    return run_dir


def create_run_dir(cfg: _Folder, config_yaml: str, prepared: str | Path | None = None) -> Path:
    """Make (or, to resume, check) the run folder, mark it memtune's and write config.yaml into it: `config_yaml`,
    the whole config's text (`TrainConfig.to_yaml()`), which the child reads back.

    `prepared`: a run folder an earlier create_run_dir made for this run (a job manager makes the folder, then
    starts the trainer in a child process that continues in it); it must carry the run marker and hold no
    checkpoint yet. Raises ConfigError (field resume_from / output_dir) naming the folder when it is not
    memtune's, has nothing to resume from, or cannot be created or written; nothing is written in that case.
    """
    from core.config.settings import ConfigError, Problem, source_problems

    if prepared is None and (unusable := source_problems(cfg)):  # a newline in the model id: no folder for it
        raise ConfigError(unusable)
    if prepared is not None and not cfg.resume_from:
        try:
            run_dir = target(prepared, "train into")
        except RefusedError as exc:
            raise ConfigError([Problem.of("output_dir", "problem.run_folder", why=str(exc))]) from None
        if (not has_marker(run_dir, "run") or any((run_dir / "checkpoints").glob("checkpoint-*"))
                or planted_link(run_dir) is not None):
            raise ConfigError([Problem.of("output_dir", "problem.not_fresh", path=run_dir)])
    elif cfg.resume_from:
        why = resume_problem(cfg.resume_from)
        if why:
            raise ConfigError([Problem.of("resume_from", "problem.resume_into", why=why)])
        run_dir = target(cfg.resume_from, "resume into")
        recover(run_dir / "adapter")  # a crash while replacing the adapter last time
    else:
        try:
            root = target(cfg.output_dir, "create a run in")
        except RefusedError as exc:
            raise ConfigError([Problem.of("output_dir", "problem.output_refused", why=str(exc))]) from None
        try:
            root.mkdir(parents=True, exist_ok=True)
            while True:
                run_dir = new_run_dir(cfg.replace(output_dir=str(root)))
                try:
                    run_dir.mkdir()
                    break
                except FileExistsError:  # another process took this name just now
                    continue
            write_marker(run_dir, "run")
        except OSError as exc:
            message = storage_message(exc, root) or f"{root} cannot be created or written ({exc.strerror or exc})"
            raise ConfigError([Problem.of("output_dir", "problem.output_dir", why=message)]) from None
    try:
        atomic_write_text(run_dir / "config.yaml", config_yaml)
    except OSError as exc:
        raise ConfigError([Problem.of("output_dir", "problem.output_full",
                                      why=str(storage_error(exc, run_dir)))]) from None
    return run_dir


# --- the end of a run --------------------------------------------------------------------------------------------
def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def save_adapter(model, tokenizer, config_yaml: str, run_dir: Path, summary: dict[str, Any],
                 state_dict: dict | None = None) -> Path:
    """Write the adapter to a temporary folder, then rename it into place: a crash never leaves half an adapter.

    A full disk raises StorageError ("No space left in RUN_DIR ..."); the previous adapter stays as it was and the
    temporary folder is removed.
    """
    final = target(Path(target(run_dir)) / "adapter", "save the adapter into")  # refuses a planted link
    recover(final)
    try:
        tmp = make_tmp(final, "adapter")
    except OSError as exc:
        raise storage_error(exc, run_dir) from None
    try:
        # peft: adapter_model.safetensors + adapter_config.json (state_dict: gathered from FSDP shards)
        # PiSSA/OLoRA: saved converted to a plain LoRA for the original base (core/levers/variants.py)
        # Only the trained adapter: a DPO/KTO run from init_adapter also holds TRL's frozen "ref" copy of it
        only = {"selected_adapters": ["default"]} if len(getattr(model, "peft_config", {})) > 1 else {}
        with variants.conversion(model) as convert:
            model.save_pretrained(tmp, **convert, **only,
                                  **({"state_dict": state_dict} if state_dict is not None else {}))
        from core.levers import expert_lora  # peft's tuner layer: imported where an adapter is saved

        if expert_lora.has_lora(model):  # LoRA on 4-bit experts: written as peft writes LoRA on 3-D weights
            expert_lora.to_peft_files(model, tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_text(tmp / "memtune.yaml", config_yaml)  # the settings it trained with
        plain_mode(tmp, "*.safetensors")
        cfg = TrainConfig.from_yaml(config_yaml)  # peft's README is a blank template: the run's own card instead
        _portable_base(tmp / "adapter_config.json", cfg.model, final)
        atomic_write_text(tmp / "README.md", model_card(summary, cfg, "adapter", base_license(cfg.model)))
        summary["adapter_bytes"] = dir_size(tmp)
        atomic_write_text(tmp / "summary.json", json.dumps(summary, indent=2))
        return move_into_place(tmp, final)
    except Exception as exc:  # safetensors reports a full disk as its own error type
        error = storage_error(exc, run_dir)
        if error is exc:
            raise
        raise error from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _portable_base(path: Path, model: str, final: Path) -> None:
    """peft names the base by the folder it loaded from, an absolute path of this machine: the Hub id or a path
    relative to the adapter folder instead (core.runs.card.portable_base). memtune itself reads memtune.yaml."""
    if not path.is_file():
        return
    saved = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(saved.get("base_model_name_or_path"), str):
        saved["base_model_name_or_path"] = portable_base(saved["base_model_name_or_path"], model, final)
        atomic_write_text(path, json.dumps(saved, indent=2, sort_keys=True) + "\n")


def tidy_run_dir(run_dir: str | Path) -> None:
    """Remove what an ended run leaves half-written: temp folders and checkpoints whose save never completed."""
    run_dir = target(run_dir, "tidy")
    for name in ("adapter", "merged", "gguf"):
        if not (run_dir / name).is_symlink():  # a planted link is refused by every writer; tidy leaves it alone
            recover(run_dir / name)
    ckpts = run_dir / "checkpoints"
    if ckpts.is_symlink():  # planted: deleting "half-written checkpoints" through it would delete elsewhere
        return
    for path in list(ckpts.glob("checkpoint-*")) + list(ckpts.glob("tmp-checkpoint-*")):
        if path.is_dir() and not path.is_symlink() and not (path / COMPLETE_MARKER).is_file():
            shutil.rmtree(path, ignore_errors=True)


def finish_run(run_dir: str | Path, summary: dict[str, Any]) -> str | None:
    """Tidy the run folder and write summary.json atomically. Never raises: returns a message if it failed."""
    try:
        tidy_run_dir(run_dir)
        atomic_write_text(Path(run_dir) / "summary.json", json.dumps(summary, indent=2))
    except StorageError as exc:
        return str(exc)
    except OSError as exc:
        return Said("log.summary_unwritten", path=str(run_dir), error=str(exc))
    return None


def record_failure(run_dir: str | Path, message: str, error_type: str = "other", emit=None,
                   trace: str | None = None, data: dict[str, Any] | None = None,
                   resolved: dict[str, Any] | None = None, **details: Any) -> dict[str, Any]:
    """The one record of a failed run: the `error` event, a failed summary.json, the `done` event, so the page and
    History show why. Returns the summary.

    Two writers call it: the run itself (core.train.recipe, `emit` its event sink, `trace` the traceback, `data` the row
    plan once there is one), and the supervisor of a process that ended without its own `done` event (killed,
    crashed, a worker died; `emit` None: appended to events.jsonl, and summary.json kept if the run wrote one).
    `resolved` (the run's core.model.resolve.ResolvedRun.as_dict(), once decided) goes into the summary; `details`
    (e.g. exit_code, world_size) go into both the event and the summary."""
    from core.runs.events import JsonlSink, make_event

    run_dir = Path(run_dir)
    # a keyed message (a Said: supervise's death message) carries its key + params, unless details give the error's
    details = {**{k: v for k, v in words_of(message).items() if k != "message"}, **details}
    summary = {"status": "failed", "error_type": error_type, "message": message, **details,
               "finished_at": datetime.now().isoformat(timespec="seconds")}
    if data is not None:
        summary["data"] = data
    if resolved is not None:
        summary["resolved"] = resolved
    own = emit is not None
    emit = emit or JsonlSink(run_dir / "events.jsonl")
    emit(make_event("error", error_type=error_type, message=message, **({"traceback": trace} if own else {}),
                    **details))
    if own or not (run_dir / "summary.json").is_file():
        if (problem := finish_run(run_dir, summary)):  # never a 0-byte summary.json; temp folders removed
            emit(make_event("log", level="warning", **words_of(problem)))
    emit(make_event("done", status="failed", run_dir=str(run_dir), summary=summary, message=message))
    return summary
