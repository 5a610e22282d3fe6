"""Checkpoint writes that cannot corrupt: a write killed at any instant leaves the checkpoint before it loadable, and a
full disk is one clear error that names the path and keeps that checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import gymnasium as gym
import numpy as np
import pytest

from flare2.core.computation_task import ComputationTask
from flare2.errors import CheckpointError
from flare2.zoo.ppo import PPO

KILLS = 200


def cartpole_ppo() -> ComputationTask:
    return ComputationTask("RL", PPO.for_env(gym.make("CartPole-v1")), device="cpu")


def test_a_checkpoint_write_killed_at_random_instants_never_leaves_one_that_cannot_be_loaded(tmp_path):
    path = tmp_path / "checkpoints" / "RL.pt"
    ct = cartpole_ppo()
    started = time.perf_counter()
    ct.save(path, {"env_steps": 0})
    write_s = time.perf_counter() - started
    rng = np.random.default_rng(0)
    loader = cartpole_ppo()
    torn = 0
    for kill in range(1, KILLS + 1):
        child = os.fork()
        if child == 0:  # writes checkpoint after checkpoint until it is killed
            try:
                while True:
                    ct.save(path, {"env_steps": kill})
            finally:
                os._exit(1)
        # The pause picks the instant of the kill (anywhere in the child's first writes), it waits for nothing.
        time.sleep(rng.uniform(0, 2 * write_s))
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        torn += any(path.parent.glob(f".{path.name}.*"))
        counters = loader.load(path)
        assert counters["env_steps"] in (0, *range(1, kill + 1))
    # Many kills fell inside a write (its temp file left behind), so the window was hit, not missed.
    assert torn >= KILLS // 10
    ct.save(path, {"env_steps": KILLS + 1})
    assert sorted(p.name for p in path.parent.iterdir()) == ["RL.pt"]  # the next write clears what the kills left


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs (a disk that fills) needs root")
def test_a_full_disk_is_an_error_that_names_the_checkpoint_and_keeps_the_one_before(tmp_path):
    ct = cartpole_ppo()
    ct.save(tmp_path / "sizing.pt", {"env_steps": 0})
    size = (tmp_path / "sizing.pt").stat().st_size
    disk = tmp_path / "disk"
    disk.mkdir()
    # Room for one checkpoint and a half: the second write's temp file cannot fit beside the first checkpoint.
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2}", "tmpfs", str(disk)], check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        path = disk / "RL.pt"
        ct.save(path, {"env_steps": 1})
        with pytest.raises(CheckpointError, match=f"cannot write the checkpoint {path}: No space left on device; the "):
            ct.save(path, {"env_steps": 2})
        assert cartpole_ppo().load(path)["env_steps"] == 1
        assert sorted(p.name for p in disk.iterdir()) == ["RL.pt"]
    finally:
        subprocess.run(["umount", str(disk)], check=False)
