"""tracking=mlflow: each run, and each sweep, also in an MLflow tracking store, while it trains.

`MLflowRun` is the store's side of the launcher's writer (report.tracking): the MLflow run is made
(RUNNING) when the workers start, with the resolved job (`job.yaml`) as params with dotted keys;
every `metrics.jsonl` record goes in as step metrics under its own names as the run trains, with
system metrics beside them (report.system_metrics); when the job ends, `job.yaml`,
`trainer_config.json` and `summary.json` as artifacts (`tracking.log_model=true`: the HF export and
a LoRA run's adapter too), tags for the git SHA, the model, the device and the status (a failure's
reason in `error`), and the MLflow status. The launcher sees what no worker does (a config error
that started no worker, the export's and the evaluation's outcome, a crash of rank 0), and the
workers never wait on the network. A launcher killed with kill -9 leaves the run RUNNING with what
it had sent.

A sweep (`-m`, Optuna's included) is one parent run, made when the multirun starts
(`report.hydra_callbacks.SweepReport`), each job's run its child (MLflow's `mlflow.parentRunId`
tag) with `run.objective`'s value as its metric `objective`; the parent gets the sweep's
summary.csv, summary.md and loss.png when the sweep ends. The MLflow run of a run dir (of a sweep
dir) is named in its `mlflow_run.json`, with the store and how much of metrics.jsonl it holds: a
resume, or an extension, continues that run (RUNNING again) and logs the records it does not have yet.

MLflow is imported by tracking=mlflow runs only (seconds of imports), in the writer's thread.
"""

from __future__ import annotations

import getpass
import json
import logging
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from qwen3_neuron.eval.objective import objective_value
from qwen3_neuron.job.settings import TrackingSettings, tracking_store
from qwen3_neuron.report.tracking import failed_before, say_failure, settings_of
from qwen3_neuron.run_dir import (
    JOB_FILE,
    MLFLOW_RUN_FILE,
    SUMMARY_FILE,
    TRAINER_CONFIG_FILE,
    read_json,
    write_json,
)


LINE = "[qwen3-neuron] MLflow"
# MLflow's HTTP client retries a request 7 times with a doubling pause: minutes before a server
# that is down is given up. The user's own MLFLOW_HTTP_REQUEST_* variables win.
FAIL_FAST = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
             "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}  # fmt: skip
RUN_STATUS = {"completed": "FINISHED", "interrupted": "KILLED"}  # any other: FAILED
VERSIONS_FILE = "versions.json"  # job.record's: the git SHA
SWEEP_FILES = ("summary.csv", "summary.md", "loss.png", "optimization_results.yaml")  # the parent's artifacts
MODEL_ARTIFACTS = {"export_dir": "hf_export", "adapter_dir": "peft_adapter"}  # tracking.log_model: field -> folder
MAX_METRICS, MAX_PARAMS = 1000, 100  # MLflow's most per request


class MLflowRun:
    """The MLflow run of the job in `run_dir` (report.tracking.TrackedRun): the one its
    `mlflow_run.json` names in the same store (a resume), else a new one (a sweep job: a child of
    the sweep's). `workers_pid`: torchrun's while the job trains (system metrics), else None."""

    label = "MLflow"

    def __init__(self, settings: TrackingSettings, run_dir: Path, job: Mapping[str, Any], sweep_dir: Path | None,
                 workers_pid: int | None = None):  # fmt: skip
        self.settings, self.run_dir, self.job, self.sweep_dir = settings, run_dir, job, sweep_dir
        self.store = store_name(settings)
        self.offset = 0
        self._workers_pid = workers_pid
        self._store: _Store | None = None
        self._record: dict[str, Any] = {}
        self._system = None

    def open(self) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        store = self._store = _Store(self.settings)
        record = read_json(self.run_dir / MLFLOW_RUN_FILE) or {}
        if record.get("tracking_uri") == store.uri and _exists(store, record["run_id"]):
            store.client.update_run(record["run_id"], status="RUNNING")  # a resume: running again
        else:
            record = _new_run(store, self.run_dir, self.sweep_dir)
        self._record, self.offset = record, record["metrics_bytes"]
        run_id = record["run_id"]
        # params are fixed once logged: a resume adds the keys the run had not (what it changed: job.yaml)
        known = store.client.get_run(run_id).data.params
        params = [Param(k, v) for k, v in job_params(self.job, MAX_PARAM_VAL_LENGTH).items() if k not in known]
        for start in range(0, len(params), MAX_PARAMS):
            store.client.log_batch(run_id, params=params[start : start + MAX_PARAMS])
        if self._workers_pid is not None and self.settings.system_metrics and self._system is None:
            self._start_system_metrics(run_id)

    def _start_system_metrics(self, run_id: str) -> None:
        """Beside the run's metrics while it trains; a monitor that cannot start is said, and the
        run's own metrics go on without it."""
        from qwen3_neuron.report.system_metrics import start_system_metrics

        try:
            self._system = start_system_metrics(self._store.uri, run_id, self.run_dir, self.job, self._workers_pid,
                                                self.settings.interval_seconds)  # fmt: skip
        except Exception as e:  # psutil, a GPU library: never the run's metrics' problem
            self._workers_pid = None  # not tried again
            print(f"{LINE}: no system metrics ({type(e).__name__}: {e})", file=sys.stderr, flush=True)

    def send(self, records: list[dict[str, Any]], offset: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(name, float(value), now, record["step"]) for record in records
                   for name, value in record.items()
                   if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)]  # fmt: skip
        self._log_metrics(entries)
        self._record["metrics_bytes"] = self.offset = offset
        write_json(self.run_dir / MLFLOW_RUN_FILE, self._record)

    def close(self, summary: dict[str, Any]) -> None:
        from mlflow.entities import Metric, RunTag
        from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

        store, run_id = self._store, self._record["run_id"]
        if self._system is not None:
            self._system.finish()
            self._system = None
        objective = (self.job.get("run") or {}).get("objective", "final_loss")
        value = objective_value(summary, objective) if summary.get("status") == "completed" else None
        if isinstance(value, (int, float)) and math.isfinite(value):
            self._log_metrics([Metric("objective", float(value), int(time.time() * 1000), summary.get("steps") or 0)])
        tags = [RunTag(k, str(v)[:MAX_TAG_VAL_LENGTH]) for k, v in _tags(self.run_dir, summary, self.job).items()
                if v is not None]  # fmt: skip
        store.client.log_batch(run_id, tags=tags)
        for name in (JOB_FILE, TRAINER_CONFIG_FILE, SUMMARY_FILE):
            if (self.run_dir / name).exists():
                store.client.log_artifact(run_id, str(self.run_dir / name))
        if self.settings.log_model:
            for field, folder in MODEL_ARTIFACTS.items():
                if summary.get(field):
                    store.client.log_artifacts(run_id, summary[field], folder)
        store.client.set_terminated(run_id, RUN_STATUS.get(summary.get("status"), "FAILED"))
        print(f"{LINE}: {store.where(self._record['experiment_id'], run_id)}", flush=True)

    def _log_metrics(self, entries: list) -> None:
        for start in range(0, len(entries), MAX_METRICS):
            self._store.client.log_batch(self._record["run_id"], metrics=entries[start : start + MAX_METRICS])


def store_name(settings: TrackingSettings) -> str:
    """The store, as the console names it (before MLflow is imported)."""
    return settings.uri or os.environ.get("MLFLOW_TRACKING_URI") or "MLflow's default store"


def sweep_started(sweep_dir: Path, composed: Mapping[str, Any]) -> None:
    """A multirun with tracking=mlflow: its parent run, named in the sweep dir for its jobs."""
    settings = settings_of(composed, "mlflow")
    (sweep_dir / MLFLOW_RUN_FILE).unlink(missing_ok=True)  # a reused sweep dir: not an earlier sweep's parent
    if settings is None:
        return

    def start() -> None:
        store = _Store(settings)
        experiment_id = store.experiment_id()
        name = settings.run_name or "/".join(sweep_dir.parts[-2:])
        tags = {"sweep_dir": str(sweep_dir), **_user()}
        run = store.client.create_run(experiment_id, run_name=name, tags=tags)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_json(sweep_dir / MLFLOW_RUN_FILE, store.record(experiment_id, run.info.run_id))

    _guarded(settings, start)


def sweep_ended(sweep_dir: Path, composed: Mapping[str, Any], statuses: list[str]) -> None:
    """The parent run of a sweep that ended (its jobs' `statuses`): the sweep's table and plot as
    artifacts, FINISHED when every job completed, else FAILED; where it is, on the console."""
    settings, parent = settings_of(composed, "mlflow"), read_json(sweep_dir / MLFLOW_RUN_FILE)
    if settings is None or parent is None:
        return

    def end() -> None:
        store = _Store(settings)
        run_id = parent["run_id"]
        for name in SWEEP_FILES:
            if (sweep_dir / name).exists():
                store.client.log_artifact(run_id, str(sweep_dir / name))
        failed = sum(status != "completed" for status in statuses)
        store.client.set_tag(run_id, "jobs", f"{len(statuses)} jobs, {failed} not completed")
        store.client.set_terminated(run_id, "FAILED" if failed else "FINISHED")
        print(f"{LINE} sweep: {store.where(parent['experiment_id'], run_id)}", flush=True)

    _guarded(settings, end)


def job_params(job: Mapping[str, Any], max_length: int = 6000) -> dict[str, str]:
    """The resolved job as MLflow params: one per leaf, its dotted key, its value as text (a list,
    a number or null as JSON). MLflow keeps `max_length` characters of a value (6000): a longer
    one is cut to that, ending in '...' (job.yaml, an artifact, holds it whole)."""
    params: dict[str, str] = {}

    def walk(key: str, value: Any) -> None:
        if isinstance(value, Mapping):  # an empty section (torchtitan's defaults all kept) says nothing
            for name, item in value.items():
                walk(f"{key}.{name}" if key else str(name), item)
            return
        text = value if isinstance(value, str) else json.dumps(value)
        # MLflow's key characters: letters, digits, _ - . / space and colon
        params[re.sub(r"[^\w\-./ :]", "_", key)] = text if len(text) <= max_length else text[: max_length - 3] + "..."

    walk("", job)
    return params


class _Store:
    """MLflow's client on the store `settings` name (MLflow's own default when none)."""

    def __init__(self, settings: TrackingSettings):
        for name, value in FAIL_FAST.items():
            os.environ.setdefault(name, value)
        # a server's run: MLflow prints its own two "View run" lines; the launch's one line says it
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its database set-up lines, on every new store
        logging.getLogger("alembic").setLevel(logging.WARNING)
        retries = logging.getLogger("urllib3.connectionpool")  # a warning per retry: the writer says a failure
        if _quiet_in_writers not in retries.filters:
            retries.addFilter(_quiet_in_writers)
        self.settings = settings
        self.uri = tracking_store(settings.uri)  # as the job recorded it (a sweep's parent: resolved the same way)
        self.client = MlflowClient(self.uri)

    def experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.settings.experiment)
        return found.experiment_id if found else self.client.create_experiment(self.settings.experiment)

    def record(self, experiment_id: str, run_id: str, metrics_bytes: int = 0) -> dict[str, Any]:
        """What `mlflow_run.json` holds."""
        return {"tracking_uri": self.uri, "experiment_id": experiment_id, "run_id": run_id,
                "metrics_bytes": metrics_bytes}  # fmt: skip

    def where(self, experiment_id: str, run_id: str) -> str:
        """The run's page on a server; in a local store, the run and the command that shows it."""
        if self.uri.startswith(("http://", "https://")):
            return f"{self.uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
        return (f"run {run_id} of experiment '{self.settings.experiment}' in {self.uri} "
                f"(mlflow ui --backend-store-uri {self.uri})")  # fmt: skip


def _quiet_in_writers(record: logging.LogRecord) -> bool:
    """No client retry warnings from the writer's threads (report.tracking, system metrics)."""
    return record.threadName not in ("tracking", "SystemMetricsMonitor")


def _new_run(store: _Store, run_dir: Path, sweep_dir: Path | None) -> dict[str, Any]:
    """A new MLflow run for `run_dir` (a child of its sweep's), named in the run dir at once: a
    later launch continues it whatever happens next."""
    parent = read_json(sweep_dir / MLFLOW_RUN_FILE) if sweep_dir else None
    if parent is not None and parent["tracking_uri"] != store.uri:
        parent = None
    name = store.settings.run_name
    if sweep_dir is not None:
        name = f"{name or '/'.join(sweep_dir.parts[-2:])}/{run_dir.name}"
    tags = {**_user(), **({"mlflow.parentRunId": parent["run_id"]} if parent else {})}
    experiment_id = parent["experiment_id"] if parent else store.experiment_id()
    run = store.client.create_run(experiment_id, run_name=name or "/".join(run_dir.parts[-2:]), tags=tags)
    record = store.record(experiment_id, run.info.run_id)
    write_json(run_dir / MLFLOW_RUN_FILE, record)
    return record


def _exists(store: _Store, run_id: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        return store.client.get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException:  # deleted from the store for good
        return False


def _tags(run_dir: Path, summary: dict[str, Any], job: Mapping[str, Any] | None) -> dict[str, Any]:
    job = job or {}
    model, device = job.get("model") or {}, job.get("device") or {}
    names = [model.get("kind"), model.get("hf_model") if model.get("kind") == "hf" else model.get("flavor")]
    return {
        "status": summary["status"],
        "error": summary.get("error"),
        "model": " ".join(str(name) for name in names if name) or None,
        "device": device.get("type"),
        "ranks": summary.get("ranks"),
        "run_dir": str(run_dir),
        "mlflow.source.git.commit": (read_json(run_dir / VERSIONS_FILE) or {}).get("git_sha"),
    }


def _user() -> dict[str, str]:
    """MLflow's own user tag (its UI's User column), as its fluent API sets it."""
    try:
        return {"mlflow.user": getpass.getuser()}
    except (OSError, KeyError):  # no login name (a container's uid without a passwd entry)
        return {}


def _guarded(settings: TrackingSettings, action: Callable[[], None]) -> None:
    """A sweep's parent run, made or ended by `action`, unless this store failed already in this
    process; a failure (a server that is down or slow, a store that refuses) said once, and the
    launch goes on."""
    store = store_name(settings)
    if failed_before(store):
        return
    retries = logging.getLogger("urllib3.connectionpool")  # a warning per retry: the failure is said below
    level = retries.level
    retries.setLevel(logging.ERROR)
    try:
        action()
    except Exception as e:  # whatever MLflow or the network raises: the run dir keeps everything
        say_failure("MLflow", store, e)
    finally:
        retries.setLevel(level)
