"""A helper for rows that come and go: each row's steps in fragments of its own, for the agents of multi-agent envs.

In a PettingZoo game each live agent is one row of a request, and an agent
that dies leaves the requests while its game goes on; when the game restarts,
its agents come back. ``OnlineHelper`` needs the same rows at every step, so
it cannot keep them. ``FragmentsHelper`` keeps each row's steps apart, by the
row's id (``ROW_IDS`` in every stored step: one int per row, the same for an
agent's place in its game from one episode to the next), and sends learn
requests ``[N, T, ...]`` of N fragments of T consecutive steps of one row each.
A fragment runs across its row's episode ends as ``OnlineHelper``'s do: the
flags say where and how each episode ended, and the algorithm bootstraps from
the ``next_inputs`` of a fragment's last step.

A request goes once the finished fragments are at least as many as the ids
seen so far: one fragment of every row when all play every step (the same
request as ``OnlineHelper``'s), a few more of the rows that play on when some
wait for their game to restart.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flare2.core.helpers import ROW_IDS, AgentHelper, CTPort, pop_row_ids
from flare2.core.learn_requests import pack
from flare2.core.specs import STEP_FLAG_SPECS, CTSpecs
from flare2.errors import ConfigError


class FragmentsHelper(AgentHelper):
    """Sends each row's steps as fragments of ``sample_interval`` consecutive steps (see the module docstring)."""

    def __init__(self, sample_interval: int = 5) -> None:
        if sample_interval < 1:
            raise ConfigError(f"FragmentsHelper.sample_interval must be >= 1, got {sample_interval}")
        self.sample_interval = sample_interval
        # Steps kept (the first is step _first of this helper); each row's open fragment as (step, row) places.
        self._steps: list[dict[str, Any]] = []
        self._first = 0
        self._open: dict[int, list[tuple[int, int]]] = {}
        self._finished: list[list[tuple[int, int]]] = []

    def attach(self, ct: str, specs: CTSpecs, port: CTPort, *, num_envs: int = 1) -> None:
        super().attach(ct, specs, port, num_envs=num_envs)
        if specs.views:
            raise ConfigError(
                f"CT {ct!r} declares trajectory views {sorted(specs.views)}, and the rows of a multi-agent env's "
                "agents come and go: give it a model without views (--frames 1)"
            )
        ragged = sorted(name for group in specs.stored_specs().values() for name, spec in group.items() if spec.ragged)
        if ragged:
            raise ConfigError(
                f"CT {ct!r} has ragged specs {ragged}, which the rows of a multi-agent env's agents do not carry: "
                "give each agent fixed-shape observations and actions"
            )

    def store(self, step: dict[str, Any]) -> None:
        ids = pop_row_ids(step, type(self).__name__)
        if ids is None:
            raise ConfigError(f"{type(self).__name__} needs each step's {ROW_IDS!r}: an int per row, ids of rows")
        at = self._first + len(self._steps)
        self._steps.append(step)
        for row, row_id in enumerate(ids.tolist()):
            fragment = self._open.setdefault(row_id, [])
            fragment.append((at, row))
            if len(fragment) == self.sample_interval:
                self._finished.append(fragment)
                self._open[row_id] = []
        if len(self._finished) >= len(self._open):
            self._send()

    def _send(self) -> None:
        fragments, self._finished = self._finished, []
        places = np.array(fragments, np.int64)  # [N, T, 2]: each step's place (step, row)
        # Every kept step's rows laid one after another: a place's index there is its step's offset plus its row.
        offsets = np.cumsum([0, *(len(step["terminated"]) for step in self._steps[:-1])])
        index = offsets[places[..., 0] - self._first] + places[..., 1]
        stored: dict[str, Any] = {
            group: {name: np.concatenate([s[group][name] for s in self._steps])[index] for name in group_specs}
            for group, group_specs in self.specs.stored_specs().items()
        }
        for flag, spec in STEP_FLAG_SPECS.items():
            stored[flag] = np.concatenate([s[flag] for s in self._steps]).astype(spec.dtype, copy=False)[index]
        # Steps before the first one an open fragment holds are no longer needed.
        needed = min(
            (fragment[0][0] for fragment in self._open.values() if fragment), default=self._first + len(self._steps)
        )
        del self._steps[: needed - self._first]
        self._first = needed
        self.port.learn(pack(self.specs, stored, 0))
