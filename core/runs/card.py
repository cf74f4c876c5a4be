"""Model cards: the README.md an exported folder carries (the adapter folder and its zip, the merged model, the GGUF
folder), written from the run's own record (summary.json and memtune.yaml), never from what a run might have done.

- `model_card(summary, cfg, kind, license)`: the card's text (pure): the base model, the data, the stage and main
  settings, the final losses, the held-out scores, the preset and the GPU memory peak; a figure the run did not record
  is left out. `kind` ("adapter", "merged", "gguf") picks how to load it; the GGUF folder's README adds its own
  Ollama and llama.cpp sections under the card.
- `adapter_card(adapter_dir, kind)`: the card for an adapter folder's run, None when the folder has no record.
- `base_license(model)`: the base model's license field, from its README front matter or config.json on this
  machine (never downloads); None when it says none.
Paths in a card are relative: a card travels with its folder.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from core.config.slices import Training

KINDS = ("adapter", "merged", "gguf")
HUB = "https://huggingface.co/"
SEE_BASE = "see the base model's card"


def hub_id(model: str) -> str | None:
    """`model` when it names a Hugging Face Hub repo (owner/name, not a folder on this machine nor the demo, which
    is built locally), else None."""
    from core.config.settings import DEMO_MODEL

    if model == DEMO_MODEL or Path(model).expanduser().exists() or model.startswith((".", "/", "~")):
        return None
    return model if re.fullmatch(r"[\w.-]+/[\w.-]+", model) else None


# a folder of the Hugging Face cache: HF_HUB_CACHE/models--owner--name/snapshots/<revision>
HUB_SNAPSHOT = re.compile(r"(?:^|/)models--([^/]+?)--([^/]+)/snapshots/[^/]+/?$")


def portable_base(written: str, model: str, adapter_dir: Path) -> str:
    """What adapter_config.json names as the base model (peft wrote `written`, the folder it loaded): the Hub id
    where the run's model is one or that folder is a snapshot of the Hugging Face cache (it loads anywhere), else
    that folder relative to the adapter folder, which the card's peft commands run from; never an absolute path of
    this machine (a public server's folders included)."""
    if (hub := hub_id(model)) is not None:
        return hub
    if (found := HUB_SNAPSHOT.search(Path(written).as_posix())) is not None:
        return f"{found[1]}/{found[2]}"
    if not Path(written).is_absolute():
        return written
    return os.path.relpath(written, Path(adapter_dir).resolve()).replace(os.sep, "/")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _mean(part: Any) -> float | None:
    return _number(part.get("mean")) if isinstance(part, dict) else None


def heldout_scores(summary: dict[str, Any]) -> dict[str, Any] | None:
    """A run's held-out scores (summary.json's `heldout`), read here for every reader (History, Compare, the result
    card, the model card): the base, parent and adapter means (0-1; None where not scored), the scorer, the rows and
    where they came from, and the verdict (its kind, whether the adapter scored lower, its key, params and English
    message). None for a run without a held-out score."""
    held = summary.get("heldout") if isinstance(summary, dict) else None
    if not isinstance(held, dict) or _mean(held.get("adapter")) is None:
        return None
    verdict = held.get("verdict") if isinstance(held.get("verdict"), dict) else {}
    return {"scorer": str(held.get("scorer", "")), "source": str(held.get("source", "")), "rows": held.get("rows"),
            "base": _mean(held.get("base")), "parent": _mean(held.get("parent")),
            "adapter": _mean(held.get("adapter")), "verdict": str(verdict.get("verdict", "")),
            "worse": bool(verdict.get("worse")), "key": str(verdict.get("key", "")),
            "params": verdict.get("params") if isinstance(verdict.get("params"), dict) else {},
            "message": str(verdict.get("message", ""))}


def _rows(summary: dict[str, Any], cfg: Training) -> list[tuple[str, str]]:
    """The card's table: (what, value) for every figure the run recorded."""
    from core.config.presets import matching

    base = hub_id(cfg.model)
    rows = [("Base model", f"[{base}]({HUB}{base})" if base else f"`{Path(cfg.model).name}`")]
    data = summary.get("data") if isinstance(summary.get("data"), dict) else {}
    used = [f"`{cfg.dataset}`", f"split `{cfg.dataset_split}`"]
    if _number(data.get("train_rows")) is not None:
        of = f" of {int(data['rows_in_split'])}" if _number(data.get("rows_in_split")) is not None else ""
        used.append(f"{int(data['train_rows'])}{of} rows trained")
    rows.append(("Data", ", ".join(used)))
    rows.append(("Stage", cfg.stage))
    settings = [f"LoRA r={cfg.lora_r}, alpha={cfg.lora_alpha}", f"learning rate {cfg.learning_rate:g}",
                f"effective batch {cfg.effective_batch_size}", f"max length {cfg.max_length}"]
    if _number(summary.get("steps")) is not None:
        settings.append(f"{int(summary['steps'])} steps")
    rows.append(("Settings", "; ".join(settings) + ("; 4-bit base (QLoRA)" if cfg.load_in_4bit else "")))
    if (preset := matching(cfg)) is not None:
        rows.append(("Preset", f"`{preset}`"))
    if (loss := _number(summary.get("final_loss"))) is not None:
        rows.append(("Final training loss", f"{loss:.4f}"))
    evals = summary.get("eval") if isinstance(summary.get("eval"), dict) else {}
    if (loss := _number(evals.get("final"))) is not None:
        step = f" (step {int(evals['final_step'])})" if _number(evals.get("final_step")) is not None else ""
        rows.append(("Final validation loss", f"{loss:.4f}{step}"))
    peak = next((p for k in ("nvml_peak_gib", "peak_reserved_gib", "peak_allocated_gib")
                 if (p := _number(summary.get(k))) is not None), None)
    if peak is not None:
        rows.append(("GPU memory peak", f"{peak:.2f} GiB"))
    return rows


def _heldout(summary: dict[str, Any]) -> list[str]:
    """The held-out section's lines (none when the run scored nothing)."""
    held = heldout_scores(summary)
    if held is None:
        return []
    trained = held["source"] in ("train", "demo")  # no rows held out: scored on rows it trained on
    rows = "?" if held["rows"] is None else held["rows"]
    lines = ["## Scores on trained rows" if trained else "## Held-out scores", "",
             f"Scorer `{held['scorer'] or '?'}` on {rows} rows the run "
             f"{'trained on (it held none out)' if trained else 'did not train on'}.", "",
             "| model | score |", "|---|---|"]
    for who, label in (("base", "base model"), ("parent", "starting adapter"), ("adapter", "this adapter")):
        if held[who] is not None:
            lines.append(f"| {label} | {100 * held[who]:.1f}% |")
    if held["message"]:
        lines += ["", f"Verdict: {held['message']}"]
    return lines + [""]


def _loading(kind: str) -> list[str]:
    if kind == "adapter":
        return ["## Load it", "", "With peft (it loads the base model named in adapter_config.json), from this folder:",
                "", "```python", "from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer",
                "", 'model = AutoPeftModelForCausalLM.from_pretrained(".")',
                'tokenizer = AutoTokenizer.from_pretrained(".")', "```", "",
                "memtune's Export tab (or `python -m core.export merge|gguf`) turns it into a full model or GGUF "
                "files for llama.cpp and Ollama.", ""]
    if kind == "merged":
        return ["## Load it", "", "A plain transformers model (bf16): no peft needed. From this folder:", "",
                "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                'model = AutoModelForCausalLM.from_pretrained(".")', 'tokenizer = AutoTokenizer.from_pretrained(".")',
                "```", ""]
    return []  # the GGUF README follows the card with its Ollama and llama.cpp sections


def model_card(summary: dict[str, Any], cfg: Training, kind: str, license: str | None = None) -> str:
    """The README.md of an exported folder of `kind` (KINDS) for the run that `summary` (summary.json) and `cfg` (its
    memtune.yaml) record. Pure: only what they hold, a missing figure left out."""
    if kind not in KINDS:
        raise ValueError(kind)
    base = hub_id(cfg.model)
    front = ["---", *([f"base_model: {base}"] if base else []),
             *(["library_name: peft"] if kind == "adapter" else []),
             *([f"license: {json.dumps(license)}"] if license else []),
             "tags:", "- memtune", f"- {cfg.stage}", "- lora", *(["- gguf"] if kind == "gguf" else []), "---", ""]
    what = {"adapter": "A LoRA adapter", "merged": "A full model: a LoRA adapter merged into its base model's weights",
            "gguf": "GGUF files of a LoRA adapter merged into its base model"}[kind]
    title = Path(cfg.model).name
    lines = [f"# {title}, fine-tuned with memtune", "", f"{what}, trained with memtune.", "",
             "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in _rows(summary, cfg)),
             f"| License | {license or SEE_BASE} |", ""]
    return "\n".join(front + lines + _heldout(summary) + _loading(kind))


def base_license(model: str) -> str | None:
    """The license field of the base model's card (README.md front matter) or config.json, read on this machine
    only (a local folder or the Hub cache); None when neither says one."""
    folder = Path(model).expanduser()
    found: dict[str, Path] = {}
    for name in ("README.md", "config.json"):
        if folder.is_dir():
            if (folder / name).is_file():
                found[name] = folder / name
            continue
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, name)
        except Exception:  # not a repo id
            cached = None
        if isinstance(cached, str):
            found[name] = Path(cached)
    try:
        if "README.md" in found:
            text = found["README.md"].read_text(encoding="utf-8")
            if (m := re.match(r"---\s*\n(.*?)\n---", text, re.S)):
                import yaml

                value = (yaml.safe_load(m.group(1)) or {}).get("license")
                if value:
                    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)
        if "config.json" in found:
            value = json.loads(found["config.json"].read_text(encoding="utf-8")).get("license")
            if isinstance(value, str) and value:
                return value
    except (OSError, ValueError, AttributeError):
        return None
    return None


def adapter_card(adapter_dir: str | Path, kind: str) -> str | None:
    """The card of the run an adapter folder holds (its summary.json and memtune.yaml), None without them."""
    from core.config.settings import TrainConfig

    folder = Path(adapter_dir)
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        cfg = TrainConfig.from_yaml((folder / "memtune.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return model_card(summary if isinstance(summary, dict) else {}, cfg, kind, base_license(cfg.model))
