"""SLURM through hydra-submitit-launcher: the node settings a SLURM task gets (unit), and a real
Hydra sweep on a real SLURM (integration).

The test starts a one-node cluster on localhost from Debian's slurm-wlm and munge
(scripts/install_slurm.sh installs them): munged, then slurmctld and slurmd with a slurm.conf it writes
into tmp. It submits a 2-job sweep with hydra/launcher=local_slurm, waits for it, checks that
both jobs trained inside SLURM and wrote their summary.json, and stops the daemons it started, by
the PIDs in their pid files. Without SLURM, root or the launcher plugin it skips and says why.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, read_jsonl

from qwen3_neuron.errors import ConfigError
from qwen3_neuron.launch import slurm as slurm_module

SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("munge", "sbatch", "sinfo", "squeue", "scancel", "scontrol")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_PID = Path("/run/munge/munged.pid")


def which(name: str) -> str | None:
    return shutil.which(name, path=SBIN_PATH)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_by_pid_file(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):  # up to 5 s to exit
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


class LocalSlurm:
    """A one-node SLURM on localhost, all state under `root`."""

    def __init__(self, root: Path):
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": SBIN_PATH}
        self.started_pid_files: list[Path] = []

    def start(self) -> None:
        self._start_munge()
        self._write_conf()
        for daemon, pid_file in (("slurmctld", "slurmctld.pid"), ("slurmd", "slurmd.pid")):
            self._run([which(daemon), "-f", str(self.conf)], f"{daemon} did not start")
            self.started_pid_files.append(self.root / pid_file)
        self._wait_until_idle()

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "--quiet", "-u", "root"], env=self.env, timeout=30, check=False)
        for pid_file in reversed(self.started_pid_files):
            stop_by_pid_file(pid_file)

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {log.name}\n" + log.read_text(errors="replace")[-2000:]
            for log in sorted(self.root.glob("*.log"))
        )  # fmt: skip

    def _start_munge(self) -> None:
        if subprocess.run(["munge", "-n"], env=self.env, capture_output=True, timeout=10).returncode == 0:
            return  # a munged is already serving: use it, leave it running
        if not MUNGE_KEY.exists() or MUNGE_KEY.stat().st_size != 1024:
            MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
            MUNGE_KEY.write_bytes(secrets.token_bytes(1024))
        MUNGE_KEY.chmod(0o400)
        MUNGE_PID.parent.mkdir(parents=True, exist_ok=True)
        shutil.chown(MUNGE_KEY, "munge", "munge")
        shutil.chown(MUNGE_PID.parent, "munge", "munge")
        self._run([which("munged"), "--force"], "munged did not start")
        self.started_pid_files.append(MUNGE_PID)

    def _write_conf(self) -> None:
        for folder in ("state", "spool"):
            (self.root / folder).mkdir(exist_ok=True)
        memory_mb = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
        ctld_port, slurmd_port = free_port(), free_port()
        self.conf.write_text(
            f"""ClusterName=qwen3test{ctld_port}
SlurmctldHost={self.host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd.pid
SlurmctldLogFile={self.root}/slurmctld.log
SlurmdLogFile={self.root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={min(20000, memory_mb * 9 // 10)} State=UNKNOWN
PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
"""
        )

    def _wait_until_idle(self, timeout: float = 90) -> None:
        deadline = time.time() + timeout
        state = ""
        while time.time() < deadline:
            result = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True, timeout=10)
            state = result.stdout.strip()
            if state == "idle":
                return
            time.sleep(1)
        raise RuntimeError(f"the node is not idle after {timeout:.0f} s (sinfo: {state!r})")

    def _run(self, command: list[str], failure: str) -> None:
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"{failure}: {result.stderr.strip() or result.stdout.strip()}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [name for name in DAEMONS + CLIENTS if which(name) is None]
    if missing:
        pytest.skip(f"SLURM/munge not installed ({', '.join(missing)} missing): run scripts/install_slurm.sh as root")
    if os.geteuid() != 0:
        pytest.skip("the local SLURM runs munged, slurmctld and slurmd as root; not root here")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install hydra-submitit-launcher==1.2.0")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        cluster.stop()
        pytest.skip(f"SLURM did not start here: {e}\n{cluster.log_tail()}")
    yield cluster
    cluster.stop()


# ---- unit: what one task of a SLURM job gets --------------------------------------------------

SLURM_JOB = {
    "SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "trn2-[07-08]",
}  # fmt: skip


def test_each_node_of_a_slurm_job_gets_its_rank_and_the_first_hosts_rendezvous(monkeypatch):
    pytest.importorskip("submitit")
    for name, value in SLURM_JOB.items():
        monkeypatch.setenv(name, value)
    composed = {"run": {"nnodes": 2, "nproc_per_node": 64}, "training": {"steps": 5}}
    settled = slurm_module.with_node_settings(composed)
    assert settled["run"] == {
        "nnodes": 2, "nproc_per_node": 64, "node_rank": 1,
        "rdzv_id": "slurm-4242", "rdzv_endpoint": f"trn2-07:{29400 + 4242 % 1000}",
    }  # fmt: skip
    assert settled["training"] == {"steps": 5}
    with pytest.raises(ConfigError, match="run.nnodes=4 but the SLURM job has 2 nodes"):
        slurm_module.node_settings({"nnodes": 4})
    monkeypatch.setenv("SLURM_NTASKS", "128")
    with pytest.raises(ConfigError, match="one task per node"):
        slurm_module.node_settings({"nnodes": 2})


def test_outside_slurm_nothing_changes(monkeypatch):
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    composed = {"run": {"nnodes": 1}}
    assert slurm_module.with_node_settings(composed) is composed


@pytest.mark.parametrize("preset", ["trn2_slurm", "local_slurm"])
def test_launcher_presets_allocate_run_nnodes_nodes_with_one_task_each(preset):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install hydra-submitit-launcher==1.2.0")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from qwen3_neuron.launch.hydra_setup import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra/launcher={preset}", "run.nnodes=4"], return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert (launcher["nodes"], launcher["tasks_per_node"]) == (4, 1)
    assert launcher["additional_parameters"]["exclusive"] is True
    if preset == "trn2_slurm":
        assert launcher["cpus_per_task"] == 192 and "export FI_PROVIDER=efa" in launcher["setup"]


# ---- integration: a sweep on a local one-node SLURM -----------------------------------------


@pytest.mark.integration
def test_a_two_job_sweep_trains_on_slurm(slurm, assets, tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), "-m", "hydra/launcher=local_slurm",
         "experiment=cpu_qwen3_tiny_native", "optimizer.lr=1e-3,3e-3", f"hydra.sweep.dir={sweep_dir}"],
        cwd=REPO, env={**slurm.env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + slurm.log_tail()

    # submitit's folder: one SLURM job per sweep job (an array: <job id>_<index>), each logged
    job_folders = sorted(p for p in (sweep_dir / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name))
    assert [p.name.split("_")[1] for p in job_folders] == ["0", "1"]
    final_losses = []
    for num, job_folder in enumerate(job_folders):
        run_dir = sweep_dir / str(num)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["exit_code"] == 0 and summary["steps"] == 5
        assert summary["final_loss"] < summary["first_loss"] - 0.3
        assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5]
        # main ran inside the SLURM job: slurm.node_settings gave this node's run keys
        job = (run_dir / "job.yaml").read_text()
        assert "node_rank: 0" in job and f"rdzv_id: slurm-{job_folder.name}" in job
        assert "[qwen3-neuron] completed" in "".join(p.read_text() for p in job_folder.glob("*_log.out"))
        final_losses.append(summary["final_loss"])
    assert final_losses[0] != final_losses[1]  # two learning rates, two runs


@pytest.mark.integration
def test_a_sweep_whose_job_fails_on_slurm_exits_1(slurm, assets, tmp_path):
    """The job runs in a SLURM job, not in the launcher: the launcher reads its outcome back from
    its summary.json at the sweep's end. It fails fast: a MoE key on a dense model."""
    sweep_dir = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), "-m", "hydra/launcher=local_slurm", "model.top_k=1",
         f"hydra.sweep.dir={sweep_dir}"],
        cwd=REPO, env={**slurm.env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:] + slurm.log_tail()
    summary = json.loads((sweep_dir / "0" / "summary.json").read_text())
    assert (summary["status"], summary["exit_code"]) == ("failed", 2)
    assert summary["error"].startswith("config error: model.top_k applies to model=moe only")
    assert "1 jobs, 0 completed, 1 failed." in (sweep_dir / "summary.md").read_text()
