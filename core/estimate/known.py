"""A model's shape where no model may be built: the web server (core.estimate.measure.measuring_here(False)).

core.model.shapes.get_shape counts the model transformers builds of config.json on the meta device, which imports
torch. The server finds the same config.json as get_shape does (the demo model's folder, a local folder or file, the
Hugging Face cache, memtune's CONFIGS, then the built-in table) and reads the counted shape from measure's disk
cache, which an inspect child fills (core/estimate/inspect.py); until then the shape read from config.json's own keys
(ModelShape.from_keys: the formula) stands in, and the shape is noted as missing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from core.config.settings import DEMO_MODEL, DEMO_VISION_MODEL
from core.estimate import measure
from core.model import shapes
from core.model.shapes import ModelShape, ShapeError, StoredCount, get_shape

def config_source(model: str) -> dict[str, Any] | ModelShape | None:
    """What get_shape reads `model`'s shape from, without building it (core.model.shapes.config_source): None for
    a demo model (text or vision) before its folder exists (a child builds it)."""
    from core.demo import demo_model_dir  # core.demo and core.demo_vision build with torch only when asked to
    from core.demo_vision import tiny_model_dir

    demo = {DEMO_MODEL: demo_model_dir, DEMO_VISION_MODEL: tiny_model_dir}.get((model or "").strip())
    return shapes.config_source(model, demo() if demo is not None else None)


def shape_key(config: dict[str, Any]) -> str:
    text = json.dumps(config, sort_keys=True)
    return "shape|" + hashlib.sha256(json.dumps([text, *measure.versions("transformers")]).encode()).hexdigest()


def as_entry(shape: ModelShape) -> dict[str, Any]:
    return {"shape": dataclasses.asdict(shape)}


def from_entry(entry: dict[str, Any], name: str) -> ModelShape:
    def tuples(v: Any) -> Any:
        return tuple(tuples(x) for x in v) if isinstance(v, list) else v

    data = dict(entry["shape"])
    stored = data.pop("stored", None)
    data = {k: tuples(v) for k, v in data.items()}
    if stored is not None:
        stored = StoredCount(**{k: tuples(v) for k, v in stored.items()})
    return ModelShape(**{**data, "name": name, "stored": stored})


def shape_of(model: str) -> ModelShape:
    """get_shape(model) where this process may build models; else the counted shape from the cache, or config.json's
    keys meanwhile (noted missing for the inspect child). ShapeError where there is nothing to read yet."""
    if measure.measures_here():
        return get_shape(model)
    source = config_source(model)
    if isinstance(source, ModelShape):
        return source
    spec = {"kind": "shape", "model": (model or "").strip()}
    if source is None:  # the demo model, not built yet
        measure.note_missing(f"shape|{spec['model']}", spec)
        raise ShapeError(f"{model} is not built yet")
    key = shape_key(source)
    found = measure.lookup(key, spec, lambda: as_entry(get_shape(model)))
    if found is not None:
        return from_entry(found, model.strip())
    return ModelShape.from_keys(source, model.strip())


def remember_shape(model: str) -> ModelShape:
    """In a child that may build models: get_shape, written to the cache under the key the server looks it up by."""
    shape = get_shape(model)
    source = config_source(model)
    if isinstance(source, dict):
        measure.remember(shape_key(source), as_entry(shape))
    return shape

