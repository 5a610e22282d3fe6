"""Predict requests as they cross from an agent on another machine to its CDP: each new frame once.

A CT with trajectory views of its observations (``View.last_observations``:
Atari's last 4 frames, ``obs_frames``) takes those views with every predict
request. Spelled out, each request repeats ``frames - 1`` frames per row that
the request before it held already: for Atari's 8 envs that is 226 KB a step
where 28 KB are new. On the way, a row whose observation views are the
previous request's views of the same row moved on by one step and ending with
this step's observation (its env played on) crosses as a flag:

- ``continued``: bool ``[N]``, the rows whose views the CDP makes from those it
  holds of the agent's last request and the row's observation
  (``inputs[view.key]``); all False starts the agent's views afresh;
- ``inputs[name]``: the views of the other rows only, ``[K, frames, ...]`` (an
  episode that started, views a custom agent made otherwise), in row order.

The sender (``ViewsSender``, in the agent's port) learns which rows continue
from the views themselves where ``ViewRows`` handed them out as they are
(``flare2.core.views.continuation_of``: the stock agents' way); other views it
compares with those it sent last, so a custom agent's views arrive exactly.
A local agent's views go through shared memory as they are, without
``continued``, and the CDP keeps nothing of them: ``ViewRows`` keeps its
frames where the compute process reads them in place
(``flare2.wire.shared_arrays``), and other views are copied, which costs less
than comparing them. The receiver
(``ViewsReceiver``, in the CDP) keeps a copy of the last views of each agent as
a ring of frames (``flare2.core.views.FrameRing``), hands each request's views
to the CT as a view of it, and refuses a request that continues views it
does not hold. Views of actions and rewards are small and cross whole. The
serial runner's in-process port hands over the views as they are.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, TypeGuard

import numpy as np

from flare2.core.specs import CTSpecs, View
from flare2.core.views import FrameRing, continuation_of
from flare2.errors import SpecError
from flare2.wire.shared_arrays import in_shared_memory

CONTINUED = "continued"
"""The key of the rows whose views continue the request before (see the module docstring)."""

VIEWS_OF = "views_of"
"""The key of which of the agent's streams of views a request's continue (an int; 0 where it is left out): the
views of each ``ViewRows`` of the agent (two, where its envs play in two alternating halves), and 0 for views it
compares."""

MOST_AGENTS_HELD = 1024
"""The CDP keeps the last views of at most this many streams of views (see ``VIEWS_OF``) of all its agents; the
longest silent one is forgotten first."""
MOST_STREAMS = 64
"""The most streams of views one agent's port keeps apart (``VIEWS_OF`` from 1 to this)."""


def _observation_views(specs: CTSpecs) -> dict[str, View]:
    return {name: view for name, view in specs.views.items() if view.group == "inputs"}


class ViewsSender:
    """The agent's side for one CT: drops the views of rows that continue the request before (module docstring).

    Views that ``ViewRows.current`` handed out say which rows continue (``continuation_of``), and those rows cross
    as a flag. Other views (copies, concatenations, a custom agent's) are compared with those sent before, row by
    row. ``whole`` (through shared memory): every view is sent as it is, read in place or copied (at 64 Atari envs a
    copy takes 0.1 ms, the comparison 0.9 ms).
    """

    def __init__(self, specs: CTSpecs, *, whole: bool = False) -> None:
        self.views = _observation_views(specs)
        self._whole = whole
        self._sent: dict[str, np.ndarray] = {}
        """Copies of the views last sent, when the next request's may have to be compared with them."""
        self._streams: OrderedDict[int, tuple[int, int | None]] = OrderedDict()
        """By the source of views ``ViewRows`` handed out: its stream (``VIEWS_OF``) and the generation last sent."""

    def pack(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` as it crosses: the same, or the views of the rows that do not continue and ``continued``."""
        if not self.views or self._whole:
            return payload
        inputs = payload["inputs"]
        views = {name: np.asarray(inputs[name]) for name in self.views}
        rows = len(next(iter(views.values())))
        marks = {continuation_of(inputs[name]) for name in self.views}
        mark = marks.pop() if len(marks) == 1 else None
        if mark is not None:
            stream, last = self._stream_of(mark.source)
            self._streams[mark.source] = (stream, mark.generation)
            continued = mark.continued
            if last is None or last != mark.generation - 1 or continued is None:
                continued = np.zeros(rows, bool)
            return {**_with_continued(payload, self.views, continued), VIEWS_OF: stream}
        previous, self._sent = self._sent, {name: view.copy() for name, view in views.items()}
        continued = np.zeros(rows, bool)
        if previous and all(views[name].shape == previous[name].shape for name in self.views):
            continued[:] = True
            for name, view in self.views.items():
                moved_on = _rows_equal(views[name][:, :-1], previous[name][:, 1:])
                ends_with_observation = _rows_equal(views[name][:, -1], np.asarray(inputs[view.key]))
                continued &= moved_on & ends_with_observation
        return _with_continued(payload, self.views, continued)

    def _stream_of(self, source: int) -> tuple[int, int | None]:
        """The stream of views of ``source`` and the generation it last sent (None yet): a new source takes the
        stream of the one longest silent once every stream is taken."""
        if source in self._streams:
            self._streams.move_to_end(source)
            return self._streams[source]
        taken = {stream for stream, _ in self._streams.values()}
        if len(taken) >= MOST_STREAMS:
            taken.discard(self._streams.popitem(last=False)[1][0])
        return min(set(range(1, MOST_STREAMS + 1)) - taken), None


def _with_continued(payload: dict[str, Any], views: dict[str, View], continued: np.ndarray) -> dict[str, Any]:
    """``payload`` with ``continued`` and the views of the other rows only (all of them, as they are, where no row
    continues: the CDP keeps them for the next request to continue)."""
    if not continued.any():
        return {**payload, CONTINUED: continued}
    inputs, restarted = payload["inputs"], ~continued
    sent_inputs = {key: value for key, value in inputs.items() if key not in views}
    sent_inputs.update({name: np.asarray(inputs[name])[restarted] for name in views})
    return {**payload, "inputs": sent_inputs, CONTINUED: continued}


class ViewsReceiver:
    """The CDP's side: rebuilds the views of each agent's requests from its last ones (module docstring)."""

    def __init__(self, specs: CTSpecs) -> None:
        self.specs = specs
        self.views = _observation_views(specs)
        self._last: OrderedDict[tuple[str, int], dict[str, FrameRing]] = OrderedDict()
        """By agent and stream of views (``VIEWS_OF``): the last views, as rings."""

    def unpack(self, agent_id: str, payload: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
        """``payload`` with every view spelled out (raises ``SpecError`` naming what does not fit), and the names of
        the inputs the CT takes as they are, without a copy into the batch: read-only, valid until the reply (the
        views rebuilt here, views of the rings, and arrays in shared memory). Keeps the views for the agent's next
        request."""
        payload, rebuilt = self._with_views(agent_id, payload)
        inputs = payload.get("inputs")
        if not isinstance(inputs, dict):
            return payload, rebuilt
        return payload, rebuilt | {key for key, value in inputs.items() if in_shared_memory(value)}

    def _with_views(self, agent_id: str, payload: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
        """``payload`` with every view spelled out, and the names of the views rebuilt here."""
        if not self.views:
            return payload, frozenset()
        inputs = payload.get("inputs")
        if not isinstance(inputs, dict):
            return payload, frozenset()  # the CDP's check names what is wrong with it
        if CONTINUED not in payload:
            return payload, frozenset()  # the agent will not continue these views
        stream = payload.get(VIEWS_OF, 0)
        if type(stream) is not int or not 0 <= stream <= MOST_STREAMS:
            raise SpecError(f"{VIEWS_OF!r} must be an int from 0 to {MOST_STREAMS}, got {stream!r}")
        key = (agent_id, stream)
        previous = self._last.pop(key, None)
        continued = payload[CONTINUED]
        if not isinstance(continued, np.ndarray) or continued.dtype != np.bool_ or continued.ndim != 1:
            raise SpecError(f"{CONTINUED!r} must be a 1-d bool array, got {_describe(continued)}")
        rows, restarted = len(continued), ~continued
        if not continued.any():
            return self._start(key, payload, rows)
        if previous is None or len(next(iter(previous.values()))) != rows:
            raise SpecError(
                f"the request continues the views of {rows} rows, but the CT holds none of this agent's of that many: "
                "an agent's first request (or one after its rows changed) must carry every view"
            )
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
        restarted_rows = np.flatnonzero(restarted)
        for name, view in self.views.items():
            ring = previous[name]
            ring.push(inputs[view.key])
            if restarted_rows.size:
                ring.replace(restarted_rows, inputs[name])
        self._hold(key, previous)
        return self._from_rings(payload, previous)

    def forget(self, agent_ids: set[str] | frozenset[str]) -> None:
        """Agents that left: their views go."""
        for key in [key for key in self._last if key[0] in agent_ids]:
            del self._last[key]

    def _start(self, key: tuple[str, int], payload: dict[str, Any], rows: int) -> tuple[dict[str, Any], frozenset[str]]:
        """A request none of whose rows continue: its views kept as rings (copies: an array of a decoded message is a
        view of its bytes, or of a shared block reused once the request is answered) and handed out from them."""
        inputs = payload["inputs"]
        for name, spec in self.specs.inputs.items():
            if name in self.views and not _fits(inputs.get(name), (rows, *spec.fixed_shape), spec.dtype):
                raise SpecError(
                    f"inputs[{name!r}] must hold the views of every row when none continues, {spec.dtype} "
                    f"{[rows, *spec.fixed_shape]}, got {_describe(inputs.get(name))}"
                )
        rings = {name: FrameRing(inputs[name]) for name in self.views}
        self._hold(key, rings)
        return self._from_rings(payload, rings)

    def _from_rings(
        self, payload: dict[str, Any], rings: dict[str, FrameRing]
    ) -> tuple[dict[str, Any], frozenset[str]]:
        """``payload`` spelled out with the rings' views in place of the views, and their names: read-only views the
        CT reads during its ``predict`` as they are, with no copy into the batch."""
        taken = {name: ring.window() for name, ring in rings.items()}
        for window in taken.values():
            window.flags.writeable = False  # the next request continues them
        spelled_out = _spelled_out(payload)
        spelled_out["inputs"] = {**payload["inputs"], **taken}
        return spelled_out, frozenset(taken)

    def _hold(self, key: tuple[str, int], rings: dict[str, FrameRing]) -> None:
        self._last[key] = rings
        while len(self._last) > MOST_AGENTS_HELD:
            self._last.popitem(last=False)


def _spelled_out(payload: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in payload.items() if key not in (CONTINUED, VIEWS_OF)}


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
