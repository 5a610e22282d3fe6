"""Failure semantics (docs/architecture.md: Failures): agents killed, user code raising, signals, a killed manager, resume."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import statistics
from pathlib import Path

import pytest
import torch
from process_token import processes_started_here
from runs import (
    CARTPOLE,
    RunProcess,
    agent_pids,
    children_of,
    compute_pid,
    finite,
    learner_pids,
    process_name,
    read_csv,
    wait_until_gone,
)

HERE = Path(__file__).resolve().parent
UP = r"compute process is up"
LEARNER_PROCESS_RUN = (
    *(CARTPOLE, "--num-agents", "2", "--envs-per-agent", "2", "--max-steps", "15000", "--checkpoint-every", "2000"),
    *("--device", "cpu", "--learner", "process"),
)
"""A short CartPole run that learns in a learner process and checkpoints often: one to kill parts of."""
FIRST_PROGRESS = r"flare2.progress INFO: steps [1-9]"


@pytest.fixture
def runs():
    started: list[RunProcess] = []
    yield lambda *args, **kwargs: started.append(RunProcess(*args, **kwargs)) or started[-1]
    for run in started:
        run.stop()


def test_agents_killed_with_sigkill_are_restarted_and_the_run_goes_on(tmp_path, runs):
    kills = 3
    # A budget no run here reaches: the run is stopped with ctrl-c once the last restarted agent plays.
    run = runs(
        CARTPOLE,
        "--num-agents",
        "4",
        "--envs-per-agent",
        "1",
        "--max-steps",
        "10000000",
        "--progress-interval",
        "0.5",
        "--max-restarts",
        "20",
        "--device",
        "cpu",
        log_dir=tmp_path,
    )
    run.wait_for_line(FIRST_PROGRESS, timeout_s=120)
    rng = random.Random(0)
    killed = []
    for _ in range(kills):
        # Kill one agent, then wait for the manager to restart it before the next kill.
        playing = agent_pids(run.process.pid)
        assert playing, f"no agent process to kill after {len(killed)} kills:\n{run.text[-3000:]}"
        victim = rng.choice(playing)
        os.kill(victim, signal.SIGKILL)
        killed.append(victim)
        run.wait_for_line(r"was killed by SIGKILL; restarting it", timeout_s=30)
        run.wait_for_line(FIRST_PROGRESS, timeout_s=30)
    run.wait_for_line(r"flare2.progress INFO: .*agents 4 local", timeout_s=30)
    run.process.send_signal(signal.SIGINT)
    assert run.wait(timeout_s=30) == 130, run.text[-4000:]

    rows = read_csv(tmp_path / "progress.csv")
    assert rows[-1]["restarts"] == kills
    assert max(row["agents"] for row in rows if row["restarts"] == kills) == 4
    # For the record: the longest a prediction request waited in the CDP while agents were being killed.
    print(
        f"\nmax_predict_wait_ms over the run: {max(row['max_predict_wait_ms'] for row in rows):.2f} "
        f"(max_wait 0 ms); per row: {[row['max_predict_wait_ms'] for row in rows]}"
    )


def test_a_silent_agent_is_taken_for_dead_after_the_heartbeat_timeout_and_restarted(tmp_path, runs):
    # A budget no run here reaches: the run is stopped with ctrl-c once the restarted agent plays.
    run = runs(
        CARTPOLE,
        "--num-agents",
        "3",
        "--envs-per-agent",
        "1",
        "--max-steps",
        "10000000",
        "--progress-interval",
        "0.5",
        "--heartbeat-timeout",
        "2",
        "--device",
        "cpu",
        log_dir=tmp_path,
    )
    run.wait_for_line(FIRST_PROGRESS, timeout_s=120)
    frozen = agent_pids(run.process.pid)[0]
    os.kill(frozen, signal.SIGSTOP)
    run.wait_for_line(r"silent for 2s \(heartbeat timeout\); killed; restarting it", timeout_s=30)
    run.wait_for_line(r"flare2.progress INFO: .*agents 3 local", timeout_s=30)
    run.process.send_signal(signal.SIGINT)
    assert run.wait(timeout_s=30) == 130, run.text[-4000:]
    rows = read_csv(tmp_path / "progress.csv")
    assert rows[-1]["restarts"] == 1
    # While it was frozen the others went on: batches were flushed by max_wait instead of waiting for it.
    assert max(row["max_predict_wait_ms"] for row in rows) < 1000


@pytest.mark.parametrize(
    "sleep_s",
    [
        # More than three heartbeat timeouts: what the default run checks.
        7,
        # Past the 60 s an agent used to wait before it took the compute process for dead.
        pytest.param(65, marks=pytest.mark.slow),
    ],
)
def test_a_learn_that_sleeps_past_any_fixed_reply_limit_is_waited_out_without_a_restart(tmp_path, runs, sleep_s):
    # Slow is not dead: agents wait on their predict and learn replies for as long as the manager vouches for
    # the compute process.
    run = runs(
        HERE / "faulty_run.py",
        "--sleep-learn-once",
        str(sleep_s),
        "--num-agents",
        "2",
        "--envs-per-agent",
        "1",
        "--max-steps",
        "3000",
        "--heartbeat-timeout",
        "2",
        "--progress-interval",
        "1",
        "--device",
        "cpu",
        log_dir=tmp_path,
    )
    assert run.wait(timeout_s=300) == 0, run.text[-4000:]
    rows = read_csv(tmp_path / "progress.csv")
    assert rows[-1]["restarts"] == 0 and rows[-1]["env_steps"] >= 3000
    assert "restarting" not in run.text
    # The sleep happened: the step count stood still for (nearly) all of it while every agent stayed in the run.
    stalled = [row for row in rows if 0 < row["env_steps"] == rows[rows.index(row) - 1]["env_steps"]]
    assert len(stalled) >= sleep_s - 2 and all(row["agents"] == 2 for row in stalled)


def test_a_compute_process_killed_with_sigkill_is_restarted_from_the_last_checkpoint_and_the_run_goes_on(
    tmp_path, runs
):
    # Its learner process dies with it, and the new compute process starts its own.
    run = runs(*LEARNER_PROCESS_RUN, "--progress-interval", "0.5", log_dir=tmp_path)
    run.wait_for_line(r"checkpoint written to", timeout_s=120)
    socket_dirs = {path.parent for path in map(Path, _local_socket_paths(tmp_path))}
    os.kill(compute_pid(run.process.pid), signal.SIGKILL)
    run.wait_for_line(
        r"the compute process died: it was killed by SIGKILL; starting a new one from the checkpoint in", timeout_s=30
    )
    run.wait_for_line(r"2 agent\(s\) rejoin the restarted compute process", timeout_s=60)
    assert run.wait(timeout_s=120) == 0, run.text[-3000:]
    rows = read_csv(tmp_path / "progress.csv")
    assert rows[-1]["compute_restarts"] == 1 and rows[-1]["env_steps"] >= 15000
    # The agents played on with the new compute process, which learned on from the checkpoint.
    after = [row for row in rows if row["compute_restarts"] == 1]
    assert after[-1]["env_steps"] > after[0]["env_steps"] and after[-1]["learn_steps"] > 0
    # What was learned after the last checkpoint died with the process: those steps were played, never learned from.
    assert 0 < after[-1]["learned_rows"] < after[-1]["env_steps"]
    assert "compute process saved its checkpoints" in run.text
    # The Unix sockets of both compute processes went with the run.
    assert not any(directory.exists() for directory in socket_dirs)


def test_a_restarted_run_keeps_a_spare_compute_process_that_takes_over_at_the_next_restart(tmp_path, runs):
    run = runs(*LEARNER_PROCESS_RUN, log_dir=tmp_path)
    run.wait_for_line(r"checkpoint written to", timeout_s=120)
    first = compute_pid(run.process.pid)
    # A run that never restarts keeps no spare.
    assert [pid for pid in children_of(run.process.pid) if process_name(pid) == "flare2-spare"] == []
    os.kill(first, signal.SIGKILL)
    waits = r"a spare compute process waits to take over at the next restart \(pid (\d+)\)"
    spare = int(re.search(waits, run.wait_for_line(waits, timeout_s=60))[1])
    assert spare in children_of(run.process.pid)
    os.kill(compute_pid(run.process.pid), signal.SIGKILL)
    run.wait_for_line(rf"compute process started \(pid {spare}\)", timeout_s=30)
    assert run.wait(timeout_s=120) == 0, run.text[-3000:]
    assert read_csv(tmp_path / "progress.csv")[-1]["compute_restarts"] == 2
    # The spare made after the second restart went with the run.
    spares = re.findall(waits, run.text)
    assert len(spares) == 2 and wait_until_gone([int(pid) for pid in spares], timeout_s=0) == []


@pytest.mark.parametrize("rank", [0, 1])
def test_a_learner_killed_with_sigkill_restarts_the_compute_process_with_a_new_group_and_the_run_goes_on(
    tmp_path, runs, rank
):
    run = runs(
        CARTPOLE,
        "--num-agents",
        "2",
        "--envs-per-agent",
        "2",
        "--max-steps",
        "6000",
        "--checkpoint-every",
        "2000",
        "--learners",
        "2",
        "--learner",
        "process",
        "--device",
        "cpu",
        log_dir=tmp_path,
    )
    run.wait_for_line(r"checkpoint written to", timeout_s=120)
    learners = sorted(learner_pids(compute_pid(run.process.pid)))
    assert len(learners) == 2, learners
    os.kill(learners[rank], signal.SIGKILL)
    run.wait_for_line(rf"the compute process lost a learner: learner process {rank} of 2 died", timeout_s=30)
    run.wait_for_line(r"starting a new one from the checkpoint in", timeout_s=30)
    run.wait_for_line(r"2 learners ready", timeout_s=60)
    assert run.wait(timeout_s=120) == 0, run.text[-3000:]
    rows = read_csv(tmp_path / "progress.csv")
    assert rows[-1]["compute_restarts"] == 1 and rows[-1]["env_steps"] >= 6000
    # The first learner, where it outlived the group, wrote the checkpoints the next group started from: what was
    # learned since the last periodic one was kept. Killed itself, it took that with it.
    saved, restarted = run.text.find("compute process saved its checkpoints"), run.text.find("starting a new one")
    assert saved != -1 and (saved < restarted) == (rank == 1), run.text[-3000:]


def test_a_compute_process_that_dies_past_max_restarts_ends_the_run_saying_so(tmp_path, runs):
    run = runs(
        CARTPOLE,
        "--num-agents",
        "2",
        "--envs-per-agent",
        "1",
        "--max-steps",
        "10000000",
        "--device",
        "cpu",
        "--max-restarts",
        "0",
        log_dir=tmp_path,
    )
    run.wait_for_line(FIRST_PROGRESS, timeout_s=120)
    os.kill(compute_pid(run.process.pid), signal.SIGKILL)
    assert run.wait(timeout_s=30) == 1
    assert_no_timeout_waited_out(run.text)
    assert (
        "the compute process died: it was killed by SIGKILL; that is 1 compute process deaths, more than " in run.text
    )
    assert "max_restarts=0" in run.text


def assert_no_timeout_waited_out(log: str) -> None:
    """The run stopped at once: no process of it was waited for past a timeout and then killed, and none was taken
    for dead after a silence (a stop that hangs on a gone peer shows as one of these, however fast the machine)."""
    waited = [line for line in log.splitlines() if "killing it" in line or "silent for" in line]
    assert not waited, "\n".join(waited)


def _local_socket_paths(log_dir: Path) -> list[str]:
    """The CDPs' Unix socket paths of a run, from its run.json (written once the compute process is up)."""
    cts = json.loads((log_dir / "run.json").read_text())["cts"].values()
    return [ct[key].removeprefix("unix://") for ct in cts for key in ("local_predict_endpoint", "local_learn_endpoint")]


def test_an_exception_in_user_learn_code_stops_the_run_and_shows_the_users_line(tmp_path, runs):
    run = runs(HERE / "faulty_run.py", "--fail-learn-after", "20", "--device", "cpu", log_dir=tmp_path)
    run.wait_for_line(r"the compute process failed", timeout_s=120)
    assert run.wait(timeout_s=30) == 1
    assert_no_timeout_waited_out(run.text)
    assert "the user's learn() broke on purpose" in run.text
    assert 'raise ValueError("the user\'s learn() broke on purpose")' in run.text
    assert "faulty_run.py" in run.text
    # The checkpoint it stops with holds the state before the failing call: 20 updates, though the 21st made one.
    state = torch.load(tmp_path / "checkpoints" / "RL.pt", weights_only=False)
    assert state["counters"]["learn_calls"] == 20 and state["counters"]["env_steps"] > 0
    assert {float(entry["step"]) for entry in state["algorithm"]["optimizer"]["state"].values()} == {20.0}


def test_an_exception_in_agent_code_restarts_that_agent_and_counts_toward_the_limit(tmp_path, runs):
    run = runs(
        HERE / "faulty_run.py",
        "--agent",
        f"{HERE / 'flaky_agent.py'}:FlakyAgent",
        "--num-agents",
        "2",
        "--max-steps",
        "3000",
        "--max-restarts",
        "50",
        "--device",
        "cpu",
        log_dir=tmp_path,
    )
    assert run.wait(timeout_s=180) == 0, run.text[-4000:]
    rows = read_csv(tmp_path / "progress.csv")
    assert rows[-1]["restarts"] == 2 and rows[-1]["env_steps"] >= 3000
    assert 'raised KeyError("the user\'s agent broke on purpose")' in run.text
    assert 'raise KeyError("the user\'s agent broke on purpose")' in run.text  # the user's line, from the traceback


def test_past_max_restarts_the_run_fails_with_a_message_that_says_so(tmp_path, runs):
    run = runs(
        HERE / "faulty_run.py",
        "--agent",
        f"{HERE / 'flaky_agent.py'}:FlakyAgent",
        "--num-agents",
        "3",
        "--max-restarts",
        "2",
        "--device",
        "cpu",
        log_dir=tmp_path,
    )
    assert run.wait(timeout_s=180) == 1
    assert "more than max_restarts=2" in run.text and "--max-restarts" in run.text
    # It stops with a checkpoint of what was learned, the run's counters in it.
    counters = torch.load(tmp_path / "checkpoints" / "RL.pt", weights_only=False)["counters"]
    assert counters["restarts"] == 3 and counters["env_steps"] > 0


@pytest.mark.parametrize(
    ("signum", "exit_code", "to"),
    [
        (signal.SIGINT, 130, "the manager"),
        (signal.SIGTERM, 143, "the manager"),
        (signal.SIGTERM, 143, "every process"),
        (signal.SIGHUP, 129, "every process"),
        (signal.SIGTERM, 143, "the compute process"),
        (signal.SIGTERM, 143, "the learner process"),
    ],
    ids=[
        "SIGINT",
        "SIGTERM",
        "SIGTERM to every process",
        "SIGHUP to every process",
        "SIGTERM to the compute process",
        "SIGTERM to the learner process",
    ],
)
def test_a_signal_stops_the_run_with_a_final_checkpoint_and_no_process_left(tmp_path, runs, signum, exit_code, to):
    # To every process of the run is how `timeout`, Slurm's scancel and systemd send SIGTERM, and a closing terminal
    # SIGHUP: the compute process and its learner must leave their stop to the manager rather than die and be
    # restarted without the run's last steps. SIGTERM to one of them alone (`kill PID`) stops the run the same way.
    run = runs(
        CARTPOLE,
        "--num-agents",
        "4",
        "--max-steps",
        "10000000",
        "--progress-interval",
        "0.5",
        "--device",
        "cpu",
        "--learner",
        "process",
        log_dir=tmp_path,
    )
    run.wait_for_line(FIRST_PROGRESS, timeout_s=120)
    children = list(processes_started_here())
    compute = [pid for pid in children if process_name(pid) == "flare2-compute"]
    targets = {
        "the manager": [run.process.pid],
        "every process": children,
        "the compute process": compute,
        "the learner process": [pid for pid in children_of(compute[0]) if pid in children],
    }[to]
    assert targets
    for pid in targets:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    assert run.wait(timeout_s=30) == exit_code
    assert_no_timeout_waited_out(run.text)
    assert "the compute process died" not in run.text
    assert "compute process saved its checkpoints" in run.text
    assert (tmp_path / "checkpoints" / "RL.pt").is_file()
    assert wait_until_gone(children, timeout_s=0) == []


def test_killing_the_manager_takes_every_process_of_the_run_with_it(tmp_path, runs):
    run = runs(
        CARTPOLE,
        "--num-agents",
        "4",
        "--max-steps",
        "10000000",
        "--device",
        "cpu",
        "--learner",
        "process",
        log_dir=tmp_path,
    )
    run.wait_for_line(UP, timeout_s=120)
    children = [pid for pid in processes_started_here() if pid != run.process.pid]
    assert len(children) >= 6  # the compute process, its learner process and four agents
    run.process.kill()
    run.process.wait()
    assert wait_until_gone(children, timeout_s=10) == []


def test_a_resumed_run_continues_the_counters_and_the_learning(tmp_path, runs):
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    # The learner process loads the checkpoint and holds the optimizer: the resume path with the most parts.
    common = ("--num-agents", "4", "--progress-interval", "1", "--device", "cpu", "--seed", "3", "--learner", "process")
    first = runs(CARTPOLE, *common, "--max-steps", "20000", log_dir=first_dir)
    assert first.wait(timeout_s=300) == 0, first.text[-4000:]
    second = runs(CARTPOLE, *common, "--max-steps", "40000", "--resume", str(first_dir), log_dir=second_dir)
    assert second.wait(timeout_s=300) == 0, second.text[-4000:]

    first_rows, second_rows = read_csv(first_dir / "progress.csv"), read_csv(second_dir / "progress.csv")
    assert second_rows[0]["env_steps"] >= first_rows[-1]["env_steps"]
    assert second_rows[0]["episodes"] >= first_rows[-1]["episodes"]
    assert second_rows[0]["learn_steps"] >= first_rows[-1]["learn_steps"]
    assert second_rows[0]["learned_rows"] >= first_rows[-1]["learned_rows"] > 0
    assert second_rows[-1]["env_steps"] >= 40000
    # Both runs recorded their settings; the resumed one logged what it changed.
    assert json.loads((second_dir / "config.json").read_text())["run"]["max_steps"] == 40000
    assert json.loads((first_dir / "config.json").read_text())["cts"]["RL"]["algorithm"] == "flare2.zoo.a2c.A2C"
    assert "resume changes max_steps: 20000 -> 40000" in second.text
    # Episodes played at the start of each run: a fresh policy against the resumed one. How far the first run gets
    # depends on the machine's load (the learner process lags more on a busy one: 38 to 160 seen), so the bar is what
    # a fresh policy cannot reach: CartPole's random play averages about 22 with a standard deviation about 12, so
    # 10 above it is nearly 4 standard errors of a 20-episode mean.
    fresh = statistics.mean(row["return"] for row in read_csv(first_dir / "episodes.csv")[:20])
    resumed = statistics.mean(row["return"] for row in read_csv(second_dir / "episodes.csv")[:20])
    assert resumed > fresh + 10, f"first 20 episodes: fresh {fresh:.1f}, resumed {resumed:.1f}"
    assert finite(row["return_mean"] for row in second_rows)
