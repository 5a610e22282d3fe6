"""tools/bench_peers.py, tools/sb3_settings.py and tools/proctree.py without SB3: the rows from the registry, SB3's
settings mapped from each preset, the medians and ratios, --only, progress.csv reading, measuring."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import sys
import threading
from pathlib import Path

import pytest
from tool_modules import load_tool

import flare2.commands.train
from flare2.core.env_making import missing_extra
from flare2.errors import ConfigError
from flare2.zoo import registry
from flare2.zoo.record import ReplaySettings
from flare2.zoo.records.ppo import RECORD as PPO_RECORD
from flare2.zoo.records.sac import SACConfig
from flare2.zoo.records.td3 import TD3Config


@pytest.fixture(scope="module")
def bench():
    return load_tool("bench_peers")


@pytest.fixture(scope="module")
def proctree():
    return load_tool("proctree")


@pytest.fixture(scope="module")
def rows(bench):
    rows, skipped = bench.race_rows()
    return {row.name: row for row in rows}, skipped


# ---- the rows -----------------------------------------------------------------------------------------------------


def test_every_preset_of_every_algorithm_sb3_has_is_a_row_and_a_missing_one_is_skipped_with_a_line(bench, rows):
    found, skipped = rows
    expected, missing, without_extra = [], [], []
    for algo in bench.SB3_CLASS:
        try:
            presets = registry.lookup(algo).presets
        except ConfigError:
            missing.append(algo)
            continue
        for env_id in presets:
            if bench.beyond_sb3(env_id):  # several agents, or entities: named as not raced
                assert any(line.startswith(f"{algo}/{env_id}: not raced, ") for line in skipped)
                continue
            (without_extra if missing_extra(env_id) else expected).append(f"{algo}/{env_id}")
    assert list(found) == expected
    for name in without_extra:  # an env of an extra this Python lacks (LunarLander-v3 without box2d) names the extra
        line = next(line for line in skipped if line.startswith(f"{name}: skipped"))
        assert f"flare2's {missing_extra(name.split('/', 1)[1])} extra installs" in line
    assert {"ppo/CartPole-v1", "ppo/MountainCar-v0", "a2c/CartPole-v1", "dqn/Acrobot-v1", "td3/Pendulum-v1"} <= set(
        found
    )
    assert {"appo/CartPole-v1", "appo/Acrobot-v1"} <= set(found)
    assert not any(name.startswith(("sarsa/", "recurrent-ppo/")) for name in found)  # SB3 has neither
    for algo in missing:  # sac until its record is in this tree
        assert (
            f"{algo}: skipped, this flare2 has no algorithm of that name (no flare2/zoo/records/{algo}.py)" in skipped
        )


def test_a_new_preset_is_a_new_row(bench, monkeypatch):
    extended = dataclasses.replace(PPO_RECORD, presets={**PPO_RECORD.presets, "MountainCarContinuous-v0": {}})

    def lookup(name):
        return extended if name == "ppo" else registry.lookup(name)

    monkeypatch.setattr(bench, "lookup", lookup)
    monkeypatch.setattr(flare2.commands.train, "lookup", lookup)
    rows, _ = bench.race_rows([("ppo", None)])
    assert [row.name for row in rows] == [
        f"ppo/{env_id}"
        for env_id in PPO_RECORD.presets
        if missing_extra(env_id) is None and not bench.beyond_sb3(env_id)
    ] + ["ppo/MountainCarContinuous-v0"]
    assert rows[-1].threshold == 90  # Gymnasium's reward_threshold of MountainCarContinuous-v0


def test_only_takes_algo_slash_env_or_an_algorithm_and_refuses_what_is_not_raced(bench):
    assert bench.parse_only(["ppo/CartPole-v1", "dqn", "appo/flare2/Some-v0"]) == [
        ("ppo", "CartPole-v1"),
        ("dqn", None),
        ("appo", "flare2/Some-v0"),
    ]
    for bad, match in [("sarsa/CliffWalking-v1", "not raced"), ("ppo/", "ALGO/ENV"), ("/CartPole-v1", "ALGO/ENV")]:
        with pytest.raises(ValueError, match=match):
            bench.parse_only([bad])
    rows, _ = bench.race_rows(bench.parse_only(["ppo/CartPole-v1", "dqn"]))
    assert [row.name for row in rows] == ["ppo/CartPole-v1", "dqn/CartPole-v1", "dqn/Acrobot-v1"]
    with pytest.raises(ValueError, match=r"ppo has no preset for Pendulum-v1 \(its presets: CartPole-v1, "):
        bench.race_rows([("ppo", "Pendulum-v1")])


def test_a_game_of_a_family_preset_races_when_only_names_it_with_flare2s_cnn_on_both_sides(bench, rows):
    assert not any(name.startswith("ppo/MinAtar") for name in rows[0])  # a family has no one env to race
    (row,), _ = bench.race_rows(bench.parse_only(["ppo/MinAtar/Breakout-v1"]))
    assert (row.name, row.threshold, row.budget) == ("ppo/MinAtar/Breakout-v1", 10.0, 1_000_000)
    assert row.spec.features_extractor == "minatar" and row.spec.n_envs == 8
    assert row.spec.kwargs["n_steps"] == 128 and row.spec.kwargs["n_epochs"] == 3
    assert not row.spec.differences, row.spec.differences
    with pytest.raises(ValueError, match="ppo has no preset for MinAtar-Breakout"):
        bench.race_rows([("ppo", "MinAtar-Breakout")])


def test_the_threshold_is_gymnasiums_where_it_has_one_else_the_tables(bench):
    assert bench.threshold_of("CartPole-v1") == (475.0, "Gymnasium's reward_threshold")
    assert bench.threshold_of("MountainCar-v0")[0] == -110.0
    assert bench.threshold_of("Pendulum-v1") == (-200.0, "tools/bench_peers.py THRESHOLDS")
    assert bench.threshold_of("Blackjack-v1") is None


def test_flare2_runs_the_preset_with_the_stop_rule_and_a_capped_budget_only_when_capped(bench, rows):
    row = rows[0]["ppo/CartPole-v1"]
    assert row.flare2_args(2, "/tmp/x") == [
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--seed",
        "2",
        "--stop-return",
        "475",
        "--device",
        "cpu",
        "--log-dir",
        "/tmp/x",
    ]
    (capped,), _ = bench.race_rows([("ppo", "CartPole-v1")], max_steps=5000)
    assert capped.flare2_args(0, "d")[-2:] == ["--max-steps", "5000"]
    # What flare2 derives from the budget follows it on both sides: PPO's annealing ends at the capped budget.
    assert capped.spec.learning_rate == {"start": 1e-3, "zero_at": 1.0, "steps": 5000}


# ---- SB3's settings, one mapping per algorithm ---------------------------------------------------------------------


def test_ppo_maps_envs_rollouts_minibatches_epochs_and_the_annealed_learning_rate(rows):
    spec = rows[0]["ppo/CartPole-v1"].spec
    assert (spec.algo, spec.n_envs) == ("PPO", 8)
    assert spec.kwargs == {
        "n_steps": 32,
        "batch_size": 256,
        "n_epochs": 20,
        "gamma": 0.98,
        "gae_lambda": 0.8,
        "clip_range": 0.2,
        "ent_coef": 0.0,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "normalize_advantage": True,
        "learning_rate": 1e-3,
        "policy_kwargs": {"net_arch": {"pi": [64, 64], "vf": [64, 64]}},
    }
    assert spec.learning_rate == {"start": 1e-3, "zero_at": 1.0, "steps": 100_000}
    assert not spec.normalize_observations and spec.reward_scale is None
    assert spec.torch_threads == 1  # flare2's --torch-threads default, on both sides
    assert "learning_rate=linear(0.001 -> 0 over 100000 env steps)" in spec.describe()
    assert any("learn_ahead 1" in text for text in spec.differences)


def test_the_actor_critics_activation_is_sb3s_activation_fn(bench):
    config = PPO_RECORD.config_class()
    options = {"num_agents": 1, "envs_per_agent": 8, "learner": "inline"}

    def spec(activation):
        settings = PPO_RECORD.settings_class(activation=activation)
        return bench.sb3_spec("ppo", config, settings, options, budget=10_000)

    assert "activation_fn" not in spec("tanh").kwargs["policy_kwargs"]  # SB3's default, as flare2's
    relu = spec("relu")
    assert relu.kwargs["policy_kwargs"]["activation_fn"] == "relu"
    assert not any("activation" in text for text in relu.differences)


def test_ppo_on_mountaincar_normalises_observations_and_scales_rewards_with_a_constant_learning_rate(rows):
    spec = rows[0]["ppo/MountainCar-v0"].spec
    assert spec.n_envs == 16
    assert {key: spec.kwargs[key] for key in ("n_steps", "batch_size", "n_epochs", "gae_lambda", "learning_rate")} == {
        "n_steps": 16,
        "batch_size": 64,
        "n_epochs": 4,
        "gae_lambda": 0.98,
        "learning_rate": 3e-4,
    }
    assert spec.learning_rate is None
    assert spec.normalize_observations and spec.reward_scale == 0.1
    assert spec.describe().endswith(
        "with rewards times 0.1; VecNormalize(norm_obs=True, norm_reward=False); torch.set_num_threads(1)"
    )


def test_appo_races_sb3_ppo_with_its_own_settings_and_says_what_it_does_otherwise(rows):
    appo, ppo = rows[0]["appo/Acrobot-v1"].spec, rows[0]["ppo/Acrobot-v1"].spec
    assert appo.algo == "PPO"
    # PPO's preset but for APPO's rollouts of 64 steps, which SB3's PPO plays too.
    assert appo.kwargs == {**ppo.kwargs, "n_steps": 64} and appo.n_envs == ppo.n_envs == 16
    assert appo.normalize_observations and appo.normalize_rewards == ppo.normalize_rewards == 0.99
    assert any("V-trace" in text and "rho_bar=1" in text for text in appo.differences)
    assert any("learn_ahead 2" in text for text in appo.differences)


def test_a2c_maps_to_sb3s_a2c_with_rmsprop_and_n_step_returns(rows):
    spec = rows[0]["a2c/CartPole-v1"].spec
    assert (spec.algo, spec.n_envs) == ("A2C", 8)
    assert spec.kwargs == {
        "n_steps": 5,
        "gamma": 0.99,
        "gae_lambda": 1.0,
        "ent_coef": 0.0,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "use_rms_prop": True,
        "rms_prop_eps": 1e-5,
        "normalize_advantage": False,
        "learning_rate": 7e-4,
        "policy_kwargs": {"net_arch": {"pi": [64, 64], "vf": [64, 64]}},
    }
    assert spec.learning_rate is None


def test_dqn_matches_gradient_steps_per_env_step_exploration_and_target_decay(rows):
    spec = rows[0]["dqn/CartPole-v1"].spec
    kwargs = spec.kwargs
    # 8 agents, each a learn request of 64 per 2 env steps, one gradient step of 64 each: 0.5 per env step.
    assert (spec.n_envs, kwargs["train_freq"], kwargs["gradient_steps"], kwargs["batch_size"]) == (8, 1, 4, 64)
    assert (kwargs["buffer_size"], kwargs["learning_starts"], kwargs["n_steps"]) == (100_000, 1000, 3)
    assert kwargs["exploration_fraction"] == pytest.approx(8000 / 100_000)
    assert (kwargs["exploration_initial_eps"], kwargs["exploration_final_eps"]) == (1.0, 0.04)
    assert spec.learning_rate == {"start": 1e-3, "zero_at": 1.0, "steps": 100_000}
    # tau 0.005 after each of the 4 gradient steps of a vec step: SB3 blends once per vec step (8 env steps).
    assert kwargs["target_update_interval"] == 8
    assert kwargs["tau"] == pytest.approx(1 - 0.995**4, abs=1e-6)
    assert (kwargs["max_grad_norm"], kwargs["policy_kwargs"]) == (10.0, {"net_arch": [128, 128]})
    # The preset's targets are SB3's (no double Q): nothing to flag there.
    assert not any("double-Q" in text for text in spec.differences)
    assert any("uniformly at random for its first 1000 steps" in text for text in spec.differences)

    acrobot = rows[0]["dqn/Acrobot-v1"].spec.kwargs
    assert (acrobot["train_freq"], acrobot["gradient_steps"], acrobot["batch_size"]) == (1, 8, 128)
    assert acrobot["tau"] == pytest.approx(1 - 0.995**8, abs=1e-6)
    assert acrobot["policy_kwargs"] == {"net_arch": [256, 256]}


def test_td3_maps_noise_delay_and_one_gradient_step_per_env_step(rows):
    spec = rows[0]["td3/Pendulum-v1"].spec
    assert (spec.algo, spec.n_envs, spec.action_noise) == ("TD3", 8, 0.1)
    assert spec.kwargs == {
        "buffer_size": 200_000,
        "learning_starts": 2000,
        "batch_size": 256,
        "gamma": 0.98,
        "train_freq": 1,
        "gradient_steps": 8,
        "n_steps": 1,
        "tau": 0.005,
        "learning_rate": 1e-3,
        "policy_delay": 2,
        "target_policy_noise": 0.2,
        "target_noise_clip": 0.5,
        "policy_kwargs": {"net_arch": [64, 64]},
    }
    assert not any("learning rate" in text or "uniformly" in text for text in spec.differences)


def test_what_sb3_cannot_set_is_a_difference_never_dropped(bench):
    sb3_spec = bench.sb3_spec
    config = TD3Config(critic_lr=3e-4, max_grad_norm=1.0, random_steps=500)
    settings = ReplaySettings(buffer=10_000, warmup=1000, sample_interval=3, batch_size=64)
    options = {"num_agents": 8, "envs_per_agent": 1}
    spec = sb3_spec("td3", dataclasses.replace(config, minibatch_size=64), settings, options, budget=10_000)
    assert (spec.kwargs["train_freq"], spec.kwargs["gradient_steps"]) == (3, 8)  # 8/3 gradient steps per vec step
    text = " | ".join(spec.differences)
    assert "one learning rate (actor and critics): 0.001 for all, where flare2 has critic_lr=0.0003" in text
    assert "flare2 clips gradients to 1" in text
    assert "flare2 acts uniformly for 500 steps; SB3 for its learning_starts (1000)" in text

    @dataclasses.dataclass(frozen=True)
    class Unknown(TD3Config):
        mystery: int = 3

    spec = sb3_spec("td3", Unknown(), ReplaySettings(), options, budget=10_000)
    assert "flare2's mystery=3 has no counterpart in this mapping" in spec.differences


def test_sac_maps_to_sb3s_defaults_with_a_learned_entropy_coefficient(bench):
    sb3_spec = bench.sb3_spec
    settings = ReplaySettings(buffer=1_000_000, warmup=100, sample_interval=1, batch_size=256)
    config = SACConfig(lr=1e-3, random_steps=100)
    spec = sb3_spec("sac", config, settings, {"num_agents": 1, "envs_per_agent": 1}, budget=20_000)
    assert (spec.algo, spec.n_envs, spec.action_noise) == ("SAC", 1, None)
    assert spec.kwargs == {
        "buffer_size": 1_000_000,
        "learning_starts": 100,
        "batch_size": 256,
        "gamma": 0.99,
        "train_freq": 1,
        "gradient_steps": 1,
        "n_steps": 1,
        "tau": 0.005,
        "learning_rate": 1e-3,
        "policy_kwargs": {"net_arch": [256, 256]},
        "ent_coef": "auto",
        "target_entropy": "auto",
        "target_update_interval": 1,
    }
    assert spec.differences == []
    options = {"num_agents": 1, "envs_per_agent": 1}
    assert (
        sb3_spec("sac", dataclasses.replace(config, fixed_alpha=0.2), settings, options, budget=20_000).kwargs[
            "ent_coef"
        ]
        == 0.2
    )
    assert (
        sb3_spec("sac", dataclasses.replace(config, initial_alpha=0.1), settings, options, budget=20_000).kwargs[
            "ent_coef"
        ]
        == "auto_0.1"
    )


def test_a_race_budget_that_would_change_a_presets_settings_is_refused(bench, monkeypatch):
    # PPO's CartPole preset anneals its learning rate over the budget: another budget races other settings.
    monkeypatch.setitem(bench.RACE_BUDGETS, "ppo/CartPole-v1", (200_000, "longer"))
    rows, skipped = bench.race_rows([("ppo", "CartPole-v1")])
    assert rows == [] and "settings of its preset follow the budget" in skipped[0]


def test_the_sac_pendulum_row_races_the_zoo_settings(bench):
    (row,), skipped = bench.race_rows([("sac", "Pendulum-v1")])
    # Its preset's 20k steps are the 100 episodes of the training mean: the race gives it TD3's 50k, which changes
    # none of its settings.
    assert (row.name, row.threshold, row.budget, row.preset_budget, skipped) == (
        "sac/Pendulum-v1",
        -200.0,
        50_000,
        20_000,
        [],
    )
    assert row.flare2_args(0, "d")[-2:] == ["--max-steps", "50000"]
    assert "budget 50000 (the preset's: 20000; the preset's 20k steps are exactly" in bench.describe_row(row)[0]
    assert row.spec.algo == "SAC"
    assert {key: row.spec.kwargs[key] for key in ("learning_rate", "learning_starts", "buffer_size", "ent_coef")} == {
        "learning_rate": 1e-3,
        "learning_starts": 100,
        "buffer_size": 1_000_000,
        "ent_coef": "auto",
    }


def test_the_spec_travels_as_json(rows):
    spec = rows[0]["dqn/CartPole-v1"].spec
    assert json.loads(json.dumps(spec.to_json()))["kwargs"] == spec.kwargs


# ---- the figures --------------------------------------------------------------------------------------------------


def test_flare2_figures_come_from_the_first_crossing_row_with_a_full_window(bench, tmp_path):
    path = tmp_path / "progress.csv"
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["wall_time", "env_steps", "episodes", "return_mean", "steps_per_s"])
        writer.writerows(
            [
                [5.0, 4000, 10, "480", 800],  # above the threshold, but 10 episodes: --stop-return waits for 100
                [10.0, 9000, 90, "474.9", 1000],
                [15.0, 14000, 120, "475.0", 1000],
                [16.0, 15000, 125, "480", 1000],
            ]
        )
    figures = bench.progress_figures(path, 475)
    assert figures == {
        "steps_to_threshold": 14000,
        "steps_trained": 15000,
        "steps_per_s": pytest.approx((15000 - 4000) / (16.0 - 5.0)),
        "train_s": 16.0,
    }
    assert bench.progress_figures(path, 500)["steps_to_threshold"] is None


def _runs(bench):
    Run = bench.Run
    name = "ppo/CartPole-v1"
    return [
        Run(name, "flare2", 0, 0, 20.0, 700.0, steps_to_threshold=60_000, steps_per_s=5000.0),
        Run(name, "sb3", 0, 0, 30.0, 300.0, steps_to_threshold=70_000, steps_per_s=3000.0),
        Run(name, "flare2", 1, 0, 90.0, 720.0, steps_to_threshold=None),  # never: the whole budget
        Run(name, "sb3", 1, 0, 25.0, 310.0, steps_to_threshold=65_000, others_load=0.9),
        Run(name, "flare2", 2, 0, 15.0, 710.0, steps_to_threshold=50_000),
        Run(name, "sb3", 2, None, None, None, error="timed out"),
    ]


def test_medians_spread_and_ratios_count_a_seed_that_never_reached_as_never(bench, rows):
    row = rows[0]["ppo/CartPole-v1"]
    (entry,) = bench.summarize([row], _runs(bench))
    flare2, sb3 = entry["sides"]["flare2"], entry["sides"]["sb3"]
    assert list(entry["sides"]) == ["flare2", "sb3"]
    assert (flare2["reached"], flare2["failed"], sb3["reached"], sb3["failed"]) == (2, 0, 2, 1)
    assert (flare2["steps_median"], flare2["steps_min"], flare2["steps_max"]) == (60_000, 50_000, math.inf)
    assert (flare2["wall_s_median"], flare2["wall_s_min"], flare2["wall_s_max"]) == (20.0, 15.0, math.inf)
    assert (sb3["steps_median"], sb3["wall_s_median"]) == (67_500, 27.5)  # the failed run has no figures
    assert entry["ratios"]["steps"] == pytest.approx(60_000 / 67_500)
    assert entry["ratios"]["wall_s"] == pytest.approx(20.0 / 27.5)
    assert entry["ratios"]["peak_rss_mb"] == pytest.approx(710.0 / 305.0)

    runs = _runs(bench)
    mostly_never = [runs[0], runs[2], dataclasses.replace(runs[2], seed=3), runs[1]]
    (entry,) = bench.summarize([row], mostly_never)
    assert entry["sides"]["flare2"]["steps_median"] == math.inf
    assert entry["ratios"]["steps"] is None  # no ratio to a median that was never reached

    table = bench.markdown_table([row], bench.summarize([row], _runs(bench)), _runs(bench))
    assert (
        "| PPO | CartPole-v1 | 475 | 100.0k | 2/3, 2/3 (1 failed) | 60.0k (50.0k-never) | 67.5k (65.0k-70.0k) | 0.89 "
        "| 20.0 (15.0-never) | 27.5 (25.0-30.0) | 0.73 | 710 / 305 |" in table
    )
    assert "- **ppo/CartPole-v1**: `PPO(n_envs=8, n_steps=32," in table
    assert "during: ppo/CartPole-v1 sb3 seed 1 (0.90);" in table  # a run that shared the machine is named
    assert bench._finite({"a": [math.inf, 1.0]}) == {"a": ["never", 1.0]}


def test_dry_run_prints_each_rows_sb3_call_and_runs_nothing(bench, capsys):
    assert bench.main(["--dry-run", "--only", "td3", "--only", "ppo/CartPole-v1"]) == 0
    out = capsys.readouterr().out
    assert "td3/Pendulum-v1: threshold -200 (tools/bench_peers.py THRESHOLDS), budget 50000 env steps" in out
    assert "  SB3: TD3(n_envs=8, buffer_size=200000," in out
    assert "ppo/CartPole-v1: threshold 475 (Gymnasium's reward_threshold)" in out
    with pytest.raises(SystemExit):
        bench.main(["--dry-run", "--only", "sarsa"])


# ---- measuring ----------------------------------------------------------------------------------------------------

CHILD = "b = bytearray(64 * 2**20); import time; t = time.monotonic()\nwhile time.monotonic() - t < 0.3: pass"
PARENT = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {CHILD!r}]); print('out'); sys.exit(3)"


@pytest.mark.usefixtures("no_leftover_processes")
def test_run_measured_sums_the_rss_of_the_children_and_leaves_nothing(proctree):
    measured = proctree.run_measured([sys.executable, "-c", PARENT], timeout_s=30)
    assert measured.returncode == 3
    assert measured.stdout == "out\n"
    assert 0.3 < measured.wall_s < 10
    assert measured.peak_rss_bytes > 64 * 2**20  # the child's buffer alone
    assert 0.05 < measured.cpu_s < 5  # mostly the child's busy loop
    assert measured.others_cpu_s >= 0
    assert measured.leftover_pids == ()


@pytest.mark.usefixtures("no_leftover_processes")
def test_run_measured_kills_the_whole_tree_past_its_timeout(proctree, tmp_path):
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    with pytest.raises(proctree.MeasureTimeout, match="limit"):
        proctree.run_measured([sys.executable, "-c", parent], timeout_s=0.4)
    if pid_file.exists():  # the child got that far on a slow machine (no_leftover_processes checks it anyway)
        state = Path(f"/proc/{int(pid_file.read_text())}/stat")
        # Killed: gone, or a zombie waiting for whichever process reaps orphans here.
        assert not state.exists() or state.read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.usefixtures("no_leftover_processes")
def test_run_measured_kills_a_child_left_behind_by_the_command(proctree, tmp_path):
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(0.2)"
    measured = proctree.run_measured([sys.executable, "-c", parent], timeout_s=30, exit_grace_s=0.1)
    child_pid = int(pid_file.read_text())
    assert measured.leftover_pids == (child_pid,)
    state = Path(f"/proc/{child_pid}/stat")
    assert not state.exists() or state.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert os.getpid() not in measured.leftover_pids


def test_run_measured_pins_the_whole_tree_to_the_cores_it_is_given(proctree):
    core = min(os.sched_getaffinity(0))
    child = "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0)))"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    measured = proctree.run_measured([sys.executable, "-c", parent], timeout_s=30, cpus=[core])
    assert measured.returncode == 0 and measured.stdout.strip() == str([core])


def test_parallel_runs_get_cores_of_their_own_or_a_line_saying_there_are_too_few(bench, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    assert bench._cpu_slots(1, 2) == [None]
    assert bench._cpu_slots(3, 2) == [frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5})]
    assert "needs 8 cores" in bench._cpu_slots(4, 2)


def test_a_stopped_measurement_kills_the_whole_tree_and_says_it_was_stopped(proctree):
    stop = threading.Event()
    stop.set()
    child = "import time; time.sleep(60)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    with pytest.raises(proctree.MeasureTimeout, match="was stopped and was killed"):
        proctree.run_measured([sys.executable, "-c", parent], timeout_s=60, stop=stop)
