"""`python -m core.train ...`: the command line (core/train_cli.py; usage in core/train/__init__.py's docstring)."""

from core.train_cli import run

run()
