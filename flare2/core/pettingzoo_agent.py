"""The stock agent of multi-agent envs: PettingZoo's parallel API, every live agent of every game one row of a request,
the agents sharing one CT (parameter sharing). Imports no torch.

**Env ids.** A PettingZoo env is named by its module, ``mpe2.simple_spread_v3``
or ``pettingzoo.butterfly.pistonball_v6`` (``flare2.core.env_making``), whose
``parallel_env(**env_kwargs)`` makes a game.

**Rows.** Each step, one request holds a row per agent that is live in its
game (``env.agents``), game after game, in the game's agent order. An agent
that leaves while its game goes on leaves the requests; when its game ends,
the game restarts and its agents join again. So the number of rows varies with
the agents alive, without rows padded to the most there could be. Each agent's
episode is its own: its return is what it earned, its end where the env said
it terminated or was truncated (``flare2.runtime.agents.episodes``: every
agent's episode is reported, and env steps count each agent's steps).

**Learning.** Each agent's place in its game (game ``g``, the ``i``-th of
``possible_agents``) keeps its row id from one episode to the next, and
``FragmentsHelper`` sends fragments of each place's consecutive steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from flare2.core.acting import Acting
from flare2.core.agent import VectorAgent
from flare2.core.env_making import make_parallel_env, shared_spaces
from flare2.core.envs import DEFAULT_CT
from flare2.core.fragments import ROW_IDS, FragmentsHelper
from flare2.core.helpers import AgentHelper
from flare2.core.spaces import action_specs, input_specs
from flare2.core.specs import CTSpecs
from flare2.core.transforms import Transforms
from flare2.errors import ConfigError


class PettingZooAgent(VectorAgent):
    """Plays ``num_envs`` games of a PettingZoo parallel env with one CT shared by all agents (module docstring):
    input ``obs`` (or one per key of a Dict observation space), action ``action``, reward ``reward``.

    ``transforms`` as GymAgent's; each game gets its own seed (``env_seed``) at its first reset.
    """

    def __init__(
        self,
        env_id: str = "mpe2.simple_spread_v3",
        *,
        env_kwargs: dict[str, Any] | None = None,
        ct: str = DEFAULT_CT,
        sample_interval: int = 5,
        transforms: list[Any] | None = None,
    ) -> None:
        self.env_id = env_id
        self.env_kwargs = env_kwargs or {}
        self.ct = ct
        self.sample_interval = sample_interval
        self.transforms = transforms or []

    def make_env(self) -> Any:
        return make_parallel_env(self.env_id, self.env_kwargs)

    def helpers(self) -> dict[str, AgentHelper]:
        return {self.ct: FragmentsHelper(self.sample_interval)}

    def check_specs(self, specs: Mapping[str, CTSpecs]) -> None:
        spaces = shared_spaces(self.envs[0], self.env_id)
        ct_specs = specs[self.ct]
        env_inputs, env_actions = input_specs(spaces.observation_space), action_specs(spaces.action_space)
        fits = set(ct_specs.acting_inputs) == set(env_inputs) and set(env_actions) <= set(ct_specs.actions)
        if not fits or set(ct_specs.rewards) != {"reward"}:
            raise ConfigError(
                f"PettingZooAgent sends each agent's inputs {sorted(env_inputs)} and reward 'reward' of env "
                f"{self.env_id!r} and reads the actions {sorted(env_actions)}, but CT {self.ct!r} declares inputs "
                f"{sorted(ct_specs.acting_inputs)}, actions {sorted(ct_specs.actions)}, rewards "
                f"{sorted(ct_specs.rewards)}: use a model with those spec names or write your own agent"
            )
        if self.eval_env is not None:
            raise ConfigError("PettingZooAgent plays no evaluation episodes during training: run without --eval-every")

    def run(self) -> None:
        spaces = shared_spaces(self.envs[0], self.env_id)
        transforms = self.bind_transforms(self.ct, Transforms.from_options(self.transforms))
        acting = Acting(
            specs=self.specs(self.ct),
            observation_space=spaces.observation_space,
            action_space=spaces.action_space,
            transforms=transforms,
            count=0,
        )
        games = _Games(self.envs, [self.env_seed(index) for index in range(len(self.envs))])
        acting.regroup(np.zeros(0, np.int64), games.observations(games.rows))
        while True:
            inputs, request, states = acting.request()
            actions, next_states = self.predict(self.ct, request, states)
            rows = games.rows
            step = games.step(rows, acting.env_actions(actions))
            next_rows = acting.next_rows()
            for index, observation in enumerate(step.observations):
                next_rows.set(index, observation)
            rewards = step.rewards.astype(acting.reward_dtype, copy=False)
            next_inputs = acting.stepped(next_rows, rewards, actions, next_states)
            self._store_rows(
                self.ct,
                {
                    "inputs": inputs,
                    "actions": actions,
                    "rewards": {"reward": rewards},
                    "next_inputs": next_inputs,
                    "terminated": step.terminated,
                    "truncated": step.truncated,
                    "states": states,
                    "extras": None,
                    "policy_version": None,
                    ROW_IDS: games.row_ids(rows),
                },
                len(rows),
            )
            kept, joined = games.regroup(rows, step.terminated | step.truncated)
            if len(kept) != len(rows) or joined:
                acting.regroup(np.asarray(kept, np.int64), games.observations(joined))


@dataclass
class _Step:
    """One step of every live agent, in rows."""

    observations: list[Any]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray


class _Games:
    """The games of a PettingZooAgent: which agent of which game each row is, their steps and restarts."""

    def __init__(self, envs: list[Any], seeds: list[int]) -> None:
        self.envs = envs
        self.places = {agent: index for index, agent in enumerate(envs[0].possible_agents)}
        self._last: dict[tuple[int, Any], Any] = {}
        for game, (env, seed) in enumerate(zip(envs, seeds)):
            self._reset(game, seed)
        self.rows: list[tuple[int, Any]] = [(game, agent) for game, env in enumerate(envs) for agent in env.agents]

    def _reset(self, game: int, seed: int | None = None) -> None:
        observations, _ = self.envs[game].reset(seed=seed)
        for agent in self.envs[game].agents:
            self._last[(game, agent)] = observations[agent]

    def observations(self, rows: list[tuple[int, Any]]) -> list[Any]:
        """The latest observation of each of ``rows``."""
        return [self._last[row] for row in rows]

    def row_ids(self, rows: list[tuple[int, Any]]) -> np.ndarray:
        """Each row's place: its game and its index among the game's ``possible_agents``."""
        width = len(self.places)
        return np.array([game * width + self.places[agent] for game, agent in rows], np.int64)

    def step(self, rows: list[tuple[int, Any]], actions: Any) -> _Step:
        """Step every game with its rows' actions (every live agent has a row)."""
        by_game: dict[int, dict[Any, Any]] = {}
        for (game, agent), action in zip(rows, actions):
            by_game.setdefault(game, {})[agent] = action
        results = {game: self.envs[game].step(game_actions) for game, game_actions in by_game.items()}
        count = len(rows)
        step = _Step([None] * count, np.zeros(count), np.zeros(count, bool), np.zeros(count, bool))
        for index, (game, agent) in enumerate(rows):
            observations, rewards, terminations, truncations, _ = results[game]
            step.observations[index] = self._last[(game, agent)] = observations[agent]
            step.rewards[index] = rewards[agent]
            step.terminated[index] = terminations[agent]
            step.truncated[index] = truncations[agent]
        return step

    def regroup(self, rows: list[tuple[int, Any]], ended: np.ndarray) -> tuple[list[int], list[tuple[int, Any]]]:
        """After a step: the rows that play on (their indices among ``rows``), and those that join (the agents of
        games that ended and restarted, and agents that appeared); ``self.rows`` becomes the two, in that order."""
        for game, env in enumerate(self.envs):
            if not env.agents:
                self._reset(game)
        index_of = {row: index for index, row in enumerate(rows)}
        kept: list[int] = []
        joined: list[tuple[int, Any]] = []
        for game, env in enumerate(self.envs):
            for agent in env.agents:
                index = index_of.get((game, agent))
                if index is not None and not ended[index]:
                    kept.append(index)
                else:
                    joined.append((game, agent))
        self.rows = [rows[index] for index in kept] + joined
        return kept, joined
