"""Hydra callbacks (`hydra.callbacks`, selected by `hydra/callbacks=sweep_report` in conf/config.yaml).

SweepReport clears a stale stop note (see qwen3_neuron.report.summary.sweep_job_value) when a multirun
starts, and writes the sweep summary (qwen3_neuron.report.sweep_table) into the sweep dir after every
job, so that it is current even when the sweep stops early (run.stop_on_failure, Ctrl-C, an
Optuna study whose trials all failed), and once more at the end of the multirun, when it also
prints the table. The launch's exit code comes from the jobs' outcomes (`report.outcome`): those
of jobs that ran in this process are launch.py's already; when they all ran elsewhere (submitit),
it reads them from their summaries here and hands them to launch.py (`SweepEnded`).
With tracking=mlflow it also makes the sweep's parent MLflow run when the multirun starts and
ends it when it ends (report.mlflow_tracking); tracking=wandb groups the jobs' runs instead.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from qwen3_neuron.report.mlflow_tracking import sweep_ended, sweep_started
from qwen3_neuron.report.outcome import JobOutcome, SweepEnded
from qwen3_neuron.report.sweep_table import CSV_FILE, MARKDOWN_FILE, PLOT_FILE, collect_jobs, write_report
from qwen3_neuron.report.tracking import settings_of
from qwen3_neuron.run_dir import STOP_FILE

log = logging.getLogger(__name__)


class SweepReport(Callback):
    def __init__(self) -> None:
        self.jobs_ended_here = 0  # a launcher plugin that runs jobs elsewhere ends them in a copy of this

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # a sweep dir reused (a fixed hydra.sweep.dir): an old stop note must not skip new jobs
        (Path(config.hydra.sweep.dir) / STOP_FILE).unlink(missing_ok=True)
        sweep_started(Path(config.hydra.sweep.dir).resolve(), _tracking(config))  # tracking=mlflow: the parent run
        if "optuna" in str(config.hydra.sweeper.get("_target_", "")).lower():
            import optuna  # the sweeper's own import, made a moment earlier

            # Optuna's INFO lines repeat Hydra's ("A new study created in memory" beside "Storage:
            # None"); its warnings (a trial that failed) still show
            optuna.logging.set_verbosity(optuna.logging.WARNING)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN:
            self.jobs_ended_here += 1
            _write(Path(config.hydra.sweep.dir), quiet=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        _write(sweep_dir, quiet=False)
        tracking = _tracking(config)
        if settings_of(tracking, "mlflow") is not None:  # tracking=mlflow: the parent run ends with the sweep
            sweep_ended(sweep_dir.resolve(), tracking, [job.summary["status"] for job in collect_jobs(sweep_dir)])
        if not self.jobs_ended_here:  # submitit ran them: launch.py has none of their outcomes
            raise SweepEnded([JobOutcome.recorded(job.summary) for job in collect_jobs(sweep_dir)])


def _tracking(config: DictConfig) -> dict[str, Any]:
    """The sweep's `tracking` section (tracking=mlflow: report.mlflow_tracking), resolved."""
    try:
        return {"tracking": OmegaConf.to_container(config.tracking, resolve=True)}
    except OmegaConfBaseException:  # each job names the mistake as its config error
        return {}


def _write(sweep_dir: Path, quiet: bool) -> None:
    try:
        write_report(sweep_dir)
    except Exception:  # a report problem must not turn finished training into a failed launch
        log.exception(f"could not write the sweep summary of {sweep_dir}")
        return
    if not quiet:
        print((sweep_dir / MARKDOWN_FILE).read_text(), end="", flush=True)
        print(f"[qwen3-neuron] sweep summary: {', '.join(str(sweep_dir / f) for f in (CSV_FILE, MARKDOWN_FILE, PLOT_FILE))}")
