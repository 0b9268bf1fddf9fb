"""The launcher <-> local rank 0 handoff while torchrun starts.

The launcher settles the job and writes it (`job.yaml`), then starts torchrun at once: the plan
is made by local rank 0 once it has imported torchtitan (which the launcher then never imports),
since on 2 cores a third torchtitan import would delay every worker. The launcher gives the
workers a handoff (`HANDOFF_ENV`: a token for this launch and its pid). Local rank 0 plans from
job.yaml and records the plan, then writes `.plan_ready.<token>` (the `PlannedRun` the launcher
reports with) or `.plan_error.<token>` (the config or data error). The launcher, once it has
written what the workers read when they build (peak_flops.json: measured while they wait),
writes `.plan_go.<token>`; every rank waits for it, and stops at a plan error or when the
launcher is gone. One set of files per launch: the nodes of a multi-node job may share the run
dir. A worker run by hand from a recorded run dir has no handoff and builds at once.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qwen3_neuron.run_dir import group_replacements, write_atomically

HANDOFF_ENV = "QWEN3_NEURON_HANDOFF"
PLAN_POLL_SECONDS = 0.02
PLANNING_LINE = "[qwen3-neuron] local rank 0: torchtitan imported; planning for the launcher"
PLAN_FAILED_EXIT = 2  # local rank 0's exit code when the plan found a config error


@dataclass(frozen=True)
class PlannedRun:
    """What the launcher needs of a plan to run and report the job, without torchtitan."""

    steps: int
    world_size: int
    parameters: dict[str, int]  # trainable_parameters, total_parameters
    replacements: list[str]  # torchtitan's "[Override] target: fqn Old -> New" lines
    messages: list[str]  # the plan's warnings and notes, for the launcher to print
    vocab_size: int  # the first-loss check's reference, ln(vocab_size)
    weights_loaded: bool  # the run starts from initial weights
    dtype: str  # the matmuls' dtype, for the peak FLOPs
    exports_hf: bool  # the last save is in HF: global rank 0 exports after training (EXPORT_FILE)
    # the run dir's checkpoint it loads, and the damaged ones skipped: {checkpoint_loaded, checkpoints_skipped}
    checkpoint: dict[str, Any] = field(default_factory=dict)

    def replacements_by_override(self) -> dict[str, list[str]]:
        """{override target: ["fqn Old -> New", ...]}, for the summary."""
        return group_replacements(self.replacements)


@dataclass(frozen=True)
class Handoff:
    """What workers started before the plan was made need to know meanwhile."""

    token: str  # names this launch's plan files
    launcher_pid: int

    def to_env(self) -> dict[str, str]:
        return {HANDOFF_ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls) -> Handoff | None:
        value = os.environ.get(HANDOFF_ENV)
        return cls(**json.loads(value)) if value else None

    def files(self, run_dir: Path) -> dict[str, Path]:
        return {kind: run_dir / f".plan_{kind}.{self.token}" for kind in ("ready", "error", "go")}

    # ---- launcher
    def wait_for_plan(self, run_dir: Path, alive) -> PlannedRun | tuple[str, str] | None:
        """Local rank 0's PlannedRun, the user's mistake it found (`plan_failed`'s label and
        message), or None if `alive()` turned false first."""
        files = self.files(run_dir)
        while True:
            if files["ready"].exists():
                return PlannedRun(**json.loads(files["ready"].read_text()))
            if files["error"].exists():
                error = json.loads(files["error"].read_text())
                return error["label"], error["message"]
            if not alive():
                return None
            time.sleep(PLAN_POLL_SECONDS)

    def let_workers_build(self, run_dir: Path) -> None:
        """After the plan, once the run dir holds what the workers read when they build."""
        write_atomically(self.files(run_dir)["go"], "")

    def remove_files(self, run_dir: Path) -> None:
        for path in self.files(run_dir).values():
            path.unlink(missing_ok=True)

    # ---- workers
    def plan_ready(self, run_dir: Path, planned: PlannedRun) -> None:
        """Local rank 0: the plan is recorded; every rank may build."""
        write_atomically(self.files(run_dir)["ready"], json.dumps(asdict(planned)))

    def plan_failed(self, run_dir: Path, label: str, message: str) -> None:
        """Local rank 0: the plan found a mistake the user can fix ("Config error", its message)."""
        write_atomically(self.files(run_dir)["error"], json.dumps({"label": label, "message": message}))

    def wait_for_go(self, run_dir: Path) -> None:
        """Every rank: return once the launcher lets the workers build (local rank 0 recorded the
        plan); exit if the plan failed or the launcher is gone."""
        files = self.files(run_dir)
        while not files["go"].exists():
            if files["error"].exists():
                raise SystemExit(PLAN_FAILED_EXIT)
            try:
                os.kill(self.launcher_pid, 0)
            except ProcessLookupError:
                raise SystemExit(f"the launcher (pid {self.launcher_pid}) exited before the plan was ready")
            time.sleep(PLAN_POLL_SECONDS)
