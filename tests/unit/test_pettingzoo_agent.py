"""PettingZooAgent: each live agent of each game one row, agents that leave and join, each agent's episodes its own,
and each agent's place learned from in fragments of its own consecutive steps."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from doubles import AnsweringPort, received
from extras import skip_without

from flare2.core.env_making import env_spaces, shared_spaces
from flare2.core.fragments import FragmentsHelper
from flare2.core.helpers import ROW_IDS, OnlineHelper
from flare2.core.pettingzoo_agent import GLOBAL_STATE, PettingZooAgent, policy_map
from flare2.core.specs import CTSpecs, Spec, View
from flare2.errors import ConfigError
from flare2.runtime.agents.playing import StopRequested, make_envs

SPECS = CTSpecs(
    inputs={"obs": Spec((3,), "float32")},
    actions={"action": Spec((), "int64")},
    states={},
    rewards={"reward": Spec((), "float32")},
)
GAME_STEPS = 4
LEAVES_AFTER = 2


class Patrol:
    """A PettingZoo-style parallel game of 4 steps: ``scout_0``, ``scout_1`` and ``scout_2`` each see
    ``[game, their index, t]`` and earn their index + 1 a step; ``scout_2`` is caught (terminated) after 2 steps while
    the others play on until the game is truncated (the third agent is caught, whatever its name). Records the actions
    each agent was given."""

    possible_agents = ["scout_0", "scout_1", "scout_2"]
    games = 0

    def __init__(self) -> None:
        self.game = Patrol.games
        Patrol.games += 1
        self.agents: list[str] = []
        self.t = 0
        self.actions: list[dict[str, int]] = []

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(-100.0, 100.0, (3,), np.float64)

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def _observations(self) -> dict[str, np.ndarray]:
        return {agent: np.array([self.game, self.possible_agents.index(agent), self.t]) for agent in self.agents}

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return self._observations(), {agent: {} for agent in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), "every live agent acts, and only those"
        self.actions.append(dict(actions))
        self.t += 1
        observations = self._observations()
        rewards = {agent: float(self.possible_agents.index(agent) + 1) for agent in self.agents}
        terminations = {agent: agent == self.possible_agents[2] and self.t == LEAVES_AFTER for agent in self.agents}
        truncations = {agent: self.t == GAME_STEPS for agent in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return observations, rewards, terminations, truncations, {agent: {} for agent in observations}

    def close(self) -> None:
        pass


def first_action(inputs):
    return {"action": np.ones(len(inputs["obs"]), np.int64)}


def played(games: int, steps: int, make_env: type | None = None, answer=first_action, **agent_kwargs):
    """An agent of ``games`` games of ``make_env`` (Patrol) run for ``steps`` requests, each answered by ``answer``;
    ``agent_kwargs`` as PettingZooAgent takes them (``sample_interval`` 3 unless given)."""
    Patrol.games = 0
    agent = PettingZooAgent("tests.patrol", **{"sample_interval": 3, **agent_kwargs})
    agent.num_envs = games
    agent.make_env = make_env or Patrol
    stats = make_envs(agent, 0)
    port = AnsweringPort(steps, answer)
    learned: list[dict] = []
    port.learn = learned.append
    agent.connect(agent_id="a0", seed=0, specs={"RL": SPECS}, ports={"RL": port}, helpers=agent.helpers())
    with pytest.raises(StopRequested):
        agent.run()
    return agent, port, stats, learned


def test_each_live_agent_is_one_row_and_agents_that_leave_leave_the_requests():
    agent, port, stats, _ = played(games=2, steps=9)
    rows = [len(payload["inputs"]["obs"]) for payload in port.sent]
    # Two games of 3 scouts; scout_2 of each is caught after 2 steps; after 4 steps both games restart.
    assert rows[:9] == [6, 6, 4, 4, 6, 6, 4, 4, 6]
    live = [{tuple(row[:2]) for row in payload["inputs"]["obs"].tolist()} for payload in port.sent[:4]]
    assert live[0] == live[1] == {(g, i) for g in (0, 1) for i in range(3)}
    assert live[2] == live[3] == {(g, i) for g in (0, 1) for i in range(2)}
    for env in agent.envs:
        assert [sorted(actions) for actions in env.actions[:4]] == [["scout_0", "scout_1", "scout_2"]] * 2 + [
            ["scout_0", "scout_1"]
        ] * 2
    # Each agent's episode is its own: scout_i earns i + 1 a step; scout_2's ends after 2 steps.
    finished = sorted(stats.finished)
    assert finished == sorted([(4.0, 4, "scout"), (8.0, 4, "scout"), (6.0, 2, "scout")] * 4)
    assert stats.steps == 2 * (3 + 3 + 2 + 2) * 2 + 6  # two whole games in each of 2 envs, then one step


def test_each_place_is_learned_from_in_fragments_of_its_own_consecutive_steps():
    _, _, _, learned = played(games=2, steps=16, sample_interval=3)
    assert learned, "the helper sent a learn request"
    seen = 0
    for payload in learned:
        batch = received(SPECS, payload)
        obs, next_obs = batch["inputs"]["obs"], batch["next_inputs"]["obs"]
        for sequence, following in zip(obs, next_obs):
            # One place (game, agent) throughout, its steps one after another (t counts on, 0 after a restart).
            assert len({tuple(row[:2]) for row in sequence.tolist()}) == 1
            times = sequence[:, 2].tolist()
            assert all(b == a + 1 or b == 0 for a, b in zip(times, times[1:]))
            np.testing.assert_array_equal(following[:, 2], sequence[:, 2] + 1)
            seen += 1
        # A caught scout's episode ends as a termination, a game's end as a truncation.
        caught = batch["inputs"]["obs"][..., 1] == 2
        assert (batch["terminated"] == (caught & (batch["next_inputs"]["obs"][..., 2] == LEAVES_AFTER))).all()
        assert (batch["truncated"] == (batch["next_inputs"]["obs"][..., 2] == GAME_STEPS)).all()
    assert seen >= 6


class Relay(Patrol):
    """Patrol without a scout caught: all three play to the game's end, which comes after 4 + the game's index steps,
    so that the games restart at different times and a restarted game's rows come after the other's in requests."""

    def step(self, actions):
        assert set(actions) == set(self.agents), "every live agent acts, and only those"
        self.actions.append(dict(actions))
        self.t += 1
        observations = self._observations()
        ended = self.t == GAME_STEPS + self.game
        self.agents = [] if ended else self.agents
        return (
            observations,
            {agent: 1.0 for agent in observations},
            {agent: False for agent in observations},
            {agent: ended for agent in observations},
            {agent: {} for agent in observations},
        )


def test_each_agent_gets_the_action_asked_for_it_when_games_restart_at_different_times():
    # Each row's action is its game's number (the observation's first value) mod 2.
    agent, *_ = played(2, 20, Relay, answer=lambda inputs: {"action": (inputs["obs"][:, 0] % 2).astype(np.int64)})
    # Game 0 restarts a step before game 1, and its rows then come after game 1's: still, every agent of game g got
    # g mod 2, in every step of both games.
    for env in agent.envs:
        assert len(env.actions) >= 15
        assert all(set(actions.values()) == {env.game % 2} for actions in env.actions), env.actions


def replayed(make_env: type, steps: int) -> tuple[PettingZooAgent, list[dict]]:
    replay = {"capacity": 600, "warmup": 24, "sample_interval": 6, "batch_size": 8, "sequence_length": 3, "seed": 0}
    agent, _, _, learned = played(2, steps, make_env, replay=replay)
    return agent, learned


@pytest.mark.parametrize("make_env", [Relay, Patrol])
def test_a_replay_buffer_keeps_a_column_per_place_so_that_its_sequences_are_one_agents_own_steps(make_env):
    # Relay: game 0 restarts a step before game 1, and its rows then come after game 1's. Patrol: scout_2 leaves its
    # game after 2 of its 4 steps, and comes back when the game restarts.
    agent, learned = replayed(make_env, steps=30)
    assert agent.rows_stored("RL") == 6  # 2 games of 3 agents
    assert learned
    places = set()
    for payload in learned:
        batch = received(SPECS, payload)
        for sequence, following in zip(batch["inputs"]["obs"], batch["next_inputs"]["obs"]):
            # One place throughout, its steps one after another (t counts on, 0 after a restart).
            assert len({tuple(row[:2]) for row in sequence.tolist()}) == 1
            places.add(tuple(sequence[0, :2].tolist()))
            times = sequence[:, 2].tolist()
            assert all(b == a + 1 or b == 0 for a, b in zip(times, times[1:]))
            np.testing.assert_array_equal(following[:, 2], sequence[:, 2] + 1)
    assert places == {(game, index) for game in (0, 1) for index in range(3)}


def test_fragments_of_rows_that_all_play_every_step_are_online_helpers_request():
    rng = np.random.default_rng(0)
    fragments, online = FragmentsHelper(4), OnlineHelper(4)
    sent: dict[str, list] = {"fragments": [], "online": []}
    for name, helper in (("fragments", fragments), ("online", online)):
        port = AnsweringPort(0, first_action)
        port.learn = sent[name].append
        helper.attach("RL", SPECS, port, num_envs=3)
    for t in range(8):
        step = {
            "inputs": {"obs": rng.normal(size=(3, 3)).astype(np.float32)},
            "next_inputs": {"obs": rng.normal(size=(3, 3)).astype(np.float32)},
            "actions": {"action": rng.integers(0, 2, 3)},
            "rewards": {"reward": rng.normal(size=3).astype(np.float32)},
            "states": {},
            "extras": {},
            "terminated": np.array([t == 5, False, False]),
            "truncated": np.zeros(3, bool),
            "policy_version": np.full(3, t, np.int64),
        }
        online.store(dict(step))
        fragments.store({**step, ROW_IDS: np.array([7, 8, 9])})
    assert len(sent["fragments"]) == len(sent["online"]) == 2
    for mine, theirs in zip(sent["fragments"], sent["online"]):
        a, b = received(SPECS, mine), received(SPECS, theirs)
        for key in ("terminated", "truncated", "policy_version"):
            np.testing.assert_array_equal(a[key], b[key])
        np.testing.assert_array_equal(a["inputs"]["obs"], b["inputs"]["obs"])
        np.testing.assert_array_equal(a["next_inputs"]["obs"], b["next_inputs"]["obs"])


def test_fragments_refuse_views_and_steps_without_row_ids():
    with_views = CTSpecs(
        inputs={"obs": Spec((3,), "float32"), "obs_frames": Spec((2, 3), "float32")},
        actions={"action": Spec((), "int64")},
        states={},
        rewards={"reward": Spec((), "float32")},
        views={"obs_frames": View.last_observations(2)},
    )
    with pytest.raises(ConfigError, match="views.*--frames 1"):
        FragmentsHelper().attach("RL", with_views, None, num_envs=1)
    helper = FragmentsHelper()
    helper.attach("RL", SPECS, None, num_envs=1)
    with pytest.raises(ConfigError, match="row_ids"):
        helper.store({"terminated": np.zeros(1, bool)})


def test_agents_of_different_spaces_cannot_share_one_ct():
    class Mixed(Patrol):
        def action_space(self, agent):
            return gym.spaces.Discrete(3 if agent == "scout_1" else 2)

    with pytest.raises(ConfigError, match="'scout_1' has .*Discrete\\(3\\)"):
        shared_spaces(Mixed(), "mixed")


def test_the_spaces_an_algorithm_is_built_for_are_those_the_agents_share():
    skip_without("pettingzoo", "mpe2")
    spaces = env_spaces("mpe2.simple_spread_v3")
    assert spaces.observation_space.shape == (18,) and spaces.action_space == gym.spaces.Discrete(5)


def test_policy_maps_give_each_agent_its_ct():
    agents = ["adversary_0", "agent_0", "agent_1"]
    assert policy_map(agents, "shared") == dict.fromkeys(agents, "RL")
    assert policy_map(agents, "team") == {"adversary_0": "adversary", "agent_0": "agent", "agent_1": "agent"}
    assert policy_map(agents, "agent") == {agent: agent for agent in agents}
    # An agent's own pair wins over its team's.
    assert policy_map(agents, "agent=good, agent_1=solo, adversary=bad") == {
        "adversary_0": "bad",
        "agent_0": "good",
        "agent_1": "solo",
    }


def test_a_policy_map_that_misses_an_agent_or_names_a_stranger_says_which():
    agents = ["adversary_0", "agent_0", "agent_1"]
    with pytest.raises(ConfigError, match=r"no CT to agents \['adversary_0'\].*adversary=CT"):
        policy_map(agents, "agent=good")
    with pytest.raises(ConfigError, match=r"\['runner'\], which are neither .* a team of \['adversary', 'agent'\]"):
        policy_map(agents, "agent=good,adversary=bad,runner=x")
    with pytest.raises(ConfigError, match="pairs NAME=CT"):
        policy_map(agents, "everyone")
    with pytest.raises(ConfigError, match="a CT's name is a Python identifier \\(red_team\\), not 'red-team'"):
        policy_map(agents, "adversary=red-team,agent=blue")


class Duel(Patrol):
    """Patrol with two teams: ``scout_0`` and ``scout_1``, and ``guard_0``, who sees one number more."""

    possible_agents = ["scout_0", "scout_1", "guard_0"]

    def observation_space(self, agent):
        return gym.spaces.Box(-100.0, 100.0, (4 if agent == "guard_0" else 3,), np.float64)

    def _observations(self):
        return {
            agent: np.array([self.game, self.possible_agents.index(agent), self.t] + [0.0] * (agent == "guard_0"))
            for agent in self.agents
        }


def test_each_team_is_asked_on_its_own_ct_with_its_own_rows():
    guard_specs = CTSpecs(
        inputs={"obs": Spec((4,), "float32")},
        actions={"action": Spec((), "int64")},
        states={},
        rewards={"reward": Spec((), "float32")},
    )
    agent = PettingZooAgent("tests.duel", policy_map="team")
    agent.num_envs = 2
    agent.make_env = Duel
    assert sorted(agent.helpers()) == ["guard", "scout"]
    make_envs(agent, 0)
    ports = {"scout": AnsweringPort(3, first_action), "guard": AnsweringPort(3, first_action)}
    for port in ports.values():
        port.learn = lambda payload: None
    agent.connect(
        agent_id="a0",
        seed=0,
        specs={"scout": SPECS, "guard": guard_specs},
        ports=ports,
        helpers=agent.helpers(),
    )
    with pytest.raises(StopRequested):
        agent.run()
    # Two games: 4 scouts on their CT, 2 guards on theirs; each guard's row is [game, 2, t, 0].
    scouts = ports["scout"].sent[0]["inputs"]["obs"]
    guards = ports["guard"].sent[0]["inputs"]["obs"]
    assert sorted(scouts[:, 1].tolist()) == [0, 0, 1, 1] and len(set(scouts[:, 0].tolist())) == 2
    assert guards.shape == (2, 4) and guards[:, 1].tolist() == [2, 2]
    # The guards leave after 2 steps (Patrol's third agent is caught): the scouts play on without them.
    assert [len(sent["inputs"]["obs"]) for sent in ports["guard"].sent] == [2, 2]


def test_a_ct_the_run_does_not_serve_is_named():
    agent = PettingZooAgent("tests.duel", policy_map="agent")
    agent.num_envs = 1
    agent.make_env = Duel
    make_envs(agent, 0)
    with pytest.raises(ConfigError, match=r"asks for CT\(s\) \['guard_0', 'scout_0', 'scout_1'\]"):
        agent.connect(agent_id="a0", seed=0, specs={"RL": SPECS}, ports={}, helpers=agent.helpers())


class Surveyed(Patrol):
    """Patrol with a game state: ``[game, t]``."""

    state_space = gym.spaces.Box(-100.0, 100.0, (2,), np.float64)

    def state(self):
        return np.array([self.game, self.t])


def test_a_centralised_critics_ct_gets_each_rows_game_state_beside_its_observation():
    specs = CTSpecs(
        inputs={"obs": Spec((3,), "float32"), GLOBAL_STATE: Spec((2,), "float32")},
        actions={"action": Spec((), "int64")},
        states={},
        rewards={"reward": Spec((), "float32")},
    )
    Patrol.games = 0
    agent = PettingZooAgent("tests.surveyed")
    agent.num_envs = 2
    agent.make_env = Surveyed
    make_envs(agent, 0)
    port = AnsweringPort(3, first_action)
    port.learn = lambda payload: None
    agent.connect(agent_id="a0", seed=0, specs={"RL": specs}, ports={"RL": port}, helpers=agent.helpers())
    with pytest.raises(StopRequested):
        agent.run()
    for t, sent in enumerate(port.sent[:3]):
        obs, state = sent["inputs"]["obs"], sent["inputs"][GLOBAL_STATE]
        np.testing.assert_array_equal(state[:, 0], obs[:, 0])  # each row's own game
        assert (state[:, 1] == t).all() and (obs[:, 2] == t).all()
    # An env without state() cannot feed such a CT: the check names the fix.
    plain = PettingZooAgent("tests.patrol")
    plain.num_envs = 1
    plain.make_env = Patrol
    make_envs(plain, 0)
    with pytest.raises(ConfigError, match="has no state\\(\\).*--critic own"):
        plain.connect(agent_id="a0", seed=0, specs={"RL": specs}, ports={"RL": port}, helpers=plain.helpers())


def test_a_centralised_critic_values_the_game_state_and_the_policy_sees_the_observation_alone():
    import torch

    from flare2.zoo.models import ActorCritic

    model = ActorCritic(
        gym.spaces.Box(-1.0, 1.0, (3,)), gym.spaces.Discrete(2), critic_space=gym.spaces.Box(-1.0, 1.0, (5,))
    )
    assert set(model.input_specs()) == {"obs", GLOBAL_STATE}
    obs, state = torch.rand(4, 3), torch.rand(4, 5)
    policy, value = model.policy_and_value({"obs": obs, GLOBAL_STATE: state})
    other_policy, other_value = model.policy_and_value({"obs": obs, GLOBAL_STATE: state + 1})
    torch.testing.assert_close(policy, other_policy)
    assert not torch.allclose(value, other_value)
    torch.testing.assert_close(model.value({"obs": obs + 1, GLOBAL_STATE: state}), value)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--env", "nosuchpackage_xyz.game_v1"], "'nosuchpackage_xyz' is not installed: install the package"),
        (["--env", "turn_games.corridor_v0", "--eval-every", "5"], r"--eval-every \(without --self-play\): flare2"),
        (["--env", "turn_games.corridor_v0", "--self-play-pool", "4"], "give --self-play N as well"),
        (["--env", "turn_games.corridor_v0", "--policy-map", "runner=a,x=b"], r"\['x'\], which are neither"),
        (["--env", "CartPole-v1", "--policy-map", "team"], "--policy-map and the --self-play options take"),
        (["--env", "turn_games.corridor_v0", "--self-play-sparring", "random=0.5"], "give --self-play N as well"),
        (["--env", "turn_games.corridor_v0", "--self-play", "2", "--self-play-sparring", "lookahead=0.5"], "not 'look"),
        (["--env", "tests_parallel_missing.x_v0", "--self-play", "2"], "'tests_parallel_missing' is not installed"),
        (["--env", "turn_games.corridor_v0", "--self-play", "2", "--policy-map", "agent"], "with no --policy-map"),
        (["--env", "CartPole-v1", "--critic", "state"], "--critic state: a centralised critic"),
        (["--env", "turn_games.corridor_v0", "--frames", "4"], "--frames 4: flare2 plays .* without frame stacks"),
    ],
)
def test_flare2_train_refuses_what_it_cannot_do_with_a_multi_agent_env_naming_the_option(argv, message):
    from flare2.commands.train import _RaisingParser, resolve

    algo = [] if "--algo" in argv else ["--algo", "ppo"]
    with pytest.raises(ConfigError, match=message):
        resolve([*argv, *algo], parser_class=_RaisingParser)
