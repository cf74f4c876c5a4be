"""A child process for the job manager that speaks `python -m core.train`'s protocol in milliseconds, for the UI tests.

`JobManager(program=TINY_CHILD)` runs it as it runs the CLI (`--config FILE --run-dir DIR`): it writes the same
events into RUN/events.jsonl (`run`, then `done`), answers the stop file RUN/STOP with the `ack` event and ends as
stopped, and ends as completed when the test writes RUN/GO. The spawn, the following of events.jsonl, Stop and its
deadlines are the manager's real ones; only the training is left out (test_child.py trains real children).
"""

import sys
import time
from pathlib import Path

from core.config.settings import TrainConfig
from core.runs.folders import STOP_FILE
from core.runs.events import JsonlSink, make_event

TINY_CHILD = [sys.executable, "-m", "tests.tiny_child"]
GO_FILE = "GO"


def main(argv: list[str]) -> int:
    cfg = TrainConfig.load(argv[argv.index("--config") + 1])
    run_dir = Path(argv[argv.index("--run-dir") + 1])
    emit = JsonlSink(run_dir / "events.jsonl")
    emit(make_event("run", run_dir=str(run_dir), config=cfg.to_dict(), total_steps=None))
    while not (run_dir / STOP_FILE).exists() and not (run_dir / GO_FILE).exists():
        time.sleep(0.02)
    stopped = (run_dir / STOP_FILE).exists()
    if stopped:
        emit(make_event("log", level="info", ack="stop", message="Stop requested: finishing the current step."))
    emit(make_event("done", status="stopped" if stopped else "completed", run_dir=str(run_dir), summary={},
                    message="bye"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
