"""The stock Gymnasium agent: any env id whose spaces flare2 carries (``flare2.core.spaces``), several envs per process,
one CT named by ``ct``."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.acting import Acting
from flare2.core.agent import EvaluationSchedule, PendingPrediction, VectorAgent
from flare2.core.env_engines import (
    DEFAULT_ENGINE,
    PythonEnvs,
    VectorEnvs,
    engine_threads,
    make_engine_env,
    resolve_engine,
)
from flare2.core.env_making import LEARNING_EPISODE_ENDS, make_gym_env
from flare2.core.helpers import AgentHelper, OnlineHelper
from flare2.core.replay import ExpReplayHelper
from flare2.core.spaces import action_specs, input_specs
from flare2.core.specs import CTSpecs
from flare2.core.transforms import Transforms
from flare2.errors import ConfigError, SpecError
from flare2.wire.ragged import concat_rows

DEFAULT_CT = "RL"
"""The CT a GymAgent asks unless told another: the one CT that ``flare2 train`` runs."""


class GymAgent(VectorAgent):
    """Plays ``num_envs`` copies of a Gymnasium env with one CT: input ``obs``, action ``action``, reward ``reward``.

    A Dict observation space gives one input per key, a Dict action space one
    action per key; a ``Sequence`` space (a varying number of entities, or an
    action per entity) is a ragged spec, sent without padding.

    Each step asks the CT once for the actions of every env (``--envs-per-agent``
    of them), steps them all, resets the ones whose episode ended and stores the
    step of every env. Experiences go to the CT every ``sample_interval`` steps
    (``OnlineHelper``: one learn request ``[num_envs, sample_interval, ...]``;
    with ``complete_episodes``, whole episodes, at least that many steps per
    env of them together),
    or, with ``replay`` (the keyword arguments of ``ExpReplayHelper``), into a
    replay buffer in this process that sends sampled sequences.

    Episode edges (docs/architecture.md): ``terminated`` and ``truncated`` are Gymnasium's;
    the stored ``next_inputs`` row of an env whose episode ended is its final
    observation, and the env starts its next episode from the observation
    ``reset()`` gives. Each env is seeded apart (``env_seed``) at its first reset.

    With evaluation episodes (``eval_every``), ``eval_env`` plays one episode
    after every ``eval_every`` training episodes of this process, as one more
    row of the same requests, marked as an evaluation row (greedy actions);
    nothing of it is stored.

    With ``double_buffer`` the envs play in two halves that alternate: while
    the compute process answers one half's request, this process steps the
    other half (Sample Factory's double buffering). Each half is one request
    per step, so it pays where the agent and the compute process would
    otherwise wait for each other (see the benchmark in the README).

    Box actions are clipped to the space bounds before they reach the env; the
    stored action is the one the CT returned. Observations, transforms, views,
    states and actions go through ``flare2.core.acting``, as they do when
    ``flare2 eval`` plays this agent (with ``evaluating`` set: every env plays
    evaluation episodes) and for ``flare2.load_policy``.

    ``transforms`` (plain data for ``Transforms.from_options``, e.g.
    ``["normalize_observations", ["clip_rewards", {"low": -1, "high": 1}]]``)
    transform every observation and reward as it leaves the env: the CT is
    asked with, and learns from, the transformed ones. The episode returns the
    run reports stay the env's own.

    ``env_id`` may be one whose package registers it on import (``ALE/Breakout-v5``,
    ``MinAtar/Breakout-v1``); ``preprocessing`` plays Atari games as the
    published results do (``flare2.core.env_making``; False: the raw env). A
    step whose ``info`` holds ``LEARNING_EPISODE_ENDS`` (an Atari game's lost
    life) is stored as a termination and the env plays on: its trajectory views
    start afresh from the next observation, and the return it reports runs to the
    env's own end (a whole game).

    ``infos`` names entries of the env's ``info`` dict that travel with each
    step to learning: each must be one of the CT's ``extra_specs`` (with its
    shape and dtype); a step whose ``info`` lacks it stores zeros.

    ``engine`` says what steps the envs (``flare2.core.env_engines``: ``python``,
    ``gymnasium``, ``ale`` or ``auto``); an engine other than ``python`` makes
    one vector env per request group (``make_vector_envs``), with
    ``engine_threads`` native threads where it has them (0: as many as this
    process may use cores).
    """

    def __init__(
        self,
        env_id: str = "CartPole-v1",
        *,
        env_kwargs: dict[str, Any] | None = None,
        ct: str = DEFAULT_CT,
        sample_interval: int = 5,
        replay: dict[str, Any] | None = None,
        double_buffer: bool = False,
        transforms: list[Any] | None = None,
        infos: list[str] | None = None,
        complete_episodes: bool = False,
        preprocessing: bool = True,
        engine: str = DEFAULT_ENGINE,
        engine_threads: int = 0,
    ) -> None:
        self.env_id = env_id
        self.preprocessing = preprocessing
        self.double_buffer = double_buffer
        self.env_kwargs = env_kwargs or {}
        self.ct = ct
        self.sample_interval = sample_interval
        self.replay = replay
        self.transforms = transforms or []
        self.infos = list(infos or [])
        self.complete_episodes = complete_episodes
        self.engine = engine
        self.engine_threads = engine_threads

    def make_env(self) -> gym.Env:
        return make_gym_env(self.env_id, self.env_kwargs, preprocessing=self.preprocessing)

    def make_vector_envs(self) -> list[Any]:
        engine = resolve_engine(self.engine, self.env_id, self.preprocessing)
        if engine == "python":
            return []
        threads = self.engine_threads or engine_threads(agent_processes=1)
        return [
            make_engine_env(
                engine, self.env_id, self.env_kwargs, stop - first, preprocessing=self.preprocessing, threads=threads
            )
            for first, stop in pairwise(self._group_bounds())
        ]

    def _group_bounds(self) -> list[int]:
        """Where each group of envs asked in one request starts, and the end: two halves with double buffering."""
        count = self.num_envs
        # Double buffering: while the compute process answers one half, this process steps the other.
        halves = self.double_buffer and self.requests_overlap and count >= 2
        return [0, count // 2, count] if halves else [0, count]

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        """The observation and action space of one of this agent's envs."""
        if self.vector_envs:
            return self.vector_envs[0].single_observation_space, self.vector_envs[0].single_action_space
        return self.envs[0].observation_space, self.envs[0].action_space

    def helpers(self) -> dict[str, AgentHelper]:
        if self.replay is not None:
            try:
                return {self.ct: ExpReplayHelper(**self.replay)}
            except TypeError as exc:
                raise ConfigError(f"GymAgent replay options {self.replay} do not fit ExpReplayHelper: {exc}") from None
        return {self.ct: OnlineHelper(sample_interval=self.sample_interval, complete_episodes=self.complete_episodes)}

    def check_specs(self, specs: Mapping[str, CTSpecs]) -> None:
        ct_specs = specs[self.ct]
        observation_space, action_space = self.spaces()
        env_inputs, env_actions_ = input_specs(observation_space), action_specs(action_space)
        if (
            set(ct_specs.acting_inputs) != set(env_inputs)
            or not set(env_actions_) <= set(ct_specs.actions)
            or set(ct_specs.rewards) != {"reward"}
        ):
            raise ConfigError(
                f"GymAgent sends the inputs {sorted(env_inputs)} and reward 'reward' of env {self.env_id!r} and reads "
                f"the actions {sorted(env_actions_)} (other action outputs are stored with them), but CT {self.ct!r} "
                f"declares inputs {sorted(ct_specs.acting_inputs)} (besides its views), actions "
                f"{sorted(ct_specs.actions)}, rewards {sorted(ct_specs.rewards)}: use a model with those spec names or "
                "write your own Agent"
            )
        missing = sorted(set(self.infos) - set(ct_specs.extras))
        if missing:
            raise ConfigError(
                f"GymAgent infos {missing} are not among the extra specs of CT {self.ct!r} ({sorted(ct_specs.extras)}): "
                "declare them in the model's extra_specs() with the shape and dtype of the info entry"
            )
        for group, env_specs, ct_group in (
            ("input", env_inputs, ct_specs.inputs),
            ("action", env_actions_, ct_specs.actions),
        ):
            for key, spec in env_specs.items():
                if ct_group[key].shape != spec.shape:
                    raise ConfigError(
                        f"env {self.env_id!r} has {group} {key!r} of shape {spec.shape}, CT {self.ct!r} expects "
                        f"{ct_group[key].shape}"
                    )

    def run(self) -> None:
        specs = self.specs(self.ct)
        transforms = self.bind_transforms(self.ct, Transforms.from_options(self.transforms))
        bounds = list(pairwise(self._group_bounds()))
        engines: list[PythonEnvs | VectorEnvs]
        if self.vector_envs:
            engines = [VectorEnvs(envs, f"{type(self).__name__}'s") for envs in self.vector_envs]
        else:
            engines = [PythonEnvs(self.envs[first:stop]) for first, stop in bounds]
        groups = [_EnvGroup(self, engine, first, specs, transforms) for engine, (first, _) in zip(engines, bounds)]
        evaluation = _EvaluationEpisodes(self, specs, transforms) if self.eval_env is not None else None
        for group in groups:
            group.send(evaluation if group is groups[0] else None)
        while True:
            steps = []
            for group in groups:
                step, ended = group.step(evaluation)
                if evaluation is not None and ended:
                    evaluation.training_episodes_ended(ended)
                # The evaluation env's row rides with the first group's requests.
                group.send(evaluation if group is groups[0] else None)
                steps.append(step)
            self.store(self.ct, **(steps[0] if len(steps) == 1 else concatenate_rows(steps)))


def concatenate_rows(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows of several steps (groups of envs, or agents' turns) as one step, in order."""
    return {
        key: {name: concat_rows([step[key][name] for step in steps]) for name in value}
        if isinstance(value, dict)
        else concat_rows([step[key] for step in steps])
        for key, value in steps[0].items()
    }


def _acting(agent: GymAgent, specs: CTSpecs, transforms: Transforms, count: int, *, training: bool) -> Acting:
    observation_space, action_space = agent.spaces()
    return Acting(
        specs=specs,
        observation_space=observation_space,
        action_space=action_space,
        transforms=transforms,
        count=count,
        training=training,
    )


class _EnvGroup:
    """A group of a GymAgent's envs, asked for in one request: its engine, its acting pipeline and that request.

    Every step of a group: ``step()`` waits for its actions, steps its envs
    (the engine restarts those whose episode ended; their stored
    ``next_inputs`` row keeps the final observation) and returns the rows to
    store; ``send()`` asks for the next actions.
    """

    def __init__(
        self, agent: GymAgent, engine: PythonEnvs | VectorEnvs, first: int, specs: CTSpecs, transforms: Transforms
    ) -> None:
        self.agent = agent
        self.engine = engine
        self.extra_specs = specs.extras
        self.acting = _acting(agent, specs, transforms, engine.count, training=not agent.evaluating)
        self.acting.start(engine.reset([agent.env_seed(first + index) for index in range(engine.count)]))
        self.pending: PendingPrediction | None = None
        self.with_evaluation = False
        self.inputs: dict[str, Any] = {}
        self.states: dict[str, Any] = {}

    def send(self, evaluation: _EvaluationEpisodes | None) -> None:
        self.with_evaluation = evaluation is not None and evaluation.playing
        self.inputs, inputs, self.states = self.acting.request()
        states, marks = self.states, None
        if evaluation is not None and self.with_evaluation:
            inputs, states, marks = evaluation.with_row(inputs, states)
        self.pending = self.agent.send_predict(self.agent.ct, inputs, states, evaluation=marks)

    def step(self, evaluation: _EvaluationEpisodes | None) -> tuple[dict[str, Any], int]:
        """The rows to store for this step of the group's envs, and how many of their episodes ended."""
        assert self.pending is not None, "send() comes before step()"
        actions, next_states = self.pending.result()
        count, acting = self.engine.count, self.acting
        evaluation_reply = None
        if evaluation is not None and self.with_evaluation:
            evaluation_reply = (
                {key: value[count:] for key, value in actions.items()},
                {key: value[count:] for key, value in next_states.items()},
            )
            actions = {key: value[:count] for key, value in actions.items()}
            next_states = {key: value[:count] for key, value in next_states.items()}
        stepped = self.engine.step(acting.env_actions(actions), self.agent.infos)
        next_obs = acting.next_rows()
        only = next_obs.only_array
        if only is not None:
            only[...] = stepped.observations
            for index, observation in stepped.final.items():
                only[index] = observation
        else:
            for index in range(count):
                next_obs.set(index, stepped.final.get(index, stepped.observations[index]))
        extras: dict[str, Any] = {name: self.extra_specs[name].zeros(count) for name in self.agent.infos}
        for name, values in stepped.infos.items():
            self._keep_infos(extras[name], name, values)
        rewards = stepped.rewards.astype(acting.reward_dtype, copy=False)
        terminated = stepped.terminated | stepped.lost_lives
        next_inputs = acting.stepped(next_obs, rewards, actions, next_states)
        if evaluation is not None and evaluation_reply is not None:
            evaluation.play(*evaluation_reply)
        step = {
            "inputs": self.inputs,
            "actions": actions,
            "rewards": {"reward": rewards},
            "next_inputs": next_inputs,
            "terminated": terminated,
            "truncated": stepped.truncated,
            "states": self.states,
            "policy_version": np.full(count, self.pending.version, np.int64),
            "extras": extras,
        }
        ended = np.flatnonzero(terminated | stepped.truncated)
        if ended.size:
            # Envs whose game goes on after a lost life start their views afresh from the observation they reached.
            acting.restart(ended, [stepped.observations[int(index)] for index in ended])
        return step, len(stepped.final)

    def _keep_infos(self, rows: np.ndarray, name: str, values: list[Any]) -> None:
        for index, value in enumerate(values):
            if value is None:
                continue
            value = np.asarray(value)
            if value.shape != rows.shape[1:] or not np.can_cast(value.dtype, rows.dtype, "same_kind"):
                raise SpecError(
                    f"info[{name!r}] of env {self.agent.env_id!r} is a {value.dtype.name} of shape {value.shape}, "
                    f"which does not fit extra spec {self.extra_specs[name]} of CT {self.agent.ct!r}: declare the "
                    "spec as the env gives it"
                )
            rows[index] = value


class _EvaluationEpisodes:
    """``eval_env`` and its acting pipeline: one episode after every ``eval_every`` training episodes, as one more
    row of the first group's requests, marked as an evaluation row. Nothing of it is stored, and its observations
    are transformed like the training ones without counting into the run's statistics."""

    def __init__(self, agent: GymAgent, specs: CTSpecs, transforms: Transforms) -> None:
        self.agent = agent
        self.env = agent.eval_env
        self.schedule = EvaluationSchedule(agent.eval_every)
        self.acting = _acting(agent, specs, transforms, 1, training=False)
        self.playing = False

    def training_episodes_ended(self, count: int) -> None:
        self.schedule.training_episodes_ended(count)
        if not self.playing and self.schedule.start_if_due():
            seed = self.agent.env_seed(self.agent.num_envs) if self.schedule.evaluated == 1 else None
            self.acting.start([self.env.reset(seed=seed)[0]])
            self.playing = True

    def with_row(self, inputs: dict[str, Any], states: dict[str, Any]) -> tuple[dict, dict, np.ndarray]:
        """The training rows plus the evaluation row, and the mask that marks it."""
        _, row, row_states = self.acting.request()
        marks = np.zeros(len(next(iter(inputs.values()))) + 1, bool)
        marks[-1] = True
        return (
            {key: concat_rows([value, row[key]]) for key, value in inputs.items()},
            {key: np.concatenate([value, row_states[key]]) for key, value in states.items()},
            marks,
        )

    def play(self, actions: dict[str, Any], next_states: dict[str, Any]) -> None:
        """Step ``eval_env`` with its row of a reply."""
        observation, reward, terminated, truncated, info = self.env.step(self.acting.env_actions(actions)[0])
        next_obs = self.acting.next_rows()
        next_obs.set(0, observation)
        self.acting.stepped(next_obs, np.array([reward], self.acting.reward_dtype), actions, next_states)
        if terminated or truncated:
            self.playing = False
        elif info.get(LEARNING_EPISODE_ENDS):
            # As in training: the views start afresh after a lost life.
            self.acting.restart(np.array([0]), [observation])
