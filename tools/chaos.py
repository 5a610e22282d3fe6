"""A chaos soak: a ``flare2 train`` run whose processes are killed, and whose links are cut, at random while it learns.

    python tools/chaos.py --max-steps 300000 --fault-every 4 [--faults N] [--seed 0] [--learners 2] [--hosts]
        [--no-undisturbed | --beside]

One run (CartPole-v1 PPO, 4 agent processes, ``--learners`` learner processes, a checkpoint every
``--checkpoint-every``) is given faults at random intervals (exponential, ``--fault-every`` seconds on average,
seeded by ``--seed``; with ``--faults N``, the first N only, and the run then goes on to its budget), each of a
kind drawn in turn from a shuffled deck so that every kind comes as often (a kind with nothing to hit at that
moment, such as a link already down, gives its turn to the next and waits for a later one; the time and kind of
each fault go to ``faults.csv`` beside the run's logs):

- ``agent``: kill -9 of one agent process (its supervisor, the manager or ``flare2 attach``, starts another);
- ``compute``: kill -9 of the compute process (the manager starts a new one from the last checkpoint);
- ``learner``: kill -9 of one learner process (the compute process is restarted with a new group).

With ``--hosts`` (root: hosts made of network namespaces, ``tools/hosts.py``) the run is on host A with 2 agents
and ``--learners 2 --remote-learners 1``; host B runs ``flare2 attach`` (2 agents) and ``flare2 learn`` (the
remote learner), host C ``flare2 attach`` (2 agents). Two more kinds of fault come then:

- ``attach``: kill -9 of one ``flare2 attach`` (its agents go with it; the soak starts it again, as a node's
  supervisor would, and its new agents join);
- ``link``: B's or C's link down for 5-40 s (the agents there are dropped and rejoin; B's learner is left behind
  and taken back).

Then the same run, same seed and budget, without faults (``--no-undisturbed`` leaves it out; ``--beside`` runs it at the
same time, on hosts of its own). Reported as a
Markdown table: the faults injected by kind, the restarts the run counted (agents, compute process) and the remote
agents that rejoined, its exit code, env steps played and how many were never learned from (``env_steps`` less
``learned_rows``: the unsent tails of fragments, what was learned after the last checkpoint before a compute restart,
what died with an agent), its final mean return against the undisturbed run's, the peak RSS of all its processes
and that of its last 10 minutes against the 10 before (last third against middle third in a shorter run: a leak grows
it), and the processes left running after it exited (killed then, and named). Exits 1 when the run failed or left a
process behind.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

from hosts import Hosts, three_hosts  # noqa: E402 - sibling modules of this tool
from proctree import rss_bytes, tree_pids  # noqa: E402

KINDS = ("agent", "compute", "learner", "attach", "link")
_SAMPLE_S = 1.0
_PORT = 47390
_OUTAGE_S = (5.0, 40.0)
_DECKS_AHEAD = 3
"""How many decks of kinds may wait dealt while the kinds at their head have nothing to hit."""
_REJOIN_FOR_S = 45.0
"""``--rejoin-for`` of the attach and learn commands: longer than any outage, so that only the end of the run ends
them, and a run that ended meanwhile lets them go within a minute."""
_GROUP_TIMEOUT_S = 20
"""The run's ``--startup-timeout``: a learner whose link is down is taken for lost once the group waits this long."""
_HELPERS_END_S = _REJOIN_FOR_S + 3 * _GROUP_TIMEOUT_S + 15
"""How long helpers may take to end after the run: a learner joining a group whose first learner is gone waits out
torch's store (up to twice the group's timeout), then its flare2 learn waits out ``--rejoin-for``."""
_FLARE2 = [sys.executable, "-m", "flare2.cli"]


def train_command(args: argparse.Namespace, log_dir: Path, hosts: Hosts | None) -> list[str]:
    agents = "2" if hosts else "4"
    command = [*_FLARE2, "train", "--env", "CartPole-v1", "--algo", "ppo"]
    command += ["--num-agents", agents, "--envs-per-agent", "2", "--max-steps", str(args.max_steps)]
    command += ["--seed", str(args.seed), "--log-dir", str(log_dir), "--checkpoint-every", args.checkpoint_every]
    command += ["--max-restarts", "100000", "--progress-interval", "2"]
    if args.learners > 1:
        command += ["--learners", str(args.learners), "--learner", "process"]
    if hosts is None:
        return command
    command += ["--remote-learners", "1", "--startup-timeout", str(_GROUP_TIMEOUT_S), "--heartbeat-timeout", "5"]
    return hosts.run_in(hosts.a, *command, "--bind", hosts.address[hosts.a], "--port", str(_PORT), "--keys", args.keys)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


class Cluster:
    """The soak's processes: the run, and with hosts the ``flare2 attach`` of B and C and the ``flare2 learn`` of B,
    each in a session of its own (what outlives them is found by it, ``proctree.tree_pids``, never a stranger)."""

    def __init__(self, args: argparse.Namespace, log_dir: Path, hosts: Hosts | None) -> None:
        self.args, self.log_dir, self.hosts = args, log_dir, hosts
        self.logs = log_dir.parent / f"{log_dir.name}-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.run = self._start("train", train_command(args, log_dir, hosts))
        self.helpers: dict[str, subprocess.Popen] = {}
        self.helper_starts: Counter[str] = Counter()
        self.down_until: dict[str, float] = {}
        """Hosts whose link is down, and when it comes up."""
        if hosts is not None:
            endpoint = f"tcp://{hosts.address[hosts.a]}:{_PORT}"
            rejoin = ["--keys", args.keys, "--rejoin-for", str(_REJOIN_FOR_S)]
            self._commands = {
                "attach-b": hosts.run_in(hosts.b, *_FLARE2, "attach", endpoint, "--num-agents", "2", *rejoin),
                "attach-c": hosts.run_in(hosts.c, *_FLARE2, "attach", endpoint, "--num-agents", "2", *rejoin),
                "learn-b": hosts.run_in(hosts.b, *_FLARE2, "learn", endpoint, *rejoin),
            }
            for name in self._commands:
                self.start_helper(name)

    def _start(self, name: str, command: list[str]) -> subprocess.Popen:
        with (self.logs / f"{name}.log").open("ab") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start_helper(self, name: str) -> None:
        self.helpers[name] = self._start(name, self._commands[name])
        self.helper_starts[name] += 1

    def restart_ended_helpers(self) -> None:
        """An attach or learn that ended while the run goes on (killed, or it gave up on an unreachable run) is
        started again; one the run stopped (exit 0) is not."""
        for name, process in self.helpers.items():
            if process.poll() not in (None, 0):
                self.start_helper(name)

    def roots(self) -> list[int]:
        return [self.run.pid, *(process.pid for process in self.helpers.values())]

    def victims(self) -> dict[str, list[Any]]:
        """What a fault of each kind may hit."""
        children = _children(self.run.pid)
        # By the names flare2 gives them: a spare compute process, waiting, is no part of the run yet.
        compute = [pid for pid in children if _name(pid) == "flare2-compute"]
        agents = [pid for pid in children if b"agent_process" in _cmdline(pid)]
        # Every process the compute process spawned is one of its learners, named so only once its imports are done:
        # on a busy machine that takes seconds after each restart, and a learner killed meanwhile (as its group
        # forms) is a lost learner too. Its resource tracker is not spawned this way.
        learners = [pid for pid in (_children(compute[0]) if compute else []) if b"spawn_main" in _cmdline(pid)]
        attaches = [process.pid for name, process in self.helpers.items() if name.startswith("attach")]
        for pid in attaches:
            agents += [child for child in _children(pid) if b"agent_process" in _cmdline(child)]
        if "learn-b" in self.helpers:
            learners += [pid for pid in _children(self.helpers["learn-b"].pid) if b"spawn_main" in _cmdline(pid)]
        hosts = self.hosts
        links = [host for host in (hosts.b, hosts.c) if host not in self.down_until] if hosts else []
        return {"agent": agents, "compute": compute, "learner": learners, "attach": attaches, "link": links}

    def hit(self, kind: str, victim: Any, rng: random.Random) -> None:
        if kind != "link":
            os.kill(victim, signal.SIGKILL)
            return
        assert self.hosts is not None
        self.hosts.cut_link(victim, up=False)
        self.down_until[victim] = time.monotonic() + rng.uniform(*_OUTAGE_S)

    def restore_links(self, now: float) -> None:
        for host, until in list(self.down_until.items()):
            if now >= until:
                assert self.hosts is not None
                self.hosts.cut_link(host, up=True)
                del self.down_until[host]

    def finish(self) -> tuple[list[int], dict[str, int | None]]:
        """After the run ended: its helpers get ``_HELPERS_END_S`` to end on their own (the run's stop, or their
        rejoin limit); what is left then is killed and returned, with each helper's exit code."""
        self.restore_links(float("inf"))
        deadline = time.monotonic() + _HELPERS_END_S
        while any(process.poll() is None for process in self.helpers.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.0)  # what exits with the run has a moment to go
        left = sorted(pid for root in self.roots() for pid in tree_pids(root) if pid != self.run.pid)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left, {name: process.poll() for name, process in self.helpers.items()}


def soak(args: argparse.Namespace, log_dir: Path, hosts: Hosts | None, *, faults: bool) -> dict:
    """Run ``flare2 train`` to its budget, killing its processes at random when ``faults``; what it did."""
    rng = random.Random(args.seed)
    kinds = [kind for kind in KINDS if (kind != "learner" or args.learners > 1) and (hosts or kind in KINDS[:3])]
    deck: list[str] = []
    injected: Counter[str] = Counter()
    samples: list[tuple[float, int]] = []
    started = time.monotonic()
    log_dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(args, log_dir, hosts)
    next_fault = started + rng.expovariate(1 / args.fault_every)
    try:
        while cluster.run.poll() is None:
            time.sleep(_SAMPLE_S / 4)
            now = time.monotonic()
            if not samples or now - started - samples[-1][0] >= _SAMPLE_S:
                pids = {pid for root in cluster.roots() for pid in tree_pids(root)}
                samples.append((now - started, sum(rss_bytes(pid) for pid in pids)))
            cluster.restore_links(now)
            cluster.restart_ended_helpers()
            if faults and now >= next_fault and sum(injected.values()) < args.faults:
                next_fault = now + rng.expovariate(1 / args.fault_every)
                victims = cluster.victims()
                # The next kind of the deck that has a victim now. One with none (a process restarting, both links
                # already down) keeps its place for a later fault, and the next deck is dealt behind it: the faults
                # keep their rate, and every kind still comes as often over the run.
                while len(deck) < _DECKS_AHEAD * len(kinds) and not any(victims[kind] for kind in deck):
                    deck = rng.sample(kinds, len(kinds)) + deck
                if ready := [index for index in range(len(deck) - 1, -1, -1) if victims[deck[index]]]:
                    kind = deck.pop(ready[0])
                    cluster.hit(kind, rng.choice(victims[kind]), rng)
                    injected[kind] += 1
                    with (cluster.logs / "faults.csv").open("a") as log:
                        log.write(f"{now - started:.2f},{kind}\n")
                else:
                    next_fault = now + _SAMPLE_S  # nothing of any kind to hit now: soon again
            if now - started > args.timeout:
                cluster.run.kill()
    finally:
        if cluster.run.poll() is None:
            cluster.run.kill()
        cluster.run.wait()
    left, helpers = cluster.finish()
    progress = log_dir / "progress.csv"
    rows = list(csv.DictReader(progress.open())) if progress.is_file() else []
    return {
        "exit": cluster.run.returncode,
        "seconds": time.monotonic() - started,
        "faults": injected,
        "kinds": kinds,
        "last": rows[-1] if rows else {},
        "samples": samples,
        "left": left,
        "helpers": helpers,
        "helper_starts": cluster.helper_starts,
    }


def _rss_drift(samples: list[tuple[float, int]]) -> tuple[float, float, str]:
    """Peak RSS (MB) of the run, the mean of its last 10 minutes over the 10 before (of its last third over its
    middle third when it is shorter than 20 minutes), and which of the two that is."""
    values = [rss for _, rss in samples] or [0]
    window = int(600 / _SAMPLE_S)
    if len(values) >= 2 * window:
        before, last, what = values[-2 * window : -window], values[-window:], "last 10 min / 10 min before"
    else:
        third = max(1, len(values) // 3)
        before, last, what = values[third : 2 * third] or values, values[-third:], "last third / middle third"
    ratio = (sum(last) / len(last)) / max(1.0, sum(before) / len(before))
    return max(values) / 1e6, ratio, what


def report(args: argparse.Namespace, chaos: dict, calm: dict | None, root: Path) -> None:
    peak, drift, what = _rss_drift(chaos["samples"])
    last, faults = chaos["last"], chaos["faults"]
    where = "hosts A, B, C" if args.hosts else "this machine"
    print(f"| chaos soak, seed {args.seed}, {where} | |\n|---|---|")
    print(f"| faults injected | {sum(faults.values())} ({', '.join(f'{k} {faults[k]}' for k in chaos['kinds'])}) |")
    restarts = f"agents {last.get('restarts')}, compute process {last.get('compute_restarts')}"
    if args.hosts:
        restarts += f", remote agents rejoined {last.get('remote_rejoins')}, dropped {last.get('remote_dropped')}"
        restarts += ", helpers started " + ", ".join(f"{k} {v}" for k, v in sorted(chaos["helper_starts"].items()))
    print(f"| restarts counted | {restarts} |")
    print(f"| exit code, minutes | {chaos['exit']}, {chaos['seconds'] / 60:.1f} |")
    steps, learned = int(last.get("env_steps") or 0), int(last.get("learned_rows") or 0)
    print(
        f"| env steps, of them never learned from | {steps}, {steps - learned} ({(steps - learned) / max(1, steps):.1%}) |"
    )
    calm_return = calm["last"].get("return_mean") if calm else "not run"
    print(f"| final return_mean (undisturbed) | {last.get('return_mean')} ({calm_return}) |")
    print(f"| peak RSS of all its processes, {what} | {peak:.0f} MB, {drift:.3f} |")
    print(f"| processes left behind | {len(chaos['left'])} {chaos['left'] or ''} |")
    if chaos["helpers"]:
        print(f"| attach and learn exit codes | {', '.join(f'{k} {v}' for k, v in sorted(chaos['helpers'].items()))} |")
    print(f"logs: {root}")


@contextlib.contextmanager
def _maybe_hosts(args: argparse.Namespace, root: Path, subnet: int) -> Iterator[Hosts | None]:
    if not args.hosts:
        yield None
        return
    args.keys = str(root / "keys")
    if not Path(args.keys).exists():
        subprocess.run([*_FLARE2, "keys", args.keys], check=True, capture_output=True, timeout=60)
    with three_hosts(subnet=subnet) as hosts:
        yield hosts


def _both_at_once(args: argparse.Namespace, root: Path, hosts: Hosts | None) -> tuple[dict, dict]:
    """The soak and the undisturbed run at the same time (``--beside``), the undisturbed one on hosts of its own."""
    with _maybe_hosts(args, root, subnet=98) as calm_hosts, ThreadPoolExecutor(1) as pool:
        calm = pool.submit(soak, args, root / "undisturbed", calm_hosts, faults=False)
        return soak(args, root / "chaos", hosts, faults=True), calm.result()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=300_000)
    parser.add_argument("--fault-every", type=float, default=4.0, help="mean seconds between two faults")
    parser.add_argument(
        "--faults", type=int, default=sys.maxsize, help="inject this many faults, then let the run go on to its budget"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--checkpoint-every", default="5s")
    parser.add_argument("--hosts", action="store_true", help="hosts A, B and C of network namespaces (root)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds a run may take before it is killed")
    parser.add_argument("--undisturbed", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--beside",
        action="store_true",
        help="run the undisturbed run at the same time as the soak, not after it: half the wall time, each on half "
        "the cores",
    )
    parser.add_argument("--log-dir", type=Path, help="where the runs write (default: a temporary folder)")
    args = parser.parse_args()
    if args.hosts and args.learners != 2:
        parser.error("--hosts runs one learner here and one on host B: leave --learners at 2")
    root = args.log_dir or Path(tempfile.mkdtemp(prefix="flare2-chaos-"))
    calm: dict | None
    with _maybe_hosts(args, root, subnet=97) as hosts:
        if args.beside and args.undisturbed:
            chaos, calm = _both_at_once(args, root, hosts)
        else:
            chaos = soak(args, root / "chaos", hosts, faults=True)
            calm = soak(args, root / "undisturbed", hosts, faults=False) if args.undisturbed else None
    report(args, chaos, calm, root)
    failed = chaos["exit"] != 0 or chaos["left"] or (calm is not None and calm["exit"] != 0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
