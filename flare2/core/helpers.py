"""Agent helpers: how stored steps become learn requests."""

from __future__ import annotations

from typing import Any

import numpy as np

from flare2.core.agent import AgentHelper
from flare2.errors import ConfigError

_ARRAY_GROUPS = ("inputs", "next_inputs", "actions", "rewards", "states")


def stack_steps(steps: list[dict[str, Any]], specs: Any) -> dict[str, Any]:
    """Stack per-step dicts into a learn payload of one sequence, ``[1, T, ...]``, with the spec dtypes."""
    groups = {"inputs": specs.inputs, "next_inputs": specs.inputs, "actions": specs.actions,
              "rewards": specs.rewards, "states": specs.states}
    payload: dict[str, Any] = {}
    for group in _ARRAY_GROUPS:
        payload[group] = {
            name: np.asarray([[step[group][name] for step in steps]], dtype=spec.dtype)
            for name, spec in groups[group].items()
        }
    payload["terminated"] = np.array([[step["terminated"] for step in steps]], dtype=bool)
    payload["truncated"] = np.array([[step["truncated"] for step in steps]], dtype=bool)
    return payload


class OnlineHelper(AgentHelper):
    """Every ``sample_interval`` steps, send those steps as one learn request and wait for the result.

    Steps run across episode ends: the episode flags in the request tell the
    algorithm where one episode stopped and how (DESIGN §6).
    """

    def __init__(self, sample_interval: int = 5) -> None:
        if sample_interval < 1:
            raise ConfigError(f"OnlineHelper.sample_interval must be >= 1, got {sample_interval}")
        self.sample_interval = sample_interval
        self._steps: list[dict[str, Any]] = []
        self.last_costs: dict[str, float] = {}

    def store(self, step: dict[str, Any]) -> None:
        self._steps.append(step)
        if len(self._steps) >= self.sample_interval:
            payload = stack_steps(self._steps, self.specs)
            self._steps = []
            self.last_costs = self.port.learn(payload).get("costs", {})


class ExpReplayHelper(AgentHelper):
    """A replay buffer in the agent process (FLARE's design): store every step, learn from random samples.

    Once ``warmup`` steps are stored, every ``sample_interval`` stored steps it
    sends one learn request of ``batch_size`` sequences of ``sequence_length``
    consecutive steps (1 for single transitions) and waits for the result.
    A sequence may run across an episode end: its ``terminated``/``truncated``
    flags say where and how, and ``states`` hold the model states before each
    step, so a recurrent learner can restart its states there.

    Memory is bounded: ``capacity`` steps, preallocated when the helper is
    attached; ``nbytes`` gives the exact size (every spec array of a step,
    inputs twice for ``next_inputs``, and two flag bytes).
    """

    def __init__(
        self,
        *,
        capacity: int = 10_000,
        warmup: int = 1_000,
        sample_interval: int = 4,
        batch_size: int = 32,
        sequence_length: int = 1,
        seed: int | None = None,
    ) -> None:
        if capacity < 1 or batch_size < 1 or sample_interval < 1 or sequence_length < 1:
            raise ConfigError("ExpReplayHelper needs capacity, batch_size, sample_interval and sequence_length >= 1")
        if not sequence_length <= warmup <= capacity:
            raise ConfigError(
                f"ExpReplayHelper needs sequence_length <= warmup <= capacity, got {sequence_length}, {warmup}, {capacity}"
            )
        self.capacity, self.warmup, self.sample_interval = capacity, warmup, sample_interval
        self.batch_size, self.sequence_length = batch_size, sequence_length
        self.rng = np.random.default_rng(seed)
        self.size = 0
        self.stored = 0
        self.last_costs: dict[str, float] = {}
        self._next = 0
        self._buffers: dict[str, dict[str, np.ndarray]] = {}
        self._flags: dict[str, np.ndarray] = {}

    def attach(self, ct: str, specs: Any, port: Any) -> None:
        super().attach(ct, specs, port)
        groups = {"inputs": specs.inputs, "next_inputs": specs.inputs, "actions": specs.actions,
                  "rewards": specs.rewards, "states": specs.states}
        self._buffers = {
            group: {name: np.zeros((self.capacity, *spec.shape), spec.dtype) for name, spec in group_specs.items()}
            for group, group_specs in groups.items()
        }
        self._flags = {name: np.zeros(self.capacity, bool) for name in ("terminated", "truncated")}

    @property
    def nbytes(self) -> int:
        arrays = [*self._flags.values(), *(a for group in self._buffers.values() for a in group.values())]
        return sum(array.nbytes for array in arrays)

    def store(self, step: dict[str, Any]) -> None:
        index = self._next
        for group, arrays in self._buffers.items():
            for name, array in arrays.items():
                array[index] = step[group][name]
        for name, array in self._flags.items():
            array[index] = step[name]
        self._next = (index + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)
        self.stored += 1
        if self.size >= self.warmup and self.stored % self.sample_interval == 0:
            self.last_costs = self.port.learn(self.sample(self.batch_size)).get("costs", {})

    def sample(self, count: int) -> dict[str, Any]:
        """A learn payload of ``count`` random sequences, ``[count, sequence_length, ...]``, oldest step first."""
        length = self.sequence_length
        if self.size < length:
            raise ValueError(f"the buffer holds {self.size} steps, fewer than one sequence of {length}")
        oldest = (self._next - self.size) % self.capacity
        # Sequences start anywhere among the stored steps but never run past the newest one.
        starts = self.rng.integers(0, self.size - length + 1, size=count)
        rows = (oldest + starts[:, None] + np.arange(length)[None, :]) % self.capacity
        payload: dict[str, Any] = {
            group: {name: array[rows] for name, array in arrays.items()} for group, arrays in self._buffers.items()
        }
        payload.update({name: array[rows] for name, array in self._flags.items()})
        return payload
