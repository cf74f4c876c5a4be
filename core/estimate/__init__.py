"""GPU memory before a run starts: the estimate, savings and Fit (`python -m core.estimate`, predict.py), the memory terms of
one process (terms.py) and per GPU for ddp and fsdp (multi.py). The GPUs as measured are core/gpus/."""
