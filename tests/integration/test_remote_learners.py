"""Learners of ``flare2 learn`` joining the learners of a ``flare2 train`` run (``--remote-learners``), over loopback
here; tests/integration/test_two_hosts.py runs one from another host, tests/unit/test_manager.py the probes the
manager refuses."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from netns import Hosts
from runs import RunProcess, learner_pids, read_csv

from flare2.runtime import exit_codes

FLARE2 = [sys.executable, "-m", "flare2.cli"]


def train_with_a_remote_learner(log_dir: Path, *options: str, prefix: tuple[str, ...] = ()) -> RunProcess:
    return RunProcess.command(
        [
            *prefix,
            *FLARE2,
            "train",
            "--env",
            "CartPole-v1",
            "--algo",
            "ppo",
            "--learners",
            "2",
            "--remote-learners",
            "1",
            "--device",
            "cpu",
            "--progress-interval",
            "0.5",
            "--log-dir",
            str(log_dir),
            *options,
        ]
    )


def run_on_host_a_with_keys(
    hosts: Hosts, tmp_path: Path, port: int, *options: str, steps: int = 6000
) -> tuple[RunProcess, Path]:
    """A run of ``steps`` env steps on network-namespace host A, waiting for a learner from another host; and its
    keys."""
    keys = tmp_path / "keys"
    subprocess.run([*FLARE2, "keys", str(keys)], check=True, capture_output=True, timeout=60)
    address = hosts.address[hosts.a]
    manager = train_with_a_remote_learner(
        tmp_path / "run",
        "--max-steps",
        str(steps),
        *options,
        "--bind",
        address,
        "--port",
        str(port),
        "--keys",
        str(keys),
        prefix=tuple(hosts.run_in(hosts.a)),
    )
    manager.wait_for_line(r"compute process is up", timeout_s=120)
    return manager, keys


def control_endpoint(manager: RunProcess) -> str:
    line = manager.wait_for_line(r"control endpoint tcp://\S+,", timeout_s=60)
    found = re.search(r"control endpoint (tcp://\S+),", line)
    assert found is not None
    return found.group(1)


def test_a_learner_of_flare2_learn_trains_with_the_run_resumes_with_it_and_rejoins_after_its_death(tmp_path):
    log_dir = tmp_path / "run"
    manager = train_with_a_remote_learner(log_dir, "--port", "0", "--max-steps", "4000")
    learners: list[RunProcess] = []
    try:
        endpoint = control_endpoint(manager)
        learners.append(RunProcess.command([*FLARE2, "learn", endpoint]))
        learners[-1].wait_for_line(r"learner 1 joined the run's learners", timeout_s=120)
        # Every batch's answer carries each learner's digest of its weights: ones that parted would stop the run.
        assert manager.wait(timeout_s=120) == exit_codes.OK
        assert learners[-1].wait(timeout_s=30) == exit_codes.OK, learners[-1].text
        assert read_csv(log_dir / "progress.csv")[-1]["learn_steps"] > 0

        # Resumed, the learner of flare2 learn takes the first learner's checkpoint (the optimizer's moments too:
        # without them its steps, and so its weights, would part from the first learner's after the first batch).
        manager = train_with_a_remote_learner(
            log_dir, "--port", "0", "--max-steps", "1000000", "--resume", str(log_dir)
        )
        endpoint = control_endpoint(manager)
        learners.append(RunProcess.command([*FLARE2, "learn", endpoint]))
        learner = learners[-1]
        learner.wait_for_line(r"learner 1 joined the run's learners", timeout_s=120)
        learned_more_than(log_dir, read_csv(log_dir / "progress.csv")[-1]["learn_steps"] + 3, manager)
        # A learner that dies does not stop the run: it goes on with the learner beside its compute process, and
        # its flare2 learn asks to join again, which the run's next group of learners takes in.
        [learner_process] = learner_pids(learner.process.pid)
        os.kill(learner_process, signal.SIGKILL)
        manager.wait_for_line(r"the compute process lost a learner", timeout_s=60)
        # The learner beside the compute process outlived the group: the next one starts from what it had learned.
        manager.wait_for_line(r"compute process saved its checkpoints", timeout_s=60)
        manager.wait_for_line(r"compute process is up on cpu, CTs \['RL'\], learn\(\) in a learner process", 60)
        learner.wait_for_line(r"a learner here was killed by SIGKILL", timeout_s=30)
        manager.wait_for_line(r"the compute process stopped for a new group of learners; starting a new one from", 60)
        manager.wait_for_line(r"learn\(\) in 2 learner processes", timeout_s=60)
        learner.wait_for_line(r"learner 1 joined the run's learners", timeout_s=120)
        learned_more_than(log_dir, read_csv(log_dir / "progress.csv")[-1]["learn_steps"] + 3, manager)
        manager.process.send_signal(signal.SIGINT)
        assert manager.wait(timeout_s=120) == exit_codes.SIGINT
        assert learner.wait(timeout_s=30) == exit_codes.OK, learner.text
        assert read_csv(log_dir / "progress.csv")[-1]["compute_restarts"] == 2
    finally:
        for run in [manager, *learners]:
            run.stop()


def learned_more_than(log_dir: Path, learn_steps: int, manager: RunProcess) -> None:
    """Wait for the run's progress to pass ``learn_steps``."""
    while read_csv(log_dir / "progress.csv")[-1]["learn_steps"] <= learn_steps:
        manager.wait_for_line(r"flare2.progress INFO", timeout_s=60)
