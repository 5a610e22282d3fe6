"""Agent: the episode logic of one agent process. Imports no torch.

Two ways to write one.

**One environment per process** (FLARE's way, the simplest to write):
subclass :class:`Agent`. The runtime drives it inside the agent process::

    agent = MyAgent(**kwargs)      # kwargs are plain data, so a recipe works on any machine
    agent.make_env()               # inside the process; the runtime wraps it to count steps
    agent.helpers()                # one AgentHelper per ComputationTask the agent asks
    agent.run_episode()            # again and again until the run stops

Inside ``run_episode`` call ``self.predict(ct, inputs, states)`` to ask a CT
for actions and ``self.store(ct, ...)`` to hand the step to that CT's helper,
which sends experiences to the CT's training loop. Evaluation episodes (the
run's ``eval_every`` option) run the same ``run_episode`` with
``self.evaluating`` set: ``predict`` then asks for the greedy action
(``Algorithm.predict_greedy``), ``store`` keeps nothing, and the episode is
reported apart from the training episodes.

**Several environments per process** (``--envs-per-agent K``): subclass
:class:`VectorAgent` and write ``run()``, which plays all of ``self.envs`` in
lockstep until the run stops: one ``predict_rows`` of K rows per step, one
``store_rows`` of K rows after it. One message per K env steps is what makes
a process fast: the round trip to the compute process is paid once for all
of them. :class:`flare2.core.envs.GymAgent` is the stock one; read its
``run()`` before writing your own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from flare2.core.specs import CTSpecs, Spec, check_arrays
from flare2.core.transforms import Transforms
from flare2.errors import ConfigError, SpecError
from flare2.wire.ragged import Ragged

Arrays = dict[str, np.ndarray]


class CTPort(Protocol):
    """How an agent reaches one ComputationTask (the runtime provides it)."""

    learn_ahead: int
    """Learn requests that may be on their way before ``learn`` waits for the oldest reply (the CT says)."""

    def predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Send a predict request and return the reply: ``actions``, ``states`` and the weights' ``version``."""

    def send_predict(self, payload: dict[str, Any]) -> int:
        """Send a predict request without waiting; returns the ticket ``wait_predict`` takes."""

    def wait_predict(self, ticket: int) -> dict[str, Any]:
        """The reply to the request of ``ticket`` (as ``predict`` returns it)."""

    def learn(self, payload: dict[str, Any]) -> None:
        """Send a learn request; returns once no more than ``learn_ahead`` requests await their reply."""

    def send_statistics(self, payload: dict[str, Any]) -> int:
        """Send an agent's new observation counts (``flare2.core.transforms``); returns the ticket ``wait_statistics`` takes."""

    def wait_statistics(self, ticket: int) -> dict[str, Any]:
        """The reply to the statistics of ``ticket``: the run's merged ``moments``."""

    def set_evaluating(self, evaluating: bool) -> None:
        """Tell the CT that this agent starts (or ends) an evaluation episode: no learn requests come meanwhile."""


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


class Agent:
    """One environment per process: override ``make_env``, ``helpers`` and ``run_episode``; see the module docstring."""

    env: Any
    agent_id: str = ""
    seed: int = 0
    evaluating: bool = False
    """Set by the runtime for an evaluation episode: greedy actions, nothing stored."""
    num_envs: int = 1
    """Environments this process plays (set by the runtime from ``--envs-per-agent``)."""
    eval_every: int = 0
    """The run's ``eval_every``: an evaluation episode after every this many training episodes (0: none)."""

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
        self._versions = {ct: 0 for ct in self._specs}
        for ct, helper in self._helpers.items():
            helper.attach(ct, self._specs[ct], self._ports[ct], num_envs=self.num_envs)
        self.check_specs(self._specs)

    def specs(self, ct: str) -> CTSpecs:
        return self._specs[ct]

    def bind_transforms(self, ct: str, transforms: Transforms) -> Transforms:
        """Bind a data pipeline to CT ``ct`` (its specs, and its port for the run's shared statistics); returns it.

        Pass each step's raw observations and rewards through it before predicting and storing
        (``flare2.core.transforms``); GymAgent does so with its ``transforms`` option.
        """
        transforms.bind(ct, self._specs[ct], self._ports[ct])
        return transforms

    def start_episode(self, *, evaluating: bool) -> None:
        """Called by the runtime before each episode of ``run_episode``: sets ``evaluating`` and, when it changes,
        tells every CT of this agent, so that their learn batches do not wait for it while it evaluates."""
        if evaluating != self.evaluating:
            for port in self._ports.values():
                port.set_evaluating(evaluating)
        self.evaluating = evaluating

    def initial_states(self, ct: str) -> Arrays:
        """The states at an episode start: zeros of the CT's state specs."""
        return {name: spec.zeros() for name, spec in self._specs[ct].states.items()}

    def predict(self, ct: str, inputs: Arrays, states: Arrays | None = None) -> tuple[Arrays, Arrays]:
        """Ask CT ``ct`` for actions; ``inputs`` and ``states`` have the spec shapes (no batch dim)."""
        specs = self._specs[ct]
        actions, next_states = self._ask(
            ct,
            {key: _one_row(value, specs.inputs.get(key)) for key, value in inputs.items()},
            {key: _one_row(value, specs.states.get(key)) for key, value in (states or {}).items()},
            np.ones(1, bool) if self.evaluating else None,
        )
        return {key: _only_row(value) for key, value in actions.items()}, {key: value[0] for key, value in next_states.items()}

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
        extras: Arrays | None = None,
    ) -> None:
        """Hand one step to the helper of CT ``ct``; ``terminated``/``truncated`` as Gymnasium reports them.

        ``inputs`` and ``next_inputs`` leave out the CT's views: the helper builds them from the stored steps.
        ``extras`` gives the CT's ``extra_specs`` that the agent fills (entries of the env's ``info``); any left out
        are zeros, for the helper's ``postprocess`` to fill.

        Steps of evaluation episodes are not learned from, so they are dropped here.
        """
        if self.evaluating:
            return
        specs = self._specs[ct]

        def rows(group: Arrays, group_specs: Mapping) -> Arrays:
            return {name: _one_row(group[name], spec, cast=True) for name, spec in group_specs.items()}

        self._helpers[ct].store({
            "inputs": rows(inputs, specs.acting_inputs),
            "next_inputs": rows(next_inputs, specs.acting_inputs),
            "actions": rows(actions, specs.actions),
            "rewards": rows(rewards, specs.rewards),
            "states": rows(states or {}, specs.states),
            "extras": _extras_rows(extras or {}, specs.extras, 1),
            "terminated": np.array([terminated], bool),
            "truncated": np.array([truncated], bool),
            "policy_version": np.array([self._versions[ct]], np.int64),
        })

    def _ask(self, ct: str, inputs: Arrays, states: Arrays, greedy: np.ndarray | None) -> tuple[Arrays, Arrays]:
        """One predict request of ``[rows, ...]`` arrays; remembers the version of the weights that answered."""
        reply = self._ports[ct].predict(_predict_payload(inputs, states, greedy))
        actions, next_states, self._versions[ct] = _read_prediction(self._specs[ct], ct, reply, inputs)
        return actions, next_states


def _one_row(value: Any, spec: Spec | None, *, cast: bool = False) -> np.ndarray | Ragged:
    """One env's array (the spec's shape) as a request's single row, in the spec's dtype with ``cast``; a ragged
    spec's items as a Ragged of one row."""
    if spec is not None and spec.ragged:
        return Ragged.from_items([value], spec.item_shape, spec.dtype)
    return np.asarray(value, dtype=spec.dtype if cast and spec is not None else None)[None]


def _extras_rows(extras: Arrays, specs: Mapping[str, Spec], rows: int) -> Arrays:
    """``rows`` rows of each extra spec: those given (one row each, or ``[rows, ...]``), zeros for the rest."""
    if not specs and not extras:
        return {}
    unknown = sorted(set(extras) - set(specs))
    if unknown:
        raise SpecError(f"extras {unknown} are not among the CT's extra specs {sorted(specs)}")
    return {
        name: np.asarray(extras[name], spec.dtype).reshape(rows, *spec.shape) if name in extras else spec.zeros(rows)
        for name, spec in specs.items()
    }


def _only_row(value: np.ndarray | Ragged) -> np.ndarray:
    """The one row of a reply: an array of the spec's shape, or the items of a ragged output."""
    return value.items()[0] if isinstance(value, Ragged) else value[0]


def _predict_payload(inputs: Arrays, states: Arrays, greedy: np.ndarray | None) -> dict[str, Any]:
    payload: dict[str, Any] = {"inputs": inputs, "states": states}
    if greedy is not None:
        payload["greedy"] = greedy
    return payload


def _read_prediction(specs: CTSpecs, ct: str, reply: dict[str, Any], inputs: Arrays) -> tuple[Arrays, Arrays, int]:
    """The actions, next states and weights version of a reply, checked against the specs and the rows asked."""
    rows = (len(next(iter(inputs.values()))),)
    check_arrays("actions", specs.actions, reply.get("actions"), leading=rows)
    check_arrays("states", specs.states, reply.get("states", {}), leading=rows)
    version = reply.get("version")
    if type(version) is not int:
        raise SpecError(f"a prediction of CT {ct!r} must carry the int 'version' of its weights, got {version!r}")
    return reply["actions"], reply.get("states", {}), version


class PendingPrediction:
    """A prediction on its way (``VectorAgent.send_rows``): play something else, then ``result()``."""

    def __init__(self, agent: Agent, ct: str, ticket: int, inputs: Arrays) -> None:
        self._agent, self._ct, self._ticket, self._inputs = agent, ct, ticket, inputs
        self.version = -1
        """The version of the weights that answered, once ``result()`` returned."""

    def result(self) -> tuple[Arrays, Arrays]:
        """Wait for the actions and next states."""
        agent, ct = self._agent, self._ct
        reply = agent._ports[ct].wait_predict(self._ticket)
        actions, states, self.version = _read_prediction(agent._specs[ct], ct, reply, self._inputs)
        agent._versions[ct] = self.version
        return actions, states


class VectorAgent(Agent):
    """Several environments per process, played in lockstep; override ``make_env``, ``helpers`` and ``run``.

    The runtime calls ``make_env()`` ``num_envs`` times (once more for
    ``eval_env`` when the run has evaluation episodes), wraps each env to count
    its steps and episodes, then calls ``run()`` once: it plays until the run
    stops (the runtime ends it from inside ``predict_rows``). Per step:

    1. ``actions, states = self.predict_rows(ct, inputs, states)`` with arrays of
       ``num_envs`` rows (plus a row for ``eval_env`` while it plays, marked in
       ``greedy``);
    2. step every env with its row of the actions; reset the envs whose episode
       ended (their ``next_inputs`` row keeps the final observation, so a
       time-limit truncation can bootstrap from it);
    3. ``self.store_rows(ct, ...)`` with the ``num_envs`` training rows.

    Give each env its own seed with ``env_seed(index)``.
    """

    envs: list[Any]
    """The ``num_envs`` training environments."""
    eval_env: Any = None
    """One more environment for greedy evaluation episodes when the run has ``eval_every``, else None."""
    requests_overlap: bool = True
    """Whether a request sent with ``send_rows`` is answered while this agent does something else; False in
    serial mode, where every request is served at once (so playing envs in halves would only halve the batches)."""

    def run(self) -> None:
        """Play ``self.envs`` until the run stops (see the class docstring)."""
        raise NotImplementedError(f"{type(self).__name__} must define run()")

    def run_episode(self) -> None:
        raise ConfigError(f"{type(self).__name__} is a VectorAgent: the runtime calls its run(), not run_episode()")

    def env_seed(self, index: int) -> int:
        """A seed for env ``index`` of this process, distinct from every other env of the run."""
        return int(np.random.SeedSequence((self.seed, index)).generate_state(1)[0])

    def initial_states(self, ct: str, rows: int | None = None) -> Arrays:
        """Zeros of the CT's state specs; ``rows`` of them (one per env) when given."""
        return {name: spec.zeros(rows) for name, spec in self._specs[ct].states.items()}

    def predict_rows(
        self, ct: str, inputs: Arrays, states: Arrays | None = None, *, greedy: np.ndarray | None = None
    ) -> tuple[Arrays, Arrays]:
        """Actions and next states for ``[rows, ...]`` inputs and states; ``greedy`` marks evaluation rows."""
        return self._ask(ct, inputs, states or {}, greedy)

    def send_rows(
        self, ct: str, inputs: Arrays, states: Arrays | None = None, *, greedy: np.ndarray | None = None
    ) -> PendingPrediction:
        """Like ``predict_rows``, without waiting: step other envs meanwhile, then call ``result()`` on it."""
        ticket = self._ports[ct].send_predict(_predict_payload(inputs, states or {}, greedy))
        return PendingPrediction(self, ct, ticket, inputs)

    def store_rows(
        self,
        ct: str,
        *,
        inputs: Arrays,
        actions: Arrays,
        rewards: Arrays,
        next_inputs: Arrays,
        terminated: np.ndarray,
        truncated: np.ndarray,
        states: Arrays | None = None,
        policy_version: np.ndarray | None = None,
        extras: Arrays | None = None,
    ) -> None:
        """Hand one step of every training env (``num_envs`` rows, arrays the helper may keep) to CT ``ct``'s helper.

        ``policy_version`` (one per row) defaults to the version that answered the latest prediction. ``extras``
        gives rows of the CT's ``extra_specs`` that the agent fills; any left out are zeros (for the helper's
        ``postprocess``).
        """
        if policy_version is None:
            policy_version = np.full(len(terminated), self._versions[ct], np.int64)
        self._helpers[ct].store({
            "inputs": inputs,
            "next_inputs": next_inputs,
            "actions": actions,
            "rewards": rewards,
            "states": states or {},
            "extras": _extras_rows(extras or {}, self._specs[ct].extras, len(terminated)),
            "terminated": terminated,
            "truncated": truncated,
            "policy_version": policy_version,
        })
