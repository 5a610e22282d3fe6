"""What frames cost on the way from a local agent to the compute process: Unix streams against shared memory.

    python tools/bench_frames.py [--envs 8 32 64] [--requests 300]

An agent process of N envs sends each step's frame stacks, ``[N, 4, 84, 84]`` uint8 (Atari's), to the compute
process, which needs them in an array of its own to batch them. Two ways, each timed as the agent sees it (send,
then wait for a small reply), in two real processes:

- ``whole stacks``: every stack of 4 frames in the request, encoded (flare2.wire.protocol), written to a Unix
  stream (flare2.wire.streams), read, decoded and copied out of the message;
- ``each frame once``: the request as flare2 sends it: each env's new frame, the stacks that move on by one
  frame crossing as a flag (flare2.core.predict_requests) and rebuilt on the compute side;
- ``shared memory``: the agent writes the frames into a shared memory block and sends a small message naming
  the step; the compute side copies them out of the block (Sample Factory's way).

``tiny`` sends one int per env the stream's way: what any round trip costs. Prints the median round trip of each,
in microseconds, and each way's cost above ``tiny``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np

from flare2.core.predict_requests import ViewsReceiver, ViewsSender
from flare2.core.specs import CTSpecs, Spec, View
from flare2.wire.protocol import PREDICT, PREDICTION, Message, pack, unpack
from flare2.wire.streams import SCHEME, StreamClient, StreamServer

FRAMES = (4, 84, 84)
MAX_BYTES = 1 << 28
WAYS = ("tiny", "whole stacks", "each frame once", "shared memory")
SPECS = CTSpecs(
    inputs={"obs": Spec(FRAMES[1:], "uint8"), "obs_frames": Spec(FRAMES, "uint8")},
    actions={"action": Spec((), "int64")},
    states={},
    rewards={"reward": Spec((), "float32")},
    views={"obs_frames": View.last_observations(FRAMES[0])},
)


def serve(path: str, block_name: str, envs: int, ready: Any) -> None:
    """The compute side: copy each request's frames into an array of its own, answer with one action per env."""
    block = shared_memory.SharedMemory(name=block_name)
    shared = np.ndarray((envs, *FRAMES), np.uint8, buffer=block.buf)
    actions = np.zeros(envs, np.int64)
    views = ViewsReceiver(SPECS)

    def receive(connection: Any, frames: list[bytes], now: float) -> None:
        message = unpack(frames, max_bytes=MAX_BYTES)
        payload = message.payload
        if "obs" in payload["inputs"]:  # each frame once: the stacks are rebuilt here
            payload = views.unpack("agent", payload)
        inputs = payload["inputs"]
        _batch = shared.copy() if "step" in inputs else {key: np.array(value) for key, value in inputs.items()}
        server.send(connection, pack(Message(PREDICTION, {"actions": {"action": actions}}, seq=message.seq)))

    server = StreamServer(path, max_bytes=MAX_BYTES, receive=receive)
    ready.set()
    try:
        while True:
            server.drain(time.monotonic())
    finally:
        block.close()


def round_trips(client: StreamClient, shared: np.ndarray, way: str, envs: int, requests: int) -> list[float]:
    rng = np.random.default_rng(0)
    stacks = rng.integers(0, 256, (envs, *FRAMES), dtype=np.uint8)
    sender = ViewsSender(SPECS)
    seconds = []
    for seq in range(requests):
        # The envs played a step: each stack moves on by a new frame (made before the clock starts).
        new = rng.integers(0, 256, (envs, *FRAMES[1:]), dtype=np.uint8)
        stacks = np.concatenate([stacks[:, 1:], new[:, None]], axis=1)
        started = time.perf_counter()
        if way == "tiny":
            payload: dict[str, Any] = {"inputs": {"count": np.zeros(envs, np.int64)}, "states": {}}
        elif way == "whole stacks":
            payload = {"inputs": {"obs_frames": stacks}, "states": {}}
        elif way == "each frame once":
            payload = sender.pack({"inputs": {"obs": new, "obs_frames": stacks}, "states": {}})
        else:
            np.copyto(shared, stacks)
            payload = {"inputs": {"step": np.full(envs, seq, np.int64)}, "states": {}}
        client.send(pack(Message(PREDICT, payload, seq=seq)))
        reply = None
        while reply is None:
            reply = client.receive(1.0)
        unpack(reply, max_bytes=MAX_BYTES)
        seconds.append(time.perf_counter() - started)
    return seconds


def measure(envs: int, requests: int) -> dict[str, float]:
    block = shared_memory.SharedMemory(create=True, size=int(np.prod(FRAMES)) * envs)
    shared = np.ndarray((envs, *FRAMES), np.uint8, buffer=block.buf)
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "frames")
        server = spawn.Process(target=serve, args=(path, block.name, envs, ready), daemon=True)
        server.start()
        try:
            ready.wait(30)
            client = StreamClient(SCHEME + path, max_bytes=MAX_BYTES)
            medians = {}
            for way in WAYS:
                round_trips(client, shared, way, envs, 20)  # warm up
                medians[way] = statistics.median(round_trips(client, shared, way, envs, requests)) * 1e6
            client.close()
        finally:
            server.kill()
            server.join()
            block.close()
            block.unlink()
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args(argv)
    print("| envs | stacks a request | tiny µs | " + " | ".join(f"{way} − tiny µs" for way in WAYS[1:]) + " |")
    print("|---:|---:|---:|" + "---:|" * (len(WAYS) - 1))
    for envs in args.envs:
        m = measure(envs, args.requests)
        size = envs * int(np.prod(FRAMES))
        above = " | ".join(f"{m[way] - m['tiny']:.0f}" for way in WAYS[1:])
        print(f"| {envs} | {size / 1e6:.2f} MB | {m['tiny']:.0f} | {above} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
