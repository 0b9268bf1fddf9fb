"""Integration: kill -9 a run mid-way, resume it, and get the uninterrupted run's losses."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CHECKPOINTED, REPO, command_lines, launch

pytestmark = pytest.mark.integration

STEPS = 10  # CHECKPOINTED (conftest.py): 10 steps, a checkpoint every 4


def losses(run_dir: Path) -> dict[int, float]:
    """{step: loss} of metrics.jsonl (a resumed run's later lines win); a line cut by a kill is skipped."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, (line for line in lines if line.endswith("}"))) if "loss" in r}


@pytest.mark.parametrize("nproc", [1, 2])
def test_resume_after_kill_9_continues_with_identical_losses(request, tmp_path, assets, nproc):
    """2 ranks: steps 5-10 equal the session's uninterrupted run of this config (test_training.py
    compares it too). 1 rank: the steps the killed run logged after its step-4 checkpoint are the
    uninterrupted reference; the resumed run recomputes them from that checkpoint."""
    ranks = f"run.nproc_per_node={nproc}"
    run_dir = tmp_path / "killed"
    kill_9_after_checkpoint(run_dir, [ranks, *CHECKPOINTED], checkpoint_step=4, steps_logged=6)
    before_kill = losses(run_dir)
    if nproc == 1:  # resume from step 4 whatever the kill's timing: steps 5.. are the killed run's
        shutil.rmtree(run_dir / "checkpoint" / "step-8", ignore_errors=True)
    # a checkpoint cut short while being written (no .metadata) must never be picked
    (run_dir / "checkpoint" / "step-9").mkdir()

    result = launch(None, f"run.resume={run_dir}", ranks)
    assert result.returncode == 0, result.stdout[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    resumed = losses(run_dir)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    loaded = re.search(r"Loading the checkpoint from \S*step-(\d+)", (run_dir / "train.log").read_text())
    assert loaded and int(loaded.group(1)) in (4, 8)  # never the unfinished step-9
    if nproc == 2:
        reference = losses(request.getfixturevalue("checkpointed_run"))
        assert [resumed[s] for s in range(5, STEPS + 1)] == [reference[s] for s in range(5, STEPS + 1)]
    else:
        assert int(loaded.group(1)) == 4
        after_checkpoint = [s for s in sorted(before_kill) if s > 4]  # at least 5 and 6
        assert [resumed[s] for s in after_checkpoint] == [before_kill[s] for s in after_checkpoint]


def test_resume_refuses_a_dir_without_checkpoint_and_a_changed_config(tmp_path, assets):
    run_dir = tmp_path / "run"
    assert launch(run_dir, "run.dry_run=true").returncode == 0
    result = launch(None, f"run.resume={run_dir}")
    assert result.returncode == 2 and "no complete checkpoint" in result.stderr
    (run_dir / "checkpoint" / "step-2").mkdir(parents=True)
    (run_dir / "checkpoint" / "step-2" / ".metadata").touch()
    result = launch(None, f"run.resume={run_dir}", "optimizer.lr=1e-2")
    assert result.returncode == 2 and "changes 'optimizer.lr'" in result.stderr


def kill_9_after_checkpoint(run_dir: Path, overrides, checkpoint_step: int, steps_logged: int) -> None:
    """Train `overrides` through launch.py in `run_dir`; kill -9 the launcher, torchrun and every
    worker once checkpoint step-`checkpoint_step` is complete and `steps_logged` training steps
    are in metrics.jsonl. Nothing is summarised."""
    process = subprocess.Popen(
        [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", *overrides],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    checkpoint = run_dir / "checkpoint" / f"step-{checkpoint_step}" / ".metadata"
    _wait_for(lambda: checkpoint.exists() and _steps_logged(run_dir) >= steps_logged, process)
    _kill_everything_mentioning(str(run_dir))
    process.wait(timeout=60)
    assert not (run_dir / "summary.json").exists()


def _steps_logged(run_dir: Path) -> int:
    """Training steps in metrics.jsonl so far (a line still being written is not one)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return sum('"loss"' in line and line.endswith("}") for line in lines)


def _wait_for(condition, process, timeout=300):
    deadline = time.time() + timeout
    while not condition():
        assert process.poll() is None and time.time() < deadline, "run ended or stalled before the kill"
        time.sleep(0.2)


def _kill_everything_mentioning(text: str) -> None:
    """kill -9 the launcher, torchrun and every worker of this run, as a machine crash would."""
    for pid, args in command_lines():
        if text in args:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
