"""Worker side of finetune.dropout > 0: each step's dropout masks drawn from (run seed, step).

torchtitan 0.3.0 checkpoints no RNG state: a run resumed at step k would draw its masks from the
generator as seeded at start-up, not as the uninterrupted run left it at step k. Seeding the
generator at the first training forward of each step from the seed torchtitan's
`set_determinism` gave this rank, plus the step, makes the masks a function of the step, so a
resumed run's losses equal the uninterrupted run's.
"""

from __future__ import annotations


def seed_each_step(trainer) -> None:
    """Install the reseeding on the trainer's model parts (after `set_determinism`, i.e. once the
    trainer is built); forwards in eval mode (validation) are left alone."""
    import torch

    run_seed = torch.initial_seed()
    seeded_step = [None]

    def reseed(module, args) -> None:
        if module.training and trainer.step != seeded_step[0]:  # one seeding per step (grad accumulation)
            seeded_step[0] = trainer.step
            torch.manual_seed((run_seed + trainer.step) % 2**64)

    for part in trainer.model_parts:
        part.register_forward_pre_hook(reseed)
