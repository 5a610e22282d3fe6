"""Two hosts made of network namespaces joined by a veth pair (needs root; skipped otherwise).

Host A runs a manager with 2 local agents bound to its veth address with
CURVE keys; host B attaches 4 agents with `flare2 attach`. Then the link is
cut, the manager drops the remote agents and goes on; then B attaches again.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys

import pytest
from runs import CARTPOLE, RunProcess, read_csv

HEARTBEAT_S = 3
ADDRESS_A, ADDRESS_B = "10.231.7.1", "10.231.7.2"
PORT = 47250

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="making network namespaces needs root and iproute2"
)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def two_hosts():
    tag = secrets.token_hex(3)
    host_a, host_b, veth_a, veth_b = f"fl2a{tag}", f"fl2b{tag}", f"fl2va{tag}", f"fl2vb{tag}"
    try:
        subprocess.run(["ip", "netns", "add", host_a], check=True, capture_output=True, timeout=10)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot make network namespaces here: {exc.stderr.decode().strip()}")
    try:
        ip("netns", "add", host_b)
        ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        ip("link", "set", veth_a, "netns", host_a)
        ip("link", "set", veth_b, "netns", host_b)
        ip("-n", host_a, "addr", "add", f"{ADDRESS_A}/24", "dev", veth_a)
        ip("-n", host_b, "addr", "add", f"{ADDRESS_B}/24", "dev", veth_b)
        for host, veth in ((host_a, veth_a), (host_b, veth_b)):
            ip("-n", host, "link", "set", "lo", "up")
            ip("-n", host, "link", "set", veth, "up")
        yield host_a, host_b, veth_b
    finally:
        for host in (host_a, host_b):
            subprocess.run(["ip", "netns", "del", host], capture_output=True, timeout=10)


def test_agents_attached_from_another_host_join_leave_and_join_again(tmp_path, two_hosts):
    host_a, host_b, veth_b = two_hosts
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "flare2.cli", "keys", str(keys)], check=True, capture_output=True, timeout=60)
    log_dir = tmp_path / "run"
    manager = RunProcess(
        CARTPOLE,
        "--num-agents",
        "2",
        "--max-steps",
        "10000000",
        "--progress-interval",
        "0.5",
        "--device",
        "cpu",
        "--bind",
        ADDRESS_A,
        "--port",
        str(PORT),
        "--keys",
        str(keys),
        "--heartbeat-timeout",
        str(HEARTBEAT_S),
        log_dir=log_dir,
        prefix=("ip", "netns", "exec", host_a),
    )
    attached = []
    try:
        manager.wait_for_line(r"compute process is up", timeout_s=120)
        attached.append(
            RunProcess.command(
                [
                    "ip",
                    "netns",
                    "exec",
                    host_b,
                    sys.executable,
                    "-m",
                    "flare2.cli",
                    "attach",
                    f"tcp://{ADDRESS_A}:{PORT}",
                    "--keys",
                    str(keys),
                    "--num-agents",
                    "4",
                ]
            )
        )
        for _ in range(4):
            manager.wait_for_line(r"remote agent r-\S+ \(pid \d+ on \S+\) attached", timeout_s=60)
        manager.wait_for_line(r"agents 2 local, 4 remote", timeout_s=60)
        manager.wait_for_line(r"agents 2 local, 4 remote", timeout_s=60)
        joined = read_csv(log_dir / "progress.csv")[-1]
        assert joined["remote_episodes"] > 0 and joined["remote_env_steps"] > 0
        # Six agents share each batch now; two local agents alone never exceed 2.
        assert joined["batch_size_mean"] > 2

        ip("-n", host_b, "link", "set", veth_b, "down")
        for _ in range(4):
            manager.wait_for_line(
                r"remote agent r-\S+ silent for 3s \(link lost\?\); dropped", timeout_s=3 * HEARTBEAT_S
            )
        before = read_csv(log_dir / "progress.csv")[-1]["env_steps"]
        manager.wait_for_line(r"agents 2 local, 0 remote", timeout_s=30)
        manager.wait_for_line(r"agents 2 local, 0 remote", timeout_s=30)
        after = read_csv(log_dir / "progress.csv")[-1]
        assert after["env_steps"] > before  # local training goes on
        assert after["remote_dropped"] == 4 and after["restarts"] == 0
        # Cut off from the manager, the attached agents give up after the heartbeat timeout, and attach with them.
        assert attached[0].wait(timeout_s=6 * HEARTBEAT_S) == 3

        ip("-n", host_b, "link", "set", veth_b, "up")
        attached.append(
            RunProcess.command(
                [
                    "ip",
                    "netns",
                    "exec",
                    host_b,
                    sys.executable,
                    "-m",
                    "flare2.cli",
                    "attach",
                    f"tcp://{ADDRESS_A}:{PORT}",
                    "--keys",
                    str(keys),
                    "--num-agents",
                    "4",
                ]
            )
        )
        manager.wait_for_line(r"agents 2 local, 4 remote", timeout_s=60)

        manager.process.send_signal(2)
        assert manager.wait(timeout_s=30) == 130
        # The manager's stop reached the attached agents: they said bye and attach ended on its own.
        assert attached[1].wait(timeout_s=30) == 0
        assert "detached" in manager.text
    finally:
        for run in [manager, *attached]:
            run.stop()
