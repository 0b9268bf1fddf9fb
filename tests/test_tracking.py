"""tracking=mlflow|wandb: runs and sweeps in a real MLflow tracking store (a local sqlite one), read
back through MLflow's own client while they train and after; W&B's offline run read back from its
own file; a store that is not there never stops training."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, SWEEP_JOB, command_lines, compose_config, compose_job, launch, read_jsonl
from mlflow.tracking import MlflowClient

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.job import settings as settings_module
from qwen3_neuron.job.settings import TrackingSettings, check_tracking
from qwen3_neuron.report import tracking as tracking_module
from qwen3_neuron.report.mlflow_tracking import job_params, sweep_ended
from qwen3_neuron.report.summary import summarize
from qwen3_neuron.report.system_metrics import RunDirDisk, neuron_figures
from qwen3_neuron.report.job_tracking import job_tracking, track_run
from qwen3_neuron.report.tracking import LiveTracking
from qwen3_neuron.run_dir import complete_steps, read_job

EXPERIMENT = "qwen3-neuron"  # tracking.experiment's default
ONE_RANK = tuple(o for o in SWEEP_JOB if not o.startswith("training.steps="))  # one rank, short steps
SYSTEM = ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes",
          "system/disk_available_megabytes", "system/rank_0/memory_rss_megabytes")  # fmt: skip


@pytest.fixture(scope="module")
def store_tables(tmp_path_factory) -> Path:
    """An MLflow sqlite database with its tables made: MLflow's migrations take seconds, a copy of
    their result milliseconds."""
    database = tmp_path_factory.mktemp("tables") / "mlflow.db"
    MlflowClient(f"sqlite:///{database}").search_experiments()
    return database


def local_store(folder: Path, tables: Path) -> str:
    """A sqlite store holding the experiment, its artifacts in `folder` (MLflow's default for a new
    experiment is ./mlruns in the launch's working dir: here, the repo); its tables a copy of `tables`."""
    shutil.copy(tables, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    MlflowClient(uri).create_experiment(EXPERIMENT, artifact_location=str(folder / "artifacts"))
    return uri


def mlflow_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("[qwen3-neuron] MLflow")]


def record_of(run_dir: Path, name: str = "mlflow_run.json") -> dict | None:
    path = run_dir / name
    return json.loads(path.read_text()) if path.exists() else None


def history(client: MlflowClient, run_id: str, name: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))


def sent_records(run_dir: Path, metrics_bytes: int) -> list[dict]:
    """The records of metrics.jsonl's first `metrics_bytes` bytes: what the store was sent."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes()[:metrics_bytes].splitlines()]


def assert_holds(client: MlflowClient, run_id: str, records: list[dict], unrecorded: list[dict] = ()) -> None:
    """Every record by its own name and step, and nothing else (the steps a resume trains again
    too: one history). A step trained again to the same value, as a resume does, is compared as
    one point: MLflow keeps two equal entries sent apart (their times differ), one sent together.
    `unrecorded`: records the store may hold beyond them (a kill -9 after a send, before its offset
    was written to mlflow_run.json: the resume sends them again, the same points)."""
    names = {name for record in records for name in record} - {"step"}
    for name in names:
        held = set(history(client, run_id, name))
        expected = {(r["step"], r[name]) for r in records if name in r}
        assert expected <= held <= expected | {(r["step"], r[name]) for r in unrecorded if name in r}, name


def wait_for(condition, process: subprocess.Popen, what: str, timeout: float = 300):
    """Poll `condition` while `process` (a launch) runs: never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the launch ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def killed(tmp_path_factory, assets, store_tables):
    """A run of 100 steps tracked to `sqlite:///mlflow.db` (relative, as docs/tracking.md writes
    it) from a launch dir of its own, sent every second, checkpointed every 2 steps: killed -9
    once the store shows, while it trains, 3 steps and system metrics. The run dir, the store (the
    launch dir's mlflow.db) and the launch dir."""
    folder = tmp_path_factory.mktemp("tracked")
    launch_dir = folder / "launch_dir"
    launch_dir.mkdir()
    uri = local_store(launch_dir, store_tables)
    run_dir = folder / "run"
    with (folder / "launch.out").open("w") as out:
        process = subprocess.Popen([sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", *ONE_RANK,
                                    "training.steps=100", "checkpointing=periodic", "checkpoint.interval=2",
                                    "tracking=mlflow", "tracking.uri=sqlite:///mlflow.db",
                                    "tracking.interval_seconds=1"],
                                   cwd=launch_dir, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    client = MlflowClient(uri)

    def live() -> bool:  # steps and system figures in the store while the run trains
        record = record_of(run_dir)
        if record is None or not complete_steps(run_dir / "checkpoint"):  # a resume needs one
            return False
        metrics = client.get_run(record["run_id"]).data.metrics
        return len(history(client, record["run_id"], "loss")) >= 3 and all(name in metrics for name in SYSTEM)

    try:
        wait_for(live, process, "3 steps and system metrics in MLflow")
        assert not (run_dir / "summary.json").exists()  # still training
        workers = [pid for pid, args in command_lines() if str(run_dir) in args and pid != process.pid]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        psutil.wait_procs([psutil.Process(pid) for pid in workers if psutil.pid_exists(pid)], timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    return run_dir, uri, launch_dir


@pytest.mark.integration
def test_each_step_is_in_mlflow_while_it_trains_and_a_kill_9_leaves_the_run_running(killed):
    run_dir, uri, launch_dir = killed
    client = MlflowClient(uri)
    record = record_of(run_dir)
    assert record["tracking_uri"] == f"sqlite:///{launch_dir / 'mlflow.db'}"  # the relative store, made absolute
    run = client.get_run(record["run_id"])
    assert run.info.status == "RUNNING" and run.info.end_time is None  # the launcher never ended it
    sent = sent_records(run_dir, record["metrics_bytes"])
    assert len([r for r in sent if "loss" in r]) >= 3
    assert_holds(client, record["run_id"], sent, unrecorded=read_jsonl(run_dir / "metrics.jsonl")[len(sent):])
    # params from the start: the resolved job, the store as the launch found it
    params = run.data.params
    assert (params["training.steps"], params["tracking.uri"]) == ("100", record["tracking_uri"])
    metrics = run.data.metrics
    assert metrics["system/rank_0/memory_rss_megabytes"] > 100  # a worker with torch loaded
    free = shutil.disk_usage(run_dir).free / 1e6
    assert abs(metrics["system/disk_available_megabytes"] - free) < 0.05 * free  # the run dir's disk


@pytest.mark.integration
def test_a_resume_from_another_directory_continues_the_same_run_in_the_same_store(killed, tmp_path):
    run_dir, uri, launch_dir = killed
    client = MlflowClient(uri)
    run_id = record_of(run_dir)["run_id"]
    system_steps = [m.step for m in client.get_metric_history(run_id, SYSTEM[0])]
    steps = complete_steps(run_dir / "checkpoint")[-1] + 2
    command = [sys.executable, str(REPO / "launch.py"), f"run.resume={run_dir}", f"training.steps={steps}"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert not (tmp_path / "mlflow.db").exists() and record_of(run_dir)["run_id"] == run_id
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert [run.info.run_id for run in client.search_runs([experiment.experiment_id])] == [run_id]
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert {r["step"] for r in records if "loss" in r} == set(range(1, steps + 1))  # no gap
    assert_holds(client, run_id, records)  # the steps trained twice: both values, as metrics.jsonl has them
    summary = json.loads((run_dir / "summary.json").read_text())
    assert history(client, run_id, "objective") == [(steps, summary["final_loss"])]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    resumed_steps = [m.step for m in client.get_metric_history(run_id, SYSTEM[0])]
    assert resumed_steps == sorted(set(resumed_steps)) and resumed_steps[: len(system_steps)] == system_steps
    # params are fixed once logged: the first launch's; the resume's new keys added
    assert set(run.data.params) == set(job_params(read_job(run_dir))) and run.data.params["training.steps"] == "100"
    tags = run.data.tags
    versions = json.loads((run_dir / "versions.json").read_text())
    assert (tags["status"], tags["model"], tags["device"]) == ("completed", "native tiny", "cpu")
    assert tags["mlflow.source.git.commit"] == versions["git_sha"] and tags["mlflow.user"] == getpass.getuser()
    assert run.info.run_name == "/".join(run_dir.parts[-2:])
    artifacts = {artifact.path for artifact in client.list_artifacts(run_id)}
    assert artifacts == {"job.yaml", "trainer_config.json", "summary.json"}
    store = f"sqlite:///{launch_dir / 'mlflow.db'}"
    assert mlflow_lines(output) == [f"[qwen3-neuron] MLflow: run {run_id} of experiment '{EXPERIMENT}' in {store} "
                                    f"(mlflow ui --backend-store-uri {store})"]  # fmt: skip


def test_a_resume_that_changes_a_recorded_key_continues_the_run_with_its_first_value(tmp_path, store_tables):
    """In-process, the launcher's writer for a run and for its resume: the resume's job changed a
    recorded key (training.steps, run.resume) and added one (checkpoint.load_step). The same
    MLflow run goes on, the only one: its params are the first launch's, the new key added (MLflow
    fixes a param once logged; job.yaml, an artifact, holds the change), its history every step."""
    uri = local_store(tmp_path, store_tables)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tracking = {"kind": "mlflow", "uri": uri}
    first = {"tracking": tracking, "training": {"steps": 4}, "run": {"resume": None}}
    resumed = {"tracking": tracking, "training": {"steps": 6}, "run": {"resume": str(run_dir)},
               "checkpoint": {"load_step": 2}}  # fmt: skip
    records = [{"step": s, "loss": 1 / s} for s in range(1, 5)]
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    job_tracking(run_dir, first, None).finish({"status": "interrupted", "steps": 2})
    run_id = record_of(run_dir)["run_id"]
    with metrics.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records[2:]))
    job_tracking(run_dir, resumed, None).finish({"status": "completed", "steps": 4, "final_loss": 0.25})
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert [run.info.run_id for run in client.search_runs([experiment.experiment_id])] == [run_id]
    run = client.get_run(run_id)
    assert run.data.params == {**job_params(resumed), **job_params(first)}
    assert (run.data.params["training.steps"], run.data.params["checkpoint.load_step"]) == ("4", "2")
    assert run.info.status == "FINISHED"
    assert history(client, run_id, "loss") == [(r["step"], r["loss"]) for r in records]


@pytest.mark.integration
def test_a_sweep_is_one_parent_run_with_a_child_per_job(tmp_path, assets, store_tables):
    uri = local_store(tmp_path, store_tables)
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


def test_only_a_completed_run_gets_an_objective_in_mlflow(tmp_path, store_tables):
    """In-process, the end of two sweep jobs that trained the same steps: the one that completed
    gets `run.objective`'s value as its metric `objective`; the one that failed after its steps
    (a crash, the first-loss check) has a final_loss, but no objective to rank it by."""
    uri = local_store(tmp_path, store_tables)
    composed = compose_config("tracking=mlflow", f"tracking.uri={uri}")
    metrics = {}
    for status in ("completed", "failed"):
        run_dir = tmp_path / status
        records = [{"step": s, "loss": 3.0 - s} for s in (1, 2)]
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        summary = summarize(run_dir, status, 1.0, exit_code=0 if status == "completed" else 1)
        assert summary["final_loss"] == 1.0
        track_run(run_dir, summary, composed, None)
        metrics[status] = MlflowClient(uri).get_run(record_of(run_dir)["run_id"]).data.metrics
    assert metrics["completed"]["objective"] == 1.0 and metrics["failed"]["loss"] == 1.0
    assert "objective" not in metrics["failed"]


def test_a_tracking_server_that_is_not_there_is_said_once_and_nothing_is_lost(tmp_path, monkeypatch, capsys, caplog):
    """In-process, the launcher's writer against a port nothing listens on: one line for the whole
    job however often it tries, no retry warnings, no MLflow run recorded, metrics.jsonl as written
    (training itself never waits on the writer: bench/tracking_overhead.py times it)."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")  # one retry: urllib3 would warn of it
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    metrics = run_dir / "metrics.jsonl"
    written = "".join(json.dumps({"step": s, "loss": 1 / s}) + "\n" for s in (1, 2))
    metrics.write_text(written)
    composed = compose_config("tracking=mlflow", f"tracking.uri={uri}", "tracking.interval_seconds=0.2")
    writer = job_tracking(run_dir, composed, None, workers_pid=os.getpid())
    writer.start()
    said, deadline = "", time.monotonic() + 120
    while "could not log" not in said:  # the first failure, said while the job goes on
        assert time.monotonic() < deadline, "the failure was never said"
        time.sleep(0.1)
        said += capsys.readouterr().err
    time.sleep(1)  # tries again meanwhile (0.2 s, 0.4 s, ...): said no more
    writer.finish({"status": "completed", "steps": 2})
    said += capsys.readouterr().err
    (line,) = mlflow_lines(said)
    assert line.startswith(f"[qwen3-neuron] MLflow: could not log to {uri} (") and "Connection refused" in line
    assert line.endswith("the run goes on, all of it in its run dir, and the launcher tries again as it trains "
                         "(a resume logs what MLflow missed)")  # fmt: skip
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]  # urllib3's warning per retry
    assert not (run_dir / "mlflow_run.json").exists() and metrics.read_text() == written


class DownServer:
    """A tracking server that is down: it takes each connection and drops it at once, counting them."""

    def __init__(self):
        self.listening = socket.create_server(("127.0.0.1", 0))
        self.uri = f"http://127.0.0.1:{self.listening.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._drop, daemon=True).start()

    def _drop(self):
        while True:
            try:
                connection, _ = self.listening.accept()
            except OSError:  # closed
                return
            self.connections += 1
            connection.close()


def test_a_store_that_failed_is_not_tried_again_for_the_sweeps_parent_run(tmp_path, monkeypatch, capsys):
    """In-process: the sweep's parent run was made, then its store went down. A job's writer finds
    it down and says so; the sweep's end then does not try it again (each try costs the client's
    retries and timeouts), and says nothing more."""
    monkeypatch.setattr(tracking_module, "_failed_stores", set())  # this test's process, as it were
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    server = DownServer()
    composed = {"tracking": {"kind": "mlflow", "uri": server.uri}}
    sweep_dir, run_dir = tmp_path / "sweep", tmp_path / "sweep" / "0"
    run_dir.mkdir(parents=True)
    parent = {"tracking_uri": server.uri, "experiment_id": "1", "run_id": "0" * 32, "metrics_bytes": 0}
    (sweep_dir / "mlflow_run.json").write_text(json.dumps(parent))
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    try:
        track_run(run_dir, {"status": "completed", "steps": 1}, composed, sweep_dir)
        tried = server.connections
        sweep_ended(sweep_dir, composed, ["completed"])
    finally:
        server.listening.close()
    assert (tried, server.connections) == (1, 1)  # the job's one request (no retries set), none from the sweep's end
    (line,) = mlflow_lines(capsys.readouterr().err)
    assert line.startswith(f"[qwen3-neuron] MLflow: could not log to {server.uri} (")


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
    with pytest.raises(ConfigError, match=r"^tracking=wandb needs the W&B client, which is not installed: pip install"):
        check_tracking(TrackingSettings(kind="wandb"))
    check_tracking(TrackingSettings())  # tracking=none needs nothing


@pytest.mark.parametrize(("overrides", "error"), [
    (["tracking=mlflow", "tracking.uri=mlflow.db"], "tracking.uri=mlflow.db is a path, not a store MLflow can open: "
     "give a URI such as sqlite:///mlflow.db (a database file, no server) or http://127.0.0.1:5000 "
     "(a tracking server)."),
    (["tracking=mlflow", "tracking.uri=./mlruns"], "tracking.uri=./mlruns is a path, not a store MLflow can open"),
    (["tracking=mlflow", "tracking.uri=localhost:5000"], "tracking.uri=localhost:5000 is a path, not a store"),
    (["tracking.uri=sqlite:///mlflow.db"], "tracking.uri=sqlite:///mlflow.db names an MLflow store, and tracking=none "
     "logs nowhere: add tracking=mlflow to log there, or drop tracking.uri."),
    (["tracking=wandb", "+tracking.uri=sqlite:///mlflow.db"],
     "and tracking=wandb logs to W&B (its server: WANDB_BASE_URL)"),
    (["tracking=mlflow", "tracking.log_model=true"], "tracking.log_model=true logs the run's HF export, and this run "
     "writes none: add checkpointing=export_hf"),
    (["tracking=mlflow", "tracking.interval_seconds=0"], "tracking.interval_seconds must be > 0"),
])  # fmt: skip
def test_a_tracking_mistake_is_refused_before_anything_starts(overrides, error):
    with pytest.raises(ConfigError) as refused:
        compose_job(*overrides).settled()  # the launcher, before torchrun starts
    assert str(refused.value).startswith(error) if error.endswith(".") else error in str(refused.value)


def test_the_store_is_recorded_as_the_launch_dir_resolves_it(tmp_path, monkeypatch):
    """A relative database is the launch dir's, for good: job.yaml records it absolute (a resume
    from anywhere logs there); a server's URL, an absolute path and MLflow's own default as they are."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def settled(*overrides: str) -> str:
        return compose_job("tracking=mlflow", *overrides).settled().composed["tracking"]["uri"]

    assert settled("tracking.uri=sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    assert settled("tracking.uri=sqlite:///runs/m.db") == f"sqlite:///{tmp_path}/runs/m.db"
    assert settled("tracking.uri=sqlite:////data/m.db") == "sqlite:////data/m.db"
    assert settled("tracking.uri=http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert settled() == f"sqlite:///{tmp_path}/mlflow.db"  # MLflow's default, in the launch dir
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    assert settled() == f"sqlite:///{tmp_path}/env.db"


def test_a_run_without_tracking_never_imports_mlflow(tmp_path):
    (tmp_path / "job.yaml").write_text("tracking:\n  kind: none\n")
    code = ("import sys; from pathlib import Path; from qwen3_neuron.launch.run_job import run_job; "
            "from qwen3_neuron.report.job_tracking import track_run; "
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


def test_a_run_name_a_failure_a_line_still_being_written_and_the_model(tmp_path, assets, store_tables):
    """In-process: tracking.run_name names the run, a failed job is a FAILED run with its error, and
    a metrics.jsonl line still being written is left for the next log (a resume's);
    tracking.log_model=true logs the export and the adapter of a run that has them."""
    from omegaconf import OmegaConf

    uri = local_store(tmp_path, store_tables)
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
    model_dir = tmp_path / "model"
    for folder, file in (("hf_export", "config.json"), ("peft_adapter", "adapter_config.json")):
        (model_dir / folder).mkdir(parents=True)
        (model_dir / folder / file).write_text("{}")
    composed = compose_config("tracking=mlflow", f"tracking.uri={uri}", "tracking.log_model=true")
    exported = {"status": "completed", "steps": 0, "export_dir": str(model_dir / "hf_export"),
                "adapter_dir": str(model_dir / "peft_adapter")}  # fmt: skip
    (tmp_path / "exported").mkdir()
    track_run(tmp_path / "exported", exported, composed, None)  # a dir without job.yaml: the composed config
    run_id = record_of(tmp_path / "exported")["run_id"]
    client = MlflowClient(uri)
    logged = {a.path for folder in ("hf_export", "peft_adapter") for a in client.list_artifacts(run_id, folder)}
    assert logged == {"hf_export/config.json", "peft_adapter/adapter_config.json"}


class Store:
    """A tracked run (report.tracking.TrackedRun) whose store fails the first `failures` sends, or
    holds each send until `released`."""

    label, store = "Store", "the test's store"

    def __init__(self, failures: int = 0):
        self.offset, self.failures, self.sent, self.closed = 0, failures, [], None
        self.released = threading.Event()
        self.released.set()

    def open(self):
        pass

    def send(self, records, offset):
        self.released.wait()
        if self.failures:
            self.failures -= 1
            raise ConnectionError("Connection refused")
        self.sent += records
        self.offset = offset

    def close(self, summary):
        self.closed = summary


def test_a_failing_store_is_said_once_tried_again_and_sent_every_record_once(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 1 / s}) + "\n" for s in (1, 2)))
    store = Store(failures=3)
    writer = LiveTracking(store, tmp_path, interval_seconds=0.01)
    writer.start()
    with metrics.open("a") as f:
        f.write(json.dumps({"step": 3, "loss": 1 / 3}) + "\n" + '{"step": 4, "lo')  # a line still being written
    whole = len(metrics.read_bytes()) - len('{"step": 4, "lo')
    deadline = time.monotonic() + 60
    while store.offset != whole:  # sent while the run goes on, once the store takes it
        assert time.monotonic() < deadline, "the records never reached the store"
        time.sleep(0.01)
    writer.finish({"status": "completed"})
    assert [r["step"] for r in store.sent] == [1, 2, 3] and store.closed == {"status": "completed"}
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("[qwen3-neuron] Store: could not log to the test's store (Connection refused); the run")


def test_a_store_that_hangs_holds_the_end_of_a_job_for_a_bounded_time(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tracking_module, "FINISH_SECONDS", 1)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    store = Store()
    store.released.clear()  # every send waits
    writer = LiveTracking(store, tmp_path, interval_seconds=0.01)
    started = time.monotonic()
    writer.start()
    writer.finish({"status": "completed"})
    assert time.monotonic() - started < 5 and store.closed is None
    said = capsys.readouterr().err
    assert "[qwen3-neuron] Store: the test's store has not taken the end of the run after 1 s" in said
    store.released.set()  # the writer's thread ends


def test_neuron_monitors_report_as_system_metrics():
    """neuron-monitor's JSON report (AWS's documented example): each NeuronCore's utilization,
    the device memory of every runtime summed."""
    core = {"neuroncore_utilization": 42.01, "loaded_models": ["my_model:my_subgraph1"]}
    runtime = {"neuron_runtime_index": 0, "error": "", "report": {
        "neuroncore_counters": {"period": 1.0, "error": "",
                                "neuroncores_in_use": {"0": core, "1": {**core, "neuroncore_utilization": 7.5}}},
        "memory_used": {"period": 1.0, "neuron_runtime_used_bytes": {"host": 1000000, "neuron_device": 2000000},
                        "loaded_models": [], "error": ""}}}  # fmt: skip
    report = {"neuron_runtime_data": [runtime, {**runtime, "neuron_runtime_index": 1}], "system_data": {}}
    assert neuron_figures(report) == {"neuroncore_0_utilization_percentage": 42.01,
                                      "neuroncore_1_utilization_percentage": 7.5,
                                      "neuron_device_memory_usage_megabytes": 4.0}  # fmt: skip
    assert neuron_figures({"neuron_runtime_data": [], "system_data": {}}) == {}  # no runtime yet


def test_the_disk_figures_are_the_run_dirs_filesystem(tmp_path):
    """MLflow's disk monitor reads `/`; a run dir on another filesystem (here /dev/shm) is what fills."""
    elsewhere = Path("/dev/shm")
    if not elsewhere.is_dir() or elsewhere.stat().st_dev == Path("/").stat().st_dev:
        pytest.skip("no filesystem here other than /'s")
    monitor = RunDirDisk(elsewhere)
    monitor.collect_metrics()
    figures = monitor.aggregate_metrics()
    usage, root = shutil.disk_usage(elsewhere), shutil.disk_usage("/")
    assert abs(figures["disk_available_megabytes"] - usage.free / 1e6) < 0.01 * usage.total / 1e6
    assert abs(figures["disk_available_megabytes"] - root.free / 1e6) > 0.01 * usage.total / 1e6


def wandb_records(run_file: Path) -> list:
    """A W&B run file (`run-<id>.wandb`) as W&B's own protobuf records. Its framing is LevelDB's log
    format: a 7-byte file header, then 32 KiB blocks of chunks, each with a 7-byte header
    (checksum, length, type: 1 whole, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, records, pending, at = run_file.read_bytes(), [], b"", 7
    assert data[:4] == b":W&B"
    while at + 7 <= len(data):
        if (room := 32768 - at % 32768) < 7:  # a block's tail too short for a header: padding
            at += room
            continue
        length, kind = int.from_bytes(data[at + 4 : at + 6], "little"), data[at + 6]
        pending, at = pending + data[at + 7 : at + 7 + length], at + 7 + length
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def wandb_run(folder: Path) -> dict:
    """What a W&B offline run folder holds: its id, project, group, config, logged rows, summary, exit code."""
    (run_file,) = folder.glob("run-*.wandb")
    held = {"rows": [], "summary": {}, "config": {}}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            held.update(id=run.run_id, project=run.project, group=run.run_group, name=run.display_name)
            held["config"].update({item.key: json.loads(item.value_json) for item in run.config.update})
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            held["rows"].append({k: v for k, v in row.items() if not k.startswith("_")})
        elif kind == "summary":
            held["summary"].update({item.key: json.loads(item.value_json) for item in record.summary.update})
        elif kind == "exit":
            held["exit_code"] = record.exit.exit_code
    return held


def test_tracking_wandb_logs_the_run_live_offline_and_a_resume_continues_it(tmp_path, monkeypatch, assets):
    """WANDB_MODE=offline: no network. The job as the run's config, each record while the run
    trains (validation's and GRPO's too), the summary and the exit at the end; a resume: the same
    run (its id kept in wandb_run.json), with the records it had not."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    composed = compose_config("tracking=wandb", "tracking.interval_seconds=0.1", "training.steps=4")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    metrics = run_dir / "metrics.jsonl"
    first = [{"step": 1, "loss": 2.5, "reward": 0.25}, {"step": 2, "loss": 2.0, "reward": 0.5},
             {"step": 2, "val_loss": 2.2, "val_perplexity": 9.0}]  # fmt: skip
    later = [{"step": 3, "loss": 1.5, "reward": 0.75}, {"step": 4, "loss": 1.0, "reward": 1.0}]
    for records, summary in ((first, {"status": "interrupted", "steps": 2}),
                             (later, {"status": "completed", "steps": 4, "final_loss": 1.0})):  # fmt: skip
        writer = job_tracking(run_dir, composed, None, workers_pid=os.getpid())
        writer.start()
        with metrics.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))
        deadline = time.monotonic() + 120
        while (record_of(run_dir, "wandb_run.json") or {}).get("metrics_bytes") != metrics.stat().st_size:
            assert time.monotonic() < deadline, "the records never reached W&B while the run went on"
            time.sleep(0.1)
        writer.finish(summary)
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    run_id = record_of(run_dir, "wandb_run.json")["run_id"]
    assert len(runs) == 2 and all(folder.name.endswith(f"-{run_id}") for folder in runs)  # one W&B run, twice opened
    killed, resumed = wandb_run(runs[0]), wandb_run(runs[1])
    assert (killed["id"], killed["project"], killed["name"]) == (run_id, EXPERIMENT, "/".join(run_dir.parts[-2:]))
    assert killed["config"]["training"] == composed["training"] and killed["config"]["tracking"]["kind"] == "wandb"
    assert killed["rows"] == first and resumed["rows"] == later
    assert (killed["exit_code"], resumed["exit_code"]) == (1, 0)
    assert (resumed["summary"]["status"], resumed["summary"]["objective"]) == ("completed", 1.0)
