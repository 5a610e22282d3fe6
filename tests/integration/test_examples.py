"""Every example runs to its end (small budgets)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from runs import REPO, read_csv


def run_example(name: str, *args: str, log_dir) -> subprocess.CompletedProcess:
    """Run examples/<name> with ``args`` and a log dir, from that dir; fails the test with its log if it fails."""
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / name), *args, "--log-dir", str(log_dir)],
        cwd=log_dir,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_the_tour_example_learns_with_four_one_env_agents_and_no_layout_given(tmp_path):
    # AgentConfig(path=..., num_agents=4): the layout is the Agent class's own, one env a process.
    result = run_example("custom_agent.py", log_dir=tmp_path)
    assert "imports torch" not in result.stderr
    with open(tmp_path / "progress.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert float(rows[-1]["return_mean"]) >= 0.85, "stopped at its --stop-return, not at its episode budget"
    assert int(rows[-1]["episodes"]) < 3000
    playing = [(int(float(row["agents"])), int(float(row["envs"]))) for row in rows]
    assert (4, 4) in playing, f"four processes of one env each, got (agents, envs) {playing}"


def test_the_main_example_documents_every_option():
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "cartpole_a2c.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    for option in ("--num-agents", "--max-steps", "--device", "--log-dir", "--max-batch", "--max-wait-ms", "--seed"):
        assert option in result.stdout


def test_the_ppo_example_runs_a_few_learn_calls(tmp_path):
    run_example(
        "cartpole_ppo.py",
        "--num-agents",
        "2",
        "--max-steps",
        "600",
        "--epochs",
        "2",
        "--device",
        "cpu",
        "--progress-interval",
        "0.5",
        log_dir=tmp_path,
    )
    final = read_csv(tmp_path / "progress.csv")[-1]
    assert final["env_steps"] >= 600 and final["learn_steps"] >= 1


def test_the_multi_ct_example_feeds_both_cts_from_every_agent(tmp_path):
    result = run_example(
        "cartpole_multi_ct.py",
        "--num-agents",
        "3",
        "--max-steps",
        "1500",
        "--device",
        "cpu",
        "--progress-interval",
        "0.5",
        log_dir=tmp_path,
    )
    learned = {line.split(",")[1] for line in (tmp_path / "learn.csv").read_text().splitlines()[1:]}
    assert learned == {"policy", "aux"}
    assert "policy/loss" in result.stderr and "aux/bce" in result.stderr
    assert "imports torch" not in result.stderr
    assert (tmp_path / "checkpoints" / "policy.pt").is_file() and (tmp_path / "checkpoints" / "aux.pt").is_file()
    cts = csv.DictReader((tmp_path / "cts.csv").read_text().splitlines())
    batched = {row["ct"] for row in cts if float(row["predict_batch_mean"]) > 1}
    assert batched == {"policy", "aux"}, "each CT's requests should batch across the agents"


def test_the_dqn_example_learns_from_replay_buffers_in_the_agents(tmp_path):
    run_example(
        "cartpole_dqn.py",
        "--num-agents",
        "2",
        "--max-steps",
        "800",
        "--warmup",
        "200",
        "--device",
        "cpu",
        "--progress-interval",
        "0.5",
        log_dir=tmp_path,
    )
    final = read_csv(tmp_path / "progress.csv")[-1]
    assert final["env_steps"] >= 800 and final["learn_steps"] >= 1
    assert "td_loss" in (tmp_path / "learn.csv").read_text()


def test_the_td3_example_learns_from_replay_buffers_and_logs_critic_and_actor_costs(tmp_path):
    run_example(
        "pendulum_td3.py",
        "--num-agents",
        "2",
        "--max-steps",
        "800",
        "--warmup",
        "400",
        "--batch-size",
        "64",
        "--minibatch-size",
        "64",
        "--device",
        "cpu",
        "--progress-interval",
        "0.5",
        log_dir=tmp_path,
    )
    final = read_csv(tmp_path / "progress.csv")[-1]
    assert final["env_steps"] >= 800 and final["learn_steps"] >= 1
    costs = (tmp_path / "learn.csv").read_text()
    assert "critic_loss" in costs and "actor_loss" in costs and "q_mean" in costs


@pytest.mark.parametrize("model", ["gru", "stack"])
def test_the_memory_example_runs_recurrent_ppo_or_a_frame_stack_and_learns_at_least_once(tmp_path, model):
    result = run_example(
        "cartpole_memory.py",
        "--model",
        model,
        "--num-agents",
        "2",
        "--max-steps",
        "600",
        "--epochs",
        "2",
        "--device",
        "cpu",
        "--progress-interval",
        "0.5",
        "--eval-every",
        "2",
        log_dir=tmp_path,
    )
    assert "imports torch" not in result.stderr
    final = read_csv(tmp_path / "progress.csv")[-1]
    assert final["env_steps"] >= 600 and final["learn_steps"] >= 1
    assert "policy_loss" in (tmp_path / "learn.csv").read_text()
    assert (tmp_path / "checkpoints" / "RL.pt").is_file()


def test_the_sarsa_example_learns_a_q_table_and_plays_greedy_evaluation_episodes(tmp_path):
    run_example(
        "cliffwalking_sarsa.py",
        "--num-agents",
        "2",
        "--max-steps",
        "1500",
        "--eval-every",
        "1",
        "--device",
        "cpu",
        "--progress-interval",
        "0.5",
        log_dir=tmp_path,
    )
    final = read_csv(tmp_path / "progress.csv")[-1]
    assert final["env_steps"] >= 1500 and final["learn_steps"] >= 1
    episodes = read_csv(tmp_path / "episodes.csv")
    evaluations = [row for row in episodes if row["eval"]]
    assert len(evaluations) == final["eval_episodes"] >= 1
    assert final["eval_return_mean"] == pytest.approx(
        sum(row["return"] for row in evaluations[-20:]) / len(evaluations[-20:]), abs=1e-3
    )
    for row in episodes:
        # CliffWalking pays -1 a step and -100 for a step into the cliff (back to the start): a return and a length
        # recorded from the same episode differ by a multiple of 99, and no way to the goal is shorter than 13 steps.
        assert (-row["return"] - row["length"]) % 99 == 0 and row["length"] >= 13, row
    assert "td_loss" in (tmp_path / "learn.csv").read_text()


def test_the_entity_example_batches_ragged_observations_across_processes_and_envs(tmp_path):
    # Three envs in each of two processes, learning in a learner process of its own: ragged data crosses every link.
    run_example(
        "minefield_entities.py",
        "--num-agents",
        "2",
        "--envs-per-agent",
        "3",
        "--max-steps",
        "1500",
        "--sample-interval",
        "8",
        "--epochs",
        "1",
        "--width",
        "16",
        "--layers",
        "1",
        "--learner",
        "process",
        "--device",
        "cpu",
        "--progress-interval",
        "0.5",
        log_dir=tmp_path,
    )
    rows = read_csv(tmp_path / "progress.csv")
    assert rows[-1]["env_steps"] >= 1500 and rows[-1]["learn_steps"] >= 1 and rows[-1]["rejected_requests"] == 0
    batches = [row["batch_size_mean"] for row in rows if row["batch_size_mean"] == row["batch_size_mean"]]
    # A batch counts observations (six envs at most), not entities (up to eight per observation); above three, it
    # held the requests of both processes.
    assert max(batches) <= 6 and max(batches) > 3


SERIAL_RUNS = {
    "cartpole_a2c.py": ["--max-steps", "2000"],
    "cartpole_ppo.py": ["--max-steps", "1000", "--epochs", "2"],
    "cartpole_dqn.py": ["--max-steps", "1000", "--warmup", "200"],
    "cliffwalking_sarsa.py": ["--max-steps", "1000", "--eval-every", "1"],
    "pendulum_td3.py": ["--max-steps", "600", "--warmup", "300", "--batch-size", "32", "--minibatch-size", "32"],
    "cartpole_memory.py": ["--max-steps", "1000", "--epochs", "2"],
    "cartpole_multi_ct.py": ["--max-steps", "1000"],
    "custom_agent.py": ["--max-episodes", "100"],
    "spread_roles.py": ["--max-steps", "600", "--envs-per-agent", "2", "--sample-interval", "8", "--epochs", "1"],
    "minefield_entities.py": [
        "--max-steps",
        "600",
        "--envs-per-agent",
        "4",
        "--sample-interval",
        "8",
        "--epochs",
        "1",
        "--width",
        "16",
        "--layers",
        "1",
    ],
}


def test_every_example_runs_to_its_budget_in_serial_mode(tmp_path):
    assert set(SERIAL_RUNS) == {path.name for path in (REPO / "examples").glob("*.py") if "agent" not in path.stem} | {
        "custom_agent.py"
    }

    def run_serially(name: str) -> None:
        # One process each, so they run side by side, one per core.
        log_dir = tmp_path / name.removesuffix(".py")
        log_dir.mkdir()
        result = run_example(name, "--serial", *SERIAL_RUNS[name], log_dir=log_dir)
        assert "budget reached" in result.stderr, name
        assert read_csv(log_dir / "progress.csv")[-1]["learn_steps"] >= 1, name

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(run_serially, SERIAL_RUNS))


def test_an_agents_own_policy_map_gives_each_ct_the_rows_of_its_agents_and_a_checkpoint(tmp_path):
    # policy_of puts agent_0 on CT scout and the other two on CT RL: twice scout's rows reach RL, from both processes.
    options = ("--num-agents", "2", "--envs-per-agent", "4", "--sample-interval", "16", "--epochs", "1")
    run_example("spread_roles.py", *options, "--max-steps", "3000", "--device", "cpu", log_dir=tmp_path)
    assert sorted(path.name for path in (tmp_path / "checkpoints").glob("*.pt")) == ["RL.pt", "scout.pt"]
    rows = read_csv(tmp_path / "cts.csv")
    predicted = {
        ct: sum(
            row["predict_batches"] * row["predict_batch_mean"]
            for row in rows
            if row["ct"] == ct and row["predict_batches"]
        )
        for ct in ("RL", "scout")
    }
    assert predicted["scout"] > 0 and predicted["RL"] == pytest.approx(2 * predicted["scout"], rel=0.01)
    learned = {ct: sum(row["learn_calls"] for row in rows if row["ct"] == ct) for ct in ("RL", "scout")}
    assert min(learned.values()) >= 1, learned


def test_a_one_env_agent_asked_for_several_envs_stops_the_run_with_the_option_and_the_fix(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "cartpole_multi_ct.py"),
            "--envs-per-agent",
            "3",
            "--num-agents",
            "2",
            "--max-steps",
            "1000",
            "--device",
            "cpu",
            "--log-dir",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "--envs-per-agent 3: PolicyAndAuxAgent plays one env per process" in result.stderr
    assert "make PolicyAndAuxAgent a flare2 VectorAgent" in result.stderr


def test_observation_statistics_are_kept_in_the_checkpoint_and_a_resumed_run_goes_on_counting(tmp_path):
    import torch

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    common = (
        "--num-agents",
        "2",
        "--envs-per-agent",
        "2",
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--normalize-observations",
        "--learner",
        "process",
    )
    run_example("cartpole_ppo.py", *common, "--max-steps", "3000", log_dir=first)
    checkpoint = torch.load(first / "checkpoints" / "RL.pt", weights_only=True)
    saved, counters = checkpoint["statistics"]["obs"], checkpoint["counters"]
    # Counted by both agents (every step's observation and each episode's first), merged in the compute process,
    # written by the learner process. Each agent trades every 1000 rows: fewer were left untraded at its stop.
    observations = counters["env_steps"] + counters["episodes"] + 4
    assert observations - 2 * 1000 < saved["count"] <= observations
    assert saved["m2"].min() > 0
    run_example("cartpole_ppo.py", *common, "--max-steps", "6000", "--resume", str(first), log_dir=second)
    resumed = torch.load(second / "checkpoints" / "RL.pt", weights_only=True)["statistics"]["obs"]
    assert resumed["count"] >= saved["count"] + 1000
