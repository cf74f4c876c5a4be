"""Run folders and the files memtune writes: markers, atomic writes, the one path resolver for deletes, history, public mode's per-visitor folders."""
