"""trainer=reward_model's objective: TRL's RewardTrainer loss and metrics, on packed pairs, in plain torch.

A packed sample holds whole pairs as DPO's do (`trainers.dpo`), but each sequence has one marked
position, its last token (`data.packing.scored_document`), where its score is read: sequence id
2k for pair k's chosen sequence, 2k + 1 for its rejected one. Per pair (TRL 1.16's
`RewardTrainer.compute_loss`):

- the loss -log sigmoid(chosen - rejected - margin), `margin` the row's own column (0 without it);
- with `center_rewards_coefficient`, + coefficient x (chosen + rejected)^2 (TRL adds the batch
  mean of it to the mean loss: the same mean over the pairs);
- the metrics, under TRL's names: `accuracy` the share of pairs scored chosen > rejected, `margin`
  the mean of chosen - rejected, `mean_reward` / `min_reward` / `max_reward` over both sequences of
  every pair.

Shapes stay static: one slot per possible pair of a sample (`trainers.dpo.sequence_sums`), slots
without a pair masked out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qwen3_neuron.trainers.preference_step import sequence_sums


def pair_scores(scores: torch.Tensor, sequence_ids: torch.Tensor, margins: torch.Tensor):
    """Per pair slot: (the scores [N, 2], chosen then rejected; the margins [N]; which slots hold a
    pair [N]) from the per-position scores [B, S] read at each sequence's mark."""
    rewards, counts = sequence_sums(scores, sequence_ids)  # one marked position a sequence: its score
    margin_sums, _ = sequence_sums(margins.to(scores.dtype), sequence_ids)  # the margin sits at the chosen's mark
    present = (counts[:, 0] > 0) & (counts[:, 1] > 0)
    return rewards, margin_sums[:, 0], present


def pair_losses(rewards: torch.Tensor, margins: torch.Tensor, present: torch.Tensor,
                center_rewards_coefficient: float | None = None) -> torch.Tensor:  # fmt: skip
    """TRL's loss of every pair slot (0 where no pair is)."""
    chosen, rejected = rewards[:, 0], rewards[:, 1]
    losses = -F.logsigmoid(chosen - rejected - margins)
    if center_rewards_coefficient is not None:
        losses = losses + center_rewards_coefficient * (chosen + rejected) ** 2
    return losses * present


def step_loss(losses: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """This batch's share of the mean loss over a global batch of `pairs` pairs."""
    return losses.sum() / pairs.clamp(min=1.0)


SUM_NAMES = ("pairs", "loss", "accuracy", "margin", "mean_reward")


def pair_metrics(
    rewards: torch.Tensor, losses: torch.Tensor, present: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums over the present pairs, to add across microbatches and ranks: [pairs, loss, correct,
    chosen - rejected, both scores]; extremes, to take the maximum of: [max score, -min score])."""
    rewards = rewards.detach()
    mask = present.to(rewards.dtype)
    chosen, rejected = rewards[:, 0], rewards[:, 1]
    sums = torch.stack([mask.sum(), losses.detach().sum(), ((chosen > rejected) * mask).sum(),
                        ((chosen - rejected) * mask).sum(), ((chosen + rejected) * mask).sum()])  # fmt: skip
    shown = rewards[present]
    if shown.numel() == 0:
        return sums, torch.full((2,), -torch.inf, dtype=rewards.dtype, device=rewards.device)
    return sums, torch.stack([shown.max(), -shown.min()])


def mean_metrics(sums: torch.Tensor, extremes: torch.Tensor) -> dict[str, float]:
    """`pair_metrics` totals -> TRL's metrics (the pair count kept)."""
    values = dict(zip(SUM_NAMES, sums.tolist()))
    pairs = max(values["pairs"], 1.0)
    metrics = {"pairs": values["pairs"], "loss": values["loss"] / pairs, "accuracy": values["accuracy"] / pairs,
               "margin": values["margin"] / pairs, "mean_reward": values["mean_reward"] / (2 * pairs)}  # fmt: skip
    if values["pairs"]:
        metrics["max_reward"], metrics["min_reward"] = float(extremes[0]), -float(extremes[1])
    return metrics
