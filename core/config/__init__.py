"""Settings: the one typed configuration (settings.py), its values, the hardware it is checked against, presets and the memory checklist."""
