"""The machine's GPUs: what they hold now and the one NVML sampler (vram.py), and how a run spreads over several of them (distributed.py: the process plan, ranks, accelerate's flags)."""
