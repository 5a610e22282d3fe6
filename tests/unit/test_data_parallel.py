"""Learners on CPU cores (gloo): each learns from its share of a batch, their gradients averaged, through the same
learner processes a run starts with --learners."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.distributed as dist

from flare2.core.computation_task import ComputationTask
from flare2.core.learn_requests import pack, unpack
from flare2.errors import ConfigError, LearnerDiedError, TransportError
from flare2.runtime.compute.cdp import ComputationDataProcessor, LearnBatch
from flare2.runtime.compute.learn_calls import learn_with_lag
from flare2.runtime.compute.learner_group import join
from flare2.runtime.compute.learner_main import LearnerSettings
from flare2.runtime.compute.learner_process import LearnerProcess, check_learners
from flare2.runtime.config import AgentConfig, CTConfig, RunConfig
from flare2.wire.sockets import free_port
from flare2.zoo.a2c import A2C
from flare2.zoo.models import ActorCritic

CARTPOLE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2)


def build_a2c() -> A2C:
    return A2C(ActorCritic(*CARTPOLE, hidden=(16, 16)))


class RankDependentA2C(A2C):
    """Moves its weights outside optimize(), by a different amount on each learner."""

    def learn(self, experience):
        costs = super().learn(experience)
        with torch.no_grad():
            next(self.model.parameters()).add_(dist.get_rank() if dist.is_initialized() else 0)
        return costs


def build_rank_dependent() -> A2C:
    return RankDependentA2C(ActorCritic(*CARTPOLE, hidden=(16, 16)))


class NormalisingA2C(A2C):
    """Keeps BatchNorm running statistics of the observations it learns from: buffers learn() moves without the
    optimizer."""

    def __init__(self, model: ActorCritic) -> None:
        super().__init__(model)
        self.norm = torch.nn.BatchNorm1d(4, momentum=0.5)

    def learn(self, experience):
        self.norm.train()(experience.inputs["obs"].flatten(0, 1))
        return super().learn(experience)


def build_normalising() -> A2C:
    return NormalisingA2C(ActorCritic(*CARTPOLE, hidden=(16, 16)))


def learn_batches(ct: ComputationTask, count: int, sequences: int = 8, steps: int = 5) -> list[dict]:
    """Learn requests of random CartPole steps, episode ends among them, as the CDP hands them to a learner."""
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        lead = (sequences, steps)
        stored = ct.specs.stored_specs()
        step = {
            "inputs": {"obs": rng.standard_normal((*lead, 4)).astype(np.float32)},
            "next_inputs": {"obs": rng.standard_normal((*lead, 4)).astype(np.float32)},
            "actions": {
                name: rng.integers(0, 2, lead).astype(spec.dtype) if name == "action" else np.zeros(lead, spec.dtype)
                for name, spec in stored["actions"].items()
            },
            "rewards": {"reward": np.ones(lead, np.float32)},
            "states": {},
            "terminated": rng.random(lead) < 0.1,
            "truncated": np.zeros(lead, bool),
            "policy_version": np.full(lead, ct.version, np.int64),
        }
        batches.append(pack(ct.specs, step, 0))
    return batches


def fresh_ct(build=build_a2c) -> ComputationTask:
    torch.manual_seed(0)
    return ComputationTask("RL", build(), device="cpu")


def two_learners(build) -> tuple[ComputationTask, ComputationDataProcessor, LearnerProcess]:
    """A CT of ``build``'s algorithm, its CDP, and two learner processes started from its weights."""
    ct = fresh_ct(build)
    settings = LearnerSettings((CTConfig("RL", build),), "cpu", 0, 1, None, os.getpid(), learners=2)
    return ct, ComputationDataProcessor(ct, reply=lambda *_: None), LearnerProcess([ct], settings)


def test_two_learners_stay_bit_identical_and_each_update_equals_one_learners_on_the_whole_batch():
    # One learner on the whole batches, here in this process (the same learn_with_lag a learner process runs) ...
    alone = fresh_ct()
    batches = learn_batches(alone, 3)
    expected = []
    for experience in batches:
        learn_with_lag(alone, experience)
        expected.append([tensor.clone() for tensor in alone.weight_tensors()])
    # ... and two learner processes, each on half of every batch, their gradients averaged.
    ct, cdp, process = two_learners(build_a2c)
    try:
        for experience, weights in zip(batches, expected):
            process.submit(LearnBatch(cdp, [], experience))
            process.finish()
            assert len(set(process.weight_digests)) == 1 and process.weight_digests[0]
            for got, want in zip(ct.weight_tensors(), weights):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    finally:
        process.close()
    # And the updates did move the weights.
    assert not torch.equal(expected[0][0], expected[-1][0])


def test_learners_average_the_buffers_learn_moves_so_their_weights_stay_identical():
    ct, cdp, process = two_learners(build_normalising)
    [batch] = learn_batches(ct, 1)
    try:
        process.submit(LearnBatch(cdp, [], batch))
        process.finish()
        assert len(set(process.weight_digests)) == 1 and process.weight_digests[0]
    finally:
        process.close()
    # From 0, one update at momentum 0.5 on each half: their mean is half the mean of the whole batch.
    whole = torch.from_numpy(unpack(ct.specs, batch)["inputs"]["obs"]).reshape(-1, 4).mean(0)
    torch.testing.assert_close(ct.algorithm.norm.running_mean, 0.5 * whole)


def test_uneven_shares_learners_that_part_ways_and_a_dead_learner_each_stop_the_run_naming_the_cause():
    # One pair of learner processes for the three (each start costs seconds): refusals first, the death last.
    ct, cdp, process = two_learners(build_rank_dependent)
    try:
        with pytest.raises(ConfigError, match="holds 7 sequences, which do not split evenly over --learners 2"):
            process.submit(LearnBatch(cdp, [], learn_batches(ct, 1, sequences=7)[0]))
        assert process.idle
        with pytest.raises(ConfigError, match="the 2 learners hold different weights: with --learners every change"):
            process.submit(LearnBatch(cdp, [], learn_batches(ct, 1)[0]))
            process.finish()
        os.kill(process.pids[1], signal.SIGKILL)
        with pytest.raises(LearnerDiedError, match=r"learner process 1 of 2 died \(killed by signal 9\)"):
            process.submit(LearnBatch(cdp, [], learn_batches(ct, 1)[0]))
            process.finish()
    finally:
        process.close()


def test_learners_the_machine_or_the_run_cannot_take_are_refused_naming_the_fix(monkeypatch):
    ct = ComputationTask("RL", build_a2c(), device="cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_learners(2, "cuda", [ct])
    with pytest.raises(
        ConfigError,
        match=r"puts a learner on each GPU from cuda:1 on, but this machine has 2 GPU\(s\): "
        r"use --learners 1 or fewer, or --device cpu",
    ):
        check_learners(2, "cuda:1", [ct])
    with pytest.raises(ConfigError, match="--learners must be >= 1, got 0"):
        RunConfig(
            cts=(CTConfig("RL", build_a2c),), agents=AgentConfig("flare2.core.envs:GymAgent"), max_steps=10, learners=0
        )
    run = {"cts": (CTConfig("RL", build_a2c),), "agents": AgentConfig("flare2.core.envs:GymAgent"), "max_steps": 10}
    with pytest.raises(ConfigError, match=r"--remote-learners must be in 0..1 \(--learners counts them"):
        RunConfig(**run, learners=2, remote_learners=2)
    with pytest.raises(ConfigError, match="CT 'RL' is built by a Python function .* train it with `flare2 train`"):
        RunConfig(**run, learners=2, remote_learners=1)
    for conflict in ({"serial": True}, {"learner": "inline"}):
        with pytest.raises(ConfigError, match="--learners 2 runs learner processes, which"):
            RunConfig(
                cts=(CTConfig("RL", build_a2c),),
                agents=AgentConfig("flare2.core.envs:GymAgent"),
                max_steps=10,
                learners=2,
                **conflict,
            )


def test_a_rendezvous_that_does_not_answer_ends_in_a_message_naming_it_within_twice_its_timeout(monkeypatch):
    # join() sets the interfaces in os.environ for the learner process it runs in; here that is the test process,
    # whose later runs would inherit a loopback interface their learners on other hosts cannot reach.
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.setenv(name, "lo")
    port = free_port("127.0.0.1")  # nothing listens there
    started = time.monotonic()
    with pytest.raises(
        TransportError,
        match=rf"the learners' process group at tcp://127.0.0.1:{port} did not take in "
        rf"learner 1 within 1s: check that this machine reaches 127.0.0.1 on TCP port {port}",
    ):
        join(f"tcp://127.0.0.1:{port}", 1, 2, device="cpu", rendezvous_timeout_s=1, timeout_s=60)
    # torch's store tries to connect twice, each for the timeout.
    assert time.monotonic() - started < 2 * 1 + 3
    assert not dist.is_initialized()
