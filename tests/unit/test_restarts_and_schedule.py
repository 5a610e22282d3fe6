"""The one supervisor of the manager's and ``flare2 attach``'s agents, its restart policy, the manager's own concerns
on top of it, and the ``--checkpoint-every`` schedule."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import resource_tracker
from types import SimpleNamespace

import pytest
import zmq

from flare2.errors import ConfigError, RunFailed
from flare2.runtime import exit_codes
from flare2.runtime.checkpoints import CheckpointSchedule
from flare2.runtime.config import CHECKPOINT_EVERY_S, AgentConfig, CTConfig, RunConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.manager.parallel import ParallelSchedule
from flare2.runtime.manager.registry import AgentRecord
from flare2.runtime.manager.totals import RunTotals
from flare2.runtime.processes import handle_stop_signals, restore_signal_handlers, stop_resource_tracker
from flare2.runtime.supervisor import (
    HEALTHY_LIFE_S,
    MAX_RESTART_BACKOFF_S,
    AgentLaunch,
    AgentSlot,
    AgentSupervisor,
    failure_streak,
    restart_backoff,
)
from flare2.wire.protocol import STATS, Message


def build():
    raise AssertionError("never called here")


def run_config(**overrides) -> RunConfig:
    return RunConfig(
        cts=(CTConfig("RL", build),), agents=AgentConfig("flare2.core.envs:GymAgent"), max_steps=10, **overrides
    )


def test_an_agent_failing_again_and_again_waits_twice_as_long_each_time_up_to_a_cap():
    streak, waits = 0, []
    for _ in range(10):
        streak = failure_streak(streak, lived_s=1.0)
        waits.append(restart_backoff(0.5, streak))
    assert waits[:7] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, MAX_RESTART_BACKOFF_S]
    assert waits[7:] == [MAX_RESTART_BACKOFF_S] * 3


def test_an_agent_that_ran_a_healthy_while_before_failing_starts_again_at_the_base_wait():
    streak = 0
    for _ in range(5):
        streak = failure_streak(streak, lived_s=1.0)
    assert restart_backoff(0.5, streak) == 8.0
    streak = failure_streak(streak, lived_s=HEALTHY_LIFE_S + 1)
    assert streak == 0 and restart_backoff(0.5, streak) == 0.5
    assert restart_backoff(0.5, failure_streak(streak, lived_s=1.0)) == 0.5


def test_an_agent_killed_after_it_played_is_no_crash_loop_and_starts_again_at_the_base_wait():
    streak = 0
    for _ in range(5):
        streak = failure_streak(streak, lived_s=1.0)
    assert failure_streak(streak, lived_s=1.0, played=True) == 0


def test_an_agent_whose_stats_counted_steps_is_restarted_at_the_base_wait(tmp_path, control):
    schedule = manager_schedule(tmp_path, restart_backoff_s=0.5)
    agent, slot = failed_agent(schedule)
    slot.failure_streak = 4  # it had failed young four times before
    schedule.desk.on_message(control, agent.agent_id.encode(), Message(STATS, {"steps": 0}, agent.agent_id, 1))
    assert not agent.played  # stats without steps
    schedule.desk.on_message(control, agent.agent_id.encode(), Message(STATS, {"steps": 12}, agent.agent_id, 2))
    schedule.agent_failed(control, agent, slot, "was killed by SIGKILL", -9)
    assert slot.failure_streak == 0 and slot.restart_at is not None
    assert slot.restart_at - time.monotonic() <= 0.5


def test_checkpoints_every_so_many_seconds_count_from_the_start_and_from_each_one():
    schedule = CheckpointSchedule(run_config(checkpoint_every_s=10.0))
    schedule.start(now=100.0, env_steps=0)
    assert not schedule.take_due(109.9, env_steps=10**9)
    assert schedule.take_due(110.0, env_steps=0)
    assert not schedule.take_due(119.0, env_steps=0)
    assert schedule.take_due(125.0, env_steps=0)
    assert not schedule.take_due(134.0, env_steps=0)


def test_checkpoints_every_so_many_env_steps_count_from_where_the_run_starts():
    schedule = CheckpointSchedule(run_config(checkpoint_every_s=None, checkpoint_every_steps=1000))
    schedule.start(now=0.0, env_steps=5000)  # a resumed run
    assert not schedule.take_due(1e9, env_steps=5999)
    assert schedule.take_due(0.0, env_steps=6200)
    assert not schedule.take_due(0.0, env_steps=7100)
    assert schedule.take_due(0.0, env_steps=7200)


def test_periodic_checkpoints_are_on_by_default_and_off_leaves_only_the_last():
    schedule = CheckpointSchedule(run_config())
    schedule.start(now=0.0, env_steps=0)
    assert not schedule.take_due(CHECKPOINT_EVERY_S - 1, env_steps=10**15)
    assert schedule.take_due(CHECKPOINT_EVERY_S, env_steps=0)
    schedule = CheckpointSchedule(run_config(checkpoint_every_s=None))
    schedule.start(now=0.0, env_steps=0)
    assert not schedule.take_due(1e12, env_steps=10**15)


@pytest.mark.parametrize("field", ["checkpoint_every_s", "checkpoint_every_steps", "restart_backoff_s"])
def test_a_period_of_zero_or_less_is_refused_naming_the_field(field):
    with pytest.raises(ConfigError, match=f"{field} must be > 0"):
        run_config(**{field: 0})


@pytest.fixture
def control():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind("tcp://127.0.0.1:*")
    yield sock
    ctx.destroy(linger=0)


def failed_agent(schedule: ParallelSchedule, *, lived_s: float = 1.0) -> tuple[AgentRecord, AgentSlot]:
    """A local agent of slot 0 whose process has ended (a stand-in: nothing is started here)."""
    slot = AgentSlot(0, "a0.0.x", SimpleNamespace(), started_at=time.monotonic() - lived_s)
    schedule.supervisor.slots[:] = [slot]
    agent = AgentRecord(slot.agent_id, last_seen=0.0, slot=0, registered=True)
    schedule.agents.put_local(agent)
    return agent, slot


def manager_schedule(tmp_path, *, compute_up: bool = True, **overrides) -> ParallelSchedule:
    schedule = Manager(run_config(log_dir=str(tmp_path), **overrides)).schedule
    assert isinstance(schedule, ParallelSchedule)
    schedule.desk.served = {} if compute_up else None
    return schedule


def test_a_failed_agent_is_restarted_after_the_backoff_and_no_longer_listened_to(tmp_path, control):
    schedule = manager_schedule(tmp_path, restart_backoff_s=0.5)
    agent, slot = failed_agent(schedule)
    schedule.agent_failed(control, agent, slot, "exited with code 1", 1)
    assert schedule.totals.restarts == 1 and slot.restart_at is not None and slot.failure_streak == 1
    assert schedule.agents.by_id(agent.agent_id) is None and not agent.live


def test_failures_no_restart_can_cure_end_the_run_with_their_own_exit_code(tmp_path, control):
    schedule = manager_schedule(tmp_path)
    agent, slot = failed_agent(schedule)
    agent.error = "unknown env 'CartPol-v1'"
    with pytest.raises(RunFailed, match="cannot run: unknown env") as caught:
        schedule.agent_failed(control, agent, slot, "exited with code 2", exit_codes.CONFIG_ERROR)
    assert caught.value.exit_code == exit_codes.CONFIG_ERROR
    schedule = manager_schedule(tmp_path, compute_up=False)
    agent, slot = failed_agent(schedule)
    with pytest.raises(RunFailed, match="could not register with the manager"):
        schedule.agent_failed(control, agent, slot, "exited with code 3", exit_codes.MANAGER_LOST)
    assert schedule.totals.restarts == 0


def test_stopping_waits_for_the_bye_of_a_welcomed_agent_only(tmp_path):
    # An agent told to stop before its welcome (the compute process failed at start) exits with no stats to send:
    # waiting for its bye would hold every such run up for the whole stop timeout.
    schedule = manager_schedule(tmp_path, compute_up=False)
    agent, slot = failed_agent(schedule)
    slot.process = SimpleNamespace(poll=lambda: 0)
    agent.registered = False
    assert not schedule._said_no_bye_yet(slot)
    agent.registered = True
    assert schedule._said_no_bye_yet(slot)
    agent.said_bye = True
    assert not schedule._said_no_bye_yet(slot)


def test_one_failure_past_max_restarts_ends_the_run_naming_the_option(tmp_path, control):
    schedule = manager_schedule(tmp_path, max_restarts=2)
    for _ in range(2):
        schedule.agent_failed(control, *failed_agent(schedule), "exited with code 1", 1)
    with pytest.raises(RunFailed, match="3 agent failures, more than max_restarts=2.*--max-restarts"):
        schedule.agent_failed(control, *failed_agent(schedule), "exited with code 1", 1)


class FakeLaunch(AgentLaunch):
    """Starts nothing: hands out a stand-in process per incarnation."""

    def start(self, slot: int, incarnation: int):
        return f"{self.id_prefix}{slot}.{incarnation}.x", SimpleNamespace(poll=lambda: None)


def test_the_manager_and_attach_restart_an_agent_with_one_supervisor_and_one_log_line(caplog):
    supervisor = AgentSupervisor(max_restarts=10, restart_backoff_s=0.5)
    supervisor.start_all(FakeLaunch("tcp://127.0.0.1:1", "m:A", {}, 1, 0, id_prefix="r-host-1-"), num_agents=1)
    (slot,) = supervisor.slots
    supervisor.restart_later(slot, "was killed by SIGKILL", -9)
    assert "agent r-host-1-0.0.x was killed by SIGKILL; restarting it in 0.5s (restart 1 of at most 10)" in caplog.text
    assert supervisor.restart_due(time.monotonic()) == [] and not slot.running
    (due,) = supervisor.restart_due(slot.restart_at)
    assert due is slot and slot.running and slot.incarnation == 1 and slot.agent_id == "r-host-1-0.1.x"


def test_a_slot_whose_agent_left_for_good_is_neither_restarted_nor_watched():
    supervisor = AgentSupervisor(max_restarts=10, restart_backoff_s=0.5)
    supervisor.start_all(FakeLaunch("tcp://127.0.0.1:1", "m:A", {}, 1, 0), num_agents=2)
    supervisor.slots[0].process = SimpleNamespace(poll=lambda: exit_codes.OK)
    [(slot, code)] = list(supervisor.exited())
    supervisor.retire(slot, code)
    assert list(supervisor.exited()) == [] and supervisor.running() == [supervisor.slots[1]]


def test_a_restart_count_kept_elsewhere_counts_toward_the_limit():
    totals = RunTotals()
    totals.resume_from({"restarts": 2})  # a resumed run continues its count
    supervisor = AgentSupervisor(max_restarts=2, restart_backoff_s=0.5, count=totals)
    supervisor.start_all(FakeLaunch("tcp://127.0.0.1:1", "m:A", {}, 1, 0), num_agents=1)
    with pytest.raises(RunFailed, match="3 agent failures"):
        supervisor.restart_later(supervisor.slots[0], "exited with code 1", 1)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_process_stopped_by_a_signal_exits_with_that_signals_code(signum, code):
    assert exit_codes.stopped_by(signum) == code
    assert exit_codes.outcome(code).startswith("stopped by")


@pytest.mark.parametrize("under_nohup", [False, True])
def test_the_stop_signals_reach_the_run_but_sighup_stays_ignored_under_nohup(under_nohup):
    def on_signal(_signum, _frame):
        pass

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN if under_nohup else signal.SIG_DFL)
    try:
        previous = handle_stop_signals(on_signal)
        try:
            assert signal.getsignal(signal.SIGINT) is on_signal
            assert signal.getsignal(signal.SIGTERM) is on_signal
            assert signal.getsignal(signal.SIGHUP) is (signal.SIG_IGN if under_nohup else on_signal)
        finally:
            restore_signal_handlers(previous)
        assert signal.getsignal(signal.SIGHUP) == (signal.SIG_IGN if under_nohup else signal.SIG_DFL)
        assert signal.getsignal(signal.SIGINT) is not on_signal
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_restarted_compute_process_whose_hello_comes_after_the_stop_gets_no_spare(tmp_path, control):
    # A spare started then would wait for work to the end, and the manager's exit with it.
    compute = manager_schedule(tmp_path).compute
    compute.restarted = True
    compute.stop(control, serving=False, counters={}, timeout_s=1.0)
    compute.keep_a_spare("inline")
    assert compute.spare is None


@pytest.mark.parametrize("held_elsewhere", [False, True])
def test_the_resource_tracker_is_stopped_and_one_that_does_not_end_keeps_the_manager_waiting_only_so_long(
    monkeypatch, caplog, held_elsewhere
):
    # A stand-in tracker: a child that ends once no process holds the write end of the pipe it reads.
    read_end, write_end = os.pipe()
    holder = os.dup(write_end) if held_elsewhere else None  # a process of the run that does not go
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.buffer.read()"], stdin=read_end)
    os.close(read_end)
    tracker = SimpleNamespace(_lock=threading.RLock(), _fd=write_end, _pid=child.pid)
    monkeypatch.setattr(resource_tracker, "_resource_tracker", tracker)
    try:
        stop_resource_tracker(timeout_s=0.2 if held_elsewhere else 60)
        assert tracker._fd is None and tracker._pid is None
        # The lock is free: a later spawn in this process may start a new tracker.
        assert tracker._lock.acquire(blocking=False)
        tracker._lock.release()
        assert (f"resource tracker (pid {child.pid}) has not ended" in caplog.text) == held_elsewhere
    finally:
        if holder is not None:
            os.close(holder)
        child.wait(60)
