"""Why a worker stopped, in the run dir's `failure.json`, for the launcher to say on its console
(`launch.workers_failed`) and the summary to keep.

A mistake the user can fix (`ConfigError`, `DataError`) may be found by any rank, and is what
explains the run's end: whichever rank finds one records it, as the sentence the console prints
(`Data error: ...`). A crash (any other exception) is recorded by global rank 0 only, with its
traceback's last frames, and never in place of a user's mistake: the other ranks' errors that
follow one (a collective cut short) say nothing about it.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from qwen3_neuron.errors import user_error_label
from qwen3_neuron.run_dir import FAILURE_FILE, read_json, write_json

TRACEBACK_FRAMES = 3  # of a crash, what the console shows (train.log keeps the whole traceback)


def record_failure(run_dir: Path, error: BaseException, last_checkpoint: str | None) -> None:
    rank = int(os.environ.get("RANK", "0"))
    label = user_error_label(error)
    if label is None and rank != 0:
        return
    earlier = read_json(run_dir / FAILURE_FILE) or {}
    if earlier.get("user_error"):
        return  # another rank found the mistake first
    failure = {
        "error": f"{label}: {error}" if label else f"{type(error).__name__}: {error}",
        "last_checkpoint": last_checkpoint,
        "user_error": label is not None,
        "rank": rank,
        "traceback_end": None if label else _traceback_end(error),
    }
    write_json(run_dir / FAILURE_FILE, failure)
    print(f"[qwen3-neuron] rank {rank} stopped: {failure['error']} Last good checkpoint: "
          f"{last_checkpoint or 'none'}.", file=sys.stderr, flush=True)  # fmt: skip


def stopped_by_signal(error: BaseException) -> bool:
    """torchrun's SignalException: this rank was told to stop (SIGTERM from the launcher or from
    torchrun: after a refused plan, a Ctrl-C), and whoever stopped it says why; not a crash."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    return isinstance(error, SignalException)


def _traceback_end(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)[-TRACEBACK_FRAMES:]
    return "".join([*traceback.format_list(frames), *traceback.format_exception_only(error)]).rstrip("\n")
