"""Agent: the episode logic of one agent process. Imports no torch.

An agent plays envs and, at each step, asks ComputationTasks (CTs) for
actions and hands what happened to a helper per CT, which sends experiences
to the CT's training loop. Two classes, one API:

- :class:`Agent` plays **one env** (FLARE's way, the simplest to write):
  override ``make_env``, ``helpers`` and ``run_episode``, which plays one
  episode on ``self.env``. Every array it passes or gets is one env's, in the
  shape of its spec.
- :class:`VectorAgent` plays **K envs in lockstep** (``--envs-per-agent K``):
  override ``make_env``, ``helpers`` and ``run``, which plays ``self.envs``
  until the run stops. Every array it passes or gets has a leading dimension
  of **rows**, one per env. One message per K env steps is what makes a
  process fast: the round trip to the compute process is paid once for all
  of them.

That is the whole difference. Both ask with the same methods, in this order
at each step::

    actions, states = self.predict(ct, inputs, states)   # or send_predict(...).result(), to play on meanwhile
    ...step the env(s) with the actions...
    self.store(ct, inputs=..., actions=..., rewards=..., next_inputs=..., terminated=..., truncated=...)

and start an episode from ``self.initial_states(ct)``. The runtime drives an
agent inside its process::

    agent = MyAgent(**kwargs)      # kwargs are plain data, so a recipe works on any machine
    agent.make_env()               # inside the process, once per env; the runtime wraps each env to count steps
    agent.helpers()                # one AgentHelper per CT the agent asks
    agent.run_episode()            # an Agent: again and again until the run stops
    agent.run()                    # a VectorAgent: once, until the run stops

**Evaluation episodes** (the run's ``eval_every``) are played the same way by
both: their rows are marked as evaluation rows in the predict request, so the
CT answers them with the greedy action (``Algorithm.predict_greedy``), and
nothing of them is stored. An Agent's whole episode is one or the other: the
runtime sets ``self.evaluating`` before ``run_episode`` and ``predict`` and
``store`` follow it. A VectorAgent plays ``eval_env`` as one more row of its
requests, marked with ``predict(..., evaluation=mask)``, and stores only the
rows of its training envs. :class:`flare2.core.envs.GymAgent` is the stock
VectorAgent; read its ``run()`` before writing your own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from flare2.core.helpers import AgentHelper, CTPort
from flare2.core.specs import CTSpecs, Spec, check_arrays
from flare2.core.transforms import Transforms
from flare2.errors import ConfigError, SpecError
from flare2.wire.ragged import Ragged

Arrays = dict[str, Any]


class EvaluationSchedule:
    """When evaluation episodes start: one after every ``eval_every`` training episodes (none with 0).

    The runtime keeps one for an Agent's episodes, GymAgent one for its ``eval_env``.
    """

    def __init__(self, eval_every: int) -> None:
        self.eval_every = eval_every
        self.trained = 0
        self.evaluated = 0

    def training_episodes_ended(self, count: int = 1) -> None:
        self.trained += count

    def start_if_due(self) -> bool:
        """Whether an evaluation episode is due now; True counts it as started."""
        if self.eval_every <= 0 or self.trained < self.eval_every * (self.evaluated + 1):
            return False
        self.evaluated += 1
        return True


class PendingPrediction:
    """A prediction on its way (``send_predict``): play something else meanwhile, then ``result()``."""

    def __init__(self, finish: Callable[[], tuple[Arrays, Arrays, int]]) -> None:
        self._finish = finish
        self.version = -1
        """The version of the weights that answered, once ``result()`` returned."""

    def result(self) -> tuple[Arrays, Arrays]:
        """Wait for the actions and next states."""
        actions, states, self.version = self._finish()
        return actions, states


class AgentBase:
    """What :class:`Agent` and :class:`VectorAgent` share: the runtime's side of an agent, in rows.

    Subclass ``Agent`` or ``VectorAgent``, not this; the module docstring tells the two apart.
    """

    agent_id: str = ""
    seed: int = 0
    num_envs: int = 1
    """Environments this process plays (set by the runtime: ``--envs-per-agent``, else ``default_envs``)."""
    default_envs: ClassVar[int] = 1
    """Environments a process of this class plays when the run does not say (``AgentConfig.envs_per_agent`` None):
    1 for an Agent, 8 for a VectorAgent; a subclass may set its own."""
    eval_every: int = 0
    """The run's ``eval_every``: an evaluation episode after every this many training episodes (0: none)."""
    evaluating: bool = False
    """True while every env of this agent plays an evaluation episode: its rows are marked as evaluation rows (greedy
    actions) and ``store`` keeps nothing. The runtime sets it for each episode of an Agent; ``flare2 eval`` for the
    GymAgent it plays."""

    def make_env(self) -> Any:
        """Create one environment; called inside the agent process, once per env."""
        raise NotImplementedError(f"{type(self).__name__} must define make_env()")

    def helpers(self) -> dict[str, AgentHelper]:
        """One helper per CT name this agent asks, e.g. ``{"RL": OnlineHelper(sample_interval=5)}``."""
        raise NotImplementedError(f"{type(self).__name__} must define helpers()")

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
            helper.attach(ct, self._specs[ct], self._ports[ct], num_envs=self.rows_stored(ct))
        self.check_specs(self._specs)

    def specs(self, ct: str) -> CTSpecs:
        return self._specs[ct]

    def rows_stored(self, ct: str) -> int:
        """The rows of each step stored for CT ``ct``, the columns a replay buffer keeps: one per env (an agent
        whose envs hold several agents on one CT stores more)."""
        return self.num_envs

    def bind_transforms(self, ct: str, transforms: Transforms) -> Transforms:
        """Bind a data pipeline to CT ``ct`` (its specs, and its port for the run's shared statistics); returns it.

        Pass each step's raw observations and rewards through it before predicting and storing
        (``flare2.core.transforms``); GymAgent does so with its ``transforms`` option.
        """
        transforms.bind(ct, self._specs[ct], self._ports[ct])
        return transforms

    def env_seed(self, index: int) -> int:
        """A seed for env ``index`` of this process, distinct from every other env of the run."""
        return int(np.random.SeedSequence((self.seed, index)).generate_state(1)[0])

    # ---- in rows: the subclasses say how their arrays become rows ----------------------------

    def _send_rows(
        self,
        ct: str,
        inputs: Arrays,
        states: Arrays,
        evaluation: np.ndarray | None,
        finish: Callable[[Arrays, Arrays], tuple[Arrays, Arrays]],
    ) -> PendingPrediction:
        """Send a predict request of ``[rows, ...]`` arrays; the pending prediction gives the reply through ``finish``."""
        port = self._ports[ct]
        payload: dict[str, Any] = {"inputs": inputs, "states": states}
        if evaluation is None and self.evaluating:
            evaluation = np.ones(len(next(iter(inputs.values()))), bool)
        if evaluation is not None:
            payload["evaluation"] = evaluation
        ticket = port.send_predict(payload)

        def read() -> tuple[Arrays, Arrays, int]:
            actions, next_states, version = _read_prediction(self._specs[ct], ct, port.wait_predict(ticket), inputs)
            self._versions[ct] = version
            return (*finish(actions, next_states), version)

        return PendingPrediction(read)

    def _store_rows(self, ct: str, step: dict[str, Any], rows: int) -> None:
        """Hand one step of ``rows`` envs (``[rows, ...]`` arrays, ``extras`` as given) to CT ``ct``'s helper;
        nothing while evaluating: evaluation episodes are not learned from."""
        if self.evaluating:
            return
        if step["policy_version"] is None:
            step["policy_version"] = np.full(rows, self._versions[ct], np.int64)
        step["states"] = step["states"] or {}
        step["extras"] = _extras_rows(step["extras"] or {}, self._specs[ct].extras, rows)
        self._helpers[ct].store(step)


class Agent(AgentBase):
    """One environment per process: override ``make_env``, ``helpers`` and ``run_episode``; see the module docstring.

    Every array passed to or returned by ``predict``, ``send_predict``, ``store`` and ``initial_states`` is one
    env's, in the shape of its spec (a ragged spec's items, one per entity).
    """

    env: Any
    default_envs = 1

    def run_episode(self) -> None:
        """Play one episode on ``self.env``, calling ``predict`` and ``store`` at each step."""
        raise NotImplementedError(f"{type(self).__name__} must define run_episode()")

    def initial_states(self, ct: str) -> Arrays:
        """The states at an episode start: zeros of the CT's state specs."""
        return {name: spec.zeros() for name, spec in self._specs[ct].states.items()}

    def predict(self, ct: str, inputs: Arrays, states: Arrays | None = None) -> tuple[Arrays, Arrays]:
        """Ask CT ``ct`` for the actions of ``inputs`` and ``states``; returns them with the next states."""
        return self.send_predict(ct, inputs, states).result()

    def send_predict(self, ct: str, inputs: Arrays, states: Arrays | None = None) -> PendingPrediction:
        """Like ``predict``, without waiting: do something else meanwhile, then call ``result()`` on it."""
        specs = self._specs[ct]

        def one_env(actions: Arrays, next_states: Arrays) -> tuple[Arrays, Arrays]:
            return {key: _only_row(value) for key, value in actions.items()}, {
                key: value[0] for key, value in next_states.items()
            }

        return self._send_rows(
            ct,
            {key: _one_row(value, specs.inputs.get(key)) for key, value in inputs.items()},
            {key: _one_row(value, specs.states.get(key)) for key, value in (states or {}).items()},
            None,
            one_env,
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
        extras: Arrays | None = None,
        policy_version: int | None = None,
    ) -> None:
        """Hand one step to the helper of CT ``ct``; ``terminated``/``truncated`` as Gymnasium reports them.

        ``inputs`` and ``next_inputs`` leave out the CT's views: the helper builds them from the stored steps.
        ``extras`` gives the CT's ``extra_specs`` that the agent fills (entries of the env's ``info``); any left out
        are zeros, for the helper's ``postprocess`` to fill. ``policy_version`` defaults to the version of the
        weights that answered the latest prediction.

        Steps of evaluation episodes are not learned from, so they are dropped here.
        """
        specs = self._specs[ct]

        def rows(group: Arrays, group_specs: Mapping[str, Spec]) -> Arrays:
            return {name: _one_row(group[name], spec, cast=True) for name, spec in group_specs.items()}

        self._store_rows(
            ct,
            {
                "inputs": rows(inputs, specs.acting_inputs),
                "next_inputs": rows(next_inputs, specs.acting_inputs),
                "actions": rows(actions, specs.actions),
                "rewards": rows(rewards, specs.rewards),
                "states": rows(states or {}, specs.states),
                "extras": {name: np.asarray(value)[None] for name, value in (extras or {}).items()},
                "terminated": np.array([terminated], bool),
                "truncated": np.array([truncated], bool),
                "policy_version": None if policy_version is None else np.array([policy_version], np.int64),
            },
            1,
        )


class VectorAgent(AgentBase):
    """Several environments per process, played in lockstep; override ``make_env``, ``helpers`` and ``run``.

    Every array passed to or returned by ``predict``, ``send_predict``, ``store`` and ``initial_states`` has a
    leading dimension of rows, one per env (a ragged spec's rows as a ``Ragged``).

    The runtime calls ``make_vector_envs()``, and where that gives none,
    ``make_env()`` ``num_envs`` times (once more for ``eval_env`` when the run
    has evaluation episodes either way); it wraps each env (or vector env) to
    count its steps and episodes, then calls ``run()`` once: it plays until the run
    stops (the runtime ends it from inside ``predict``). Per step:

    1. ``actions, states = self.predict(ct, inputs, states)`` with ``num_envs``
       rows (plus a row for ``eval_env`` while it plays, marked in ``evaluation``);
    2. step every env with its row of the actions; reset the envs whose episode
       ended (their ``next_inputs`` row keeps the final observation, so a
       time-limit truncation can bootstrap from it);
    3. ``self.store(ct, ...)`` with the ``num_envs`` training rows.

    Give each env its own seed with ``env_seed(index)``.
    """

    default_envs = 8
    """One process of 8 envs beside the compute process keeps both cores of a 2-core machine busy."""

    envs: list[Any]
    """The ``num_envs`` training environments (none where ``make_vector_envs`` gave vector envs)."""
    vector_envs: Sequence[Any] = ()
    """What ``make_vector_envs`` gave, each wrapped by the runtime to count its episodes; empty otherwise."""
    eval_env: Any = None
    """One more environment for evaluation episodes when the run has ``eval_every``, else None."""
    requests_overlap: bool = True
    """Whether a request sent with ``send_predict`` is answered while this agent does something else; False in
    serial mode, where every request is served at once (so playing envs in halves would only halve the batches)."""

    def make_vector_envs(self) -> list[Any]:
        """Vector envs that play this agent's ``num_envs`` envs in place of ``make_env()`` (Gymnasium ``VectorEnv``s,
        one per group of envs asked in one request; ``flare2.core.env_engines``), made inside the agent process;
        an empty list (the default) has the runtime make each env with ``make_env()``."""
        return []

    def run(self) -> None:
        """Play ``self.envs`` until the run stops (see the class docstring)."""
        raise NotImplementedError(f"{type(self).__name__} must define run()")

    def initial_states(self, ct: str) -> Arrays:
        """The states at an episode start: zeros of the CT's state specs, one row per env."""
        return {name: spec.zeros(self.num_envs) for name, spec in self._specs[ct].states.items()}

    def predict(
        self, ct: str, inputs: Arrays, states: Arrays | None = None, *, evaluation: np.ndarray | None = None
    ) -> tuple[Arrays, Arrays]:
        """Actions and next states for rows of inputs and states; ``evaluation`` (a bool per row) marks the rows of
        evaluation episodes, which get the greedy action (default: every row while ``evaluating``, else none)."""
        return self.send_predict(ct, inputs, states, evaluation=evaluation).result()

    def send_predict(
        self, ct: str, inputs: Arrays, states: Arrays | None = None, *, evaluation: np.ndarray | None = None
    ) -> PendingPrediction:
        """Like ``predict``, without waiting: step other envs meanwhile, then call ``result()`` on it."""
        return self._send_rows(ct, inputs, states or {}, evaluation, _as_they_are)

    def store(
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
        extras: Arrays | None = None,
        policy_version: np.ndarray | None = None,
    ) -> None:
        """Hand one step of every training env (``num_envs`` rows, arrays the helper may keep) to CT ``ct``'s helper.

        As ``Agent.store``, in rows: ``terminated``, ``truncated`` and ``policy_version`` hold one value per row.
        Nothing is kept while ``evaluating``.
        """
        self._store_rows(
            ct,
            {
                "inputs": inputs,
                "next_inputs": next_inputs,
                "actions": actions,
                "rewards": rewards,
                "states": states,
                "extras": extras,
                "terminated": terminated,
                "truncated": truncated,
                "policy_version": policy_version,
            },
            len(terminated),
        )


def _as_they_are(actions: Arrays, states: Arrays) -> tuple[Arrays, Arrays]:
    return actions, states


def _one_row(value: Any, spec: Spec | None, *, cast: bool = False) -> np.ndarray | Ragged:
    """One env's array (the spec's shape) as a request's single row, in the spec's dtype with ``cast``; a ragged
    spec's items as a Ragged of one row."""
    if spec is not None and spec.ragged:
        return Ragged.from_items([value], spec.item_shape, spec.dtype)
    return np.asarray(value, dtype=spec.dtype if cast and spec is not None else None)[None]


def _extras_rows(extras: Arrays, specs: Mapping[str, Spec], rows: int) -> Arrays:
    """``rows`` rows of each extra spec: those given (``[rows, ...]``), zeros for the rest."""
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


def _read_prediction(specs: CTSpecs, ct: str, reply: dict[str, Any], inputs: Arrays) -> tuple[Arrays, Arrays, int]:
    """The actions, next states and weights version of a reply, checked against the specs and the rows asked."""
    rows = (len(next(iter(inputs.values()))),)
    check_arrays("actions", specs.actions, reply.get("actions"), leading=rows)
    check_arrays("states", specs.states, reply.get("states", {}), leading=rows)
    version = reply.get("version")
    if type(version) is not int:
        raise SpecError(f"a prediction of CT {ct!r} must carry the int 'version' of its weights, got {version!r}")
    return reply["actions"], reply.get("states", {}), version
