"""The training recipe (recipe.py: setup, train, save), its library arguments, its callbacks and events, and its command line (`python -m core.train`)."""
