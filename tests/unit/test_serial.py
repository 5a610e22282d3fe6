"""Serial mode: the whole run in this process and thread, through the same CDP and ComputationTask code."""

from __future__ import annotations

import csv
import os
import signal
import threading
from pathlib import Path

import gymnasium as gym
import pytest

from flare2.errors import ConfigError
from flare2.runtime import exit_codes
from flare2.runtime.config import AgentConfig, CTConfig, RunConfig
from flare2.runtime.manager import serial
from flare2.runtime.manager.manager import Manager
from flare2.zoo.a2c import A2C
from flare2.zoo.models import ActorCritic

HOOK_CALLS: list[tuple[str, int, int]] = []


def breakpoint_hook(where: str) -> None:
    """Stands for a debugger breakpoint: records where user code was reached."""
    HOOK_CALLS.append((where, os.getpid(), threading.get_ident()))


class HookedA2C(A2C):
    def predict(self, inputs, states):
        breakpoint_hook("predict")
        return super().predict(inputs, states)

    def learn(self, experience):
        breakpoint_hook("learn")
        return super().learn(experience)


def build_hooked() -> HookedA2C:
    env = gym.make("CartPole-v1")
    return HookedA2C(ActorCritic(env.observation_space, env.action_space, hidden=(16,)))


def serial_config(tmp_path, **agents) -> RunConfig:
    return RunConfig(
        cts=(CTConfig(name="RL", build=build_hooked),),
        agents=AgentConfig(**{"path": "flare2.core.envs:GymAgent", "num_agents": 2, "envs_per_agent": 3, **agents}),
        log_dir=str(tmp_path),
        max_steps=600,
        device="cpu",
        serial=True,
        progress_interval_s=0.2,
    )


def test_a_breakpoint_in_a_user_algorithm_is_reached_in_the_calling_process_and_thread(tmp_path):
    HOOK_CALLS.clear()
    assert Manager(serial_config(tmp_path)).run() == 0
    where = {call[0] for call in HOOK_CALLS}
    assert where == {"predict", "learn"}
    assert {call[1:] for call in HOOK_CALLS} == {(os.getpid(), threading.get_ident())}


def test_a_serial_run_plays_every_env_of_the_run_and_writes_the_usual_logs(tmp_path):
    assert Manager(serial_config(tmp_path)).run() == 0
    rows = list(csv.DictReader((tmp_path / "progress.csv").read_text().splitlines()))
    assert int(rows[-1]["env_steps"]) >= 600
    assert rows[-1]["envs"] == "6" and float(rows[-1]["batch_size_mean"]) == 6.0
    assert (tmp_path / "checkpoints" / "RL.pt").is_file()


def test_serial_mode_refuses_an_address_other_machines_could_reach(tmp_path):
    with pytest.raises(ConfigError, match="--serial .* --bind 10.0.0.1"):
        RunConfig(**{**serial_config(tmp_path).__dict__, "bind": "10.0.0.1", "insecure": True})


def test_a_one_env_agent_asked_for_several_envs_ends_the_run_with_a_config_error(tmp_path, caplog):
    corridor = Path(__file__).resolve().parents[2] / "examples" / "corridor_agent.py"
    config = serial_config(tmp_path, path=f"{corridor}:CorridorAgent", envs_per_agent=2)
    assert Manager(config).run() == 2
    assert "--envs-per-agent 2: CorridorAgent plays one env per process" in caplog.text


class InterruptedA2C(HookedA2C):
    """Sends this process a Ctrl+C after a few predictions, as a user at the terminal would."""

    calls = 0

    def predict(self, inputs, states):
        InterruptedA2C.calls += 1
        if InterruptedA2C.calls == 20:
            os.kill(os.getpid(), signal.SIGINT)
        return super().predict(inputs, states)


def build_interrupted() -> InterruptedA2C:
    env = gym.make("CartPole-v1")
    return InterruptedA2C(ActorCritic(env.observation_space, env.action_space, hidden=(16,)))


def test_ctrl_c_stops_a_serial_run_as_it_stops_a_parallel_one_with_a_final_checkpoint(tmp_path, caplog):
    InterruptedA2C.calls = 0
    config = RunConfig(
        **{
            **serial_config(tmp_path).__dict__,
            "cts": (CTConfig(name="RL", build=build_interrupted),),
            "max_steps": 10**9,
        }
    )
    assert Manager(config).run() == exit_codes.SIGINT
    assert "stopping on SIGINT" in caplog.text and "stopped by Ctrl+C" in caplog.text
    assert (tmp_path / "checkpoints" / "RL.pt").is_file()
    rows = list(csv.DictReader((tmp_path / "progress.csv").read_text().splitlines()))
    assert 0 < int(rows[-1]["env_steps"]) < 10**9


def test_serial_mode_writes_checkpoints_on_the_schedule_the_parallel_run_keeps(tmp_path, caplog, monkeypatch):
    # The schedule is looked at when the agent's control link reports; reporting after every step makes the count
    # depend on the steps alone, not on how fast this machine plays them.
    monkeypatch.setattr(serial._SerialControl.__init__, "__defaults__", (0.0,))
    config = RunConfig(**{**serial_config(tmp_path).__dict__, "max_steps": 3000, "checkpoint_every_steps": 500})
    assert Manager(config).run() == 0
    # Some on the way (every 500 steps of 3000, counted from where each one was written), and the final one.
    assert caplog.text.count("checkpoint written to") >= 3
