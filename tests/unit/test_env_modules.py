"""PettingZoo envs named by their modules: what names one, what to install when its package is missing, and the
modules closest to a path that does not import."""

from __future__ import annotations

import pytest

from flare2.core.env_making import is_pettingzoo_env, make_pettingzoo_env
from flare2.errors import ConfigError


def test_pettingzoo_env_ids_are_module_paths():
    assert is_pettingzoo_env("mpe2.simple_spread_v3")
    assert is_pettingzoo_env("pettingzoo.classic.connect_four_v3")
    for gym_id in ("CartPole-v1", "ALE/Breakout-v5", "gymnasium.envs:CartPole-v1", "MinAtar/Breakout-v1"):
        assert not is_pettingzoo_env(gym_id)


def test_a_missing_env_package_names_what_to_install():
    with pytest.raises(ConfigError, match=r"'nosuchpackage_xyz' is not installed: install the package"):
        make_pettingzoo_env("nosuchpackage_xyz.simple_v1")
    with pytest.raises(ConfigError, match="no such module.*check the env's module path"):
        make_pettingzoo_env("flare2.no_such_env_v1")
    with pytest.raises(ConfigError, match=r"has neither parallel_env\(\) nor env\(\)"):
        make_pettingzoo_env("flare2.errors")


def test_a_module_path_that_does_not_import_names_the_nearest_modules_of_its_package(tmp_path, monkeypatch):
    # A wrong version or a typo, as a new user types them: the package's modules closest to the name are given.
    games = tmp_path / "fakeboards"
    games.mkdir()
    (games / "__init__.py").write_text("")
    for name in ("race_v11", "race", "chess_v6"):
        (games / f"{name}.py").write_text("" if name == "race" else "def env(): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"no such module .*did you mean fakeboards\.race_v11 or fakeboards\.race\?"):
        make_pettingzoo_env("fakeboards.race_v10")
    with pytest.raises(
        ConfigError, match=r"fakeboards\.chess_v6 is a module, not a package: did you mean fakeboards\.chess_v6\?"
    ):
        make_pettingzoo_env("fakeboards.chess_v6.more")
    with pytest.raises(ConfigError, match=r"fakeboards has no module 'go_v1'"):
        make_pettingzoo_env("fakeboards.go_v1")
    with pytest.raises(ConfigError, match=r"'fakeboardz' is not installed: .* or did you mean fakeboards\.race_v11\?"):
        make_pettingzoo_env("fakeboardz.race_v11")
    (games / "cards").mkdir()
    (games / "cards" / "__init__.py").write_text("")
    (games / "cards" / "poker_v1.py").write_text("def env(): ...\n")
    with pytest.raises(ConfigError, match=r"did you mean fakeboards\.cards\.poker_v1\?"):
        make_pettingzoo_env("fakeboards.cardz.poker_v1")
    # A package of the env's code beside its versioned module, as PettingZoo ships them.
    with pytest.raises(ConfigError, match=r"neither parallel_env\(\) nor env\(\).*did you mean fakeboards\.race_v11\?"):
        make_pettingzoo_env("fakeboards.race")


def test_an_env_module_whose_own_import_fails_names_the_missing_package_and_its_extra(tmp_path, monkeypatch):
    # A package with an extra per family of envs, as PettingZoo has ("pettingzoo[classic]" brings rlcard).
    family = tmp_path / "fakegames" / "cards"
    family.mkdir(parents=True)
    (tmp_path / "fakegames" / "__init__.py").write_text("")
    (family / "__init__.py").write_text("")
    (family / "poker_v0.py").write_text("import nosuchdependency_xyz\n")
    (tmp_path / "fakegames" / "standalone_v0.py").write_text("import nosuchdependency_xyz\n")
    metadata = tmp_path / "fakegames-1.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: fakegames\nVersion: 1.0\nProvides-Extra: cards\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"imports 'nosuchdependency_xyz', which is not installed: pip install \"fakegames\[cards\]\""
    ):
        make_pettingzoo_env("fakegames.cards.poker_v0")
    with pytest.raises(
        ConfigError, match=r"which is not installed: install the package that provides 'nosuchdependency_xyz'"
    ):
        make_pettingzoo_env("fakegames.standalone_v0")
