"""What an agent process counts of its episodes: steps, and the return and length of each finished episode.

The runtime wraps every env of an agent in an ``EpisodeRecorder``, so a custom
Agent reports its episodes without writing a line for it; ``EpisodeStats``
holds what goes to the manager with the next stats message.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flare2.core.env_making import is_turn_based
from flare2.core.pettingzoo_agent import team_of


class EpisodeStats:
    """Steps and finished episodes of every env of this process since the last report.

    Evaluation episodes are counted apart, so they never mix with the training
    statistics or count towards the step budget.
    """

    def __init__(self) -> None:
        self.steps = 0
        self.eval_steps = 0
        self.finished: list[tuple[float, int, str]] = []
        self.eval_finished: list[tuple[float, int, str]] = []
        """(return, length, team) of each finished episode: the team of a multi-agent env's agent
        (``flare2.core.pettingzoo_agent.team_of``), "" for an env's one agent."""

    def take(self) -> dict[str, Any]:
        stats = {"steps": self.steps, "episodes": _on_the_wire(self.finished)}
        if self.eval_steps or self.eval_finished:
            stats.update(eval_steps=self.eval_steps, eval_episodes=_on_the_wire(self.eval_finished))
        self.steps, self.finished, self.eval_steps, self.eval_finished = 0, [], 0, []
        return stats


def _on_the_wire(finished: list[tuple[float, int, str]]) -> list[list[Any]]:
    """Episodes as a stats message carries them: [return, length], and the team where there is one."""
    return [
        [episode_return, length, team] if team else [episode_return, length]
        for episode_return, length, team in finished
    ]


class EpisodeRecorder:
    """Wraps one env to count its steps and the return and length of each finished episode into ``stats``.

    ``evaluating`` says whether the episode it plays counts as an evaluation episode.
    """

    def __init__(self, env: Any, stats: EpisodeStats, *, evaluating: bool = False) -> None:
        self.env = env
        self.stats = stats
        self.evaluating = evaluating
        self._return = 0.0
        self._length = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        self._return, self._length = 0.0, 0
        return self.env.reset(*args, **kwargs)

    def step(self, action: Any) -> Any:
        result = self.env.step(action)
        stats = self.stats
        if self.evaluating:
            stats.eval_steps += 1
        else:
            stats.steps += 1
        self._return += float(result[1])
        self._length += 1
        if result[2] or result[3]:
            (stats.eval_finished if self.evaluating else stats.finished).append((self._return, self._length, ""))
            self._return, self._length = 0.0, 0
        return result


class _EachAgentsEpisodes(EpisodeRecorder):
    """What the recorders of multi-agent envs share: each agent's return and length so far, by name.

    ``unrecorded``: the agents whose episodes are not reported (their steps still count), such as the seats of
    self-play's frozen copy, whose returns mirror the learner's; who plays a seat may change from game to game.
    """

    def __init__(self, env: Any, stats: EpisodeStats, *, evaluating: bool = False) -> None:
        super().__init__(env, stats, evaluating=evaluating)
        self._returns: dict[Any, float] = {}
        self._lengths: dict[Any, int] = {}
        self.unrecorded: set[Any] = set()

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        self._returns, self._lengths = {}, {}
        return self.env.reset(*args, **kwargs)

    def _count_steps(self, steps: int) -> None:
        if self.evaluating:
            self.stats.eval_steps += steps
        else:
            self.stats.steps += steps

    def _finish(self, agent: Any) -> None:
        """Agent ``agent``'s episode ended: its return, length and team join the finished episodes (unless it is
        ``unrecorded``)."""
        finished = self.stats.eval_finished if self.evaluating else self.stats.finished
        episode = (self._returns.pop(agent, 0.0), self._lengths.pop(agent, 0), team_of(agent))
        if agent not in self.unrecorded:
            finished.append(episode)


class AgentsEpisodeRecorder(_EachAgentsEpisodes):
    """Wraps a multi-agent env (PettingZoo's parallel API: ``step`` takes and gives dicts by agent) to count, as
    ``EpisodeRecorder`` does for one env, each agent's steps and the return and length of each agent's episode: an
    agent's episode ends where the env says it terminated or was truncated, whether or not its game goes on."""

    def step(self, actions: Any) -> Any:
        result = self.env.step(actions)
        _, rewards, terminations, truncations, _ = result
        self._count_steps(len(actions))
        for agent in actions:
            self._returns[agent] = self._returns.get(agent, 0.0) + float(rewards.get(agent, 0.0))
            self._lengths[agent] = self._lengths.get(agent, 0) + 1
            if terminations.get(agent, False) or truncations.get(agent, False):
                self._finish(agent)
        return result


class TurnsEpisodeRecorder(_EachAgentsEpisodes):
    """Wraps a turn-based multi-agent env (PettingZoo's AEC API: ``step(action)`` of the agent whose turn it is) to
    count each agent's moves and the return and length of each agent's episode: its return is every reward the env
    gave it, on its moves and the others'; its episode is recorded when the env steps it with ``None``, done."""

    def step(self, action: Any) -> Any:
        agent = self.env.agent_selection
        result = self.env.step(action)
        for name, reward in self.env.rewards.items():
            self._returns[name] = self._returns.get(name, 0.0) + float(reward)
        if action is not None:
            self._count_steps(1)
            self._lengths[agent] = self._lengths.get(agent, 0) + 1
        elif agent in self._returns:
            self._finish(agent)
        return result


def recorder(env: Any, stats: EpisodeStats, *, evaluating: bool = False) -> EpisodeRecorder:
    """The recorder of an env an agent made: one of each agent of a multi-agent env (one that names its
    ``possible_agents``, as PettingZoo's do: turn-based, or all at once), else of the env's one episode at a time."""
    if not hasattr(env, "possible_agents"):
        return EpisodeRecorder(env, stats, evaluating=evaluating)
    kind = TurnsEpisodeRecorder if is_turn_based(env) else AgentsEpisodeRecorder
    return kind(env, stats, evaluating=evaluating)


class VectorEpisodeRecorder:
    """Wraps a vector env (an env engine's, ``flare2.core.env_engines``) to count the steps of all its envs and the
    return and length of each finished episode into ``stats``, as ``EpisodeRecorder`` does for one env."""

    def __init__(self, vector_env: Any, stats: EpisodeStats) -> None:
        self.vector_env = vector_env
        self.stats = stats
        self._returns = np.zeros(vector_env.num_envs)
        self._lengths = np.zeros(vector_env.num_envs, np.int64)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.vector_env, name)

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        self._returns[:] = 0
        self._lengths[:] = 0
        return self.vector_env.reset(*args, **kwargs)

    def step(self, actions: Any) -> Any:
        result = self.vector_env.step(actions)
        self.stats.steps += len(self._returns)
        self._returns += result[1]
        self._lengths += 1
        ended = np.flatnonzero(np.logical_or(result[2], result[3]))
        if ended.size:
            self.stats.finished.extend((float(self._returns[index]), int(self._lengths[index]), "") for index in ended)
            self._returns[ended] = 0
            self._lengths[ended] = 0
        return result
