"""trainer=dpo: the DPO objective (Rafailov et al. 2023) on packed preference samples, and its trainer.

A packed sample holds whole pairs: each pair's chosen and rejected responses are two documents
of one sample (`data.preference`). The dataset marks every label token with its sequence id
(`data.packing.SEQUENCE_IDS`): 2k for pair k's chosen response, 2k + 1 for its rejected one, -1 for a token
without a loss. A sequence's log-probability is the sum of its response tokens' log-probabilities.

The losses are TRL's (`DPOConfig.loss_type`), with TRL's formulas:
- sigmoid: -log sigmoid(beta * delta), delta = (policy - reference) of chosen minus of rejected;
- ipo: (delta' - 1 / (2 beta))^2, with each log-ratio divided by its response's token count;
- robust: sigmoid's loss corrected for preference labels flipped with probability
  `label_smoothing` (Chowdhury et al. 2024).
Rewards are beta * (policy - reference) log-ratios; the reward accuracy is the share of pairs
whose chosen reward is above the rejected one, the margin their mean difference.

`sft_weight` adds TRL's "sft" loss (`loss_type=[loss, "sft"], loss_weights=[1, sft_weight]`): the
policy's NLL of the chosen responses, a mean over all their tokens in the batch (not per pair).
Pure DPO only moves the chosen-minus-rejected margin, mostly by pushing the rejected reply down;
the NLL term also pulls the chosen reply up, so the policy generates it.

Per pair slot (`trainers.preference_step.sequence_sums`); slots without a pair are masked out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qwen3_neuron.trainers.preference_step import (
    METRIC_NAMES,
    PairTerms,
    PreferenceObjective,
    PreferenceTrainer,
    mean_metrics,
    pair_metrics,
    step_loss,
)

LOSS_TYPES = ("sigmoid", "ipo", "robust")


def pair_terms(
    policy: torch.Tensor,
    reference: torch.Tensor,
    counts: torch.Tensor,
    *,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> PairTerms:
    """The loss of every pair slot from sequence log-probabilities [N, 2] (chosen, rejected)."""
    logratios = policy - reference
    chosen, rejected = logratios[:, 0], logratios[:, 1]
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * (chosen - rejected))
    elif loss_type == "robust":
        delta = beta * (chosen - rejected)
        clean, flipped = -(1 - label_smoothing) * F.logsigmoid(delta), -label_smoothing * F.logsigmoid(-delta)
        losses = (clean - flipped) / (1 - 2 * label_smoothing)  # unbiased under flipped labels
    elif loss_type == "ipo":
        lengths = counts.clamp(min=1.0)
        losses = (chosen / lengths[:, 0] - rejected / lengths[:, 1] - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss {loss_type!r}; known: {', '.join(LOSS_TYPES)}")
    present = (counts[:, 0] > 0) & (counts[:, 1] > 0)
    rewards = beta * logratios.detach()
    return PairTerms(losses * present, rewards[:, 0], rewards[:, 1], present,
                     -policy[:, 0] * present, counts[:, 0] * present)  # fmt: skip


class DPOObjective(PreferenceObjective):
    """The `preference` section's DPO, for `PreferenceStep`."""

    metric_names = METRIC_NAMES

    def __init__(self, preference):
        self.beta, self.loss_type, self.label_smoothing = preference.beta, preference.loss, preference.label_smoothing
        self.sft_weight = preference.sft_weight

    def terms(self, policy, reference, counts, desirable, dp_sum) -> PairTerms:
        return pair_terms(policy, reference, counts, beta=self.beta, loss_type=self.loss_type,
                          label_smoothing=self.label_smoothing)  # fmt: skip

    def loss(self, terms, slots, chosen_tokens) -> torch.Tensor:
        return step_loss(terms, slots, chosen_tokens, self.sft_weight)

    def metric_sums(self, terms) -> torch.Tensor:
        return pair_metrics(terms)

    def means(self, sums) -> dict[str, float]:
        return mean_metrics(sums, self.sft_weight)


class DPOTrainer(PreferenceTrainer):
    """trainer=dpo (data=preference's default): torchtitan's trainer taking DPO steps."""

    def make_objective(self, settings) -> DPOObjective:
        return DPOObjective(settings.preference)
