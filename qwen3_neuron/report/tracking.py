"""tracking=mlflow|wandb: one writer per run, the launcher, logging the run while it trains.

The workers never talk to a tracking store: the metrics rank writes metrics.jsonl as always, and
the launcher follows that file from a thread of its own (`LiveTracking`), sending every
`tracking.interval_seconds` the whole records the file gained since the last send. The file is
the queue: how much of it the store holds is kept in the run dir's record of the tracked run
(mlflow_run.json, wandb_run.json) after every send, so a record is sent once whatever happens (a
kill -9 of the launcher included: a resume sends the rest), and a send reads at most
MAX_SEND_BYTES of it at a time, so a store that fell behind catches up in bounded pieces. Nothing
waits on this thread: not a step (the workers are other processes), not the launcher's progress
line. A store that fails is said once on the console; the thread tries again, less and less often
(up to once a minute), and the run dir stays complete.

When the job ends, `finish` sends what is left and closes the tracked run (its summary, tags,
artifacts and status) in that same thread, and waits for it at most FINISH_SECONDS. A job that
never trained (a sweep job's config error, workers that crashed while planning) is logged by
`finish` alone. Which store a job logs to: report.job_tracking. Validation, DPO and GRPO figures
are metrics.jsonl records like the others.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Mapping, Protocol

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.fields import apply_fields
from qwen3_neuron.job.settings import TrackingSettings
from qwen3_neuron.run_dir import METRICS_FILE

MAX_SEND_BYTES = 1 << 20  # of metrics.jsonl per send: thousands of records
RETRY_MAX_SECONDS = 60.0  # a failing store is tried again after interval, 2 x interval, ... up to this
FINISH_SECONDS = 120.0  # the end of a job waits this long at most for its last sends

_failed_stores: set[str] = set()  # stores whose failure this process said already


class TrackedRun(Protocol):
    """A run in a tracking store (report.mlflow_tracking.MLflowRun, report.wandb_tracking.WandbRun)."""

    label: str  # the console's name for the store's kind: MLflow, W&B
    store: str  # where it logs, as the console says it
    offset: int  # bytes of metrics.jsonl the run holds (known once it is open)

    def open(self) -> None:
        """Make the run, or continue the one the run dir names (again after a failure)."""

    def send(self, records: list[dict[str, Any]], offset: int) -> None:
        """Log `records`, then note that the run holds metrics.jsonl up to byte `offset`."""

    def close(self, summary: dict[str, Any]) -> None:
        """The job ended with `summary`: what the run still lacks, its status; where it is, on the console."""


def settings_of(composed: Mapping[str, Any] | None, kind: str | None = None) -> TrackingSettings | None:
    """The tracking settings of a composed config when it tracks (as `kind`, if given); None for
    tracking=none, or for a `tracking` section with a mistake (the job names it as a config error)."""
    try:
        settings = apply_fields(TrackingSettings(), (composed or {}).get("tracking") or {}, "tracking")
    except ConfigError:
        return None
    return settings if settings.kind != "none" and kind in (None, settings.kind) else None


class LiveTracking:
    """One run's writer: a thread that follows metrics.jsonl into `run` (module docstring)."""

    def __init__(self, run: TrackedRun, run_dir: Path, interval_seconds: float):
        self.run = run
        self._metrics = run_dir / METRICS_FILE
        self._interval = interval_seconds
        self._opened = False
        self._summary: dict[str, Any] | None = None
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="tracking", daemon=True)

    def start(self) -> None:
        """Follow metrics.jsonl until `finish`."""
        self._thread.start()

    def finish(self, summary: dict[str, Any]) -> None:
        """Send what is left and close the run as `summary` says (waiting FINISH_SECONDS at most)."""
        self._summary = summary
        self._ended.set()
        if not self._thread.is_alive():
            self._thread.start()  # a job that never trained: open, send, close at once
        self._thread.join(FINISH_SECONDS)
        if self._thread.is_alive():
            print(f"[qwen3-neuron] {self.run.label}: {self.run.store} has not taken the end of the run after "
                  f"{FINISH_SECONDS:.0f} s; the launch ends without it (the run dir holds everything: a resume "
                  f"logs what {self.run.label} missed)", file=sys.stderr, flush=True)  # fmt: skip

    def _follow(self) -> None:
        delay = 0.0  # the run is made at once: it shows as running from the start
        while True:
            ended = self._ended.wait(delay)
            try:
                if not self._opened:
                    self.run.open()
                    self._opened = True
                self._send_new()
                if ended:
                    self.run.close(self._summary or {})
                    return
                delay = self._interval
            except Exception as e:  # whatever the client or the network raises: said once, tried again
                say_failure(self.run.label, self.run.store, e)
                if ended:
                    return
                delay = min(max(2 * delay, self._interval), RETRY_MAX_SECONDS)

    def _send_new(self) -> None:
        """Every whole record metrics.jsonl gained since the run's offset, MAX_SEND_BYTES at a time."""
        while True:
            records, offset = new_records(self._metrics, self.run.offset)
            if offset == self.run.offset:
                return
            self.run.send(records, offset)


def new_records(path: Path, start: int, limit: int = MAX_SEND_BYTES) -> tuple[list[dict[str, Any]], int]:
    """The whole records of metrics.jsonl from byte `start` on (at most `limit` bytes of them; a
    line still being written is left for later), and the byte after them. A file shorter than
    `start` is not the one that was counted: read from its start."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = start if start <= size else 0
            f.seek(start)
            data = f.read(limit)
    except FileNotFoundError:
        return [], start
    end = data.rfind(b"\n") + 1
    records = []
    for line in data[:end].splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:  # not a record (a line cut by a full disk): nothing to log
            continue
    return records, start + end


def say_failure(label: str, store: str, error: Exception) -> bool:
    """A store that failed, said once per process; True the first time."""
    if store in _failed_stores:
        return False
    _failed_stores.add(store)
    reason = " ".join(str(error).split()) or type(error).__name__
    if len(reason) > 300:  # a client's request, then the cause at the end (Connection refused)
        reason = f"{reason[:140]} ... {reason[-140:]}"
    print(f"[qwen3-neuron] {label}: could not log to {store} ({reason}); the run goes on, all of it in its run "
          f"dir, and the launcher tries again as it trains (a resume logs what {label} missed)",
          file=sys.stderr, flush=True)  # fmt: skip
    return True


def failed_before(store: str) -> bool:
    """Whether this process said already that `store` failed."""
    return store in _failed_stores
