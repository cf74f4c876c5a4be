"""The offline demo: its tiny model, tokenizer and data built on this machine (build.py), and its score (score.py)."""
