"""``flare2 train``: where each setting comes from, and the one message each wrong command line ends with."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from extras import needs_env

import flare2
from flare2.commands.train import resolve
from flare2.errors import ConfigError
from flare2.zoo.registry import lookup, names


def usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        resolve(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_settings_come_from_the_algorithm_then_the_envs_preset_then_a_preset_file_then_the_command_line(tmp_path):
    plan = resolve(["--env", "CartPole-v1", "--algo", "dqn", "--log-dir", str(tmp_path)])
    # DQN's own starting point, its CartPole preset (greedy evaluation every episode), --max-steps for the schedule.
    assert plan.options["envs_per_agent"] == 8 and plan.options["eval_every"] == 1
    assert plan.settings.n_step == 3 and plan.config.anneal_steps == plan.options["max_steps"] == 100_000
    preset = tmp_path / "preset.json"
    preset.write_text(json.dumps({"algorithm": {"lr": 0.01}, "agent": {"n_step": 2}, "run": {"eval_every": 3}}))
    plan = resolve(
        [
            "--env",
            "CartPole-v1",
            "--algo",
            "dqn",
            "--preset",
            str(preset),
            "--eval-every",
            "5",
            "--max-steps",
            "7000",
            "--log-dir",
            str(tmp_path),
        ]
    )
    assert (plan.config.lr, plan.settings.n_step, plan.options["eval_every"]) == (0.01, 2, 5)
    assert plan.config.anneal_steps == 7000
    assert plan.run.agents.kwargs["replay"]["sequence_length"] == 2
    td3 = resolve(["--env", "Pendulum-v1", "--algo", "td3", "--warmup", "800", "--log-dir", str(tmp_path)])
    assert td3.config.hidden == (64, 64) and td3.config.random_steps == 800


PRESETS = [(algo, env_id) for algo in names() for env_id in lookup(algo).presets]


def test_every_algorithm_has_a_preset_env():
    assert {algo for algo, _ in PRESETS} == set(names())


@pytest.mark.parametrize("algo, env_id", [pytest.param(*preset, marks=needs_env(preset[1])) for preset in PRESETS])
def test_every_preset_env_is_one_its_algorithm_takes(tmp_path, algo, env_id):
    env = f"flare2.zoo.envs:{env_id}" if env_id.startswith("flare2/") else env_id
    assert resolve(["--env", env, "--algo", algo, "--log-dir", str(tmp_path)]).algo == algo


@needs_env("pettingzoo.classic.connect_four_v3")
def test_connect_fours_preset_plays_self_play_against_a_pool_and_self_play_0_turns_both_off(tmp_path):
    argv = ["--env", "pettingzoo.classic.connect_four_v3", "--algo", "ppo", "--log-dir", str(tmp_path)]
    preset = resolve(argv).run.cts
    assert [(ct.name, ct.follows, ct.snapshots) for ct in preset] == [("RL", None, 1), ("opponent", "RL", 16)]
    assert [ct.name for ct in resolve([*argv, "--self-play", "0"]).run.cts] == ["RL"]


@needs_env("pettingzoo.classic.tictactoe_v3")
def test_pettingzoo_classic_games_played_in_turns_start_from_connect_fours_settings_without_a_sparring_partner(
    tmp_path,
):
    def plan(env_id: str, *options: str):
        return resolve(["--env", env_id, "--algo", "ppo", "--log-dir", str(tmp_path), *options])

    tictactoe = plan("pettingzoo.classic.tictactoe_v3")
    assert [(ct.name, ct.follows, ct.snapshots) for ct in tictactoe.run.cts] == [
        ("RL", None, 1),
        ("opponent", "RL", 16),
    ]
    assert tictactoe.options["self_play_sparring"] == "" and tictactoe.options["max_steps"] == 300_000
    connect_four = plan("pettingzoo.classic.connect_four_v3")
    assert (tictactoe.config, tictactoe.settings) == (connect_four.config, connect_four.settings)
    assert tictactoe.settings.hidden == (256, 256) and tictactoe.config.minibatch_size == 64
    # Rock-paper-scissors moves at once (no seat to take in turn), and a turn-based game of one's own is no
    # PettingZoo classic game: neither plays self-play unless asked.
    for env_id in ("pettingzoo.classic.rps_v2", "turn_games.corridor_v0"):
        assert [ct.name for ct in plan(env_id).run.cts] == ["RL"]
        assert plan(env_id).settings.hidden == (64, 64)


@pytest.mark.parametrize(
    "env_id, module, extra", [("LunarLander-v3", "Box2D", "box2d"), ("HalfCheetah-v5", "mujoco", "mujoco")]
)
def test_a_gymnasium_env_whose_package_is_missing_names_flare2s_extra(capsys, monkeypatch, env_id, module, extra):
    installed = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == module else installed(name))
    assert (
        usage_error(capsys, ["--env", env_id, "--algo", "ppo" if extra == "box2d" else "sac"])
        .rstrip()
        .endswith(
            f"env '{env_id}' needs {module}, which flare2's {extra} extra installs: pip install \"flare2[{extra}]\""
        )
    )


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--env", "CartPol-v1", "--algo", "ppo"],
            "'CartPol-v1' is no registered Gymnasium environment: did you mean CartPole-v1",
        ),
        (
            ["--env", "Pendulum-v1", "--algo", "dqn"],
            (
                "--algo dqn takes Box, Discrete or Dict of those observations and Discrete actions, "
                "but Pendulum-v1 has observation space Box"
            ),
        ),
        (["--env", "Pendulum-v1", "--algo", "dqn"], "try --algo a2c or appo or ppo or sac or td3"),
        (
            ["--env", "CartPole-v1", "--algo", "td3"],
            "action space Discrete(2): try --algo a2c or appo or dqn or ppo or recurrent-ppo or sarsa\n",
        ),
        (["--env", "CartPole-v1"], "give --env ENV_ID and --algo ALGO"),
        (["--env", "CartPole-v1", "--algo", "reinforce"], "argument --algo: invalid choice: 'reinforce'"),
        (
            ["--env", "CartPole-v1", "--algo", "ppo", "--sample-interval", "zero"],
            "--sample-interval: expected an integer",
        ),
        (["--env", "CartPole-v1", "--algo", "dqn", "--frames", "0"], "--frames 0: a model sees at least the current"),
        (["--env", "CartPole-v1", "--algo", "ppo", "--frames", "0"], "use --frames 1 or more"),
    ],
)
def test_a_wrong_command_line_ends_in_one_message_naming_the_fix(capsys, argv, says):
    assert says in usage_error(capsys, argv)


def test_a_preset_file_that_names_no_option_or_is_no_json_is_refused(tmp_path, capsys):
    preset = tmp_path / "preset.json"
    preset.write_text(json.dumps({"algo": "ppo", "env": "CartPole-v1", "algorithm": {"learning_rate": 0.1}}))
    assert "algorithm must be a map of option names, and ['learning_rate'] is not one of" in usage_error(
        capsys, ["--preset", str(preset)]
    )
    preset.write_text("{algo: ppo")
    assert f"--preset {preset} is not a JSON file" in usage_error(capsys, ["--preset", str(preset)])
    assert "no such file" in usage_error(capsys, ["--preset", str(tmp_path / "missing.json")])


def test_flare2_train_from_python_names_a_setting_it_does_not_know_and_the_closest_ones(tmp_path):
    with pytest.raises(flare2.ConfigError, match=r"'lrr' is no setting of flare2 train --algo ppo: did you mean lr"):
        flare2.train("CartPole-v1", algo="ppo", lrr=0.1, log_dir=str(tmp_path))


def test_flare2_train_from_python_refuses_a_setting_out_of_range_with_the_command_lines_message(tmp_path):
    with pytest.raises(flare2.ConfigError, match="num_agents must be >= 0"):
        flare2.train("CartPole-v1", algo="ppo", num_agents=-1, log_dir=str(tmp_path))


def test_a_preset_that_runs_serially_is_undone_with_no_serial_and_a_conflict_names_it(capsys, tmp_path):
    command = ["--env", "CartPole-v1", "--algo", "a2c", "--log-dir", str(tmp_path)]
    assert resolve(command).run.serial
    assert "drop --learner process, or give --no-serial" in usage_error(capsys, [*command, "--learner", "process"])
    plan = resolve([*command, "--no-serial", "--learner", "process"])
    assert not plan.run.serial and plan.run.learner == "process"


@pytest.mark.parametrize("algo", names())
def test_help_without_an_env_lists_the_options_with_an_env_the_algorithm_takes(capsys, algo):
    with pytest.raises(SystemExit) as exit_info:
        resolve(["--algo", algo, "--help"])
    assert exit_info.value.code == 0
    assert f"with {algo}" in capsys.readouterr().out


def test_double_buffering_reaches_the_agents_of_an_on_policy_run(tmp_path):
    def agent_kwargs(*options):
        argv = ["--env", "CartPole-v1", "--algo", "ppo", *options, "--log-dir", str(tmp_path)]
        return resolve(argv).run.agents.kwargs

    assert agent_kwargs()["double_buffer"] is False
    assert agent_kwargs("--double-buffer")["double_buffer"] is True


def test_double_buffering_where_nothing_could_overlap_names_the_fix(capsys, tmp_path):
    command = ["--env", "CartPole-v1", "--algo", "a2c", "--double-buffer", "--log-dir", str(tmp_path)]  # serial
    assert "--serial runs both in this one process: give --no-double-buffer, or --no-serial" in usage_error(
        capsys, command
    )
    one_env = [*command, "--no-serial", "--envs-per-agent", "1"]
    assert "give --envs-per-agent 2 or more, or --no-double-buffer" in usage_error(capsys, one_env)
    assert resolve([*command, "--no-serial"]).run.agents.kwargs["double_buffer"] is True


@pytest.mark.parametrize("algo", ["ppo", "appo", "a2c"])
def test_the_activation_reaches_both_mlps_of_the_actor_critic_and_an_unknown_one_names_the_choices(tmp_path, algo):
    def hidden_activations(*options):
        argv = ["--env", "CartPole-v1", "--algo", algo, *options, "--log-dir", str(tmp_path)]
        model = resolve(argv).run.cts[0].build().model
        nets = (model.policy_net, model.value_net)
        return {type(layer).__name__ for net in nets for layer in net if not isinstance(layer, torch.nn.Linear)}

    assert hidden_activations() == {"Tanh"}
    assert hidden_activations("--activation", "relu") == {"ReLU"}
    with pytest.raises(ConfigError, match="--activation 'gelu' is no activation here: use one of tanh, relu"):
        hidden_activations("--activation", "gelu")
