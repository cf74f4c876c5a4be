"""`python -m core.train ...`: the command line (core/train/cli.py; usage in core/train/recipe.py's docstring)."""

from core.train.cli import run

run()
