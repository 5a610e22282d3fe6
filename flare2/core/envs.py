"""The stock Gymnasium agent: any env id with Box or Discrete spaces, several envs per process, one CT named by ``ct``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.agent import AgentHelper, PendingPrediction, VectorAgent
from flare2.core.helpers import ExpReplayHelper, OnlineHelper
from flare2.core.specs import CTSpecs, Spec
from flare2.errors import ConfigError


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

    Each step asks the CT once for the actions of every env (``--envs-per-agent``
    of them), steps them all, resets the ones whose episode ended and stores the
    step of every env. Experiences go to the CT every ``sample_interval`` steps
    (``OnlineHelper``: one learn request ``[num_envs, sample_interval, ...]``),
    or, with ``replay`` (the keyword arguments of ``ExpReplayHelper``), into a
    replay buffer in this process that sends sampled sequences.

    Episode edges (DESIGN §6): ``terminated`` and ``truncated`` are Gymnasium's;
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
    ) -> None:
        self.env_id = env_id
        self.double_buffer = double_buffer
        self.env_kwargs = env_kwargs or {}
        self.ct = ct
        self.sample_interval = sample_interval
        self.replay = replay

    def make_env(self) -> gym.Env:
        return make_gym_env(self.env_id, self.env_kwargs)

    def helpers(self) -> dict[str, AgentHelper]:
        if self.replay is not None:
            try:
                return {self.ct: ExpReplayHelper(**self.replay)}
            except TypeError as exc:
                raise ConfigError(f"GymAgent replay options {self.replay} do not fit ExpReplayHelper: {exc}") from None
        return {self.ct: OnlineHelper(sample_interval=self.sample_interval)}

    def check_specs(self, specs: Mapping[str, CTSpecs]) -> None:
        ct_specs = specs[self.ct]
        if set(ct_specs.inputs) != {"obs"} or "action" not in ct_specs.actions or set(ct_specs.rewards) != {"reward"}:
            raise ConfigError(
                f"GymAgent sends input 'obs' and reward 'reward' and reads action 'action' (other action outputs are "
                f"stored with it), but CT {self.ct!r} "
                f"declares inputs {sorted(ct_specs.inputs)}, actions {sorted(ct_specs.actions)}, rewards "
                f"{sorted(ct_specs.rewards)}: use a model with those spec names or write your own Agent"
            )
        obs_spec = ct_specs.inputs["obs"]
        obs_shape = self.envs[0].observation_space.shape
        if tuple(obs_shape or ()) != obs_spec.shape:
            raise ConfigError(
                f"env {self.env_id!r} gives observations of shape {obs_shape}, CT {self.ct!r} expects {obs_spec.shape}"
            )

    def run(self) -> None:
        specs = self.specs(self.ct)
        space = self.envs[0].action_space
        clip = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
        count = self.num_envs
        # Double buffering: while the compute process answers one half, this process steps the other.
        halves = self.double_buffer and self.requests_overlap and count >= 2
        bounds = [0, count // 2, count] if halves else [0, count]
        groups = [_EnvGroup(self, first, stop, specs, clip) for first, stop in zip(bounds, bounds[1:])]
        evaluation = _EvaluationEpisodes(self, specs.inputs["obs"]) if self.eval_env is not None else None
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
        key: {name: np.concatenate([step[key][name] for step in steps]) for name in value}
        if isinstance(value, dict) else np.concatenate([step[key] for step in steps])
        for key, value in steps[0].items()
    }


class _EnvGroup:
    """Envs ``first`` to ``stop`` of a GymAgent, asked for in one request: their observations, states and that request.

    Every step of a group: ``step()`` waits for its actions, steps its envs,
    resets those whose episode ended (their stored ``next_inputs`` row keeps
    the final observation) and returns the rows to store; ``send()`` asks for
    the next actions.
    """

    def __init__(self, agent: GymAgent, first: int, stop: int, specs: CTSpecs, clip: tuple | None) -> None:
        self.agent, self.clip = agent, clip
        self.envs = agent.envs[first:stop]
        self.reward_dtype = specs.rewards["reward"].dtype
        self.obs = specs.inputs["obs"].zeros(len(self.envs))
        for index, env in enumerate(self.envs):
            self.obs[index] = env.reset(seed=agent.env_seed(first + index))[0]
        self.states = agent.initial_states(agent.ct, len(self.envs))
        self.pending: PendingPrediction | None = None
        self.with_evaluation = False

    def send(self, evaluation: _EvaluationEpisodes | None) -> None:
        self.with_evaluation = evaluation is not None and evaluation.playing
        if self.with_evaluation:
            inputs, states, greedy = evaluation.with_row(self.obs, self.states)
        else:
            inputs, states, greedy = self.obs, self.states, None
        self.pending = self.agent.send_rows(self.agent.ct, {"obs": inputs}, states, greedy=greedy)

    def step(self, evaluation: _EvaluationEpisodes | None) -> tuple[dict[str, Any], int]:
        """The rows to store for this step of the group's envs, and how many of their episodes ended."""
        actions, next_states = self.pending.result()
        envs, count = self.envs, len(self.envs)
        env_actions = actions["action"] if self.clip is None else np.clip(actions["action"], *self.clip)
        # Fresh arrays every step: the helper keeps what it is given.
        next_obs = np.empty_like(self.obs)
        rewards = np.empty(count, self.reward_dtype)
        terminated, truncated = np.empty(count, bool), np.empty(count, bool)
        for index, (env, action) in enumerate(zip(envs, env_actions)):
            next_obs[index], rewards[index], terminated[index], truncated[index], _ = env.step(action)
        if self.with_evaluation:
            evaluation.step(env_actions[count], {key: value[count:] for key, value in next_states.items()})
            actions = {key: value[:count] for key, value in actions.items()}
            next_states = {key: value[:count] for key, value in next_states.items()}
        step = {
            "inputs": {"obs": self.obs}, "actions": actions, "rewards": {"reward": rewards},
            "next_inputs": {"obs": next_obs}, "terminated": terminated, "truncated": truncated, "states": self.states,
            "policy_version": np.full(count, self.pending.version, np.int64),
        }
        ended = np.flatnonzero(terminated | truncated)
        self.obs, self.states = next_obs, next_states
        if ended.size:
            # The stored next_obs keeps the final observations; the next step starts from the reset ones.
            self.obs = next_obs.copy()
            self.states = {key: value.copy() for key, value in next_states.items()}
            for index in ended:
                self.obs[index] = envs[index].reset()[0]
                for value in self.states.values():
                    value[index] = 0
        return step, ended.size


class _EvaluationEpisodes:
    """The schedule and state of ``eval_env``: one greedy episode after every ``eval_every`` training episodes."""

    def __init__(self, agent: GymAgent, obs_spec: Spec) -> None:
        self.agent = agent
        self.env = agent.eval_env
        self.obs = obs_spec.zeros(1)
        self.states = agent.initial_states(agent.ct, 1)
        self.playing = False
        self.started = 0
        self.trained = 0

    def training_episodes_ended(self, count: int) -> None:
        self.trained += count
        if not self.playing and self.trained >= self.agent.eval_every * (self.started + 1):
            seed = self.agent.env_seed(self.agent.num_envs) if self.started == 0 else None
            self.obs[0] = self.env.reset(seed=seed)[0]
            self.states = self.agent.initial_states(self.agent.ct, 1)
            self.playing = True
            self.started += 1

    def with_row(self, obs: np.ndarray, states: dict[str, np.ndarray]) -> tuple[np.ndarray, dict, np.ndarray]:
        """The training rows plus the evaluation row, and the mask that asks greedy actions for it."""
        greedy = np.zeros(len(obs) + 1, bool)
        greedy[-1] = True
        rows = {key: np.concatenate([value, self.states[key]]) for key, value in states.items()}
        return np.concatenate([obs, self.obs]), rows, greedy

    def step(self, action: Any, next_states: dict[str, np.ndarray]) -> None:
        observation, _, terminated, truncated, _ = self.env.step(action)
        self.obs[0] = observation
        self.states = next_states
        if terminated or truncated:
            self.playing = False
