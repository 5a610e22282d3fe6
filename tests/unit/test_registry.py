"""The algorithms flare2 train, tune and eval know: the zoo's records, ones registered in Python, and entry points."""

from __future__ import annotations

import dataclasses
import pickle
import textwrap

import pytest
from tool_modules import ROOT, load_tool

from flare2.commands.train import resolve
from flare2.commands.tune import search_space
from flare2.errors import ConfigError
from flare2.wire.codec import decode, encode
from flare2.zoo import registry
from flare2.zoo.record import BOX, DISCRETE, ActorCriticSettings, AlgorithmRecord
from flare2.zoo.records.a2c import A2CConfig


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    """Records registered by a test are forgotten after it."""
    registry.names()  # the zoo's records first, so that they stay
    monkeypatch.setattr(registry, "_records", dict(registry._records))


@dataclasses.dataclass(frozen=True)
class SmallConfig:
    lr: float = 0.01
    """Learning rate."""
    gamma: float = 0.9
    """Discount factor."""


def small_record(**changes) -> AlgorithmRecord:
    fields = {
        "name": "small",
        "config_class": SmallConfig,
        "settings_class": ActorCriticSettings,
        "build": "flare2.zoo.a2c:build",
        "observations": (BOX, DISCRETE),
        "actions": (DISCRETE,),
        "run": {"num_agents": 1, "max_steps": 3000},
        "agent": {"sample_interval": 16},
        "presets": {"CartPole-v1": {"algorithm": {"gamma": 0.95}}},
        "search_space": {"lr": ("log", (1e-4, 1e-1))},
    }
    return AlgorithmRecord(**{**fields, **changes})


def test_an_unknown_name_is_refused_naming_the_known_algorithms_and_the_closest():
    with pytest.raises(ConfigError) as error:
        registry.lookup("ppo2")
    message = str(error.value)
    assert (
        "invalid choice: 'ppo2' (choose from a2c, appo, dqn, ppo, recurrent-ppo, sac, sarsa, td3; did you mean ppo?)"
        in message
    )
    assert "flare2.zoo.register" in message and "'flare2.algorithms' entry point" in message


def test_the_zoo_has_one_record_per_module_each_named_as_flare2_train_knows_it():
    assert registry.names() == ["a2c", "appo", "dqn", "ppo", "recurrent-ppo", "sac", "sarsa", "td3"]
    assert all(registry.lookup(name).name == name for name in registry.names())


def test_a_registered_record_is_what_flare2_train_and_tune_read(tmp_path):
    record = registry.register(small_record())
    assert registry.lookup("small") is record and "small" in registry.names()
    plan = resolve(["--env", "CartPole-v1", "--algo", "small", "--lr", "0.02", "--log-dir", str(tmp_path)])
    # Its starting point, then its preset for the env, then the command line.
    assert plan.config == SmallConfig(0.02, 0.95)
    assert (plan.options["max_steps"], plan.settings.sample_interval) == (3000, 16)
    assert plan.run.agents.kwargs["sample_interval"] == 16
    assert search_space("small") == {"lr": ("log", (1e-4, 1e-1))}
    # The CT's build travels to the compute process by pickling, and names the build function by its path.
    build = pickle.loads(pickle.dumps(plan.run.cts[0].build))
    assert (build.path, build.env_id, build.config) == ("flare2.zoo.a2c:build", "CartPole-v1", SmallConfig(0.02, 0.95))


@pytest.mark.parametrize(
    "argv",
    [
        ["--env", "Acrobot-v1", "--algo", "ppo", "--hidden", "32", "16"],
        ["--env", "Pendulum-v1", "--algo", "sac"],
        ["--env", "CartPole-v1", "--algo", "dqn", "--max-episode-steps", "200"],
    ],
)
def test_a_build_crosses_to_a_learner_on_another_machine_as_data_and_is_the_same_build_there(argv, tmp_path):
    build = resolve([*argv, "--log-dir", str(tmp_path)]).run.cts[0].build
    # What `flare2 learn` gets: the recipe through flare2's codec (lists for tuples, no pickle).
    crossed = decode(encode(build.recipe()))
    assert registry.rebuild(crossed) == build
    with pytest.raises(ConfigError, match="not a build recipe of flare2 train"):
        registry.rebuild({**crossed, "algorithm": {**crossed["algorithm"], "no_such_setting": 1}})
    # An algorithm this Python lacks (a plugin not installed here): lookup's own message, naming how one joins.
    with pytest.raises(ConfigError, match="invalid choice: 'my-ppo' .* entry point"):
        registry.rebuild({**crossed, "algo": "my-ppo"})


def test_registering_twice_is_harmless_but_a_taken_name_is_refused():
    registry.register(small_record())
    registry.register(small_record())
    with pytest.raises(ConfigError, match="an algorithm named 'ppo' is registered already .*give yours another name"):
        registry.register(small_record(name="ppo"))


def test_an_algorithm_without_a_search_space_cannot_be_tuned():
    registry.register(small_record(search_space={}))
    with pytest.raises(ConfigError, match="small has no search space: give its AlgorithmRecord a search_space"):
        search_space("small")


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"name": "two words"}, "AlgorithmRecord.name must be a word"),
        ({"build": "flare2.zoo.a2c.build"}, "build must be the import path 'package.module:function'"),
        ({"config_class": dict}, "config_class must be a dataclass"),
        ({"settings_class": SmallConfig}, "settings_class must be OnlineSettings or ReplaySettings"),
        (
            {"observations": ("Image",)},
            "observations must be a non-empty tuple of ('Box', 'Discrete', 'Dict of those', 'Dict of entities",
        ),
        ({"actions": ()}, "actions must be a non-empty tuple of ('Discrete', '1-d Box')"),
        ({"agent": {"samples": 3}}, "agent names ['samples'], which are not among the fields"),
        (
            {"presets": {"CartPole-v1": {"algorithm": {"alpha": 1}}}},
            "the preset of CartPole-v1: algorithm names ['alpha']",
        ),
        (
            {"presets": {"CartPole-v1": {"network": {}}}},
            "the preset of CartPole-v1 must be a map of algorithm, agent, run",
        ),
        ({"search_space": {"beta": ("log", (0.1, 1))}}, "search_space names ['beta']"),
        ({"search_space": {"lr": ("uniform", (0.1, 1))}}, "must be (kind, bounds) with kind one of"),
        ({"search_space": {"lr": ("log", (0.0, 1.0))}}, "log needs bounds above 0"),
        ({"search_space": {"lr": ("float", (1.0, 0.1))}}, "needs bounds (low, high) with low < high"),
        ({"search_space": {"lr": ("choice", ())}}, "a choice needs a non-empty tuple of values"),
        ({"derived": {"lr": "max_steps"}}, "search_space['lr'] is derived from max_steps"),
    ],
)
def test_a_record_that_does_not_hold_together_is_refused_naming_the_field(changes, says):
    with pytest.raises(ConfigError) as error:
        small_record(**changes)
    assert says in str(error.value)


def test_an_entry_point_of_an_installed_package_is_found_by_its_name(tmp_path, monkeypatch):
    package = tmp_path / "small_algorithms"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "records.py").write_text(
        textwrap.dedent("""
        from flare2.zoo.record import BOX, DISCRETE, ActorCriticSettings, AlgorithmRecord
        from flare2.zoo.records.a2c import A2CConfig

        RECORD = AlgorithmRecord(name="plugged", config_class=A2CConfig, settings_class=ActorCriticSettings,
                                 build="flare2.zoo.a2c:build", observations=(BOX, DISCRETE), actions=(DISCRETE,))
        WRONG_NAME = AlgorithmRecord(name="other", config_class=A2CConfig, settings_class=ActorCriticSettings,
                                     build="flare2.zoo.a2c:build", observations=(BOX,), actions=(DISCRETE,))
        NOT_A_RECORD = 3
    """)
    )
    metadata = tmp_path / "small_algorithms-1.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: small-algorithms\nVersion: 1.0\n")
    (metadata / "entry_points.txt").write_text(
        "[flare2.algorithms]\n"
        "plugged = small_algorithms.records:RECORD\n"
        "misnamed = small_algorithms.records:WRONG_NAME\n"
        "number = small_algorithms.records:NOT_A_RECORD\n"
        "broken = small_algorithms.missing:RECORD\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    assert {"plugged", "misnamed", "number", "broken"} <= set(registry.names())
    record = registry.lookup("plugged")
    assert (record.name, record.config_class) == ("plugged", A2CConfig)
    with pytest.raises(ConfigError, match="entry point misnamed = .* is the record of 'other': name the entry point"):
        registry.lookup("misnamed")
    with pytest.raises(ConfigError, match="entry point number = .* is a int, not an AlgorithmRecord"):
        registry.lookup("number")
    with pytest.raises(ConfigError, match="entry point broken = .* does not load .*ModuleNotFound.*fix or uninstall"):
        registry.lookup("broken")
    # The algorithms that take CartPole's spaces leave out an entry point that does not load.
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    assert registry.fitting(env.observation_space, env.action_space) == [
        "a2c",
        "appo",
        "dqn",
        "plugged",
        "ppo",
        "recurrent-ppo",
        "sarsa",
    ]


def test_the_docs_table_has_a_row_per_algorithm_with_its_spaces_and_preset_envs(capsys):
    tool = load_tool("algorithms_table")
    registry.register(small_record())
    assert tool.main([]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "| algorithm | observations | actions | presets (env ids, kinds of env) |"
    assert len(rows) == 2 + len(registry.names())
    assert "| `td3` | Box | 1-d Box | `Pendulum-v1` |" in rows
    assert "| `sac` | Box | 1-d Box | `HalfCheetah-v5`, `Pendulum-v1` |" in rows
    assert "| `small` | Box, Discrete | Discrete | `CartPole-v1` |" in rows
    assert (
        "| `dqn` | Box, Discrete, Dict of those | Discrete | `Acrobot-v1`, `CartPole-v1`, Atari games, MinAtar games |"
        in rows
    )


def test_the_zoo_page_shows_the_table_the_tool_prints(capsys):
    assert load_tool("algorithms_table").main([]) == 0
    assert capsys.readouterr().out.strip() in (ROOT / "docs" / "zoo.md").read_text()


def test_a_record_that_derives_a_setting_from_no_option_is_refused_by_flare2_train(tmp_path, capsys):
    registry.register(small_record(derived={"gamma": "max_step"}, search_space={}))
    with pytest.raises(SystemExit):
        resolve(["--env", "CartPole-v1", "--algo", "small", "--log-dir", str(tmp_path)])
    assert "the record of small derives settings from ['max_step'], which are neither run options" in (
        capsys.readouterr().err
    )
