"""The end of `Trainer.train()` without its fixed wait.

torchtitan 0.3.0's `train()` ends with global rank 0 sleeping 2 s "for other ranks to complete".
Here every rank meets the others at a barrier after `train()` returns (`meet_after_training`),
which waits exactly as long as the slowest rank takes, so that sleep is taken out of torchtitan's
trainer module (`skip_the_closing_sleep`): every run, and every job of a sweep, ends 2 s sooner.
"""

from __future__ import annotations

import time
import types

CLOSING_SLEEP_SECONDS = 2  # torchtitan's, at the end of train(); any other sleep still sleeps


def skip_the_closing_sleep() -> None:
    """torchtitan's trainer module sees a `time` whose sleep(2) returns at once (idempotent)."""
    import torchtitan.trainer as trainer_module

    if isinstance(trainer_module.time, types.SimpleNamespace):
        return
    names = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}

    def sleep(seconds: float) -> None:
        if seconds != CLOSING_SLEEP_SECONDS:
            time.sleep(seconds)

    trainer_module.time = types.SimpleNamespace(**{**names, "sleep": sleep})


def meet_after_training() -> None:
    """Every rank waits here until all have finished training (what the sleep stood in for)."""
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.barrier()
