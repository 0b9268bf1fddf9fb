"""trainer=simpo: SimPO (Meng et al. 2024) as TRL computes it (`experimental.cpo`, `loss_type="simpo"`),
and its trainer.

Reference-free: no reference model is held (no frozen copy, no adapters-off forward). Per pair,
with each response's mean per-token log-probability (TRL's `average_log_prob` for simpo):

    loss = -log sigmoid(beta x (mean log p_chosen - mean log p_rejected) - simpo_gamma)
           (a mean over pairs) + cpo_alpha x the NLL of the chosen responses per token

TRL's `cpo_loss` and `get_batch_loss_metrics` (label_smoothing 0, alpha 0); rewards are beta x the
mean log-probability. cpo_alpha=0 is the SimPO paper's loss, > 0 CPO-SimPO (TRL's default 1).
`nll_loss` is the chosen responses' NLL per token, reported whatever cpo_alpha (TRL reports 0 when
it is 0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qwen3_neuron.trainers.preference_step import (
    METRIC_NAMES,
    PairTerms,
    PreferenceObjective,
    PreferenceTrainer,
    mean_logps,
    mean_metrics,
    pair_metrics,
    step_loss,
)


def simpo_terms(policy: torch.Tensor, counts: torch.Tensor, *, beta: float, simpo_gamma: float) -> PairTerms:
    """Per pair slot, from sequence log-probability sums [N, 2] and token counts [N, 2]."""
    means = mean_logps(policy, counts)
    margin = means[:, 0] - means[:, 1] - simpo_gamma / beta  # TRL's gamma_logratios
    present = (counts[:, 0] > 0) & (counts[:, 1] > 0)
    rewards = beta * means.detach()
    return PairTerms(-F.logsigmoid(beta * margin) * present, rewards[:, 0], rewards[:, 1], present,
                     -policy[:, 0] * present, counts[:, 0] * present)  # fmt: skip


class SimPOObjective(PreferenceObjective):
    """The `simpo` section's SimPO, for `PreferenceStep`."""

    metric_names = METRIC_NAMES

    def __init__(self, simpo):
        self.beta, self.simpo_gamma, self.cpo_alpha = simpo.beta, simpo.simpo_gamma, simpo.cpo_alpha

    def terms(self, policy, reference, counts, desirable, dp_sum) -> PairTerms:
        return simpo_terms(policy, counts, beta=self.beta, simpo_gamma=self.simpo_gamma)

    def loss(self, terms, slots, chosen_tokens) -> torch.Tensor:
        return step_loss(terms, slots, chosen_tokens, self.cpo_alpha)

    def metric_sums(self, terms) -> torch.Tensor:
        return pair_metrics(terms)

    def means(self, sums) -> dict[str, float]:
        means = mean_metrics(sums, self.cpo_alpha)
        means["nll_loss"] = means.pop("chosen_nll")  # TRL's name
        return means


class SimPOTrainer(PreferenceTrainer):
    """trainer=simpo (data=preference): torchtitan's trainer taking SimPO steps."""

    def make_objective(self, settings) -> SimPOObjective:
        return SimPOObjective(settings.simpo)
