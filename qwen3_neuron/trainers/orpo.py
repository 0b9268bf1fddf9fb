"""trainer=orpo: ORPO (Hong et al. 2024), TRL's `experimental.orpo` names and formulas, and its trainer.

Reference-free: no reference model is held (no frozen copy, no adapters-off forward). Per pair,
with p the mean per-token probability of a response (TRL's `average_log_prob=True`):

    log_odds = (log p_chosen - log p_rejected) - (log(1 - p_chosen) - log(1 - p_rejected))
    loss = NLL of the chosen responses per token - beta x mean over pairs of log sigmoid(log_odds)

TRL's `odds_ratio_loss` and `get_batch_loss_metrics`; rewards are beta x the mean log-probability,
`log_odds_ratio` the mean of log sigmoid(log_odds), `log_odds_chosen` the mean of log_odds. The NLL
is over the chosen responses' tokens, as data=chat trains them (TRL's ORPO also counts the prompt's
tokens in it; its CPO, and the ORPO paper, do not).
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

ORPO_METRIC_NAMES = (*METRIC_NAMES, "log_odds_ratio", "log_odds_chosen")


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, without cancellation (TRL's branch at -ln 2)."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_terms(policy: torch.Tensor, counts: torch.Tensor, *, beta: float) -> tuple[PairTerms, torch.Tensor]:
    """Per pair slot, from sequence log-probability sums [N, 2] and token counts [N, 2]: the terms
    (losses: -beta x log sigmoid(log_odds)) and log_odds."""
    means = mean_logps(policy, counts)
    chosen, rejected = means[:, 0], means[:, 1]
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    present = (counts[:, 0] > 0) & (counts[:, 1] > 0)
    rewards = beta * means.detach()
    terms = PairTerms(-beta * F.logsigmoid(log_odds) * present, rewards[:, 0], rewards[:, 1], present,
                      -policy[:, 0] * present, counts[:, 0] * present)  # fmt: skip
    return terms, log_odds * present


class ORPOObjective(PreferenceObjective):
    """The `orpo` section's ORPO, for `PreferenceStep`: the chosen NLL always weighs 1."""

    metric_names = ORPO_METRIC_NAMES

    def __init__(self, orpo):
        self.beta = orpo.beta

    def terms(self, policy, reference, counts, desirable, dp_sum) -> tuple[PairTerms, torch.Tensor]:
        return orpo_terms(policy, counts, beta=self.beta)

    def loss(self, terms, slots, chosen_tokens) -> torch.Tensor:
        return step_loss(terms[0], slots, chosen_tokens, 1.0)

    def metric_sums(self, terms) -> torch.Tensor:
        pairs, log_odds = terms
        return torch.cat([pair_metrics(pairs), torch.stack([(F.logsigmoid(log_odds) * pairs.present).sum(),
                                                            log_odds.sum()]).detach()])  # fmt: skip

    def means(self, sums) -> dict[str, float]:
        means = mean_metrics(sums[: len(METRIC_NAMES)], 1.0)
        means["nll_loss"] = means.pop("chosen_nll")  # TRL's name
        pairs = max(means["pairs"], 1.0)
        means["log_odds_ratio"], means["log_odds_chosen"] = (float(v) / pairs for v in sums[len(METRIC_NAMES):])
        return means


class ORPOTrainer(PreferenceTrainer):
    """trainer=orpo (data=preference): torchtitan's trainer taking ORPO steps."""

    def make_objective(self, settings) -> ORPOObjective:
        return ORPOObjective(settings.orpo)
