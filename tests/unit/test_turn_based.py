"""Turn-based games (PettingZoo's AEC API): each agent's turn stored at its next turn, with every reward it received
meanwhile, each agent's episode its own, and a masked move never sampled."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from doubles import AnsweringPort, KeepingHelper, received
from turn_games.corridor_v0 import TURNS, Corridor

import flare2
from flare2.commands.evaluate import _against_line, play_games
from flare2.commands.policies import load_policies
from flare2.core.helpers import ROW_IDS, AskOnlyHelper
from flare2.core.pettingzoo_agent import PettingZooAgent
from flare2.core.specs import CTSpecs, Spec
from flare2.errors import ConfigError
from flare2.runtime.agents.playing import StopRequested, make_envs

SPECS = CTSpecs(
    inputs={"observation": Spec((2,), "float32"), "action_mask": Spec((7,), "bool")},
    actions={"action": Spec((), "int64")},
    states={},
    rewards={"reward": Spec((), "float32")},
)


def legal_moves(inputs):
    return {"action": np.argmax(inputs["action_mask"], axis=1).astype(np.int64)}


def test_each_turn_is_stored_at_its_agents_next_turn_with_what_it_earned_meanwhile():
    agent = PettingZooAgent("turn_games.corridor_v0")
    agent.num_envs = 2
    agent.make_env = Corridor
    stats = make_envs(agent, 0)
    port, helper = AnsweringPort(2 * TURNS // 2 + 1, legal_moves), KeepingHelper()
    agent.connect(agent_id="a0", seed=0, specs={"RL": SPECS}, ports={"RL": port}, helpers={"RL": helper})
    with pytest.raises(StopRequested):
        agent.run()
    # Each request holds one row per game: the agent whose turn it is there.
    assert [len(sent["inputs"]["observation"]) for sent in port.sent] == [2] * len(port.sent)
    rows: dict[int, list[tuple]] = {}
    for step in helper.steps:
        for row, place in enumerate(step[ROW_IDS].tolist()):
            rows.setdefault(place, []).append(
                (
                    step["inputs"]["observation"][row].tolist(),
                    float(step["rewards"]["reward"][row]),
                    bool(step["terminated"][row]),
                    step["next_inputs"]["observation"][row].tolist(),
                )
            )
    # Places 0 and 1 are game 0's runners, 2 and 3 game 1's; runner i moves at turns i, i + 2, i + 4.
    for place in range(4):
        runner = place % 2
        turns = [runner, runner + 2, runner + 4]
        assert [inputs for inputs, *_ in rows[place]] == [[runner, t] for t in turns]
        # The next observation of a turn is the one of the runner's next turn, or the game's end.
        assert [following for *_, following in rows[place]] == [[runner, t] for t in (*turns[1:], TURNS)]
        # runner_1's last move ends the game: runner_0 earns +1 on it, credited to its own last move.
        assert [(reward, ended) for _, reward, ended, _ in rows[place]] == [(0.0, False), (0.0, False)] + [
            (1.0 if runner == 0 else -1.0, True)
        ]
    assert sorted(stats.finished) == [(-1.0, 3, "runner")] * 2 + [(1.0, 3, "runner")] * 2


def test_a_masked_move_is_never_sampled_when_the_zoo_learns_a_turn_based_game(tmp_path):
    # Corridor raises at the first illegal move, and 6 of its 7 moves are illegal at every turn: a policy that
    # ignored the mask would end this run within a few moves.
    run = flare2.train(
        "turn_games.corridor_v0",
        "ppo",
        max_steps=1500,
        serial=True,
        epochs=1,
        envs_per_agent=4,
        sample_interval=12,
        log_dir=str(tmp_path),
    )
    assert run.exit_code == 0 and run.env_steps >= 1500
    assert run.episodes >= 2 * (1500 // TURNS - 4)  # each game two episodes, but for the 4 games still on
    # flare2 eval's way: every runner played by the policy, game after game, each one's return its own.
    games, _ = play_games(load_policies(tmp_path), 3, seed=0, greedy=True, video=None)
    assert games == [{"runner_0": (1.0, 3), "runner_1": (-1.0, 3)}] * 3
    # Against a fixed player, which takes runner_1's seat in the first game and runner_0's in the second: the policy
    # wins as runner_0 and loses as runner_1 (the last move decides), and sees only its own turns.
    games, fixed = play_games(load_policies(tmp_path), 2, seed=0, greedy=True, video=None, against="random")
    assert fixed == ["runner_1", "runner_0"]
    assert _against_line(games, fixed, "random") == "against random: won 1, drew 0, lost 1 of 2 (win rate 50%)"
    # The connect four players play no other game.
    with pytest.raises(
        ConfigError, match=r"no lookahead player, its fixed players are \['random'\]: use --against random"
    ):
        play_games(load_policies(tmp_path), 1, seed=0, greedy=True, video=None, against="lookahead")


def test_dqn_learns_a_turn_based_game_without_a_masked_move_sampled(tmp_path):
    # As above for PPO: Corridor raises at the first illegal move. Exploring, DQN draws among the legal moves.
    run = flare2.train(
        "turn_games.corridor_v0", "dqn", max_steps=1200, serial=True, envs_per_agent=4, log_dir=str(tmp_path)
    )
    assert run.exit_code == 0 and run.env_steps >= 1200
    games, _ = play_games(load_policies(tmp_path), 2, seed=0, greedy=True, video=None)
    assert games == [{"runner_0": (1.0, 3), "runner_1": (-1.0, 3)}] * 2


def test_a_replay_buffer_in_self_play_keeps_each_places_turns_in_a_column_of_its_own():
    replay = {"capacity": 600, "warmup": 12, "sample_interval": 2, "batch_size": 16, "sequence_length": 3, "seed": 0}
    agent = PettingZooAgent("turn_games.corridor_v0", self_play=True, replay=replay)
    agent.num_envs = 3
    agent.make_env = Corridor
    make_envs(agent, 0)
    ports = {"RL": AnsweringPort(80, legal_moves), "opponent": AnsweringPort(80, legal_moves)}
    learned: list[dict] = []
    ports["RL"].learn = learned.append
    agent.connect(agent_id="a0", seed=0, specs={"RL": SPECS, "opponent": SPECS}, ports=ports, helpers=agent.helpers())
    assert agent.rows_stored("RL") == 6  # a column for each seat of each game: the learner takes either
    with pytest.raises(StopRequested):
        agent.run()
    assert learned
    seats = set()
    for payload in learned:
        batch = received(SPECS, payload)
        seen, following = batch["inputs"]["observation"], batch["next_inputs"]["observation"]
        for sequence, next_sequence, ended in zip(seen, following, batch["terminated"]):
            # One seat throughout, its turns two apart (runner i moves at turns i, i + 2, i + 4), and after its
            # last turn the game's end (turn 6), where its episode ends.
            assert len(set(sequence[:, 0].tolist())) == 1
            seats.add(int(sequence[0, 0]))
            np.testing.assert_array_equal(next_sequence[:, 1], np.where(ended, TURNS, sequence[:, 1] + 2))
            assert (ended == (sequence[:, 1] + 2 >= TURNS)).all()
    assert seats == {0, 1}


def test_in_self_play_one_seat_a_game_is_the_learners_and_only_its_turns_are_learned_from():
    agent = PettingZooAgent("turn_games.corridor_v0", self_play=True)
    agent.num_envs = 3
    agent.make_env = Corridor
    assert set(agent.policies()) == {"RL", "opponent"}
    stats = make_envs(agent, 0)
    ports = {"RL": AnsweringPort(40, legal_moves), "opponent": AnsweringPort(40, legal_moves)}
    learner = KeepingHelper()
    helpers = agent.helpers()
    agent.connect(
        agent_id="a0", seed=0, specs={"RL": SPECS, "opponent": SPECS}, ports=ports, helpers={**helpers, "RL": learner}
    )
    with pytest.raises(StopRequested):
        agent.run()
    rows = [
        len(ports["RL"].sent[i]["inputs"]["observation"]) + len(ports["opponent"].sent[i]["inputs"]["observation"])
        for i in range(min(len(ports["RL"].sent), len(ports["opponent"].sent)))
    ]
    assert rows and set(rows) == {3}  # one agent a game moves at a time, on one CT or the other
    seats = {int(row[0]) for step in learner.steps for row in step["inputs"]["observation"]}
    assert seats == {0, 1}  # the learner took both seats over the games
    # Each learned turn is a turn the learner's CT was asked for: as many as its rows, less those still on their way.
    asked = sum(len(sent["inputs"]["observation"]) for sent in ports["RL"].sent)
    learned = sum(len(step["terminated"]) for step in learner.steps)
    assert asked - 3 <= learned <= asked
    assert isinstance(helpers["opponent"], AskOnlyHelper)  # the frozen copy learns nothing of its own
    # The episodes reported are the learner's alone (the copy's returns would mirror them): one for each of its
    # episodes that ended, and none of the copy's.
    ended = sum(int(step["terminated"].sum()) for step in learner.steps)
    assert ended and len(stats.finished) == ended


def self_play_run(
    games: int = 3, eval_every: int = 0, sparring: str = ""
) -> tuple[dict[str, AnsweringPort], KeepingHelper, Any]:
    """A self-play agent of ``games`` corridor games (``eval_every``, ``sparring`` as a run gives them), run until its
    ports stop it: the ports, the learner's helper and the agent's episode stats."""
    agent = PettingZooAgent("turn_games.corridor_v0", self_play=True, sparring=sparring)
    agent.num_envs = games
    agent.make_env = Corridor
    stats = make_envs(agent, eval_every)
    ports = {"RL": AnsweringPort(60, legal_moves), "opponent": AnsweringPort(60, legal_moves)}
    learner = KeepingHelper()
    agent.connect(
        agent_id="a0",
        seed=0,
        specs={"RL": SPECS, "opponent": SPECS},
        ports=ports,
        helpers={**agent.helpers(), "RL": learner},
    )
    with pytest.raises(StopRequested):
        agent.run()
    return ports, learner, stats


def test_self_play_evaluation_games_put_the_learner_greedy_against_a_fixed_player_in_each_seat_in_turn():
    # An evaluation game after every training game.
    ports, learner, stats = self_play_run(games=2, eval_every=1)
    # The learner takes runner_0's seat in the first game (and wins: the last move decides), runner_1's in the next;
    # a corridor's random player has one legal move, the learner 3 moves a game. Only the learner's episode counts.
    assert len(stats.eval_finished) >= 4
    assert stats.eval_finished[:4] == [(1.0, 3, "random"), (-1.0, 3, "random")] * 2
    assert stats.eval_steps >= 3 * len(stats.eval_finished)
    # Its rows are the RL requests' last, marked for the greedy action; none of them is learned from.
    marked = [sent for sent in ports["RL"].sent if "evaluation" in sent]
    assert marked and all(
        sent["evaluation"].tolist() == [False] * (len(sent["evaluation"]) - 1) + [True] for sent in marked
    )
    asked = sum(len(sent["inputs"]["observation"]) for sent in ports["RL"].sent) - len(marked)
    learned = sum(len(step["terminated"]) for step in learner.steps)
    assert asked - 2 <= learned <= asked
    assert all(team == "runner" for *_, team in stats.finished)


def test_in_the_sparring_share_of_the_games_a_fixed_player_takes_the_opponents_seats_and_the_learner_learns_them():
    ports, learner, _ = self_play_run(sparring="random=1")
    assert ports["opponent"].sent == []  # every game against the fixed player: the frozen copy is never asked
    asked = sum(len(sent["inputs"]["observation"]) for sent in ports["RL"].sent)
    learned = sum(len(step["terminated"]) for step in learner.steps)
    assert asked - 3 <= learned <= asked  # every learner's turn of those games is learned from
    assert {int(row[0]) for step in learner.steps for row in step["inputs"]["observation"]} == {0, 1}  # both seats
    # Half the games: a corridor game is 3 turns of each seat, so the frozen copy plays about half as many turns.
    ports, _, _ = self_play_run(sparring="random=0.5")
    learner_turns, opponent_turns = (sum(len(sent["inputs"]["observation"]) for sent in ports[ct].sent) for ct in ports)
    assert 0.25 < opponent_turns / learner_turns < 0.75, (opponent_turns, learner_turns)


def test_sparring_names_a_player_the_game_does_not_have_a_share_out_of_range_and_self_play_it_needs():
    from flare2.core.pettingzoo_agent import sparring_shares
    from flare2.errors import ConfigError

    connect_four = "pettingzoo.classic.connect_four_v3"
    assert sparring_shares("lookahead=0.5, random=0.25", connect_four) == {"lookahead": 0.5, "random": 0.25}
    assert sparring_shares("", connect_four) == {}
    with pytest.raises(ConfigError, match=r"played by the fixed players \['random'\], not 'lookahead'"):
        sparring_shares("lookahead=0.5", "turn_games.corridor_v0")
    for spec in ("lookahead", "lookahead=0", "lookahead=1.5", "lookahead=half"):
        with pytest.raises(ConfigError, match=r"a number in \(0, 1\] \(lookahead=0.5\)"):
            sparring_shares(spec, connect_four)
    with pytest.raises(ConfigError, match="add up to more than all the games"):
        sparring_shares("lookahead=0.75,random=0.5", connect_four)
    agent = PettingZooAgent("turn_games.corridor_v0", sparring="random=0.5")
    agent.num_envs = 1
    agent.make_env = Corridor
    make_envs(agent, 0)
    with pytest.raises(ConfigError, match="give --self-play N"):
        agent.check_specs({"RL": SPECS})
