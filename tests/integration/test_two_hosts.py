"""Hosts made of network namespaces on one bridge (needs root; skipped otherwise).

Host A runs a manager with 2 local agents bound to its bridge address with
CURVE keys; hosts B and C each attach 2 agents with `flare2 attach`, which
takes the run's recipe from the manager. Then both links go down (B's at its
own end, C's at A's end: one side sees no route, the other packets lost) for
longer than the heartbeat timeout: the manager drops the remote agents and
trains on; when the links come back, the attached agents rejoin with no
command typed on B or C.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from netns import Hosts, needs_root, three_hosts
from runs import CARTPOLE, RunProcess, read_csv
from test_remote_learners import run_on_host_a_with_keys

from flare2.runtime import exit_codes

PORT = 47250

pytestmark = needs_root


@pytest.fixture
def hosts():
    with three_hosts(subnet=7) as made:
        yield made


def attach_from(hosts: Hosts, host: str, keys: Path) -> RunProcess:
    endpoint = f"tcp://{hosts.address[hosts.a]}:{PORT}"
    return RunProcess.command(
        hosts.run_in(host, sys.executable, "-m", "flare2.cli", "attach", endpoint, "--keys", str(keys))
        + ["--num-agents", "2"]
    )


@dataclass(frozen=True)
class Outage:
    heartbeat_s: int
    seconds: int
    local_agents: int
    budget: int | None
    """The run's env steps; None: it runs until the test stops it. Without local agents only the remote ones can
    reach it, so it is reached after they are back."""


@pytest.mark.parametrize(
    "outage",
    [
        pytest.param(Outage(heartbeat_s=2, seconds=6, local_agents=2, budget=None), id="6s"),
        pytest.param(
            Outage(heartbeat_s=10, seconds=30, local_agents=0, budget=150_000),
            marks=pytest.mark.slow,
            id="30s-default-heartbeat-to-the-budget",
        ),
    ],
)
def test_agents_attached_from_two_hosts_ride_out_a_network_outage(tmp_path, hosts, outage):
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "flare2.cli", "keys", str(keys)], check=True, capture_output=True, timeout=60)
    log_dir = tmp_path / "run"
    local = outage.local_agents
    manager = RunProcess(
        CARTPOLE,
        "--num-agents",
        str(local),
        "--envs-per-agent",
        "2",
        "--max-steps",
        str(outage.budget or 100_000_000),
        "--progress-interval",
        "0.5",
        "--device",
        "cpu",
        "--bind",
        hosts.address[hosts.a],
        "--port",
        str(PORT),
        "--keys",
        str(keys),
        "--heartbeat-timeout",
        str(outage.heartbeat_s),
        log_dir=log_dir,
        prefix=tuple(hosts.run_in(hosts.a)),
    )
    attached = []
    try:
        manager.wait_for_line(r"compute process is up", timeout_s=120)
        # No agent options: the run's recipe (its agent, CartPole with 2 envs each) comes from the manager.
        attached = [attach_from(hosts, hosts.b, keys), attach_from(hosts, hosts.c, keys)]
        for _ in range(4):
            manager.wait_for_line(r"remote agent r-\S+ \(pid \d+ on \S+\) attached", timeout_s=60)
        manager.wait_for_line(rf"agents {local} local, 4 remote, {2 * local + 8} envs", timeout_s=60)
        # Their first episodes reach the progress rows a few rows later.
        deadline = time.monotonic() + 60
        while (joined := read_csv(log_dir / "progress.csv")[-1])["remote_episodes"] == 0:
            assert time.monotonic() < deadline, f"no remote episode counted within 60 s:\n{manager.text[-3000:]}"
            manager.wait_for_line(r"flare2.progress INFO", timeout_s=10)
        assert joined["remote_env_steps"] > 0

        hosts.cut(up=False)
        cut_at = time.monotonic()
        for _ in range(4):
            manager.wait_for_line(rf"remote agent r-\S+ silent for {outage.heartbeat_s}s \(link lost\?\); dropped", 60)
        before = read_csv(log_dir / "progress.csv")[-1]["env_steps"]
        # The outage lasts its length; meanwhile the run goes on (each progress row says so).
        while time.monotonic() - cut_at < outage.seconds:
            manager.wait_for_line(rf"agents {local} local, 0 remote", timeout_s=10)
        if local:
            assert read_csv(log_dir / "progress.csv")[-1]["env_steps"] > before  # local training goes on
        assert all(run.process.poll() is None for run in attached), "attach gave up during the outage"

        hosts.cut(up=True)
        back_at = time.monotonic()
        for _ in range(4):
            manager.wait_for_line(r"remote agent r-\S+ \(pid \d+ on \S+\) rejoined", timeout_s=60)
        manager.wait_for_line(rf"agents {local} local, 4 remote", timeout_s=60)
        print(f"all 4 remote agents back {time.monotonic() - back_at:.1f}s after the links came up")
        manager.wait_for_line(rf"agents {local} local, 4 remote", timeout_s=60)
        rejoined = read_csv(log_dir / "progress.csv")[-1]
        assert rejoined["remote_dropped"] == 4 and rejoined["remote_rejoins"] == 4
        assert rejoined["restarts"] == 0 and rejoined["remote_env_steps"] > joined["remote_env_steps"]
        # What the agents sent before their links broke arrives late; it is taken for what it is, not dropped.
        assert rejoined["dropped_messages"] == 0, manager.text[-3000:]

        if outage.budget is None:
            manager.process.send_signal(2)
            assert manager.wait(timeout_s=30) == exit_codes.SIGINT
        else:
            assert manager.wait(timeout_s=600) == exit_codes.OK
            assert read_csv(log_dir / "progress.csv")[-1]["env_steps"] >= outage.budget
        # The manager's stop reached the attached agents: they said bye and attach ended on its own.
        for run in attached:
            assert run.wait(timeout_s=30) == exit_codes.OK
        assert "detached" in manager.text
    finally:
        for run in [manager, *attached]:
            run.stop()


def learn_on_host_b(hosts: Hosts, keys: Path) -> RunProcess:
    endpoint = f"tcp://{hosts.address[hosts.a]}:{PORT}"
    return RunProcess.command(
        hosts.run_in(hosts.b, sys.executable, "-m", "flare2.cli", "learn", endpoint, "--keys", str(keys))
    )


@pytest.mark.slow  # the same code path as tests/integration/test_remote_learners.py, which runs over loopback
def test_a_learner_on_another_host_joins_the_runs_learners_over_the_link(tmp_path, hosts):
    manager, keys = run_on_host_a_with_keys(hosts, tmp_path, PORT)
    address = hosts.address[hosts.a]
    learner = None
    try:
        learner = learn_on_host_b(hosts, keys)
        # The learners meet at the run's address, each on the interface that reaches it (not the host name's).
        learner.wait_for_line(rf"its learners meet at tcp://{re.escape(address)}:\d+", timeout_s=60)
        learner.wait_for_line(r"learner 1 joined the run's learners", timeout_s=120)
        assert manager.wait(timeout_s=180) == exit_codes.OK
        assert learner.wait(timeout_s=30) == exit_codes.OK, learner.text
        assert read_csv(tmp_path / "run" / "progress.csv")[-1]["learn_steps"] > 0
    finally:
        for run in [manager, learner]:
            if run is not None:
                run.stop()


@pytest.mark.slow
def test_a_learner_whose_link_is_down_for_a_minute_is_left_behind_and_taken_back_when_it_returns(tmp_path, hosts):
    # The group's collective timeout is --startup-timeout: 20 s takes a 60 s outage for a lost learner.
    manager, keys = run_on_host_a_with_keys(hosts, tmp_path, PORT, "--startup-timeout", "20", steps=10**7)
    learner = None
    try:
        learner = learn_on_host_b(hosts, keys)
        learner.wait_for_line(r"learner 1 joined the run's learners", timeout_s=120)
        hosts.cut(up=False)
        cut_at = time.monotonic()
        manager.wait_for_line(r"the compute process lost a learner", timeout_s=60)
        manager.wait_for_line(r"learn\(\) in a learner process", timeout_s=60)
        learned_before = read_csv(tmp_path / "run" / "progress.csv")[-1]["learn_steps"]
        learner.wait_for_line(r"asking for ranks in its next group", timeout_s=60)
        time.sleep(max(0.0, 60 - (time.monotonic() - cut_at)))  # the outage itself, not a synchronisation
        hosts.cut(up=True)
        manager.wait_for_line(r"the compute process stopped for a new group of learners", timeout_s=60)
        learner.wait_for_line(r"learner 1 joined the run's learners", timeout_s=120)
        manager.wait_for_line(r"flare2.progress INFO", timeout_s=60)
        # The run learned on without it, and goes on with it.
        rows = read_csv(tmp_path / "run" / "progress.csv")
        assert rows[-1]["learn_steps"] > learned_before and rows[-1]["compute_restarts"] == 2
        manager.process.send_signal(signal.SIGINT)
        assert manager.wait(timeout_s=120) == exit_codes.SIGINT
        assert learner.wait(timeout_s=30) == exit_codes.OK, learner.text
    finally:
        for run in [manager, learner]:
            if run is not None:
                run.stop()
