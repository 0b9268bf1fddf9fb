"""Local rank 0 of workers the launcher started before planning: plan the job the launcher
settled and recorded (job.yaml), record the plan, and hand the launcher what it reports with
(`handoff.Handoff`); this rank then trains with the plan's job and `Trainer.Config` (built
and checked once).

The plan is the launcher's (`job.plan.make_plan`, the same call a dry run makes in the
launcher); it runs here because this process has imported torchtitan anyway, and a third import
in the launcher would hold back every worker on a small host.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwen3_neuron.handoff import PLAN_FAILED_EXIT, PLANNING_LINE, Handoff

if TYPE_CHECKING:
    from qwen3_neuron.job.plan import Plan


def plan_for_the_launcher(run_dir: Path, handoff: Handoff, recorded_job: dict[str, Any]) -> Plan:
    """Record the plan of the job the launcher settled (job.yaml, as `run_dir.read_job` returns
    it) and say it is ready; a config or data error is handed over and ends this rank."""
    from qwen3_neuron.errors import ConfigError, DataError, user_error_label
    from qwen3_neuron.job.checks.torchtitan_api import check_torchtitan_api
    from qwen3_neuron.job.job import Job

    print(PLANNING_LINE, flush=True)
    messages: list[str] = []
    try:
        job = Job.recorded(recorded_job)  # this process's one parse
        check_torchtitan_api(job.settings.model.kind)  # before the plan's modules import them
        from qwen3_neuron.job.plan import make_plan
        from qwen3_neuron.job.record import record_plan

        nproc = int(os.environ["LOCAL_WORLD_SIZE"])  # torchrun's --nproc_per_node
        plan = make_plan(job, run_dir, nproc, messages.append)
        loads = _checked_checkpoint(plan, messages.append)
        planned = dataclasses.replace(record_plan(plan, run_dir, messages), checkpoint=loads)
    except (ConfigError, DataError) as e:
        handoff.plan_failed(run_dir, user_error_label(e), str(e))
        raise SystemExit(PLAN_FAILED_EXIT) from None
    handoff.plan_ready(run_dir, planned)
    return plan


def _checked_checkpoint(plan, warn: Callable[[str], None]) -> dict[str, Any]:
    """The run dir's checkpoint this launch loads, checked before any rank builds (node 0 checks
    the folder the nodes share; a damaged one is set aside: `worker.checkpoint_check`)."""
    from qwen3_neuron.worker.checkpoint_check import check_checkpoints

    checkpoint = plan.trainer_config.checkpoint
    if not checkpoint.enable or plan.settings.run.node_rank != 0:
        return {}
    return check_checkpoints(Path(plan.trainer_config.dump_folder) / checkpoint.folder, checkpoint.load_step, warn)
