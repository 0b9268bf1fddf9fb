"""torchtitan's `Trainer` as every objective's: built from the job's settings.

An objective's trainer overrides torchtitan's `train_step` and `forward_backward_step` and calls
torchtitan's own (`super()`) for what stays the same: the microbatch loop, the optimizer,
clipping, the LR schedule, checkpoints and metrics.
"""

from __future__ import annotations

import torch
from torchtitan.trainer import Trainer


class ObjectiveTrainer(Trainer):
    """torchtitan's Trainer, built with the job's settings (`settings`, the framework's sections)
    and the run's seed."""

    def __init__(self, config: Trainer.Config, *, settings, seed: int):
        super().__init__(config)
        self.settings, self.seed = settings, seed

    @property
    def lora(self) -> bool:
        return self.settings.finetune.method == "lora"

    def held_tensors(self) -> list[torch.Tensor]:
        """Tensors the objective keeps across steps besides the model's and the optimizer's (the
        step meter counts them)."""
        return []


class SFTTrainer(ObjectiveTrainer):
    """The language-model loss (data=text|chat|mix: chat rows' assistant tokens only): torchtitan's own step."""
