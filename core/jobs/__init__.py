"""Child processes: the app's one job at a time, what a page shows of it, the supervisor, and runs over several GPUs or machines."""
