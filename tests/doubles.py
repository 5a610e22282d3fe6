"""Test doubles shared by several test files: a one-parameter model over ``x -> y`` and its learn requests, a
helper that keeps what an agent stores, and a port that answers an agent's predictions."""

from __future__ import annotations

import copy

import numpy as np
import torch

from flare2.core.learn_requests import check_learn, pack, unpack
from flare2.core.model import Model
from flare2.core.specs import CTSpecs, Spec, View
from flare2.runtime.agents.playing import StopRequested


class Scale(Model):
    """Input ``x`` and action ``y``, both ``(2,)`` float32; one parameter ``scale`` (2.0) and one buffer ``seen``."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def input_specs(self):
        return {"x": Spec((2,), "float32")}

    def action_specs(self):
        return {"y": Spec((2,), "float32")}


SCALE_SPECS = CTSpecs(
    inputs={"x": Spec((2,), "float32")},
    actions={"y": Spec((2,), "float32")},
    states={},
    rewards={"reward": Spec((), "float32")},
)
"""The specs of a CT of ``Scale`` (with the default reward)."""


ATARI_SPECS = CTSpecs(
    inputs={"obs": Spec((84, 84), "uint8"), "obs_frames": Spec((4, 84, 84), "uint8")},
    actions={"action": Spec((), "int64")},
    states={},
    rewards={"reward": Spec((), "float32")},
    views={"obs_frames": View.last_observations(4)},
)
"""The specs of a CT of an Atari preset's model: 84x84 frames and the view of the last 4 of them."""


def learn_payload(sequences: int, steps: int, *, fill: float = 0.0, version: int = 0) -> dict:
    """A learn request of ``Scale``'s CT as an agent sends it (``pack``): inputs full of ``fill``, every step acted
    by weights ``version``."""
    lead = (sequences, steps)
    return pack(
        SCALE_SPECS,
        {
            "inputs": {"x": np.full((*lead, 2), fill, np.float32)},
            "next_inputs": {"x": np.zeros((*lead, 2), np.float32)},
            "actions": {"y": np.zeros((*lead, 2), np.float32)},
            "rewards": {"reward": np.zeros(lead, np.float32)},
            "states": {},
            "terminated": np.zeros(lead, bool),
            "truncated": np.zeros(lead, bool),
            "policy_version": np.full(lead, version, np.int64),
        },
        0,
    )


class KeepingHelper:
    """An AgentHelper that keeps every step it is given."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.num_envs = 0

    def attach(self, ct, specs, port, *, num_envs=1):
        self.num_envs = num_envs

    def store(self, step):
        self.steps.append(step)


class AnsweringPort:
    """A CT port that answers each predict request with the actions ``answer(inputs)`` and weights ``version(ticket)``,
    and keeps the payloads it was sent; the agent stops (``StopRequested``) when it waits for answer ``steps + 1``."""

    learn_ahead = 0

    def __init__(self, steps: int, answer) -> None:
        self.steps, self.answer = steps, answer
        self.sent: list[dict] = []

    def send_predict(self, payload):
        self.sent.append(copy.deepcopy(payload))  # kept past the reply, when the agent's views move on in place
        return len(self.sent)

    def wait_predict(self, ticket):
        if ticket > self.steps:
            raise StopRequested()
        return {"actions": self.answer(self.sent[ticket - 1]["inputs"]), "states": {}, "version": self.version(ticket)}

    def version(self, ticket: int) -> int:
        """The weights version of answer ``ticket``."""
        return 0


def received(specs: CTSpecs, payload: dict) -> dict:
    """A learn request as learn() gets it: checked as the CDP checks it, then spelled out (``unpack``)."""
    check_learn(specs, payload)
    return unpack(specs, payload)
