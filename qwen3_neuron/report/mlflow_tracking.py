"""tracking=mlflow: each run, and each sweep, also in an MLflow tracking store.

One writer, the launcher, once a job has ended, from what its run dir holds: every
`metrics.jsonl` record as step metrics under its own names, the resolved job (`job.yaml`) as
params with dotted keys, `job.yaml`, `trainer_config.json` and `summary.json` as artifacts, and tags for the git SHA,
the model, the device and the status (a failure's reason in `error`). The launcher sees what no
worker does (a config error that started no worker, the export's and the evaluation's outcome, a
crash of rank 0), and the workers never wait on the network: a store that is down or slow is
said once on the console and the launch goes on, its run dir complete as always.

A sweep (`-m`, Optuna's included) is one parent run, made when the multirun starts
(`report.hydra_callbacks.SweepReport`), each job's run its child (MLflow's `mlflow.parentRunId`
tag) with `run.objective`'s value as its metric `objective`; the parent gets the sweep's
summary.csv, summary.md and loss.png when the sweep ends. The MLflow run of a run dir (of a sweep
dir) is named in its `mlflow_run.json`, with how much of metrics.jsonl it holds: a resume, or an
extension, continues that run and logs the records it does not have yet.

MLflow is imported by tracking=mlflow runs only (seconds of imports).
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

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.job.settings import TrackingSettings
from qwen3_neuron.eval.objective import objective_value
from qwen3_neuron.fields import apply_fields
from qwen3_neuron.run_dir import (
    JOB_FILE,
    METRICS_FILE,
    MLFLOW_RUN_FILE,
    SUMMARY_FILE,
    TRAINER_CONFIG_FILE,
    read_job,
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

_given_up: set[str] = set()  # stores this process failed to log to: said once, not tried again


def settings_of(composed: Mapping[str, Any] | None) -> TrackingSettings | None:
    """tracking=mlflow's settings in a composed config; None for tracking=none, or for a
    `tracking` section with a mistake (the job names it as a config error)."""
    try:
        settings = apply_fields(TrackingSettings(), (composed or {}).get("tracking") or {}, "tracking")
    except ConfigError:
        return None
    return settings if settings.kind == "mlflow" else None


def track_run(run_dir: Path, summary: dict[str, Any], composed: Mapping[str, Any] | None,
              sweep_dir: Path | None) -> None:  # fmt: skip
    """The job that ended in `run_dir` with `summary`, logged to its MLflow run when it runs with
    tracking=mlflow: the run its `mlflow_run.json` names (a resume), else a new one (in a sweep,
    a child of the sweep's). `composed`: the job's config as Hydra composed it, for a job whose
    run dir has no job.yaml (a sweep job's config error, a crash before the plan)."""
    job = _read_job(run_dir) or composed
    settings = settings_of(job)
    if settings is not None:
        _guarded(settings, lambda: _log_run(_Store(settings), run_dir, summary, job, sweep_dir))


def sweep_started(sweep_dir: Path, composed: Mapping[str, Any]) -> None:
    """A multirun with tracking=mlflow: its parent run, named in the sweep dir for its jobs."""
    settings = settings_of(composed)
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
    settings, parent = settings_of(composed), read_json(sweep_dir / MLFLOW_RUN_FILE)
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
        import mlflow
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its database set-up lines, on every new store
        logging.getLogger("alembic").setLevel(logging.WARNING)
        self.settings = settings
        self.uri = settings.uri or mlflow.get_tracking_uri()
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


def _log_run(store: _Store, run_dir: Path, summary: dict[str, Any], job: Mapping[str, Any] | None,
             sweep_dir: Path | None) -> None:  # fmt: skip
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH

    record = read_json(run_dir / MLFLOW_RUN_FILE) or {}
    if record.get("tracking_uri") != store.uri or not _exists(store, record["run_id"]):
        record = _new_run(store, run_dir, sweep_dir)
    run_id = record["run_id"]
    now = int(time.time() * 1000)
    metrics, logged = _new_records(run_dir, record["metrics_bytes"])
    entries = [Metric(name, float(value), now, step["step"]) for step in metrics for name, value in step.items()
               if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)]  # fmt: skip
    objective = ((job or {}).get("run") or {}).get("objective", "final_loss")
    value = objective_value(summary, objective) if summary["status"] == "completed" else None
    if isinstance(value, (int, float)) and math.isfinite(value):
        entries.append(Metric("objective", float(value), now, summary.get("steps") or 0))
    for start in range(0, len(entries), 1000):  # MLflow's most metrics per request
        store.client.log_batch(run_id, metrics=entries[start : start + 1000])
    record["metrics_bytes"] = logged
    write_json(run_dir / MLFLOW_RUN_FILE, record)
    # params are fixed once logged: a resume adds the keys the run had not (what it changed: job.yaml)
    known = store.client.get_run(run_id).data.params
    params = [Param(k, v) for k, v in job_params(job or {}, MAX_PARAM_VAL_LENGTH).items() if k not in known]
    for start in range(0, len(params), 100):  # MLflow's most params per request
        store.client.log_batch(run_id, params=params[start : start + 100])
    tags = [RunTag(k, str(v)[:MAX_TAG_VAL_LENGTH]) for k, v in _tags(run_dir, summary, job).items() if v is not None]
    store.client.log_batch(run_id, tags=tags)
    for name in (JOB_FILE, TRAINER_CONFIG_FILE, SUMMARY_FILE):
        if (run_dir / name).exists():
            store.client.log_artifact(run_id, str(run_dir / name))
    store.client.set_terminated(run_id, RUN_STATUS.get(summary["status"], "FAILED"))
    print(f"{LINE}: {store.where(record['experiment_id'], run_id)}", flush=True)


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


def _new_records(run_dir: Path, start: int) -> tuple[list[dict[str, Any]], int]:
    """The records of metrics.jsonl from byte `start` on (whole lines), and the byte after them."""
    path = run_dir / METRICS_FILE
    data = path.read_bytes() if path.exists() else b""
    if start > len(data):  # not the file the record counted
        start = 0
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[start:end].splitlines() if line.strip()], max(end, start)


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


def _read_job(run_dir: Path) -> dict[str, Any] | None:
    return read_job(run_dir) if (run_dir / JOB_FILE).exists() else None


def _guarded(settings: TrackingSettings, action: Callable[[], None]) -> None:
    """`action`, unless logging to this store failed already in this process; a failure (a server
    that is down or slow, a store that refuses) said once, and the launch goes on."""
    store = settings.uri or os.environ.get("MLFLOW_TRACKING_URI") or "MLflow's default store"
    if store in _given_up:
        return
    retries = logging.getLogger("urllib3.connectionpool")  # a warning per retry: the failure is said below
    level = retries.level
    retries.setLevel(logging.ERROR)
    try:
        action()
    except Exception as e:  # whatever MLflow or the network raises: the run dir keeps everything
        _given_up.add(store)
        reason = " ".join(str(e).split()) or type(e).__name__
        if len(reason) > 300:  # MLflow's request, then the cause at the end (Connection refused)
            reason = f"{reason[:140]} ... {reason[-140:]}"
        print(f"{LINE}: could not log to {store} ({reason}); the run goes on without MLflow, all of it "
              "in its run dir (a resume logs what MLflow missed)", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        retries.setLevel(level)
