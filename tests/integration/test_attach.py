"""`flare2 attach` and CURVE on loopback: join, detach, the run's recipe, refusal, unreachable manager, giving up on
a silent one, version mismatch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from runs import CARTPOLE, RunProcess, agent_pids, read_csv, wait_until_gone

from flare2.runtime import exit_codes
from flare2.wire.protocol import ERROR, HELLO, PREDICT, PROTOCOL_VERSION, Message, pack, unpack
from flare2.wire.security import load_client, make_client_socket, make_keys

HERE = Path(__file__).resolve().parent
UP = r"compute process is up"


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def attach(*args: str) -> RunProcess:
    return RunProcess.command([sys.executable, "-m", "flare2.cli", "attach", *args])


def test_attach_restarts_a_killed_agent_the_manager_takes_back_and_gives_up_on_a_manager_gone_for_good(tmp_path):
    manager = RunProcess(
        CARTPOLE,
        "--num-agents",
        "1",
        "--envs-per-agent",
        "1",
        "--max-steps",
        "10000000",
        "--progress-interval",
        "0.5",
        "--heartbeat-timeout",
        "2",
        "--device",
        "cpu",
        log_dir=tmp_path,
    )
    remote = None
    try:
        manager.wait_for_line(UP, timeout_s=120)
        endpoint = json.loads((tmp_path / "run.json").read_text())["control_endpoint"]
        remote = attach(endpoint, "--num-agents", "1", "--rejoin-for", "1")
        manager.wait_for_line(r"agents 1 local, 1 remote", timeout_s=60)
        (victim,) = agent_pids(remote.process.pid)
        os.kill(victim, signal.SIGKILL)
        remote.wait_for_line(r"was killed by SIGKILL; restarting it in 0\.5s \(restart 1 of at most 10\)", timeout_s=30)
        # The successor registers as a new remote agent and plays; the victim is dropped after the heartbeat timeout.
        manager.wait_for_line(r"remote agent r-\S+ \(pid \d+ on \S+\) attached", timeout_s=60)
        manager.wait_for_line(r"remote agent r-\S+ silent for 2s", timeout_s=60)
        manager.wait_for_line(r"agents 1 local, 1 remote", timeout_s=60)
        (successor,) = agent_pids(remote.process.pid)
        assert successor != victim
        # Then the manager is gone for good: the agent notices after the heartbeat timeout, attach probes for
        # --rejoin-for and ends.
        manager.process.kill()
        manager.wait(timeout_s=30)
        remote.wait_for_line(r"lost the manager; a new one rejoins as soon as the run answers again", timeout_s=30)
        remote.wait_for_line(
            r"the manager has not answered for \ds \(--rejoin-for 1\): the run is over or out of reach", timeout_s=30
        )
        assert remote.wait(timeout_s=30) == exit_codes.MANAGER_LOST
        assert wait_until_gone([successor], timeout_s=10) == []
    finally:
        for run in (manager, remote):
            if run is not None:
                run.stop()


def test_remote_agents_dropped_before_the_compute_process_is_up_are_taken_back_once_they_wake(tmp_path):
    # The CT is built only once the attached agents, frozen, have been dropped; they are thawed after it is up.
    # A budget no run here reaches: the run is stopped with ctrl-c once all four are back.
    built_after = tmp_path / "agents_dropped"
    manager = RunProcess(
        HERE / "faulty_run.py",
        "--build-after",
        str(built_after),
        "--num-agents",
        "1",
        "--envs-per-agent",
        "1",
        "--max-steps",
        "10000000",
        "--heartbeat-timeout",
        "3",
        "--progress-interval",
        "0.5",
        "--device",
        "cpu",
        log_dir=tmp_path,
    )
    remote = None
    try:
        endpoint = re.search(
            r"control endpoint (tcp://\S+),", manager.wait_for_line(r"control endpoint tcp://", 60)
        ).group(1)
        remote = attach(endpoint, "--num-agents", "4")
        for _ in range(4):
            manager.wait_for_line(r"remote agent r-\S+ \(pid \d+ on \S+\) attached", timeout_s=60)
        frozen = agent_pids(remote.process.pid)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        for _ in range(4):
            manager.wait_for_line(r"remote agent r-\S+ silent for 3s .*; dropped from the run", timeout_s=30)
        built_after.touch()
        manager.wait_for_line(UP, timeout_s=60)
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        manager.wait_for_line(r"agents 1 local, 4 remote", timeout_s=90)
        manager.process.send_signal(signal.SIGINT)
        assert manager.wait(timeout_s=60) == 130, manager.text[-4000:]
        assert remote.wait(timeout_s=30) == exit_codes.OK
    finally:
        for run in (manager, remote):
            if run is not None:
                run.stop()
    final = read_csv(tmp_path / "progress.csv")[-1]
    assert final["remote_dropped"] >= 4 and final["remote_env_steps"] > 0


def test_peers_without_an_allowed_key_get_no_service(tmp_path, ctx):
    keys, strangers = tmp_path / "keys", tmp_path / "strangers"
    make_keys(keys)
    make_keys(strangers)
    manager = RunProcess(
        CARTPOLE,
        "--num-agents",
        "1",
        "--max-steps",
        "10000000",
        "--device",
        "cpu",
        "--keys",
        str(keys),
        "--max-message-bytes",
        "100000",
        log_dir=tmp_path / "run",
    )
    try:
        manager.wait_for_line(UP, timeout_s=120)
        info = json.loads((tmp_path / "run" / "run.json").read_text())
        wrong_key = load_client(strangers)
        # The stranger's own pair, but the run's server key: the handshake reaches ZAP, which says no.
        wrong_key = type(wrong_key)(wrong_key.public_key, wrong_key.secret_key, load_client(keys).server_public_key)
        allowed = load_client(keys)

        def ask(curve, endpoint: str, frames: list[bytes], timeout_ms: int) -> list[bytes] | None:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            # The sender's id from the message's header: a ROUTER refuses a new connection under an id whose last
            # connection it has not cleaned up yet.
            sock.setsockopt(zmq.IDENTITY, msgpack.unpackb(frames[0])[2].encode())
            if curve is not None:
                make_client_socket(sock, curve)
            sock.connect(endpoint)
            # A DEALER blocks its send while it holds no connection, which a refused handshake can leave it without.
            sock.setsockopt(zmq.SNDTIMEO, timeout_ms)
            try:
                sock.send_multipart(frames)
            except zmq.Again:
                sock.close()
                return None
            reply = sock.recv_multipart() if sock.poll(timeout_ms) else None
            sock.close()
            return reply

        def predict(peer: str) -> list[bytes]:
            request = {"inputs": {"obs": np.zeros((1, 4), np.float32)}, "states": {}}
            return pack(Message(PREDICT, request, peer, 2, "RL"))

        probe = pack(Message(HELLO, {"role": "probe"}, "r-peer", 1))
        for curve in (None, wrong_key):
            assert ask(curve, info["control_endpoint"], probe, 2000) is None
            assert ask(curve, info["cts"]["RL"]["predict_endpoint"], predict("r-peer"), 2000) is None
        manager.wait_for_line(r"refused a peer whose CURVE key .* \(refusal 1\)", timeout_s=10)
        # The peer without CURVE never reached the allow-list: its failed handshake is logged on its own.
        assert "a peer failed the CURVE handshake on" in manager.text
        # A message over the limit, even with the allowed key, loses its connection, and the compute process says so.
        oversize = [*predict("r-peer")[:-1], b"\0" * 200_000]
        assert ask(allowed, info["cts"]["RL"]["predict_endpoint"], oversize, 2000) is None
        manager.wait_for_line(
            re.escape(info["cts"]["RL"]["predict_endpoint"]) + r" closed \(closure \d+\): its peer left, "
            r"or sent a message over max_message_bytes \(100000\)",
            timeout_s=30,
        )
        # The same requests with the allowed key are served.
        assert (
            unpack(ask(allowed, info["control_endpoint"], probe, 10_000)).payload["protocol_version"]
            == PROTOCOL_VERSION
        )
        served = ask(allowed, info["cts"]["RL"]["predict_endpoint"], predict("r-peer-2"), 10_000)
        assert unpack(served).kind == "prediction"
    finally:
        manager.stop()


def test_attaching_to_an_address_where_no_manager_listens_fails_fast_with_a_clear_message():
    with zmq.Context() as context:
        sock = context.socket(zmq.ROUTER)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        sock.close(linger=0)  # a port that was free a moment ago, and nobody listens on now
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "flare2.cli", "attach", f"tcp://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == exit_codes.UNREACHABLE
    assert time.monotonic() - started < 20
    assert f"no manager answered at tcp://127.0.0.1:{port}" in result.stderr


def test_a_peer_with_another_protocol_version_is_told_both_versions(tmp_path, ctx):
    manager = RunProcess(CARTPOLE, "--num-agents", "1", "--max-steps", "10000000", "--device", "cpu", log_dir=tmp_path)
    try:
        manager.wait_for_line(UP, timeout_s=120)
        endpoint = json.loads((tmp_path / "run.json").read_text())["control_endpoint"]
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send_multipart([msgpack.packb([99, HELLO, "r-old", 1, ""]), msgpack.packb({"role": "probe"})])
        assert sock.poll(10_000)
        reply = unpack(sock.recv_multipart())
        assert reply.kind == ERROR
        assert "protocol 99" in reply.payload["reason"] and f"speaks {PROTOCOL_VERSION}" in reply.payload["reason"]
    finally:
        manager.stop()


def test_attach_with_no_agent_options_plays_the_runs_recipe_with_its_statistics_and_detaches_on_ctrl_c(tmp_path):
    # Acrobot's PPO preset normalises observations with statistics the run's agents merge in its CT.
    manager = RunProcess.command(
        [sys.executable, "-m", "flare2.cli", "train", "--env", "Acrobot-v1", "--algo", "ppo", "--no-serial"]
        + ["--num-agents", "1", "--envs-per-agent", "2", "--max-steps", "10000000", "--progress-interval", "0.5"]
        + ["--device", "cpu", "--log-dir", str(tmp_path)],
        cwd=tmp_path,
    )
    remote = None
    try:
        manager.wait_for_line(UP, timeout_s=120)
        endpoint = json.loads((tmp_path / "run.json").read_text())["control_endpoint"]
        refused = subprocess.run(
            [sys.executable, "-m", "flare2.cli", "attach", endpoint, "--agent-kwargs", '{"env_id": "CartPole-v1"}'],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == exit_codes.CONFIG_ERROR, refused.stderr
        assert (
            "--agent-kwargs sets 'env_id' to 'CartPole-v1', the run's agents play with 'Acrobot-v1'" in refused.stderr
        )

        remote = attach(endpoint, "--num-agents", "2")
        remote.wait_for_line(r"starting 2 agent\(s\) of flare2.core.envs:GymAgent with 2 env\(s\) each", timeout_s=60)
        manager.wait_for_line(r"agents 1 local, 2 remote, 6 envs", timeout_s=60)
        while read_csv(tmp_path / "progress.csv")[-1]["remote_env_steps"] < 6000:
            manager.wait_for_line(r"agents 1 local, 2 remote", timeout_s=60)
        # Ctrl+C detaches them: gone, not crashed.
        remote.process.send_signal(signal.SIGINT)
        assert remote.wait(timeout_s=30) == exit_codes.OK
        for _ in range(2):
            manager.wait_for_line(r"remote agent r-\S+ detached", timeout_s=10)
        manager.process.send_signal(signal.SIGTERM)
        assert manager.wait(timeout_s=60) == exit_codes.SIGTERM
    finally:
        for run in (manager, remote):
            if run is not None:
                run.stop()
    final = read_csv(tmp_path / "progress.csv")[-1]
    assert final["restarts"] == 0 and final["remote_dropped"] == 0
    import torch

    counted = torch.load(tmp_path / "checkpoints" / "RL.pt", weights_only=True)["statistics"]["obs"]["count"]
    # The local agent alone counts at most its own steps (and its episodes' first observations). The run's
    # statistics hold nearly every step of the three agents (each may keep up to its sync interval, 1000 rows,
    # unsent): the remote agents normalised with them and fed them, as the local one does.
    local_steps = final["env_steps"] - final["remote_env_steps"]
    assert counted > local_steps + final["episodes"] + 2000
    assert counted >= final["env_steps"] - 3 * 1000
