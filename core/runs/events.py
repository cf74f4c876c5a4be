"""Training events: plain dicts sent to an in-memory sink and appended to `events.jsonl` in the run folder.

Training never blocks on a reader: sinks are unbounded queues or files, and the JSONL file lets a reloaded page
(or `tail -f`) reattach to a run. Every event has `kind` and `time` (Unix seconds). Kinds and their fields:

- run:    run_dir, config (dict), resume_from (the checkpoint resumed, or ""), pid, threads (torch CPU threads)
- phase:  phase (starting|resolving|loading_model|tokenizing|preflight|scoring|warming_up|training|saving|done; scoring: the held-out score before training (core/train/heldout.py); starting: the job manager's), message, progress (0..1 or null);
          warming_up's last event (kernel_warmup, core/train/callbacks.py make_warmup) adds seconds and tokens
- step:   step, total_steps, epoch, tokens, tokens_per_s, elapsed_s, eta_s, gpu_mem_gib?, peak_gib?
          (one per optimizer step: drives the progress bar)
- metrics: step, total_steps, epoch, loss, learning_rate, grad_norm (every `logging_steps`: drives the loss curve);
          a preference run's add reward_accuracy?, reward_margin, reward_chosen, reward_rejected, logp_chosen,
          logp_rejected (core/train/rewards.py: drive the reward chart)
- eval:   step, total_steps, eval_loss, best_eval_loss, answers ([{prompt, reference, answer}]: greedy answers to a
          few validation prompts), loss_s and answers_s (seconds each part took); at step 0 (before training),
          every eval_steps and at the end; a preference run's add its validation pairs' reward fields, named as
          in `metrics` (the reward chart's validation series)
- log:    message, level (info|warning), ack? ("stop": the run has seen a Stop and ends after the current step)
- data:   message + core.data.plan.DataPlan.to_dict(): format, rows_in_split, train_rows, kept, truncated,
          prompt_cut, dropped_long, dropped_empty, packs, max_length, long_prompts, longest_row_tokens
- done:   status (completed|stopped|failed), run_dir, adapter_dir?, summary (dict), message
- error:  error_type (config|data|model|oom|other), message, traceback? (for bug reports), exit_code? (the
          job manager's, for a child that died)

A Try it child (core/jobs/act.py) adds: answer (request, base, tuned: the answers so far, streamed) and answered
(request, status, base, tuned); its phases are loading, ready and generating, a merge's and an export's loading,
merging and converting (core/jobs/actions.py follows them as it follows a run).

The words of run, phase, log, data, error and done events (and the supervisor's kill and death messages) carry
`key` + `params` beside `message` (core.messages.keyed / words_of): `message` is en.json's text filled, what the CLI
prints and `tail -f` shows; a page says the key in its own language (ui.render.said). A parameter that is itself a
message nests as {"key", "params"}; msg.lines' `lines` is a list of them (or quoted texts: a log's last lines). An
error may instead carry `problems` (a ConfigError's, each keyed). Events of older runs have `message` only.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

EventSink = Callable[[dict[str, Any]], None]


def make_event(kind: str, **data: Any) -> dict[str, Any]:
    return {"kind": kind, "time": round(time.time(), 3), **data}



# --- an eval's answers in one readable line (the CLI's log and the page's) ------------------------------------------
_SPECIAL = re.compile(r"<\|[^|>]*\|>|<(?:/?s|start_of_turn|end_of_turn|bos|eos)>")  # chat templates' special tokens


def one_line(text: str, limit: int = 60) -> str:
    """`text` on one line, as written (no repr escapes): control characters and line breaks become spaces; past
    `limit` characters it ends at a word, with "…"."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    if len(flat) <= limit:
        return flat
    cut = flat[:limit].rsplit(" ", 1)[0] if " " in flat[:limit] else flat[:limit]
    return cut.rstrip(" ,;:") + "…"


def prompt_gist(prompt: str, limit: int = 80) -> str:
    """What a validation prompt asks, for a log line: its last line of more than one word (the question), without the
    template's headers ("### Response:", a chat role) and special tokens; the whole prompt on one line otherwise."""
    lines = [line.strip(" #") for line in _SPECIAL.sub("\n", str(prompt)).splitlines()]
    asked = [line for line in lines if len(re.findall(r"\w+", line)) > 1]
    return one_line(asked[-1] if asked else _SPECIAL.sub(" ", str(prompt)), limit)

class EventList:
    """Mixin of a job and an action (core/jobs): `events` (a list) and `_lock` (a threading.Lock) it holds; the
    thread that follows the child's events.jsonl appends, the page's poll reads what arrived since it last looked."""

    events: list[dict[str, Any]]
    _lock: threading.Lock

    def emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def events_since(self, start: int = 0) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events[start:])


class JsonlSink:
    """Appends each event as one JSON line and flushes, so readers see it at once."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.dropped = 0  # events that could not be written (disk full)

    def __call__(self, event: dict[str, Any]) -> None:
        data = (json.dumps(event, default=str, ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            try:  # h2: one unbuffered write; on a full disk the cut line is taken back and the event dropped,
                with open(self.path, "ab", buffering=0) as fh:  # so later events (after space is freed) still parse
                    start = fh.seek(0, os.SEEK_END)
                    try:
                        if fh.write(data) != len(data):
                            raise OSError(errno.ENOSPC, "short write")
                    except OSError:
                        fh.truncate(start)
                        raise
            except OSError:  # a full disk must not turn a handled failure into a traceback
                self.dropped += 1


def fan_out(*sinks: EventSink | None) -> EventSink:
    targets = [s for s in sinks if s is not None]

    def emit(event: dict[str, Any]) -> None:
        for sink in targets:
            sink(event)

    return emit


def read_events(path: Path, start_line: int = 0) -> list[dict[str, Any]]:
    """Events from a JSONL file from line `start_line` on; a half-written last line is left for next time."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    with path.open("r", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i < start_line:
                continue
            if not line.endswith("\n"):
                break
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return out


class EventTail:
    """Reads an events.jsonl incrementally: each `read()` returns only the complete lines added since the last one.

    Remembers a byte offset, so following a long run costs one small read per poll, not a re-parse of the file.
    A half-written last line (the writer is mid-append) is left for the next read.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1  # only complete lines
        out = []
        for line in chunk[:end].splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a damaged line (e.g. a crash mid-write before a later append): skip it, keep reading
        self.offset += end
        return out
