"""``flare2.train`` from Python runs what ``flare2 train`` runs: PPO's CartPole preset reaches a mean return of 475
(about 15 s; runs by default), and the run it returns holds its figures and a policy that plays.

It runs in one process (``serial=True``), where the agent waits for each learn() and the run's course follows from
its seed alone. With a learner process, when each update lands depends on the machine's load: 1 of 16 runs of seed
1 beside a busy core missed 475 within 100k steps, and one run of this test fell back from a return of 240 to 64 and
missed it within 200k. In serial, seeds 0-9 each reached 475 within 200k steps (56k to 176k)."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import flare2

pytestmark = pytest.mark.learning


def test_flare2_train_from_python_reaches_475_on_cartpole_and_returns_a_playable_policy(
    tmp_path, no_leftover_processes
):
    run = flare2.train(
        "CartPole-v1", algo="ppo", max_steps=200_000, stop_return=475, seed=1, serial=True, log_dir=str(tmp_path)
    )

    assert run.exit_code == 0 and run.log_dir == tmp_path
    assert run.return_mean >= 475 and run.env_steps < 200_000
    # The run is one of flare2 train's: its train.json repeats it on the command line.
    recorded = json.loads((tmp_path / "train.json").read_text())
    assert (recorded["algo"], recorded["env"], recorded["run"]["seed"], recorded["run"]["serial"]) == (
        "ppo",
        "CartPole-v1",
        1,
        True,
    )
    env = gym.make("CartPole-v1")
    observation, _ = env.reset(seed=0)
    action = run.policy.predict(observation, episode_start=True)
    assert env.action_space.contains(int(action))
