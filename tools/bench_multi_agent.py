"""Multi-agent throughput: ``flare2 train`` on a PettingZoo env against the env's own loop with random actions.

    python tools/bench_multi_agent.py [--env mpe2.simple_spread_v3] [--agents 1 2 4] [--envs-per-agent 8]

The ceiling: PettingZoo's parallel API played as its docs show it (``env.step({agent: space.sample()})``, a game
reset when it ends), ``--envs-per-agent`` games in each of 1 and of as many processes as the machine has cores,
for ``--ceiling-seconds`` each after a second of warm-up: agent steps per second, every process together. Then
one ``flare2 train --algo ppo`` run per ``--agents`` value (agent processes of ``--envs-per-agent`` games each,
the compute process beside them, learning as it plays) for ``--steps`` agent steps; over its progress rows past
``--warmup-steps``: agent steps per second, the ratio to the machine's ceiling, the mean rows of a forward pass
(cts.csv: every live agent of every game of the processes that asked together), forward passes per second, and
the peak RSS of the run's process tree, and the mean return of the last 100 agents' episodes it reported. With
``--random-games N``, N games played with random actions first give the return a policy has to beat. All in one run
of this tool, so the ratios are of figures measured minutes apart. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from bench_atari import read_rows  # noqa: E402
from proctree import run_measured  # noqa: E402


def play_randomly(env_id: str, games: int, seconds: float, seed: int) -> int:
    """Agent steps of ``games`` games played with random actions for ``seconds`` (after one second unmeasured)."""
    module = importlib.import_module(env_id)
    envs = [module.parallel_env() for _ in range(games)]
    for index, env in enumerate(envs):
        env.reset(seed=seed + index)
        for agent in env.possible_agents:
            env.action_space(agent).seed(seed + index)
    steps, start = 0, time.monotonic()
    measured_from = start + 1.0
    while True:
        now = time.monotonic()
        if now >= measured_from + seconds:
            return steps
        for env in envs:
            actions = {agent: env.action_space(agent).sample() for agent in env.agents}
            env.step(actions)
            if now >= measured_from:
                steps += len(actions)
            if not env.agents:
                env.reset()


def random_return(env_id: str, games: int, seed: int = 0) -> float:
    """The mean return of an agent's episode over ``games`` games played with random actions."""
    env = importlib.import_module(env_id).parallel_env()
    returns: list[float] = []
    for game in range(games):
        env.reset(seed=seed + game)
        earned = dict.fromkeys(env.agents, 0.0)
        for agent in env.agents:
            env.action_space(agent).seed(seed + game)
        while env.agents:
            _, rewards, terminations, truncations, _ = env.step(
                {agent: env.action_space(agent).sample() for agent in env.agents}
            )
            for agent, reward in rewards.items():
                earned[agent] = earned.get(agent, 0.0) + float(reward)
                if terminations[agent] or truncations[agent]:
                    returns.append(earned.pop(agent))
    return sum(returns) / len(returns)


def ceiling(env_id: str, games: int, processes: int, seconds: float) -> float:
    """Agent steps per second of ``processes`` processes of ``games`` games each, played at once."""
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        steps = pool.starmap(play_randomly, [(env_id, games, seconds, 1000 * p) for p in range(processes)])
    return sum(steps) / seconds


def measure(args: argparse.Namespace, agents: int, log_dir: Path) -> dict[str, Any]:
    """One flare2 run of ``agents`` agent processes; its rates over the progress rows past the warm-up."""
    command = [
        sys.executable,
        "-m",
        "flare2.cli",
        "train",
        "--env",
        args.env,
        "--algo",
        "ppo",
        "--num-agents",
        str(agents),
        "--envs-per-agent",
        str(args.envs_per_agent),
        "--max-steps",
        str(args.steps),
        "--progress-interval",
        "2",
        "--log-dir",
        str(log_dir),
        *args.extra,
    ]
    print(f"# {' '.join(command[2:])}", flush=True)
    measured = run_measured(command, cwd=TOOLS.parent, timeout_s=args.timeout)
    if measured.returncode != 0:
        print(measured.stderr[-2000:], file=sys.stderr)
    progress = [row for row in read_rows(log_dir / "progress.csv") if int(row["env_steps"]) >= args.warmup_steps]
    first, last = progress[0], progress[-1]
    window = float(last["wall_time"]) - float(first["wall_time"])
    cts = [row for row in read_rows(log_dir / "cts.csv") if float(first["wall_time"]) < float(row["wall_time"])]
    batches = sum(int(row["predict_batches"]) for row in cts)
    # A row with no batch since the one before has no mean (nan): it adds no rows.
    rows = sum(
        int(row["predict_batches"]) * float(row["predict_batch_mean"]) for row in cts if int(row["predict_batches"])
    )
    return {
        "agents": agents,
        "steps_per_s": (int(last["env_steps"]) - int(first["env_steps"])) / window,
        "rows_per_forward": rows / batches if batches else float("nan"),
        "forwards_per_s": batches / (float(cts[-1]["wall_time"]) - float(first["wall_time"])) if cts else 0.0,
        "peak_rss_mb": measured.peak_rss_bytes / 2**20,
        "return_mean": float(last["return_mean"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="mpe2.simple_spread_v3", help="a PettingZoo env module")
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 2, 4], help="agent processes, a run each")
    parser.add_argument("--envs-per-agent", type=int, default=8, help="games in each agent process")
    parser.add_argument("--steps", type=int, default=300_000, help="agent steps of each run")
    parser.add_argument("--warmup-steps", type=int, default=50_000)
    parser.add_argument("--ceiling-seconds", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    parser.add_argument("--random-games", type=int, default=0, help="games of random actions for the return to beat")
    parser.add_argument("extra", nargs="*", help="more flare2 train options (after --)")
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    baseline = random_return(args.env, args.random_games) if args.random_games else float("nan")
    one = ceiling(args.env, args.envs_per_agent, 1, args.ceiling_seconds)
    machine = ceiling(args.env, args.envs_per_agent, cores, args.ceiling_seconds)
    print(f"# ceiling: {one:,.0f} agent steps/s in one process, {machine:,.0f} in {cores} processes", flush=True)
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for agents in args.agents:
            runs.append(measure(args, agents, Path(folder) / f"run{agents}"))
    print(f"\n{args.env}, {args.envs_per_agent} games an agent process, {cores} cores:\n")
    print(
        "| what | agent steps/s | of the machine's ceiling | rows a forward pass | forward passes/s | peak RSS MB "
        "| return (an agent's episode) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| random actions, 1 process | {one:,.0f} | {one / machine:.2f} | | | | {baseline:.3g} |")
    print(f"| random actions, {cores} processes | {machine:,.0f} | 1.00 | | | | |")
    for run in runs:
        print(
            f"| flare2 ppo, {run['agents']} agent process{'es' * (run['agents'] > 1)} | {run['steps_per_s']:,.0f} | "
            f"{run['steps_per_s'] / machine:.2f} | {run['rows_per_forward']:.1f} | {run['forwards_per_s']:,.0f} | "
            f"{run['peak_rss_mb']:,.0f} | {run['return_mean']:.3g} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
