"""What periodic checkpoints cost: the time one checkpoint of a CT takes to write, as a share of the default interval.

    python tools/bench_checkpoint.py [--repeats 10]

For the zoo's PPO over CartPole's vectors (a 64-64 MLP) and over Atari's stacks of four 84x84 frames (the Nature
CNN), each with Adam's moments as they are from the first update on: the file's size, the median time of
``ComputationTask.save`` over ``--repeats`` writes (a temporary file, then a rename: ``flare2.core.checkpoint_files``),
and that time as a share of ``CHECKPOINT_EVERY_S``, the run time the compute process gives to checkpoints by default.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from flare2.core.computation_task import ComputationTask
from flare2.runtime.config import CHECKPOINT_EVERY_S
from flare2.zoo.models import ActorCritic
from flare2.zoo.ppo import PPO, PPOConfig

MODELS = {
    "PPO, CartPole (64-64 MLP)": (gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(2), 1),
    "PPO, Atari (Nature CNN, 4 frames)": (gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(4), 4),
}


def save_seconds(name: str, repeats: int, directory: Path) -> tuple[int, float]:
    """The size of CT ``name``'s checkpoint and the median seconds of writing it."""
    observation_space, action_space, frames = MODELS[name]
    algorithm = PPO(ActorCritic(observation_space, action_space, frames=frames), PPOConfig())
    for parameter in algorithm.model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    algorithm.optimizer.step()  # Adam's moments, as every checkpoint after the first update holds them
    ct = ComputationTask("RL", algorithm, device="cpu")
    path = directory / "RL.pt"
    times = []
    for step in range(repeats):
        started = time.perf_counter()
        ct.save(path, {"env_steps": step})
        times.append(time.perf_counter() - started)
    return path.stat().st_size, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"| model | checkpoint | write (median of {args.repeats}) | share of {CHECKPOINT_EVERY_S:.0f} s |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as directory:
        for name in MODELS:
            size, seconds = save_seconds(name, args.repeats, Path(directory))
            share = seconds / CHECKPOINT_EVERY_S
            print(f"| {name} | {size / 1e6:.1f} MB | {seconds * 1000:.1f} ms | {share:.3%} |")


if __name__ == "__main__":
    main()
