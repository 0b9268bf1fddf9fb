"""What the launcher says when the workers stop with an error (torchrun's own report and the
workers' tracebacks stay in train.log):

- a mistake the user can fix, recorded by the rank that found it (`worker.failure_record`): its
  sentence (`Data error: ...`), and exit 2 as for every config mistake;
- a crash rank 0 recorded: its error, its traceback's last frames and where the whole one is;
- no record (a worker killed, torchrun's own failure): the end of train.log.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwen3_neuron.launch.process import LaunchResult
from qwen3_neuron.run_dir import FAILURE_FILE, LOG_FILE, read_json

USER_ERROR_EXIT = 2


@dataclass
class WorkersFailed(Exception):
    """The workers stopped with an error: the launch's exit code and what to print."""

    exit_code: int
    message: str


def workers_failed(run_dir: Path, result: LaunchResult, verbose: bool) -> WorkersFailed:
    """Why torchrun exited non-zero (not interrupted), from the workers' record."""
    failure = read_json(run_dir / FAILURE_FILE) or {}
    if failure.get("user_error"):
        return WorkersFailed(USER_ERROR_EXIT, failure["error"])
    exit_code = result.returncode or 1
    where = f"its output ({result.log_error})" if result.log_error else run_dir / LOG_FILE
    if failure.get("traceback_end"):
        return WorkersFailed(exit_code, (
            f"[qwen3-neuron] the job failed: rank {failure['rank']} raised {failure['error']}\n"
            f"{failure['traceback_end']}\n"
            f"[qwen3-neuron] the whole traceback, and torchrun's report: {where}"
        ))  # fmt: skip
    if verbose:  # the output is on screen already
        return WorkersFailed(exit_code, f"[qwen3-neuron] the job failed; its output is above (and in {where})")
    return WorkersFailed(exit_code, f"[qwen3-neuron] the job failed; the end of {where}:\n{result.output_end.rstrip()}")
