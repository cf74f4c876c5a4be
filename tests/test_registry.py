"""The lever registry (core/config/settings.py's `Lever` on each field, core/config/levers.py's queries).

core/config is one of memtune's lowest layers: it names the modules a lever is handed to, modelled in and
implemented by (core.model.load, core.estimate.terms, core.levers...) and the bench/RESULTS.md sections that measure
it as text, since importing them would make config import upward. This test imports every one of those names
instead, so a renamed function, a moved module or a retitled section fails here, not on a user's GPU; and it checks
that each named function really is where its field is used. The lists derived from the registry (page, Fit, presets) follow.
"""

import importlib
import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

from core.config import checklist, levers, presets, settings
from core.config.settings import PLACES, TrainConfig, field_meta

ROOT = Path(__file__).resolve().parent.parent
FIELDS = {f.name for f in fields(TrainConfig)}
# Fields the estimator reads that are not levers: they define the adapter (what is trained), not how it is trained.
NOT_LEVERS = {"lora_r", "lora_target_modules"}
REFS = sorted({(name, ref) for name, lv in levers.LEVERS.items() for ref in lv.library + lv.term})


def resolve(ref: str):
    """The object a dotted name ("package.module.attribute...") names: its longest importable module, then getattr."""
    parts = ref.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if not ".".join(parts[:cut]).startswith(exc.name or "\0"):
                raise  # the module exists but imports something missing: a real failure
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(ref)


def reads(source: str, name: str) -> bool:
    """Whether a function's source reads config field `name` off its config (`cfg.name`, `getattr(cfg, "name"`)."""
    return bool(re.search(rf"\bcfg\.{name}\b|getattr\(cfg, [\"']{name}[\"']", source))


def test_the_module_names_import():
    for module in (settings.ARGS, settings.LOAD, settings.TERMS, settings.EMBEDDING, settings.HEAD):
        importlib.import_module(module)
    assert (ROOT / settings.RESULTS).is_file()


@pytest.mark.parametrize("name, ref", REFS, ids=[f"{n}:{r.rpartition('.')[2]}" for n, r in REFS])
def test_every_name_is_a_real_function_that_uses_its_field(name, ref):
    obj = resolve(ref)
    assert inspect.isfunction(obj) or inspect.isclass(obj), f"{name}: {ref} is a {type(obj).__name__}"
    assert obj.__module__ == ref.rpartition(".")[0], f"{ref} is {obj.__module__}'s: name it where it is defined"
    lever = levers.LEVERS[name]
    if ref in lever.term:  # the estimator's own functions, and nothing else, model memory
        assert ref.startswith("core.estimate.") and inspect.isfunction(obj), f"{name}: {ref} is no estimator function"
    source = inspect.getsource(obj)
    if reads(source, name):
        return
    # Otherwise it is the lever's own implementation (core/levers/), called by a function of the same declaration
    # that reads the field: the loader decides, the lever's module does the work.
    assert ref.startswith("core.levers."), f"{name}: {ref} never reads cfg.{name}"
    callers = [r for r in lever.library if r != ref and reads(inspect.getsource(resolve(r)), name)
               and re.search(rf"\b{obj.__name__}\(", inspect.getsource(resolve(r)))]
    assert callers, f"{name}: no function of its declaration reads cfg.{name} and calls {ref}"


def test_every_lever_module_is_named_by_the_registry():
    """Every core/levers module is named by a Lever, or serves only lever modules that are (a part split off so that
    torch-free code can read it: core/levers/grouping.py for experts.py and the estimate)."""
    named = {ref.rpartition(".")[0] for _, ref in REFS}
    modules = {f"core.levers.{p.stem}" for p in (ROOT / "core/levers").glob("*.py") if p.stem != "__init__"}

    def imported_by_named(module: str) -> bool:
        stem = module.rpartition(".")[2]
        return any(re.search(rf"^from core\.levers(\.{stem} import|\s+import .*\b{stem}\b)", 
                             (ROOT / "core/levers" / f"{n.rpartition('.')[2]}.py").read_text(encoding="utf-8"), re.M)
                   for n in named if n.startswith("core.levers."))

    assert modules and all(m in named or imported_by_named(m) for m in modules), \
        "declare what each core/levers module implements on its field's Lever"


def test_every_measured_section_is_a_heading_of_results():
    results = (ROOT / levers.RESULTS).read_text(encoding="utf-8")
    headings = [line.lstrip("#").strip() for line in results.splitlines() if line.startswith("#")]
    for name, lever in levers.LEVERS.items():
        if lever.measured:
            assert any(h.startswith(lever.measured) for h in headings), f"{name}: no section {lever.measured!r}"
    assert {levers.measured(i.key) for i in checklist.ITEMS} >= {settings.TOLD}


def test_the_names_and_paths_the_config_layer_writes_exist():
    """Every dotted module name and every file path core/config/ and core/levers/ mention (code, comments and
    docstrings) is real: they name code they cannot import, so only this keeps them true."""
    files = sorted((ROOT / "core/config").glob("*.py")) + sorted((ROOT / "core/levers").glob("*.py"))
    text = "\n".join(f.read_text(encoding="utf-8") for f in files)
    dotted = set(re.findall(r"\b(?:core|ui|bench|scripts)(?:\.[A-Za-z_]\w*)+", text))
    paths = {p.rstrip(".") for p in re.findall(r"\b(?:core|ui|bench|scripts|tests|assets)/[\w./-]*", text)}
    assert {"core.model.load", "core/model/load.py"} <= dotted | paths
    for ref in sorted(dotted):
        resolve(ref)
    assert [p for p in sorted(paths) if not (ROOT / p).exists()] == []


def _estimator_fields() -> set[str]:
    return set(re.findall(r"\bcfg\.([a-z_0-9]+)\b", (ROOT / "core/estimate/terms.py").read_text())) & FIELDS


def test_every_lever_field_is_declared_and_every_declaration_is_a_real_field():
    # What makes a field a lever, found in the code rather than in the registry: a preset sets it, a checklist item
    # governs it, or the estimator's memory terms read it.
    preset_set = {k for p in presets.PRESETS.values() for k in p["overrides"]}
    governed = {f for item in checklist.ITEMS for f in item.fields}
    found = (preset_set | governed | _estimator_fields()) - NOT_LEVERS
    assert found - set(levers.LEVERS) == set(), "declare these with lever=Lever(...) in core/config/settings.py"
    assert set(levers.LEVERS) <= FIELDS and governed <= FIELDS
    assert "quantize_output_head" in levers.LEVERS and "attention" in levers.LEVERS
    for name, lever in levers.LEVERS.items():
        assert lever.place in PLACES, name
        assert (lever.place == "checklist") == bool(lever.item), name
        if lever.item:
            assert lever.item in checklist.BY_KEY, f"{name}: no checklist item {lever.item!r}"
        assert lever.library, f"{name}: say where the engine hands it to the libraries"
        assert field_meta(name)["lever"] is lever
    for item in checklist.ITEMS:  # every item's fields are levers of that item or of its sibling batch item
        assert all(f in levers.LEVERS for f in item.fields), item.key
        assert not item.switch or levers.LEVERS[item.switch].item == item.key


def test_a_lever_without_an_estimator_term_changes_no_estimate():
    from core.estimate.predict import estimate

    base = TrainConfig(per_device_train_batch_size=2, gradient_accumulation_steps=4)
    free = [n for n, lv in levers.LEVERS.items() if not lv.term]
    assert free == ["bnb_4bit_quant_type", "use_rslora", "lora_init", "loraplus_lr_ratio",
                    "gradient_accumulation_steps", "compile_layers"]
    for changed in (base.replace(bnb_4bit_quant_type="fp4"), base.replace(gradient_accumulation_steps=1),
                    base.replace(compile_layers="on"),  # run 21: +0.09-0.13 GiB NVML on 8B `fastest`, within the estimate
                    base.replace(use_rslora=True), base.replace(lora_init="olora"),
                    base.replace(loraplus_lr_ratio=16.0)):  # the same tensors: another scale, start or lr
        assert estimate(changed).nvml_peak == estimate(base).nvml_peak
    assert estimate(base.replace(quantize_output_head=True)).nvml_peak < estimate(base).nvml_peak  # a term that counts


def test_presets_fit_and_tutorial_lists_come_from_the_registry():
    from scripts import tutorial

    assert presets.CHAPTER == {n: getattr(TrainConfig(), n) for n, lv in levers.LEVERS.items() if lv.preset}
    assert all(set(p["overrides"]) <= set(presets.CHAPTER) for p in presets.PRESETS.values())
    assert presets.CUDA_ONLY == ("use_liger_kernel", "offload_activations") == levers.cuda_only()
    assert tutorial.CHECKLIST_KEYS == tuple(i.key for i in checklist.ITEMS)
    assert levers.fit_fields() == ("per_device_train_batch_size", "gradient_accumulation_steps", "max_length",
                                   "gradient_checkpointing", "optim", "stream_layers")  # the order Fit's note lists


def test_fit_to_my_gpu_changes_only_the_fields_the_registry_gives_it(monkeypatch):
    from core.estimate import terms
    from core.estimate.predict import FIT_MARGIN, fit_floor, fit_to_gpu

    monkeypatch.setattr(terms, "available_ram", lambda: 64 * 2**30)  # RAM for streamed layers (Fit's last resort)
    cfg = TrainConfig(upcast_to_fp32=False, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                      gradient_checkpointing=False, max_length=2048, optim="adamw_torch")
    floor = int(fit_floor(cfg).nvml_peak / (1 - FIT_MARGIN)) + 1  # just fits the smallest setting Fit may choose
    streamed = int(fit_floor(cfg.replace(stream_layers=True)).nvml_peak / (1 - FIT_MARGIN)) + 1  # only streamed
    assert streamed < floor
    changed = set()
    for budget in (streamed, floor, 3 * floor):
        fitted, _ = fit_to_gpu(cfg, budget)
        changed |= {f for f in FIELDS if getattr(fitted, f) != getattr(cfg, f)}
    assert changed == set(levers.fit_fields())  # every one of them is used, and nothing else


def test_the_page_places_every_lever_once_from_the_registry():
    from core.estimate.predict import GENERATION_FIELDS
    from ui import handlers, layout

    assert handlers.FIT_FIELDS == levers.fit_fields() + GENERATION_FIELDS  # then GRPO's sampling, which is no lever
    assert layout.GOVERNS == {i.key: levers.beside(i.key) for i in checklist.ITEMS}
    assert layout.BEYOND == levers.placed("beyond")
    assert layout.BEYOND.index("quantize_output_head") == layout.BEYOND.index("offload_embeddings") + 1
    switches = [i.switch for i in checklist.ITEMS if i.switch]  # the box is the field; its widget sits in Advanced
    shown = [n for ns in layout.GOVERNS.values() for n in ns] + layout.BEYOND + levers.placed("training") + switches
    assert sorted(shown) == sorted(levers.LEVERS)  # each lever once




def test_the_config_layer_imports_no_torch():
    """The registry names the levers' torch modules as text: loading config (the CLI's --help, a YAML check) stays
    free of torch, which only hardware detection imports, when asked."""
    import subprocess
    import sys

    code = ("import sys, core.config.settings, core.config.levers, core.config.presets, core.config.arguments; "
            "print(sorted({'torch', 'transformers', 'core.levers', 'core.model'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_results_section_the_code_cites_is_a_heading():
    """Comments and docstrings cite a measurement by its section (`bench/RESULTS.md, section "X"`), never copy it."""
    results = (ROOT / levers.RESULTS).read_text(encoding="utf-8")
    headings = [line.lstrip("#").strip() for line in results.splitlines() if line.startswith("#")]
    cited = set()
    for file in sorted((ROOT / "core").rglob("*.py")) + sorted((ROOT / "ui").glob("*.py")):
        text = re.sub(r"\s*\n\s*#?\s*", " ", file.read_text(encoding="utf-8"))  # a citation may wrap
        cited |= {(file.name, s) for s in re.findall(r'RESULTS\.md, section "([^"]+)"', text)}
    assert len(cited) >= 5
    assert [c for c in sorted(cited) if not any(h.startswith(c[1]) for h in headings)] == []
