"""The manager's message handling at unit level: a real control socket, no child processes."""

from __future__ import annotations

import time
from typing import Any

import pytest
import zmq

from flare2.runtime.config import AgentConfig, CTConfig, RunConfig
from flare2.runtime.manager import agent_desk
from flare2.runtime.manager.manager import Manager
from flare2.runtime.manager.parallel import ParallelSchedule
from flare2.wire.protocol import BYE, ERROR, HELLO, STATS, WELCOME, Message
from flare2.zoo.record import ActorCriticSettings
from flare2.zoo.records.ppo import PPOConfig
from flare2.zoo.registry import lookup


def build():  # never called: no compute process is started here
    raise AssertionError


@pytest.fixture
def control():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind("tcp://127.0.0.1:*")
    yield sock
    ctx.destroy(linger=0)


def manager(tmp_path) -> ParallelSchedule:
    """The manager's side of the control socket: its parallel schedule."""
    config = RunConfig(
        cts=(CTConfig("RL", build),),
        agents=AgentConfig("flare2.core.envs:GymAgent", {"env_id": "Acrobot-v1"}, num_agents=2, envs_per_agent=4),
        seed=7,
        max_steps=10,
        log_dir=str(tmp_path),
        heartbeat_timeout_s=1.0,
    )
    schedule = Manager(config).schedule
    assert isinstance(schedule, ParallelSchedule)
    return schedule


def remote_hello(agent_id: str, *, rejoin: bool = False) -> Message:
    payload = {"role": "agent", "remote": True, "rejoin": rejoin, "cts": ["RL"], "pid": 1, "host": "elsewhere"}
    return Message(HELLO, payload, agent_id, 1)


def sent_by_the_desk(monkeypatch) -> list[tuple[bytes, Message]]:
    """What the manager's agent desk sends from now on, instead of its socket."""
    sent: list[tuple[bytes, Message]] = []
    monkeypatch.setattr(agent_desk, "router_send", lambda _sock, identity, message: sent.append((identity, message)))
    return sent


def test_a_probe_is_answered_with_the_runs_id_and_recipe_and_seed_slots_of_its_own(tmp_path, control, monkeypatch):
    run = manager(tmp_path)
    sent = sent_by_the_desk(monkeypatch)
    for probe in ("probe-1", "probe-2"):
        run.desk.on_message(control, probe.encode(), Message(HELLO, {"role": "probe"}, probe, 1))
    (first, one), (second, other) = sent
    assert (first, second) == (b"probe-1", b"probe-2") and one.kind == other.kind == WELCOME
    assert one.payload["run_id"] == other.payload["run_id"] == run.desk.run_id
    recipe = one.payload["recipe"]
    assert {key: recipe[key] for key in ("agent", "agent_kwargs", "envs_per_agent", "seed")} == {
        "agent": "flare2.core.envs:GymAgent",
        "agent_kwargs": {"env_id": "Acrobot-v1"},
        "envs_per_agent": 4,
        "seed": 7,
    }
    # Past the run's own 2 slots, and apart: two attaches never draw the same seeds.
    assert 2 <= recipe["first_slot"] < other.payload["recipe"]["first_slot"] - 1000


def test_late_stats_of_a_dropped_remote_agent_count_and_a_rejoin_is_counted(tmp_path, control, monkeypatch):
    run = manager(tmp_path)
    sent_by_the_desk(monkeypatch)
    run.desk.on_message(control, b"r-b-0.0.aa", remote_hello("r-b-0.0.aa"))
    run.agents.remotes["r-b-0.0.aa"].last_seen = time.monotonic() - 10
    run.desk.supervise_remotes(control)
    assert run.totals.remote_dropped == 1
    # Sent before the link broke, delivered once it is back: steps that were played.
    stats = Message(STATS, {"role": "agent", "steps": 30, "episodes": [[15.0, 15]]}, "r-b-0.0.aa", 5)
    run.desk.on_message(control, b"r-b-0.0.aa", stats)
    run.desk.on_message(control, b"r-b-0.0.aa", Message(BYE, {}, "r-b-0.0.aa", 6))
    assert (run.totals.remote_env_steps, run.totals.remote_episodes, run.totals.dropped_messages) == (30, 1, 0)
    assert "r-b-0.0.aa" not in run.agents.remotes
    run.desk.on_message(control, b"r-b-0.1.bb", remote_hello("r-b-0.1.bb", rejoin=True))
    assert "r-b-0.1.bb" in run.agents.remotes and run.totals.remote_rejoins == 1
    # A stranger that was never an agent of the run is still dropped.
    run.desk.on_message(control, b"r-x", stats)
    assert run.totals.dropped_messages == 1


def test_stats_count_each_episodes_team_and_a_malformed_team_drops_the_message(tmp_path, control, monkeypatch):
    run = manager(tmp_path)
    sent_by_the_desk(monkeypatch)
    run.desk.on_message(control, b"r-t-0.0.aa", remote_hello("r-t-0.0.aa"))
    episodes = [[-3.0, 25, "adversary"], [4.0, 25, "agent"], [5.0, 9]]
    stats = Message(STATS, {"role": "agent", "steps": 59, "episodes": episodes}, "r-t-0.0.aa", 5)
    run.desk.on_message(control, b"r-t-0.0.aa", stats)
    assert [team for *_, team in run.totals.take_finished()] == ["adversary", "agent", ""]
    for team in ("x" * 65, 7):
        bad = Message(STATS, {"role": "agent", "steps": 1, "episodes": [[1.0, 1, team]]}, "r-t-0.0.aa", 6)
        run.desk.on_message(control, b"r-t-0.0.aa", bad)
    assert run.totals.env_steps == 59 and run.totals.take_finished() == []


def test_a_remote_agent_dropped_while_the_compute_process_is_still_starting_leaves_the_manager_running(
    tmp_path, control
):
    run = manager(tmp_path)
    run.desk.on_message(control, b"r-late", remote_hello("r-late"))
    assert "r-late" in run.agents.remotes
    # Silent past the heartbeat timeout before the compute process said hello.
    run.agents.remotes["r-late"].last_seen = time.monotonic() - 10
    run.desk.supervise_remotes(control)
    assert "r-late" not in run.agents.remotes and run.totals.remote_dropped == 1


def test_a_remote_agent_that_says_bye_before_the_compute_process_is_up_leaves_the_manager_running(tmp_path, control):
    run = manager(tmp_path)
    run.desk.on_message(control, b"r-early", remote_hello("r-early"))
    run.desk.on_message(control, b"r-early", Message(BYE, {}, "r-early", 2))
    assert "r-early" not in run.agents.remotes


def test_agents_that_say_hello_while_the_compute_process_is_on_its_way_out_are_welcomed_by_the_next_one(
    tmp_path, control, monkeypatch
):
    run = manager(tmp_path)
    sent = sent_by_the_desk(monkeypatch)
    ct = {"specs": {}, "learn_ahead": 0, "predict_endpoint": "tcp://127.0.0.1:1", "learn_endpoint": "tcp://127.0.0.1:2"}

    def welcomes() -> list[bytes]:
        return [identity for identity, message in sent if message.kind == WELCOME]

    run.desk.compute_is_up(control, {"RL": ct}, device="cpu")
    run.desk.on_message(control, b"r-before", remote_hello("r-before"))
    assert welcomes() == [b"r-before"]
    # Asked to stop for a new group of learners (or leaving after it lost one): it takes no new agent, and one it
    # welcomed that cannot reach it is no error of its own.
    run.compute.regrouping = True
    run._supervise(control)
    run.desk.on_message(control, b"r-during", remote_hello("r-during"))
    assert welcomes() == [b"r-before"] and [hello.agent_id for hello in run.desk.pending_hellos] == ["r-during"]
    assert run.desk.welcomed_by_a_gone_compute_process(run.agents.remotes["r-before"])
    run.desk.compute_is_up(control, {"RL": ct}, device="cpu")  # the next one serves
    assert welcomes() == [b"r-before", b"r-during"]


def learner_probe(count, name: str = "probe-l", gpus: int = 0, **asks: Any) -> tuple[bytes, Message]:
    return name.encode(), Message(HELLO, {"role": "probe", "learners": count, "gpus": gpus, **asks}, name, 1)


def with_remote_learners(tmp_path) -> tuple[ParallelSchedule, Any]:
    """A run of 3 learners, 2 of them on other machines, and its CT's build."""
    build = lookup("ppo").builder("CartPole-v1", {}, PPOConfig(), ActorCriticSettings(), preprocessing=True)
    config = RunConfig(
        cts=(CTConfig("RL", build),),
        agents=AgentConfig("flare2.core.envs:GymAgent", {"env_id": "CartPole-v1"}),
        max_steps=10,
        log_dir=str(tmp_path),
        learners=3,
        remote_learners=2,
        seed=5,
    )
    run = Manager(config).schedule
    assert isinstance(run, ParallelSchedule)
    return run, build


def test_learner_probes_get_ranks_and_the_recipe_once_the_compute_process_is_up_and_are_refused_past_them(
    tmp_path, control, monkeypatch
):
    run, build = with_remote_learners(tmp_path)
    sent = sent_by_the_desk(monkeypatch)
    run.desk.on_message(control, *learner_probe(1))
    assert sent.pop()[1].payload["learners"] == {"starting": True}
    run.desk.compute_is_up(control, {}, device="cpu")
    run.desk.on_message(control, *learner_probe(3))
    refused = sent.pop()[1]
    assert refused.kind == ERROR and "the run has 2 of its 2 remote learner rank(s) left" in refused.payload["reason"]
    assert "start this with --learners 2" in refused.payload["reason"]
    run.desk.on_message(control, *learner_probe(1))
    given = sent.pop()[1].payload["learners"]
    assert {key: given[key] for key in ("first_rank", "count", "learners", "device", "seed")} == {
        "first_rank": 1,
        "count": 1,
        "learners": 3,
        "device": "cpu",
        "seed": 5,
    }
    assert given["rendezvous"] == run.desk.learner_seats.rendezvous
    assert given["cts"] == [{"name": "RL", "build": build.recipe()}]
    run.desk.on_message(control, *learner_probe(1))
    assert sent.pop()[1].payload["learners"]["first_rank"] == 2
    run.desk.on_message(control, *learner_probe(1))
    assert "every one is taken" in sent.pop()[1].payload["reason"]
    for bad in (0, "1", None):
        run.desk.on_message(control, *learner_probe(bad))
        assert "a learner probe must ask for 1 or more learners" in sent.pop()[1].payload["reason"]


def test_a_group_that_lost_a_learner_elsewhere_goes_on_with_the_learners_here_and_grows_for_one_that_comes_back(
    tmp_path, control, monkeypatch
):
    run, _ = with_remote_learners(tmp_path)
    sent = sent_by_the_desk(monkeypatch)
    seats = run.desk.learner_seats
    run.desk.compute_is_up(control, {}, device="cpu")
    run.desk.on_message(control, *learner_probe(2, learn_id="b"))
    first_rendezvous = sent.pop()[1].payload["learners"]["rendezvous"]
    # Its group broke: asking again before the manager heard of it is no refusal.
    run.desk.on_message(control, *learner_probe(2, learn_id="b", rejoin=True))
    assert sent.pop()[1].payload["learners"] == {"starting": True}

    seats.new_group(lost_elsewhere=True)
    assert (seats.learners, seats.remote, seats.wants_to_grow) == (1, 0, False)
    assert seats.rendezvous == ""  # one learner: no group to meet in
    run.desk.on_message(control, *learner_probe(2, learn_id="b", rejoin=True))
    assert sent.pop()[1].payload["learners"] == {"starting": True}  # no compute process up yet
    run.desk.compute_is_up(control, {}, device="cpu")
    run.desk.on_message(control, *learner_probe(2, learn_id="b", rejoin=True))
    run.desk.on_message(control, *learner_probe(2, learn_id="b", rejoin=True))  # asked again: still 2 ranks
    assert sent.pop()[1].payload["learners"] == {"starting": True} and seats.wants_to_grow
    run.desk.on_message(control, *learner_probe(1))
    assert "must carry the id of its flare2 learn" in sent.pop()[1].payload["reason"]

    seats.new_group(lost_elsewhere=False)
    assert (seats.learners, seats.remote, seats.wants_to_grow) == (3, 2, False)
    run.desk.compute_is_up(control, {}, device="cpu")
    run.desk.on_message(control, *learner_probe(2, learn_id="b", rejoin=True))
    given = sent.pop()[1].payload["learners"]
    assert (given["first_rank"], given["learners"]) == (1, 3)
    assert given["rendezvous"] not in ("", first_rendezvous)


def test_a_group_re_formed_with_the_learners_it_had_elsewhere_waits_for_them_only_the_heartbeat_timeout(
    tmp_path, control, monkeypatch
):
    run, _ = with_remote_learners(tmp_path)
    sent = sent_by_the_desk(monkeypatch)
    seats, config = run.desk.learner_seats, run.config
    assert config.heartbeat_timeout_s < config.startup_timeout_s
    run.desk.compute_is_up(control, {}, device="cpu")
    run.desk.on_message(control, *learner_probe(2, learn_id="b"))
    given = sent.pop()[1].payload["learners"]
    # The first group waits for its learners as the run was started; its collectives, as every group's, as long.
    assert given["rendezvous_timeout_s"] == given["timeout_s"] == config.startup_timeout_s
    # The compute process died: the next group keeps the learners elsewhere, which may have gone with a link.
    seats.new_group(lost_elsewhere=False)
    assert seats.remote == 2 and seats.rendezvous_timeout_s == config.heartbeat_timeout_s
    run.desk.compute_is_up(control, {}, device="cpu")
    run.desk.on_message(control, *learner_probe(2, learn_id="b", rejoin=True))
    given = sent.pop()[1].payload["learners"]
    assert (given["rendezvous_timeout_s"], given["timeout_s"]) == (config.heartbeat_timeout_s, config.startup_timeout_s)
    # They did not come: the group without them waits for no one elsewhere, and the one that grows for them when
    # they ask, as long as the first.
    seats.new_group(lost_elsewhere=True)
    assert seats.remote == 0 and seats.rendezvous_timeout_s == config.startup_timeout_s
    run.desk.compute_is_up(control, {}, device="cpu")
    run.desk.on_message(control, *learner_probe(2, learn_id="b", rejoin=True))
    assert sent.pop()[1].payload["learners"] == {"starting": True} and seats.wants_to_grow
    seats.new_group(lost_elsewhere=False)
    assert seats.remote == 2 and seats.rendezvous_timeout_s == config.startup_timeout_s


def test_a_run_that_learns_on_cuda_takes_no_more_learners_from_a_machine_than_it_has_gpus(
    tmp_path, control, monkeypatch
):
    run, _ = with_remote_learners(tmp_path)
    sent = sent_by_the_desk(monkeypatch)
    run.desk.compute_is_up(control, {}, device="cuda:0")
    run.desk.on_message(control, *learner_probe(2, gpus=1))
    assert "has 1 GPU(s) for --learners 2: use --learners 1 or fewer" in sent.pop()[1].payload["reason"]
    run.desk.on_message(control, *learner_probe(2, gpus=2))
    assert sent.pop()[1].payload["learners"]["count"] == 2


def test_a_run_without_remote_learners_refuses_learner_probes_naming_the_options(tmp_path, control, monkeypatch):
    run = manager(tmp_path)
    sent = sent_by_the_desk(monkeypatch)
    run.desk.on_message(control, *learner_probe(1))
    refused = sent.pop()[1]
    assert refused.kind == ERROR
    assert refused.payload["reason"] == (
        "this run takes no learners from other machines: start it with --learners N --remote-learners K"
    )
