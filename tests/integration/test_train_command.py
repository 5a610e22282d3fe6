"""``flare2 train`` runs every zoo algorithm on its preset env to a small budget, as a user types it."""

from __future__ import annotations

import csv
import json
import os
import select
import subprocess
import sys
import time

import numpy as np
import pytest
from extras import needs_modules, skip_without
from runs import REPO, read_csv

from flare2.commands.policies import load_policy
from flare2.commands.train import resolve
from flare2.commands.tune import Study
from flare2.errors import ConfigError


@pytest.mark.parametrize(
    "algo, env, options",
    [
        # Real processes for one; the others in serial mode, which runs the same code in one process, faster.
        ("ppo", "CartPole-v1", ["--envs-per-agent", "2", "--max-steps", "600", "--epochs", "1"]),
        # ... and through Gymnasium's SyncVectorEnv, the seam every vector env plays through.
        ("a2c", "CartPole-v1", ["--serial", "--max-steps", "300", "--tensorboard", "--env-engine", "gymnasium"]),
        ("dqn", "CartPole-v1", ["--serial", "--max-steps", "600", "--warmup", "200"]),
        ("sarsa", "CliffWalking-v1", ["--serial", "--max-steps", "300"]),
        ("td3", "Pendulum-v1", ["--serial", "--max-steps", "400", "--warmup", "200", "--batch-size", "32"]),
        (
            "recurrent-ppo",
            "flare2.zoo.envs:flare2/CartPoleNoVelocity-v1",
            ["--serial", "--max-steps", "600", "--epochs", "1"],
        ),
        # A PettingZoo env: the 3 agents of each of 2 games are rows of one CT's requests.
        pytest.param(
            "appo",
            "mpe2.simple_spread_v3",
            ["--envs-per-agent", "2", "--max-steps", "600"],
            marks=needs_modules("pettingzoo", "pettingzoo", "mpe2"),
        ),
    ],
)
def test_each_algorithm_trains_its_preset_env_and_writes_its_settings_and_checkpoint(tmp_path, algo, env, options):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flare2.cli",
            "train",
            "--env",
            env,
            "--algo",
            algo,
            *options,
            "--device",
            "cpu",
            "--log-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    budget = int(options[options.index("--max-steps") + 1])
    assert read_csv(tmp_path / "progress.csv")[-1]["env_steps"] >= budget
    assert (tmp_path / "checkpoints" / "RL.pt").is_file()
    written = json.loads((tmp_path / "train.json").read_text())
    assert (written["algo"], written["env"], written["run"]["max_steps"]) == (algo, env, budget)
    assert any(tmp_path.glob("events.out.tfevents.*")) == ("--tensorboard" in options)
    assert "run complete: " in result.stderr.splitlines()[-1]


def test_sac_learns_in_a_learner_process_whose_checkpoint_a_resumed_run_goes_on_from(tmp_path):
    import torch

    # SAC's preset env with real processes (the other algorithms' runs above are serial), small networks and batches:
    # the point is the learner process and its checkpoint, not the learning.
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["--env", "Pendulum-v1", "--algo", "sac", "--num-agents", "1", "--hidden", "32", "32"]
    common += ["--warmup", "100", "--batch-size", "32", "--minibatch-size", "32", "--device", "cpu"]
    result = flare2("train", *common, "--max-steps", "400", "--log-dir", str(first))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "learn() in a learner process" in result.stderr  # --learner auto: SAC allows one
    saved = torch.load(first / "checkpoints" / "RL.pt", weights_only=True)["algorithm"]
    assert saved["gradient_steps"] > 0 and "predicted" not in saved
    result = flare2("train", *common, "--max-steps", "800", "--resume", str(first), "--log-dir", str(second))
    assert result.returncode == 0, result.stderr[-4000:]
    assert read_csv(second / "progress.csv")[-1]["env_steps"] >= 800
    resumed = torch.load(second / "checkpoints" / "RL.pt", weights_only=True)["algorithm"]
    assert resumed["gradient_steps"] > saved["gradient_steps"]
    assert not torch.equal(resumed["alpha"]["log_alpha"], saved["alpha"]["log_alpha"])


def test_wandb_gets_every_scalar_and_the_runs_settings_through_its_tensorboard_sync(tmp_path):
    skip_without("wandb", "wandb")
    # Offline, W&B keeps its run on disk for a later `wandb sync`; its settings and caches stay in the test's folder.
    wandb_environment = {
        "WANDB_MODE": "offline",
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),
        "WANDB_DATA_DIR": str(tmp_path / "data"),
    }
    log_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flare2.cli",
            "train",
            "--env",
            "CartPole-v1",
            "--algo",
            "a2c",
            "--serial",
            "--max-steps",
            "600",
            "--progress-interval",
            "0.2",
            "--wandb",
            "flare2-tests",
            "--log-dir",
            str(log_dir),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **wandb_environment},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "W&B did not start" not in result.stderr
    [run_file] = (log_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = run_file.read_bytes()
    for scalar in ("progress/return_mean", "progress/steps_per_s", "learn/RL/policy_loss"):
        assert scalar.encode() in records, scalar
    assert b'"algo":"a2c"' in records  # train.json, as the W&B run's config
    assert any(log_dir.glob("events.out.tfevents.*"))


def flare2(*argv: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flare2.cli", *argv], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small flare2 train run with normalised observations and a frame stack: what eval must play back alike."""
    run_dir = tmp_path_factory.mktemp("trained")
    result = flare2(
        "train",
        "--env",
        "CartPole-v1",
        "--algo",
        "ppo",
        "--serial",
        "--max-steps",
        "1200",
        "--epochs",
        "1",
        "--frames",
        "3",
        "--normalize-observations",
        "--device",
        "cpu",
        "--log-dir",
        str(run_dir),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return run_dir


def test_eval_plays_a_trained_run_and_reports_its_return(trained, tmp_path):
    result = flare2("eval", str(trained), "--episodes", "3")
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.startswith("ppo on CartPole-v1, 3 greedy episodes: return ")
    checkpoint = flare2(
        "eval",
        str(trained / "checkpoints" / "RL.pt"),
        "--episodes",
        "1",
        "--stochastic",
        "--video",
        str(tmp_path / "episode.gif"),
    )
    assert checkpoint.returncode == 0, checkpoint.stderr[-4000:]
    assert "1 stochastic episode: " in checkpoint.stdout
    assert (tmp_path / "episode.gif").read_bytes()[:6] == b"GIF89a"


def test_a_loaded_policy_acts_with_the_runs_statistics_and_views(trained):
    import flare2 as package

    policy = package.load_policy(trained)
    saved = policy.ct.statistics["obs"]
    assert saved.count > 1000
    env = policy.make_env()
    observation, _ = env.reset(seed=3)
    action = policy.predict(observation, episode_start=True)
    assert env.action_space.contains(action)
    for _ in range(5):
        observation, reward, terminated, truncated, _ = env.step(action)
        action = policy.predict(observation, reward=reward)
    # The frames the model sees are the normalised observations, newest last.
    frames = policy._playing[None].acting.views.current()["obs_frames"][0]
    expected = np.clip((observation - saved.mean) / np.sqrt(saved.variance + 1e-8), -10, 10)
    np.testing.assert_allclose(frames[-1], expected, rtol=1e-5, atol=1e-5)


@needs_modules("pettingzoo", "pettingzoo", "mpe2")
def test_a_pettingzoo_env_trains_a_ct_per_team_and_eval_reports_each_team(tmp_path):
    result = flare2(
        "train",
        "--env",
        "mpe2.simple_adversary_v3",
        "--algo",
        "ppo",
        "--policy-map",
        "team",
        "--serial",
        "--max-steps",
        "600",
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--log-dir",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert sorted(path.name for path in (tmp_path / "checkpoints").glob("*.pt")) == ["adversary.pt", "agent.pt"]
    played = flare2("eval", str(tmp_path), "--episodes", "2", "--video", str(tmp_path / "game.gif"))
    assert played.returncode == 0, played.stderr[-4000:]
    lines = played.stdout.splitlines()
    assert lines[0] == "ppo on mpe2.simple_adversary_v3, 2 greedy games:"
    assert [line.split(":")[0] for line in lines[1:]] == [
        "team 'adversary'",
        "team 'agent'",
        "agent 'adversary_0'",
        "agent 'agent_0'",
        "agent 'agent_1'",
    ]
    assert (tmp_path / "game.gif").read_bytes()[:6] == b"GIF89a"
    # From Python, one CT at a time: the run has no CT RL.
    with pytest.raises(ConfigError, match=r"has no CT 'RL': its policy map made CTs \['adversary', 'agent'\]"):
        load_policy(tmp_path)
    agent_policy = load_policy(tmp_path, ct="agent")
    assert agent_policy.agents == ("agent_0", "agent_1")
    # A game played from Python: each policy answers for its own agents of the dict, each agent with its own views.
    adversary_policy = load_policy(tmp_path, ct="adversary")
    env = agent_policy.make_env()
    observations, _ = env.reset(seed=0)
    actions = {**agent_policy.predict(observations, episode_start=True), **adversary_policy.predict(observations)}
    assert sorted(actions) == ["adversary_0", "agent_0", "agent_1"]
    for _ in range(3):
        observations, rewards, _, _, _ = env.step(actions)
        actions = {
            **agent_policy.predict(observations, reward=rewards),
            **adversary_policy.predict(observations, reward=rewards),
        }
    assert all(env.action_space(agent).contains(action) for agent, action in actions.items())
    assert sorted(agent_policy._playing) == ["agent_0", "agent_1"]
    # Another team's agent alone (its turn in a turn-based game), or none left: nothing for this policy to answer.
    assert agent_policy.predict({"adversary_0": observations["adversary_0"]}) == {} and agent_policy.predict({}) == {}
    for agent in ("agent_0", "agent_1"):
        alone, _ = agent_policy.ct.predict({"obs": observations[agent][None].astype(np.float32)}, {}, greedy=True)
        assert actions[agent] == alone["action"][0]
    shared = flare2("train", "--env", "mpe2.simple_adversary_v3", "--algo", "ppo", "--log-dir", str(tmp_path / "x"))
    assert shared.returncode == 2 and "give each kind of agent a CT of its own" in shared.stderr


def test_local_agents_send_learn_requests_past_the_networks_message_limit(tmp_path):
    """--max-message-bytes bounds what comes from other machines; an agent of the compute process's own machine sends
    its learn requests (here about 75 kB: 8 envs x 256 steps) over a stream of the run's own user, which takes more."""
    options = "--env CartPole-v1 --algo ppo --max-steps 4000 --sample-interval 256 --max-message-bytes 32768"
    result = flare2("train", *options.split(), "--device", "cpu", "--log-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-4000:]
    rows = read_csv(tmp_path / "run" / "progress.csv")
    assert float(rows[-1]["learn_steps"]) >= 1
    assert rows[-1]["rejected_requests"] == rows[-1]["dropped_messages"] == 0


def test_eval_of_a_directory_that_is_no_flare2_train_run_says_so(tmp_path):
    result = flare2("eval", str(tmp_path))
    assert (
        result.returncode == 2
        and "is no run of flare2 train: " in result.stderr
        and "train.json is missing" in result.stderr
    )


def trial_rows(log_dir) -> list[dict[str, str]]:
    with open(log_dir / "trials.csv", newline="") as file:
        return list(csv.DictReader(file))


def test_tune_runs_its_trials_and_writes_the_best_as_a_preset_flare2_train_takes(tmp_path):
    result = flare2(
        "tune",
        "--env",
        "CartPole-v1",
        "--algo",
        "a2c",
        "--trials",
        "2",
        "--trial-steps",
        "400",
        "--serial",
        "--device",
        "cpu",
        "--log-dir",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    trials = trial_rows(tmp_path)
    assert [(row["trial"], row["state"]) for row in trials] == [("0", "complete"), ("1", "complete")]
    assert all(int(row["last_step"]) >= 400 for row in trials)
    best = max(trials, key=lambda row: float(row["mean_return"]))
    assert f"best: trial {best['trial']} with mean return " in result.stdout
    preset = json.loads((tmp_path / "best.json").read_text())
    assert preset["algorithm"]["lr"] == pytest.approx(float(best["lr"]))
    plan = resolve(["--preset", str(tmp_path / "best.json"), "--log-dir", str(tmp_path / "again")])
    assert (plan.algo, plan.env_id, plan.config.lr) == ("a2c", "CartPole-v1", pytest.approx(float(best["lr"])))


def test_a_pruned_trial_is_stopped_early_and_ends_cleanly(tmp_path):
    skip_without("tune", "optuna")
    import optuna

    # A pruner that stops every trial at its first report: the run it stops must end at once, not at its budget.
    study = Study(
        "a2c",
        ["--algo", "a2c", "--env", "CartPole-v1", "--serial", "--device", "cpu", "--progress-interval", "0.5"],
        10_000_000,
        tmp_path,
        0.5,
    )
    code = study.run(1, 0, {}, optuna.pruners.ThresholdPruner(lower=1e9))
    assert code == 1
    [trial] = trial_rows(tmp_path)
    assert trial["state"] == "pruned" and 0 < int(trial["last_step"]) < 10_000_000
    assert "stopped by Ctrl+C" in (tmp_path / "trial_0" / "manager.log").read_text()
    assert not (tmp_path / "best.json").exists()


def test_a_tune_trial_is_interrupted_when_flare2_tune_dies_even_by_sigkill():
    # Stands in for flare2 tune: starts a child the way it starts a trial, and is then killed with SIGKILL.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            """if True:
        import os, subprocess, sys
        from flare2.runtime.processes import interrupt_at_parent_death
        subprocess.Popen([sys.executable, "-c", '''if True:
            import signal, sys
            signal.signal(signal.SIGINT, lambda *_: (print("interrupted", flush=True), sys.exit(0)))
            print("playing", flush=True)
            signal.pause()'''], preexec_fn=interrupt_at_parent_death(os.getpid()))
        import signal
        signal.pause()
    """,
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert read_until_end(parent.stdout, b"playing\n", timeout_s=30) == b"playing\n"
        parent.kill()
        # Then "interrupted" and the end of the pipe: the trial has ended.
        assert read_until_end(parent.stdout, None, timeout_s=30) == b"interrupted\n"
    finally:
        parent.kill()
        parent.wait()


def read_until_end(pipe, stop_after: bytes | None, timeout_s: float) -> bytes:
    """What ``pipe`` gives until ``stop_after`` has come (None: until its end), failing past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while stop_after is None or not data.endswith(stop_after):
        ready, _, _ = select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"nothing more within {timeout_s} s; so far {data!r}"
        chunk = os.read(pipe.fileno(), 4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize(
    "starts_the_run",
    [
        "import flare2\nflare2.train('CartPole-v1', algo='ppo', max_steps=600, log_dir=LOG_DIR)\n",
        # A manager script's main(), called at the top of another script.
        f"import sys\nsys.path.insert(0, {str(REPO / 'examples')!r})\nfrom cartpole_a2c import main\n"
        "sys.exit(main(['--max-steps', '600', '--log-dir', LOG_DIR]))\n",
    ],
    ids=["flare2.train", "Manager"],
)
def test_a_script_that_starts_a_run_without_the_main_guard_ends_once_with_a_message_naming_the_guard(
    tmp_path, starts_the_run
):
    script = tmp_path / "no_guard.py"
    script.write_text(f"LOG_DIR = {str(tmp_path / 'run')!r}\n{starts_the_run}", encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode != 0 and "a setting is wrong" in result.stderr.splitlines()[-1], result.stderr[-3000:]
    # The compute process, importing the script again, said why once and was not restarted to say it again.
    assert result.stderr.count('call it under `if __name__ == "__main__":`') == 1, result.stderr[-3000:]
    assert "compute restart" not in result.stderr
