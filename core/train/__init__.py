"""The training recipe (recipe.py: RunContext, then LoRARecipe's setup, train, save, cleanup), its Trainer callbacks
(callbacks.py), its command line (`python -m core.train`, cli.py) and the libraries every run imports (libraries.py,
preload.py). The config -> library arguments mapping is core/config/arguments.py; the events a run writes are
core/runs/events.py."""
