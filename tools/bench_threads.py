"""Torch's threads beside other busy processes: a run's wall time under each OpenMP wait setting.

    python tools/bench_threads.py [--steps 1500] [--repeat 2]

Torch's CPU kernels run on OpenMP threads (libgomp, in the Linux wheels), which by libgomp's default spin up to
300,000 times after each parallel region before they sleep: with a core to each thread that saves a wake-up, and
beside other busy processes it holds a core that they need. Each setting of ``SETTINGS`` (``GOMP_SPINCOUNT``,
``OMP_WAIT_POLICY``, ``--torch-threads``) runs SAC's Pendulum preset (2 torch threads) in one process
(``--serial``) for ``--steps`` env steps, first on the machine as it is, then beside one busy process per core (the
load of other runs on the same cores), and the table gives each median wall time and its ratio to libgomp's default
under the same load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proctree import MeasureTimeout, run_measured  # noqa: E402

SETTINGS: dict[str, tuple[dict[str, str], list[str]]] = {
    "libgomp's default": ({}, []),
    "GOMP_SPINCOUNT=10000": ({"GOMP_SPINCOUNT": "10000"}, []),
    "GOMP_SPINCOUNT=1000": ({"GOMP_SPINCOUNT": "1000"}, []),
    "OMP_WAIT_POLICY=PASSIVE": ({"OMP_WAIT_POLICY": "PASSIVE"}, []),
    "--torch-threads 1": ({}, ["--torch-threads", "1"]),
}
BASELINE = next(iter(SETTINGS))


@contextmanager
def busy_cores(count: int) -> Iterator[list[subprocess.Popen]]:
    """``count`` processes that each keep a core busy, for the duration of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def timed_run(extra_env: dict[str, str], extra_args: list[str], steps: int, scratch: str, timeout_s: float) -> float:
    """Seconds of one serial SAC run under ``extra_env`` (over an environment without either OpenMP setting)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    command = [sys.executable, "-m", "flare2.cli", "train", "--env", "Pendulum-v1", "--algo", "sac"]
    command += ["--max-steps", str(steps), "--serial", "--log-dir", tempfile.mkdtemp(dir=scratch), *extra_args]
    try:
        measured = run_measured(command, env={**env, **extra_env}, timeout_s=timeout_s)
    except MeasureTimeout as timeout:
        raise SystemExit(f"give a slower machine a larger --timeout or fewer --steps: {timeout}") from None
    if measured.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited with {measured.returncode}:\n{measured.stderr[-2000:]}")
    return measured.wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500, help="env steps of each run")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each setting under each load (the median)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run may take before it is killed")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"SAC, Pendulum-v1, --serial, 2 torch threads, {args.steps} env steps a run, {cores} cores")
    print("| load | setting | wall s | of libgomp's default |")
    print("|---|---|---:|---:|")
    with tempfile.TemporaryDirectory() as scratch:
        for load, spinners in (("none", 0), (f"{cores} busy processes", cores)):
            with busy_cores(spinners):
                seconds = {
                    name: statistics.median(
                        timed_run(*setting, args.steps, scratch, args.timeout) for _ in range(args.repeat)
                    )
                    for name, setting in SETTINGS.items()
                }
            for name, value in seconds.items():
                print(f"| {load} | {name} | {value:.1f} | {value / seconds[BASELINE]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
