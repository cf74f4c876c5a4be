"""Taking an adapter elsewhere: zip, merge and push (adapter.py), GGUF for llama.cpp, and `python -m core.export`."""
