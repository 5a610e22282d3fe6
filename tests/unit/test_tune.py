"""``flare2 tune``: what it searches for each algorithm, the first trial, and the preset it writes."""

from __future__ import annotations

import json

import pytest
from extras import needs_env

from flare2.commands.train import _write_train_file, resolve
from flare2.commands.tune import _defaults, best_preset, search_space
from flare2.runtime.run_files import TRAIN_FILE
from flare2.zoo.record import field_names
from flare2.zoo.registry import lookup, names

PRESETS = [
    pytest.param(algo, env_id, marks=needs_env(env_id))
    for algo, env_id in sorted((algo, env_id) for algo in names() for env_id in lookup(algo).presets)
]


def test_every_algorithm_has_a_search_space_of_its_own_settings():
    for algo in names():
        record = lookup(algo)
        space = search_space(algo)
        known = field_names(record.config_class) | field_names(record.settings_class)
        assert space and set(space) <= known, algo
        # A setting derived from the budget follows the run that takes the preset; it is not searched.
        assert not set(space) & set(record.derived), algo


@pytest.mark.parametrize("algo, env_id", PRESETS)
def test_the_first_trial_plays_the_packages_settings_where_they_lie_in_the_space(tmp_path, algo, env_id):
    plan = resolve(["--env", env_id, "--algo", algo, "--log-dir", str(tmp_path)])
    first = _defaults(plan)
    assert first and set(first) <= set(search_space(algo))
    assert first["gamma"] == plan.config.gamma


def test_the_best_trial_becomes_a_preset_without_the_trials_budget_that_flare2_train_takes(tmp_path):
    trial = tmp_path / "trial_3"
    trial_plan = resolve(
        [
            "--env",
            "CartPole-v1",
            "--algo",
            "ppo",
            "--lr",
            "0.0005",
            "--max-steps",
            "8000",
            "--seed",
            "4",
            "--num-agents",
            "2",
            "--log-dir",
            str(trial),
        ]
    )
    _write_train_file(trial_plan)
    preset = best_preset(trial, "ppo")
    assert preset["algorithm"]["lr"] == 0.0005 and "anneal_steps" not in preset["algorithm"]
    assert "max_steps" not in preset["run"] and "seed" not in preset["run"] and preset["run"]["num_agents"] == 2
    (tmp_path / "best.json").write_text(json.dumps(preset))
    plan = resolve(["--preset", str(tmp_path / "best.json"), "--max-steps", "90000", "--log-dir", str(tmp_path / "x")])
    # The schedule follows the new run's budget; the found settings stay.
    assert (plan.config.lr, plan.config.anneal_steps, plan.options["num_agents"]) == (0.0005, 90000, 2)
    assert json.loads((trial / TRAIN_FILE).read_text())["run"]["max_steps"] == 8000
