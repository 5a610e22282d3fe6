"""Environments for the zoo's examples. Imports no torch: agent processes import this module.

``flare2/CartPoleNoVelocity-v1`` is CartPole-v1 with the cart velocity and the
pole's angular velocity hidden: the observation is ``[x, theta]``. A policy
that sees one observation cannot tell which way the pole is falling; one with
short-term memory can infer the velocities from consecutive observations.

Gymnasium's ``"module:id"`` form imports this module, which registers the id,
so from any process::

    gymnasium.make("flare2.zoo.envs:flare2/CartPoleNoVelocity-v1")

Importing it registers Minefield's ids too (``flare2.zoo.minefield``): an id of the ``flare2`` namespace imports this
module first (``flare2.core.env_making.ENV_PACKAGES``), so ``flare2/Minefield-v1`` works without a module prefix.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

import flare2.zoo.minefield  # noqa: F401  (registers flare2/Minefield-v0 and -v1)

CARTPOLE_NO_VELOCITY = "flare2/CartPoleNoVelocity-v1"
"""The registered id (without the module prefix)."""

CARTPOLE_NO_VELOCITY_ENTRY = f"flare2.zoo.envs:{CARTPOLE_NO_VELOCITY}"
"""The id to pass to ``gymnasium.make`` or ``GymAgent(env_id=...)`` from a process that has not imported this module."""

_KEPT = np.array([0, 2])  # CartPole's observation is [x, x_dot, theta, theta_dot].


class HideVelocity(gym.ObservationWrapper):
    """Keeps the cart position and the pole angle of a CartPole observation, drops both velocities."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or space.shape != (4,):
            raise ValueError(f"HideVelocity wraps CartPole-like envs with a Box((4,)) observation, got {space}")
        self.observation_space = gym.spaces.Box(space.low[_KEPT], space.high[_KEPT], dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation)[_KEPT]


def make_cartpole_no_velocity(**kwargs) -> gym.Env:
    """The entry point of the registered id: CartPole (no time limit of its own) wrapped by ``HideVelocity``."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return HideVelocity(CartPoleEnv(**kwargs))


if CARTPOLE_NO_VELOCITY not in gym.registry:
    gym.register(
        id=CARTPOLE_NO_VELOCITY,
        entry_point=make_cartpole_no_velocity,
        max_episode_steps=500,
        reward_threshold=475.0,
    )
