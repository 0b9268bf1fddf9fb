"""data=preference: torchtitan's trainer takes DPO steps (the objective: `trainers.dpo`).

The seam is the trainer's own `forward_backward_step` (and `train_step`, `validator.validate`),
replaced on the built trainer as worker/tensor_memory.py's meter is: a loss component sees only
the logits and labels, while DPO needs the reference's log-probabilities of the same batch (a
second forward, of the same model with its adapters off) and the pair each token belongs to.
Everything else - the data loader, optimizer, clipping, LR schedule, checkpoints, metrics - is
torchtitan's own step.

The loss is the mean over the pairs of the global batch: `train_step` counts the pairs of every
microbatch of the step on every data-parallel rank first (one all-reduce), and each microbatch's
backward is its pairs' loss sum over that count (with preference.sft_weight, plus the weighted
NLL sum of its chosen tokens over the global batch's chosen-token count, counted alongside). torchtitan adds the microbatches' returned
losses and sums them over the ranks for its log, so the logged loss is that mean too; FSDP sums
the ranks' gradients (torchtitan's divide factor 1), the gradient of the same mean.

The reference: finetune=lora, the same model with every adapter's output scaled by 0, under
no_grad (no second copy of the weights). finetune=full: a frozen copy of the starting weights
(`FrozenReference`: each rank copies its own shards once torchtitan has loaded them, at the first
step), swapped into the model's parameters in place for the reference forward and back after
it, so FSDP gathers them as it gathers the policy's; the copy is part of the checkpoints, so a
resumed run keeps the reference it started with. At the first step the policy is the reference
either way, and the sigmoid loss is ln 2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import spmd_types as spmd
import torch
from torchtitan.distributed import utils as dist_utils

from qwen3_neuron.data.packing import SEQUENCE_IDS
from qwen3_neuron.trainers.dpo import (
    METRIC_NAMES,
    mean_metrics,
    pair_metrics,
    pair_terms,
    sequence_sums,
    step_loss,
)
from qwen3_neuron.models.logprobs import model_token_logps
from qwen3_neuron.trainers.base import ObjectiveTrainer
from qwen3_neuron.trainers.reference import FrozenReference, adapters_off

METRIC_PREFIX = "preference/"  # the step's DPO metrics in torchtitan's metrics dict
VALIDATION_PREFIX = "validation_metrics/"
CHECKPOINT_KEY = "dpo_reference"  # the frozen reference's entry in torchtitan's checkpoint states


class PreferenceStep:
    """DPO in place of the trainer's language-model loss: `DPOTrainer`'s step. `base_train_step`
    is torchtitan's own (the microbatch loop), which this step's `train_step` runs."""

    def __init__(self, trainer, preference, lora: bool, base_train_step: Callable[[Iterator], None]):
        self.trainer = trainer
        self.frozen = None if lora else FrozenReference(trainer.model_parts[0])
        self.beta, self.loss_type, self.label_smoothing = preference.beta, preference.loss, preference.label_smoothing
        self.sft_weight = preference.sft_weight
        self._train_step = base_train_step
        self._global_counts = torch.ones(2, device=trainer.device)  # pairs, chosen tokens
        self._sums = torch.zeros(len(METRIC_NAMES), device=trainer.device)

    def register(self) -> None:
        """The step's metrics, held-out measure and checkpoint state, in the trainer's components."""
        if hasattr(getattr(self.trainer, "validator", None), "dl_config"):  # torchtitan's Validator, when enabled
            self.trainer.validator.validate = self.validate
        self.trainer.metrics_processor.step_metrics = self.step_metrics
        if self.frozen is not None:
            self.trainer.checkpointer.states[CHECKPOINT_KEY] = self.frozen

    # ---- training --------------------------------------------------------------------------

    def train_step(self, data_iterator: Iterator) -> None:
        trainer = self.trainer
        if self.frozen is not None and not int(self.frozen.taken):
            self.frozen.take()  # the starting weights: torchtitan loaded them before the first step
        microbatches = [next(data_iterator) for _ in range(trainer.gradient_accumulation_steps)]
        local = [_counts(input_dict[SEQUENCE_IDS]) for input_dict, _ in microbatches]
        self._global_counts = self._dp_sum(torch.tensor([float(sum(c)) for c in zip(*local)], device=trainer.device))
        self._sums = torch.zeros(len(METRIC_NAMES), device=trainer.device)
        self._train_step(iter(microbatches))

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens) -> torch.Tensor:
        trainer = self.trainer
        sequence_ids = input_dict.pop(SEQUENCE_IDS)
        inputs, labels, extra_kwargs = trainer.post_dataloading_process(input_dict, labels)
        model = trainer.model_parts[0]
        with trainer.train_context():
            reference = self._reference(model, inputs, labels, extra_kwargs, sequence_ids)
            policy, counts = _sequence_logps(model, inputs, labels, extra_kwargs, sequence_ids)
            terms = self._terms(policy, reference, counts)
            loss = step_loss(terms, *self._global_counts, self.sft_weight)
            with spmd.no_typecheck():  # as torchtitan's own backward
                loss.backward()
        self._sums += pair_metrics(terms)
        return loss.detach()

    def step_metrics(self) -> dict[str, float]:
        """The step's DPO metrics over the global batch (every rank calls this: one all-reduce)."""
        means = mean_metrics(self._dp_sum(self._sums), self.sft_weight)
        return {f"{METRIC_PREFIX}{name}": value for name, value in means.items()}

    # ---- validation ------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self, model_parts, step: int) -> None:
        """torchtitan's Validator's loop with the DPO metrics: `validator.steps` batches of the
        held-out pairs, the loss their mean over pairs."""
        validator, trainer = self.trainer.validator, self.trainer
        model = model_parts[0]
        model.eval()
        loader = validator.dl_config.build(
            dp_world_size=validator.dp_world_size, dp_rank=validator.dp_rank, tokenizer=validator.tokenizer,
            seq_len=validator.seq_len, local_batch_size=validator.local_batch_size,
        )  # fmt: skip
        sums = torch.zeros(len(METRIC_NAMES), device=trainer.device)
        for _, (input_dict, labels) in zip(range(validator.config.steps), loader):
            input_dict = {k: v.to(trainer.device) for k, v in input_dict.items()}
            sequence_ids = input_dict.pop(SEQUENCE_IDS)
            inputs, labels, extra_kwargs = validator.post_dataloading_process(
                input_dict, labels.to(trainer.device), model_parts
            )  # the validator's own: the trainer's counts the tokens it trains on
            with validator.validation_context():
                reference = self._reference(model, inputs, labels, extra_kwargs, sequence_ids)
                policy, counts = _sequence_logps(model, inputs, labels, extra_kwargs, sequence_ids)
            sums += pair_metrics(self._terms(policy, reference, counts))
        means = mean_metrics(self._dp_sum(sums), self.sft_weight)
        extra = {f"{VALIDATION_PREFIX}{METRIC_PREFIX}{name}": value for name, value in means.items()}
        validator.metrics_processor.log_validation(loss=means["loss"], step=step, extra_metrics=extra)
        model.train()

    # ---- shared ----------------------------------------------------------------------------

    def _reference(self, model, inputs, labels, extra_kwargs, sequence_ids) -> torch.Tensor:
        reference = adapters_off(model) if self.frozen is None else self.frozen.swapped_in()
        with torch.no_grad(), reference:
            sums, _ = _sequence_logps(model, inputs, labels, extra_kwargs, sequence_ids)
        return sums

    def _terms(self, policy, reference, counts):
        return pair_terms(policy, reference, counts, beta=self.beta, loss_type=self.loss_type,
                          label_smoothing=self.label_smoothing)  # fmt: skip

    def _dp_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        parallel_dims = self.trainer.parallel_dims
        if not parallel_dims.dp_enabled:
            return tensor
        return dist_utils.dist_sum_tensor(tensor, parallel_dims.get_mesh("batch"))


def _sequence_logps(model, inputs, labels, extra_kwargs, sequence_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's log-probability of each sequence's trained tokens, summed, and their counts."""
    return sequence_sums(model_token_logps(model, inputs, labels, extra_kwargs), sequence_ids)


def _counts(sequence_ids: torch.Tensor) -> tuple[int, int]:
    """(pairs, chosen tokens) in a batch: sequence ids run 0..2P-1 in each sample, even ids the
    chosen responses (-1: no loss)."""
    pairs = int(((sequence_ids.max(dim=-1).values + 1) // 2).sum())
    return pairs, int(((sequence_ids >= 0) & (sequence_ids % 2 == 0)).sum())


class DPOTrainer(ObjectiveTrainer):
    """trainer=dpo (data=preference): torchtitan's trainer taking DPO steps (`PreferenceStep`)."""

    def __init__(self, config, *, settings, seed: int):
        super().__init__(config, settings=settings, seed=seed)
        self.preference = PreferenceStep(self, settings.preference, self.lora, super().train_step)
        self.preference.register()

    def train_step(self, data_iterator: Iterator) -> None:
        self.preference.train_step(data_iterator)

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens) -> torch.Tensor:
        return self.preference.forward_backward_step(input_dict=input_dict, labels=labels,
                                                     global_valid_tokens=global_valid_tokens)  # fmt: skip

    def held_tensors(self) -> list[torch.Tensor]:
        return self.preference.frozen.copies if self.preference.frozen is not None else []
