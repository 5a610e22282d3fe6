"""Turn-based multi-agent envs (PettingZoo's AEC API), as ``PettingZooAgent`` plays them. Imports no torch.

In a board game one agent acts at a time, and what its action earned is
known only at its next turn: the moves of the others come between, and the
reward of a lost game reaches the loser after the winner's move. So each
agent of each game (a *place*) has an acting pipeline of its own, and each
turn of a place is one row of a request, the places whose turn it is in every
game asked together, CT by CT. A place's turn is stored when its next turn (or
its game's end) comes: its observation then is the turn's next observation,
and the reward is all it received since it acted (the env's ``last()``), the
rewards of the others' moves credited to its own last action. A place's
episode ends where the env says it terminated or was truncated; the agent then
steps it with ``None``, as the AEC API asks, and the game restarts once every
agent is done.

The legal moves come in the observation (``action_mask`` beside
``observation``): a CT of the zoo's actor-critic takes them as its input
``action_mask`` and never samples an illegal move.

Self-play with the run's ``eval_every`` plays evaluation games against fixed
players (``flare2.core.board_players``): after every ``eval_every`` training
games of the process, one game in which the learner plays greedy in one seat
and a baseline the others. The learner's return of it is an evaluation episode
whose team is the baseline's name, which progress reads as a win rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from flare2.core.acting import Acting
from flare2.core.agent import EvaluationSchedule, VectorAgent
from flare2.core.board_players import PLAYERS, baselines
from flare2.core.env_making import shared_spaces
from flare2.core.envs import concatenate_rows
from flare2.core.helpers import ROW_IDS
from flare2.core.transforms import Transforms
from flare2.wire.ragged import concat_rows

Place = tuple[int, str]
"""An agent of a game: (the game's index, the agent's name)."""

_FIXED_SEAT = "fixed player "


def fixed_seat(player: str) -> str:
    """What ``seats`` gives an agent that a fixed player (``flare2.core.board_players``) plays in a game: no CT
    asks for its moves, and none learns from them."""
    return _FIXED_SEAT + player


@dataclass
class _Turn:
    """A place's turn on its way to its next observation: what was asked, and the reply."""

    inputs: dict[str, Any]
    states: dict[str, Any]
    actions: dict[str, Any]
    next_states: dict[str, Any]
    version: int


class TurnBasedPlay:
    """The turns of a PettingZooAgent's games (module docstring); ``run`` plays until the run stops it.

    ``policies``: each CT's agents; ``transforms``: the data transforms (options, as GymAgent's) of every CT;
    ``seats``, where the CT of an agent changes from game to game (self-play: which seat the learner takes), gives
    each agent's CT (or ``fixed_seat``) for a game as it starts; ``learner`` (self-play), the CT whose seats'
    episodes are reported and that plays the evaluation games against the baselines (with the run's ``eval_every``).
    """

    def __init__(
        self,
        agent: VectorAgent,
        env_id: str,
        policies: dict[str, list[str]],
        transforms: list[Any],
        seats: Callable[[], dict[str, str]] | None = None,
        learner: str | None = None,
    ) -> None:
        self.agent = agent
        self.envs = agent.envs
        self.places = {name: index for index, name in enumerate(self.envs[0].possible_agents)}
        self.policies = policies
        fixed = {name: ct for ct, names in policies.items() for name in names}
        self.seats = seats or (lambda: fixed)
        # Each CT's pipeline of data transforms, shared by its places: the run's statistics count them all.
        self.transforms = {ct: agent.bind_transforms(ct, Transforms.from_options(transforms)) for ct in policies}
        self.spaces = {ct: shared_spaces(self.envs[0], env_id, names) for ct, names in policies.items()}
        self.acting: dict[tuple[Place, str], Acting] = {}
        self.turns: dict[Place, _Turn] = {}
        self.playing: set[Place] = set()
        self.ct_of: list[dict[str, str]] = []
        """Each game's agents' CTs, for the game it plays now."""
        self.learner = learner
        for game, env in enumerate(self.envs):
            env.reset(seed=agent.env_seed(game))
            self.ct_of.append(self.seats())
            self._record_learner_only(game)
        self.fixed_moves = np.random.default_rng(agent.env_seed(len(self.envs) + 4))
        self.evaluation = (
            _BaselineGames(agent, env_id, learner, self.transforms[learner])
            if learner is not None and agent.eval_env is not None
            else None
        )

    def run(self) -> None:
        while True:
            finished: dict[str, list[dict[str, Any]]] = {ct: [] for ct in self.policies}
            asking: dict[str, list[tuple[Place, dict[str, Any], dict[str, Any], dict[str, Any]]]] = {
                ct: [] for ct in self.policies
            }
            for game in range(len(self.envs)):
                self._to_next_turn(game, finished, asking)
            for ct, steps in finished.items():
                if steps:
                    self.agent._store_rows(ct, concatenate_rows(steps), len(steps))
            evaluated = self.evaluation.ask(asking) if self.evaluation is not None else None
            pending = {
                ct: self.agent.send_predict(
                    ct,
                    {key: concat_rows([request[key] for _, _, request, _ in rows]) for key in rows[0][2]},
                    {key: concat_rows([states[key] for *_, states in rows]) for key in rows[0][3]},
                    evaluation=_marks(len(rows)) if evaluated == ct else None,
                )
                for ct, rows in asking.items()
                if rows
            }
            for ct, waiting in pending.items():
                actions, next_states = waiting.result()
                for row, (place, inputs, _, states) in enumerate(asking[ct]):
                    mine = {key: value[row : row + 1] for key, value in actions.items()}
                    if place is None and self.evaluation is not None:  # the evaluation game's row, the last
                        self.evaluation.play(mine, {key: value[row : row + 1] for key, value in next_states.items()})
                        continue
                    self.turns[place] = _Turn(
                        inputs,
                        states,
                        mine,
                        {key: value[row : row + 1] for key, value in next_states.items()},
                        waiting.version,
                    )
                    self.envs[place[0]].step(self.acting[(place, ct)].env_actions(mine)[0])

    def _to_next_turn(
        self,
        game: int,
        finished: dict[str, list[dict[str, Any]]],
        asking: dict[str, list[tuple[Place, dict[str, Any], dict[str, Any], dict[str, Any]]]],
    ) -> None:
        """Play game ``game`` on to the next agent that acts: store the turns that the observations on the way
        complete, step the agents that are done with ``None``, restart the game once all are; then ask for the
        acting agent's move."""
        env = self.envs[game]
        while True:
            if not env.agents:
                env.reset()
                self.ct_of[game] = self.seats()
                self._record_learner_only(game)
                if self.evaluation is not None:
                    self.evaluation.training_games_ended(1)
            name = env.agent_selection
            place, ct = (game, name), self.ct_of[game][name]
            observation, reward, terminated, truncated, _ = env.last()
            if ct.startswith(_FIXED_SEAT):
                fixed = PLAYERS[ct[len(_FIXED_SEAT) :]]
                env.step(None if terminated or truncated else fixed(observation, self.fixed_moves))
                continue
            acting = self._acting(place, ct)
            turn = self.turns.pop(place, None)
            if turn is not None:
                finished[ct].append(self._finished(place, acting, turn, observation, reward, terminated, truncated))
            if terminated or truncated:
                self.playing.discard(place)
                env.step(None)
                continue
            if place not in self.playing:
                acting.start([observation])
                self.playing.add(place)
            inputs, request, states = acting.request()
            asking[ct].append((place, inputs, request, states))
            return

    def _record_learner_only(self, game: int) -> None:
        """In self-play, the episodes reported are the learner's: the other seats' returns mirror its own."""
        if self.learner is not None:
            seats = self.ct_of[game].items()
            self.envs[game].unrecorded = {name for name, ct in seats if ct != self.learner}

    def _finished(
        self,
        place: Place,
        acting: Acting,
        turn: _Turn,
        observation: Any,
        reward: float,
        terminated: bool,
        truncated: bool,
    ) -> dict[str, Any]:
        """The stored step of ``place``'s last turn, now that its next observation came."""
        next_rows = acting.next_rows()
        next_rows.set(0, observation)
        rewards = np.array([reward], acting.reward_dtype)
        next_inputs = acting.stepped(next_rows, rewards, turn.actions, turn.next_states)
        game, name = place
        return {
            "inputs": turn.inputs,
            "actions": turn.actions,
            "rewards": {"reward": rewards},
            "next_inputs": next_inputs,
            "terminated": np.array([terminated]),
            "truncated": np.array([truncated]),
            "states": turn.states,
            "extras": {},
            "policy_version": np.array([turn.version], np.int64),
            ROW_IDS: np.array([game * len(self.places) + self.places[name]], np.int64),
        }

    def _acting(self, place: Place, ct: str) -> Acting:
        acting = self.acting.get((place, ct))
        if acting is None:
            spaces = self.spaces[ct]
            acting = self.acting[(place, ct)] = Acting(
                specs=self.agent.specs(ct),
                observation_space=spaces.observation_space,
                action_space=spaces.action_space,
                transforms=self.transforms[ct],
                count=1,
                training=not self.agent.evaluating,
            )
        return acting


def _marks(rows: int) -> np.ndarray:
    """The evaluation mask of a request of ``rows`` rows whose last is an evaluation game's."""
    marks = np.zeros(rows, bool)
    marks[-1] = True
    return marks


class _BaselineGames:
    """Self-play's evaluation games (module docstring): after every ``eval_every`` training games of the process, one
    game of ``agent.eval_env`` in which CT ``ct`` plays greedy in one seat and a fixed player the others, the seats
    and then the baselines taken in turn. Its row is the last of ``ct``'s requests, marked as an evaluation row;
    nothing of it is stored. The learner's return and moves make an evaluation episode of team BASELINE."""

    def __init__(self, agent: VectorAgent, env_id: str, ct: str, transforms: Transforms) -> None:
        recorder = agent.eval_env
        # The recorder of eval_env would record every seat's episode: only the learner's is recorded, by its opponent.
        self.env, self.stats = recorder.env, recorder.stats
        self.ct = ct
        self.baselines = baselines(env_id)
        self.schedule = EvaluationSchedule(agent.eval_every)
        spaces = shared_spaces(self.env, env_id, list(self.env.possible_agents))
        self.acting = Acting(
            specs=agent.specs(ct),
            observation_space=spaces.observation_space,
            action_space=spaces.action_space,
            transforms=transforms,
            count=1,
            training=False,
        )
        self.rng = np.random.default_rng(agent.env_seed(len(agent.envs) + 2))
        self.seed = agent.env_seed(len(agent.envs) + 3)
        self.games = 0
        self.seat, self.baseline = "", ""
        self.playing = False
        self.earned, self.moves = 0.0, 0

    def training_games_ended(self, count: int) -> None:
        self.schedule.training_episodes_ended(count)
        if not self.playing and self.schedule.start_if_due():
            self._start()

    def ask(self, asking: dict[str, list[Any]]) -> str | None:
        """Add the learner's turn to ``asking`` (last) while a game plays: the CT it asks, or None."""
        if not self.playing:
            return None
        inputs, request, states = self.acting.request()
        asking[self.ct].append((None, inputs, request, states))
        return self.ct

    def play(self, actions: dict[str, Any], next_states: dict[str, Any]) -> None:
        """The learner's move, then the fixed player's moves up to the learner's next turn or the game's end."""
        self.env.step(self.acting.env_actions(actions)[0])
        self.moves += 1
        turn = self._to_learners_turn()
        if turn is not None:
            next_rows = self.acting.next_rows()
            next_rows.set(0, turn[0])
            self.acting.stepped(next_rows, np.array([turn[1]], self.acting.reward_dtype), actions, next_states)

    def _start(self) -> None:
        seats = self.env.possible_agents
        self.seat = seats[self.games % len(seats)]
        self.baseline = self.baselines[(self.games // len(seats)) % len(self.baselines)]
        self.env.reset(seed=self.seed + self.games)
        self.games += 1
        self.earned, self.moves, self.playing = 0.0, 0, True
        turn = self._to_learners_turn()
        if turn is not None:
            self.acting.start([turn[0]])

    def _to_learners_turn(self) -> tuple[Any, float] | None:
        """The baseline's moves up to the learner's turn: its observation and the reward it received since its last
        move (AEC's ``last()``); None where the game ended, the learner's episode recorded and the next game begun
        if one is due."""
        env, player = self.env, PLAYERS[self.baseline]
        while env.agents and env.agent_selection != self.seat:
            observation, _, terminated, truncated, _ = env.last()
            env.step(None if terminated or truncated else player(observation, self.rng))
        observation, reward, terminated, truncated, _ = env.last() if env.agents else (None, 0.0, True, False, None)
        self.earned += float(reward)
        if not (terminated or truncated):
            return observation, float(reward)
        self.stats.eval_steps += self.moves
        self.stats.eval_finished.append((self.earned, self.moves, self.baseline))
        self.playing = False
        if self.schedule.start_if_due():
            self._start()
        return None
