"""One learning-rate rule, however a run is resumed or extended.

torchtitan's schedule is a function of the step, planned over `lr_scheduler.total_steps` (else
`training.steps`). Two things keep a resume's rates equal to that function:

- past the schedule's end the rate stays at its last step's rate (torchtitan's linear decay
  would go to 0, then below): an extended run (`run.resume=D training.steps=N`, which keeps the
  schedule the run was planned with: `launch.resume`) trains its new steps at the rate of the
  old last step;
- after a checkpoint is loaded, the optimizer takes the rate the schedule gives for the next
  step. torchtitan restores only the scheduler's step count; the optimizer's saved state holds
  the rate computed before the save, which differs from the schedule's once it has changed.

A run that is neither resumed nor trained past its schedule's end trains at torchtitan's rates.
"""

from __future__ import annotations


def schedule_end(config) -> int:
    """The step the run's schedule was planned to end at."""
    return getattr(config.lr_scheduler, "total_steps", None) or config.training.steps


def follow_one_schedule(trainer, end: int) -> None:
    """Install the rule on a built trainer, before `trainer.train()` loads its checkpoint."""
    for scheduler in trainer.lr_schedulers.schedulers:
        scheduler.lr_lambdas = [_held_after(rate, end) for rate in scheduler.lr_lambdas]
    load = trainer.checkpointer.load

    def load_then_take_the_schedules_rate(*args, **kwargs):  # torchtitan's load sets the last rate
        loaded = load(*args, **kwargs)
        for scheduler in trainer.lr_schedulers.schedulers:
            for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr()):
                group["lr"] = lr
        return loaded

    trainer.checkpointer.load = load_then_take_the_schedules_rate


def _held_after(rate, end: int):
    """`rate` (a factor of the 0-based step index), its last step's factor after `end` steps."""
    return lambda index: rate(min(index, end - 1))
