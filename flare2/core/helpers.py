"""Agent helpers: how stored steps become learn requests, and the port to a CT that agents and helpers send through."""

from __future__ import annotations

from typing import Any, Protocol, cast

import numpy as np

from flare2.core.learn_requests import pack
from flare2.core.specs import STEP_FLAG_SPECS, CTSpecs
from flare2.core.views import EpisodeAges, view_context, with_views
from flare2.errors import ConfigError
from flare2.wire.ragged import Ragged, concat_time, stack_time

ROW_IDS = "row_ids"
"""The key of a stored step's row ids (int64 ``[K]``), where its rows come and go: one int per row, the same for an
agent's place in its game from one episode to the next (``FragmentsHelper``, ``ExpReplayHelper``)."""


def pop_row_ids(step: dict[str, Any], helper: str) -> np.ndarray | None:
    """A stored step's ``ROW_IDS``, taken out of it (None where it has none); a ConfigError naming ``helper`` where
    they are not an int array of one id per row."""
    ids = step.pop(ROW_IDS, None)
    if ids is not None and (
        not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu" or ids.shape != np.shape(step["terminated"])
    ):
        raise ConfigError(f"{helper} needs each step's {ROW_IDS!r} as an int array of one id per row, got {ids!r}")
    return ids


class CTPort(Protocol):
    """How an agent reaches one ComputationTask (the runtime provides it)."""

    learn_ahead: int
    """Learn requests that may be on their way before ``learn`` waits for the oldest reply (the CT says)."""

    def send_predict(self, payload: dict[str, Any]) -> int:
        """Send a predict request without waiting; returns the ticket ``wait_predict`` takes. The payload's arrays
        may change once its reply is waited for (an agent's frame stacks move on in place): a port that keeps them
        longer keeps copies."""

    def wait_predict(self, ticket: int) -> dict[str, Any]:
        """The reply to the request of ``ticket``: ``actions``, ``states`` and the weights' ``version``."""

    def learn(self, payload: dict[str, Any]) -> None:
        """Send a learn request; returns once no more than ``learn_ahead`` requests await their reply."""

    def send_statistics(self, payload: dict[str, Any]) -> int:
        """Send an agent's new observation counts (``flare2.core.transforms``); returns the ticket ``wait_statistics`` takes."""

    def wait_statistics(self, ticket: int) -> dict[str, Any]:
        """The reply to the statistics of ``ticket``: the run's merged ``moments``."""


class AgentHelper:
    """Decides what stored steps become learn requests, and when.

    ``store`` gets one step of every env of the agent: each array has a
    leading dimension of K rows (one per env, K = 1 for an ``Agent``); the
    flags ``terminated``, ``truncated`` and ``policy_version`` are arrays of
    K. A learn request holds N sequences of T consecutive steps of one env
    each, every array ``[N, T, ...]``.
    """

    def attach(self, ct: str, specs: CTSpecs, port: CTPort, *, num_envs: int = 1) -> None:
        self.ct, self.specs, self.port, self.num_envs = ct, specs, port, num_envs

    def store(self, step: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define store()")

    def largest_request(self) -> tuple[int, int] | None:
        """The sequences and steps of the largest learn request it will send, where it knows them before it
        stores a step (the runtime checks them against the message limit at the start); None where it cannot."""
        return None


class AskOnlyHelper(AgentHelper):
    """The helper of a CT an agent asks and does not teach: a frozen copy of another (self-play's opponent,
    ``CTConfig.follows``), whose steps are let go."""

    def store(self, step: dict[str, Any]) -> None:
        pass


def stack_steps(steps: list[dict[str, Any]], specs: CTSpecs) -> dict[str, Any]:
    """T stored steps of K rows as K sequences ``[K, T, ...]`` in the spec dtypes: every group a helper keeps
    (``CTSpecs.stored_specs``: no views) and the step flags. ``pack`` makes the learn request of them."""
    payload: dict[str, Any] = {
        group: {
            name: stack_time([step[group][name] for step in steps]).astype(spec.dtype, copy=False)
            for name, spec in specs_of_group.items()
        }
        for group, specs_of_group in specs.stored_specs().items()
    }
    for flag, spec in STEP_FLAG_SPECS.items():
        payload[flag] = np.stack([step[flag] for step in steps], axis=1).astype(spec.dtype, copy=False)
    return payload


def spelled_out(specs: CTSpecs, stored: dict[str, Any], ages: np.ndarray | None, context: int) -> dict[str, Any]:
    """Stored steps ``[K, context + T, ...]`` as learn() will see them, ``[K, T, ...]`` with the views: what
    ``postprocess`` gets (every group but the views are views of ``stored``, so that what it writes is sent)."""
    if not specs.views:
        return stored  # no step is kept for views alone: context is 0
    assert ages is not None, "a CT with views keeps its steps' ages"
    return with_views(specs, stored, ages, context)


class OnlineHelper(AgentHelper):
    """Send the steps of every env as they come, in one of two batch modes.

    **Truncated fragments** (the default): every ``sample_interval`` steps,
    those steps of every env go as one learn request ``[K, T, ...]``. Steps
    run across episode ends: the episode flags tell the algorithm where one
    episode stopped and how (docs/architecture.md: Episode edges), and it bootstraps from the
    ``next_inputs`` of a fragment's last step. Learning starts after a few
    steps, memory is fixed, and the requests of all agents batch together.

    **Complete episodes** (``complete_episodes=True``): each env's steps are
    kept until its episode ends; once ended episodes hold at least
    ``sample_interval * K`` steps, they go as one request ``[1, T, ...]``,
    episode after episode in time (the flags mark where each ends, and every
    sequence ends with an episode's end). Nothing is bootstrapped from a cut,
    and ``postprocess`` sees whole episodes (Monte-Carlo returns, hindsight
    relabelling); but a long episode is learned from only when it ends, the
    helper keeps every step of an unfinished one, and requests of different
    lengths are learned one at a time (the CDP batches sequences of one length).

    ``postprocess(sequence)`` runs on each env's part of a request before it
    goes (one whole episode with complete episodes, one fragment otherwise):
    override it to fill the CT's ``extras`` (RLlib's ``postprocess_trajectory``).

    Whether the agent waits for ``learn()`` before it plays on is the CT's ``learn_ahead``.
    """

    def __init__(self, sample_interval: int = 5, *, complete_episodes: bool = False) -> None:
        if sample_interval < 1:
            raise ConfigError(f"OnlineHelper.sample_interval must be >= 1, got {sample_interval}")
        self.sample_interval = sample_interval
        self.complete_episodes = complete_episodes
        self._steps: list[dict[str, Any]] = []
        self._postprocessing = type(self).postprocess is not OnlineHelper.postprocess
        # With views: each kept step's age in its episode, and how many kept steps are only there for their frames.
        self._episode_ages = EpisodeAges(1)
        self._ages: list[np.ndarray] = []
        self._context = 0
        # Complete episodes: the steps kept start at step _first; env i's episode started at step _starts[i].
        self._first = 0
        self._starts = np.zeros(1, np.int64)
        self._ended: list[tuple[dict[str, Any], np.ndarray | None]] = []
        self._ended_steps = 0

    def attach(self, ct: str, specs: CTSpecs, port: Any, *, num_envs: int = 1) -> None:
        super().attach(ct, specs, port, num_envs=num_envs)
        self._starts = np.zeros(num_envs, np.int64)
        self._episode_ages = EpisodeAges(num_envs)

    def largest_request(self) -> tuple[int, int] | None:
        """Every env's ``sample_interval`` steps; unknown for whole episodes, which may be of any length."""
        return None if self.complete_episodes else (self.num_envs, self.sample_interval)

    def postprocess(self, sequence: dict[str, Any]) -> None:
        """Change one env's sequence in place before it is sent: groups and flags as in a learn request, each array
        ``[T, ...]`` (views of the request: write into them, e.g. ``sequence["extras"]["returns"][:] = ...``)."""

    def store(self, step: dict[str, Any]) -> None:
        self._steps.append(step)
        if self.specs.views:
            self._ages.append(self._episode_ages.of(step))
        if self.complete_episodes:
            self._store_for_episodes(step)
        elif len(self._steps) - self._context >= self.sample_interval:
            stored = stack_steps(self._steps, self.specs)
            ages = np.stack(self._ages, axis=1) if self.specs.views else None
            if self._postprocessing:
                steps = spelled_out(self.specs, stored, ages, self._context)
                for env in range(self.num_envs):
                    self.postprocess(_sequence(steps, lambda value, env=env: _only_sequence(value[env : env + 1])))
            payload = pack(self.specs, stored, self._context, ages)
            # The next request's first views reach back into these steps.
            self._context = min(view_context(self.specs), len(self._steps))
            self._steps = self._steps[len(self._steps) - self._context :]
            self._ages = self._ages[len(self._ages) - self._context :]
            self.port.learn(payload)

    def _store_for_episodes(self, step: dict[str, Any]) -> None:
        now = self._first + len(self._steps) - 1
        for env in np.flatnonzero(step["terminated"] | step["truncated"]):
            start = self._starts[env] - self._first
            window = stack_steps(self._steps[start:], self.specs)
            episode = _sequence(window, lambda value, env=env: value[[env]])
            ages = np.stack(self._ages[start:], axis=1)[[env]] if self.specs.views else None
            if self._postprocessing:
                self.postprocess(_sequence(spelled_out(self.specs, episode, ages, 0), _only_sequence))
            self._ended.append((episode, ages))
            self._ended_steps += len(episode["terminated"][0])
            self._starts[env] = now + 1
        done = int(self._starts.min()) - self._first
        if done:
            del self._steps[:done]
            del self._ages[:done]
            self._first += done
        if self._ended_steps >= self.sample_interval * self.num_envs:
            ended, self._ended, self._ended_steps = self._ended, [], 0
            episodes = [episode for episode, _ in ended]
            stored = {
                key: {name: concat_time([e[key][name] for e in episodes]) for name in value}
                if isinstance(value, dict)
                else concat_time([e[key] for e in episodes])
                for key, value in episodes[0].items()
            }
            ages = np.concatenate([ages for _, ages in ended], axis=1) if self.specs.views else None
            self.port.learn(pack(self.specs, stored, 0, ages))


def _sequence(payload: dict[str, Any], take: Any) -> dict[str, Any]:
    """``take`` applied to every array of a learn payload."""
    return {
        key: {name: take(array) for name, array in value.items()} if isinstance(value, dict) else take(value)
        for key, value in payload.items()
    }


def _only_sequence(value: Any) -> Any:
    """The one sequence of ``[1, T, ...]``, as ``[T, ...]`` (a view)."""
    return Ragged(value.values, value.lengths[0]) if isinstance(value, Ragged) else value[0]


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
