"""The torchrun command of a settled job (`job.job.Job.settled`: its device resolved): ranks per
node, torchrun's own arguments (one node standalone, or one node of a multi-node job) and the
workers' environment.

All of it comes from the framework's own settings, without torchtitan, so the launcher can start
torchrun while its plan is still checking the rest (`handoff.Handoff`).

One node without a rendezvous endpoint keeps `--standalone` (torchrun picks a free local port).
A multi-node job runs the same launch once per node - by hand, or once per node of a SLURM job
(`qwen3_neuron.launch.slurm`) - and every node meets at a c10d rendezvous:

    node 0:  launch.py run.nnodes=2 run.node_rank=0 run.rdzv_endpoint=node0:29500 run.rdzv_id=job7
    node 1:  launch.py run.nnodes=2 run.node_rank=1 run.rdzv_endpoint=node0:29500 run.rdzv_id=job7

Node 0 hosts the rendezvous store (`is_host`, so the endpoint may be any name or address that
reaches it). Global ranks are given out by the rendezvous; the run's metrics come from the rank
torchtitan picks for them, whichever node holds it.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qwen3_neuron.devices import policy as devices
from qwen3_neuron.errors import ConfigError
from qwen3_neuron.run_dir import RANKS_LOG_DIR

if TYPE_CHECKING:
    from qwen3_neuron.job.job import Job


@dataclass(frozen=True)
class WorkerLaunch:
    nproc_per_node: int
    command: list[str]
    env: dict[str, str]  # added to the launcher's own environment for torchrun

    def command_line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.command)}".strip()


def worker_launch(job: Job, run_dir: Path) -> WorkerLaunch:
    """How this node starts the workers of a settled `Job`; a dry run may plan for a device that
    is not here (the plan says so)."""
    settings, device = job.settings, job.device
    nproc = settings.run.nproc_per_node
    if nproc is None:
        nproc = devices.default_nproc(device)
        if nproc < 1:  # a dry run for GPUs that are not here
            raise ConfigError(
                f"device={device}: no {device} device here to count ranks from; set run.nproc_per_node=N "
                "(devices per node) to plan for N of them."
            )
    if nproc < 1:
        raise ConfigError(f"run.nproc_per_node must be >= 1, got {nproc}.")
    # CPU: the ranks forked from one process that imported torchtitan (`worker.forked_torchrun`)
    runner = "qwen3_neuron.worker.forked_torchrun" if device == "cpu" else "torch.distributed.run"
    command = [
        sys.executable, "-m", runner, *torchrun_args(settings.run, nproc, run_dir),
        "-m", "qwen3_neuron.worker.train", str(run_dir),
    ]  # fmt: skip
    # user kernels and rewards importable where the run was first launched are importable in the workers too
    env = {**devices.worker_env(device, nproc), **devices.compiler_env(device),
           "PYTHONPATH": os.pathsep.join(settings.run.python_path or devices.launch_python_path())}  # fmt: skip
    if device == "neuron":  # settled with the job; recorded in command.sh, even when it was exported
        env[devices.NEFF_CACHE_ENV] = settings.device.cache_dir
    return WorkerLaunch(nproc, command, env)


def compile_cache_line(requested: str | None, launch: WorkerLaunch) -> str | None:
    """device=neuron: what a dry run says of TorchNeuron's NEFF cache in the workers' env
    (`requested`: device.cache_dir as the user set it, for where the choice came from). Outside
    the run dir on purpose: runs and sweep jobs share it."""
    if devices.NEFF_CACHE_ENV not in launch.env:
        return None
    _, source = devices.neff_cache_dir(requested)
    return (
        f"compile cache: {launch.env[devices.NEFF_CACHE_ENV]} ({devices.NEFF_CACHE_ENV}; {source}) - shared by "
        "every run and sweep job that compiles the same graphs; the only place the project has this run write "
        "outside its run dir"
    )


def torchrun_args(run, nproc: int, run_dir: Path) -> list[str]:
    """The arguments between `python -m torch.distributed.run` and `-m qwen3_neuron.worker.train`.

    `run` is the framework's `RunSettings` (nnodes, node_rank, rdzv_endpoint, rdzv_id,
    max_restarts); raises ConfigError when they do not describe one node of a job.
    """
    check_run_settings(run)
    if run.nnodes == 1 and not run.rdzv_endpoint:
        rendezvous = ["--standalone"]
        log_dir = run_dir / RANKS_LOG_DIR
    else:
        rendezvous = [
            f"--nnodes={run.nnodes}",
            f"--node-rank={run.node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={run.rdzv_endpoint}",
            f"--rdzv-id={run.rdzv_id}",
            # node 0 serves the store; the others only connect (never race to host it)
            f"--rdzv-conf=is_host={'true' if run.node_rank == 0 else 'false'}",
        ]
        # per node: on a shared run dir, local rank 0 of every node would write the same file
        log_dir = run_dir / RANKS_LOG_DIR / f"node{run.node_rank}"
    restarts = [f"--max-restarts={run.max_restarts}"] if run.max_restarts else []
    return [
        *rendezvous, f"--nproc_per_node={nproc}", *restarts,
        # every rank's full output under the run dir; the terminal shows local rank 0's
        f"--log-dir={log_dir}", "--tee=3", "--local-ranks-filter=0", "--role=rank",
    ]  # fmt: skip


def check_run_settings(run) -> None:
    if run.nnodes < 1:
        raise ConfigError(f"run.nnodes must be >= 1, got {run.nnodes}.")
    if not 0 <= run.node_rank < run.nnodes:
        raise ConfigError(
            f"run.node_rank={run.node_rank} is outside 0..{run.nnodes - 1} (run.nnodes={run.nnodes})."
        )
    if run.max_restarts < 0:
        raise ConfigError(f"run.max_restarts must be >= 0, got {run.max_restarts}.")
    if run.nnodes > 1 and not run.rdzv_endpoint:
        raise ConfigError(
            f"run.nnodes={run.nnodes} needs run.rdzv_endpoint=<host>:<port> of node 0 (the same on "
            "every node), e.g. run.rdzv_endpoint=node0:29500, and a shared run.rdzv_id. Under "
            "SLURM (hydra/launcher=trn2_slurm) both are set from the job."
        )
    if run.rdzv_endpoint:
        host, _, port = run.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"run.rdzv_endpoint={run.rdzv_endpoint} is not <host>:<port> (e.g. node0:29500)."
            )
    if not str(run.rdzv_id) or any(c.isspace() for c in str(run.rdzv_id)):
        raise ConfigError(f"run.rdzv_id={run.rdzv_id!r}: must be a non-empty word, the same on every node.")
