"""Integration: `launch.py` trains the tiny native Qwen3 on two CPU ranks through torchrun."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO, TINY, compose_config, console, launch, process_counts, processes_mentioning, read_jsonl

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.job.job import Job
from qwen3_neuron.job.torchrun import worker_launch
from qwen3_neuron.launch.process import Torchrun
from qwen3_neuron.launch.run_job import _Workers
from qwen3_neuron.handoff import PLAN_FAILED_EXIT, PLANNING_LINE, Handoff
from qwen3_neuron.run_dir import read_job

pytestmark = pytest.mark.integration

STEP_LINE = re.compile(r"step:\s+(\d+)\s+\S*loss:\s+([0-9.]+)")


# default_run: conftest.py's session run (tests/test_resume.py launches it again and resumes it).


def test_default_run_trains_and_the_loss_falls(default_run):
    summary = json.loads((default_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["exit_code"] == 0
    assert summary["steps"] == 10
    # a tiny model on its first steps: ln(2048) = 7.62 at random init, clearly lower after 10
    assert summary["first_loss"] == pytest.approx(7.62, abs=0.3)
    assert summary["final_loss"] < summary["first_loss"] - 0.5
    assert summary["tokens_per_second"] > 0 and summary["peak_memory_gib"] > 0
    # what the workers ran (worker/what_ran.py), not what the plan said: CPU attention in all 4 layers, no compile
    assert summary["attention"] == {"qwen3_neuron.kernels.attention.sdpa.SDPAFlexAttention": 4}
    assert summary["compiled"] is None


def test_each_process_parses_the_job_once_and_each_rank_builds_its_config_once(default_run):
    """The launcher parses, settles and checks the job (the only `check_settings`) and builds
    nothing (no torchtitan); every rank parses the job.yaml the launcher wrote once, local rank 0
    trains with the config its plan built and checked, rank 1 builds once. torchtitan is imported
    once, by the process that forks the ranks. No plan request is left (there is none)."""
    assert process_counts(default_run) == {
        "launcher parse": 1, "launcher check": 1, "rank0 parse": 1, "rank0 build": 1, "rank1 parse": 1,
        "rank1 build": 1, "torchrun torch import": 1, "torchrun torchtitan import": 1,
    }  # fmt: skip
    assert [p.name for p in default_run.glob(".plan_*")] == []


def test_the_default_job_prints_the_projects_own_lines_only(default_run):
    """No line a user has to learn to ignore: torchrun's, torchtitan's and the libraries' output
    goes to train.log; the console has the progress line per step and the end-of-run lines."""
    lines = console(default_run)
    assert [line for line in lines if not line.startswith("[qwen3-neuron] ")] == []
    assert [line for line in lines if line.startswith("[qwen3-neuron]  step ")][-1].startswith("[qwen3-neuron]  step 10/10  loss ")
    assert lines[-1] == f"[qwen3-neuron] run dir: {default_run} (every figure: summary.json)"
    assert "torchtitan" in (default_run / "train.log").read_text()


def test_metrics_and_summary_agree_with_what_the_workers_logged(default_run):
    records = read_jsonl(default_run / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 11))
    logged = {int(step): float(loss) for step, loss in STEP_LINE.findall((default_run / "train.log").read_text())}
    assert logged == {r["step"]: pytest.approx(r["loss"], abs=5e-5) for r in records}
    summary = json.loads((default_run / "summary.json").read_text())
    assert (summary["first_loss"], summary["final_loss"]) == (records[0]["loss"], records[-1]["loss"])
    assert summary["peak_memory_gib"] == max(r["peak_memory_gib"] for r in records)


def test_a_sigterm_stops_every_worker_and_keeps_completed_checkpoints(tmp_path, assets):
    """What SLURM or Kubernetes sends. Ctrl-C reaches the launcher as SIGINT, which it handles
    the same way (the next test)."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", *TINY, "training.steps=500",
         "checkpointing=periodic", "checkpoint.interval=2",
         "checkpoint.keep_latest_k=0"],  # keep every step: fast steps would purge step-2 before the signal
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 300
    while not _steps_logged(run_dir) >= 3 and time.time() < deadline:
        assert process.poll() is None, "the run ended before it could be interrupted"
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) != 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 3 <= summary["steps"] < 500
    assert summary["error"] == "interrupted by SIGTERM"
    assert processes_mentioning(str(run_dir)) == []
    assert (run_dir / "checkpoint" / "step-2" / ".metadata").exists()


def test_ctrl_c_in_the_launcher_stops_torchrun_with_sigterm_and_names_sigint(tmp_path):
    """The launcher's handler, in this process: a stand-in for torchrun (its own session, as the
    real one) gets SIGTERM when the launcher gets SIGINT; the launcher's handlers are restored."""
    stand_in = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
        "pathlib.Path(sys.argv[1]).touch()\n"
        "time.sleep(60)\n"
    )
    ready = tmp_path / "ready"
    before = signal.getsignal(signal.SIGINT)
    torchrun = Torchrun([sys.executable, "-c", stand_in, str(ready)], {}, tmp_path, echo=False)

    def ctrl_c_once_ready():
        while not ready.exists() or signal.getsignal(signal.SIGINT) is before:  # started, and waited on
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c_once_ready, daemon=True).start()
    result = torchrun.wait()
    assert (result.returncode, result.interrupted_by) == (143, "SIGINT")
    assert signal.getsignal(signal.SIGINT) is before


def test_a_non_finite_loss_stops_the_run_naming_the_step_and_the_last_good_checkpoint(tmp_path, assets):
    run_dir = tmp_path / "run"
    result = launch(run_dir, *TINY, "optimizer.lr=1e6", "training.steps=8", "checkpointing=periodic", "checkpoint.interval=2")
    assert result.returncode != 0
    summary = json.loads((run_dir / "summary.json").read_text())
    nan_step = int(re.search(r"not finite .* at step (\d+)", summary["error"]).group(1))
    assert summary["status"] == "failed" and summary["steps"] == nan_step - 1
    last_good = 2 * ((nan_step - 1) // 2)
    assert summary["last_checkpoint"] == str(run_dir / "checkpoint" / f"step-{last_good}")
    assert (run_dir / "checkpoint" / f"step-{last_good}" / ".metadata").exists()
    assert f"Last good checkpoint: {summary['last_checkpoint']}" in (run_dir / "train.log").read_text()


def _steps_logged(run_dir) -> int:
    metrics = run_dir / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def test_local_rank_0_plans_and_a_config_error_it_finds_stops_every_worker(tmp_path, assets):
    """What the launcher does for every run that trains: torchrun starts before any torchtitan
    import in the launcher; local rank 0 plans once it has imported torchtitan, the other rank
    waits. The launcher records the settled job (job.yaml, command.sh) before torchrun starts,
    and local rank 0 plans from that file. A config error only torchtitan finds comes back to
    the launcher, and stopping the workers removes what this launch wrote, and only that: here
    the run dir holds an earlier launch's record and logs, as a resumed run's does, and gets them
    back. (A fresh run dir is left empty: test_bad_inputs.py.)"""
    run_dir = tmp_path / "run"
    earlier_rank_log = run_dir / "ranks" / "earlier_launch" / "attempt_0" / "0" / "stdout.log"
    earlier_rank_log.parent.mkdir(parents=True)
    earlier_rank_log.write_text("step 4\n")
    earlier = {"train.log": "the earlier launch's output\n", "job.yaml": "training:\n  seq_len: 128\n", "command.sh": "torchrun\n"}
    for name, text in earlier.items():
        (run_dir / name).write_text(text)
    job = Job.parse(compose_config("training.seq_len=4096")).settled()  # torchtitan's RoPE bound: the plan's
    launch = worker_launch(job, run_dir)
    workers = _Workers(job, launch, run_dir)
    assert read_job(run_dir) == job.composed  # what every rank reads: written before any of them starts
    assert (run_dir / "command.sh").read_text() == f"#!/bin/sh\n{launch.command_line()}\n"
    with pytest.raises(ConfigError, match="training.seq_len=4096 is too long for qwen3 tiny"):
        workers.wait_for_plan()
    this_launch = [p for p in run_dir.glob("ranks/*/attempt_0/0/stdout.log") if p != earlier_rank_log]
    assert len(this_launch) == 1 and PLANNING_LINE in this_launch[0].read_text()
    assert not (run_dir / "trainer_config.json").exists()  # nothing planned, nothing built
    workers.discard()
    assert processes_mentioning(str(run_dir)) == []
    assert sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()) == [
        "command.sh", "job.yaml", "ranks/earlier_launch/attempt_0/0/stdout.log", "train.log",
    ]  # fmt: skip
    assert {name: (run_dir / name).read_text() for name in earlier} == earlier
    assert earlier_rank_log.read_text() == "step 4\n"


def test_a_waiting_worker_stops_when_the_plan_failed_or_the_launcher_is_gone(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(SystemExit, match=f"launcher \\(pid {gone.pid}\\) exited before the plan was ready"):
        Handoff("token", gone.pid).wait_for_go(tmp_path)
    handoff = Handoff("token", os.getpid())
    handoff.plan_failed(tmp_path, "Config error", "training.steps must be a positive integer, got 0.")
    with pytest.raises(SystemExit) as stopped:
        handoff.wait_for_go(tmp_path)
    assert stopped.value.code == PLAN_FAILED_EXIT
    assert handoff.wait_for_plan(tmp_path, alive=lambda: True) == (
        "Config error", "training.steps must be a positive integer, got 0."
    )


def test_a_finished_process_skips_the_teardown_but_runs_its_exit_handlers_and_flushes(tmp_path):
    """How a worker (and launch.py) ends once its run is done: with its code, the libraries' exit
    handlers run (here: a temporary dir's cleanup and a handler of its own), its output flushed."""
    script = f"""
import atexit, pathlib, sys, tempfile
from qwen3_neuron.process_exit import exit_without_teardown
temporary = tempfile.TemporaryDirectory(dir={str(tmp_path)!r})
atexit.register(pathlib.Path({str(tmp_path / "handler_ran")!r}).touch)
sys.stdout.write("not flushed yet")
exit_without_teardown(3)
print("never printed")
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (3, "not flushed yet")
    assert [path.name for path in tmp_path.iterdir()] == ["handler_ran"]
