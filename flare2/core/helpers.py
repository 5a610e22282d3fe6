"""Agent helpers: how stored steps become learn requests, and the port to a CT that agents and helpers send through."""

from __future__ import annotations

from typing import Any, Protocol

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
