"""Predict requests as they cross from an agent to its CDP: each new frame once.

A CT with trajectory views of its observations (``View.last_observations``:
Atari's last 4 frames, ``obs_frames``) takes those views with every predict
request. Spelled out, each request repeats ``frames - 1`` frames per row that
the request before it held already: for Atari's 8 envs that is 226 KB a step
where 28 KB are new. On the way, a row whose observation views are the
previous request's views of the same row moved on by one step and ending with
this step's observation (its env played on) crosses as a flag:

- ``continued``: bool ``[N]``, the rows whose views the CDP makes from those it
  rebuilt for the agent's last request and the row's observation
  (``inputs[view.key]``);
- ``inputs[name]``: the views of the other rows only, ``[K, frames, ...]`` (an
  episode that started, views a custom agent made otherwise), in row order.

The sender (``ViewsSender``, in the agent's port) compares each view with the
one it sent last (on a local stream, where arrays cross through shared memory,
it sends whole views: ``ViewsSender(whole=True)``), so nothing is assumed from episode flags and a custom agent's
views arrive exactly; a request without ``continued`` carries every view. The
receiver (``ViewsReceiver``, in the CDP) keeps the last views of each agent and
refuses a request that continues views it does not hold. Views of actions and
rewards are small and cross whole. The serial runner's in-process port hands
over the views as they are.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, TypeGuard

import numpy as np

from flare2.core.specs import CTSpecs, View
from flare2.errors import SpecError
from flare2.wire.shared_arrays import in_shared_block

CONTINUED = "continued"
"""The key of the rows whose views continue the request before (see the module docstring)."""

MOST_AGENTS_HELD = 1024
"""The CDP keeps the last views of at most this many agents; the longest silent one is forgotten first."""


def _observation_views(specs: CTSpecs) -> dict[str, View]:
    return {name: view for name, view in specs.views.items() if view.group == "inputs"}


class ViewsSender:
    """The agent's side for one CT: drops the views of rows that continue the request before (module docstring).

    ``whole``: send every view as it is. An agent whose requests cross through shared memory does: there a copy of
    the views costs less than finding the rows that continue (at 64 Atari envs, 0.1 ms against 0.9 ms).
    """

    def __init__(self, specs: CTSpecs, *, whole: bool = False) -> None:
        self.views = {} if whole else _observation_views(specs)
        self._sent: dict[str, np.ndarray] = {}

    def pack(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` as it crosses: the same, or the views of the rows that do not continue and ``continued``."""
        if not self.views:
            return payload
        inputs = payload["inputs"]
        views = {name: np.asarray(inputs[name]) for name in self.views}
        previous, self._sent = self._sent, {name: view.copy() for name, view in views.items()}
        if not previous or any(views[name].shape != previous[name].shape for name in self.views):
            return payload
        continued = np.ones(len(next(iter(views.values()))), bool)
        for name, view in self.views.items():
            moved_on = _rows_equal(views[name][:, :-1], previous[name][:, 1:])
            ends_with_observation = _rows_equal(views[name][:, -1], np.asarray(inputs[view.key]))
            continued &= moved_on & ends_with_observation
        if not continued.any():
            return payload
        restarted = ~continued
        sent_inputs = {key: value for key, value in inputs.items() if key not in self.views}
        sent_inputs.update({name: view[restarted] for name, view in views.items()})
        return {**payload, "inputs": sent_inputs, CONTINUED: continued}


class ViewsReceiver:
    """The CDP's side: rebuilds the views of each agent's requests from its last ones (module docstring)."""

    def __init__(self, specs: CTSpecs) -> None:
        self.specs = specs
        self.views = _observation_views(specs)
        self._last: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()

    def unpack(self, agent_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` with every view spelled out (raises ``SpecError`` naming what does not fit); keeps its views
        for the agent's next request."""
        if not self.views:
            return payload
        previous = self._last.pop(agent_id, None)
        inputs = payload.get("inputs")
        if not isinstance(inputs, dict):
            return payload  # the CDP's check names what is wrong with it
        if CONTINUED not in payload:
            self._keep(agent_id, {name: inputs.get(name) for name in self.views})
            return payload
        continued = payload[CONTINUED]
        if not isinstance(continued, np.ndarray) or continued.dtype != np.bool_ or continued.ndim != 1:
            raise SpecError(f"{CONTINUED!r} must be a 1-d bool array, got {_describe(continued)}")
        rows, restarted = len(continued), ~continued
        if previous is None or len(next(iter(previous.values()))) != rows:
            raise SpecError(
                f"the request continues the views of {rows} rows, but the CT holds none of this agent's of that many: "
                "an agent's first request (or one after its rows changed) must carry every view"
            )
        rebuilt = {}
        for name, view in self.views.items():
            spec = self.specs.inputs[name]
            observation, fresh = inputs.get(view.key), inputs.get(name)
            if not _fits(observation, (rows, *spec.fixed_shape[1:]), spec.dtype):
                raise SpecError(
                    f"inputs[{view.key!r}] must be {spec.dtype} [{rows}, ...] to continue the views of {rows} rows, "
                    f"got {_describe(observation)}"
                )
            expected = (int(restarted.sum()), *spec.fixed_shape)
            if not _fits(fresh, expected, spec.dtype):
                raise SpecError(
                    f"inputs[{name!r}] must hold the views of the rows that do not continue, {spec.dtype} "
                    f"{list(expected)}, got {_describe(fresh)}"
                )
            # Every row moved on by one frame, then the restarted rows overwritten: one pass over the stacks (a
            # boolean index on the continued rows would copy them twice).
            views = np.empty_like(previous[name])
            views[:, :-1] = previous[name][:, 1:]
            views[:, -1] = observation
            views[restarted] = fresh
            rebuilt[name] = views
        self._hold(agent_id, rebuilt)
        spelled_out = {key: value for key, value in payload.items() if key != CONTINUED}
        spelled_out["inputs"] = {**inputs, **rebuilt}
        return spelled_out

    def forget(self, agent_ids: set[str] | frozenset[str]) -> None:
        """Agents that left: their views go."""
        for agent_id in agent_ids:
            self._last.pop(agent_id, None)

    def _keep(self, agent_id: str, views: dict[str, Any]) -> None:
        """Keep a request's views when they are as the specs say and of one row count; others are refused by the
        CDP's check, and nothing can continue them. Kept as they are, not copied: a decoded message's arrays are
        read-only views of its bytes or copies of its own (``flare2.wire.codec``), and the model gets a batch made of
        copies (``ComputationDataProcessor``)."""
        specs = self.specs.inputs
        if not all(isinstance(views[name], np.ndarray) and views[name].ndim >= 1 for name in self.views):
            return
        if any(in_shared_block(views[name]) for name in self.views):
            return  # its region is reused once it is answered; an agent that shares arrays sends whole views anyway
        rows = len(next(iter(views.values())))
        if all(_fits(views[name], (rows, *specs[name].fixed_shape), specs[name].dtype) for name in self.views):
            self._hold(agent_id, dict(views))

    def _hold(self, agent_id: str, views: dict[str, np.ndarray]) -> None:
        self._last[agent_id] = views
        while len(self._last) > MOST_AGENTS_HELD:
            self._last.popitem(last=False)


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether each row of ``a`` holds the same bytes as ``b``'s (same shape and dtype), compared 8 bytes at a time
    where the rows allow it: a frame stack is compared in an eighth of the steps."""
    rows = len(a)
    a, b = a.reshape(rows, -1), b.reshape(rows, -1)
    if a.dtype == b.dtype and a.shape[1] * a.itemsize % 8 == 0:
        try:
            a, b = a.view(np.uint64), b.view(np.uint64)
        except ValueError:  # a row's bytes are not laid out one after another, or not on 8-byte boundaries
            pass
    return (a == b).all(axis=1)


def _fits(value: Any, shape: tuple[int, ...], dtype: str) -> TypeGuard[np.ndarray]:
    return isinstance(value, np.ndarray) and value.shape == shape and value.dtype == dtype


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__
