"""``flare2 plot``: seeds of one configuration as their mean over the band between them, evaluation returns dashed."""

from __future__ import annotations

import json

import pytest

from flare2.commands.plot import group_key, main, plot, read_curves
from flare2.errors import ConfigError

HEADER = "wall_time,env_steps,episodes,return_mean,eval_return_mean\n"


def write_run(path, rows, train=None):
    path.mkdir(parents=True)
    (path / "progress.csv").write_text(HEADER + "".join(f"0,{s},1,{r},{e}\n" for s, r, e in rows))
    if train is not None:
        (path / "train.json").write_text(json.dumps(train))
    return path


def test_seeds_of_one_configuration_make_one_curve_with_their_mean_and_spread(tmp_path, capsys):
    train = {"algo": "ppo", "env": "CartPole-v1", "algorithm": {"lr": 0.001}, "agent": {}, "run": {"seed": 0}}
    runs = [
        write_run(
            tmp_path / f"ppo_s{seed}", [(0, 10, "nan"), (1000, 100 + 100 * seed, 200)], {**train, "run": {"seed": seed}}
        )
        for seed in range(3)
    ]
    other = write_run(tmp_path / "other_s0", [(0, 5, "nan"), (500, 50, "nan")])
    output = tmp_path / "out" / "curve.png"
    assert main([*map(str, runs), str(other), "-o", str(output)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "ppo on CartPole-v1: 3 seeds, last mean 200.0 (lowest 100.0, highest 300.0) at 1,000 env steps"
    assert printed[1].startswith("ppo on CartPole-v1 (evaluation): 3 seeds, last mean 200.0")
    assert printed[2] == "other: 1 run, last mean 50.0 (lowest 50.0, highest 50.0) at 500 env steps"
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_of_other_settings_are_not_seeds_of_one_and_nan_returns_are_left_out(tmp_path):
    first = write_run(tmp_path / "a", [(0, "nan", "nan"), (10, 1, "nan")], {"algo": "ppo", "run": {"seed": 0}})
    second = write_run(tmp_path / "b", [(0, 2, "nan")], {"algo": "ppo", "run": {"seed": 1, "max_steps": 5}})
    assert group_key(first) != group_key(second)
    steps, returns = read_curves(first)["return_mean"]
    assert steps.tolist() == [10.0] and returns.tolist() == [1.0]
    assert "eval_return_mean" not in read_curves(first)
    assert len(plot([first, second], tmp_path / "c.png")) == 2


def test_a_directory_without_progress_is_named(tmp_path):
    with pytest.raises(ConfigError, match="has no progress.csv: give the log dir of a run"):
        plot([tmp_path], tmp_path / "c.png")


def test_a_run_with_episodes_is_drawn_one_point_per_episode_between_its_progress_rows(tmp_path):
    run = write_run(tmp_path / "run", [(100, 15.0, "nan"), (400, 30.0, "nan")])
    # Two episodes reported with the row at 100 steps, three with the row at 400; one evaluation episode.
    (run / "episodes.csv").write_text(
        "wall_time,env_steps,return,length,eval\n"
        + "".join(
            f"0,{steps},{ret},10,{evaluation}\n"
            for steps, ret, evaluation in [
                (100, 10, 0),
                (100, 20, 0),
                (400, 30, 0),
                (400, 40, 0),
                (400, 50, 0),
                (400, 7, 1),
            ]
        )
    )
    curves = read_curves(run)
    steps, means = curves["return_mean"]
    assert steps.tolist() == [50, 100, 200, 300, 400]
    assert means.tolist() == [10, 15, 20, 25, 30]  # the mean of every episode so far (fewer than 100)
    assert [values.tolist() for values in curves["eval_return_mean"]] == [[400], [7]]


def test_a_multi_agent_run_is_drawn_a_curve_per_team(tmp_path, capsys):
    run = write_run(tmp_path / "duel", [(100, 0.0, "nan"), (200, 0.0, "nan")])
    (run / "episodes.csv").write_text(
        "wall_time,env_steps,return,length,eval,team\n"
        + "".join(
            f"0,{steps},{ret},25,0,{team}\n"
            for steps, ret, team in [
                (100, -4, "adversary"),
                (100, 2, "agent"),
                (100, 4, "agent"),
                (200, -2, "adversary"),
            ]
        )
    )
    curves = read_curves(run)
    assert sorted(curves) == ["return_mean:adversary", "return_mean:agent"]
    assert curves["return_mean:adversary"][1].tolist() == [-4, -3]
    assert curves["return_mean:agent"][1].tolist() == [2, 3]
    assert main([str(run), "-o", str(tmp_path / "teams.png")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed[:2]] == ["duel, team adversary", "duel, team agent"]
