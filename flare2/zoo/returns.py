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
    # Whole-sequence masks first: the loop, which runs once per step, is then two ops a step (A2C's learn() of 5
    # steps spent more time in this loop's small ops than in its network's forward pass).
    discounts = gamma * (~terminated).to(rewards.dtype)
    restarts = terminated | truncated
    restarts[:, -1] = True
    returns = torch.empty_like(rewards)
    running = next_values[:, -1]
    for t in reversed(range(rewards.shape[1])):
        running = torch.addcmul(rewards[:, t], discounts[:, t], torch.where(restarts[:, t], next_values[:, t], running))
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


def vtrace(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    behaviour_log_prob: torch.Tensor,
    target_log_prob: torch.Tensor,
    gamma: float,
    lam: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace's policy-gradient advantages and value targets, for steps played by another policy than the target.

    IMPALA's V-trace (Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
    Actor-Learner Architectures", eq. 1, with Remark 2's λ), over the episode edges ``gae`` follows. With
    ``ρ_s = min(ρ̄, π(a_s|x_s) / μ(a_s|x_s))`` (π the target policy, μ the behaviour policy that acted),
    ``c_s = λ min(c̄, π/μ)`` and the TD error ``δ_s = ρ_s (r_s + γ V(x_{s+1}) - V(x_s))``, the value target is
    ``v_s = V(x_s) + δ_s + γ c_s (v_{s+1} - V(x_{s+1}))`` and the advantage ``ρ_s (r_s + γ v_{s+1} - V(x_s))``.

    Episode edges as in ``gae``: a terminated step has discount 0 (no ``V(x_{s+1})``, no ``v_{s+1}``); a truncated
    step and the last step of a sequence take ``V(x_{s+1})`` from ``next_values`` (the final observation's value)
    and ``v_{s+1} = V(x_{s+1})``, since nothing after them was played by this episode; no trace crosses an episode
    end. Within an episode ``next_values[:, s]`` is ``values[:, s + 1]``, as SEED RL's ``values_t_plus_1`` is.

    Followed: the backward recursion of SEED RL's ``common/vtrace.py`` (``from_importance_weights``, the scalable
    agent's V-trace), with the policy-gradient weights truncated at ρ̄ as in the paper's section 4.2 (SEED RL's
    ``clip_pg_rho_threshold`` at its default, equal to ρ̄ = 1) and c̄ a parameter as in the paper (SEED RL and
    rlax fix it at 1). With every ratio 1 the targets are ``gae``'s with the same λ, and with λ = 1 they are
    ``n_step_returns`` (the paper's on-policy case). All ``[B, T]``; the log-probabilities are those of the actions
    taken; returns ``(advantages, targets)``, as ``gae`` does.
    """
    steps = rewards.shape[1]
    ratios = (target_log_prob - behaviour_log_prob).exp().to(rewards.dtype)
    rhos = ratios.clamp(max=rho_bar)
    cs = lam * ratios.clamp(max=c_bar)
    alive = (~terminated).to(rewards.dtype)
    cut = terminated | truncated
    cut[:, -1] = True
    deltas = rhos * (rewards + gamma * alive * next_values - values)
    corrections = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(steps)):
        running = deltas[:, t] + gamma * cs[:, t] * (~cut[:, t]).to(rewards.dtype) * running
        corrections[:, t] = running
    targets = values + corrections
    following = next_values.clone()
    following[:, :-1] = torch.where(cut[:, :-1], next_values[:, :-1], targets[:, 1:])
    advantages = rhos * (rewards + gamma * alive * following - values)
    return advantages, targets
