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


class StepTrainer(ObjectiveTrainer):
    """An objective whose step is an object of its own (`make_step`, handed torchtitan's own
    `train_step`, the microbatch loop): GRPO's and the preference family's. The step registers its
    metrics, held-out measure and checkpoint states; its `frozen` reference, if any, is held."""

    def __init__(self, config: Trainer.Config, *, settings, seed: int):
        super().__init__(config, settings=settings, seed=seed)
        self.objective_step = self.make_step(super().train_step)
        self.objective_step.register()

    def make_step(self, base_train_step):
        raise NotImplementedError

    def train_step(self, data_iterator) -> None:
        self.objective_step.train_step(data_iterator)

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens) -> torch.Tensor:
        return self.objective_step.forward_backward_step(input_dict=input_dict, labels=labels,
                                                         global_valid_tokens=global_valid_tokens)  # fmt: skip

    def held_tensors(self) -> list[torch.Tensor]:
        frozen = self.objective_step.frozen
        return frozen.copies if frozen is not None else []


def held_out_loader(validator):
    """A new loader of the held-out rows, built as torchtitan's Validator builds its own at each
    validation, for an objective's validation loop."""
    return validator.dl_config.build(
        dp_world_size=validator.dp_world_size, dp_rank=validator.dp_rank, tokenizer=validator.tokenizer,
        seq_len=validator.seq_len, local_batch_size=validator.local_batch_size,
    )  # fmt: skip
