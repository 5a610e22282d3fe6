"""Hostile input (docs/architecture.md: Wire; Security): thousands of random and mutated messages at a running run's sockets and streams.

The generator is seeded; a failure names its seed, and FLARE2_FUZZ_SEED=<seed> replays it.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import struct
import time

import msgpack
import numpy as np
import zmq
from runs import CARTPOLE, RunProcess, read_csv

from flare2.wire.codec import DEFAULT_MAX_BYTES
from flare2.wire.protocol import HELLO, LEARN, PREDICT, PROTOCOL_VERSION, STATS, Message, pack
from flare2.wire.stream_bytes import stream_chunks

MESSAGES = 10_000
STREAM_MESSAGES = 3_000
FLOOD = 3_000
BUDGET_STEPS = 8_000
SEED = int(os.environ.get("FLARE2_FUZZ_SEED", "20261123"))


def valid_frames(rng: random.Random, kind: str, identity: str) -> list[bytes]:
    if kind == PREDICT:
        payload = {"inputs": {"obs": np.zeros((1, 4), np.float32)}, "states": {}}
    elif kind == LEARN:
        lead = (1, 5)
        payload = {
            "inputs": {"obs": np.zeros((*lead, 4), np.float32)},
            "next_inputs": {"obs": np.zeros((*lead, 4), np.float32)},
            "actions": {"action": np.zeros(lead, np.int64)},
            "rewards": {"reward": np.ones(lead, np.float32)},
            "states": {},
            "terminated": np.zeros(lead, bool),
            "truncated": np.zeros(lead, bool),
        }
    elif kind == STATS:
        payload = {"role": "agent", "steps": 1_000_000, "episodes": [[500.0, 500]] * 10}
    else:
        payload = {"role": "agent", "pid": 1, "host": "fuzz", "cts": ["RL"]}
    return pack(Message(kind, payload, identity, rng.randrange(1 << 20), "RL"))


def mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    """One hostile variation of a valid message."""
    frames = list(frames)
    choice = rng.randrange(11)
    if choice == 0:  # flip bytes
        index = rng.randrange(len(frames))
        data = bytearray(frames[index])
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        frames[index] = bytes(data)
    elif choice == 1:  # truncate
        index = rng.randrange(len(frames))
        frames[index] = frames[index][: rng.randrange(len(frames[index]) + 1)]
    elif choice == 2:  # lengthen
        frames[rng.randrange(len(frames))] += rng.randbytes(rng.randint(1, 64))
    elif choice == 3:  # drop or add a frame
        frames = frames[:1] if rng.random() < 0.5 else [*frames, rng.randbytes(16)]
    elif choice == 4:  # another protocol version
        header = msgpack.unpackb(frames[0])
        header[0] = PROTOCOL_VERSION + rng.randint(1, 5)
        frames[0] = msgpack.packb(header)
    elif choice == 5:  # unknown kind, or a kind of the wrong type
        header = msgpack.unpackb(frames[0])
        header[1] = rng.choice(["launch", "", ["predict"], {"a": 1}, 7, None])
        frames[0] = msgpack.packb(header)
    elif choice == 6:  # unknown CT name
        header = msgpack.unpackb(frames[0])
        header[4] = rng.choice(["rl", "RL2", "x" * 500, 3])
        frames[0] = msgpack.packb(header)
    elif choice == 7:  # a payload field dropped or retyped
        payload = msgpack.unpackb(frames[1], strict_map_key=False)
        key = rng.choice(sorted(payload))
        if rng.random() < 0.5:
            del payload[key]
        else:
            payload[key] = rng.choice([None, 1, "x", [1, 2], {"obs": 1}])
        frames[1] = msgpack.packb(payload)
    elif choice == 8:  # an array of the wrong shape or dtype (a size that does not match, too)
        dims = rng.choice([(1, 5), (2, 4), (4,), (0, 4)])
        dtype = rng.choice(["<f8", "<i4", "<f4"])
        body = np.zeros(dims, dtype).tobytes()
        if rng.random() < 0.3:
            body = body[:-1]
        codes = {"<f8": 11, "<i4": 3, "<f4": 10}
        head = bytes([codes[dtype], len(dims)]) + b"".join(d.to_bytes(4, "little") for d in dims)
        payload = {"inputs": {"obs": msgpack.ExtType(1, head + body)}, "states": {}}
        frames[1] = msgpack.packb(payload)
    elif choice == 9:  # pure garbage
        frames = [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 3))]
    else:  # object-like ext types and non-str keys
        frames[1] = msgpack.packb({"inputs": {1: msgpack.ExtType(rng.randint(2, 127), b"\x00" * 8)}})
    return frames


def test_ten_thousand_hostile_messages_neither_crash_nor_skew_a_run(tmp_path):
    rng = random.Random(SEED)
    # One env per agent keeps the steps played after the budget (while agents stop) well under the bound below.
    run = RunProcess(
        CARTPOLE,
        "--num-agents",
        "4",
        "--envs-per-agent",
        "1",
        "--max-steps",
        str(BUDGET_STEPS),
        "--progress-interval",
        "0.5",
        "--device",
        "cpu",
        log_dir=tmp_path,
    )
    ctx = zmq.Context()
    try:
        run.wait_for_line(r"compute process is up", timeout_s=120)
        info = json.loads((tmp_path / "run.json").read_text())
        endpoints = {
            PREDICT: info["cts"]["RL"]["predict_endpoint"],
            LEARN: info["cts"]["RL"]["learn_endpoint"],
            STATS: info["control_endpoint"],
        }
        sockets = {}
        for kind, endpoint in endpoints.items():
            for n in range(3):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.IDENTITY, f"fuzz-{kind}-{n}".encode())
                sock.connect(endpoint)
                sockets[(kind, n)] = sock

        def send(sock: zmq.Socket, frames: list[bytes]) -> bool:
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK)
                return True
            except zmq.Again:
                return False

        sent = 0
        for _ in range(MESSAGES):
            kind, n = rng.choice(sorted(sockets))
            identity = f"fuzz-{kind}-{n}"
            message_kind = kind if kind != STATS else rng.choice([STATS, HELLO])
            frames = valid_frames(rng, message_kind, identity)
            sent += send(sockets[(kind, n)], mutate(rng, frames) if rng.random() < 0.9 else frames)
            for sock in sockets.values():  # read what comes back, as a peer would
                while sock.poll(0):
                    sock.recv_multipart()
        # Oversized messages: ZeroMQ cuts them at the socket's size limit.
        for _ in range(3):
            sent += send(sockets[(PREDICT, 0)], [b"\x00" * 16, b"\x00" * (DEFAULT_MAX_BYTES + 100_000)])
        # A flood of valid requests from one peer that never waits for its answers.
        flood = sockets[(PREDICT, 1)]
        for _ in range(FLOOD):
            sent += send(flood, valid_frames(rng, PREDICT, "fuzz-predict-1"))
        assert sent >= MESSAGES, f"seed {SEED}: only {sent} messages went out"

        # The head of the log shows how a run that ended early ended; the tail is the fuzz's own warnings.
        assert run.wait(timeout_s=300) == 0, f"seed {SEED}:\n{run.text[:4000]}\n...\n{run.text[-2000:]}"
    finally:
        ctx.destroy(linger=0)
        run.stop()

    rows = read_csv(tmp_path / "progress.csv")
    final = rows[-1]
    assert final["env_steps"] >= BUDGET_STEPS, f"seed {SEED}"
    # The fake stats (a million steps each) were dropped, not counted.
    assert final["env_steps"] < BUDGET_STEPS + 5_000, f"seed {SEED}: env_steps {final['env_steps']}"
    assert final["restarts"] == 0, f"seed {SEED}"
    assert final["rejected_requests"] > 1_000, f"seed {SEED}"
    assert final["dropped_messages"] > 100, f"seed {SEED}"
    # The connections ZeroMQ closed on the oversized messages are counted.
    assert final["closed_connections"] >= 1, f"seed {SEED}"
    assert "Traceback" not in run.text, f"seed {SEED}:\n{run.text[-4000:]}"


class StreamPeer:
    """A hostile process of the same user on a CDP's Unix stream: reconnects whenever the server closes on it."""

    def __init__(self, endpoint: str) -> None:
        self.path = endpoint.removeprefix("unix://")
        self.sock: socket.socket | None = None
        self.closed_on_it = 0

    def send(self, data: bytes) -> bool:
        if self.sock is None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(self.path)
        try:
            self.sock.settimeout(10)
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            self._reconnect()
            return False

    def read(self) -> None:
        """Take what came back, as a peer would (and notice a close)."""
        while self.sock is not None:
            self.sock.setblocking(False)
            try:
                if not self.sock.recv(1 << 16):
                    self._reconnect()
            except BlockingIOError:
                return
            except ConnectionResetError:
                self._reconnect()

    def _reconnect(self) -> None:
        self.closed_on_it += 1
        self.sock.close()
        self.sock = None


def test_hostile_bytes_on_the_local_streams_close_only_their_own_connections(tmp_path):
    rng = random.Random(SEED)
    run = RunProcess(
        CARTPOLE,
        "--num-agents",
        "2",
        "--envs-per-agent",
        "1",
        "--max-steps",
        str(10**9),
        "--progress-interval",
        "0.5",
        "--device",
        "cpu",
        log_dir=tmp_path,
    )
    try:
        run.wait_for_line(r"compute process is up", timeout_s=120)
        ct = json.loads((tmp_path / "run.json").read_text())["cts"]["RL"]
        peers = {PREDICT: StreamPeer(ct["local_predict_endpoint"]), LEARN: StreamPeer(ct["local_learn_endpoint"])}
        sent = 0
        for _ in range(STREAM_MESSAGES):
            kind = rng.choice([PREDICT, LEARN])
            frames = valid_frames(rng, kind, f"fuzz-stream-{kind}")
            frames = mutate(rng, frames) if rng.random() < 0.9 else frames
            if len(frames) == 2 and rng.random() < 0.9:
                data = b"".join(stream_chunks(frames))
            else:  # lengths that lie, most of them past any limit
                data = struct.pack("<II", rng.randrange(1 << 32), rng.randrange(1 << 32)) + b"".join(frames)
            sent += peers[kind].send(data)
            peers[kind].read()
        assert sent >= STREAM_MESSAGES * 0.8, f"seed {SEED}: only {sent} stream messages went out"
        closed = sum(peer.closed_on_it for peer in peers.values())
        assert closed > 10, f"seed {SEED}: lying lengths closed no stream"

        # The run plays on: its agents' own streams were untouched. The progress lines printed while the fuzz ran
        # may all show one count (on a busy machine the agents may have barely started): a later line shows more.
        def steps_of(line: str) -> int:
            return int(re.search(r"progress INFO: steps (\d+)", line).group(1))

        printed = [steps_of(line) for line in run.lines if "progress INFO: steps" in line]
        played = printed[-1] if printed else 0
        deadline = time.monotonic() + 60
        while steps_of(run.wait_for_line(r"progress INFO: steps", timeout_s=60)) <= played:
            assert time.monotonic() < deadline, f"seed {SEED}: the run stopped playing after the fuzz at {played} steps"
        run.process.send_signal(signal.SIGINT)
        assert run.wait(timeout_s=60) == 130, f"seed {SEED}:\n{run.text[-4000:]}"
    finally:
        run.stop()

    final = read_csv(tmp_path / "progress.csv")[-1]
    assert final["restarts"] == 0, f"seed {SEED}"
    # Every stream the server closed on the fuzzer was counted (besides the requests it refused with a reply).
    assert final["rejected_requests"] >= closed, f"seed {SEED}: {final['rejected_requests']} counted, {closed} closed"
    assert "Traceback" not in run.text, f"seed {SEED}:\n{run.text[-4000:]}"
