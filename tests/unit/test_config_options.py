"""An algorithm's settings on the command line: one option per field of its config, each with its type and help."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from flare2.runtime.options import add_config_options, add_run_options, config_from_args
from flare2.zoo.records.a2c import A2CConfig
from flare2.zoo.records.dqn import DQNConfig
from flare2.zoo.records.ppo import PPOConfig
from flare2.zoo.records.td3 import TD3Config
from flare2.zoo.registry import lookup, names

ZOO_CONFIGS = [lookup(name).config_class for name in names()]


def parser_for(config_class, **kwargs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="run")
    add_config_options(parser, config_class, **kwargs)
    return parser


@pytest.mark.parametrize("config_class", ZOO_CONFIGS, ids=lambda c: c.__name__)
def test_every_field_of_every_zoo_config_has_an_option_with_help_and_no_option_clashes_with_a_run_option(config_class):
    parser = parser_for(config_class)
    add_run_options(parser)  # argparse refuses a flag added twice
    flags = {action.dest: action for action in parser._actions}
    for field in dataclasses.fields(config_class):
        action = flags[f"{config_class.__name__}.{field.name}"]
        assert action.option_strings[0] == "--" + field.name.replace("_", "-")
        assert len(action.help) > len(" (default: %(default)s)"), f"{config_class.__name__}.{field.name} has no help"
    assert config_from_args(parser, parser.parse_args([]), config_class) == config_class()


def test_options_parse_to_the_field_types_including_none_booleans_and_tuples():
    parser = parser_for(DQNConfig)
    args = parser.parse_args(["--lr", "0.01", "--anneal-steps", "none", "--no-double-q", "--target-update-every", "4"])
    config = config_from_args(parser, args, DQNConfig)
    assert (config.lr, config.anneal_steps, config.double_q, config.target_update_every) == (0.01, None, False, 4)
    td3 = parser_for(TD3Config)
    assert config_from_args(td3, td3.parse_args(["--hidden", "32", "16"]), TD3Config).hidden == (32, 16)


def test_a_script_default_and_a_derived_default_apply_unless_the_option_is_given():
    parser = parser_for(PPOConfig, epochs=5, derived={"anneal_steps": "--max-steps"})
    assert "(default: --max-steps)" in parser.format_help()
    config = config_from_args(parser, parser.parse_args([]), PPOConfig, anneal_steps=60_000)
    assert (config.epochs, config.anneal_steps) == (5, 60_000)
    given = config_from_args(parser, parser.parse_args(["--anneal-steps", "7"]), PPOConfig, anneal_steps=60_000)
    assert given.anneal_steps == 7


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gamma", "2"], "A2CConfig.gamma must be in [0, 1], got 2.0"),
        (["--lr", "fast"], "argument --lr: expected a number, got 'fast'"),
        (["--optimizer", "sgd"], "A2CConfig.optimizer must be 'rmsprop' or 'adam', got 'sgd'"),
    ],
)
def test_a_value_the_config_refuses_is_a_usage_error_that_names_the_field(capsys, argv, message):
    parser = parser_for(A2CConfig)
    with pytest.raises(SystemExit) as exited:
        config_from_args(parser, parser.parse_args(argv), A2CConfig)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults_for_no_field_and_fields_without_a_command_line_form_are_refused():
    with pytest.raises(TypeError, match=r"no field of A2CConfig: \['learning_rate'\]"):
        parser_for(A2CConfig, learning_rate=1.0)

    @dataclasses.dataclass(frozen=True)
    class Odd:
        table: dict = dataclasses.field(default_factory=dict)

    with pytest.raises(TypeError, match="Odd.table is a <class 'dict'>, which has no command-line form"):
        parser_for(Odd)


def test_a_default_set_on_the_parser_for_a_config_field_is_refused_with_the_way_that_works():
    parser = parser_for(PPOConfig)
    parser.set_defaults(lr=1e-3)
    with pytest.raises(TypeError, match=r"add_config_options\(parser, PPOConfig, lr=\.\.\.\)"):
        config_from_args(parser, parser.parse_args([]), PPOConfig)
