"""The tracking writer of a job (report.tracking), on the store its `tracking` section chooses:
MLflow (report.mlflow_tracking) or W&B (report.wandb_tracking)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from qwen3_neuron.report.mlflow_tracking import MLflowRun
from qwen3_neuron.report.tracking import LiveTracking, TrackedRun, settings_of
from qwen3_neuron.report.wandb_tracking import WandbRun
from qwen3_neuron.run_dir import JOB_FILE, read_job


def job_tracking(run_dir: Path, job: Mapping[str, Any] | None, sweep_dir: Path | None,
                 workers_pid: int | None = None) -> LiveTracking | None:  # fmt: skip
    """The writer of the job in `run_dir` (its settled config `job`; a sweep job: in `sweep_dir`)
    when it tracks, else None. `workers_pid`: torchrun's, while the job trains (system metrics
    follow its ranks); None for a job that never trained."""
    settings = settings_of(job)
    if settings is None:
        return None
    if settings.kind == "mlflow":
        run: TrackedRun = MLflowRun(settings, run_dir, job or {}, sweep_dir, workers_pid)
    else:
        run = WandbRun(settings, run_dir, job or {}, sweep_dir, live=workers_pid is not None)
    return LiveTracking(run, run_dir, settings.interval_seconds)


def track_run(run_dir: Path, summary: dict[str, Any], composed: Mapping[str, Any] | None,
              sweep_dir: Path | None) -> None:  # fmt: skip
    """A job that ended with `summary` without a live writer (it never trained), logged now:
    `composed` stands in for a job.yaml its run dir lacks."""
    job = read_job(run_dir) if (run_dir / JOB_FILE).exists() else composed
    tracking = job_tracking(run_dir, job, sweep_dir)
    if tracking is not None:
        tracking.finish(summary)
