"""Agents for tools/bench.py. Imports no torch: this module runs in flare2's agent processes.

``RolloutAgent`` is the stock ``GymAgent`` (K envs per process, one predict
request of K rows per step) whose helper throws every stored step away, so the
run sends prediction requests only: a rollout without learning, which is what
``python tools/bench.py`` times against raw ZeroMQ and an in-process loop.
It is named in a RunConfig as ``tools/bench_agents.py:RolloutAgent``
(relative to the directory the manager starts in).
"""

from __future__ import annotations

from typing import Any

from flare2.core.envs import GymAgent
from flare2.core.helpers import AgentHelper


class DropHelper(AgentHelper):
    """Takes each step and keeps nothing: no learn request ever leaves the agent."""

    def store(self, step: dict[str, Any]) -> None:
        pass


class RolloutAgent(GymAgent):
    """A GymAgent that only acts: its CT (``ct``, "RL" by default) gets predict requests and never a learn request."""

    def helpers(self) -> dict[str, AgentHelper]:
        return {self.ct: DropHelper()}
