"""SB3's side of tools/bench_atari.py: Stable-Baselines3's PPO on an Atari game for a number of env steps; prints
one JSON line.

    .venv-peers/bin/python tools/sb3_atari.py '{"env_id": "ALE/Breakout-v5", "envs": 8, "steps": 30000,
        "warmup_steps": 10000, "device": "cpu", "vec_env": "subproc", "torch_threads": 2}'

rl-baselines3-zoo's PPO settings for Atari (hyperparams/ppo.yml): SB3's AtariWrapper and 4 stacked frames,
n_steps 128, 4 epochs of minibatches of 256, learning rate 2.5e-4, clip 0.1, entropy 0.01, value 0.5; the envs in
one process (``DummyVecEnv``) or one process each (``SubprocVecEnv``, make_atari_env's way past one env). ALE's
own frame skip and sticky actions are off, as flare2's preprocessing has them. Over the rollouts that end past
``warmup_steps``: env steps per second, the share of that time spent in ``train()`` (the update), and the rate
the updates alone would allow.
"""

from __future__ import annotations

import json
import sys
import time

import ale_py
import gymnasium as gym
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

gym.register_envs(ale_py)


class Clock(BaseCallback):
    """Records (seconds since the start, env steps) at every rollout's end."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.monotonic()
        self.marks: list[tuple[float, int]] = []

    def _on_rollout_end(self) -> None:
        self.marks.append((time.monotonic() - self.start, self.num_timesteps))

    def _on_step(self) -> bool:
        return True


def main() -> None:
    job = json.loads(sys.argv[1])
    torch.set_num_threads(job["torch_threads"])
    env = make_atari_env(
        job["env_id"],
        n_envs=job["envs"],
        seed=0,
        vec_env_cls={"dummy": DummyVecEnv, "subproc": SubprocVecEnv}[job["vec_env"]],
        env_kwargs={"frameskip": 1, "repeat_action_probability": 0.0},
    )
    env = VecFrameStack(env, n_stack=4)
    model = PPO(
        "CnnPolicy",
        env,
        n_steps=128,
        n_epochs=4,
        batch_size=256,
        learning_rate=2.5e-4,
        clip_range=0.1,
        ent_coef=0.01,
        vf_coef=0.5,
        device=job["device"],
        seed=0,
    )
    clock = Clock()
    updates: list[tuple[float, float]] = []  # (start, seconds) of each train()
    train = model.train

    def timed_train() -> None:
        began = time.monotonic()
        train()
        updates.append((began - clock.start, time.monotonic() - began))

    model.train = timed_train  # type: ignore[method-assign]
    model.learn(total_timesteps=job["steps"], callback=clock)
    env.close()
    after = [(at, steps) for at, steps in clock.marks if steps >= job["warmup_steps"]]
    if len(after) < 2:
        print(json.dumps({"steps_per_s": float("nan")}))
        return
    (begin, first), (end, last) = after[0], after[-1]
    # Each train() follows a rollout's end: those after the window's first rollout and before its last.
    update_s = sum(seconds for at, seconds in updates if begin <= at < end)
    rate = (last - first) / (end - begin)
    print(
        json.dumps(
            {
                "steps": last - first,
                "steps_per_s": rate,
                "update_share": update_s / (end - begin),
                "update_only_steps_per_s": (last - first) / update_s if update_s else float("nan"),
                "torch_threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
