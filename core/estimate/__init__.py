"""GPU memory before a run starts: the estimate, savings, Fit and the presets sized per model (predict.py; `python -m
core.estimate`: __main__.py), the memory terms of one process (terms.py; one decoder layer's saved tensors measured
in measure.py, ORPO's logits in preference.py), a preference stage's part (stages.py) and per GPU for ddp and fsdp
(multi.py). The GPUs as measured are core/gpus/; what would help a run that ran out of memory, advice.py."""
