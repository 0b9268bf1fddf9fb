"""Integration: `launch.py` trains the tiny native Qwen3 on two CPU ranks through torchrun."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, TINY, compose_config, launch, processes_mentioning, read_jsonl

from qwen3_neuron.config.settings import parse_settings
from qwen3_neuron.config.torchrun import worker_launch
from qwen3_neuron.launch.job import _Workers
from qwen3_neuron.run_dir import WAITING_LINE, Handoff

pytestmark = pytest.mark.integration

STEP_LINE = re.compile(r"step:\s+(\d+)\s+\S*loss:\s+([0-9.]+)")


# default_run and checkpointed_run: conftest.py's session runs (test_resume.py resumes the latter's
# config).


def test_default_run_trains_and_the_loss_falls(default_run):
    summary = json.loads((default_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["exit_code"] == 0
    assert summary["steps"] == 10
    # a tiny model on its first steps: ln(2048) = 7.62 at random init, clearly lower after 10
    assert summary["first_loss"] == pytest.approx(7.62, abs=0.3)
    assert summary["final_loss"] < summary["first_loss"] - 0.5
    assert summary["tokens_per_second"] > 0 and summary["peak_memory_gib"] > 0


def test_metrics_and_summary_agree_with_what_the_workers_logged(default_run):
    records = read_jsonl(default_run / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 11))
    logged = {int(step): float(loss) for step, loss in STEP_LINE.findall((default_run / "train.log").read_text())}
    assert logged == {r["step"]: pytest.approx(r["loss"], abs=5e-5) for r in records}
    summary = json.loads((default_run / "summary.json").read_text())
    assert (summary["first_loss"], summary["final_loss"]) == (records[0]["loss"], records[-1]["loss"])
    assert summary["peak_memory_gib"] == max(r["peak_memory_gib"] for r in records)


def test_same_seed_twice_gives_identical_losses(default_run, checkpointed_run):
    # the same job launched again, saving checkpoints on the way (which must not change a loss)
    assert list((checkpointed_run / "checkpoint").glob("step-*/.metadata"))
    first = [r["loss"] for r in read_jsonl(default_run / "metrics.jsonl")]
    second = [r["loss"] for r in read_jsonl(checkpointed_run / "metrics.jsonl")]
    assert len(first) == 10 and first == second


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_every_worker_and_keeps_completed_checkpoints(tmp_path, assets, signum):
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
    process.send_signal(signum)
    assert process.wait(timeout=120) != 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 3 <= summary["steps"] < 500
    assert processes_mentioning(str(run_dir)) == []
    assert (run_dir / "checkpoint" / "step-2" / ".metadata").exists()


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


def test_workers_started_early_wait_for_the_plan_and_a_failed_plan_stops_them(tmp_path, assets):
    """What the launcher does for every run: torchrun starts while the plan runs; its workers
    import torchtitan, then wait. A plan that fails stops them and removes what torchrun wrote."""
    run_dir = tmp_path / "run"
    workers = _Workers(worker_launch(parse_settings(compose_config()), run_dir), run_dir, verbose=False)
    deadline = time.time() + 300
    while not any(WAITING_LINE in log.read_text() for log in run_dir.glob("ranks/*/attempt_0/0/stdout.log")):
        assert workers.torchrun.process.poll() is None and time.time() < deadline
        time.sleep(0.2)
    time.sleep(1)  # a worker that did not wait would be building now
    assert len(processes_mentioning("qwen3_neuron.worker.train " + str(run_dir))) == 3  # torchrun, 2 ranks
    assert sorted(p.name for p in run_dir.iterdir()) == ["ranks", "train.log"]  # nothing built: no plan
    workers.discard()
    assert processes_mentioning(str(run_dir)) == []
    assert list(run_dir.iterdir()) == []


def test_a_worker_whose_launcher_is_gone_stops_waiting(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    handoff = Handoff("cpu", "token", gone.pid)
    with pytest.raises(SystemExit, match=f"launcher \\(pid {gone.pid}\\) exited before its plan was ready"):
        handoff.wait_until_ready(tmp_path)
    handoff.mark_ready(tmp_path)
    handoff.wait_until_ready(tmp_path)  # returns: the go is there
