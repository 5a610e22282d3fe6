"""Env steps per second of a flare2 run against an in-process baseline measured in the same run.

    python tools/bench_throughput.py --num-agents 8 --steps 40000

Baseline: one process steps N CartPole envs in lockstep, asks the same A2C
MLP for N actions at once and calls learn() every 5 steps: the same work
without processes or sockets. Then flare2 runs the same A2C with N agent
processes, once with the default batching rule and once with max_batch=1
(no batching). Each flare2 rate is taken between its first and last progress
rows, so start-up and shutdown are left out. Ratios are against the baseline
because machines are noisy; compare ratios, not raw rates, across machines.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from flare2.core.computation_task import ComputationTask
from flare2.runtime.config import AgentConfig, BatchingConfig, CTConfig, RunConfig
from flare2.runtime.manager import Manager
from flare2.zoo.a2c import A2C, A2CConfig
from flare2.zoo.models import MLPActorCritic

ENV_ID = "CartPole-v1"
SAMPLE_INTERVAL = 5


def build_a2c() -> A2C:
    env = gym.make(ENV_ID)
    return A2C(MLPActorCritic(env.observation_space, env.action_space), A2CConfig())


def serial_steps_per_s(num_envs: int, steps: int) -> float:
    """The baseline: the same envs, model and learn calls in one process."""
    torch.set_num_threads(1)
    ct = ComputationTask("RL", build_a2c(), device="cpu")
    envs = [gym.make(ENV_ID) for _ in range(num_envs)]
    obs = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)]).astype(np.float32)
    window: list[dict[str, np.ndarray]] = []
    start = time.perf_counter()
    for _ in range(steps // num_envs):
        actions, _ = ct.predict({"obs": obs}, {})
        step = {"obs": obs, "action": actions["action"], "next_obs": np.empty_like(obs)}
        rewards, terminated, truncated = np.empty(num_envs, np.float32), np.empty(num_envs, bool), np.empty(num_envs, bool)
        for i, env in enumerate(envs):
            next_obs, rewards[i], terminated[i], truncated[i], _ = env.step(int(actions["action"][i]))
            step["next_obs"][i] = next_obs
            if terminated[i] or truncated[i]:
                next_obs, _ = env.reset()
            obs[i] = next_obs
        window.append({**step, "reward": rewards, "terminated": terminated, "truncated": truncated})
        obs = obs.copy()
        if len(window) == SAMPLE_INTERVAL:
            stacked = {key: np.stack([s[key] for s in window], axis=1) for key in window[0]}
            ct.learn({
                "inputs": {"obs": stacked["obs"]}, "next_inputs": {"obs": stacked["next_obs"]},
                "actions": {"action": stacked["action"]}, "rewards": {"reward": stacked["reward"]},
                "states": {}, "terminated": stacked["terminated"], "truncated": stacked["truncated"],
            })
            window = []
    return (steps // num_envs) * num_envs / (time.perf_counter() - start)


def flare2_steps_per_s(num_agents: int, steps: int, batching: BatchingConfig) -> tuple[float, float]:
    """Steady-state env steps/s and mean prediction batch of a real run."""
    with tempfile.TemporaryDirectory() as log_dir:
        config = RunConfig(
            cts=(CTConfig(name="RL", build=partial(build_a2c), batching=batching),),
            agents=AgentConfig(path="flare2.core.envs:GymAgent", kwargs={"env_id": ENV_ID}, num_agents=num_agents),
            log_dir=log_dir, max_steps=steps, device="cpu", progress_interval_s=1.0,
        )
        code = Manager(config).run()
        if code != 0:
            raise SystemExit(f"the flare2 run failed with exit code {code}")
        with open(Path(log_dir) / "progress.csv", newline="") as file:
            rows = [row for row in csv.DictReader(file) if int(row["env_steps"]) > 0]
    first, last = rows[0], rows[-2] if len(rows) > 2 else rows[-1]
    rate = (int(last["env_steps"]) - int(first["env_steps"])) / (float(last["wall_time"]) - float(first["wall_time"]))
    batches = [float(row["batch_size_mean"]) for row in rows[1:] if row["batch_size_mean"] != "nan"]
    return rate, sum(batches) / len(batches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-agents", type=int, default=8, help="agent processes (and envs of the baseline)")
    parser.add_argument("--steps", type=int, default=40_000, help="env steps of each measurement")
    args = parser.parse_args(argv)

    baseline = serial_steps_per_s(args.num_agents, args.steps)
    batched, batched_mean = flare2_steps_per_s(args.num_agents, args.steps, BatchingConfig())
    unbatched, _ = flare2_steps_per_s(args.num_agents, args.steps, BatchingConfig(max_batch=1, learn_max_batch=1))

    print(f"\n{args.num_agents} envs/agents, {args.steps} env steps each, CartPole-v1, A2C MLP 64-64, CPU")
    print(f"{'configuration':44} {'steps/s':>9} {'ratio':>7} {'batch':>6}")
    print(f"{'in-process serial loop (baseline)':44} {baseline:9.0f} {1.0:7.2f} {args.num_agents:6d}")
    print(f"{'flare2, batching rule (max_batch 64, 2 ms)':44} {batched:9.0f} {batched / baseline:7.2f} {batched_mean:6.2f}")
    print(f"{'flare2, no batching (max_batch 1)':44} {unbatched:9.0f} {unbatched / baseline:7.2f} {1:6d}")
    print(f"batching speed-up: {batched / unbatched:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
