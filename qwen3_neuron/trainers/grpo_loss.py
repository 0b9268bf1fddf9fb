"""The GRPO objective (Shao et al. 2024) in plain torch, with TRL 1.16's names and formulas.

A group is `num_generations` completions sampled for one prompt. Each completion gets one reward
per reward function (NaN: the function does not apply to it); their weighted sum, NaN ignored, is
its reward (NaN when no function applied). Its advantage is its reward minus its group's mean,
divided by a standard deviation (`scale_rewards`: group - its group's; batch - the whole batch's;
none - not divided), 0 when the reward is NaN.

Per completion token, with r = exp(logp - logp_old) (logp_old: the policy that sampled it; the
same as logp, detached, when each generation batch trains one step), the clipped surrogate
    -min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A)
plus beta times the k3 estimate of KL(policy || reference), exp(ref - logp) - (ref - logp) - 1,
times r (TRL's default `use_bias_correction_kl`: the unbiased reverse-KL gradient off-policy).
`loss_type` says how the token losses become one number over the global batch:
- grpo: each completion's mean over its tokens, then the mean over completions;
- dapo: the sum over every completion token of the batch / their count (TRL's default);
- dr_grpo: the sum / (completions x max_completion_length), a constant.
The clip ratios are TRL's: the share of completion tokens whose ratio is below 1 - epsilon with
A < 0 (low), above 1 + epsilon_high with A > 0 (high), either (region).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_TYPES = ("grpo", "dapo", "dr_grpo")
SCALE_REWARDS = ("group", "batch", "none")
STD_EPSILON = 1e-4  # TRL's: advantages / (std + 1e-4)


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The sample standard deviation (n - 1) of the non-NaN values (TRL's `nanstd`)."""
    dims = tuple(range(values.dim())) if dim is None else dim
    mean = torch.nanmean(values, dim=dims, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dims, keepdim=True)
    count = (~torch.isnan(values)).sum(dim=dims, keepdim=True)
    return torch.sqrt(variance * count / (count - 1)).squeeze(dims)


def total_rewards(rewards_per_function: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[N, F] rewards (NaN: not applicable) -> [N] weighted sums; NaN where no function applied."""
    totals = (rewards_per_function * weights.unsqueeze(0)).nansum(dim=1)
    return totals.masked_fill(torch.isnan(rewards_per_function).all(dim=1), float("nan"))


def advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group") -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages of the global batch's [N] rewards (groups consecutive), and which
    completions sit where the standard deviation is zero (TRL's frac_reward_zero_std)."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}; known: {', '.join(SCALE_REWARDS)}")
    grouped = rewards.view(-1, num_generations)
    means = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:  # none: the group's std is only looked at for the zero-std share
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations)
    centred = rewards - means
    scaled = centred / (std + STD_EPSILON) if scale_rewards != "none" else centred
    return torch.nan_to_num(scaled, nan=0.0), torch.isclose(std, torch.zeros_like(std))


@dataclass
class TokenTerms:
    """Per completion token [B, T]: the loss and what the metrics count (`mask`: a real token)."""

    losses: torch.Tensor
    mask: torch.Tensor
    low_clipped: torch.Tensor
    high_clipped: torch.Tensor
    kl: torch.Tensor | None


def token_terms(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    reference_logps: torch.Tensor | None = None,
) -> TokenTerms:
    """The per-token GRPO loss of completions [B, T] with advantages [B]; `old_logps` None: the
    sampling policy is this one (ratio 1, the gradient of the plain policy gradient)."""
    high = epsilon if epsilon_high is None else epsilon_high
    old_logps = logps.detach() if old_logps is None else old_logps
    advantages = advantages.unsqueeze(1)
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + high)
    losses = -torch.min(ratio * advantages, clipped * advantages)
    kl = None
    if beta != 0.0:
        delta = reference_logps - logps
        kl = (torch.exp(delta) - delta - 1) * ratio  # TRL's use_bias_correction_kl (its default)
        losses = losses + beta * kl
    mask = mask.to(logps.dtype)
    return TokenTerms(losses * mask, mask, ((ratio < 1 - epsilon) & (advantages < 0)).detach(),
                      ((ratio > 1 + high) & (advantages > 0)).detach(), kl)  # fmt: skip


def batch_loss(
    terms: TokenTerms, loss_type: str, *, completions: float, tokens: float, max_completion_length: int
) -> torch.Tensor:
    """This batch's share of the loss of a global batch of `completions` completions holding
    `tokens` completion tokens: summed over the batches of a step (and the ranks), the loss."""
    if loss_type == "grpo":
        per_completion = terms.losses.sum(-1) / terms.mask.sum(-1).clamp(min=1.0)
        return per_completion.sum() / max(completions, 1.0)
    if loss_type == "dapo":
        return terms.losses.sum() / max(tokens, 1.0)
    if loss_type == "dr_grpo":
        return terms.losses.sum() / (max(completions, 1.0) * max_completion_length)
    raise ValueError(f"unknown GRPO loss_type {loss_type!r}; known: {', '.join(LOSS_TYPES)}")


TOKEN_METRICS = ("tokens", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "kl")


def token_metric_sums(terms: TokenTerms) -> torch.Tensor:
    """Sums over the real tokens, added over batches and ranks before `token_metric_means`."""
    mask = terms.mask.detach()
    low, high = terms.low_clipped.to(mask.dtype) * mask, terms.high_clipped.to(mask.dtype) * mask
    kl = (terms.kl.detach() * mask).sum() if terms.kl is not None else mask.new_zeros(())
    return torch.stack([mask.sum(), low.sum(), high.sum(), ((low + high) > 0).to(mask.dtype).sum(), kl])


def token_metric_means(sums: torch.Tensor, beta: float) -> dict[str, float]:
    values = dict(zip(TOKEN_METRICS, sums.tolist()))
    tokens = max(values.pop("tokens"), 1.0)
    means = {name: value / tokens for name, value in values.items()}
    if beta == 0.0:
        del means["kl"]
    return means
