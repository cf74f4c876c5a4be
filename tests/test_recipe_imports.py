"""The recipe stays readable top to bottom: it calls a few builders by responsibility (the run's context, the data,
the model, the trainer) instead of importing every part of memtune itself. Read with ast, nothing run."""

from pathlib import Path

from tests.test_imports import imported_modules, project_modules

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "core" / "train" / "recipe.py"
MOST_CORE_MODULES = 12


def core_modules(name: str, file: Path) -> set[str]:
    """The distinct core.* modules `file` imports anywhere (module level, functions, TYPE_CHECKING blocks alike)."""
    return {m for m in imported_modules(name, file, project_modules()) if m.startswith("core.")}


def test_the_recipe_imports_at_most_twelve_core_modules():
    found = core_modules("core.train.recipe", RECIPE)
    assert len(found) <= MOST_CORE_MODULES, sorted(found)


def test_the_count_sees_every_import_form(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("from core.config import arguments\nfrom core.config.settings import TrainConfig\n"
                      "from core.model import load as model_lib, families\nimport core.files\n"
                      "def f():\n    from core.runs.events import make_event\n")
    found = core_modules("core.train.probe", source)
    assert found == {"core.config.arguments", "core.config.settings", "core.model.load", "core.model.families",
                     "core.files", "core.runs.events"}
