"""flare2 against Stable-Baselines3 on CartPole-v1, measured in the same run on the same machine.

    python tools/bench_peers.py --install                  # once: makes .venv-peers with stable-baselines3
    python tools/bench_peers.py --seeds 0 1 2 --json runs/peers.json
    python tools/bench_peers.py --algos ppo --flare2-args "--num-agents 2 --envs-per-agent 4"

For A2C and PPO and each seed, three systems train until the mean return of
the last 100 finished training episodes reaches 475 (or a step budget runs out):

- sb3-dummy: SB3 with its 8 envs stepped in one process (DummyVecEnv);
- sb3-subproc: SB3 with one worker process per env (SubprocVecEnv);
- flare2: `python examples/cartpole_{a2c,ppo}.py --num-agents 1 --envs-per-agent 8` (their defaults: one agent
  process of 8 envs beside the compute process), as a new user runs it.

SB3 uses the rl-baselines3-zoo CartPole-v1 hyperparameters and runs in the
python of a separate virtualenv (made with --system-site-packages, so it shares
this python's torch and gymnasium); stable-baselines3 is no dependency of
flare2. Every run is one command, measured from start to exit with the peak
RSS of its whole process tree (tools/proctree.py). Reported per algorithm and
system: training env steps/s (SB3: steps / time in learn(); flare2: between
its first and last progress.csv rows, so start-up is left out on both sides),
env steps when the return first reached 475, process wall time to exit, and
peak RSS. Ratios of flare2 to each SB3 variant follow, because raw figures
move from machine to machine and run to run while the ratios of runs made
side by side move much less: compare ratios, not raw rates, across machines.

Each run also records how many cores other processes kept busy meanwhile;
runs that shared the machine are named under the table, and
--max-others-load N repeats such runs (the least disturbed attempt counts).

PPO's learning rate and clip range fall linearly to 0 over the step budget on
both sides (SB3: zoo's lin_ schedules over learn(); flare2: over --max-steps);
the default --ppo-steps 100000 is the zoo's schedule.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import venv
from dataclasses import asdict, dataclass
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
sys.path.insert(0, str(TOOLS))

from proctree import Measured, MeasureTimeout, run_measured  # noqa: E402
from steps_to_threshold import first_crossing  # noqa: E402

ALGOS = ("a2c", "ppo")
SYSTEMS = ("sb3-dummy", "sb3-subproc", "flare2")
SB3_VEC_ENV = {"sb3-dummy": "dummy", "sb3-subproc": "subproc"}
DEFAULT_VENV = ROOT / ".venv-peers"
# Runs during which the rest of the machine kept more than this many cores busy on average are named under the table.
SHARED_LOAD = 0.25

# Run by the venv's python with `-c`; argv[1] is a JSON object with algo, vec_env, n_envs, seed, budget, threshold.
SB3_RUNNER = r'''
"""SB3 side of tools/bench_peers.py: train on CartPole-v1 with rl-baselines3-zoo's settings, print one JSON line."""
import json
import sys
import time

import numpy as np
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv


def linear(start):
    """The zoo's lin_<start>: start when learn() begins, 0 at the end of its total_timesteps."""
    return lambda progress_remaining: progress_remaining * start


# rl-baselines3-zoo hyperparams/a2c.yml and ppo.yml, CartPole-v1 (both with n_envs 8).
ZOO = {
    # Otherwise SB3's defaults: n_steps 5, RMSprop at 7e-4, gamma 0.99, gae_lambda 1.
    "a2c": (A2C, {"ent_coef": 0.0}),
    "ppo": (PPO, {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                  "ent_coef": 0.0, "learning_rate": linear(1e-3), "clip_range": linear(0.2)}),
}


class StopAtReturn(BaseCallback):
    """Stops learn() once the last 100 training episodes (a full ep_info_buffer) average the threshold."""

    def __init__(self, threshold):
        super().__init__()
        self.threshold = threshold
        self.steps_at_threshold = None

    def _on_step(self):
        buffer = self.model.ep_info_buffer
        if (self.locals["dones"].any() and len(buffer) == buffer.maxlen
                and np.mean([info["r"] for info in buffer]) >= self.threshold):
            self.steps_at_threshold = self.model.num_timesteps
            return False
        return True


spec = json.loads(sys.argv[1])
algo_cls, hyperparams = ZOO[spec["algo"]]
vec_env_cls = {"dummy": DummyVecEnv, "subproc": SubprocVecEnv}[spec["vec_env"]]
env = make_vec_env("CartPole-v1", n_envs=spec["n_envs"], seed=spec["seed"], vec_env_cls=vec_env_cls)
model = algo_cls("MlpPolicy", env, seed=spec["seed"], device="cpu", verbose=0, **hyperparams)
callback = StopAtReturn(spec["threshold"])
start = time.perf_counter()
model.learn(total_timesteps=spec["budget"], callback=callback)
train_s = time.perf_counter() - start
env.close()
print(json.dumps({
    "steps_to_threshold": callback.steps_at_threshold,
    "steps_trained": int(model.num_timesteps),
    "train_s": train_s,
    "steps_per_s": model.num_timesteps / train_s,
}))
'''


@dataclass
class Run:
    """One training run of one system; the figures are None when the run failed or could not tell."""

    algo: str
    system: str
    seed: int
    returncode: int | None
    wall_s: float | None  # process wall time, command to exit
    peak_rss_mb: float | None  # summed over the process tree
    steps_to_threshold: int | None = None
    steps_trained: int | None = None
    steps_per_s: float | None = None
    train_s: float | None = None  # SB3: time in learn(); flare2: wall_time of its last progress row
    leftover_pids: tuple[int, ...] = ()
    cpu_s: float | None = None  # CPU seconds of the whole process tree
    others_load: float | None = None  # cores the rest of the machine kept busy meanwhile, on average
    attempts: int = 1  # more than 1 when --max-others-load repeated the run
    error: str | None = None


def venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def install_venv(venv_dir: Path) -> None:
    """Make the venv (sharing this python's packages, so torch is not fetched again) and pip-install SB3 into it."""
    if not venv_python(venv_dir).exists():
        print(f"creating {venv_dir} (--system-site-packages)", file=sys.stderr)
        venv.EnvBuilder(system_site_packages=True, with_pip=True).create(venv_dir)
    subprocess.run(
        [str(venv_python(venv_dir)), "-m", "pip", "install", "--disable-pip-version-check", "stable-baselines3"],
        check=True,
    )


def sb3_version(venv_dir: Path) -> str | None:
    """The stable-baselines3 version importable in the venv, or None."""
    python = venv_python(venv_dir)
    if not python.exists():
        return None
    done = subprocess.run(
        [str(python), "-c", "import stable_baselines3; print(stable_baselines3.__version__)"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def progress_figures(progress_csv: Path, threshold: float) -> dict[str, float | int | None]:
    """flare2's figures from its progress.csv: steps at the threshold, steps trained, and steps/s.

    The rate is taken between the first and the last row (the last is written as the run stops),
    so the start-up before the first row is left out, as SB3's time in learn() leaves out its own.
    """
    crossing = first_crossing(progress_csv, threshold)
    with open(progress_csv, newline="") as file:
        rows = [(float(row["wall_time"]), float(row["env_steps"])) for row in csv.DictReader(file)]
    if not rows:
        return {"steps_to_threshold": None, "steps_trained": None, "steps_per_s": None, "train_s": None}
    (t0, s0), (t1, s1) = rows[0], rows[-1]
    return {
        "steps_to_threshold": None if crossing is None else int(crossing["env_steps"]),
        "steps_trained": int(s1),
        "steps_per_s": (s1 - s0) / (t1 - t0) if t1 > t0 else None,
        "train_s": t1,
    }


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def measured_run(algo: str, system: str, seed: int, measured: Measured) -> Run:
    return Run(
        algo,
        system,
        seed,
        measured.returncode,
        measured.wall_s,
        measured.peak_rss_bytes / 2**20,
        leftover_pids=measured.leftover_pids,
        cpu_s=measured.cpu_s,
        others_load=measured.others_cpu_s / measured.wall_s if measured.wall_s > 0 else None,
    )


def run_sb3(
    algo: str, system: str, seed: int, *, venv_dir: Path, n_envs: int, budget: int, threshold: float, timeout_s: float
) -> Run:
    spec = {
        "algo": algo,
        "vec_env": SB3_VEC_ENV[system],
        "n_envs": n_envs,
        "seed": seed,
        "budget": budget,
        "threshold": threshold,
    }
    command = [str(venv_python(venv_dir)), "-c", SB3_RUNNER, json.dumps(spec)]
    try:
        measured = run_measured(command, cwd=ROOT, timeout_s=timeout_s)
    except MeasureTimeout as exc:
        return Run(algo, system, seed, None, None, None, error=str(exc))
    run = measured_run(algo, system, seed, measured)
    lines = [line for line in measured.stdout.splitlines() if line.startswith("{")]
    if measured.returncode != 0 or not lines:
        run.error = f"exit {measured.returncode}:\n{_tail(measured.stderr)}"
        return run
    figures = json.loads(lines[-1])
    for key in ("steps_to_threshold", "steps_trained", "steps_per_s", "train_s"):
        setattr(run, key, figures[key])
    return run


def run_flare2(algo: str, seed: int, *, flare2_args: list[str], budget: int, threshold: float, timeout_s: float) -> Run:
    with tempfile.TemporaryDirectory(prefix=f"bench_peers_{algo}_s{seed}_") as log_dir:
        command = [
            sys.executable,
            f"examples/cartpole_{algo}.py",
            *flare2_args,
            "--stop-return",
            f"{threshold:g}",
            "--max-steps",
            str(budget),
            "--log-dir",
            log_dir,
            "--seed",
            str(seed),
            "--device",
            "cpu",
        ]
        try:
            measured = run_measured(command, cwd=ROOT, timeout_s=timeout_s)
        except MeasureTimeout as exc:
            return Run(algo, "flare2", seed, None, None, None, error=str(exc))
        run = measured_run(algo, "flare2", seed, measured)
        progress_csv = Path(log_dir) / "progress.csv"
        if measured.returncode != 0 or not progress_csv.is_file():
            run.error = f"exit {measured.returncode}:\n{_tail(measured.stdout + measured.stderr)}"
            return run
        for key, value in progress_figures(progress_csv, threshold).items():
            setattr(run, key, value)
    return run


def _median(values: list[float | int | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(runs: list[Run]) -> dict:
    """Per (algo, system): the medians and per-seed figures; per algo: flare2's ratios to each SB3 variant.

    steps_per_s ratio > 1: flare2 steps faster; wall_s and peak_rss ratios < 1: flare2 exits sooner / holds less.
    """
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.algo, run.system), []).append(run)
    rows = []
    for (algo, system), group in groups.items():
        group = sorted(group, key=lambda run: run.seed)
        rows.append(
            {
                "algo": algo,
                "system": system,
                "seeds": [run.seed for run in group],
                "steps_per_s_median": _median([run.steps_per_s for run in group]),
                "steps_to_threshold": [run.steps_to_threshold for run in group],
                "reached": [run.error is None and run.steps_to_threshold is not None for run in group],
                "failed": [run.error is not None for run in group],
                "wall_s": [run.wall_s for run in group],
                "wall_s_median": _median([run.wall_s for run in group]),
                "peak_rss_mb_median": _median([run.peak_rss_mb for run in group]),
                "cpu_s_median": _median([run.cpu_s for run in group]),
                "others_load": [run.others_load for run in group],
            }
        )
    by_key = {(row["algo"], row["system"]): row for row in rows}
    ratios = []
    for (algo, system), row in by_key.items():
        flare2 = by_key.get((algo, "flare2"))
        if system == "flare2" or flare2 is None:
            continue
        ratios.append(
            {
                "algo": algo,
                "against": system,
                "steps_per_s": _ratio(flare2["steps_per_s_median"], row["steps_per_s_median"]),
                "wall_s": _ratio(flare2["wall_s_median"], row["wall_s_median"]),
                "peak_rss": _ratio(flare2["peak_rss_mb_median"], row["peak_rss_mb_median"]),
            }
        )
    order = {name: i for i, name in enumerate(ALGOS + SYSTEMS)}
    rows.sort(key=lambda row: (order.get(row["algo"], 99), order.get(row["system"], 99)))
    ratios.sort(key=lambda row: (order.get(row["algo"], 99), order.get(row["against"], 99)))
    return {"rows": rows, "ratios": ratios}


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown_table(summary: dict, threshold: float = 475.0) -> str:
    """The summary as two markdown tables: the figures per (algo, system), then flare2's ratios."""
    t = f"{threshold:g}"
    lines = [
        f"| algo | system | env steps/s (median) | steps to {t} (per seed) | wall s to exit (per seed) "
        "| wall s (median) | peak RSS MB (median) |",
        "|---|---|---:|---|---|---:|---:|",
    ]
    for row in summary["rows"]:
        steps = " / ".join(
            "failed" if failed else "never" if value is None else f"{value:,}"
            for value, failed in zip(row["steps_to_threshold"], row["failed"])
        )
        walls = " / ".join(_num(value, 1) for value in row["wall_s"])
        lines.append(
            f"| {row['algo'].upper()} | {row['system']} | {_num(row['steps_per_s_median'])} | {steps} | {walls} "
            f"| {_num(row['wall_s_median'], 1)} | {_num(row['peak_rss_mb_median'])} |"
        )
    if summary["ratios"]:
        lines += [
            "",
            "| algo | flare2 against | steps/s ratio (>1: flare2 faster) | wall-time ratio (<1: flare2 sooner) "
            "| RSS ratio (<1: flare2 smaller) |",
            "|---|---|---:|---:|---:|",
        ]
        for ratio in summary["ratios"]:
            lines.append(
                f"| {ratio['algo'].upper()} | {ratio['against']} | {_num(ratio['steps_per_s'], 2)} "
                f"| {_num(ratio['wall_s'], 2)} | {_num(ratio['peak_rss'], 2)} |"
            )
    shared = [
        f"{row['algo'].upper()} {row['system']} seed {seed} ({load:.2f})"
        for row in summary["rows"]
        for seed, load in zip(row["seeds"], row["others_load"])
        if load is not None and load > SHARED_LOAD
    ]
    if shared:
        lines += [
            "",
            f"Other processes kept this many cores busy on average during: {', '.join(shared)}; "
            "those runs had less of the machine than the others.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--install", action="store_true", help="create the venv and pip-install stable-baselines3 into it"
    )
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="virtualenv holding stable-baselines3")
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--threshold", type=float, default=475.0, help="mean return of the last 100 episodes to reach")
    parser.add_argument("--a2c-steps", type=int, default=500_000, help="A2C step budget (zoo: 5e5)")
    parser.add_argument(
        "--ppo-steps",
        type=int,
        default=100_000,
        help="PPO step budget; the learning rate and clip range fall to 0 over it (zoo: 1e5)",
    )
    parser.add_argument("--n-envs", type=int, default=8, help="SB3's env count (zoo: 8)")
    parser.add_argument(
        "--flare2-args",
        default=None,
        help="extra arguments of the flare2 example scripts (default: '--num-agents 1 --envs-per-agent N_ENVS'; "
        "keep the env count equal to SB3's for a like-for-like comparison)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is killed")
    parser.add_argument(
        "--max-others-load",
        type=float,
        default=None,
        help="repeat a run (up to --retries times) while other processes kept more than this many "
        "cores busy on average during it; the least disturbed attempt is kept",
    )
    parser.add_argument("--retries", type=int, default=2, help="repeats allowed per run by --max-others-load")
    parser.add_argument("--json", type=Path, help="also write every run's figures and the ratios to this file")
    args = parser.parse_args(argv)
    venv_dir = args.venv.resolve()
    flare2_args = shlex.split(
        args.flare2_args if args.flare2_args is not None else f"--num-agents 1 --envs-per-agent {args.n_envs}"
    )
    budgets = {"a2c": args.a2c_steps, "ppo": args.ppo_steps}

    if args.install:
        install_venv(venv_dir)
    version = None
    if any(system in SB3_VEC_ENV for system in args.systems):
        version = sb3_version(venv_dir)
        if version is None:
            venv_option = "" if venv_dir == DEFAULT_VENV else f" --venv {args.venv}"
            print(
                f"stable-baselines3 is not importable with {venv_python(venv_dir)}: "
                f"run `python tools/bench_peers.py --install{venv_option}` once to make that venv",
                file=sys.stderr,
            )
            return 2

    def run_once(algo: str, system: str, seed: int) -> Run:
        if system == "flare2":
            run = run_flare2(
                algo,
                seed,
                flare2_args=flare2_args,
                budget=budgets[algo],
                threshold=args.threshold,
                timeout_s=args.timeout,
            )
        else:
            run = run_sb3(
                algo,
                system,
                seed,
                venv_dir=venv_dir,
                n_envs=args.n_envs,
                budget=budgets[algo],
                threshold=args.threshold,
                timeout_s=args.timeout,
            )
        status = (
            f"FAILED: {run.error}"
            if run.error
            else (
                f"{_num(run.steps_per_s)} steps/s, {run.steps_to_threshold or 'never'} steps to "
                f"{args.threshold:g}, {run.wall_s:.1f} s, {run.peak_rss_mb:.0f} MB, others used "
                f"{_num(run.others_load, 2)} cores"
            )
        )
        if run.leftover_pids:
            status += f" (left processes running: {list(run.leftover_pids)}, killed)"
        print(f"{algo} {system} seed {seed}: {status}", file=sys.stderr, flush=True)
        return run

    def disturbed(run: Run) -> bool:
        return args.max_others_load is not None and (run.others_load or 0.0) > args.max_others_load

    runs: list[Run] = []
    # Systems interleaved within each seed, so slow drift of the machine falls on all of them alike.
    for algo in args.algos:
        for seed in args.seeds:
            for system in args.systems:
                attempts = [run_once(algo, system, seed)]
                while disturbed(attempts[-1]) and not attempts[-1].error and len(attempts) <= args.retries:
                    attempts.append(run_once(algo, system, seed))
                kept = min(attempts, key=lambda run: (run.error is not None, run.others_load or 0.0))
                kept.attempts = len(attempts)
                runs.append(kept)

    summary = summarize(runs)
    print(markdown_table(summary, args.threshold))
    if args.json:
        config = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
        config.update(flare2_args=flare2_args, sb3_version=version, python=sys.version.split()[0], cpus=os.cpu_count())
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": config, "runs": [asdict(run) for run in runs], **summary}, indent=2))
    return 1 if any(run.error for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
