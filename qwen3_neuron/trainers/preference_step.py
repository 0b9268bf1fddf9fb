"""data=preference: the preference trainers' shared step (trainer=dpo|orpo|simpo|kto), torchtitan's
trainer taking steps of one preference objective (`PreferenceObjective`: DPO's in `trainers.dpo`,
ORPO's, SimPO's and KTO's in their modules, each its formulas and its trainer class).

The seam is the trainer's own `forward_backward_step` (and `train_step`, `validator.validate`): a
loss component sees only the logits and labels, while these objectives need the log-probability
of each whole response, the pair (or KTO unit) each token belongs to and, for DPO and KTO, the
reference's log-probabilities of the same batch (a second forward, of the same model with its
adapters off or its starting weights swapped in). Everything else - the data loader, optimizer,
clipping, LR schedule, checkpoints, metrics - is torchtitan's own step.

A sample holds whole slots of two sequences (`data.packing.SEQUENCE_IDS`: 2k and 2k + 1): a
pair's chosen and rejected responses, or KTO's completion and the mismatched completion its KL
estimate reads. The loss is a mean over the slots of the global batch: `train_step` counts the
slots of every microbatch of the step on every data-parallel rank first (one all-reduce), with
the chosen tokens (an NLL term's count), and each microbatch's backward is its share of that
mean. torchtitan adds the microbatches' returned losses and sums them over the ranks for its
log, so the logged loss is that mean too; FSDP sums the ranks' gradients (torchtitan's divide
factor 1), the gradient of the same mean.

The reference (trainers.KEEPS_REFERENCE: DPO, KTO; ORPO and SimPO hold none): finetune=lora, the
same model with every adapter's output scaled by 0, under no_grad (no second copy of the
weights); finetune=full, a frozen copy of the starting weights (`trainers.reference`), part of
the checkpoints. At the first step the policy is the reference either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import spmd_types as spmd
import torch
from torchtitan.distributed import utils as dist_utils

from qwen3_neuron.data.packing import DESIRABLE, SEQUENCE_IDS
from qwen3_neuron.models.logprobs import model_token_logps
from qwen3_neuron.trainers import KEEPS_REFERENCE
from qwen3_neuron.trainers.base import StepTrainer, held_out_loader
from qwen3_neuron.trainers.reference import FrozenReference, adapters_off

METRIC_PREFIX = "preference/"  # the step's objective metrics in torchtitan's metrics dict
VALIDATION_PREFIX = "validation_metrics/"
CHECKPOINT_KEY = "dpo_reference"  # the frozen reference's entry in torchtitan's checkpoint states (DPO's first)


def sequence_sums(per_token: torch.Tensor, sequence_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per slot: (sums [B*P, 2], token counts [B*P, 2]) of `per_token` over each sequence, column 0
    sequence 2k (a pair's chosen response), 1 sequence 2k + 1 (its rejected one). ceil(S / 2) slots
    per sample; a slot without sequences has counts 0. Shapes stay static (one slot per possible
    pair of a sample: a sequence has at least one token), so a compiled step sees one graph."""
    batch, seq_len = sequence_ids.shape
    slots = seq_len + seq_len % 2  # a pair has at least two tokens: at most S sequences, paired
    valid = sequence_ids >= 0
    index = (sequence_ids.clamp(min=0) + slots * torch.arange(batch, device=sequence_ids.device).unsqueeze(1))
    index = index.masked_fill(~valid, 0).reshape(-1)
    sums = torch.zeros(batch * slots, dtype=per_token.dtype, device=per_token.device)
    sums = sums.index_add(0, index, (per_token * valid).reshape(-1))
    counts = torch.zeros(batch * slots, dtype=per_token.dtype, device=per_token.device)
    counts = counts.index_add(0, index, valid.reshape(-1).to(per_token.dtype))
    return sums.reshape(-1, 2), counts.reshape(-1, 2)


@dataclass
class PairTerms:
    """Per pair slot: the loss and the rewards; `present` marks the slots that hold a pair."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    present: torch.Tensor
    chosen_nll: torch.Tensor  # the policy's -log p of each chosen response (a sum over its tokens)
    chosen_tokens: torch.Tensor


def step_loss(terms: PairTerms, pairs: torch.Tensor, chosen_tokens: torch.Tensor, sft_weight: float) -> torch.Tensor:
    """This batch's share of the loss of a batch of `pairs` pairs with `chosen_tokens` chosen
    tokens: the pairs' losses a mean over the pairs, the chosen responses' NLL (weighted by
    `sft_weight`: DPO's preference.sft_weight, ORPO's 1, SimPO's cpo_alpha) a mean over the chosen
    tokens (TRL's)."""
    loss = terms.losses.sum() / pairs.clamp(min=1.0)
    if sft_weight:
        loss = loss + sft_weight * terms.chosen_nll.sum() / chosen_tokens.clamp(min=1.0)
    return loss


def pair_metrics(terms: PairTerms) -> torch.Tensor:
    """Sums over the present pairs, to be added across microbatches and ranks before dividing by
    the pair count: [pairs, loss, chosen reward, rejected reward, accuracy, margin]."""
    present = terms.present.to(terms.chosen_rewards.dtype)
    chosen, rejected = terms.chosen_rewards * present, terms.rejected_rewards * present
    correct = (terms.chosen_rewards > terms.rejected_rewards).to(present.dtype) * present
    return torch.stack([present.sum(), terms.losses.detach().sum(), chosen.sum(), rejected.sum(),
                        correct.sum(), (chosen - rejected).sum(), terms.chosen_tokens.sum(),
                        terms.chosen_nll.detach().sum()])  # fmt: skip


METRIC_NAMES = ("pairs", "loss", "rewards_chosen", "rewards_rejected", "reward_accuracy", "reward_margin",
                "chosen_tokens", "chosen_nll")  # fmt: skip
PAIR_MEANS = METRIC_NAMES[1:6]  # means over the pairs; chosen_nll is one over the chosen tokens


def mean_metrics(sums: torch.Tensor, sft_weight: float = 0.0) -> dict[str, float]:
    """`pair_metrics` sums -> means (the pair count kept): the loss is the pairs' mean plus
    `sft_weight` x chosen_nll, the policy's NLL per chosen token."""
    values = dict(zip(METRIC_NAMES, sums.tolist()))
    pairs, tokens = values["pairs"], values.pop("chosen_tokens")
    means = {"pairs": pairs, **{name: values[name] / max(pairs, 1.0) for name in PAIR_MEANS}}
    means["chosen_nll"] = values["chosen_nll"] / max(tokens, 1.0)
    means["loss"] += sft_weight * means["chosen_nll"]
    return means


def mean_logps(policy: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each sequence's mean log-probability per token (TRL's `average_log_prob`: ORPO's, SimPO's),
    at most MAX_MEAN_LOGP; -1 in a slot without a sequence (every formula finite there)."""
    return torch.where(counts > 0, policy / counts.clamp(min=1.0), -1.0).clamp(max=MAX_MEAN_LOGP)


# A mean log-probability of exactly 0 (every token certain in float32: a memorised reply) makes
# ORPO's log(1 - p) -inf and its gradient NaN; held just below, where log(1 - p) is -13.8.
MAX_MEAN_LOGP = -1e-6


class PreferenceObjective:
    """What a preference objective gives `PreferenceStep`, from the sequence log-probabilities of a
    batch's slots (`sequence_sums`: [N, 2] sums and token counts; the reference's None for an
    objective that holds none): its per-slot terms, the share of the step's loss they make, and
    its metrics as sums to add over microbatches and ranks, then means."""

    metric_names: tuple[str, ...]  # what `metric_sums` stacks

    def terms(self, policy: torch.Tensor, reference: torch.Tensor | None, counts: torch.Tensor,
              desirable: torch.Tensor | None, dp_sum: Callable[[torch.Tensor], torch.Tensor]):  # fmt: skip
        """`desirable`: KTO's label per slot (None for pairs); `dp_sum` sums a tensor over the
        data-parallel ranks (KTO's KL estimate is the batch's)."""
        raise NotImplementedError

    def loss(self, terms, slots: torch.Tensor, chosen_tokens: torch.Tensor) -> torch.Tensor:
        """This microbatch's share of the loss of a step of `slots` slots and `chosen_tokens` chosen tokens."""
        raise NotImplementedError

    def metric_sums(self, terms) -> torch.Tensor:
        raise NotImplementedError

    def means(self, sums: torch.Tensor) -> dict[str, float]:
        """`metric_sums` added over the step's microbatches and ranks -> the metrics, "loss" among them."""
        raise NotImplementedError


class PreferenceStep:
    """A preference objective in place of the trainer's language-model loss. `base_train_step` is
    torchtitan's own (the microbatch loop), which this step's `train_step` runs."""

    def __init__(self, trainer, objective: PreferenceObjective, *, reference: bool, lora: bool,
                 base_train_step: Callable[[Iterator], None]):  # fmt: skip
        self.trainer, self.objective, self.reference = trainer, objective, reference
        self.frozen = FrozenReference(trainer.model_parts[0]) if reference and not lora else None
        self._train_step = base_train_step
        self._global_counts = torch.ones(2, device=trainer.device)  # slots, chosen tokens
        self._sums = torch.zeros(len(objective.metric_names), device=trainer.device)

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
        self._sums = torch.zeros(len(self.objective.metric_names), device=trainer.device)
        self._train_step(iter(microbatches))

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens) -> torch.Tensor:
        trainer = self.trainer
        sequence_ids, desirable = input_dict.pop(SEQUENCE_IDS), input_dict.pop(DESIRABLE, None)
        inputs, labels, extra_kwargs = trainer.post_dataloading_process(input_dict, labels)
        model = trainer.model_parts[0]
        with trainer.train_context():
            reference = self._reference(model, inputs, labels, extra_kwargs, sequence_ids)
            policy, counts = _sequence_logps(model, inputs, labels, extra_kwargs, sequence_ids)
            terms = self._terms(policy, reference, counts, desirable, sequence_ids)
            loss = self.objective.loss(terms, *self._global_counts)
            with spmd.no_typecheck():  # as torchtitan's own backward
                loss.backward()
        self._sums += self.objective.metric_sums(terms)
        return loss.detach()

    def step_metrics(self) -> dict[str, float]:
        """The step's metrics over the global batch (every rank calls this: one all-reduce)."""
        means = self.objective.means(self._dp_sum(self._sums))
        return {f"{METRIC_PREFIX}{name}": value for name, value in means.items()}

    # ---- validation ------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self, model_parts, step: int) -> None:
        """torchtitan's Validator's loop with the objective's metrics: `validator.steps` batches of
        the held-out rows, the loss their mean over slots."""
        validator, trainer = self.trainer.validator, self.trainer
        model = model_parts[0]
        model.eval()
        loader = held_out_loader(validator)
        sums = torch.zeros(len(self.objective.metric_names), device=trainer.device)
        for _, (input_dict, labels) in zip(range(validator.config.steps), loader):
            input_dict = {k: v.to(trainer.device) for k, v in input_dict.items()}
            sequence_ids, desirable = input_dict.pop(SEQUENCE_IDS), input_dict.pop(DESIRABLE, None)
            inputs, labels, extra_kwargs = validator.post_dataloading_process(
                input_dict, labels.to(trainer.device), model_parts
            )  # the validator's own: the trainer's counts the tokens it trains on
            with validator.validation_context():
                reference = self._reference(model, inputs, labels, extra_kwargs, sequence_ids)
                policy, counts = _sequence_logps(model, inputs, labels, extra_kwargs, sequence_ids)
            sums += self.objective.metric_sums(self._terms(policy, reference, counts, desirable, sequence_ids))
        means = self.objective.means(self._dp_sum(sums))
        extra = {f"{VALIDATION_PREFIX}{METRIC_PREFIX}{name}": value for name, value in means.items()}
        validator.metrics_processor.log_validation(loss=means["loss"], step=step, extra_metrics=extra)
        model.train()

    # ---- shared ----------------------------------------------------------------------------

    def _reference(self, model, inputs, labels, extra_kwargs, sequence_ids) -> torch.Tensor | None:
        if not self.reference:  # ORPO, SimPO: no reference forward at all
            return None
        reference = adapters_off(model) if self.frozen is None else self.frozen.swapped_in()
        with torch.no_grad(), reference:
            sums, _ = _sequence_logps(model, inputs, labels, extra_kwargs, sequence_ids)
        return sums

    def _terms(self, policy, reference, counts, desirable, sequence_ids):
        if desirable is not None:  # KTO: each slot's label, from its completion's tokens
            desirable = sequence_sums(desirable.to(policy.dtype), sequence_ids)[0][:, 0] > 0
        return self.objective.terms(policy, reference, counts, desirable, self._dp_sum)

    def _dp_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        parallel_dims = self.trainer.parallel_dims
        if not parallel_dims.dp_enabled:
            return tensor
        return dist_utils.dist_sum_tensor(tensor, parallel_dims.get_mesh("batch"))


def _sequence_logps(model, inputs, labels, extra_kwargs, sequence_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's log-probability of each sequence's trained tokens, summed, and their counts."""
    return sequence_sums(model_token_logps(model, inputs, labels, extra_kwargs), sequence_ids)


def _counts(sequence_ids: torch.Tensor) -> tuple[int, int]:
    """(slots: pairs or KTO units, chosen tokens) in a batch: sequence ids run 0..2P-1 in each
    sample, even ids the chosen responses (KTO: the completions; -1: no loss)."""
    pairs = int(((sequence_ids.max(dim=-1).values + 1) // 2).sum())
    return pairs, int(((sequence_ids >= 0) & (sequence_ids % 2 == 0)).sum())


class PreferenceTrainer(StepTrainer):
    """A preference objective's trainer (data=preference): torchtitan's trainer taking
    `PreferenceStep`s of the objective `make_objective` builds from the job's settings."""

    def make_step(self, base_train_step) -> PreferenceStep:
        return PreferenceStep(self, self.make_objective(self.settings), lora=self.lora,
                              reference=self.settings.trainer.name in KEEPS_REFERENCE,
                              base_train_step=base_train_step)  # fmt: skip

    def make_objective(self, settings) -> PreferenceObjective:
        raise NotImplementedError
