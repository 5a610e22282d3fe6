"""What frames cost on the way from a local agent to the compute process: through the stream or shared memory.

    python tools/bench_frames.py [--envs 8 32 64] [--requests 1000]

An agent process of N envs sends each step's frame stacks, ``[N, 4, 84, 84]`` uint8 (Atari's), to the compute
process, which needs them in an array of its own to batch them. Each way is timed as the agent sees it (send,
then wait for a small reply), in two real processes, through the functions a run calls on each side: the agent's
``Acting`` (the request it builds, its stacks moved on by a new frame before the clock starts) and its port's
``ViewsSender`` and ``Requester`` (a Unix stream), the compute process's ``StreamServer``, ``unpack`` with the
connection's shared-array reader and the CDP's ``ViewsReceiver``, and the copy into the batch of what the CT may not
take as it is (the model is left out):

- ``whole stacks``: every stack of 4 frames in the request, through the stream;
- ``each frame once``: each env's new frame, the stacks that move on by one frame crossing as a flag
  (flare2.core.predict_requests) and rebuilt on the compute side, through the stream (agents of other machines);
- ``shared memory, whole stacks``: the frames and a copy of every stack written into the shared block
  (flare2.wire.shared_arrays), as local agents sent them before;
- ``shared memory, stacks in place``: the stacks and the new frames named where the agent's ``ViewRows`` keeps
  them (a view buffer) and read there: the way of local agents.

``tiny`` sends one int per env: what any round trip costs. Prints the median round trip of each, in
microseconds, and each way's cost above ``tiny``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.acting import Acting
from flare2.core.predict_requests import ViewsReceiver, ViewsSender
from flare2.core.specs import CTSpecs, Spec, View
from flare2.core.transforms import Transforms
from flare2.wire.protocol import PREDICT, PREDICTION, Message, pack, unpack
from flare2.wire.sockets import Requester
from flare2.wire.streams import SCHEME, StreamServer

FRAMES = (4, 84, 84)
MAX_BYTES = 1 << 28
WAYS = ("tiny", "whole stacks", "each frame once", "shared memory, whole stacks", "shared memory, stacks in place")
SPECS = CTSpecs(
    inputs={"obs": Spec(FRAMES[1:], "uint8"), "obs_frames": Spec(FRAMES, "uint8")},
    actions={"action": Spec((), "int64")},
    states={},
    rewards={"reward": Spec((), "float32")},
    views={"obs_frames": View.last_observations(FRAMES[0])},
)


def serve(path: str, ready: Any) -> None:
    """The compute side: each request's frames into an array of its own, one action per env back."""
    views = ViewsReceiver(SPECS)

    def receive(connection: Any, frames: list[bytes], now: float) -> None:
        message = unpack(frames, max_bytes=MAX_BYTES, shared=connection.shared_arrays)
        payload, own = views.unpack(message.agent_id, message.payload)
        _batch = {key: value if key in own else np.array(value) for key, value in payload["inputs"].items()}
        rows = len(next(iter(_batch.values())))
        reply = {"actions": {"action": np.zeros(rows, np.int64)}}
        connection.shared_arrays.release(message.seq)  # as the CDP's reply does (SocketFront._send)
        server.send(connection, pack(Message(PREDICTION, reply, seq=message.seq)))

    server = StreamServer(path, max_bytes=MAX_BYTES, receive=receive)
    ready.set()
    while True:
        server.drain(time.monotonic())


def round_trips(requester: Requester, way: str, envs: int, requests: int) -> list[float]:
    rng = np.random.default_rng(0)
    acting = Acting(
        specs=SPECS,
        observation_space=gym.spaces.Box(0, 255, FRAMES[1:], np.uint8),
        action_space=gym.spaces.Discrete(4),
        transforms=Transforms(),
        count=envs,
    )
    acting.start(rng.integers(0, 256, (envs, *FRAMES[1:]), dtype=np.uint8))
    sender = ViewsSender(SPECS, whole=requester.shares_arrays)
    actions, rewards = {"action": np.zeros(envs, np.int64)}, np.zeros(envs, np.float32)
    seconds = []
    for _ in range(requests):
        # The envs played a step: each stack moves on by a new frame (before the clock starts, as an agent's does).
        next_rows = acting.next_rows()
        next_rows.only_array[...] = rng.integers(0, 256, (envs, *FRAMES[1:]), dtype=np.uint8)
        acting.stepped(next_rows, rewards, actions, {})
        observations, inputs, _ = acting.request()
        started = time.perf_counter()
        if way == "tiny":
            payload: dict[str, Any] = {"inputs": {"count": np.zeros(envs, np.int64)}, "states": {}}
        elif way == "whole stacks":
            payload = {"inputs": {"obs_frames": inputs["obs_frames"]}, "states": {}}
        elif way == "shared memory, whole stacks":
            # Not in a view buffer: the writer copies both into the block.
            stacks = np.ascontiguousarray(inputs["obs_frames"])
            payload = {"inputs": {"obs": observations["obs"], "obs_frames": stacks}, "states": {}}
        else:
            payload = sender.pack({"inputs": inputs, "states": {}})
        requester.wait_reply(requester.send_request(PREDICT, payload), timeout_s=10.0, what="predict")
        seconds.append(time.perf_counter() - started)
    return seconds


def measure(envs: int, requests: int) -> dict[str, float]:
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "frames")
        server = spawn.Process(target=serve, args=(path, ready), daemon=True)
        server.start()
        try:
            if not ready.wait(60):
                raise RuntimeError(f"the compute side did not start within 60 s (exit code {server.exitcode})")
            medians = {}
            for way in WAYS:
                # A connection per way, as the server keeps the last views of each agent it serves.
                requester = Requester(
                    None, SCHEME + path, identity=way, max_bytes=MAX_BYTES, shared_arrays="shared" in way
                )
                try:
                    round_trips(requester, way, envs, 20)  # warm up
                    medians[way] = statistics.median(round_trips(requester, way, envs, requests)) * 1e6
                finally:
                    requester.close()
        finally:
            server.kill()
            server.join()
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--requests", type=int, default=1000)
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
