"""The stock Gymnasium agent: any env id whose spaces flare2 carries (``flare2.core.spaces``), several envs per process,
one CT named by ``ct``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.agent import AgentHelper, PendingPrediction, VectorAgent
from flare2.core.helpers import ExpReplayHelper, OnlineHelper
from flare2.core.spaces import ACTION_KEY, ObservationRows, action_specs, env_actions, input_specs
from flare2.core.specs import CTSpecs
from flare2.core.transforms import Transforms
from flare2.core.views import ViewRows
from flare2.errors import ConfigError, SpecError
from flare2.wire.ragged import concat_rows


def make_gym_env(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> gym.Env:
    """``gymnasium.make`` with an error that names the id and the fix."""
    try:
        return gym.make(env_id, **dict(env_kwargs or {}))
    except gym.error.Error as exc:
        raise ConfigError(
            f"cannot make Gymnasium environment {env_id!r} ({exc}): check the id "
            "(gymnasium.pprint_registry() lists them) or install the package that registers it"
        ) from None


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

    With evaluation episodes (``eval_every``), ``eval_env`` plays one greedy
    episode after every ``eval_every`` training episodes of this process, as one
    more row of the same requests; nothing of it is stored.

    With ``double_buffer`` the envs play in two halves that alternate: while
    the compute process answers one half's request, this process steps the
    other half (Sample Factory's double buffering). Each half is one request
    per step, so it pays where the agent and the compute process would
    otherwise wait for each other (see the benchmark in the README).

    Box actions are clipped to the space bounds before they reach the env; the
    stored action is the one the CT returned.

    ``transforms`` (plain data for ``Transforms.from_options``, e.g.
    ``["normalize_observations", ["clip_rewards", {"low": -1, "high": 1}]]``)
    transform every observation and reward as it leaves the env: the CT is
    asked with, and learns from, the transformed ones. The episode returns the
    run reports stay the env's own.

    ``infos`` names entries of the env's ``info`` dict that travel with each
    step to learning: each must be one of the CT's ``extra_specs`` (with its
    shape and dtype); a step whose ``info`` lacks it stores zeros.
    """

    def __init__(
        self,
        env_id: str = "CartPole-v1",
        *,
        env_kwargs: dict[str, Any] | None = None,
        ct: str = "RL",
        sample_interval: int = 5,
        replay: dict[str, Any] | None = None,
        double_buffer: bool = False,
        transforms: list[Any] | None = None,
        infos: list[str] | None = None,
        complete_episodes: bool = False,
    ) -> None:
        self.env_id = env_id
        self.double_buffer = double_buffer
        self.env_kwargs = env_kwargs or {}
        self.ct = ct
        self.sample_interval = sample_interval
        self.replay = replay
        self.transforms = transforms or []
        self.infos = list(infos or [])
        self.complete_episodes = complete_episodes

    def make_env(self) -> gym.Env:
        return make_gym_env(self.env_id, self.env_kwargs)

    def helpers(self) -> dict[str, AgentHelper]:
        if self.replay is not None:
            try:
                return {self.ct: ExpReplayHelper(**self.replay)}
            except TypeError as exc:
                raise ConfigError(f"GymAgent replay options {self.replay} do not fit ExpReplayHelper: {exc}") from None
        return {self.ct: OnlineHelper(sample_interval=self.sample_interval, complete_episodes=self.complete_episodes)}

    def check_specs(self, specs: Mapping[str, CTSpecs]) -> None:
        ct_specs = specs[self.ct]
        env = self.envs[0]
        env_inputs, env_actions_ = input_specs(env.observation_space), action_specs(env.action_space)
        if (set(ct_specs.acting_inputs) != set(env_inputs) or not set(env_actions_) <= set(ct_specs.actions)
                or set(ct_specs.rewards) != {"reward"}):
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
        for group, env_specs, ct_group in (("input", env_inputs, ct_specs.inputs), ("action", env_actions_, ct_specs.actions)):
            for key, spec in env_specs.items():
                if ct_group[key].shape != spec.shape:
                    raise ConfigError(
                        f"env {self.env_id!r} has {group} {key!r} of shape {spec.shape}, CT {self.ct!r} expects "
                        f"{ct_group[key].shape}"
                    )

    def run(self) -> None:
        specs = self.specs(self.ct)
        space = self.envs[0].action_space
        action_keys = list(space.spaces) if isinstance(space, gym.spaces.Dict) else None
        clip = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
        count = self.num_envs
        # Double buffering: while the compute process answers one half, this process steps the other.
        halves = self.double_buffer and self.requests_overlap and count >= 2
        bounds = [0, count // 2, count] if halves else [0, count]
        pipeline = self.bind_transforms(self.ct, Transforms.from_options(self.transforms))
        groups = [_EnvGroup(self, first, stop, specs, clip, action_keys, pipeline)
                  for first, stop in zip(bounds, bounds[1:])]
        evaluation = _EvaluationEpisodes(self, specs, pipeline) if self.eval_env is not None else None
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
            self.store_rows(self.ct, **(steps[0] if len(steps) == 1 else _concatenate(steps)))


def _concatenate(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows of several groups' steps as one step, in env order."""
    return {
        key: {name: concat_rows([step[key][name] for step in steps]) for name in value}
        if isinstance(value, dict) else concat_rows([step[key] for step in steps])
        for key, value in steps[0].items()
    }


def _observation_rows(agent: GymAgent, specs: CTSpecs, count: int) -> ObservationRows:
    keyed = isinstance(agent.envs[0].observation_space, gym.spaces.Dict)
    return ObservationRows(specs.acting_inputs, count, keyed=keyed)


class _EnvGroup:
    """Envs ``first`` to ``stop`` of a GymAgent, asked for in one request: their observations, states and that request.

    Every step of a group: ``step()`` waits for its actions, steps its envs,
    resets those whose episode ended (their stored ``next_inputs`` row keeps
    the final observation) and returns the rows to store; ``send()`` asks for
    the next actions.
    """

    def __init__(
        self, agent: GymAgent, first: int, stop: int, specs: CTSpecs, clip: tuple | None, action_keys: list[str] | None,
        pipeline: Transforms,
    ) -> None:
        self.agent, self.clip, self.action_keys, self.pipeline = agent, clip, action_keys, pipeline
        self.envs = agent.envs[first:stop]
        self.reward_dtype = specs.rewards["reward"].dtype
        self.extra_specs = specs.extras
        self.obs = _observation_rows(agent, specs, len(self.envs))
        for index, env in enumerate(self.envs):
            self.obs.set(index, env.reset(seed=agent.env_seed(first + index))[0])
        if pipeline.observing:
            pipeline.observations(self.obs.arrays())
        self.views = ViewRows(specs, len(self.envs))
        if self.views:
            self.views.start_all(self.obs.arrays())
        self.states = agent.initial_states(agent.ct, len(self.envs))
        self.pending: PendingPrediction | None = None
        self.with_evaluation = False
        self.inputs: dict[str, Any] = {}

    def send(self, evaluation: _EvaluationEpisodes | None) -> None:
        self.with_evaluation = evaluation is not None and evaluation.playing
        # Stored as they are; the views go in the request only (the helper assembles them again for learning).
        self.inputs = self.obs.arrays()
        inputs = {**self.inputs, **self.views.current()} if self.views else self.inputs
        if self.with_evaluation:
            inputs, states, greedy = evaluation.with_row(inputs, self.states)
        else:
            states, greedy = self.states, None
        self.pending = self.agent.send_rows(self.agent.ct, inputs, states, greedy=greedy)

    def step(self, evaluation: _EvaluationEpisodes | None) -> tuple[dict[str, Any], int]:
        """The rows to store for this step of the group's envs, and how many of their episodes ended."""
        actions, next_states = self.pending.result()
        envs, count = self.envs, len(self.envs)
        if self.clip is not None:
            actions_for_envs = {ACTION_KEY: np.clip(actions[ACTION_KEY], *self.clip)}
        else:
            actions_for_envs = actions
        per_env = env_actions(actions_for_envs, self.action_keys, count + self.with_evaluation)
        # Fresh rows every step: the helper keeps what it is given.
        next_obs = self.obs.fresh()
        rewards = np.empty(count, self.reward_dtype)
        terminated, truncated = np.empty(count, bool), np.empty(count, bool)
        only = next_obs.only_array
        extras = {name: self.extra_specs[name].zeros(count) for name in self.agent.infos}
        for index, env in enumerate(envs):
            observation, rewards[index], terminated[index], truncated[index], info = env.step(per_env[index])
            if only is not None:
                only[index] = observation
            else:
                next_obs.set(index, observation)
            if extras:
                self._keep_infos(extras, index, info)
        if self.pipeline.observing:
            self.pipeline.observations(next_obs.arrays())
        self.pipeline.rewards(rewards)
        if self.with_evaluation:
            evaluation.step(per_env[count], {key: value[count:] for key, value in actions.items()},
                            {key: value[count:] for key, value in next_states.items()})
            actions = {key: value[:count] for key, value in actions.items()}
            next_states = {key: value[:count] for key, value in next_states.items()}
        next_inputs = next_obs.arrays()
        if self.views:
            self.views.advance(next_inputs, actions, {"reward": rewards})
        step = {
            "inputs": self.inputs, "actions": actions, "rewards": {"reward": rewards},
            "next_inputs": next_inputs, "terminated": terminated, "truncated": truncated, "states": self.states,
            "policy_version": np.full(count, self.pending.version, np.int64), "extras": extras,
        }
        ended = np.flatnonzero(terminated | truncated)
        self.obs, self.states = next_obs, next_states
        if ended.size:
            # The stored next_obs keeps the final observations; the next step starts from the reset ones.
            self.obs = next_obs.copy()
            self.states = {key: value.copy() for key, value in next_states.items()}
            for index in ended:
                self.obs.set(index, envs[index].reset()[0])
                for value in self.states.values():
                    value[index] = 0
            if self.pipeline.observing:
                self.pipeline.observations(self.obs.arrays(), ended)
            if self.views:
                for index in ended:
                    self.views.start(index, self.obs.row(index))
        return step, ended.size

    def _keep_infos(self, extras: dict[str, np.ndarray], index: int, info: dict[str, Any]) -> None:
        for name, rows in extras.items():
            if name in info:
                value = np.asarray(info[name])
                if value.shape != rows.shape[1:] or not np.can_cast(value.dtype, rows.dtype, "same_kind"):
                    raise SpecError(
                        f"info[{name!r}] of env {self.agent.env_id!r} is a {value.dtype.name} of shape {value.shape}, "
                        f"which does not fit extra spec {self.extra_specs[name]} of CT {self.agent.ct!r}: declare the "
                        "spec as the env gives it"
                    )
                rows[index] = value


class _EvaluationEpisodes:
    """The schedule and state of ``eval_env``: one greedy episode after every ``eval_every`` training episodes."""

    def __init__(self, agent: GymAgent, specs: CTSpecs, pipeline: Transforms) -> None:
        self.agent, self.pipeline = agent, pipeline
        self.reward_dtype = specs.rewards["reward"].dtype
        self.env = agent.eval_env
        self.obs = _observation_rows(agent, specs, 1)
        self.views = ViewRows(specs, 1)
        self.states = agent.initial_states(agent.ct, 1)
        self.playing = False
        self.started = 0
        self.trained = 0

    def training_episodes_ended(self, count: int) -> None:
        self.trained += count
        if not self.playing and self.trained >= self.agent.eval_every * (self.started + 1):
            seed = self.agent.env_seed(self.agent.num_envs) if self.started == 0 else None
            self.obs.set(0, self.env.reset(seed=seed)[0])
            # Evaluation episodes are transformed like training ones, but do not count towards the statistics.
            self.pipeline.observations(self.obs.arrays(), count=False)
            self.views.start(0, self.obs.row(0))
            self.states = self.agent.initial_states(self.agent.ct, 1)
            self.playing = True
            self.started += 1

    def with_row(self, inputs: dict[str, Any], states: dict[str, np.ndarray]) -> tuple[dict, dict, np.ndarray]:
        """The training rows plus the evaluation row, and the mask that asks greedy actions for it."""
        greedy = np.zeros(len(next(iter(inputs.values()))) + 1, bool)
        greedy[-1] = True
        rows = {key: np.concatenate([value, self.states[key]]) for key, value in states.items()}
        evaluation = {**self.obs.arrays(), **self.views.current()}
        return {key: concat_rows([value, evaluation[key]]) for key, value in inputs.items()}, rows, greedy

    def step(self, action: Any, action_rows: dict[str, Any], next_states: dict[str, np.ndarray]) -> None:
        observation, reward, terminated, truncated, _ = self.env.step(action)
        self.obs.set(0, observation)
        rewards = np.array([reward], self.reward_dtype)
        self.pipeline.observations(self.obs.arrays(), count=False)
        self.pipeline.rewards(rewards)
        self.views.advance(self.obs.arrays(), action_rows, {"reward": rewards})
        self.states = next_states
        if terminated or truncated:
            self.playing = False
