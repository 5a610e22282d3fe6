"""Agent helpers: how stored steps become learn requests."""

from __future__ import annotations

from typing import Any

import numpy as np

from flare2.core.agent import AgentHelper
from flare2.core.specs import STEP_FLAG_SPECS, CTSpecs
from flare2.errors import ConfigError
from flare2.wire.ragged import stack_time

def stack_steps(steps: list[dict[str, Any]], specs: CTSpecs) -> dict[str, Any]:
    """Stack T steps of K rows into a learn payload of K sequences, ``[K, T, ...]``, with the spec dtypes."""
    payload: dict[str, Any] = {
        group: {
            name: stack_time([step[group][name] for step in steps]).astype(spec.dtype, copy=False)
            for name, spec in specs_of_group.items()
        }
        for group, specs_of_group in specs.experience_specs().items()
    }
    for flag, spec in STEP_FLAG_SPECS.items():
        payload[flag] = np.stack([step[flag] for step in steps], axis=1).astype(spec.dtype, copy=False)
    return payload


class OnlineHelper(AgentHelper):
    """Every ``sample_interval`` steps, send those steps of every env as one learn request ``[K, T, ...]``.

    Steps run across episode ends: the episode flags in the request tell the
    algorithm where one episode stopped and how (DESIGN §6). Whether the agent
    waits for ``learn()`` before it plays on is the CT's ``learn_ahead``.
    """

    def __init__(self, sample_interval: int = 5) -> None:
        if sample_interval < 1:
            raise ConfigError(f"OnlineHelper.sample_interval must be >= 1, got {sample_interval}")
        self.sample_interval = sample_interval
        self._steps: list[dict[str, Any]] = []

    def store(self, step: dict[str, Any]) -> None:
        self._steps.append(step)
        if len(self._steps) >= self.sample_interval:
            payload = stack_steps(self._steps, self.specs)
            self._steps = []
            self.port.learn(payload)


class ExpReplayHelper(AgentHelper):
    """A replay buffer in the agent process (FLARE's design): store every step, learn from random samples.

    Once ``warmup`` steps are stored, it sends one learn request of
    ``batch_size`` sequences of ``sequence_length`` consecutive steps of one
    env (1 for single transitions) per ``sample_interval`` env steps stored
    (counted over all the agent's envs; K envs may make several due at once,
    and they go out as one request of that many times ``batch_size``).
    A sequence may run across an episode end: its ``terminated``/``truncated``
    flags say where and how, and ``states`` hold the model states before each
    step, so a recurrent learner can restart its states there.

    Memory is bounded: ``capacity`` steps (K envs keep ``capacity / K`` steps
    each), preallocated when the helper is attached; ``nbytes`` gives the exact
    size (every spec array of a step, inputs twice for ``next_inputs``, and the
    step flags).
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
        """Steps held per env (time rows of the buffer)."""
        self.stored = 0
        """Env steps stored so far, over all envs."""
        self._intervals_seen = 0
        self._next = 0
        self._rows = 0
        self._buffers: dict[str, dict[str, np.ndarray]] = {}
        self._flags: dict[str, np.ndarray] = {}

    def attach(self, ct: str, specs: CTSpecs, port: Any, *, num_envs: int = 1) -> None:
        super().attach(ct, specs, port, num_envs=num_envs)
        ragged = [f"{group}[{name!r}]" for group, specs_of_group in specs.experience_specs().items()
                  for name, spec in specs_of_group.items() if spec.ragged]
        if ragged:
            raise ConfigError(
                f"ExpReplayHelper keeps fixed-size arrays, but CT {ct!r} has ragged {', '.join(ragged)}: learn from "
                "them with OnlineHelper, or give the spec a fixed shape"
            )
        # Time-major, one column per env, so that a sequence is consecutive steps of one env.
        self._rows = max(-(-self.capacity // num_envs), self.sequence_length)
        self._buffers = {
            group: {name: np.zeros((self._rows, num_envs, *spec.shape), spec.dtype) for name, spec in specs_of_group.items()}
            for group, specs_of_group in specs.experience_specs().items()
        }
        self._flags = {name: np.zeros((self._rows, num_envs), spec.dtype) for name, spec in STEP_FLAG_SPECS.items()}

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
        self._next = (index + 1) % self._rows
        self.size = min(self.size + 1, self._rows)
        self.stored += self.num_envs
        intervals = self.stored // self.sample_interval
        due, self._intervals_seen = intervals - self._intervals_seen, intervals
        if due and self.size * self.num_envs >= self.warmup and self.size >= self.sequence_length:
            self.port.learn(self.sample(due * self.batch_size))

    def sample(self, count: int) -> dict[str, Any]:
        """A learn payload of ``count`` random sequences, ``[count, sequence_length, ...]``, oldest step first."""
        length = self.sequence_length
        if self.size < length:
            raise ValueError(f"the buffer holds {self.size} steps per env, fewer than one sequence of {length}")
        oldest = (self._next - self.size) % self._rows
        # Sequences start anywhere among the stored steps but never run past the newest one.
        starts = self.rng.integers(0, self.size - length + 1, size=count)
        rows = (oldest + starts[:, None] + np.arange(length)[None, :]) % self._rows
        envs = self.rng.integers(0, self.num_envs, size=count)[:, None]
        payload: dict[str, Any] = {
            group: {name: array[rows, envs] for name, array in arrays.items()} for group, arrays in self._buffers.items()
        }
        payload.update({name: array[rows, envs] for name, array in self._flags.items()})
        return payload
