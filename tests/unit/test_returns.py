"""n_step_returns against returns worked out by hand (gamma 0.5 keeps every value exact in float32).

The rule (docs/architecture.md: Episode edges, ALF's TimeStep): a terminated step stops bootstrapping;
a truncated step and the last step of a sequence bootstrap from
``next_values`` of that step; no step borrows the return of the next episode.
"""

from __future__ import annotations

import pytest
import torch

from flare2.zoo.returns import gae, n_step_returns, vtrace

GAMMA = 0.5


def returns_of(rewards, next_values, terminated=None, truncated=None, gamma=GAMMA) -> torch.Tensor:
    """n_step_returns for one sequence given as lists; returns its single row."""
    steps = len(rewards)
    flags = lambda marks: torch.tensor([[t in (marks or ()) for t in range(steps)]])  # noqa: E731
    result = n_step_returns(
        torch.tensor([rewards], dtype=torch.float32),
        torch.tensor([next_values], dtype=torch.float32),
        flags(terminated),
        flags(truncated),
        gamma,
    )
    assert result.shape == (1, steps) and result.dtype == torch.float32
    return result[0]


def assert_returns(actual: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), rtol=0, atol=0)


def test_without_an_episode_end_every_step_bootstraps_from_the_last_next_value():
    # G2 = 3 + .5 * 40 = 23;  G1 = 2 + .5 * 23 = 13.5;  G0 = 1 + .5 * 13.5 = 7.75
    assert_returns(returns_of([1, 2, 3], [10, 20, 40]), [7.75, 13.5, 23.0])


def test_a_termination_mid_sequence_stops_bootstrapping_and_later_steps_start_fresh():
    # Episode ends after step 1: G1 = 2 (no bootstrap from next_values[1] = 20), G0 = 1 + .5 * 2 = 2.
    # Steps 2-3 are a new episode: G3 = 4 + .5 * 40 = 24, G2 = 3 + .5 * 24 = 15.
    assert_returns(returns_of([1, 2, 3, 4], [10, 20, 30, 40], terminated=[1]), [2.0, 2.0, 15.0, 24.0])


def test_a_truncation_mid_sequence_bootstraps_from_that_steps_next_value():
    # Time limit after step 1: G1 = 2 + .5 * next_values[1] = 2 + 10 = 12, G0 = 1 + .5 * 12 = 7.
    # The new episode's return (15 at step 2) is not borrowed.
    assert_returns(returns_of([1, 2, 3, 4], [10, 20, 30, 40], truncated=[1]), [7.0, 12.0, 15.0, 24.0])


def test_a_termination_at_the_last_step_does_not_bootstrap():
    # G2 = 3;  G1 = 2 + .5 * 3 = 3.5;  G0 = 1 + .5 * 3.5 = 2.75
    assert_returns(returns_of([1, 2, 3], [10, 20, 40], terminated=[2]), [2.75, 3.5, 3.0])


def test_a_truncation_at_the_last_step_bootstraps_like_the_end_of_a_sequence():
    assert_returns(returns_of([1, 2, 3], [10, 20, 40], truncated=[2]), returns_of([1, 2, 3], [10, 20, 40]).tolist())


def test_a_step_both_terminated_and_truncated_counts_as_terminated():
    assert_returns(returns_of([1, 2, 3, 4], [10, 20, 30, 40], terminated=[1], truncated=[1]), [2.0, 2.0, 15.0, 24.0])


def test_several_episode_ends_in_one_sequence():
    # Terminated after 0, truncated after 2: G0 = 1; G2 = 3 + .5 * 30 = 18, G1 = 2 + .5 * 18 = 11; G3 = 4 + .5 * 40 = 24.
    result = returns_of([1, 2, 3, 4], [10, 20, 30, 40], terminated=[0], truncated=[2])
    assert_returns(result, [1.0, 11.0, 18.0, 24.0])


def test_gamma_zero_gives_the_rewards_and_gamma_one_sums_them():
    assert_returns(returns_of([1, 2, 3], [10, 20, 40], gamma=0.0), [1.0, 2.0, 3.0])
    assert_returns(returns_of([1, 2, 3], [10, 20, 40], gamma=1.0), [46.0, 45.0, 43.0])


def test_a_single_step_sequence():
    assert_returns(returns_of([5], [8]), [9.0])
    assert_returns(returns_of([5], [8], terminated=[0]), [5.0])


def test_each_row_of_a_batch_is_computed_on_its_own():
    rows = [
        ([1, 2, 3, 4], [10, 20, 30, 40], [1], []),
        ([1, 2, 3, 4], [10, 20, 30, 40], [], [1]),
        ([0, 0, 0, 1], [2, 4, 6, 8], [], []),
    ]
    rewards = torch.tensor([r for r, _, _, _ in rows], dtype=torch.float32)
    next_values = torch.tensor([v for _, v, _, _ in rows], dtype=torch.float32)
    terminated = torch.tensor([[t in term for t in range(4)] for _, _, term, _ in rows])
    truncated = torch.tensor([[t in trunc for t in range(4)] for _, _, _, trunc in rows])

    batch = n_step_returns(rewards, next_values, terminated, truncated, GAMMA)

    assert batch.shape == (3, 4)
    for index, (r, v, term, trunc) in enumerate(rows):
        assert_returns(batch[index], returns_of(r, v, term, trunc).tolist())


def test_the_inputs_are_left_unchanged():
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    next_values = torch.tensor([[10.0, 20.0, 40.0]])
    terminated = torch.tensor([[False, True, False]])
    truncated = torch.zeros(1, 3, dtype=torch.bool)
    copies = [t.clone() for t in (rewards, next_values, terminated, truncated)]

    n_step_returns(rewards, next_values, terminated, truncated, GAMMA)

    for original, copy in zip((rewards, next_values, terminated, truncated), copies):
        assert torch.equal(original, copy)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_returns_have_the_dtype_of_the_rewards(dtype):
    result = n_step_returns(
        torch.ones(2, 3, dtype=dtype),
        torch.ones(2, 3, dtype=dtype),
        torch.zeros(2, 3, dtype=torch.bool),
        torch.zeros(2, 3, dtype=torch.bool),
        GAMMA,
    )
    assert result.dtype == dtype


# ---- GAE: gamma 0.5, lambda 0.5, values [0.2, 0.4, 0.6], next values [0.4, 0.6, 0.8], rewards 1 ----


def gae_case(terminated_at: int | None = None, truncated_at: int | None = None):
    flags = [torch.zeros(1, 3, dtype=torch.bool), torch.zeros(1, 3, dtype=torch.bool)]
    if terminated_at is not None:
        flags[0][0, terminated_at] = True
    if truncated_at is not None:
        flags[1][0, truncated_at] = True
    values = torch.tensor([[0.2, 0.4, 0.6]])
    return gae(torch.ones(1, 3), values, torch.tensor([[0.4, 0.6, 0.8]]), *flags, gamma=0.5, lam=0.5), values


def test_gae_without_an_episode_end_runs_the_trace_to_the_sequence_end_and_bootstraps_there():
    (advantages, targets), values = gae_case()
    # deltas 1.0, 0.9, 0.8; A2 = 0.8, A1 = 0.9 + 0.25 * 0.8, A0 = 1.0 + 0.25 * 1.1
    torch.testing.assert_close(advantages, torch.tensor([[1.275, 1.1, 0.8]]))
    torch.testing.assert_close(targets, advantages + values)


def test_gae_does_not_bootstrap_after_a_termination_and_cuts_the_trace_there():
    (advantages, _), _ = gae_case(terminated_at=1)
    # delta1 = 1 - 0.4 (no bootstrap); the trace of step 0 stops at step 1; step 2 starts a new episode
    torch.testing.assert_close(advantages, torch.tensor([[1.15, 0.6, 0.8]]))


def test_gae_bootstraps_a_truncated_step_from_its_final_observation_but_cuts_the_trace():
    (advantages, _), _ = gae_case(truncated_at=1)
    # delta1 = 1 + 0.5 * 0.6 - 0.4 (bootstrap from the final observation); the trace stops at step 1
    torch.testing.assert_close(advantages, torch.tensor([[1.225, 0.9, 0.8]]))


# ---- V-trace: five steps, terminated after step 1, truncated after step 3, gamma 0.5 ----
# Within an episode next_values[s] is values[s + 1]; after an episode end it is the final observation's value.

VTRACE_REWARDS = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
VTRACE_VALUES = torch.tensor([[0.2, 0.4, 0.6, 0.8, 1.0]])
VTRACE_NEXT_VALUES = torch.tensor([[0.4, 0.9, 0.8, 1.2, 1.4]])
VTRACE_TERMINATED = torch.tensor([[False, True, False, False, False]])
VTRACE_TRUNCATED = torch.tensor([[False, False, False, True, False]])


def vtrace_case(ratios: list[float], **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace of the five steps with the behaviour policy's log-probabilities at -1 and the target's at
    -1 + log(ratio)."""
    behaviour = torch.full((1, 5), -1.0)
    target = behaviour + torch.tensor([ratios]).log()
    return vtrace(
        VTRACE_REWARDS,
        VTRACE_VALUES,
        VTRACE_NEXT_VALUES,
        VTRACE_TERMINATED,
        VTRACE_TRUNCATED,
        behaviour,
        target,
        **{"gamma": 0.5, **kwargs},
    )


def test_vtrace_truncates_the_weights_at_rho_bar_and_c_bar_and_follows_the_episode_edges():
    # Ratios pi/mu 2, 1.25, 0.5, 4, 0.8 with rho_bar 1.5, c_bar 1, lambda 0.5:
    #   rho = min(1.5, ratio) = 1.5, 1.25, 0.5, 1.5, 0.8   (steps 0 and 3 above rho_bar, step 1 between the two bars)
    #   c = 0.5 * min(1, ratio) = 0.5, 0.5, 0.25, 0.5, 0.4  (steps 0, 1 and 3 above c_bar)
    # delta_s = rho_s (r_s + gamma V(x_{s+1}) - V(x_s)), no V(x_{s+1}) after the termination (step 1):
    #   1.5 * (1 + .5 * .4 - .2) = 1.5;  1.25 * (2 - .4) = 2;  .5 * (3 + .5 * .8 - .6) = 1.4;
    #   1.5 * (4 + .5 * 1.2 - .8) = 5.7 (the truncated step bootstraps from its final observation);
    #   .8 * (5 + .5 * 1.4 - 1) = 3.76 (the sequence's last step bootstraps from next_values)
    # v_s - V(x_s) = delta_s + gamma c_s (v_{s+1} - V(x_{s+1})), the trace cut after steps 1, 3 and 4:
    #   step 4: 3.76; step 3: 5.7; step 2: 1.4 + .5 * .25 * 5.7 = 2.1125; step 1: 2; step 0: 1.5 + .5 * .5 * 2 = 2
    # so v = 2.2, 2.4, 2.7125, 6.5, 4.76.
    # Advantages rho_s (r_s + gamma v_{s+1} - V(x_s)), v_{s+1} being V(x_{s+1}) where the trace is cut:
    #   1.5 * (1 + .5 * 2.4 - .2) = 3;  1.25 * (2 - .4) = 2;  .5 * (3 + .5 * 6.5 - .6) = 2.825;
    #   1.5 * (4 + .5 * 1.2 - .8) = 5.7;  .8 * (5 + .5 * 1.4 - 1) = 3.76
    advantages, targets = vtrace_case([2.0, 1.25, 0.5, 4.0, 0.8], lam=0.5, rho_bar=1.5, c_bar=1.0)

    torch.testing.assert_close(targets, torch.tensor([[2.2, 2.4, 2.7125, 6.5, 4.76]]))
    torch.testing.assert_close(advantages, torch.tensor([[3.0, 2.0, 2.825, 5.7, 3.76]]))


def test_on_policy_vtrace_with_lambda_one_gives_the_n_step_returns_and_gae_lambda_one():
    # The paper (section 4.1): with pi = mu and c_bar >= 1, v_s is the n-step Bellman target.
    advantages, targets = vtrace_case([1.0] * 5, lam=1.0)

    returns = n_step_returns(VTRACE_REWARDS, VTRACE_NEXT_VALUES, VTRACE_TERMINATED, VTRACE_TRUNCATED, 0.5)
    gae_advantages, gae_targets = gae(
        VTRACE_REWARDS, VTRACE_VALUES, VTRACE_NEXT_VALUES, VTRACE_TERMINATED, VTRACE_TRUNCATED, 0.5, 1.0
    )
    torch.testing.assert_close(targets, returns)
    torch.testing.assert_close(targets, gae_targets)
    torch.testing.assert_close(advantages, gae_advantages)


def test_on_policy_vtrace_gives_the_value_targets_of_gae_with_the_same_lambda():
    _, targets = vtrace_case([1.0] * 5, lam=0.5)

    _, gae_targets = gae(
        VTRACE_REWARDS, VTRACE_VALUES, VTRACE_NEXT_VALUES, VTRACE_TERMINATED, VTRACE_TRUNCATED, 0.5, 0.5
    )
    torch.testing.assert_close(targets, gae_targets)


def test_vtrace_leaves_its_inputs_unchanged():
    copies = [t.clone() for t in (VTRACE_REWARDS, VTRACE_NEXT_VALUES, VTRACE_TERMINATED, VTRACE_TRUNCATED)]

    vtrace_case([2.0, 1.25, 0.5, 4.0, 0.8])

    for original, copy in zip((VTRACE_REWARDS, VTRACE_NEXT_VALUES, VTRACE_TERMINATED, VTRACE_TRUNCATED), copies):
        assert torch.equal(original, copy)
