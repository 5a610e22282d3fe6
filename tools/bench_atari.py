"""Atari throughput: ``flare2 train`` and SB3's PPO on a game for a fixed number of env steps, measured alike.

    python tools/bench_atari.py --device cpu --envs 8 --sb3-python .venv-peers/bin/python --repeat 3
    python tools/bench_atari.py --device cuda --envs 64 128 256 --steps 400000 --warmup-steps 100000

Each setting is one run of the algorithm's Atari preset with ``--num-agents`` processes of ``--envs-per-agent``
envs (the total split into processes of at most ``--envs-per-process``, a run for each value given) for
``--steps`` env steps, with
``--torch-threads`` threads. Over the rows of progress.csv past ``--warmup-steps`` it reports env steps/s and
frames/s (4 frames per step, the preprocessing's frame skip), the compute process's seconds in predict() and
learn() per wall second (cts.csv), the rate learn() alone would allow (the steps over the seconds learn() took:
acting for free), the mean predict batch, the peak RSS of the run's process tree (tools/proctree.py) and, where
there is one, the GPU's utilisation sampled by nvidia-smi over the same window.

``--engines python ale ...`` plays every setting once per env engine (``--env-engine``, flare2.core.env_engines).
``--ceiling`` first measures each engine alone: the same processes of the same envs each, random actions, no
inference, no learning (``--ceiling-seconds`` of play after one second of warm-up); every flare2 row then states
its ratio to the ceiling of the engine it used.

With ``--sb3-python PYTHON`` (a Python that has stable-baselines3 and ale-py, such as the one
``tools/bench_peers.py --install`` makes), SB3's PPO plays each setting too, right after flare2's, once per
``--sb3-vec-env`` (DummyVecEnv, SubprocVecEnv): tools/sb3_atari.py, rl-baselines3-zoo's Atari settings and the
same torch threads, measured over the same steps, with its share of time in ``train()``. Each ratio is flare2's
rate over the better SB3 rate of the same repeat; ``--repeat N`` plays every run N times, interleaved, and the
table gives the medians. Prints Markdown tables; ``--json FILE`` keeps every run's figures.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from proctree import run_measured  # noqa: E402

FRAME_SKIP = 4
"""Frames per env step under the published preprocessing (flare2.core.env_making)."""


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


class GPUSampler:
    """nvidia-smi's utilisation.gpu every half second, in a thread; nothing where there is no nvidia-smi."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._process: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if shutil.which("nvidia-smi") is None:
            return
        self._process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-lms", "500"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            parts = line.strip().split(",")
            try:
                self.samples.append((time.monotonic(), float(parts[0])))
            except (ValueError, IndexError):
                continue

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait()

    def mean_between(self, start: float, stop: float) -> float:
        values = [value for at, value in self.samples if start <= at <= stop]
        return sum(values) / len(values) if values else math.nan


def layout(envs: int, envs_per_process: int) -> tuple[int, int]:
    """Agent processes and envs in each for ``envs`` envs, at most ``envs_per_process`` in a process."""
    agents = max(1, math.ceil(envs / envs_per_process))
    return agents, envs // agents


def play_alone(engine: str, env_id: str, envs: int, seconds: float, threads: int) -> None:
    """``--play-alone``: one process of the ceiling; prints the env steps it played in ``seconds`` after a warm-up."""
    import numpy as np

    from flare2.core.env_engines import PythonEnvs, VectorEnvs, make_engine_env
    from flare2.core.env_making import make_gym_env

    if engine == "python":
        played: PythonEnvs | VectorEnvs = PythonEnvs([make_gym_env(env_id) for _ in range(envs)])
    else:
        vector_env = make_engine_env(engine, env_id, {}, envs, preprocessing=True, threads=threads)
        played = VectorEnvs(vector_env, f"the {engine} engine's")
    played.reset(list(range(envs)))
    actions = make_gym_env(env_id).action_space.n
    rng = np.random.default_rng(0)
    steps, started = 0, time.perf_counter()
    warm_until, stop_at = started + 1.0, started + 1.0 + seconds
    while (now := time.perf_counter()) < stop_at:
        played.step(rng.integers(0, actions, envs))
        if now >= warm_until:
            steps += envs
    print(json.dumps({"steps": steps, "seconds": seconds}), flush=True)


def measure_ceiling(args: argparse.Namespace, engine: str, envs: int, envs_per_process: int) -> dict[str, Any]:
    """The engine alone, in the layout of a flare2 run of ``envs`` envs: its processes play at once."""
    from flare2.core.env_engines import engine_threads  # flare2 train's share of the cores for each agent's engine

    agents, per_agent = layout(envs, envs_per_process)
    threads = engine_threads(agents)
    print(f"# ceiling of {engine}, {envs} envs ({agents} x {per_agent})", flush=True)
    command = [sys.executable, str(Path(__file__)), "--play-alone", engine, args.env, str(per_agent)]
    processes = [
        subprocess.Popen(
            [*command, str(args.ceiling_seconds), str(threads)], cwd=TOOLS.parent, stdout=subprocess.PIPE, text=True
        )
        for _ in range(agents)
    ]
    played = 0.0
    for process in processes:
        out, _ = process.communicate(timeout=args.timeout)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if process.returncode != 0 or not lines:
            return {"system": f"{engine} alone {agents}x{per_agent}", "envs": envs, "steps_per_s": math.nan}
        figures = json.loads(lines[-1])
        played += figures["steps"] / figures["seconds"]
    return {"system": f"{engine} alone {agents}x{per_agent}", "envs": envs, "engine": engine, "steps_per_s": played}


def measure(args: argparse.Namespace, envs: int, envs_per_process: int, log_dir: Path, engine: str) -> dict[str, float]:
    """One flare2 run of ``envs`` envs, at most ``envs_per_process`` in an agent process, for ``args.steps`` env
    steps with ``engine``; its rates over the rows past the warm-up."""
    agents, per_agent = layout(envs, envs_per_process)
    command = [
        sys.executable,
        "-m",
        "flare2.cli",
        "train",
        "--env",
        args.env,
        "--algo",
        args.algo,
        "--device",
        args.device,
        "--num-agents",
        str(agents),
        "--envs-per-agent",
        str(per_agent),
        "--torch-threads",
        str(args.torch_threads),
        "--max-steps",
        str(args.steps),
        "--progress-interval",
        "2",
        "--log-dir",
        str(log_dir),
        "--env-engine",
        engine,
        *args.extra,
    ]
    print(f"# flare2, {envs} envs ({agents} x {per_agent}): {' '.join(command[2:])}", flush=True)
    sampler = GPUSampler()
    started = time.monotonic()
    sampler.start()
    measured = run_measured(command, cwd=TOOLS.parent, timeout_s=args.timeout)
    sampler.stop()
    if measured.returncode != 0:
        print(measured.stderr[-2000:], file=sys.stderr)
    result: dict[str, Any] = {
        "system": f"flare2 {engine} {agents}x{per_agent}",
        "engine": engine,
        "envs": envs,
        "agents": agents,
        "peak_rss_mb": measured.peak_rss_bytes / 2**20,
    }
    # A run that failed early may have written no logs, or none past the warm-up.
    logged = (log_dir / "progress.csv").exists() and (log_dir / "cts.csv").exists()
    progress = (
        [r for r in read_rows(log_dir / "progress.csv") if int(r["env_steps"]) >= args.warmup_steps] if logged else []
    )
    if len(progress) < 2:
        return {**result, "steps_per_s": math.nan}
    cts = [row for row in read_rows(log_dir / "cts.csv") if float(row["wall_time"]) >= float(progress[0]["wall_time"])]
    if len(cts) < 2:
        return {**result, "steps_per_s": math.nan}
    first, last = progress[0], progress[-1]
    window = float(last["wall_time"]) - float(first["wall_time"])
    steps = int(last["env_steps"]) - int(first["env_steps"])
    later = cts[1:]  # each cts.csv row covers the time since the row before
    predict_s = sum(float(row["predict_s"]) for row in later)
    learn_s = sum(float(row["learn_s"]) for row in later)
    ct_window = float(later[-1]["wall_time"]) - float(cts[0]["wall_time"])
    batches = [float(row["predict_batch_mean"]) for row in later if row["predict_batch_mean"] != "nan"]
    steps_per_s = steps / window
    return {
        **result,
        "steps": steps,
        "steps_per_s": steps_per_s,
        "frames_per_s": steps * FRAME_SKIP / window,
        "predict_share": predict_s / ct_window,
        "update_share": learn_s / ct_window,
        "update_only_steps_per_s": steps_per_s / (learn_s / ct_window) if learn_s else math.nan,
        "predict_batch_rows": sum(batches) / len(batches) if batches else math.nan,
        "gpu_util_pct": sampler.mean_between(started + float(first["wall_time"]), started + float(last["wall_time"])),
    }


def measure_sb3(args: argparse.Namespace, envs: int, vec_env: str) -> dict[str, float]:
    """SB3's PPO with ``envs`` envs in ``vec_env`` over the same steps (tools/sb3_atari.py in ``args.sb3_python``)."""
    job = {
        "env_id": args.env,
        "envs": envs,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "device": args.device,
        "vec_env": vec_env,
        "torch_threads": args.torch_threads,
    }
    print(f"# SB3 PPO, {envs} envs, {vec_env}", flush=True)
    measured = run_measured(
        [args.sb3_python, str(TOOLS / "sb3_atari.py"), json.dumps(job)], cwd=TOOLS.parent, timeout_s=args.timeout
    )
    lines = [line for line in measured.stdout.splitlines() if line.startswith("{")]
    result: dict[str, float] = {
        "system": f"SB3 {vec_env}",
        "envs": envs,
        "peak_rss_mb": measured.peak_rss_bytes / 2**20,
    }
    if measured.returncode != 0 or not lines:
        print(measured.stderr[-2000:], file=sys.stderr)
        return {**result, "steps_per_s": math.nan}
    return {**result, **json.loads(lines[-1])}


COLUMNS = (
    ("env steps/s", "steps_per_s", ".0f"),
    ("update share", "update_share", ".2f"),
    ("steps/s of the updates alone", "update_only_steps_per_s", ".0f"),
    ("peak RSS MB", "peak_rss_mb", ".0f"),
    ("predict() s/s", "predict_share", ".2f"),
    ("rows per forward pass", "predict_batch_rows", ".1f"),
    ("GPU util %", "gpu_util_pct", ".0f"),
    ("of its engine's ceiling", "ratio_to_ceiling", ".2f"),
)


def _median(runs: list[dict[str, float]], key: str) -> float:
    values = [run[key] for run in runs if key in run and not math.isnan(run[key])]
    return statistics.median(values) if values else math.nan


def table(runs: list[dict]) -> str:
    """Medians over the repeats, a row per setting and system, and flare2's ratio to the better SB3 of each repeat."""
    lines = [
        "| envs | system | " + " | ".join(name for name, _, _ in COLUMNS) + " | flare2 / better SB3 |",
        "|---:|---|" + "---:|" * (len(COLUMNS) + 1),
    ]
    for envs in dict.fromkeys(run["envs"] for run in runs):
        of_envs = [run for run in runs if run["envs"] == envs]
        for system in dict.fromkeys(run["system"] for run in of_envs):
            same = [run for run in of_envs if run["system"] == system]
            cells = [format(_median(same, key), spec) for _, key, spec in COLUMNS]
            ratio = _median(same, "ratio_to_better_sb3")
            lines.append(f"| {envs} | {system} ({len(same)}) | " + " | ".join(cells) + f" | {ratio:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="ALE/Breakout-v5")
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--envs", type=int, nargs="+", default=[8], help="total envs of each setting")
    parser.add_argument(
        "--envs-per-process",
        type=int,
        nargs="+",
        default=[8],
        help="at most this many envs per agent process (a run each)",
    )
    parser.add_argument("--steps", type=int, default=30_000, help="env steps of each run")
    parser.add_argument("--warmup-steps", type=int, default=10_000, help="env steps of each run left out of the rates")
    parser.add_argument(
        "--torch-threads", type=int, default=2, help="torch threads of flare2's compute process and SB3"
    )
    parser.add_argument("--repeat", type=int, default=1, help="play every run this many times, interleaved")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take before it is killed")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--sb3-python", help="also run SB3's PPO with this Python, as the baseline of each setting")
    parser.add_argument("--sb3-vec-env", nargs="+", choices=("dummy", "subproc"), default=["dummy", "subproc"])
    parser.add_argument("--runs", type=Path, help="keep each run's log dir here (default: a temporary dir)")
    parser.add_argument(
        "--engines", nargs="+", default=["python"], help="the --env-engine of flare2's runs (a run each)"
    )
    parser.add_argument("--ceiling", action="store_true", help="measure each engine alone first (the module docstring)")
    parser.add_argument("--ceiling-seconds", type=float, default=10.0, help="seconds each engine plays alone")
    parser.add_argument("extra", nargs="*", help="more flare2 train options (after --)")
    if argv is None and sys.argv[1:2] == ["--play-alone"]:
        engine, env_id, envs, seconds, threads = sys.argv[2:7]
        play_alone(engine, env_id, int(envs), float(seconds), int(threads))
        return 0
    args = parser.parse_args(argv)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench_atari_") as scratch:
        logs = args.runs or Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        ceilings: dict[tuple[str, int, int], float] = {}
        for envs in args.envs if args.ceiling else ():
            for most in args.envs_per_process:
                for engine in args.engines:
                    alone = measure_ceiling(args, engine, envs, most)
                    ceilings[engine, envs, most] = alone["steps_per_s"]
                    runs.append({**alone, "repeat": 0})
                    print(json.dumps(runs[-1]), flush=True)
        for repeat in range(args.repeat):
            for envs in args.envs:
                ours = []
                for most in args.envs_per_process:
                    for engine in args.engines:
                        run = measure(args, envs, most, logs / f"{args.algo}_{envs}_{most}_{engine}_{repeat}", engine)
                        if (engine, envs, most) in ceilings:
                            run["ratio_to_ceiling"] = run["steps_per_s"] / ceilings[engine, envs, most]
                        ours.append(run)
                theirs = [measure_sb3(args, envs, vec_env) for vec_env in args.sb3_vec_env] if args.sb3_python else []
                for run in ours if theirs else ():
                    run["ratio_to_better_sb3"] = run["steps_per_s"] / max(other["steps_per_s"] for other in theirs)
                for run in (*ours, *theirs):
                    runs.append({**run, "repeat": repeat})
                    print(json.dumps(runs[-1]), flush=True)
    print(
        f"{args.env}, {args.algo}, {args.device}, {args.torch_threads} torch threads, {args.steps} steps a run, "
        f"rates past {args.warmup_steps}; medians of {args.repeat} repeat(s)"
    )
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
