"""Env engines (flare2.core.env_engines): the same steps through every engine, ALE's lives and games, the episode
counts of a vector env, and the message for an engine that cannot play an env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from extras import needs_env

from flare2.core.env_engines import (
    PythonEnvs,
    VectorEnvs,
    ale_vector_env,
    gymnasium_vector_env,
    resolve_engine,
)
from flare2.core.env_making import make_gym_env
from flare2.errors import ConfigError
from flare2.runtime.agents.episodes import EpisodeRecorder, EpisodeStats, VectorEpisodeRecorder

SEEDS = [11, 12, 13, 14]


def play(engine, steps: int, seed: int = 0):
    """Every step of ``engine`` under the same random actions, and the first observations."""
    actions = np.random.default_rng(seed).integers(0, 2, (steps, engine.count))
    first = np.array(engine.reset(SEEDS))
    return first, [engine.step(row) for row in actions]


def test_a_gymnasium_vector_env_steps_cartpole_exactly_as_the_python_envs_do_across_episode_ends():
    python_stats, vector_stats = EpisodeStats(), EpisodeStats()
    python = PythonEnvs([EpisodeRecorder(make_gym_env("CartPole-v1"), python_stats) for _ in SEEDS])
    vector = VectorEnvs(
        VectorEpisodeRecorder(gymnasium_vector_env(lambda: make_gym_env("CartPole-v1"), len(SEEDS)), vector_stats),
        "the gymnasium engine's",
    )
    first_p, steps_p = play(python, 300)
    first_v, steps_v = play(vector, 300)
    np.testing.assert_array_equal(first_p, first_v)
    ends = 0
    for p, v in zip(steps_p, steps_v):
        np.testing.assert_allclose(np.array(p.observations), v.observations, rtol=1e-6)
        for name in ("rewards", "terminated", "truncated", "lost_lives"):
            np.testing.assert_array_equal(getattr(p, name), getattr(v, name))
        assert p.final.keys() == v.final.keys()
        for index in p.final:
            np.testing.assert_allclose(p.final[index], v.final[index], rtol=1e-6)
            # The final observation is the episode's last; the one acted on next starts a new episode.
            assert not np.allclose(p.final[index], p.observations[index])
        ends += len(p.final)
    assert ends > 20  # random CartPole episodes last about 20 steps
    assert python_stats.finished == vector_stats.finished and python_stats.steps == vector_stats.steps == 1200


def test_a_vector_env_that_resets_on_the_next_step_is_refused_naming_same_step():
    next_step = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    with pytest.raises(ConfigError, match=r"autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP"):
        VectorEnvs(next_step, "my agent's")


@needs_env("ALE/Breakout-v5")
def test_ale_reports_a_lost_life_for_learning_and_the_end_of_a_game_with_its_last_frame_and_raw_score():
    stats = EpisodeStats()
    engine = VectorEnvs(VectorEpisodeRecorder(ale_vector_env("ALE/Breakout-v5", 2, {}, threads=1), stats), "ALE's")
    observations = np.asarray(engine.reset([1, 2]))
    assert observations.shape == (2, 84, 84) and observations.dtype == np.uint8
    rng = np.random.default_rng(0)
    lives_lost, returns, lengths, ended = 0, np.zeros(2), np.zeros(2, int), []
    for _ in range(5000):
        step = engine.step(rng.integers(0, 4, 2))
        returns += step.rewards
        lengths += 1
        lives_lost += int(step.lost_lives.sum())
        assert not (step.lost_lives & step.terminated).any()
        for index in step.final:
            assert step.final[index].shape == (84, 84)
            ended.append((returns[index], lengths[index]))
            returns[index], lengths[index] = 0, 0
        if len(ended) >= 2:
            break
    # Breakout has 5 lives: each game that ended lost 4 lives on the way that did not end it.
    assert len(ended) >= 2 and lives_lost >= 4 * len(ended)
    # The counted episodes are whole games, with their raw scores.
    assert stats.finished == [(float(r), int(n), "") for r, n in ended]


def test_auto_takes_ale_for_atari_games_with_their_preprocessing_and_python_for_the_rest():
    assert resolve_engine("auto", "CartPole-v1", preprocessing=True) == "python"
    assert resolve_engine("gymnasium", "CartPole-v1", preprocessing=True) == "gymnasium"
    pytest.importorskip("ale_py.vector_env", reason='ALE\'s vector env is the atari extra: pip install -e ".[atari]"')
    assert resolve_engine("auto", "ALE/Breakout-v5", preprocessing=True) == "ale"
    assert resolve_engine("auto", "ALE/Breakout-v5", preprocessing=False) == "python"


@pytest.mark.parametrize(
    "engine, env_id, preprocessing, says",
    [
        ("ale", "CartPole-v1", True, r"--env-engine ale plays ale-py's Atari games .* 'CartPole-v1' is no Atari game"),
        ("ale", "ALE/Breakout-v5", False, r"is played raw \(--no-env-preprocessing\): use --env-engine python"),
        ("envpool", "CartPole-v1", True, r"--env-engine 'envpool': choose one of auto, python, gymnasium, ale"),
    ],
)
def test_an_engine_that_cannot_play_an_env_says_so_and_names_the_fix(engine, env_id, preprocessing, says):
    if env_id.startswith("ALE/"):
        pytest.importorskip(
            "ale_py.vector_env", reason='ALE\'s vector env is the atari extra: pip install -e ".[atari]"'
        )
    with pytest.raises(ConfigError, match=says):
        resolve_engine(engine, env_id, preprocessing)


def test_ale_without_its_vector_env_names_the_atari_extra(monkeypatch):
    import importlib.util

    installed = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if "ale_py" in name else installed(name))
    with pytest.raises(
        ConfigError, match=r'needs ale-py 0.10 or later, which has a vector env: pip install -U "flare2\[atari\]"'
    ):
        resolve_engine("ale", "ALE/Breakout-v5", preprocessing=True)
