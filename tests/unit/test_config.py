"""Run configuration and command-line options: mistakes end in a message that names the fix."""

from __future__ import annotations

import argparse

import pytest

from flare2.errors import ConfigError
from flare2.runtime.config import AgentConfig, CTConfig, RunConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.options import add_run_options, parse_checkpoint_every, run_config_from_args


def build():
    raise AssertionError("never called here")


def run_config(**overrides) -> RunConfig:
    settings = {"cts": (CTConfig("RL", build),), "agents": AgentConfig("flare2.core.envs:GymAgent"), "max_steps": 10}
    return RunConfig(**{**settings, **overrides})


def test_listening_beyond_loopback_without_keys_is_refused_unless_insecure():
    with pytest.raises(ConfigError, match=r"flare2 keys DIR.*--keys DIR.*--insecure"):
        run_config(bind="10.1.2.3")
    assert run_config(bind="10.1.2.3", insecure=True).insecure
    assert run_config(bind="10.1.2.3", keys_dir="keys").keys_dir == "keys"
    assert run_config(bind="127.0.0.1").bind == "127.0.0.1"


def test_listening_on_every_address_needs_an_advertised_one():
    with pytest.raises(ConfigError, match="--advertise"):
        run_config(bind="0.0.0.0", keys_dir="keys")
    assert run_config(bind="0.0.0.0", keys_dir="keys", advertise="10.1.2.3").advertise == "10.1.2.3"


def test_a_run_needs_a_budget():
    with pytest.raises(ConfigError, match="max_steps or max_episodes"):
        run_config(max_steps=None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("300s", (300.0, None)), ("50000", (None, 50000)), ("20steps", (None, 20)), ("off", (None, None))],
)
def test_checkpoint_every_takes_seconds_or_steps(text, expected):
    assert parse_checkpoint_every(text) == expected


@pytest.mark.parametrize("text", ["", "0", "5m", "2.5", "-3s", "often"])
def test_a_bad_checkpoint_every_is_a_usage_error(text):
    with pytest.raises(argparse.ArgumentTypeError, match="300s"):
        parse_checkpoint_every(text)


def test_options_that_do_not_fit_together_are_a_usage_error_that_names_them(capsys):
    parser = argparse.ArgumentParser(prog="run")
    add_run_options(parser)
    args = parser.parse_args(["--stop-eval-return", "475"])
    with pytest.raises(SystemExit):
        run_config_from_args(parser, args, cts=[CTConfig("RL", build)], agent_path="flare2.core.envs:GymAgent")
    assert "stop_eval_return needs evaluation episodes" in capsys.readouterr().err


def test_stopping_on_the_evaluation_return_needs_evaluation_episodes():
    with pytest.raises(ConfigError, match=r"stop_eval_return needs evaluation episodes.*--eval-every"):
        run_config(stop_eval_return=475.0)
    assert run_config(stop_eval_return=475.0, eval_every=2).stop_eval_return == 475.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--envs-per-agent", "0"], "argument --envs-per-agent: must be >= 1, got 0"),
        (["--max-wait-ms", "-1"], "argument --max-wait-ms: must be >= 0, got -1"),
        (["--max-batch", "0"], "argument --max-batch: must be >= 1, got 0"),
        (["--num-agents", "two"], "argument --num-agents: expected an integer >= 0, got 'two'"),
        (["--heartbeat-timeout", "0"], "argument --heartbeat-timeout: must be > 0, got 0"),
        (["--busy-wait-us", "-5"], "argument --busy-wait-us: must be >= 0, got -5"),
        (["--predict-threads", "0"], "argument --predict-threads: must be >= 1, got 0"),
        (["--busy-wait-us", "2000000"], "busy_wait_us must be between 0 (sleep at once) and 1000000, got 2000000"),
        (
            ["--serial", "--bind", "10.1.2.3", "--insecure"],
            "--serial runs the whole run in this process, so nothing listens on --bind 10.1.2.3",
        ),
    ],
)
def test_option_mistakes_are_usage_errors_that_name_the_option(capsys, options, message):
    parser = argparse.ArgumentParser(prog="run")
    add_run_options(parser)
    with pytest.raises(SystemExit) as exit_info:
        args = parser.parse_args(options)
        run_config_from_args(parser, args, cts=[CTConfig("RL", build)], agent_path="flare2.core.envs:GymAgent")
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_local_agents_get_the_cts_unix_sockets_and_remote_ones_the_advertised_tcp_address():
    manager = Manager(run_config(bind="0.0.0.0", keys_dir="keys", advertise="10.1.2.3"))
    served = {
        "specs": {},
        "learn_ahead": 1,
        "predict_endpoint": "tcp://0.0.0.0:5001",
        "learn_endpoint": "tcp://0.0.0.0:5002",
        "local_predict_endpoint": "unix:///tmp/flare2-x/ct0-predict",
        "local_learn_endpoint": "unix:///tmp/flare2-x/ct0-learn",
        "busy_wait_us": 200,
    }
    local = manager.schedule.desk._endpoints_for(served, local=True)
    remote = manager.schedule.desk._endpoints_for(served, local=False)
    assert (local["predict_endpoint"], local["learn_endpoint"]) == (
        served["local_predict_endpoint"],
        served["local_learn_endpoint"],
    )
    assert (remote["predict_endpoint"], remote["learn_endpoint"]) == ("tcp://10.1.2.3:5001", "tcp://10.1.2.3:5002")
    assert "local_predict_endpoint" not in remote and local["learn_ahead"] == remote["learn_ahead"] == 1
    # Agents of other machines talk ZeroMQ, where no busy wait is done.
    assert local["busy_wait_us"] == 200 and "busy_wait_us" not in remote


def test_every_setting_of_a_run_has_one_option_and_the_option_defaults_are_the_config_defaults():
    from dataclasses import fields

    from flare2.runtime.config import BatchingConfig
    from flare2.runtime.options import COMMAND_LINE_DEFAULTS, OPTIONS, batching_from_args

    # What the command line cannot express (code, structure) or sets through another option (--checkpoint-every).
    not_options = {"cts", "agents", "path", "kwargs", "checkpoint_every_s", "checkpoint_every_steps"}
    settings = {field.name for kind in (RunConfig, AgentConfig, BatchingConfig) for field in fields(kind)} - not_options
    optioned = [name for *_, name, _ in OPTIONS]
    assert sorted(optioned) == sorted(settings)

    parser = argparse.ArgumentParser(prog="run")
    add_run_options(parser)
    config = run_config_from_args(
        parser, parser.parse_args([]), cts=[CTConfig("RL", build)], agent_path="flare2.core.envs:GymAgent"
    )
    assert config.max_steps == COMMAND_LINE_DEFAULTS["max_steps"]
    assert (config.agents.num_agents, config.agents.envs_per_agent) == (
        AgentConfig.num_agents,
        AgentConfig.envs_per_agent,
    )
    for name in ("heartbeat_timeout_s", "learner", "torch_threads", "restart_backoff_s", "stop_timeout_s", "device"):
        assert getattr(config, name) == getattr(RunConfig, name)
    assert batching_from_args(parser.parse_args([])) == BatchingConfig()


def test_a_default_for_no_option_is_refused():
    with pytest.raises(TypeError, match="no run option: \\['num_envs'\\]"):
        add_run_options(argparse.ArgumentParser(), num_envs=4)


def test_tensorboard_and_wandb_without_their_packages_name_the_extra_to_install(monkeypatch):
    import importlib.util

    with pytest.raises(ConfigError, match="--wandb needs a W&B project name"):
        run_config(wandb_project=" ")
    installed = importlib.util.find_spec
    for missing, option, extra in (
        ("wandb", {"wandb_project": "p"}, "wandb"),
        ("tensorboard", {"wandb_project": "p"}, "tensorboard"),
        ("tensorboard", {"tensorboard": True}, "tensorboard"),
    ):
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, *rest, gone=missing: None if name == gone else installed(name, *rest),
        )
        with pytest.raises(ConfigError, match=rf"not installed: python -m pip install -e \"\.\[{extra}\]\""):
            run_config(**option)


def test_a_run_config_of_no_predicting_threads_is_refused_naming_the_setting():
    with pytest.raises(ConfigError, match=r"predict_threads must be >= 1 \(or None: from the cores\), got 0"):
        run_config(predict_threads=0)
