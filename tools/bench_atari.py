"""Atari throughput: ``flare2 train`` on a game for a fixed time at several env counts, measured from the run's logs.

    python tools/bench_atari.py --device cuda --envs 64 128 256 --seconds 90
    python tools/bench_atari.py --device cpu --envs 8 --seconds 60 --algo ppo --env ALE/Pong-v5

Each setting is one run of the algorithm's Atari preset with ``--num-agents`` processes of ``--envs-per-agent``
envs (the total split into processes of at most ``--envs-per-process``), stopped with Ctrl+C after ``--seconds``.
Over the rows of progress.csv after ``--warmup`` seconds it reports env steps/s and frames/s (4 frames per step,
the preprocessing's frame skip), the compute process's seconds in predict() and learn() per wall second
(cts.csv), the mean predict batch, and the GPU's utilisation sampled by nvidia-smi over the same window (where
there is one). Prints a Markdown table; ``--json FILE`` keeps the figures.

With ``--sb3-python PYTHON`` (a Python that has stable-baselines3 and ale-py, such as the one
``tools/bench_peers.py --install`` makes), each setting is run by SB3's PPO too (tools/sb3_atari.py, PPO's
Atari settings only), right after flare2's, and the table gives SB3's env steps/s and flare2's ratio to it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

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


def measure(args: argparse.Namespace, envs: int, log_dir: Path) -> dict[str, float]:
    """One run of ``envs`` envs for ``args.seconds``; its rates over the rows after the warm-up."""
    agents = max(1, math.ceil(envs / args.envs_per_process))
    per_agent = envs // agents
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
        "--max-steps",
        str(10**10),
        "--progress-interval",
        "2",
        "--log-dir",
        str(log_dir),
        *args.extra,
    ]
    print(f"# {envs} envs ({agents} x {per_agent}): {' '.join(command[2:])}", flush=True)
    sampler = GPUSampler()
    started = time.monotonic()
    with open(log_dir.with_suffix(".log"), "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        sampler.start()
        try:
            process.wait(timeout=args.seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    sampler.stop()
    progress = [row for row in read_rows(log_dir / "progress.csv") if float(row["wall_time"]) >= args.warmup]
    cts = [row for row in read_rows(log_dir / "cts.csv") if float(row["wall_time"]) >= args.warmup]
    if len(progress) < 2:
        return {"envs": envs, "agents": agents, "steps_per_s": math.nan}
    first, last = progress[0], progress[-1]
    window = float(last["wall_time"]) - float(first["wall_time"])
    steps = int(last["env_steps"]) - int(first["env_steps"])
    later = cts[1:]  # each cts.csv row covers the time since the row before
    predict_s = sum(float(row["predict_s"]) for row in later)
    learn_s = sum(float(row["learn_s"]) for row in later)
    ct_window = float(later[-1]["wall_time"]) - float(cts[0]["wall_time"]) if later else math.nan
    batches = [float(row["predict_batch_mean"]) for row in later if row["predict_batch_mean"] != "nan"]
    return {
        "envs": envs,
        "agents": agents,
        "steps_per_s": steps / window,
        "frames_per_s": steps * FRAME_SKIP / window,
        "predict_share": predict_s / ct_window,
        "learn_share": learn_s / ct_window,
        "predict_batch_rows": sum(batches) / len(batches) if batches else math.nan,
        "gpu_util_pct": sampler.mean_between(started + float(first["wall_time"]), started + float(last["wall_time"])),
        "return_mean": float(last["return_mean"]),
    }


def measure_sb3(args: argparse.Namespace, envs: int) -> float:
    """SB3's PPO env steps/s with ``envs`` envs over the same time (tools/sb3_atari.py in ``args.sb3_python``)."""
    job = {"env_id": args.env, "envs": envs, "seconds": args.seconds, "warmup": args.warmup, "device": args.device}
    script = Path(__file__).with_name("sb3_atari.py")
    print(f"# SB3 PPO, {envs} envs", flush=True)
    done = subprocess.run(
        [args.sb3_python, str(script), json.dumps(job)], capture_output=True, text=True, timeout=args.seconds + 120
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        print(done.stderr[-2000:], file=sys.stderr)
        return math.nan
    return float(json.loads(lines[-1])["steps_per_s"])


def table(results: list[dict[str, float]]) -> str:
    lines = [
        "| envs | agent processes | env steps/s | frames/s | predict() s/s | learn() s/s | rows per forward pass "
        "| GPU util % | SB3 env steps/s | flare2 / SB3 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        sb3 = r.get("sb3_steps_per_s", math.nan)
        lines.append(
            f"| {r['envs']} | {r['agents']} | {r['steps_per_s']:.0f} | {r.get('frames_per_s', math.nan):.0f} "
            f"| {r.get('predict_share', math.nan):.2f} | {r.get('learn_share', math.nan):.2f} "
            f"| {r.get('predict_batch_rows', math.nan):.1f} | {r.get('gpu_util_pct', math.nan):.0f} "
            f"| {sb3:.0f} | {r['steps_per_s'] / sb3:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="ALE/Breakout-v5")
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--envs", type=int, nargs="+", default=[64, 128, 256], help="total envs of each run")
    parser.add_argument("--envs-per-process", type=int, default=8, help="at most this many envs per agent process")
    parser.add_argument("--seconds", type=float, default=90.0, help="wall time of each run")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of each run left out of the rates")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--sb3-python", help="also run SB3's PPO with this Python, as the baseline of each setting")
    parser.add_argument("--runs", type=Path, help="keep each run's log dir and log here (default: a temporary dir)")
    parser.add_argument("extra", nargs="*", help="more flare2 train options (after --)")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_atari_") as scratch:
        runs = args.runs or Path(scratch)
        runs.mkdir(parents=True, exist_ok=True)
        for envs in args.envs:
            results.append(measure(args, envs, runs / f"{args.algo}_{envs}"))
            if args.sb3_python:
                results[-1]["sb3_steps_per_s"] = measure_sb3(args, envs)
            print(json.dumps(results[-1]), flush=True)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
