"""The training recipe (recipe.py: `run_training`, setup, train, save), what a run says while it trains and how it hears
Stop (callbacks.py), its command line (`python -m core.train`: cli.py, __main__.py) and the libraries every run imports
(libraries.py; preload.py: the warm-start server's). The config -> library arguments mapping is
core/config/arguments.py; the events a run writes are core/runs/events.py, its folder core/runs/folders.py."""
