"""The stock agent of multi-agent envs: PettingZoo's envs, every live agent of every game one row of a request on
the CT its policy map gives it (one CT for all by default: parameter sharing). Imports no torch.

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

Turn-based games (the AEC API) are played by ``flare2.core.turn_based``: one
row per game, the agent whose turn it is; there, ``self_play`` puts the
learner in one seat of each game and a frozen copy of it in the others.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.acting import Acting
from flare2.core.agent import VectorAgent
from flare2.core.board_players import baselines, check_fixed_players_can_play
from flare2.core.env_making import AgentSpaces, is_turn_based, make_pettingzoo_env, shared_spaces
from flare2.core.envs import DEFAULT_CT
from flare2.core.fragments import FragmentsHelper
from flare2.core.helpers import ROW_IDS, AgentHelper, AskOnlyHelper
from flare2.core.parallel_games import GLOBAL_STATE, ParallelGames, Step
from flare2.core.replay import ExpReplayHelper
from flare2.core.spaces import OBS_KEY, action_specs, input_specs
from flare2.core.specs import CTSpecs
from flare2.core.transforms import Transforms
from flare2.core.turn_based import TurnBasedPlay, fixed_seat
from flare2.errors import ConfigError

OPPONENT_CT = "opponent"
"""Self-play's frozen opponent: the CT of the seats that the learner (CT ``RL``) does not take."""

_NUMBERED = re.compile(r"_\d+$")

POLICY_MAPS = ("shared", "team", "agent")
"""The stock policy maps: every agent on CT ``RL`` (parameter sharing), one CT per team, one CT per agent."""


def team_of(agent: str) -> str:
    """The team of a PettingZoo agent: its name without the number PettingZoo gives each of a kind (``adversary_0``
    and ``adversary_1`` are team ``adversary``)."""
    return _NUMBERED.sub("", str(agent))


def policy_map(agents: Sequence[str], spec: str, shared_ct: str = DEFAULT_CT) -> dict[str, str]:
    """Each agent's CT by ``spec``: ``shared`` (all on ``shared_ct``), ``team`` (a CT per team, named by it), ``agent``
    (a CT per agent, named by it), or pairs ``NAME=CT,...`` where NAME is an agent or a team (an agent's own pair wins
    over its team's); a ConfigError names an agent that no pair covers."""
    if spec == "shared":
        return {agent: shared_ct for agent in agents}
    if spec == "team":
        return {agent: team_of(agent) for agent in agents}
    if spec == "agent":
        return {agent: str(agent) for agent in agents}
    pairs: dict[str, str] = {}
    for pair in spec.split(","):
        name, equals, ct = (part.strip() for part in pair.partition("="))
        if not (equals and name and ct):
            raise ConfigError(
                f"--policy-map {spec!r}: give {', '.join(POLICY_MAPS)}, or pairs NAME=CT separated by commas (NAME: "
                f"an agent or a team of {list(agents)}), not {pair!r}"
            )
        if not ct.isidentifier():
            raise ConfigError(f"--policy-map {spec!r}: a CT's name is a Python identifier (red_team), not {ct!r}")
        pairs[name] = ct
    unknown = sorted(set(pairs) - set(agents) - {team_of(agent) for agent in agents})
    if unknown:
        teams = sorted({team_of(agent) for agent in agents})
        raise ConfigError(
            f"--policy-map {spec!r} names {unknown}, which are neither agents nor teams of the env: name an agent of "
            f"{list(agents)} or a team of {teams} (an agent's name without its number)"
        )
    uncovered = [agent for agent in agents if agent not in pairs and team_of(agent) not in pairs]
    if uncovered:
        raise ConfigError(
            f"--policy-map {spec!r} gives no CT to agents {uncovered}: add a pair for each (AGENT=CT) or for their "
            f"team ({team_of(uncovered[0])}=CT)"
        )
    return {agent: pairs.get(agent, pairs.get(team_of(agent), "")) for agent in agents}


def sparring_shares(spec: str, env_id: str) -> dict[str, float]:
    """The fixed players self-play's learner spars with and the share of the training games each takes, from
    ``PLAYER=SHARE,...`` (``lookahead=0.5``); ``""``: none. A ConfigError names a player the game does not have, a
    share outside (0, 1] or shares that add up to more than 1."""
    players = baselines(env_id)
    shares: dict[str, float] = {}
    for pair in filter(None, (part.strip() for part in spec.split(","))):
        player, _, share_text = (part.strip() for part in pair.partition("="))
        if player not in players:
            raise ConfigError(
                f"--self-play-sparring {spec!r}: {env_id} is played by the fixed players {list(players)}, not "
                f"{player!r}"
            )
        try:
            share = float(share_text)
        except ValueError:
            share = 0.0
        if not 0 < share <= 1:
            raise ConfigError(
                f"--self-play-sparring {spec!r}: give each player the share of the training games it plays, a number "
                f"in (0, 1] (lookahead=0.5), not {pair!r}"
            )
        shares[player] = share
    if sum(shares.values()) > 1:
        raise ConfigError(f"--self-play-sparring {spec!r}: the shares add up to more than all the games")
    return shares


def policy_groups(agents: Sequence[str], ct_of: Callable[[str], str]) -> dict[str, list[str]]:
    """Each CT's agents, in the env's order, as ``ct_of`` maps them (a policy map, or an agent's ``policy_of``)."""
    groups: dict[str, list[str]] = {}
    for agent in agents:
        groups.setdefault(ct_of(agent), []).append(agent)
    return groups


class PettingZooAgent(VectorAgent):
    """Plays ``num_envs`` games of a PettingZoo parallel env (module docstring), each agent with the CT its policy map
    gives it (``policy_map``: ``shared``, ``team``, ``agent`` or pairs, see ``policy_map``); a subclass may override
    ``policy_of`` instead. Each CT's agents share its input ``obs`` (or one per key of a Dict observation space),
    action ``action`` and reward ``reward``.

    ``transforms`` as GymAgent's, one pipeline per CT; each game gets its own seed (``env_seed``) at its first reset.

    ``self_play`` (turn-based games): in each game one seat, drawn as the game starts, is the learner's (CT ``RL``)
    and the others are its opponent's (CT ``opponent``, a frozen copy of ``RL`` that the compute process refreshes:
    ``CTConfig.follows``), whose turns are not learned from. With the run's ``eval_every``, the learner also plays
    greedy evaluation games against the game's fixed players (``flare2.core.turn_based``). ``sparring``
    (``PLAYER=SHARE,...``, see ``sparring_shares``) puts a fixed player of ``flare2.core.board_players`` in the
    opponent's seats of that share of the games instead of the frozen copy: the learner learns from those games as
    from the others, against an opponent that punishes what its own past copies let pass.

    ``replay`` (``ExpReplayHelper``'s keyword arguments, as ``flare2 train --algo dqn`` gives them) learns each
    learning CT from a replay buffer with a column per place (game and agent), which fills as its agent acts (every
    step, every other turn, or until it dies): the n-step returns run along one agent's own steps.
    """

    def __init__(
        self,
        env_id: str = "mpe2.simple_spread_v3",
        *,
        env_kwargs: dict[str, Any] | None = None,
        policy_map: str = "shared",
        sample_interval: int = 5,
        transforms: list[Any] | None = None,
        self_play: bool = False,
        sparring: str = "",
        replay: dict[str, Any] | None = None,
    ) -> None:
        self.env_id = env_id
        self.env_kwargs = env_kwargs or {}
        self.policy_map = policy_map
        self.sample_interval = sample_interval
        self.transforms = transforms or []
        self.self_play = self_play
        self.sparring = sparring
        self.replay = replay
        self._possible_agents: list[str] | None = None

    def make_env(self) -> Any:
        return make_pettingzoo_env(self.env_id, self.env_kwargs)

    @property
    def possible_agents(self) -> list[str]:
        """Every agent a game of the env may have (one game is made to learn them before the envs are)."""
        if self._possible_agents is None:
            envs = getattr(self, "envs", None)  # the runtime makes them after it asks for the helpers
            if envs:
                self._possible_agents = list(envs[0].possible_agents)
            else:
                env = self.make_env()
                self._possible_agents = list(env.possible_agents)
                env.close()
        return self._possible_agents

    def policy_of(self, agent: str) -> str:
        """The CT that acts for ``agent`` and learns from it (RLlib's ``policy_mapping_fn``)."""
        return policy_map(self.possible_agents, self.policy_map)[agent]

    def policies(self) -> dict[str, list[str]]:
        """Each CT's agents, in the env's order (with ``self_play``, every agent may play on either CT)."""
        if self.self_play:
            return {DEFAULT_CT: list(self.possible_agents), OPPONENT_CT: list(self.possible_agents)}
        return policy_groups(self.possible_agents, self.policy_of)

    def helpers(self) -> dict[str, AgentHelper]:
        return {ct: self._helper(ct) for ct in self.policies()}

    def _helper(self, ct: str) -> AgentHelper:
        if self.self_play and ct == OPPONENT_CT:
            return AskOnlyHelper()  # the frozen copy learns nothing of its own
        return FragmentsHelper(self.sample_interval) if self.replay is None else ExpReplayHelper(**self.replay)

    @cached_property
    def sparring_partners(self) -> dict[str, float]:
        """The fixed players of ``sparring`` and their shares of the games (``sparring_shares``)."""
        return sparring_shares(self.sparring, self.env_id)

    def rows_stored(self, ct: str) -> int:
        """A row per place of the CT's agents in every game: a replay buffer's columns."""
        return self.num_envs * len(self.policies()[ct])

    def _seats(self) -> dict[str, str]:
        """Self-play: each agent's CT in a game that starts, the learner's seat drawn at random, and the opponent's
        seats the frozen copy's or, for the sparring share of the games, a fixed player's."""
        agents = self.possible_agents
        learner = agents[int(self._seat_draws.integers(len(agents)))]
        opponent, draw = OPPONENT_CT, self._seat_draws.random() if self.sparring_partners else 1.0
        for player, share in self.sparring_partners.items():
            if draw < share:
                opponent = fixed_seat(player)
                break
            draw -= share
        return {agent: DEFAULT_CT if agent == learner else opponent for agent in agents}

    def check_specs(self, specs: Mapping[str, CTSpecs]) -> None:
        for ct, agents in self.policies().items():
            spaces = shared_spaces(self.envs[0], self.env_id, agents)
            ct_specs = specs[ct]
            if GLOBAL_STATE in ct_specs.acting_inputs and spaces.state_space is None:
                raise ConfigError(
                    f"CT {ct!r} asks for the game's {GLOBAL_STATE!r} (a centralised critic), and {self.env_id!r} "
                    "has no state(): give it a critic of the agents' own observations (--critic own)"
                )
            seen = _seen_space(spaces, with_state=GLOBAL_STATE in ct_specs.acting_inputs)
            env_inputs, env_actions = input_specs(seen), action_specs(spaces.action_space)
            fits = set(ct_specs.acting_inputs) == set(env_inputs) and set(env_actions) <= set(ct_specs.actions)
            if not fits or set(ct_specs.rewards) != {"reward"}:
                raise ConfigError(
                    f"PettingZooAgent sends the inputs {sorted(env_inputs)} and reward 'reward' of agents {agents} of "
                    f"env {self.env_id!r} and reads the actions {sorted(env_actions)}, but CT {ct!r} declares inputs "
                    f"{sorted(ct_specs.acting_inputs)}, actions {sorted(ct_specs.actions)}, rewards "
                    f"{sorted(ct_specs.rewards)}: use a model with those spec names or write your own agent"
                )
        if self.eval_env is not None and not self.self_play:
            raise ConfigError(
                "PettingZooAgent plays evaluation games during training in self-play alone (the learner against "
                "fixed players): run without --eval-every, or play the run's policies after it with flare2 eval"
            )
        sparring = self.sparring_partners
        if sparring and not self.self_play:
            raise ConfigError(
                "--self-play-sparring puts fixed players in self-play's opponent seats: give --self-play N"
            )
        for wanted, option in ((self.eval_env is not None, "--eval-every"), (bool(sparring), "--self-play-sparring")):
            if wanted:
                seat = self.possible_agents[0]
                check_fixed_players_can_play(self.envs[0].observation_space(seat), self.env_id, option)
        if self.self_play and not is_turn_based(self.envs[0]):
            raise ConfigError(
                f"self-play takes turn-based games (PettingZoo's AEC API), and {self.env_id!r} plays all its agents "
                "at once: leave --self-play out"
            )

    def run(self) -> None:
        if is_turn_based(self.envs[0]):
            self._seat_draws = np.random.default_rng(self.env_seed(len(self.envs) + 1))
            seats = self._seats if self.self_play else None
            learner = DEFAULT_CT if self.self_play else None
            TurnBasedPlay(self, self.env_id, self.policies(), self.transforms, seats, learner).run()
        policies = self.policies()
        with_state = {ct for ct in policies if GLOBAL_STATE in self.specs(ct).acting_inputs}
        games = ParallelGames(
            self.envs, [self.env_seed(index) for index in range(len(self.envs))], self.policy_of, with_state
        )
        acting = {ct: self._acting(ct, agents, ct in with_state) for ct, agents in policies.items()}
        for ct, pipeline in acting.items():
            pipeline.regroup(np.zeros(0, np.int64), games.observations(games.rows[ct]))
        while True:
            # Every CT asked at once: each answers while the others do.
            asked = {}
            for ct, pipeline in acting.items():
                if pipeline.count:
                    inputs, request, states = pipeline.request()
                    asked[ct] = (inputs, states, self.send_predict(ct, request, states))
            replies = {ct: pending.result() for ct, (_, _, pending) in asked.items()}
            rows = dict(games.rows)
            steps = games.step({ct: acting[ct].env_actions(actions) for ct, (actions, _) in replies.items()})
            for ct in asked:
                self._stepped(ct, acting[ct], rows[ct], steps[ct], asked[ct], replies[ct], games)
            for ct, (kept, joined) in games.regroup({ct: step.ended for ct, step in steps.items()}).items():
                if len(kept) != len(rows[ct]) or joined:
                    acting[ct].regroup(np.asarray(kept, np.int64), games.observations(joined))

    def _acting(self, ct: str, agents: list[str], with_state: bool) -> Acting:
        spaces = shared_spaces(self.envs[0], self.env_id, agents)
        return Acting(
            specs=self.specs(ct),
            observation_space=_seen_space(spaces, with_state=with_state),
            action_space=spaces.action_space,
            transforms=self.bind_transforms(ct, Transforms.from_options(self.transforms)),
            count=0,
            training=not self.evaluating,
        )

    def _stepped(
        self,
        ct: str,
        acting: Acting,
        rows: list[tuple[int, str]],
        step: Step,
        asked: tuple[dict[str, Any], dict[str, Any], Any],
        reply: tuple[dict[str, Any], dict[str, Any]],
        games: ParallelGames,
    ) -> None:
        """CT ``ct``'s rows stepped: their next observations into its pipeline, the step to its helper."""
        inputs, states, pending = asked
        actions, next_states = reply
        next_rows = acting.next_rows()
        for index, observation in enumerate(step.observations):
            next_rows.set(index, observation)
        rewards = step.rewards.astype(acting.reward_dtype, copy=False)
        next_inputs = acting.stepped(next_rows, rewards, actions, next_states)
        self._store_rows(
            ct,
            {
                "inputs": inputs,
                "actions": actions,
                "rewards": {"reward": rewards},
                "next_inputs": next_inputs,
                "terminated": step.terminated,
                "truncated": step.truncated,
                "states": states,
                "extras": None,
                "policy_version": np.full(len(rows), pending.version, np.int64),
                ROW_IDS: games.row_ids(rows),
            },
            len(rows),
        )


def _seen_space(spaces: AgentSpaces, *, with_state: bool) -> gym.Space:
    """What a CT's rows hold of each agent: its observation, and the game's state for a centralised critic (beside the
    keys of a Dict observation, or beside ``obs``)."""
    if not with_state:
        return spaces.observation_space
    assert spaces.state_space is not None, "check_specs refuses a state the env does not have"
    own = spaces.observation_space
    parts = dict(own.spaces) if isinstance(own, gym.spaces.Dict) else {OBS_KEY: own}
    return gym.spaces.Dict({**parts, GLOBAL_STATE: spaces.state_space})
