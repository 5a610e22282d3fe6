"""SB3's side of tools/bench_atari.py: Stable-Baselines3's PPO on an Atari game for a fixed time; prints one JSON line.

    .venv-peers/bin/python tools/sb3_atari.py '{"env_id": "ALE/Breakout-v5", "envs": 64, "seconds": 90,
                                                "warmup": 20, "device": "cuda"}'

rl-baselines3-zoo's PPO settings for Atari (hyperparams/ppo.yml): SB3's AtariWrapper and 4 stacked frames,
n_steps 128, 4 epochs of minibatches of 256, learning rate 2.5e-4, clip 0.1, entropy 0.01, value 0.5; one
process per env (SubprocVecEnv, make_atari_env's way past one env). ALE's own frame skip and sticky actions are
off, as flare2's preprocessing has them. Env steps per second over the time after the warm-up.
"""

from __future__ import annotations

import json
import sys
import time

import ale_py
import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import SubprocVecEnv, VecFrameStack

gym.register_envs(ale_py)


class Clock(BaseCallback):
    """Records (seconds since the start, env steps) at every rollout's end; stops learn() after ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.start = time.monotonic()
        self.marks: list[tuple[float, int]] = []

    def _on_rollout_end(self) -> None:
        self.marks.append((time.monotonic() - self.start, self.num_timesteps))

    def _on_step(self) -> bool:
        return time.monotonic() - self.start < self.seconds


def main() -> None:
    job = json.loads(sys.argv[1])
    vec_env_cls = SubprocVecEnv if job["envs"] > 1 else None
    env = make_atari_env(
        job["env_id"],
        n_envs=job["envs"],
        seed=0,
        vec_env_cls=vec_env_cls,
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
    clock = Clock(job["seconds"])
    model.learn(total_timesteps=10**10, callback=clock)
    env.close()
    after = [(at, steps) for at, steps in clock.marks if at >= job["warmup"]]
    rate = (after[-1][1] - after[0][1]) / (after[-1][0] - after[0][0]) if len(after) >= 2 else float("nan")
    print(json.dumps({"envs": job["envs"], "steps_per_s": rate, "marks": len(clock.marks)}))


if __name__ == "__main__":
    main()
