"""The DPO objective (Rafailov et al. 2023) on packed preference samples, in plain torch.

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

Shapes stay static (one slot per possible pair of a sample: a pair has at least two tokens), so
a compiled step sees the same graph every step; slots without a pair are masked out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

LOSS_TYPES = ("sigmoid", "ipo", "robust")


def sequence_sums(per_token: torch.Tensor, sequence_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pair slot: (sums [B*P, 2], token counts [B*P, 2]), column 0 chosen, 1 rejected.
    ceil(S / 2) slots per sample; a slot without a pair has counts 0."""
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


def step_loss(terms: PairTerms, pairs: torch.Tensor, chosen_tokens: torch.Tensor, sft_weight: float) -> torch.Tensor:
    """This batch's share of the loss of a batch of `pairs` pairs with `chosen_tokens` chosen
    tokens: DPO a mean over the pairs, the SFT term a mean over the chosen tokens (TRL's)."""
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
    """`pair_metrics` sums -> means (the pair count kept): the loss is DPO's mean over the pairs
    plus `sft_weight` x chosen_nll, the policy's NLL per chosen token."""
    values = dict(zip(METRIC_NAMES, sums.tolist()))
    pairs, tokens = values["pairs"], values.pop("chosen_tokens")
    means = {"pairs": pairs, **{name: values[name] / max(pairs, 1.0) for name in PAIR_MEANS}}
    means["chosen_nll"] = values["chosen_nll"] / max(tokens, 1.0)
    means["loss"] += sft_weight * means["chosen_nll"]
    return means
