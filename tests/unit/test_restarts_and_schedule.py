"""The restart policy shared by the manager and ``flare2 attach``, the supervisor that applies it to local agents, and the
``--checkpoint-every`` schedule."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from flare2.errors import ConfigError
from flare2.runtime import exit_codes
from flare2.runtime.checkpoints import CheckpointSchedule
from flare2.runtime.config import AgentConfig, CTConfig, RunConfig
from flare2.errors import RunFailed
from flare2.runtime.manager.progress import RunTotals
from flare2.runtime.manager.registry import AgentRecord, AgentRegistry
from flare2.runtime.restarts import HEALTHY_LIFE_S, MAX_RESTART_BACKOFF_S, failure_streak, restart_backoff
from flare2.runtime.supervisor import AgentSupervisor


def build():
    raise AssertionError("never called here")


def run_config(**overrides) -> RunConfig:
    return RunConfig(cts=(CTConfig("RL", build),), agents=AgentConfig("flare2.core.envs:GymAgent"), max_steps=10, **overrides)


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


def test_checkpoints_every_so_many_seconds_count_from_the_start_and_from_each_one():
    schedule = CheckpointSchedule(run_config(checkpoint_every_s=10.0))
    schedule.start(now=100.0, env_steps=0)
    assert not schedule.take_due(109.9, env_steps=10**9)
    assert schedule.take_due(110.0, env_steps=0)
    assert not schedule.take_due(119.0, env_steps=0)
    assert schedule.take_due(125.0, env_steps=0)
    assert not schedule.take_due(134.0, env_steps=0)


def test_checkpoints_every_so_many_env_steps_count_from_where_the_run_starts():
    schedule = CheckpointSchedule(run_config(checkpoint_every_steps=1000))
    schedule.start(now=0.0, env_steps=5000)  # a resumed run
    assert not schedule.take_due(1e9, env_steps=5999)
    assert schedule.take_due(0.0, env_steps=6200)
    assert not schedule.take_due(0.0, env_steps=7100)
    assert schedule.take_due(0.0, env_steps=7200)


def test_without_checkpoint_every_no_periodic_checkpoint_is_ever_due():
    schedule = CheckpointSchedule(run_config())
    schedule.start(now=0.0, env_steps=0)
    assert not schedule.take_due(1e12, env_steps=10**15)


@pytest.mark.parametrize("field", ["checkpoint_every_s", "checkpoint_every_steps", "restart_backoff_s"])
def test_a_period_of_zero_or_less_is_refused_naming_the_field(field):
    with pytest.raises(ConfigError, match=f"{field} must be > 0"):
        run_config(**{field: 0})


def failed_agent(registry, *, lived_s: float = 1.0):
    agent = AgentRecord(0, 0, "a0.0.x", SimpleNamespace(), last_seen=0.0, started_at=time.monotonic() - lived_s)
    registry.put_local(agent)
    return agent


def supervisor(**overrides):
    registry = AgentRegistry()
    return AgentSupervisor(run_config(**overrides), registry, RunTotals()), registry


def test_a_failed_agent_is_restarted_after_the_backoff_and_no_longer_listened_to():
    sup, registry = supervisor(restart_backoff_s=0.5)
    agent = failed_agent(registry)
    sup.restart_later(agent, "exited with code 1", 1, compute_up=True)
    assert sup.totals.restarts == 1 and agent.restart_at is not None and agent.failure_streak == 1
    assert registry.by_id(agent.agent_id) is None and not agent.live


def test_failures_no_restart_can_cure_end_the_run_with_their_own_exit_code():
    sup, registry = supervisor()
    agent = failed_agent(registry)
    agent.error = "unknown env 'CartPol-v1'"
    with pytest.raises(RunFailed, match="cannot run: unknown env") as caught:
        sup.restart_later(agent, "exited with code 2", exit_codes.CONFIG_ERROR, compute_up=True)
    assert caught.value.exit_code == exit_codes.CONFIG_ERROR
    with pytest.raises(RunFailed, match="could not register with the manager"):
        sup.restart_later(agent, "exited with code 3", exit_codes.MANAGER_LOST, compute_up=False)
    assert sup.totals.restarts == 0


def test_one_failure_past_max_restarts_ends_the_run_naming_the_option():
    sup, registry = supervisor(max_restarts=2)
    for _ in range(2):
        sup.restart_later(failed_agent(registry), "exited with code 1", 1, compute_up=True)
    with pytest.raises(RunFailed, match="3 agent failures, more than max_restarts=2.*--max-restarts"):
        sup.restart_later(failed_agent(registry), "exited with code 1", 1, compute_up=True)
