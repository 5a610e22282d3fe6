"""A chaos soak: a ``flare2 train`` run whose own processes are killed at random while it learns.

    python tools/chaos.py --max-steps 300000 --fault-every 4 [--seed 0] [--learners 2] [--no-undisturbed]

One run on this machine (CartPole-v1 PPO, 4 agent processes, ``--learners`` learner processes, a checkpoint every
``--checkpoint-every``) is given faults at random intervals (exponential, ``--fault-every`` seconds on average,
seeded by ``--seed``), each of a kind drawn in turn from a shuffled deck so that every kind comes as often:

- ``agent``: kill -9 of one agent process (the manager restarts it);
- ``compute``: kill -9 of the compute process (the manager starts a new one from the last checkpoint);
- ``learner``: kill -9 of one learner process (the compute process is restarted with a new group).

Then the same run, same seed and budget, without faults (``--no-undisturbed`` leaves it out). Reported as a
Markdown table: the faults injected by kind, the restarts the run counted (agents, compute process), its exit
code, env steps and final mean return against the undisturbed run's, the peak RSS of its process tree and that of
its last third against its middle third (a leak grows it), and the processes of its tree left running after it
exited (killed then, and named). Exits 1 when the run failed or left a process behind.

Two machines, ``flare2 attach`` and links taken down are not part of this soak yet.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from proctree import rss_bytes, tree_pids  # noqa: E402 - a sibling module of this tool

KINDS = ("agent", "compute", "learner")
_SAMPLE_S = 1.0


def train_command(args: argparse.Namespace, log_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "flare2.cli", "train", "--env", "CartPole-v1", "--algo", "ppo"]
    command += ["--num-agents", "4", "--envs-per-agent", "2", "--max-steps", str(args.max_steps)]
    command += ["--seed", str(args.seed), "--log-dir", str(log_dir), "--checkpoint-every", args.checkpoint_every]
    command += ["--max-restarts", "100000", "--progress-interval", "2"]
    if args.learners > 1:
        command += ["--learners", str(args.learners), "--learner", "process"]
    return command


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def victims(manager: int) -> dict[str, list[int]]:
    """The run's processes a fault may kill, by kind."""
    children = _children(manager)
    compute = [pid for pid in children if b"spawn_main" in _cmdline(pid)]
    agents = [pid for pid in children if b"agent_process" in _cmdline(pid)]
    learners = [pid for pid in (_children(compute[0]) if compute else []) if b"spawn_main" in _cmdline(pid)]
    return {"agent": agents, "compute": compute, "learner": learners}


def soak(args: argparse.Namespace, log_dir: Path, *, faults: bool) -> dict:
    """Run ``flare2 train`` to its budget, killing its processes at random when ``faults``; what it did."""
    rng = random.Random(args.seed)
    kinds = [kind for kind in KINDS if kind != "learner" or args.learners > 1]
    deck: list[str] = []
    injected: Counter[str] = Counter()
    samples: list[tuple[float, int]] = []
    started = time.monotonic()
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir.parent / f"{log_dir.name}.log").open("wb") as log:
        # A session of its own: what outlives the run is found by it (``proctree.tree_pids``), never a stranger.
        process = subprocess.Popen(
            train_command(args, log_dir), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    next_fault = started + rng.expovariate(1 / args.fault_every)
    try:
        while process.poll() is None:
            time.sleep(_SAMPLE_S / 4)
            now = time.monotonic()
            pids = tree_pids(process.pid)
            if not samples or now - started - samples[-1][0] >= _SAMPLE_S:
                samples.append((now - started, sum(rss_bytes(pid) for pid in pids)))
            if faults and now >= next_fault:
                next_fault = now + rng.expovariate(1 / args.fault_every)
                if not deck:
                    deck = rng.sample(kinds, len(kinds))
                kind = deck.pop()
                found = victims(process.pid)[kind]
                if found:
                    os.kill(rng.choice(found), signal.SIGKILL)
                    injected[kind] += 1
            if now - started > args.timeout:
                process.kill()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    time.sleep(1.0)  # what exits with the run has a moment to go
    left = sorted(tree_pids(process.pid) - {process.pid})
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    progress = log_dir / "progress.csv"
    rows = list(csv.DictReader(progress.open())) if progress.is_file() else []
    return {
        "exit": process.returncode,
        "seconds": time.monotonic() - started,
        "faults": injected,
        "last": rows[-1] if rows else {},
        "samples": samples,
        "left": left,
    }


def _rss_drift(samples: list[tuple[float, int]]) -> tuple[float, float]:
    """Peak RSS (MB) of the run, and the mean of its last third over the mean of its middle third."""
    values = [rss for _, rss in samples] or [0]
    third = max(1, len(values) // 3)
    middle, last = values[third : 2 * third] or values, values[-third:]
    ratio = (sum(last) / len(last)) / max(1.0, sum(middle) / len(middle))
    return max(values) / 1e6, ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=300_000)
    parser.add_argument("--fault-every", type=float, default=4.0, help="mean seconds between two faults")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--checkpoint-every", default="5s")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds a run may take before it is killed")
    parser.add_argument("--undisturbed", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--log-dir", type=Path, help="where the runs write (default: a temporary folder)")
    args = parser.parse_args()
    root = args.log_dir or Path(tempfile.mkdtemp(prefix="flare2-chaos-"))
    chaos = soak(args, root / "chaos", faults=True)
    calm = soak(args, root / "undisturbed", faults=False) if args.undisturbed else None
    peak, drift = _rss_drift(chaos["samples"])
    last = chaos["last"]
    faults = chaos["faults"]
    print(f"| chaos soak, seed {args.seed} | |\n|---|---|")
    print(f"| faults injected | {sum(faults.values())} ({', '.join(f'{k} {faults[k]}' for k in KINDS)}) |")
    print(f"| restarts counted | agents {last.get('restarts')}, compute process {last.get('compute_restarts')} |")
    print(f"| exit code, minutes | {chaos['exit']}, {chaos['seconds'] / 60:.1f} |")
    print(f"| env steps | {last.get('env_steps')} |")
    calm_return = calm["last"].get("return_mean") if calm else "not run"
    print(f"| final return_mean (undisturbed) | {last.get('return_mean')} ({calm_return}) |")
    print(f"| peak RSS of the tree, last third / middle third | {peak:.0f} MB, {drift:.3f} |")
    print(f"| processes left behind | {len(chaos['left'])} {chaos['left'] or ''} |")
    print(f"logs: {root}")
    return 0 if chaos["exit"] == 0 and not chaos["left"] and (calm is None or calm["exit"] == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
