"""The manager's message handling at unit level: a real control socket, no child processes."""

from __future__ import annotations

import time

import pytest
import zmq

from flare2.runtime.config import AgentConfig, CTConfig, RunConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.manager.parallel import ParallelSchedule
from flare2.wire.protocol import BYE, HELLO, Message


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
        agents=AgentConfig("flare2.core.envs:GymAgent", num_agents=0),
        max_steps=10,
        log_dir=str(tmp_path),
        heartbeat_timeout_s=1.0,
    )
    schedule = Manager(config).schedule
    assert isinstance(schedule, ParallelSchedule)
    return schedule


def remote_hello(agent_id: str) -> Message:
    return Message(HELLO, {"role": "agent", "remote": True, "cts": ["RL"], "pid": 1, "host": "elsewhere"}, agent_id, 1)


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
