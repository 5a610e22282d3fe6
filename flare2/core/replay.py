"""The replay buffer an agent process keeps (``ExpReplayHelper``): FLARE's off-policy helper, which stores every step
and sends learn requests of random samples."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from flare2.core.helpers import ROW_IDS, AgentHelper, pop_row_ids
from flare2.core.learn_requests import pack
from flare2.core.specs import STEP_FLAG_SPECS, CTSpecs
from flare2.core.views import EpisodeAges, view_context
from flare2.errors import ConfigError


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

    **Columns.** The buffer keeps a column per env, each a ring of its own
    steps. A step of all K envs fills one step of every column. A step whose
    rows come and go (the agents of a multi-agent env: a turn-based game's
    agent acts every other step, an agent that dies waits for its game to
    restart) carries each row's id (``ROW_IDS``, as for ``FragmentsHelper``)
    and fills only the columns of those ids: each id gets a column the first
    time it is seen, and a sequence is then consecutive steps of one agent.
    Sequences are drawn uniformly among all those the columns hold.

    Memory is bounded: ``capacity`` steps (K envs keep ``capacity / K`` steps
    each), preallocated when the helper is attached; ``nbytes`` gives the exact
    size (every spec array of a step, its inputs once, and the
    step flags). Each observation is kept once: a step's next inputs are the
    following step's inputs, and only those that are not (an episode's final
    observation, which a reset replaced) are kept apart, as Dopamine's replay
    buffer does; 100k Atari steps of 84x84 frames take 0.7 GB. A CT's views are
    not kept: each sample rebuilds them from the steps before it and their ages
    in their episodes (``with_views``), and sequences start late enough that
    those steps are still in the buffer.
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
        self.sizes = np.zeros(0, np.int64)
        """Steps held by each column."""
        self.stored = 0
        """Env steps stored so far, over all envs."""
        self._intervals_seen = 0
        self._next = np.zeros(0, np.int64)  # each column's next time row
        self._column_ids = np.zeros(0, np.int64)
        self._rows = 0
        self._column_of: dict[int, int] = {}
        self._buffers: dict[str, dict[str, np.ndarray]] = {}
        self._flags: dict[str, np.ndarray] = {}
        self._context = 0
        self._episode_ages = EpisodeAges(1)
        self._ages = np.zeros((0, 1), np.int64)
        # The next inputs that are not the following step's inputs, by (row, column), and where there are some.
        self._finals: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        self._has_final = np.zeros((0, 1), bool)
        self._newest_next: dict[str, np.ndarray] = {}

    def attach(self, ct: str, specs: CTSpecs, port: Any, *, num_envs: int = 1) -> None:
        super().attach(ct, specs, port, num_envs=num_envs)
        ragged = [
            f"{group}[{name!r}]"
            for group, specs_of_group in specs.experience_specs().items()
            for name, spec in specs_of_group.items()
            if spec.ragged
        ]
        if ragged:
            raise ConfigError(
                f"ExpReplayHelper keeps fixed-size arrays, but CT {ct!r} has ragged {', '.join(ragged)}: learn from "
                "them with OnlineHelper, or give the spec a fixed shape"
            )
        # Time-major, one column per env, so that a sequence is consecutive steps of one env.
        self._context = view_context(specs)
        self._rows = max(-(-self.capacity // num_envs), self.sequence_length + self._context)
        # No spec is ragged (refused above), so every dim of every shape is a size.
        self._buffers = {
            group: {
                name: np.zeros((self._rows, num_envs, *cast("tuple[int, ...]", spec.shape)), spec.dtype)
                for name, spec in specs_of_group.items()
            }
            for group, specs_of_group in specs.stored_specs().items()
            if group != "next_inputs"
        }
        self._newest_next = {name: np.zeros_like(array[0]) for name, array in self._buffers["inputs"].items()}
        self._flags = {name: np.zeros((self._rows, num_envs), spec.dtype) for name, spec in STEP_FLAG_SPECS.items()}
        self._has_final = np.zeros((self._rows, num_envs), bool)
        self._next = np.zeros(num_envs, np.int64)
        self._column_ids = np.arange(num_envs)
        self.sizes = np.zeros(num_envs, np.int64)
        if specs.views:
            self._episode_ages = EpisodeAges(num_envs)
            self._ages = np.zeros((self._rows, num_envs), np.int64)

    def largest_request(self) -> tuple[int, int] | None:
        """``batch_size`` sequences for each ``sample_interval`` env steps one store of the agent's envs makes due."""
        return self.batch_size * -(-self.num_envs // self.sample_interval), self.sequence_length

    @property
    def nbytes(self) -> int:
        arrays = [
            *self._flags.values(),
            self._ages,
            self._has_final,
            self._next,
            self.sizes,
            *self._newest_next.values(),
            *(a for group in self._buffers.values() for a in group.values()),
            *(a for final in self._finals.values() for a in final.values()),
        ]
        return sum(array.nbytes for array in arrays)

    def store(self, step: dict[str, Any]) -> None:
        columns = self._columns(pop_row_ids(step, type(self).__name__), len(step["terminated"]))
        ids = self._column_ids[columns]
        # Every env's row fills one time row of all the columns, which advance together: basic indexing, the fastest.
        index = int(self._next[0]) if isinstance(columns, slice) else self._next[columns]
        at = np.broadcast_to(index, ids.shape)
        # The previous step's next inputs of a column that are not this step's inputs are kept apart.
        previous = (index - 1) % self._rows
        differs = np.zeros(len(ids), bool)
        for name, newest in self._newest_next.items():
            differs |= (newest[columns] != step["inputs"][name]).reshape(len(ids), -1).any(-1)
        differs &= self.sizes[columns] > 0
        for row in np.flatnonzero(differs):
            column = int(ids[row])
            self._finals[(int(at[row] - 1) % self._rows, column)] = {
                name: newest[column].copy() for name, newest in self._newest_next.items()
            }
        self._has_final[previous, columns] = differs
        for row in np.flatnonzero(self._has_final[index, columns]):
            del self._finals[(int(at[row]), int(ids[row]))]
        self._has_final[index, columns] = False
        for name, newest in self._newest_next.items():
            newest[columns] = step["next_inputs"][name]
        for group, arrays in self._buffers.items():
            for name, array in arrays.items():
                array[index, columns] = step[group][name]
        for name, array in self._flags.items():
            array[index, columns] = step[name]
        if self.specs.views:
            self._ages[index, columns] = self._episode_ages.of(step, ids)
        self._next[columns] = (index + 1) % self._rows
        self.sizes[columns] = np.minimum(self.sizes[columns] + 1, self._rows)
        self.stored += len(ids)
        intervals = self.stored // self.sample_interval
        due, self._intervals_seen = intervals - self._intervals_seen, intervals
        if due and self.sizes.sum() >= self.warmup and self._sequence_starts().sum():
            self.port.learn(self.sample(due * self.batch_size))

    def _columns(self, row_ids: np.ndarray | None, rows: int) -> np.ndarray | slice:
        """The columns of a step's rows: every env's in order (a slice), or those of the rows' ids (class docstring)."""
        if row_ids is None:
            if rows != self.num_envs or self._column_of:
                raise ConfigError(
                    f"a step of {rows} rows without {ROW_IDS!r} reached the replay buffer of CT {self.ct!r}, which "
                    f"keeps a column for each of {self.num_envs} envs (or row ids, once steps name them): store "
                    f"every env's row at every step, or give every step's {ROW_IDS!r}"
                )
            return slice(None)
        for row_id in row_ids.tolist():
            if row_id not in self._column_of:
                if len(self._column_of) == self.num_envs:
                    raise ConfigError(
                        f"the replay buffer of CT {self.ct!r} keeps {self.num_envs} columns, one per row id, and "
                        f"row id {row_id} is one more: the agent's rows_stored() must count every row id its steps "
                        "carry"
                    )
                self._column_of[row_id] = len(self._column_of)
        return np.array([self._column_of[row_id] for row_id in row_ids.tolist()], np.int64)

    def _first_starts(self) -> np.ndarray:
        """Each column's first step a sequence may start at: its views reach back ``context`` steps, which must not
        be overwritten ones (until a column is full, the steps before its oldest are the start of its first
        episodes, age 0 says so, never read)."""
        return np.where(self.sizes == self._rows, self._context, 0)

    def _sequence_starts(self) -> np.ndarray:
        """How many sequences each column holds: they start from its first start on, and never run past its newest
        step."""
        return np.maximum(self.sizes - self.sequence_length + 1 - self._first_starts(), 0)

    def sample(self, count: int) -> dict[str, Any]:
        """A learn request (``pack``) of ``count`` random sequences of ``sequence_length`` steps, oldest step first."""
        length = self.sequence_length
        starts_of = self._sequence_starts()
        if not starts_of.sum():
            raise ValueError(f"no column of the buffer holds a sequence of {length} steps: it holds {self.sizes}")
        # A draw among all the sequences the columns hold: its column, then its start there.
        ends = np.cumsum(starts_of)
        draws = self.rng.integers(0, int(ends[-1]), size=count)
        envs = np.searchsorted(ends, draws, side="right")
        starts = self._first_starts()[envs] + draws - (ends[envs] - starts_of[envs])
        oldest = (self._next[envs] - self.sizes[envs]) % self._rows
        context = self._context if self.specs.views else 0
        rows = (oldest[:, None] + starts[:, None] + np.arange(-context, length)[None, :]) % self._rows
        envs = envs[:, None]
        payload: dict[str, Any] = {
            group: {name: array[rows, envs] for name, array in arrays.items()}
            for group, arrays in self._buffers.items()
        }
        payload["next_inputs"] = self._next_inputs(rows, envs)
        payload.update({name: array[rows, envs] for name, array in self._flags.items()})
        return pack(self.specs, payload, context, self._ages[rows, envs] if self.specs.views else None)

    def _next_inputs(self, rows: np.ndarray, envs: np.ndarray) -> dict[str, np.ndarray]:
        """The next inputs of the steps at ``rows`` of ``envs``: the following rows' inputs, but each column's newest
        step's own and those kept apart."""
        following = (rows + 1) % self._rows
        next_inputs = {name: array[following, envs] for name, array in self._buffers["inputs"].items()}
        envs_of = np.broadcast_to(envs, rows.shape)
        newest = (self._next - 1) % self._rows  # each column's newest row
        for at in zip(*np.nonzero((rows == newest[envs]) | self._has_final[rows, envs])):
            row, env = int(rows[at]), int(envs_of[at])
            kept = self._newest_next if row == newest[env] else self._finals[(row, env)]
            for name, values in next_inputs.items():
                values[at] = kept[name][env] if row == newest[env] else kept[name]
        return next_inputs
