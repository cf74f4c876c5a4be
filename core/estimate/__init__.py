"""GPU memory: the estimate of a run before it starts (`python -m core.estimate`), its terms per GPU, and the GPUs as measured (vram.py)."""
