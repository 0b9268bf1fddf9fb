"""Integration: kill -9 a run mid-way, resume it, and get the uninterrupted run's losses."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, TINY, command_lines, launch

from qwen3_neuron.run_dir import complete_steps
from qwen3_neuron.worker.checkpoint_check import damage

pytestmark = pytest.mark.integration

# conftest.py's default_run (TINY, 10 steps, 2 ranks), saving every 2 steps (the newest two kept)
STEPS = 10
CHECKPOINTED = (*TINY, "checkpointing=periodic", "checkpoint.interval=2", f"training.steps={STEPS}")
# the same, exporting its model at the end: the last step is then a full checkpoint and the export
EXPORTED = (*TINY, "checkpointing=[periodic,export_hf]", "checkpoint.interval=2", f"training.steps={STEPS}")


def losses(run_dir: Path) -> dict[int, float]:
    """{step: loss} of metrics.jsonl (a resumed run's later lines win); a line cut by a kill is skipped."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, (line for line in lines if line.endswith("}"))) if "loss" in r}


def test_the_same_seed_again_and_its_resume_after_kill_9_give_identical_losses(default_run, tmp_path):
    """The default job again, saving checkpoints and exporting: until the kill it is the same seed
    launched a second time, so its losses are default_run's (and saving a checkpoint changes none). Its newest
    checkpoint then loses two thirds of a shard (as a full disk or a cut copy leaves it): the
    resume continues from the one before, and ends on default_run's losses too. While it runs, it
    owns the run dir: a second launch there stops at once."""
    run_dir = tmp_path / "killed"
    kill_9_after_checkpoint(run_dir, EXPORTED, checkpoint_step=4, steps_logged=6)
    uninterrupted, before_kill = losses(default_run), losses(run_dir)
    assert len(before_kill) >= 6 and all(before_kill[s] == uninterrupted[s] for s in before_kill)
    # a checkpoint cut short while being written (no .metadata) must never be picked
    (run_dir / "checkpoint" / "step-9").mkdir()
    *_, intact, newest = complete_steps(run_dir / "checkpoint")
    shard = run_dir / "checkpoint" / f"step-{newest}" / "__1_0.distcp"
    size = shard.stat().st_size
    os.truncate(shard, size // 3)
    assert json.loads((run_dir / ".lock").read_text())["pid"]  # the killed launch's, left behind
    cut_before_any_complete_one_says_to_start_again(run_dir, tmp_path / "cut")

    output = tmp_path / "resume.out"
    with output.open("w") as out:
        resume = subprocess.Popen([sys.executable, str(REPO / "launch.py"), f"run.resume={run_dir}"],
                                  cwd=REPO, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        _wait_for(lambda: _lock_owner(run_dir) == resume.pid, resume)
        # while the resume runs, a second resume and a new run pointed at its dir stop at once: the
        # refusal comes while the owner still trains (not after waiting for it)
        first_launch = (run_dir / ".hydra" / "overrides.yaml").read_text()
        for second in ([f"run.resume={run_dir}"], [f"hydra.run.dir={run_dir}", "training.steps=3"]):
            refused = launch(None, *second)
            assert refused.returncode == 2 and resume.poll() is None
            assert f"Run dir in use: run dir {run_dir} is in use by another launch (pid {resume.pid} on host" in refused.stderr
            assert (run_dir / ".hydra" / "overrides.yaml").read_text() == first_launch  # Hydra's record too
        assert resume.wait(timeout=600) == 0, output.read_text()[-3000:]
    printed = output.read_text()
    assert "took over a stale lock; its owner is gone" in printed  # kill -9's lock
    assert not (run_dir / ".lock").exists()
    problem = f"__1_0.distcp is {size // 3:,} bytes, its .metadata says {size:,}"
    assert (f"warning: checkpoint {run_dir}/checkpoint/step-{newest} is damaged: {problem}. Skipped (moved to "
            f"{run_dir}/checkpoint/damaged/step-{newest}); the run continues from step-{intact}") in printed  # fmt: skip
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    assert summary["checkpoint_loaded"] == f"step-{intact}"
    assert summary["checkpoints_skipped"] == {f"step-{newest}": problem}
    resumed = losses(run_dir)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    loaded = re.search(r"Loading the checkpoint from \S*step-(\d+)", (run_dir / "train.log").read_text())
    assert loaded and int(loaded.group(1)) == intact  # never the unfinished step-9, nor the damaged one
    assert f"continuing from checkpoint step-{intact} of {run_dir}" in printed
    assert (f"warning: checkpoint {run_dir}/checkpoint/step-9 was cut while saving (no DCP .metadata, which is "
            "written last: the run was killed or its disk filled while writing it); never loaded. The run continues "
            f"from step-{newest}, the newest complete checkpoint.") in printed  # then found damaged: above
    after = range(intact + 1, STEPS + 1)
    assert [resumed[s] for s in after] == [uninterrupted[s] for s in after]
    assert "checkpointing=[periodic,export_hf]" in (run_dir / ".hydra" / "overrides.yaml").read_text()  # the first launch's
    extended_from_its_last_step_or_the_one_before_trains_alike(run_dir, tmp_path)


def cut_before_any_complete_one_says_to_start_again(run_dir: Path, copy: Path) -> None:
    """The killed periodic run as kill -9 during its first save leaves it: its only checkpoint has
    no .metadata. Its resume names that checkpoint and says to start again, writing nothing."""
    shutil.copytree(run_dir, copy)
    first, *later = sorted((copy / "checkpoint").glob("step-*"), key=lambda p: int(p.name.removeprefix("step-")))
    for path in later:
        shutil.rmtree(path)
    (first / ".metadata").unlink()
    (copy / ".lock").unlink()  # the killed launch's: a launch takes it over and removes it
    before = _files(copy)
    result = launch(None, f"run.resume={copy}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert (f"Config error: run.resume={copy}: no complete checkpoint in {copy}/checkpoint: nothing to continue "
            f"from. Its checkpoint {first} was cut while saving (no DCP .metadata, which is written last: the run was "
            "killed or its disk filled while writing it), and it has no complete one before it. Start the run again: "
            "the same command without run.resume, in a new run dir.") in result.stderr  # fmt: skip
    assert "checkpointing=periodic" not in result.stderr  # it was on
    assert _files(copy) == before


def extended_from_its_last_step_or_the_one_before_trains_alike(run_dir: Path, tmp_path: Path) -> None:
    """The finished run extended by two steps: its last step is a full checkpoint beside the export
    (`full-N` renamed `step-N` once the export consumed the HF save), so only the new steps train,
    and the extension exports again; from the checkpoint before (checkpoint.load_step), steps 9-10
    retrain on the schedule they were planned with, and the new steps 11-12 are the same as from
    the last step."""
    checkpoints = run_dir / "checkpoint"
    assert complete_steps(checkpoints) == [STEPS - 2, STEPS] and not list(checkpoints.glob("full-*"))
    exported = (run_dir / "hf_export" / "model.safetensors").read_bytes()
    extended, extended_earlier = STEPS + 2, shutil.copytree(run_dir, tmp_path / "from-earlier")
    rule = (f"run.resume: training on to step {extended}; learning rate: steps 1-{STEPS} keep the schedule planned "
            f"for {STEPS} steps; steps {STEPS + 1}-{extended} train at its step-{STEPS} rate")  # fmt: skip
    trained = len(losses(run_dir))
    lines_before = len((run_dir / "metrics.jsonl").read_text().splitlines())
    result = launch(None, f"run.resume={run_dir}", f"training.steps={extended}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert rule in result.stdout and f"continuing from checkpoint step-{STEPS} of" in result.stdout
    new_records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()[lines_before:]]
    assert [r["step"] for r in new_records if "loss" in r] == [STEPS + 1, STEPS + 2]  # only the new steps
    assert complete_steps(checkpoints)[-1] == extended
    assert (run_dir / "hf_export" / "model.safetensors").read_bytes() != exported  # step 12's model
    result = launch(None, f"run.resume={extended_earlier}", f"training.steps={extended}", f"checkpoint.load_step={STEPS - 2}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert rule in result.stdout
    last, earlier = losses(run_dir), losses(extended_earlier)
    assert len(last) == trained + 2
    assert [earlier[s] for s in range(STEPS - 1, extended + 1)] == [last[s] for s in range(STEPS - 1, extended + 1)]


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(size): a file system of `size` ("80m") at a new dir; a size-limited tmpfs, which
    only root may mount. Resized in place with `remount`."""
    disk = tmp_path / "disk"
    disk.mkdir()

    def mount(size: str) -> Path:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                                 capture_output=True, text=True, check=False)  # fmt: skip
        if mounted.returncode != 0:
            pytest.skip(f"a full disk is a size-limited tmpfs, which only root may mount: {mounted.stderr.strip()}")
        return disk

    yield mount
    subprocess.run(["umount", "--lazy", str(disk)], check=False, capture_output=True)


def test_a_full_disk_while_saving_stops_the_run_and_the_resume_ends_on_the_undisturbed_losses(default_run, small_disk):
    """80 MB: one checkpoint of CHECKPOINTED's run fits (2 shards of ~24 MB), the second does not."""
    disk = small_disk("80m")
    run_dir = disk / "run"
    result = launch(run_dir, *CHECKPOINTED)
    full = f"{run_dir}/train.log could not be written: No space left on device"
    assert result.returncode == 1 and f"the job failed; the end of its output ({full})" in result.stderr
    # the disk is full to the last byte: the summary is said not to be written, never left half-written
    assert f"{run_dir}/summary.json could not be written: No space left on device" in result.stderr
    assert not (run_dir / "summary.json").exists() and f"step 4/{STEPS}" in result.stdout
    checkpoints = run_dir / "checkpoint"
    assert complete_steps(checkpoints) == [2] and damage(checkpoints / "step-2") is None  # step-4 was cut short

    subprocess.run(["mount", "-o", "remount,size=400m", str(disk)], check=True)  # space freed
    result = launch(None, f"run.resume={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["checkpoint_loaded"] == "step-2" and summary["checkpoints_skipped"] == {}
    resumed, uninterrupted = losses(run_dir), losses(default_run)
    assert [resumed[s] for s in range(3, STEPS + 1)] == [uninterrupted[s] for s in range(3, STEPS + 1)]


def test_a_full_disk_during_the_hf_export_keeps_the_checkpoint_before_intact(assets, small_disk):
    """55 MB: step-2's checkpoint (~47 MB) fits, the last save in HF (~15 MB) the export is made
    from does not. The run fails; no export is left under its name; step-2 is what it was."""
    run_dir = small_disk("55m") / "run"
    result = launch(run_dir, *TINY, "checkpointing=[periodic,export_hf]", "checkpoint.interval=2", "training.steps=4")
    assert result.returncode == 1 and "No space left on device" in result.stderr and "step 4/4" in result.stdout
    assert f"{run_dir}/summary.json could not be written: No space left on device" in result.stderr
    assert not (run_dir / "hf_export").exists() and not (run_dir / "summary.json").exists()
    checkpoints = run_dir / "checkpoint"
    assert complete_steps(checkpoints) == [2] and damage(checkpoints / "step-2") is None


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
    assert f"nothing left to train: its checkpoint step-{STEPS} is at training.steps={STEPS}" in result.stdout
    assert _files(run_dir) == before  # no torchrun started, summary.json as the run left it


def test_a_new_run_pointed_at_a_finished_run_dir_is_refused_and_writes_nothing(default_run, tmp_path):
    """The issue's case: a run trained into D, then a new run into D with another lr. Refused before
    anything is written (Hydra's record, job.yaml, metrics and summary as the first run left them)."""
    run_dir = shutil.copytree(default_run, tmp_path / "run")
    before = _contents(run_dir)
    result = launch(run_dir, "training.steps=2", "optimizer.lr=1e-2")
    assert result.returncode == 2, result.stderr[-2000:]
    assert (f"Config error: run dir {run_dir} holds a run already (summary.json; completed after {STEPS} steps); "
            f"a new run never writes into another's dir. To continue or extend that run: run.resume={run_dir} "
            "(training.steps=N trains on to step N). For a new run: leave hydra.run.dir unset, or name a dir "
            "of its own.") in result.stderr  # fmt: skip
    assert _contents(run_dir) == before


def _contents(run_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


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
    """Train `overrides` through launch.py in `run_dir`; kill -9 the launcher once checkpoint
    step-`checkpoint_step` is complete and `steps_logged` training steps are in metrics.jsonl:
    within 5 s torchrun and every worker are gone too. Nothing is summarised, and the launch's
    handoff files are gone."""
    process = subprocess.Popen(
        [sys.executable, str(REPO / "launch.py"), f"hydra.run.dir={run_dir}", *overrides],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    checkpoint = run_dir / "checkpoint" / f"step-{checkpoint_step}" / ".metadata"
    _wait_for(lambda: checkpoint.exists() and _steps_logged(run_dir) >= steps_logged, process)
    started = [pid for pid, args in command_lines() if str(run_dir) in args and pid != process.pid]
    assert len(started) >= 2  # torchrun and its workers
    process.kill()
    process.wait(timeout=60)
    deadline = time.monotonic() + 5
    while (alive := [pid for pid in started if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive == [], [args for pid, args in command_lines() if pid in alive]
    assert not (run_dir / "summary.json").exists() and not list(run_dir.glob(".plan_*"))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a zombie has ended, unreaped
    except psutil.NoSuchProcess:
        return False


def _lock_owner(run_dir: Path) -> int | None:
    try:
        return json.loads((run_dir / ".lock").read_text())["pid"]
    except (OSError, ValueError):  # no lock, or its record being written
        return None


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
