"""The run-dir contract: the files the launcher, the workers and the reports share, and how each
is read or written. Both sides of torchrun import this module; it imports nothing of either.

    <run dir>/job.yaml            the resolved composed config; workers rebuild from it
    <run dir>/.plan_ready.<token> the launcher's go to its workers while they run (see below)
    <run dir>/failure.json        rank 0's error and last good checkpoint, when training raised
    <run dir>/train.log           torchrun's whole output
    <run dir>/ranks/              torchrun's per-rank logs
    <run dir>/metrics.jsonl       one record per logged step (rank that torchtitan picks)
    <run dir>/peak_flops.json     the peak MFU is measured against
    <run dir>/memory_estimate.json  the plan's tensor memory estimate per rank
    <run dir>/tensor_memory.json  the tensor memory rank 0 measured while training
    <run dir>/data_stats/rank_N.json  what rank N's data pipeline read, packed, truncated, dropped
    <run dir>/data_cache/         datasets' Arrow cache of local data files (data=text|chat|mix)
    <run dir>/summary.json        how the run ended
    <sweep dir>/.stop_sweep       left by a job that stops the sweep: later jobs skip

The launcher starts torchrun before its plan is done, so that the workers import torchtitan
while it plans. It gives them a handoff (`HANDOFF_ENV`: the device, a token for this launch and
its pid); they import, then wait for `.plan_ready.<token>` before reading job.yaml (one file per
launch: the nodes of a multi-node job may share the run dir). A plan that fails stops them
instead; a launcher that dies is noticed. A worker run by hand from a recorded run dir has no
handoff and reads job.yaml at once.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

JOB_FILE = "job.yaml"
FAILURE_FILE = "failure.json"
LOG_FILE = "train.log"
RANKS_LOG_DIR = "ranks"
METRICS_FILE = "metrics.jsonl"
PEAK_FLOPS_FILE = "peak_flops.json"
MEMORY_ESTIMATE_FILE = "memory_estimate.json"
TENSOR_MEMORY_FILE = "tensor_memory.json"
SUMMARY_FILE = "summary.json"
DATA_STATS_DIR = "data_stats"
STOP_FILE = ".stop_sweep"
HANDOFF_ENV = "QWEN3_NEURON_HANDOFF"

_PLAN_POLL_SECONDS = 0.02
WAITING_LINE = "[qwen3-neuron] workers ready to build; waiting for the launcher's plan"


@dataclass(frozen=True)
class Handoff:
    """What a worker started before the plan was done needs to know meanwhile."""

    device: str  # fixes.install(device) must run before torchtitan is imported
    token: str  # names this launch's ready file
    launcher_pid: int

    def to_env(self) -> dict[str, str]:
        return {HANDOFF_ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls) -> Handoff | None:
        value = os.environ.get(HANDOFF_ENV)
        return cls(**json.loads(value)) if value else None

    def ready_file(self, run_dir: Path) -> Path:
        return run_dir / f".plan_ready.{self.token}"

    def mark_ready(self, run_dir: Path) -> None:
        """Launcher: the plan is recorded; the workers may build."""
        self.ready_file(run_dir).touch()

    def wait_until_ready(self, run_dir: Path) -> None:
        """Worker: return once the launcher marked the plan ready; exit if the launcher is gone
        (a failed plan stops the workers with SIGTERM before that)."""
        ready = self.ready_file(run_dir)
        if not ready.exists() and os.environ.get("LOCAL_RANK") == "0":
            print(WAITING_LINE, flush=True)
        while not ready.exists():
            try:
                os.kill(self.launcher_pid, 0)
            except ProcessLookupError:
                raise SystemExit(f"the launcher (pid {self.launcher_pid}) exited before its plan was ready")
            time.sleep(_PLAN_POLL_SECONDS)


def read_job(run_dir: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf  # the workers' only OmegaConf use: keep it off import

    return OmegaConf.to_container(OmegaConf.load(run_dir / JOB_FILE))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """One record per step, oldest first: the records of a step merged (training, then
    validation's `val_loss`); a resumed run re-logs the steps after its checkpoint: the last
    value of a field wins. A line still being written is skipped."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    by_step = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        by_step.setdefault(record["step"], {}).update(record)
    return [by_step[step] for step in sorted(by_step)]


def read_json(path: Path) -> dict[str, Any] | None:
    """A run-dir JSON file (summary, failure, peak), or None when it is not there."""
    return json.loads(path.read_text()) if path.exists() else None


def write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def complete_steps(checkpoint_folder: Path) -> list[int]:
    """Steps with a finished DCP checkpoint (`step-N/.metadata`, written last), oldest first:
    torchtitan's own rule for which checkpoint it resumes from."""
    if not checkpoint_folder.is_dir():
        return []
    steps = [
        int(p.name.removeprefix("step-"))
        for p in checkpoint_folder.glob("step-*")
        if (p / ".metadata").exists()
    ]
    return sorted(steps)


def write_data_stats(run_dir: Path, rank: int, stats: dict[str, int]) -> None:
    folder = run_dir / DATA_STATS_DIR
    folder.mkdir(exist_ok=True)
    write_json(folder / f"rank_{rank}.json", stats)


def read_data_stats(run_dir: Path) -> dict[str, int] | None:
    """Every rank's data counts added up; None when no rank wrote any (data=tiny, or no run)."""
    folder = run_dir / DATA_STATS_DIR
    files = sorted(folder.glob("rank_*.json")) if folder.is_dir() else []
    if not files:
        return None
    total: dict[str, int] = {}
    for path in files:
        for name, value in json.loads(path.read_text()).items():
            total[name] = total.get(name, 0) + value
    return total
