"""The memory levers that are modules of their own, beside their declarations (core/config/settings.py's `Lever`):
the input embedding kept in CPU memory (embedding.py: offload_embeddings) and the output head in 4-bit NF4
(output_head.py: quantize_output_head). core/model/load.py applies them while loading and preparing a model."""
