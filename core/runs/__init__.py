"""What a run leaves behind and who may see it: the run folder, its checkpoints, adapter and summary (folders.py), the
events a run writes (events.py), the history read back from them (history.py), public mode's limits and per-visitor
folders (public.py) and the visitor id the server issues (identity.py). Markers, atomic writes and the one path
resolver for deletes are core/files.py's."""
