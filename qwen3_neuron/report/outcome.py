"""How a job ended (`JobOutcome`) and the code the launch exits with (`launch_exit_code`).

A job Hydra runs in the launcher's own process hands its outcome to launch.py directly. The jobs
of a sweep that hydra-submitit-launcher runs elsewhere (SLURM, submitit_local) cannot: Hydra
hands launch.py nothing of them, and its callbacks swallow exceptions. So at the end of such a
sweep the sweep report (`hydra_callbacks.SweepReport`, in the launcher) reads each job's outcome
from the summary.json it wrote and hands them over by raising `SweepEnded`, which Hydra lets through.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class JobOutcome:
    """How one job ended: its exit code (0 completed or dry run, 1 failed, interrupted or
    skipped, 2 config error), its objective for a sweeper (None when it failed: the sweep goes
    on unless run.stop_on_failure) and its summary (None when it wrote none)."""

    exit_code: int
    single_run: bool
    objective: float | None = None
    summary: dict | None = None

    @classmethod
    def recorded(cls, summary: dict[str, Any]) -> JobOutcome:
        """A sweep job's outcome from its summary.json (status `unknown` when it wrote none: it
        did not finish)."""
        return cls(summary.get("exit_code") or (0 if summary["status"] == "completed" else 1), False, summary=summary)


def launch_exit_code(outcomes: list[JobOutcome]) -> int:
    """A single run's own exit code; a sweep's: 1 if any of its jobs did not complete (a sweep
    of dry runs: 0 when every plan was fine)."""
    if len(outcomes) == 1 and outcomes[0].single_run:
        return outcomes[0].exit_code
    return 1 if any(outcome.exit_code for outcome in outcomes) else 0


class SweepEnded(BaseException):
    """A sweep whose jobs ran in other processes ended: their recorded outcomes, for launch.py.
    A BaseException: Hydra's callback runner turns an Exception into a warning."""

    def __init__(self, outcomes: list[JobOutcome]):
        super().__init__(f"{len(outcomes)} jobs ran elsewhere")
        self.outcomes = outcomes
