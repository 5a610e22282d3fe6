"""Agent: the episode logic of one agent process. Imports no torch.

Call order, driven by the runtime inside the agent process::

    agent = MyAgent(**kwargs)      # kwargs are plain data, so a recipe works on any machine
    agent.make_env()               # inside the process; the runtime wraps it to count steps
    agent.helpers()                # one AgentHelper per ComputationTask the agent asks
    agent.run_episode()            # again and again until the run stops

Inside ``run_episode`` call ``self.predict(ct, inputs, states)`` to ask a CT
for actions and ``self.store(ct, ...)`` to hand the step to that CT's helper,
which sends experiences to the CT's training loop.

Evaluation episodes (the run's ``eval_every`` option) run the same
``run_episode`` with ``self.evaluating`` set: ``predict`` then asks for the
greedy action (``Algorithm.predict_greedy``), ``store`` keeps nothing, and the
episode is reported apart from the training episodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from flare2.core.specs import CTSpecs, check_arrays
from flare2.errors import ConfigError

Arrays = dict[str, np.ndarray]


class CTPort(Protocol):
    """How an agent reaches one ComputationTask (the runtime provides it)."""

    def predict(self, payload: dict[str, Any]) -> dict[str, Any]: ...

    def learn(self, payload: dict[str, Any]) -> dict[str, Any]: ...


class AgentHelper:
    """Decides what stored steps become learn requests, and when."""

    def attach(self, ct: str, specs: CTSpecs, port: CTPort) -> None:
        self.ct, self.specs, self.port = ct, specs, port

    def store(self, step: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define store()")


class Agent:
    """Override ``make_env``, ``helpers`` and ``run_episode``; see the module docstring."""

    env: Any
    agent_id: str = ""
    seed: int = 0
    evaluating: bool = False
    """Set by the runtime for an evaluation episode: greedy actions, nothing stored."""

    def make_env(self) -> Any:
        """Create the environment; called once inside the agent process."""
        raise NotImplementedError(f"{type(self).__name__} must define make_env()")

    def helpers(self) -> dict[str, AgentHelper]:
        """One helper per CT name this agent asks, e.g. ``{"RL": OnlineHelper(sample_interval=5)}``."""
        raise NotImplementedError(f"{type(self).__name__} must define helpers()")

    def run_episode(self) -> None:
        """Play one episode on ``self.env``, calling ``predict`` and ``store`` at each step."""
        raise NotImplementedError(f"{type(self).__name__} must define run_episode()")

    def check_specs(self, specs: Mapping[str, CTSpecs]) -> None:
        """Raise ConfigError if the CTs' specs do not fit this agent; called once after connecting."""

    # ---- provided by the runtime -------------------------------------------------

    def connect(
        self,
        *,
        agent_id: str,
        seed: int,
        specs: Mapping[str, CTSpecs],
        ports: Mapping[str, CTPort],
        helpers: Mapping[str, AgentHelper],
    ) -> None:
        """Bind this agent and its helpers to their CTs (the runtime calls this after ``helpers()``)."""
        unknown = sorted(set(helpers) - set(specs))
        if unknown:
            raise ConfigError(f"{type(self).__name__} asks for CT(s) {unknown}, but the run serves {sorted(specs)}")
        self.agent_id, self.seed = agent_id, seed
        self._specs = dict(specs)
        self._ports = dict(ports)
        self._helpers = dict(helpers)
        for ct, helper in self._helpers.items():
            helper.attach(ct, self._specs[ct], self._ports[ct])
        self.check_specs(self._specs)

    def specs(self, ct: str) -> CTSpecs:
        return self._specs[ct]

    def initial_states(self, ct: str) -> Arrays:
        """The states at an episode start: zeros of the CT's state specs."""
        return {name: spec.zeros() for name, spec in self._specs[ct].states.items()}

    def predict(self, ct: str, inputs: Arrays, states: Arrays | None = None) -> tuple[Arrays, Arrays]:
        """Ask CT ``ct`` for actions; ``inputs`` and ``states`` have the spec shapes (no batch dim)."""
        specs = self._specs[ct]
        payload = {
            "inputs": {key: np.asarray(value)[None] for key, value in inputs.items()},
            "states": {key: np.asarray(value)[None] for key, value in (states or {}).items()},
        }
        if self.evaluating:
            payload["greedy"] = True
        reply = self._ports[ct].predict(payload)
        check_arrays("actions", specs.actions, reply.get("actions"), leading=(1,))
        check_arrays("states", specs.states, reply.get("states", {}), leading=(1,))
        return (
            {key: value[0] for key, value in reply["actions"].items()},
            {key: value[0] for key, value in reply.get("states", {}).items()},
        )

    def store(
        self,
        ct: str,
        *,
        inputs: Arrays,
        actions: Arrays,
        rewards: Arrays,
        next_inputs: Arrays,
        terminated: bool,
        truncated: bool,
        states: Arrays | None = None,
    ) -> None:
        """Hand one step to the helper of CT ``ct``; ``terminated``/``truncated`` as Gymnasium reports them.

        Steps of evaluation episodes are not learned from, so they are dropped here.
        """
        if self.evaluating:
            return
        self._helpers[ct].store(
            {
                "inputs": inputs,
                "next_inputs": next_inputs,
                "actions": actions,
                "rewards": rewards,
                "states": states or {},
                "terminated": bool(terminated),
                "truncated": bool(truncated),
            }
        )
