"""n_step_returns against returns worked out by hand (gamma 0.5 keeps every value exact in float32).

The rule (docs/architecture.md: Episode edges, ALF's TimeStep): a terminated step stops bootstrapping;
a truncated step and the last step of a sequence bootstrap from
``next_values`` of that step; no step borrows the return of the next episode.
"""

from __future__ import annotations

import pytest
import torch

from flare2.zoo.returns import gae, n_step_returns

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
