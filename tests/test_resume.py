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
from conftest import REPO, TINY, command_lines, launch

pytestmark = pytest.mark.integration

# conftest.py's default_run (TINY, 10 steps, 2 ranks), saving step-4 and step-8
STEPS = 10
CHECKPOINTED = (*TINY, "checkpointing=periodic", "checkpoint.interval=4", f"training.steps={STEPS}")


def losses(run_dir: Path) -> dict[int, float]:
    """{step: loss} of metrics.jsonl (a resumed run's later lines win); a line cut by a kill is skipped."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, (line for line in lines if line.endswith("}"))) if "loss" in r}


def test_the_same_seed_again_and_its_resume_after_kill_9_give_identical_losses(default_run, tmp_path):
    """The default job again, saving checkpoints: until the kill it is the same seed launched a
    second time, so its losses are default_run's (and saving a checkpoint changes none). After the
    resume from step 4 or 8, steps 5-10 are default_run's too."""
    run_dir = tmp_path / "killed"
    kill_9_after_checkpoint(run_dir, CHECKPOINTED, checkpoint_step=4, steps_logged=6)
    uninterrupted, before_kill = losses(default_run), losses(run_dir)
    assert len(before_kill) >= 6 and all(before_kill[s] == uninterrupted[s] for s in before_kill)
    # a checkpoint cut short while being written (no .metadata) must never be picked
    (run_dir / "checkpoint" / "step-9").mkdir()

    result = launch(None, f"run.resume={run_dir}")
    assert result.returncode == 0, result.stdout[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    resumed = losses(run_dir)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    loaded = re.search(r"Loading the checkpoint from \S*step-(\d+)", (run_dir / "train.log").read_text())
    assert loaded and int(loaded.group(1)) in (4, 8)  # never the unfinished step-9
    assert f"resuming from {run_dir / 'checkpoint' / f'step-{loaded.group(1)}'} (step" in result.stdout
    assert [resumed[s] for s in range(5, STEPS + 1)] == [uninterrupted[s] for s in range(5, STEPS + 1)]
    assert "checkpointing=periodic" in (run_dir / ".hydra" / "overrides.yaml").read_text()  # the first launch's


def test_resume_refuses_a_dir_without_checkpoint_and_a_changed_config(default_run, tmp_path):
    run_dir = shutil.copytree(default_run, tmp_path / "run")  # a finished run that saved no checkpoint
    before = _files(run_dir)
    result = launch(None, f"run.resume={run_dir}")
    assert result.returncode == 2 and "no complete checkpoint" in result.stderr
    assert _files(run_dir) == before  # refused before anything was written
    (run_dir / "checkpoint" / "step-2").mkdir(parents=True)
    (run_dir / "checkpoint" / "step-2" / ".metadata").touch()
    result = launch(None, f"run.resume={run_dir}", "optimizer.lr=1e-2")
    assert result.returncode == 2 and "changes 'optimizer.lr'" in result.stderr
    # the recorded value is the one the run trained with, the base config function's here
    assert "(0.0008, the base config function's default -> 0.01)" in result.stderr


def test_resuming_a_run_with_nothing_left_to_train_does_nothing(default_run, tmp_path):
    run_dir = shutil.copytree(default_run, tmp_path / "run")
    (run_dir / "checkpoint" / f"step-{STEPS}").mkdir(parents=True)
    (run_dir / "checkpoint" / f"step-{STEPS}" / ".metadata").touch()
    before = _files(run_dir)
    result = launch(None, f"run.resume={run_dir}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"nothing left to train: {run_dir / 'checkpoint' / f'step-{STEPS}'} is step {STEPS}" in result.stdout
    assert _files(run_dir) == before  # no torchrun started, summary.json as the run left it


def _files(run_dir: Path) -> dict[str, int]:
    return {p.relative_to(run_dir).as_posix(): p.stat().st_size for p in run_dir.rglob("*") if p.is_file()}


def as_of_checkpoint(run_dir: Path, copy: Path, step: int) -> Path:
    """A copy of a finished run's dir as it stood right after its step-`step` checkpoint: the later
    checkpoints, metrics records, exports and summary are gone. What a resume test starts from
    when the state it checks is the checkpoint's, not how the run ended (kill -9: above)."""
    shutil.copytree(run_dir, copy)
    for later in (copy / "checkpoint").glob("step-*"):
        if int(later.name.removeprefix("step-")) > step:
            shutil.rmtree(later)
    for written_at_the_end in ("hf_export", "hf_adapter"):
        shutil.rmtree(copy / written_at_the_end, ignore_errors=True)
    for written_at_the_end in ("summary.json", "export.json"):
        (copy / written_at_the_end).unlink(missing_ok=True)
    metrics = copy / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= step]
    metrics.write_text("".join(line + "\n" for line in kept))
    return copy


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
