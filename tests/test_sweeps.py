"""Sweeps and reporting: a multirun that keeps going past a failed job, the sweep summary (CSV,
Markdown, loss plot), Optuna, live progress, and MFU against the measured peak."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SWEEP_JOB, compose_job, plan_of, read_jsonl
from hydra import compose, initialize_config_dir

from qwen3_neuron.job.record import training_dtype
from qwen3_neuron.launch import hydra_setup as project_compose
from qwen3_neuron.launch.progress import Progress
from qwen3_neuron.report.outcome import JobOutcome, launch_exit_code
from qwen3_neuron.report.peak_flops import PeakFlops, cache_path, peak_flops
from qwen3_neuron.report.summary import JobFailed, crash_error, summarize, summary_lines, sweep_job_value
from qwen3_neuron.report.sweep_table import COLUMNS, read_overrides, write_report
from qwen3_neuron.run_dir import write_data_stats

# tiny and quick: every job of these sweeps starts one rank for three short steps
SMALL = SWEEP_JOB
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def multirun(sweep_dir: Path, *overrides: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`python launch.py -m ...` with its sweep dir pinned to `sweep_dir`."""
    return subprocess.run(
        [sys.executable, str(REPO / "launch.py"), "-m", f"hydra.sweep.dir={sweep_dir}", *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def csv_rows(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


# ---- a 4-job multirun with one bad combination ------------------------------------------------


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, assets):
    # model.top_k is a MoE key: model=native with model.top_k=1 fails at plan, the other three train
    sweep_dir = tmp_path_factory.mktemp("sweep") / "multirun"
    result = multirun(sweep_dir, "model=native,moe", "model.top_k=null,1", *SMALL)
    return sweep_dir, result


@pytest.mark.integration
def test_the_sweep_goes_on_past_a_failed_job_and_exits_1(sweep):
    sweep_dir, result = sweep
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    summaries = {d.name: summary_of(d) for d in sorted(sweep_dir.iterdir()) if d.is_dir()}
    assert sorted(summaries) == ["0", "1", "2", "3"]  # one dir per job, none shared
    statuses = {name: s["status"] for name, s in summaries.items()}
    assert statuses == {"0": "completed", "1": "failed", "2": "completed", "3": "completed"}
    failed = summaries["1"]
    assert failed["exit_code"] == 2 and failed["steps"] == 0 and failed["final_loss"] is None
    assert failed["error"].startswith("config error: model.top_k applies to model=moe only")
    for name in ("0", "2", "3"):
        assert summaries[name]["steps"] == 3 and summaries[name]["error"] is None
        assert summaries[name]["final_loss"] < summaries[name]["first_loss"]


@pytest.mark.integration
def test_summary_csv_holds_each_jobs_summary_and_the_overrides_that_differ(sweep):
    sweep_dir, _ = sweep
    rows = csv_rows(sweep_dir / "summary.csv")
    assert list(rows[0]) == ["job", "model", "model.top_k", *COLUMNS, "run_dir"]  # training.steps=3 etc. are the same for all
    assert [(r["job"], r["model"], r["model.top_k"]) for r in rows] == [
        ("0", "native", "null"), ("1", "native", "1"), ("2", "moe", "null"), ("3", "moe", "1"),
    ]  # fmt: skip
    for row in rows:
        summary = summary_of(sweep_dir / row["run_dir"])
        for column in COLUMNS:
            expected, cell = summary[column], row[column]
            if expected is None:
                assert cell == "", (row["job"], column)
            elif isinstance(expected, (int, float)):
                assert float(cell) == expected, (row["job"], column)  # exact: floats in full
            else:
                assert cell == expected, (row["job"], column)
    markdown = (sweep_dir / "summary.md").read_text()
    assert "4 jobs, 3 completed, 1 failed." in markdown
    assert "| 1 | native | 1 | failed |" in markdown and "model.top_k applies to model=moe only" in markdown


@pytest.mark.integration
def test_loss_png_is_a_png_with_every_trained_jobs_curve(sweep):
    from PIL import Image

    sweep_dir, _ = sweep
    path = sweep_dir / "loss.png"
    assert path.read_bytes()[:8] == PNG_MAGIC
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (900, 550)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # axes, text and curves, not a blank canvas


@pytest.mark.integration
def test_progress_lines_on_screen_and_torchtitans_log_only_in_train_log(sweep):
    sweep_dir, result = sweep
    for job in ("#0", "#2", "#3"):
        assert f"[qwen3-neuron] {job}  step 3/3  loss " in result.stdout
    assert "[titan]" not in result.stdout  # run.verbose=false: the full log is in the run dir
    assert "step:  1" in (sweep_dir / "0" / "train.log").read_text()
    assert "[qwen3-neuron] sweep summary:" in result.stdout


@pytest.mark.integration
def test_mfu_is_against_the_measured_peak_and_consistent_with_tokens_per_second(sweep):
    sweep_dir, _ = sweep
    for name in ("0", "2", "3"):
        run_dir = sweep_dir / name
        summary = summary_of(run_dir)
        peak = json.loads((run_dir / "peak_flops.json").read_text())
        trained_in = json.loads((run_dir / "trainer_config.json").read_text())["training"]["mixed_precision_param"]
        # the probe measures the dtype the matmuls ran in (float32 where this CPU emulates bf16)
        assert peak["source"] == "measured" and peak["device"] == "cpu" and peak["dtype"] == trained_in
        # one rank: it runs with every core, and the probe measured with the same thread count
        assert peak["ranks"] == summary["ranks"] == 1 and peak["threads"] >= 1
        # the machine's cached measurement for this dtype and thread count (which only ever rises)
        cached = [e for e in json.loads(cache_path().read_text()).values()
                  if (e["device"], e["dtype"], e["threads"]) == ("cpu", trained_in, peak["threads"])]  # fmt: skip
        assert cached and 0 < peak["flops_per_second"] <= max(e["flops_per_second"] for e in cached)
        assert peak["flops_per_second"] != 312e12  # never torchtitan's A100 fallback
        assert summary["peak_flops_per_rank"] == peak["flops_per_second"]
        assert summary["mfu"] > 0 and summary["flops_per_token"] > 0
        expected = summary["flops_per_token"] * summary["tokens_per_second"] / (peak["flops_per_second"] * peak["ranks"])
        assert summary["mfu"] == pytest.approx(expected, rel=1e-12)
        for record in read_jsonl(run_dir / "metrics.jsonl"):  # per step, per device: the same ratio
            per_device = record["flops_per_token"] * record["tps_per_device"] / peak["flops_per_second"]
            assert record["mfu"] == pytest.approx(per_device, rel=1e-9)
            assert record["tokens_per_second"] == pytest.approx(record["tps_per_device"] * peak["ranks"])


@pytest.mark.integration
def test_sweep_report_command_rebuilds_the_same_csv(sweep):
    sweep_dir, _ = sweep
    written = (sweep_dir / "summary.csv").read_text()
    for name in ("summary.csv", "summary.md", "loss.png"):
        (sweep_dir / name).unlink()
    result = subprocess.run(
        [sys.executable, "-m", "qwen3_neuron.report.sweep_table", str(sweep_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (sweep_dir / "summary.csv").read_text() == written
    assert (sweep_dir / "loss.png").read_bytes()[:8] == PNG_MAGIC
    assert "| 1 | native | 1 | failed |" in result.stdout


@pytest.mark.integration
def test_stop_on_failure_stops_the_sweep_at_the_failed_job(tmp_path, assets):
    sweep_dir = tmp_path / "multirun"
    # job 0 fails in the launcher's settings check (model.top_k is a MoE key), before any torchrun
    result = multirun(sweep_dir, "model.top_k=1,null", "run.stop_on_failure=true", *SMALL)
    assert result.returncode == 1
    assert "JobFailed" in result.stderr or "JobFailed" in result.stdout
    assert summary_of(sweep_dir / "0")["status"] == "failed"
    skipped = summary_of(sweep_dir / "1")  # Hydra launched it (same batch); it did not start
    assert skipped["status"] == "skipped" and skipped["error"].startswith("not run: job #0 failed: config error")
    assert not (sweep_dir / "1" / "train.log").exists()
    assert [r["status"] for r in csv_rows(sweep_dir / "summary.csv")] == ["failed", "skipped"]
    assert "The sweep stopped early: job #0 failed" in (sweep_dir / "summary.md").read_text()


# ---- Optuna --------------------------------------------------------------------------------------


@pytest.mark.integration
def test_optuna_reports_the_best_trial_and_a_failed_trial_as_failed(tmp_path, assets):
    sweep_dir = tmp_path / "optuna"
    # TPE's seeded start-up draws (optuna 2.10.1): trial 0 nosuch (fails at plan), trial 1 tiny.
    # Not the grid sampler: hydra-optuna-sweeper 1.3.0 crashes when a grid's last trial fails
    # ("Study.stop is supposed to be invoked inside an objective function or a callback").
    storage = f"sqlite:///{tmp_path / 'study.db'}"  # a persistent study (docs/sweeps.md)
    result = multirun(
        sweep_dir, "hydra/sweeper=optuna", "hydra.sweeper.sampler.seed=0", "hydra.sweeper.n_trials=2",
        f"hydra.sweeper.storage={storage}", "hydra.sweeper.study_name=flavors",
        "model.flavor=choice(tiny,nosuch)", "run.verbose=true", *SMALL,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]  # a trial failed
    by_flavor = {yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text())[0]: summary_of(d)
                 for d in sweep_dir.iterdir() if d.is_dir()}  # fmt: skip
    assert set(by_flavor) == {"model.flavor=tiny", "model.flavor=nosuch"}
    trained, failed = by_flavor["model.flavor=tiny"], by_flavor["model.flavor=nosuch"]
    assert trained["status"] == "completed" and failed["status"] == "failed"
    # the failed trial returned None: Optuna marked it FAIL rather than scoring it
    assert "Failed experiment: Return value must be float-castable. Got 'None'" in output
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["best_params"] == {"model.flavor": "tiny"}
    assert results["best_value"] == trained["final_loss"]  # run.objective=final_loss, not 0
    assert "Optuna best value:" in (sweep_dir / "summary.md").read_text()
    assert "step:  3" in result.stdout  # run.verbose=true: torchtitan's log on screen
    # nothing a user has to learn to ignore: Optuna's INFO lines repeat Hydra's; no Python warning
    # (a plot legend of every override once crushed the axes)
    assert [line for line in result.stderr.splitlines() if line.startswith("[I ")] == []
    assert "constrained_layout not applied" not in output and "[HYDRA] Storage: sqlite:///" in result.stdout
    # the study outlives the sweep: both trials in the sqlite file, as Optuna recorded them
    import optuna

    study = optuna.load_study(study_name="flavors", storage=storage)
    states = {trial.params["model.flavor"]: (trial.state.name, trial.value) for trial in study.trials}
    assert states == {"tiny": ("COMPLETE", trained["final_loss"]), "nosuch": ("FAIL", None)}


def test_the_optuna_example_composes_into_a_search_space_the_plan_accepts(tmp_path, assets):
    with initialize_config_dir(config_dir=str(project_compose.CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=optuna_lr"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "minimize"
    assert cfg.hydra.callbacks.sweep_report._target_ == "qwen3_neuron.report.hydra_callbacks.SweepReport"
    assert set(sweeper.params) == {"optimizer.lr", "optimizer.weight_decay", "lr_scheduler.warmup_steps"}
    # one point of the space: every searched key is a key the plan knows
    plan = plan_of(
        compose_job("experiment=optuna_lr", "optimizer.lr=1e-3", "optimizer.weight_decay=0.05",
                       "lr_scheduler.warmup_steps=2"),
        tmp_path / "run",
    )  # fmt: skip
    assert plan.trainer_config.optimizer.param_groups[0].optimizer_kwargs["lr"] == 1e-3
    assert plan.settings.run.objective == "final_loss"


# ---- units: report, progress, peak ---------------------------------------------------------------


def write_records(run_dir: Path, records: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_launch_exits_with_a_single_runs_code_and_1_for_a_sweep_with_a_job_that_did_not_complete():
    assert [launch_exit_code([JobOutcome(code, single_run=True)]) for code in (0, 1, 2)] == [0, 1, 2]
    done, config_error = JobOutcome(0, single_run=False, objective=3.2), JobOutcome(2, single_run=False)
    assert launch_exit_code([done, done]) == 0  # dry runs too: they end with 0
    assert launch_exit_code([done, config_error]) == 1
    assert launch_exit_code([]) == 0  # --cfg job, --help: no job ran


def test_a_failed_jobs_error_is_the_workers_own_else_the_first_traceback_of_its_log(tmp_path):
    write_records(tmp_path, [{"step": 1, "loss": 7.6}])
    (tmp_path / "train.log").write_text(
        "[rank0]:[rank0]: Traceback (most recent call last):\n[rank0]:[rank0]:   File \"x.py\"\n"
        "[rank0]:[rank0]: OSError: [Errno 28] No space left on device\n"
    )  # fmt: skip
    summary = summarize(tmp_path, "failed", 1.0, exit_code=1)
    assert summary["error"] == "OSError: [Errno 28] No space left on device"
    assert sweep_job_value(summary, "final_loss", stop_on_failure=False) is None
    # rank 0's own record of the exception (train.py: a non-finite loss, any error) wins
    (tmp_path / "failure.json").write_text(json.dumps({"error": "RuntimeError: Loss is not finite", "last_checkpoint": None}))
    assert summarize(tmp_path, "failed", 1.0, exit_code=1)["error"] == "RuntimeError: Loss is not finite"


def test_a_crash_is_reported_with_the_root_causes_exception(tmp_path):
    error_file = tmp_path / "ranks" / "x" / "attempt_0" / "1" / "error.json"
    error_file.parent.mkdir(parents=True)
    error_file.write_text(json.dumps({"message": {"message": "RuntimeError: boom", "extraInfo": {}}}))
    (tmp_path / "train.log").write_text(
        "[rank0]:[rank0]: Traceback (most recent call last):\n[rank0]:[rank0]:   File \"x.py\"\n"
        "[rank0]:[rank0]: ValueError: rank 0 saw its peer go\n"
        "Root Cause (first observed failure):\n[1]:\n  host      : localhost\n"
        f"  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 9)\n  error_file: {error_file}\n"
    )  # fmt: skip
    assert summarize(tmp_path, "failed", 1.0, exit_code=1)["error"] == "rank 1: RuntimeError: boom"
    error_file.unlink()  # no error file: the first traceback of the log
    assert crash_error(tmp_path, 1) == "ValueError: rank 0 saw its peer go"


def test_what_a_sweep_job_returns():
    completed = {"status": "completed", "final_loss": 6.5, "mfu": 0.02}
    assert sweep_job_value(completed, "final_loss", stop_on_failure=True) == 6.5
    assert sweep_job_value(completed, "mfu", stop_on_failure=False) == 0.02
    failed = {"status": "failed", "error": "config error: x", "final_loss": None}
    assert sweep_job_value(failed, "final_loss", stop_on_failure=False) is None
    with pytest.raises(JobFailed, match="config error: x"):
        sweep_job_value(failed, "final_loss", stop_on_failure=True)
    with pytest.raises(JobFailed):  # Ctrl-C stops a sweep whatever stop_on_failure says
        sweep_job_value({"status": "interrupted"}, "final_loss", stop_on_failure=False)


def test_report_of_a_sweep_whose_job_left_no_summary(tmp_path):
    for name, flavor in (("0", "tiny"), ("1", "debugmodel")):
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text(f"- model.flavor={flavor}\n- training.steps=3\n")
    write_records(tmp_path / "0", [{"step": 1, "loss": 7.6}, {"step": 2, "loss": 7.1}])
    for rank, padding in ((0, 100), (1, 4)):  # two ranks' data counts: 2 x 1024 tokens, 104 of them padding
        write_data_stats(tmp_path / "0", rank, {"tokens": 1024, "padding_tokens": padding})
    (tmp_path / "0" / "summary.json").write_text(json.dumps(summarize(tmp_path / "0", "completed", 2.0)))
    report = write_report(tmp_path)
    assert report.varying == ["model.flavor"] and [job.name for job in report.failed] == ["1"]
    rows = csv_rows(tmp_path / "summary.csv")
    assert [(r["model.flavor"], r["status"], r["final_loss"], r["packing_efficiency"]) for r in rows] == [
        ("tiny", "completed", "7.1", str(1944 / 2048)), ("debugmodel", "unknown", "", ""),
    ]  # fmt: skip
    assert "| 7.1000 |  |  | 0.9492 |" in (tmp_path / "summary.md").read_text()  # final loss, val loss, tok/s, efficiency
    assert (tmp_path / "loss.png").read_bytes()[:8] == PNG_MAGIC


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def feed_progress(metrics: Path, stream) -> None:
    with Progress(metrics, total_steps=4, label="#7", stream=stream):
        for step, elapsed in ((1, 5.0), (2, 6.0), (3, 7.0)):
            with open(metrics, "a") as f:
                f.write(json.dumps({"step": step, "loss": 8 - step, "tokens_per_second": 1500.0,
                                    "mfu": 0.0123, "elapsed_seconds": elapsed}) + "\n")  # fmt: skip
            time.sleep(0.6)


FINAL_LINE = "[qwen3-neuron] #7  step 3/4  loss 5.0000  tok/s 1,500  mfu 1.23%  ETA 0:00:01"


def test_progress_prints_plain_lines_when_not_on_a_terminal(tmp_path):
    out = io.StringIO()
    feed_progress(tmp_path / "metrics.jsonl", out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[qwen3-neuron] #7  starting") and lines[-1] == FINAL_LINE
    assert "\r" not in out.getvalue()
    step_line = re.compile(r"\[qwen3-neuron\] #7  step [1-3]/4  loss \d\.\d{4}  tok/s 1,500  mfu 1\.23%  ETA ")
    assert all(step_line.match(line) for line in lines[1:])
    assert all(line.endswith("ETA --") for line in lines[1:] if "step 1/4" in line)  # no pace yet


def test_the_end_of_a_run_is_a_few_labelled_lines():
    summary = {"status": "completed", "steps": 10, "wall_seconds": 12.34, "first_loss": 7.66, "final_loss": 6.5,
               "val_loss": 6.75, "val_step": 10, "tokens_per_second": 2172.8, "mfu": 0.1137, "peak_memory_gib": 0.69,
               "tensor_memory_gib": 0.045, "memory_estimate_gib": 0.044, "export_dir": "/run/hf_export",
               "error": None, "flops_per_token": 1.0e7, "overrides": {"a": ["b"]}}  # fmt: skip
    assert summary_lines(summary) == [
        "completed: 10 steps in 12.3 s; loss 7.6600 -> 6.5000 (validation 6.7500 at step 10)",
        "speed: 2,173 tok/s, mfu 11.37%; memory per rank: peak 0.69 GiB, tensors 0.045 GiB, estimate 0.044 GiB",
        "HF export: /run/hf_export",
    ]
    stats = {"rows": 5000, "dropped": 0, "skipped": 0, "truncated": 12, "buffered_documents": 1234, "packing_efficiency": 0.95817}
    packed = {**summary, "packing_efficiency": 0.95817, "data_stats": stats}
    assert summary_lines(packed)[2:4] == [
        "data: 5,000 rows read: 5,000 kept (12 of them truncated), 0 dropped, 0 skipped; packing efficiency 0.9582 "
        "(the share of tokens that is not padding); 1,234 documents read but not trained on (still buffered)",
        "  truncated 12 (kept, cut to training.seq_len):",
    ]
    resumed = {**summary, "val_loss": None, "checkpoint_loaded": "step-8"}
    assert summary_lines(resumed)[0] == "completed: 10 steps in 12.3 s; loss 7.6600 -> 6.5000; continued from checkpoint step-8"


def test_progress_prints_each_step_once_with_its_validation(tmp_path):
    """Not on a terminal: steps read in one poll each get their line, and a step's validation,
    logged after it, is on that step's one line."""
    metrics, out = tmp_path / "metrics.jsonl", io.StringIO()
    progress = Progress(metrics, total_steps=3, stream=out)

    def log(*records):
        with open(metrics, "a") as f:
            f.write("".join(json.dumps(record) + "\n" for record in records))
        progress._poll()

    log({"step": 1, "loss": 7.5, "elapsed_seconds": 1.0})
    log({"step": 1, "val_loss": 7.25})
    log({"step": 2, "loss": 7.0, "elapsed_seconds": 2.0}, {"step": 3, "loss": 6.5, "elapsed_seconds": 3.0})
    progress.stop()
    steps = [line.split("  ")[1] + "  " + line.split("  ")[3] for line in out.getvalue().splitlines()]
    assert steps == ["step 1/3  val 7.2500 (step 1)", "step 2/3  val 7.2500 (step 1)", "step 3/3  val 7.2500 (step 1)"]


def test_progress_redraws_one_line_on_a_terminal(tmp_path):
    out = FakeTerminal()
    feed_progress(tmp_path / "metrics.jsonl", out)
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, ended when the job ends
    assert text.rstrip().split("\r")[-1].rstrip() == FINAL_LINE


def test_peak_is_taken_from_the_machine_cache_and_neuron_uses_the_vendor_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN3_NEURON_CACHE", str(tmp_path))
    from qwen3_neuron.report import peak_flops as module

    key = module._cache_key("cpu", module.cpu_name(), "float32", 1)
    entry = PeakFlops(1.5e11, "measured", "cpu", module.cpu_name(), "float32", 1, "seeded by the test")
    (tmp_path / "peak_flops.json").write_text(json.dumps({key: entry.__dict__}))
    monkeypatch.setattr(module, "_measure_in_subprocess", lambda *a: pytest.fail("measured despite the cache"))
    assert peak_flops("cpu", "float32", threads=1) == entry
    neuron = peak_flops("neuron", "bfloat16", neuron_cores_per_rank=2)
    assert neuron.source == "vendor" and neuron.flops_per_second == pytest.approx(667e12 / 8 * 2)


def test_training_dtype_follows_fsdp_mixed_precision(tmp_path, assets):
    config = plan_of(compose_job(), tmp_path / "run").trainer_config
    config.training.mixed_precision_param = "bfloat16"
    assert training_dtype(config) == "bfloat16"  # mixed_precision_param, FSDP's compute dtype
    config.training.mixed_precision_param = "float32"
    assert training_dtype(config) == "float32"
    config.training.dtype = "bfloat16"
    assert training_dtype(config) == "bfloat16"


def test_the_sweep_table_reads_overrides_as_hydra_parses_them(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(
        "- +activation_checkpoint.mode=full\n- ~metrics\n- checkpointing=[from_hf,export_hf]\n"
        "- optimizer.lr=1e-3\n- run.objective='final_loss'\n"
    )
    assert read_overrides(tmp_path) == {
        "activation_checkpoint.mode": "full",
        "metrics": "(deleted)",
        "checkpointing": "[from_hf,export_hf]",
        "optimizer.lr": "0.001",
        "run.objective": "'final_loss'",  # as typed: Hydra keeps a quoted string quoted
    }


def test_progress_shows_what_the_workers_logged_before_it_started_but_not_an_earlier_launchs(tmp_path):
    """Workers started before the plan may log steps before the launcher starts the line; a resumed
    run's metrics.jsonl holds the killed launch's steps, which are not this launch's."""
    metrics = tmp_path / "metrics.jsonl"
    earlier = json.dumps({"step": 9, "loss": 1.0, "elapsed_seconds": 9.0}) + "\n"
    metrics.write_text(earlier)
    out = io.StringIO()
    progress = Progress(metrics, total_steps=12, label="#7", stream=out, earlier_bytes=len(earlier))
    with open(metrics, "a") as f:
        f.write(json.dumps({"step": 10, "loss": 2.0, "elapsed_seconds": 10.0}) + "\n")
    progress.start()
    progress.stop()
    assert out.getvalue().splitlines()[-1] == "[qwen3-neuron] #7  step 10/12  loss 2.0000  ETA --"
    assert "step 9" not in out.getvalue()


@pytest.mark.integration
def test_an_optuna_dry_run_shows_its_first_trial_and_stops_in_a_sentence(tmp_path, assets):
    """Every trial of an Optuna dry run would plan and train nothing and return no value, and
    Optuna's own end (`study.best_trial`) raises then: the search stops after the first plan,
    saying why, exit 0."""
    result = multirun(tmp_path / "optuna", "experiment=optuna_lr", "hydra.sweeper.n_trials=3", "run.dry_run=true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and result.stdout.count("dry run: nothing started") == 1
    assert result.stderr.rstrip().endswith(
        "[qwen3-neuron] an Optuna search with run.dry_run=true or run.show_data stops after its first trial "
        "(above): nothing trains, so no trial gives Optuna a value to search on. Without -m a dry run shows one "
        "config's plan."
    )
