"""trainer=kto: KTO (Ethayarajh et al. 2024), TRL's `KTOTrainer` names and formulas, and its trainer.

KTO learns from single completions labelled desirable or undesirable (TRL's unpaired rows; a pair
is one of each: `data.preference.row_units`). Each unit's sample slot holds two sequences
(`data.packing.SEQUENCE_IDS`): 2k its completion, 2k + 1 the same prompt with another row's
completion (TRL's mismatched pair, read for the KL estimate). With r = beta x (log p_policy -
log p_reference) of a completion and z the batch's KL estimate:

    desirable:   desirable_weight x (1 - sigmoid(r - beta z))
    undesirable: undesirable_weight x (1 - sigmoid(beta z - r))
    z = max(0, mean over the batch's mismatched completions of (log p_policy - log p_reference)), no gradient

the loss a mean over the units (TRL's `_compute_loss`, loss_type="kto"). z is one microbatch's,
over every data-parallel rank (TRL: each rank's mean, averaged over the ranks; the same when the
ranks hold as many units). Rewards: a desirable unit's r is `rewards_chosen`, an undesirable one's
`rewards_rejected` (each a mean over its kind), `reward_margin` their difference; `kl` the mean z.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qwen3_neuron.trainers.preference_step import PreferenceObjective, PreferenceTrainer

KTO_METRIC_NAMES = ("units", "loss", "desirable", "undesirable", "rewards_chosen", "rewards_rejected", "kl",
                    "microbatches")  # fmt: skip


@dataclass
class KTOTerms:
    """Per unit slot: the weighted loss and the reward; `present` marks the slots that hold a unit."""

    losses: torch.Tensor
    rewards: torch.Tensor
    desirable: torch.Tensor
    present: torch.Tensor
    kl: torch.Tensor  # the batch's estimate, a scalar


def kl_estimate(policy: torch.Tensor, reference: torch.Tensor, counts: torch.Tensor, dp_sum) -> torch.Tensor:
    """z: the mean log-ratio of the mismatched completions (column 1) over the batch, across the
    ranks (`dp_sum`), at least 0, without gradient."""
    present = (counts[:, 1] > 0).to(policy.dtype)
    totals = dp_sum(torch.stack([((policy[:, 1] - reference[:, 1]).detach() * present).sum(), present.sum()]))
    return (totals[0] / totals[1].clamp(min=1.0)).clamp(min=0.0)


def kto_terms(policy: torch.Tensor, reference: torch.Tensor, counts: torch.Tensor, desirable: torch.Tensor, *,
              beta: float, desirable_weight: float, undesirable_weight: float,
              kl: torch.Tensor) -> KTOTerms:  # fmt: skip
    """Per unit slot, from sequence log-probability sums [N, 2] (the completion, the mismatched one)."""
    logratios = policy[:, 0] - reference[:, 0]
    chosen = desirable_weight * (1 - torch.sigmoid(beta * (logratios - kl)))
    rejected = undesirable_weight * (1 - torch.sigmoid(beta * (kl - logratios)))
    present = counts[:, 0] > 0
    losses = torch.where(desirable, chosen, rejected) * present
    return KTOTerms(losses, beta * logratios.detach(), desirable & present, present, kl)


class KTOObjective(PreferenceObjective):
    """The `kto` section's KTO, for `PreferenceStep`."""

    metric_names = KTO_METRIC_NAMES

    def __init__(self, kto):
        self.beta, self.desirable_weight, self.undesirable_weight = (kto.beta, kto.desirable_weight,
                                                                     kto.undesirable_weight)  # fmt: skip

    def terms(self, policy, reference, counts, desirable, dp_sum) -> KTOTerms:
        kl = kl_estimate(policy, reference, counts, dp_sum)
        return kto_terms(policy, reference, counts, desirable, beta=self.beta, kl=kl,
                         desirable_weight=self.desirable_weight,
                         undesirable_weight=self.undesirable_weight)  # fmt: skip

    def loss(self, terms: KTOTerms, slots, chosen_tokens) -> torch.Tensor:
        return terms.losses.sum() / slots.clamp(min=1.0)

    def metric_sums(self, terms: KTOTerms) -> torch.Tensor:
        present = terms.present.to(terms.rewards.dtype)
        good = terms.desirable.to(present.dtype)
        bad = present - good
        return torch.stack([present.sum(), terms.losses.detach().sum(), good.sum(), bad.sum(),
                            (terms.rewards * good).sum(), (terms.rewards * bad).sum(), terms.kl,
                            torch.ones_like(terms.kl)])  # fmt: skip

    def means(self, sums) -> dict[str, float]:
        """TRL's: rewards over their own kind (absent when a step has none of it), the margin when
        it has both; `kl` the mean of the microbatches' estimates."""
        values = dict(zip(KTO_METRIC_NAMES, sums.tolist()))
        units, good, bad = values["units"], values["desirable"], values["undesirable"]
        means = {"units": units, "loss": values["loss"] / max(units, 1.0), "desirable": good, "undesirable": bad,
                 "kl": values["kl"] / max(values["microbatches"], 1.0)}  # fmt: skip
        if good:
            means["rewards_chosen"] = values["rewards_chosen"] / good
        if bad:
            means["rewards_rejected"] = values["rewards_rejected"] / bad
        if good and bad:
            means["reward_margin"] = means["rewards_chosen"] - means["rewards_rejected"]
        return means


class KTOTrainer(PreferenceTrainer):
    """trainer=kto (data=preference): torchtitan's trainer taking KTO steps."""

    def make_objective(self, settings) -> KTOObjective:
        return KTOObjective(settings.kto)
