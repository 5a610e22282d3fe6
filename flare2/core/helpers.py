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
