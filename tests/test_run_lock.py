"""A run dir has one owner: the lock a launch holds (qwen3_neuron.launch.run_lock), in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace

import pytest
from conftest import REPO

from qwen3_neuron.errors import RunDirInUse
from qwen3_neuron.launch import run_lock
from qwen3_neuron.launch.run_lock import STALE_AFTER_SECONDS, Owner, RunDirLock
from qwen3_neuron.run_dir import earlier_run

HOLD = """
import sys, time
from pathlib import Path
from qwen3_neuron.launch.run_lock import RunDirLock
RunDirLock.take(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(120)
"""


def test_a_live_owner_is_named_and_a_kill_9_leaves_a_lock_the_next_launch_takes_over(tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunDirInUse) as refused:
            RunDirLock.take(tmp_path)
        message = str(refused.value)
        assert f"run dir {tmp_path} is in use by another launch (pid {holder.pid} on host {os.uname().nodename}" in message
        assert f"kill {holder.pid} on its host" in message and f"run.resume={tmp_path}" in message
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == holder.pid  # what kill -9 leaves

    lock = RunDirLock.take(tmp_path)
    assert f"took over a stale lock; its owner is gone (pid {holder.pid} on host" in capsys.readouterr().err
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / ".lock").exists()


def test_a_record_counts_only_while_its_process_or_its_host_is_alive(tmp_path, capsys):
    me = Owner.this_process()
    lock_file = tmp_path / ".lock"

    def taken_over_from(owner: Owner, age: float = 0.0) -> bool:
        lock_file.write_text(json.dumps(asdict(owner)))
        os.utime(lock_file, (time.time() - age, time.time() - age))
        try:
            RunDirLock.take(tmp_path).release()
        except RunDirInUse:
            return False
        return "took over a stale lock" in capsys.readouterr().err

    # no flock held (a file system without locks, or Lustre's node-local localflock): the record decides
    assert not taken_over_from(me)  # this very process: alive
    assert taken_over_from(replace(me, started=me.started - 3600))  # its pid, reused by a later process
    elsewhere = replace(me, host="another-node", pid=1)
    assert not taken_over_from(elsewhere)  # another host, refreshing its lock
    assert taken_over_from(elsewhere, age=STALE_AFTER_SECONDS + 1)  # another host that stopped refreshing it


def test_each_node_of_a_multi_node_job_holds_its_own_lock(tmp_path):
    node0, node1 = RunDirLock.take(tmp_path, 0), RunDirLock.take(tmp_path, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", ".lock.node1"]
    with pytest.raises(RunDirInUse):
        RunDirLock.take(tmp_path, 1)
    node0.release()
    node1.release()
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("left", ["summary.json", "metrics.jsonl", "train.log", "failure.json", "job.yaml"])
def test_a_dir_holding_a_run_is_named_by_what_it_holds_and_a_dry_runs_record_is_not_a_run(tmp_path, left):
    """Finished (summary), interrupted (metrics, output) or stopped at its plan (job.yaml): a run.
    A dry run's or run.show_data's record (job.yaml beside PLAN_ONLY.txt) is not."""
    (tmp_path / left).write_text("")
    assert earlier_run(tmp_path) == left
    (tmp_path / "PLAN_ONLY.txt").write_text("")
    assert earlier_run(tmp_path) == (None if left == "job.yaml" else left)


def test_a_held_flock_refuses_even_when_the_record_looks_like_another_hosts_stale_one(tmp_path):
    """Where flock works it decides: a launch whose view of the record is another host's stale one
    (a record being rewritten, a clock off) is still refused while the owner holds the dir."""
    owner = RunDirLock.take(tmp_path)
    stale = replace(Owner.this_process(), host="another-node", pid=1)
    (tmp_path / ".lock").write_text(json.dumps(asdict(stale)))
    long_ago = time.time() - STALE_AFTER_SECONDS - 1
    os.utime(tmp_path / ".lock", (long_ago, long_ago))
    try:
        with pytest.raises(RunDirInUse, match="in use by another launch \\(pid 1 on host another-node"):
            RunDirLock.take(tmp_path)
    finally:
        owner.release()


def test_the_owner_refreshes_its_record_while_it_holds_the_dir(tmp_path, monkeypatch):
    """Another host judges the owner alive by the record's age: the heartbeat keeps it fresh."""
    monkeypatch.setattr(run_lock, "HEARTBEAT_SECONDS", 0.05)
    lock = RunDirLock.take(tmp_path)
    long_ago = time.time() - STALE_AFTER_SECONDS - 1
    os.utime(tmp_path / ".lock", (long_ago, long_ago))
    try:
        deadline = time.time() + 5
        while (tmp_path / ".lock").stat().st_mtime < long_ago + 1 and time.time() < deadline:
            time.sleep(0.05)
        assert time.time() - (tmp_path / ".lock").stat().st_mtime < STALE_AFTER_SECONDS
    finally:
        lock.release()
