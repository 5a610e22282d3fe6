"""Return estimators over ``[B, T]`` sequences that follow the termination/truncation rule.

A terminated step stops bootstrapping (its discount is 0). A truncated step
(time limit) and the last step of a sequence bootstrap from the value of the
observation that followed them (``next_values``), because the episode goes on
in principle; the step before an episode end never borrows the next episode's
return.
"""

from __future__ import annotations

import torch


def n_step_returns(
    rewards: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """Discounted returns of each step up to the end of its episode or of the sequence."""
    steps = rewards.shape[1]
    returns = torch.empty_like(rewards)
    running = next_values[:, -1]
    for t in reversed(range(steps)):
        cut = truncated[:, t] if t < steps - 1 else torch.ones_like(truncated[:, t])
        following = torch.where(cut | terminated[:, t], next_values[:, t], running)
        running = rewards[:, t] + gamma * (~terminated[:, t]).to(rewards.dtype) * following
        returns[:, t] = running
    return returns


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and the matching value targets (advantage + value).

    Each step's TD error bootstraps from ``next_values`` unless the step
    terminated; the exponentially weighted trace stops at every episode end
    (terminated or truncated) and at the end of the sequence.
    """
    steps = rewards.shape[1]
    advantages = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(steps)):
        alive = (~terminated[:, t]).to(rewards.dtype)
        delta = rewards[:, t] + gamma * alive * next_values[:, t] - values[:, t]
        cut = terminated[:, t] | truncated[:, t] if t < steps - 1 else torch.ones_like(terminated[:, t])
        running = delta + gamma * lam * (~cut).to(rewards.dtype) * running
        advantages[:, t] = running
    return advantages, advantages + values
