"""The model: loading and quantizing it, LoRA and its targets, the attention memtune installs, architecture shapes and the families it verifies."""
