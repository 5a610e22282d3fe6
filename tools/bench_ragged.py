"""What ragged batching costs: entities/s through a CT's prediction path, ragged against the same batch padded.

    python tools/bench_ragged.py [--rows 64] [--requests 8] [--seconds 3]

A batch of ``--rows`` Minefield observations (1-3 robots, 1-5 mines each),
split into ``--requests`` predict requests as that many agents would send
them, goes the whole way a prediction goes in the compute process: each
request is encoded and decoded (the wire), checked against the CT's specs,
the requests are concatenated (the CDP) and ``ComputationTask.predict`` runs
``EntityActorCritic`` on them, one torch thread. Two layouts of the same
entities, measured in the same run:

- ragged: each entity type as ``Ragged`` (flat items plus lengths), what flare2 sends;
- padded: each entity type padded to the longest observation of the batch,
  ``[rows, longest, 2]`` plus a ``[rows, longest]`` bool mask, which the model
  turns back into its flat items (what a framework without ragged batching
  makes the user do).

Printed: entities/s and batches/s for each, the bytes a batch puts on the
wire, and ragged / padded ratios (above 1: ragged is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from flare2.core.algorithm import Algorithm
from flare2.core.computation_task import ComputationTask
from flare2.core.model import Model
from flare2.core.ragged_tensor import RaggedTensor
from flare2.core.spaces import ObservationRows, input_specs
from flare2.core.specs import Spec, check_arrays
from flare2.wire.codec import decode, encode
from flare2.wire.ragged import Ragged, concat_rows
from flare2.zoo.entity import EntityActorCritic
from flare2.zoo.minefield import MAX_MINES, MAX_ROBOTS, Minefield
from flare2.zoo.ppo import PPO

ENTITY_TYPES = ("robot", "mine")
LONGEST = {"robot": MAX_ROBOTS, "mine": MAX_MINES}


class PaddedEntities(Model):
    """EntityActorCritic's network, fed padded entity arrays and masks instead of ragged ones."""

    def __init__(self, inner: EntityActorCritic) -> None:
        super().__init__()
        self.inner = inner

    def input_specs(self) -> dict[str, Spec]:
        specs = {"cannon": Spec((1,), "float32")}
        for key in ENTITY_TYPES:
            specs[key] = Spec((LONGEST[key], 2), "float32")
            specs[f"{key}_mask"] = Spec((LONGEST[key],), "bool")
        return specs

    def action_specs(self) -> dict[str, Spec]:
        return self.inner.action_specs()

    def ragged_inputs(self, inputs: dict) -> dict:
        ragged = {"cannon": inputs["cannon"]}
        for key in ENTITY_TYPES:
            mask = inputs[f"{key}_mask"]
            ragged[key] = RaggedTensor(inputs[key][mask], mask.sum(-1))
        return ragged


class PaddedPPO(Algorithm):
    def __init__(self, model: PaddedEntities) -> None:
        super().__init__(model)
        self.inner = PPO(model.inner)

    def predict(self, inputs, states):
        return self.inner.predict(self.model.ragged_inputs(inputs), states)

    def learn(self, experience):
        return {}


def observations(rows: int, seed: int) -> dict:
    env = Minefield()
    obs = ObservationRows(input_specs(env.observation_space), rows, keyed=True)
    for index in range(rows):
        obs.set(index, env.reset(seed=seed + index)[0])
    return obs.arrays()


def padded(arrays: dict) -> dict:
    out = {"cannon": arrays["cannon"]}
    for key in ENTITY_TYPES:
        items, mask = arrays[key].padded()
        width = LONGEST[key]
        out[key] = np.zeros((len(mask), width, 2), np.float32)
        out[f"{key}_mask"] = np.zeros((len(mask), width), bool)
        out[key][:, : items.shape[1]] = items
        out[f"{key}_mask"][:, : mask.shape[1]] = mask
    return out


def split(arrays: dict, requests: int) -> list[dict]:
    rows = len(arrays["cannon"])
    bounds = np.linspace(0, rows, requests + 1).astype(int)
    return [{key: value[start:stop] for key, value in arrays.items()} for start, stop in zip(bounds, bounds[1:])]


def measure(ct: ComputationTask, requests: list[dict], seconds: float) -> tuple[float, int]:
    """Median seconds per batch over the whole path, and the bytes the batch's requests take on the wire."""
    messages = [encode({"inputs": request, "states": {}}) for request in requests]
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        started = time.perf_counter()
        payloads = []
        for request in requests:
            payload = decode(encode({"inputs": request, "states": {}}))
            check_arrays("inputs", ct.specs.inputs, payload["inputs"])
            payloads.append(payload["inputs"])
        inputs = {key: concat_rows([payload[key] for payload in payloads]) for key in ct.specs.inputs}
        ct.predict(inputs, {})
        times.append(time.perf_counter() - started)
    return statistics.median(times), sum(len(message) for message in messages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="observations per batch")
    parser.add_argument("--requests", type=int, default=8, help="predict requests the batch is made of")
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per layout")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    env = Minefield()
    network = EntityActorCritic(
        env.observation_space, env.action_space, actors={"move": "robot"}, selects={"fire": "mine"}
    )
    ragged_ct = ComputationTask("ragged", PPO(network), device="cpu")
    padded_ct = ComputationTask("padded", PaddedPPO(PaddedEntities(network)), device="cpu")
    arrays = observations(args.rows, seed=0)
    entities = sum(int(arrays[key].lengths.sum()) for key in ENTITY_TYPES if isinstance(arrays[key], Ragged))
    results = {}
    for name, ct, batch in (("ragged", ragged_ct, arrays), ("padded", padded_ct, padded(arrays))):
        seconds, wire_bytes = measure(ct, split(batch, args.requests), args.seconds)
        results[name] = (seconds, wire_bytes)
        print(
            f"{name:7s} {entities / seconds:10,.0f} entities/s  {1 / seconds:8,.1f} batches/s  "
            f"{seconds * 1e3:7.2f} ms/batch  {wire_bytes:7,d} wire bytes/batch"
        )
    (ragged_s, ragged_bytes), (padded_s, padded_bytes) = results["ragged"], results["padded"]
    print(
        f"{args.rows} observations, {entities} entities, {args.requests} requests per batch; "
        f"ragged/padded speed {padded_s / ragged_s:.2f}, wire bytes {ragged_bytes / padded_bytes:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
