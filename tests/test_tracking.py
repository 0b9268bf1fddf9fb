"""tracking=mlflow: runs and sweeps in a real MLflow tracking store (a local sqlite one), read back
through MLflow's own client; a store that is not there never stops training."""

from __future__ import annotations

import getpass
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SWEEP_JOB, compose_config, compose_job, launch, read_jsonl
from mlflow.tracking import MlflowClient

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.job import settings as settings_module
from qwen3_neuron.job.settings import TrackingSettings, check_tracking
from qwen3_neuron.report import mlflow_tracking
from qwen3_neuron.report.mlflow_tracking import job_params
from qwen3_neuron.run_dir import read_job

EXPERIMENT = "qwen3-neuron"  # tracking.experiment's default
ONE_RANK = tuple(o for o in SWEEP_JOB if not o.startswith("training.steps="))  # one rank, short steps


def local_store(folder: Path) -> str:
    """A sqlite store holding the experiment, its artifacts in `folder` (MLflow's default for a new
    experiment is ./mlruns in the launch's working dir: here, the repo)."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    MlflowClient(uri).create_experiment(EXPERIMENT, artifact_location=str(folder / "artifacts"))
    return uri


def mlflow_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("[qwen3-neuron] MLflow")]


def record_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "mlflow_run.json").read_text())


def history(client: MlflowClient, run_id: str, name: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, assets):
    """4 steps with checkpoints at 2 and 4, logged to a local store: the run dir, the store, what
    its launch printed and the job it recorded."""
    folder = tmp_path_factory.mktemp("tracked")
    uri = local_store(folder)
    result = launch(folder / "run", *ONE_RANK, "training.steps=4", "checkpointing=periodic", "checkpoint.interval=2",
                    "tracking=mlflow", f"tracking.uri={uri}")  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder / "run", uri, result.stdout + result.stderr, read_job(folder / "run")


@pytest.mark.integration
def test_a_runs_step_metrics_are_its_metrics_jsonl_and_its_params_the_jobs_keys(tracked):
    run_dir, uri, output, job = tracked
    client = MlflowClient(uri)
    run_id = record_of(run_dir)["run_id"]
    run = client.get_run(run_id)
    records = read_jsonl(run_dir / "metrics.jsonl")
    names = {name for record in records for name in record} - {"step"}
    assert {"loss", "grad_norm", "tokens_per_second", "mfu", "peak_memory_gib"} <= names
    for name in names:  # every record by its own name and step (a resume's too: one history)
        assert history(client, run_id, name) == [(r["step"], r[name]) for r in records if name in r], name
    assert run.data.params == job_params(job)  # the resolved job, dotted keys
    params = run.data.params
    assert (params["training.steps"], params["tracking.kind"], params["model.flavor"]) == ("4", "mlflow", "tiny")
    tags = run.data.tags
    versions = json.loads((run_dir / "versions.json").read_text())
    assert (tags["status"], tags["model"], tags["device"]) == ("completed", "native tiny", "cpu")
    assert tags["mlflow.source.git.commit"] == versions["git_sha"] and tags["mlflow.user"] == getpass.getuser()
    assert run.info.status == "FINISHED" and run.info.run_name == "/".join(run_dir.parts[-2:])
    artifacts = {artifact.path for artifact in client.list_artifacts(run_id)}
    assert artifacts == {"job.yaml", "trainer_config.json", "summary.json"}
    # the end of the launch says where the run is, once
    assert mlflow_lines(output) == [f"[qwen3-neuron] MLflow: run {run_id} of experiment '{EXPERIMENT}' in {uri} "
                                    f"(mlflow ui --backend-store-uri {uri})"]  # fmt: skip


@pytest.mark.integration
def test_a_resume_continues_the_same_mlflow_run(tracked):
    run_dir, uri, _, _ = tracked
    client = MlflowClient(uri)
    run_id = record_of(run_dir)["run_id"]
    result = launch(None, f"run.resume={run_dir}", "training.steps=6")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert record_of(run_dir)["run_id"] == run_id
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert [run.info.run_id for run in client.search_runs([experiment.experiment_id])] == [run_id]
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # the resume from step 4 re-logged none
    assert history(client, run_id, "loss") == [(r["step"], r["loss"]) for r in records]
    summary = json.loads((run_dir / "summary.json").read_text())
    first_final_loss = history(client, run_id, "loss")[3][1]  # the extension appends its objective at step 6
    assert history(client, run_id, "objective") == [(4, first_final_loss), (6, summary["final_loss"])]
    assert client.get_run(run_id).info.status == "FINISHED"


@pytest.mark.integration
def test_a_sweep_is_one_parent_run_with_a_child_per_job(tmp_path, assets):
    uri = local_store(tmp_path)
    sweep_dir = tmp_path / "sweep"
    # job 1 is a config error (model.top_k is a MoE key), found before it starts anything
    result = launch(None, "-m", f"hydra.sweep.dir={sweep_dir}", "model.top_k=null,1", *SWEEP_JOB,
                    "tracking=mlflow", f"tracking.uri={uri}")  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]  # a job failed
    client = MlflowClient(uri)
    parent_id = record_of(sweep_dir)["run_id"]
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = {run.info.run_id: run for run in client.search_runs([experiment.experiment_id])}
    children = {Path(run.data.tags["run_dir"]).name: run for run in runs.values() if run.info.run_id != parent_id}
    assert len(runs) == 3 and {run.data.tags["mlflow.parentRunId"] for run in children.values()} == {parent_id}
    by_top_k = {run.data.params["model.top_k"]: (name, run) for name, run in children.items()}  # the failed job's too
    (trained_dir, trained), (failed_dir, failed) = by_top_k["null"], by_top_k["1"]
    trained_summary = json.loads((sweep_dir / trained_dir / "summary.json").read_text())
    assert trained.info.status == "FINISHED" and trained.data.metrics["objective"] == trained_summary["final_loss"]
    records = read_jsonl(sweep_dir / trained_dir / "metrics.jsonl")
    assert history(client, trained.info.run_id, "loss") == [(r["step"], r["loss"]) for r in records]
    failed_summary = json.loads((sweep_dir / failed_dir / "summary.json").read_text())
    assert failed.info.status == "FAILED" and "objective" not in failed.data.metrics
    assert failed.data.tags["status"] == "failed" and failed.data.tags["error"] == failed_summary["error"]
    assert failed_summary["error"].startswith("config error: model.top_k applies to model=moe only")
    parent = runs[parent_id]
    assert parent.info.status == "FAILED"  # not every job completed
    artifacts = {artifact.path for artifact in client.list_artifacts(parent_id)}
    assert artifacts == {"summary.csv", "summary.md", "loss.png"}
    lines = mlflow_lines(output)
    assert f"[qwen3-neuron] MLflow sweep: run {parent_id} of experiment '{EXPERIMENT}' in {uri} " \
           f"(mlflow ui --backend-store-uri {uri})" == lines[-1]  # fmt: skip
    assert sorted(line.split()[3] for line in lines[:-1]) == sorted(run.info.run_id for run in children.values())


@pytest.mark.integration
def test_a_tracking_server_that_is_not_there_is_said_once_and_training_goes_on(tmp_path, assets):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    fail_fast = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"}
    result = launch(tmp_path / "run", *ONE_RANK, "training.steps=2", "tracking=mlflow", f"tracking.uri={uri}",
                    env=fail_fast)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["steps"]) == ("completed", 2)
    (line,) = mlflow_lines(output)
    assert line.startswith(f"[qwen3-neuron] MLflow: could not log to {uri} (") and "Connection refused" in line
    assert line.endswith("the run goes on without MLflow, all of it in its run dir (a resume logs what MLflow missed)")
    assert "Retrying" not in output  # urllib3's warning per retry: the one line says it
    assert not (tmp_path / "run" / "mlflow_run.json").exists()


def test_params_are_the_jobs_leaves_by_dotted_key_cut_to_mlflows_limit():
    job = {"training": {"steps": 4, "seq_len": 64}, "profiler": {}, "run": {"resume": None},
           "data": {"files": ["a.jsonl", "b.jsonl"], "name": "x" * 7000}}  # fmt: skip
    params = job_params(job)
    assert set(params) == {"training.steps", "training.seq_len", "run.resume", "data.files", "data.name"}
    assert (params["training.steps"], params["run.resume"]) == ("4", "null")
    assert params["data.files"] == '["a.jsonl", "b.jsonl"]'
    assert len(params["data.name"]) == 6000 and params["data.name"].endswith("x...")


def test_a_misspelled_tracking_key_and_a_missing_client_are_config_errors(monkeypatch):
    with pytest.raises(ConfigError, match=r"Unknown config key 'tracking.urii'. Did you mean 'uri'\?"):
        compose_job("tracking=mlflow", "tracking.urii=sqlite:///x.db")
    assert compose_job("tracking=mlflow").settings.tracking == TrackingSettings(kind="mlflow")
    monkeypatch.setattr(settings_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"tracking=mlflow needs MLflow's client, which is not installed"):
        check_tracking(TrackingSettings(kind="mlflow"))
    check_tracking(TrackingSettings())  # tracking=none needs nothing


def test_a_run_without_tracking_never_imports_mlflow(tmp_path):
    (tmp_path / "job.yaml").write_text("tracking:\n  kind: none\n")
    code = ("import sys; from pathlib import Path; from qwen3_neuron.launch.run_job import run_job; "
            "from qwen3_neuron.report.mlflow_tracking import track_run; "
            f"track_run(Path({str(tmp_path)!r}), {{'status': 'completed'}}, None, None); "
            "print('mlflow' in sys.modules)")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout == "False\n"


def test_a_resume_keeps_the_recorded_tracking_unless_it_sets_tracking(tmp_path):
    """A tracked run's resume logs on to its store without restating it; a resume may start
    tracking an untracked run, or move it to another store."""
    from omegaconf import OmegaConf

    from qwen3_neuron.launch.resume import resumed_config

    uri = "sqlite:///recorded.db"
    OmegaConf.save(OmegaConf.create(compose_config("checkpointing=periodic", "tracking=mlflow", f"tracking.uri={uri}")),
                   tmp_path / "job.yaml")  # fmt: skip
    (tmp_path / "trainer_config.json").write_text("{}")
    (tmp_path / "checkpoint" / "step-2").mkdir(parents=True)
    (tmp_path / "checkpoint" / "step-2" / ".metadata").touch()
    other = "sqlite:///other.db"
    for typed, expected in [([], ("mlflow", uri)), ([f"tracking.uri={other}"], ("mlflow", other)),
                            (["tracking=none"], ("none", None))]:  # fmt: skip
        typed = [f"run.resume={tmp_path}", "training.steps=4", *typed]
        tracking = resumed_config(tmp_path, compose_config(*typed), typed)["tracking"]
        assert (tracking["kind"], tracking.get("uri")) == expected


def test_a_run_name_a_failure_and_a_line_still_being_written(tmp_path, assets):
    """In-process: tracking.run_name names the run, a failed job is a FAILED run with its error, and
    a metrics.jsonl line still being written is left for the next log (a resume's)."""
    from omegaconf import OmegaConf

    from qwen3_neuron.report.mlflow_tracking import track_run

    uri = local_store(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    composed = compose_config("tracking=mlflow", f"tracking.uri={uri}", "tracking.run_name=lr-3e-4")
    OmegaConf.save(OmegaConf.create(composed), run_dir / "job.yaml")
    whole = '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.0}\n'
    (run_dir / "metrics.jsonl").write_text(whole + '{"step": 3, "lo')
    track_run(run_dir, {"status": "failed", "error": "RuntimeError: boom", "steps": 2}, None, None)
    record = record_of(run_dir)
    run = MlflowClient(uri).get_run(record["run_id"])
    assert (run.info.run_name, run.info.status, run.data.tags["error"]) == ("lr-3e-4", "FAILED", "RuntimeError: boom")
    assert history(MlflowClient(uri), record["run_id"], "loss") == [(1, 2.5), (2, 2.0)]
    assert record["metrics_bytes"] == len(whole)
