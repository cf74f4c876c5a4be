"""The GGUF export as users run it (Export tab, `python -m core.export gguf`): plan (RAM and disk, said before
anything starts), merge the adapter into its base (core.export.merge_adapter), convert to each chosen format
(core.gguf), write an Ollama Modelfile and a README with the exact commands, rename the folder into place.

Layout of the result (default: the run's folder/gguf):
    <name>-f16.gguf, <name>-q8_0.gguf, ...   one file per format
    Modelfile                                 Ollama: FROM the smallest file, TEMPLATE, stop tokens
    README.md                                 ollama create / ollama run / llama-cli commands
    .memtune.json                             memtune's marker (kind export): formats, files, source
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.gguf import (FORMATS, GiB, MiB, GGUFError, Progress, architecture, file_bytes, parse_formats,
                       read_config, tensor_plan, tokenizer_metadata, write_gguf)

DEMO_PROMPT = "Translate the word 'cat' into French."
# Ollama Go templates for the chat templates we recognise (Ollama cannot run Jinja), with their stop strings.
OLLAMA_TEMPLATES = {
    "<|start_header_id|>": (
        "{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
        "{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}<|eot_id|>{{ end }}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}<|eot_id|>",
        ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
    "<|im_start|>": (
        "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
        "{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
        "{{ .Response }}<|im_end|>\n",
        ["<|im_start|>", "<|im_end|>"]),
    "[INST]": ("[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }} [/INST]{{ .Response }}",
               ["[INST]", "[/INST]"]),
}
# Without a chat template memtune trained on its Alpaca-style prompt (core.data.DEFAULT_TEMPLATE).
PLAIN_TEMPLATE = "### Instruction:\n{{ .Prompt }}\n\n### Response:\n{{ .Response }}"


@dataclass
class GGUFPlan:
    source: Path  # the model folder whose weights are converted (the base model when an adapter is merged first)
    out_dir: Path
    name: str
    formats: list[str]
    file_bytes: dict[str, int]
    merge_bytes: int  # disk for the merged bf16 model while converting (0 when no merge is needed)
    ram_bytes: int
    ram_free: int
    disk_free: int
    adapter_dir: Path | None = None
    ok: bool = True
    message: str = ""


@dataclass
class GGUFResult:
    out_dir: Path
    files: dict[str, Path]
    modelfile: Path
    readme: Path
    commands: list[str] = field(default_factory=list)


def default_gguf_dir(adapter_dir: str | Path | None = None, model_dir: str | Path | None = None) -> Path:
    """run_dir/gguf next to an adapter; <folder>-gguf next to a model folder."""
    if adapter_dir:
        return Path(adapter_dir).resolve().parent / "gguf"
    model = Path(model_dir).resolve()
    return model.parent / f"{model.name}-gguf"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._") or "memtune"


def _quote(text: str) -> str:
    """Double quotes where the shell leaves the text alone inside them (readable: 'cat' stays as typed)."""
    return f'"{text}"' if not re.search(r'["$`\\!]', text.replace("\\n", "")) else shlex.quote(text)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / MiB:.1f} MiB"


def plan_gguf(adapter_dir: str | Path | None = None, model_dir: str | Path | None = None,
              formats: Any = ("f16", "q8_0"), out_dir: str | Path | None = None) -> GGUFPlan:
    """How much RAM and disk the export needs and whether this machine has it (message says both); GGUFError for
    inputs that cannot be exported at all (no model, unsupported architecture, unknown format)."""
    import psutil

    from core.export import _local_model_dir, merge_plan

    fmts = parse_formats(formats)
    if bool(adapter_dir) == bool(model_dir):
        raise GGUFError("Give either an adapter folder (merged into its base first) or a model folder.")
    cfg = None
    if adapter_dir:
        from core.infer import InferError, adapter_config

        try:
            cfg = adapter_config(adapter_dir)
        except InferError as exc:
            raise GGUFError(str(exc)) from None
        source = _local_model_dir(cfg)
        if source is None or not (source / "config.json").is_file():
            raise GGUFError(f"The base model {cfg.model} is not on this machine, so memtune cannot check that it "
                            "can be converted nor how big it is. Try the adapter once (Try it) to download it.")
        name = _slug(f"{Path(cfg.model).name}-{Path(adapter_dir).resolve().parent.name}")
    else:
        source = Path(model_dir)
        name = _slug(source.resolve().name)
    config = read_config(source)
    architecture(config)  # refuses unsupported models before anything is merged
    tplan = tensor_plan(source, config)
    tok_file = source / "tokenizer.json"
    extra = 2 * (tok_file.stat().st_size if tok_file.is_file() else 0) + MiB  # vocabulary, merges, metadata
    sizes = {f: file_bytes(tplan, f) + extra for f in fmts}
    params = sum(_count(shape) for _, src, shape in tplan if src)
    biggest = max(_count(shape) for _, _, shape in tplan) * 4 * 3  # one tensor in f32, permuted, encoded
    merge_bytes = params * 2 if adapter_dir else 0
    ram = max(merge_plan(cfg)["needed"] if cfg else 0, biggest)
    from core.files import RefusedError, target

    try:  # resolved once (core.files.target): the checks and the final rename act on this same folder
        out = target(out_dir or default_gguf_dir(adapter_dir, model_dir), "write the GGUF export into")
    except RefusedError as exc:
        raise GGUFError(str(exc)) from None
    parent = _existing_parent(out)
    disk_free, ram_free = shutil.disk_usage(parent).free, int(psutil.virtual_memory().available)
    disk = merge_bytes + sum(sizes.values())
    what = ", ".join(f"{f} {_gib(b)}" for f, b in sizes.items())
    merge_text = f" + {_gib(merge_bytes)} for the merged model while converting" if merge_bytes else ""
    message = (f"Needs about {_gib(ram)} of RAM and {_gib(disk)} of disk in {parent} ({what}{merge_text}); "
               f"free: {_gib(ram_free)} RAM, {_gib(disk_free)} disk.")
    ok = True
    if ram > ram_free and not (cfg is not None and merge_plan(cfg)["device"] == "cuda"):
        ok, message = False, message + " Not enough memory: close other programs or stop the training run."
    if disk * 1.05 > disk_free:
        ok, message = False, message + " Not enough disk space: free some space or choose another folder."
    return GGUFPlan(source=source, out_dir=out, name=name, formats=fmts, file_bytes=sizes, merge_bytes=merge_bytes,
                    ram_bytes=ram, ram_free=ram_free, disk_free=disk_free, ok=ok, message=message,
                    adapter_dir=Path(adapter_dir) if adapter_dir else None)


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def export_gguf(adapter_dir: str | Path | None = None, model_dir: str | Path | None = None,
                formats: Any = ("f16", "q8_0"), out_dir: str | Path | None = None,
                progress: Progress | None = None, overwrite: bool = False,
                trust_remote_code: bool = False) -> GGUFResult:
    """Export an adapter (merged into its base) or a model folder to GGUF files + Modelfile + README.
    trust_remote_code: the user's confirmation, for an adapter whose settings ask for it (merge_adapter)."""
    from core.export import ExportError, merge_adapter
    from core.files import RefusedError, make_tmp, move_into_place, recover, require_marker

    plan = plan_gguf(adapter_dir, model_dir, formats, out_dir)

    def step(fraction: float, message: str) -> None:
        if progress is not None:
            progress(min(max(fraction, 0.0), 1.0), message)

    step(0.0, plan.message)
    if not plan.ok:
        raise GGUFError(plan.message)
    if plan.adapter_dir is not None:  # refused before anything is written (merge_adapter checks it again)
        from core.infer import InferError, adapter_config

        try:
            adapter_config(plan.adapter_dir, trust_remote_code=trust_remote_code)
        except InferError as exc:
            raise GGUFError(str(exc)) from None
    out = plan.out_dir
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise GGUFError(f"{out} already exists and is not empty. Choose another folder, or allow replacing it.")
        try:
            require_marker(out, "export", "replace")  # memtune only replaces what it made
        except RefusedError as exc:
            raise GGUFError(str(exc)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    recover(out)  # what an interrupted earlier export left
    try:
        tmp = make_tmp(out, "export")  # marked first: a crash leaves a folder a later start may remove
    except RefusedError as exc:
        raise GGUFError(str(exc)) from None
    try:
        source, start = plan.source, 0.0
        if plan.adapter_dir is not None:
            def merge_step(fraction: float, message: str) -> None:
                step(0.5 * fraction, message)

            try:
                source = merge_adapter(plan.adapter_dir, tmp / "merged", progress=merge_step,
                                       trust_remote_code=trust_remote_code)
            except ExportError as exc:
                raise GGUFError(str(exc)) from None
            start = 0.5
        files: dict[str, Path] = {}
        share = (1.0 - start) / len(plan.formats)
        for i, fmt in enumerate(plan.formats):
            begin = start + i * share

            def file_step(fraction: float, message: str, begin: float = begin) -> None:
                step(begin + share * fraction * 0.98, message)

            step(begin, f"Writing {plan.name}-{fmt}.gguf ({FORMATS[fmt][0]})")
            files[fmt] = write_gguf(source, tmp / f"{plan.name}-{fmt}.gguf", fmt, plan.name, file_step)
        meta = tokenizer_metadata(source, int(read_config(source)["vocab_size"]))
        shutil.rmtree(tmp / "merged", ignore_errors=True)
        result = _write_extras(tmp, out, plan, files, meta)
        move_into_place(tmp, out)
        step(1.0, f"GGUF export done: {', '.join(p.name for p in result.files.values())} in {out}")
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ollama_template(meta: dict[str, Any]) -> tuple[str | None, list[str]]:
    """(Ollama TEMPLATE or None to let Ollama read the GGUF's own, stop strings) for a tokenizer's metadata."""
    eos = [meta["eos_text"]] if meta.get("eos_text") else []
    chat = meta.get("chat_template")
    if not chat:
        return PLAIN_TEMPLATE, eos + ["### Instruction:"]
    for marker, (template, stops) in OLLAMA_TEMPLATES.items():
        if marker in chat:
            return template, list(dict.fromkeys(stops + eos))
    return None, eos


def _write_extras(tmp: Path, out: Path, plan: GGUFPlan, files: dict[str, Path], meta: dict[str, Any]) -> GGUFResult:
    """Modelfile, README.md and the marker, inside `tmp`; paths in the result and commands point into `out`."""
    primary = min(files.values(), key=lambda p: p.stat().st_size)  # Ollama gets the smallest file
    template, stops = ollama_template(meta)
    lines = [f"# Ollama Modelfile written by memtune: ollama create {plan.name} -f Modelfile", f"FROM ./{primary.name}"]
    if template is not None:
        lines.append(f'TEMPLATE """{template}"""')
    else:
        lines.append("# No TEMPLATE: Ollama uses the chat template stored in the GGUF file.")
    lines += [f"PARAMETER stop {json.dumps(s)}" for s in stops]
    (tmp / "Modelfile").write_text("\n".join(lines) + "\n", encoding="utf-8")

    from core.config import DEMO_MODEL

    base = ""
    if plan.adapter_dir is not None:
        from core.infer import adapter_config

        base = adapter_config(plan.adapter_dir).model
    prompt = DEMO_PROMPT if base == DEMO_MODEL else "Hello! Who are you?"
    commands = [f"ollama create {plan.name} -f {shlex.quote(str(out / 'Modelfile'))}",
                f"ollama run {plan.name} {_quote(prompt)}"]
    for path in files.values():
        gguf_path = shlex.quote(str(out / path.name))
        if meta.get("chat_template"):
            commands.append(f"llama-cli -m {gguf_path} -cnv")
        else:  # no chat template: give llama-cli the prompt format the adapter was trained on
            raw = "### Instruction:\\n" + prompt + "\\n\\n### Response:\\n"
            commands.append(f"llama-cli -m {gguf_path} -no-cnv -e -n 32 -p {_quote(raw)}")
    sizes = "\n".join(f"| {p.name} | {fmt} | {p.stat().st_size / MiB:,.1f} MiB |" for fmt, p in files.items())
    source = f"the adapter {plan.adapter_dir.resolve()} merged into {base}" if plan.adapter_dir else str(plan.source)
    readme = (f"# {plan.name} (GGUF)\n\nWritten by memtune on {_dt.date.today().isoformat()} from {source}.\n\n"
              f"| file | format | size |\n|---|---|---|\n{sizes}\n\n"
              "## Ollama\n\nThe Modelfile points at the smallest file; edit its FROM line to use another.\n\n"
              f"```sh\n{commands[0]}\n{commands[1]}\n```\n\n"
              "## llama.cpp\n\n```sh\n" + "\n".join(commands[2:]) + "\n```\n\n"
              "## LM Studio\n\nCopy or import a .gguf file (`lms import <file>`), then load it in the chat tab.\n")
    (tmp / "README.md").write_text(readme, encoding="utf-8")
    from core.files import write_marker

    write_marker(tmp, "export", what="gguf", source=source, formats=list(files),
                 files=[p.name for p in files.values()], ollama_name=plan.name)
    return GGUFResult(out_dir=out, files={f: out / p.name for f, p in files.items()}, modelfile=out / "Modelfile",
                      readme=out / "README.md", commands=commands)
