"""`python -m core.export ...`: the command line (core/export/cli.py)."""

from core.export.cli import main

raise SystemExit(main())
