"""The games of a PettingZoo parallel env as ``PettingZooAgent`` plays them (``flare2.core.pettingzoo_agent``): each
CT's rows, one per live agent of every game, stepped together, and regrouped as agents leave and games restart.
Imports no torch."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flare2.core.spaces import OBS_KEY

GLOBAL_STATE = "global_state"
"""The input that holds a row's game state (the env's ``state()``), sent with each agent's observation to a CT that
declares it: a centralised critic's (``flare2.zoo.models.ActorCritic``'s ``critic_space``)."""


def observation_with_state(observation: Any, state: Any) -> dict[str, Any]:
    """An agent's observation with its game's state: its own keys (or ``obs``) and ``GLOBAL_STATE``."""
    parts = dict(observation) if isinstance(observation, Mapping) else {OBS_KEY: observation}
    return {**parts, GLOBAL_STATE: state}


@dataclass
class Step:
    """One step of the live agents of one CT, in rows."""

    observations: list[Any]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    @property
    def ended(self) -> np.ndarray:
        return self.terminated | self.truncated


class ParallelGames:
    """The games of a PettingZooAgent: which agent of which game each row of each CT is, their steps and restarts."""

    def __init__(
        self, envs: list[Any], seeds: list[int], policy_of: Callable[[str], str], with_state: set[str]
    ) -> None:
        self.envs = envs
        self.places = {agent: index for index, agent in enumerate(envs[0].possible_agents)}
        self.policy_of = {agent: policy_of(agent) for agent in self.places}
        # Each row's latest observation, as its CT sees it (with its game's state where the CT wants that).
        self._wants_state = {agent for agent, ct in self.policy_of.items() if ct in with_state}
        self._last: dict[tuple[int, str], Any] = {}
        for game, (env, seed) in enumerate(zip(envs, seeds)):
            self._reset(game, seed)
        self.rows: dict[str, list[tuple[int, str]]] = {ct: [] for ct in self.policy_of.values()}
        for game, env in enumerate(envs):
            for agent in env.agents:
                self.rows[self.policy_of[agent]].append((game, agent))

    def _reset(self, game: int, seed: int | None = None) -> None:
        observations, _ = self.envs[game].reset(seed=seed)
        self._keep(game, observations, self.envs[game].agents)

    def _keep(self, game: int, observations: Mapping[str, Any], agents: Sequence[str]) -> None:
        state = self.envs[game].state() if self._wants_state.intersection(agents) else None
        for agent in agents:
            observation = observations[agent]
            self._last[(game, agent)] = (
                observation if agent not in self._wants_state else observation_with_state(observation, state)
            )

    def observations(self, rows: list[tuple[int, str]]) -> list[Any]:
        """The latest observation of each of ``rows``."""
        return [self._last[row] for row in rows]

    def row_ids(self, rows: list[tuple[int, str]]) -> np.ndarray:
        """Each row's place: its game and its index among the game's ``possible_agents``."""
        width = len(self.places)
        return np.array([game * width + self.places[agent] for game, agent in rows], np.int64)

    def step(self, actions: Mapping[str, Sequence[Any] | np.ndarray]) -> dict[str, Step]:
        """Step every game with the actions of each CT's rows (every live agent has a row)."""
        by_game: dict[int, dict[str, Any]] = {}
        for ct, ct_actions in actions.items():
            for (game, agent), action in zip(self.rows[ct], ct_actions):
                by_game.setdefault(game, {})[agent] = action
        results = {game: self.envs[game].step(game_actions) for game, game_actions in by_game.items()}
        for game, game_actions in by_game.items():
            self._keep(game, results[game][0], list(game_actions))
        steps = {}
        for ct, rows in self.rows.items():
            count = len(rows)
            step = steps[ct] = Step([None] * count, np.zeros(count), np.zeros(count, bool), np.zeros(count, bool))
            for index, (game, agent) in enumerate(rows):
                _, rewards, terminations, truncations, _ = results[game]
                step.observations[index] = self._last[(game, agent)]
                step.rewards[index] = rewards[agent]
                step.terminated[index] = terminations[agent]
                step.truncated[index] = truncations[agent]
        return steps

    def regroup(self, ended: dict[str, np.ndarray]) -> dict[str, tuple[list[int], list[tuple[int, str]]]]:
        """After a step, per CT: the rows that play on (their indices among its rows), and those that join (the
        agents of games that ended and restarted, and agents that appeared); each CT's rows become the two, in that
        order."""
        for game, env in enumerate(self.envs):
            if not env.agents:
                self._reset(game)
        live = [(game, agent) for game, env in enumerate(self.envs) for agent in env.agents]
        live_set = set(live)
        regrouped: dict[str, tuple[list[int], list[tuple[int, str]]]] = {}
        for ct, rows in self.rows.items():
            # The rows that play on keep their order, so that a CT's pipeline, which is regrouped only where rows
            # leave or join, stays row for row with them.
            kept = [index for index, row in enumerate(rows) if row in live_set and not ended[ct][index]]
            playing_on = {rows[index] for index in kept}
            joined = [row for row in live if self.policy_of[row[1]] == ct and row not in playing_on]
            regrouped[ct] = (kept, joined)
            self.rows[ct] = [rows[index] for index in kept] + joined
        return regrouped
