"""Prediction round trip as an attached agent sees it: hello, then predict requests one after another.

    python tools/bench_roundtrip.py tcp://HOST:PORT [--keys DIR] [--requests 2000]

Run it against a manager started with --num-agents 0, so this probe is the
only live agent and every request is served at once (no batching wait). It
prints the median, 90th and 99th percentile round trip in microseconds.
"""

from __future__ import annotations

import argparse
import secrets
import socket
import statistics
import sys
import time

import zmq

from flare2.core.specs import CTSpecs
from flare2.wire.protocol import BYE, HELLO, PREDICT
from flare2.wire.security import load_client
from flare2.wire.sockets import Requester, context


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("endpoint", help="the manager's control endpoint")
    parser.add_argument("--keys", default=None, help="CURVE keys folder, as for flare2 attach")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--ct", default="RL")
    args = parser.parse_args(argv)
    curve = load_client(args.keys) if args.keys else None
    agent_id = f"r-bench-{socket.gethostname()}-{secrets.token_hex(4)}"
    with context() as ctx:
        control = Requester(ctx, args.endpoint, identity=agent_id, curve=curve)
        welcome = control.request(
            HELLO,
            {"role": "agent", "remote": True, "pid": 0, "host": socket.gethostname(), "cts": [args.ct]},
            timeout_s=10,
            what="hello to the manager",
        ).payload
        ct = welcome["cts"][args.ct]
        specs = CTSpecs.from_wire(ct["specs"])
        payload = {
            "inputs": {key: spec.zeros(1) for key, spec in specs.inputs.items()},
            "states": {key: spec.zeros(1) for key, spec in specs.states.items()},
        }
        predictor = Requester(ctx, ct["predict_endpoint"], identity=agent_id, curve=curve)
        times = []
        for _ in range(args.requests + 50):
            start = time.perf_counter()
            predictor.request(PREDICT, payload, ct=args.ct, timeout_s=10, what="predict")
            times.append(time.perf_counter() - start)
        control.send(BYE, {"reason": "benchmark done"})
        control.socket.setsockopt(zmq.LINGER, 1000)
        predictor.close()
        control.close()
    micros = sorted(t * 1e6 for t in times[50:])  # the first ones include connecting
    print(
        f"{args.endpoint}: {len(micros)} predict round trips, median {statistics.median(micros):.0f} us, "
        f"p90 {micros[int(0.9 * len(micros))]:.0f} us, p99 {micros[int(0.99 * len(micros))]:.0f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
