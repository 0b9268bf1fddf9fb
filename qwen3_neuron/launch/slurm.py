"""SLURM through hydra-submitit-launcher: one task per node, each running torchrun once.

    python launch.py -m hydra/launcher=trn2_slurm run.nnodes=2 experiment=trn2_qwen3_4b_native

Each sweep job is one SLURM allocation of `run.nnodes` nodes with one task per node
(`conf/hydra/launcher/*.yaml`: `nodes: ${run.nnodes}`, `tasks_per_node: 1`). submitit runs the
Hydra task function - launch.py's `main` - once per task, i.e. once per node, in the same
sweep-job run dir (a shared filesystem, as SLURM clusters have). `node_settings` reads the job
from submitit's `JobEnvironment` (SLURM_NODEID, SLURM_JOB_NODELIST, SLURM_JOB_ID) and gives that
node's `run.*` values: its node rank and a c10d rendezvous on the job's first node. torchrun then
forms one job of nnodes x nproc_per_node ranks (`qwen3_neuron.job.torchrun`).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from qwen3_neuron.errors import ConfigError

RDZV_BASE_PORT = 29400
RDZV_PORTS = 1000  # the port is RDZV_BASE_PORT + job id % RDZV_PORTS: two jobs on a node differ


def node_settings(run: Mapping[str, Any]) -> dict[str, Any]:
    """`run.*` values for this node of a submitit SLURM job; {} outside one.

    `run` is the composed `run` section; its `nnodes` must equal the job's node count.
    """
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return {}
    import submitit

    job = submitit.JobEnvironment()
    if job.num_tasks != job.num_nodes:
        raise ConfigError(
            f"the SLURM job has {job.num_tasks} tasks on {job.num_nodes} nodes; this launcher needs "
            "one task per node (hydra.launcher.tasks_per_node=1): torchrun starts the ranks."
        )
    nnodes = run.get("nnodes", 1)
    if job.num_nodes != nnodes:
        raise ConfigError(
            f"run.nnodes={nnodes} but the SLURM job has {job.num_nodes} nodes: the launcher preset "
            "sets hydra.launcher.nodes=${run.nnodes}; do not sweep run.nnodes (one allocation size "
            "per sweep)."
        )
    settings: dict[str, Any] = {"node_rank": job.node, "rdzv_id": f"slurm-{job.job_id}"}
    if job.num_nodes > 1:
        port = RDZV_BASE_PORT + _job_number(job.job_id) % RDZV_PORTS
        settings["rdzv_endpoint"] = f"{job.hostnames[0]}:{port}"
    return settings


def with_node_settings(composed: dict[str, Any]) -> dict[str, Any]:
    """`composed` with this node's `run.*` filled in when running as a SLURM task."""
    settings = node_settings(composed.get("run") or {})
    if not settings:
        return composed
    return {**composed, "run": {**(composed.get("run") or {}), **settings}}


def _job_number(job_id: str) -> int:
    """'1234' or an array job's '1234_5' -> a number that differs between the two."""
    digits = "".join(c for c in job_id if c.isdigit())
    return int(digits) if digits else 0
