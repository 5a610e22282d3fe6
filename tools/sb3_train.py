"""SB3's side of tools/bench_peers.py: train one row with Stable-Baselines3 and print one JSON line of figures.

    .venv-peers/bin/python tools/sb3_train.py '{"spec": {...}, "env_id": "CartPole-v1", "seed": 0,
                                                "budget": 100000, "threshold": 475, "vec_env": "dummy"}'

``spec`` is a tools/sb3_settings.py Sb3Spec as JSON; an optional ``curve`` path receives every finished
episode (env steps, return, mean of the last 100). Training stops once the
mean return of the last 100 finished training episodes reaches the threshold,
the rule of flare2's --stop-return, or when learn() has spent the budget. Runs
in the virtualenv that holds stable-baselines3 (bench_peers.py --install).
"""

from __future__ import annotations

import csv
import json
import sys
import time
from collections import deque

import gymnasium as gym
import numpy as np
import stable_baselines3
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.noise import NormalActionNoise
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack, VecNormalize

# bench_peers.py puts this tree's flare2 on the path: its registration of the env packages (MinAtar's ids exist only
# once minatar.gym.register_envs() has run) serves both sides.
from flare2.core.env_making import register_env_package

RETURN_WINDOW = 100


class RewardTransform(gym.RewardWrapper):
    """flare2's --scale-rewards then --clip-rewards, inside SB3's Monitor, so the returns it reports stay the env's."""

    def __init__(self, env: gym.Env, scale: float | None = None, clip: float | None = None) -> None:
        super().__init__(env)
        self.scale, self.clip = scale, clip

    def reward(self, reward):
        if self.scale is not None:
            reward = reward * self.scale
        if self.clip is not None:
            reward = float(np.clip(reward, -self.clip, self.clip))
        return reward


class StopAtReturn(BaseCallback):
    """Stops learn() once the last 100 finished training episodes average the threshold.

    It keeps its own window from the Monitor infos of each step: SB3 adds them to its ep_info_buffer only after the
    callback has run, so that buffer would lag a step behind.
    """

    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold = threshold
        self.returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.steps_at_threshold: int | None = None
        self.curve: list[tuple[int, float, float]] = []  # env steps, return, mean of the window

    def _on_step(self) -> bool:
        ended = [info["episode"]["r"] for info in self.locals["infos"] if "episode" in info]
        if not ended:
            return True
        for value in ended:
            self.returns.append(float(value))
            self.curve.append((int(self.model.num_timesteps), float(value), float(np.mean(self.returns))))
        if len(self.returns) == RETURN_WINDOW and np.mean(self.returns) >= self.threshold:
            self.steps_at_threshold = int(self.model.num_timesteps)
            return False
        return True


class MinAtarCNN(BaseFeaturesExtractor):
    """flare2's ``minatar`` encoder (flare2/zoo/encoders.py) for SB3: over channels-last images, one 3x3 convolution
    of 16 channels, then 128 features, ReLU after each (SB3 initialises it orthogonally with gain sqrt(2), as
    flare2 does)."""

    def __init__(self, observation_space: gym.spaces.Box) -> None:
        super().__init__(observation_space, features_dim=128)
        height, width, channels = observation_space.shape
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(channels, 16, 3),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(16 * (height - 2) * (width - 2), 128),
            torch.nn.ReLU(),
        )

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.net(observations.permute(0, 3, 1, 2).float())


FEATURES_EXTRACTORS = {"minatar": MinAtarCNN}


def linear(start: float, zero_at: float):
    """start at the beginning of learn(), 0 once the fraction zero_at of its budget is spent, and 0 after."""
    return lambda progress_remaining: start * max(0.0, 1.0 - (1.0 - progress_remaining) / zero_at)


def build(job: dict):
    spec = job["spec"]
    torch.set_num_threads(spec["torch_threads"])
    wrapper = None
    if spec["reward_scale"] is not None or spec["reward_clip"] is not None:
        wrapper = RewardTransform
    register_env_package(job["env_id"])
    env = make_vec_env(
        job["env_id"],
        n_envs=spec["n_envs"],
        seed=job["seed"],
        env_kwargs=spec["env_kwargs"] or None,
        vec_env_cls={"dummy": DummyVecEnv, "subproc": SubprocVecEnv}[job["vec_env"]],
        wrapper_class=wrapper,
        wrapper_kwargs={"scale": spec["reward_scale"], "clip": spec["reward_clip"]} if wrapper else None,
    )
    if spec["frame_stack"]:
        env = VecFrameStack(env, spec["frame_stack"])
    if spec["normalize_observations"] or spec["normalize_rewards"] is not None:
        rewards = spec["normalize_rewards"] is not None
        env = VecNormalize(
            env,
            norm_obs=spec["normalize_observations"],
            norm_reward=rewards,
            clip_obs=10.0,
            clip_reward=10.0,
            gamma=spec["normalize_rewards"] if rewards else 0.99,
        )
    kwargs = dict(spec["kwargs"])
    policy_kwargs = dict(kwargs.get("policy_kwargs", {}))
    if "activation_fn" in policy_kwargs:
        policy_kwargs["activation_fn"] = {"relu": torch.nn.ReLU}[policy_kwargs["activation_fn"]]
    if spec["features_extractor"] is not None:
        policy_kwargs["features_extractor_class"] = FEATURES_EXTRACTORS[spec["features_extractor"]]
    kwargs["policy_kwargs"] = policy_kwargs
    if spec["learning_rate"] is not None:
        kwargs["learning_rate"] = linear(spec["learning_rate"]["start"], spec["learning_rate"]["zero_at"])
    if spec["action_noise"] is not None:
        size = env.action_space.shape[-1]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(size), spec["action_noise"] * np.ones(size))
    algo = getattr(stable_baselines3, spec["algo"])
    return env, algo("MlpPolicy", env, seed=job["seed"], device="cpu", verbose=0, **kwargs)


def main() -> None:
    job = json.loads(sys.argv[1])
    env, model = build(job)
    callback = StopAtReturn(job["threshold"])
    start = time.perf_counter()
    model.learn(total_timesteps=job["budget"], callback=callback)
    train_s = time.perf_counter() - start
    env.close()
    if job.get("curve"):
        with open(job["curve"], "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["env_steps", "return", "return_mean"])
            writer.writerows(callback.curve)
    print(
        json.dumps(
            {
                "steps_to_threshold": callback.steps_at_threshold,
                "steps_trained": int(model.num_timesteps),
                "train_s": train_s,
                "steps_per_s": model.num_timesteps / train_s,
                "sb3_version": stable_baselines3.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
