"""The ComputationTask on a GPU: the same numbers as on the CPU, checkpoints that move between the two, and the
weight hand-over of the learner process. Skipped where torch sees no CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_computation_task import assert_same_state, learn_batch, make_model
from test_entity_model import model as entity_model

from flare2.core.computation_task import ComputationTask
from flare2.wire.ragged import Ragged
from flare2.zoo.a2c import A2C
from flare2.zoo.ppo import PPO

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


def make_ct(device: str, seed: int = 0) -> ComputationTask:
    return ComputationTask("RL", A2C(make_model(seed)), device=device)


def test_predict_on_the_gpu_gives_numpy_arrays_on_the_host_from_the_same_policy_as_the_cpu():
    cpu, gpu = make_ct("cpu"), make_ct("cuda")
    obs = np.random.default_rng(0).standard_normal((64, 4), dtype=np.float32)

    actions, states = gpu.predict({"obs": obs}, {})

    assert isinstance(actions["action"], np.ndarray) and actions["action"].shape == (64,) and states == {}
    with torch.no_grad():
        on_cpu = cpu.algorithm.model.policy({"obs": torch.from_numpy(obs)})
        on_gpu = gpu.algorithm.model.policy({"obs": torch.from_numpy(obs).cuda()})
    assert torch.allclose(on_cpu, on_gpu.cpu(), atol=1e-5)


def test_the_caller_may_reuse_its_input_buffer_as_soon_as_predict_returns():
    # Inputs go over with non-blocking copies; predict must not return while a copy still reads the caller's array.
    gpu = make_ct("cuda")
    obs = np.zeros((1 << 20, 4), np.float32)
    for row in range(3):
        obs.fill(row)
        first = gpu._tensor(obs)
        obs.fill(-1.0)
        torch.cuda.synchronize()
        assert float(first.min()) == float(first.max()) == row


def test_one_learn_on_the_gpu_moves_the_weights_as_on_the_cpu():
    cpu, gpu = make_ct("cpu"), make_ct("cuda")
    batch = learn_batch(batch=8, steps=16)

    cpu_costs, gpu_costs = cpu.learn(batch), gpu.learn(batch)

    assert gpu_costs.keys() == cpu_costs.keys()
    for name, value in cpu_costs.items():
        assert gpu_costs[name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    for (name, on_cpu), on_gpu in zip(cpu.algorithm.model.named_parameters(), gpu.algorithm.model.parameters()):
        assert on_gpu.device.type == "cuda"
        assert torch.allclose(on_cpu, on_gpu.cpu(), atol=1e-5), name


def test_a_checkpoint_written_on_the_gpu_loads_on_the_cpu_and_back(tmp_path):
    gpu = make_ct("cuda")
    gpu.learn(learn_batch())
    gpu.save(tmp_path / "RL.pt", {"env_steps": 10})

    cpu = make_ct("cpu", seed=1)
    assert cpu.load(tmp_path / "RL.pt")["env_steps"] == 10
    assert all(p.device.type == "cpu" for p in cpu.algorithm.model.parameters())
    assert_same_state(
        {k: v.cpu() for k, v in gpu.algorithm.model.state_dict().items()}, cpu.algorithm.model.state_dict()
    )

    cpu.save(tmp_path / "back.pt", {"env_steps": 10})
    again = make_ct("cuda", seed=2)
    again.load(tmp_path / "back.pt")
    assert all(p.device.type == "cuda" for p in again.algorithm.model.parameters())
    # The optimizer's moments came along on the GPU: the next step is the same on both.
    batch = learn_batch(seed=3)
    assert again.learn(batch)["loss"] == pytest.approx(gpu.learn(batch)["loss"], rel=1e-4)


def test_weights_handed_over_through_host_memory_become_the_gpu_acting_weights():
    # The learner process writes into host shared memory; the compute process adopts them on its device.
    learner, acting = make_ct("cuda", seed=0), make_ct("cuda", seed=1)
    learner.learn(learn_batch())
    host = [tensor.detach().to("cpu", copy=True).share_memory_() for tensor in learner.weight_tensors()]

    acting.adopt_weights(host, learn_calls=1)

    assert acting.version == 1
    obs = np.random.default_rng(1).standard_normal((16, 4), dtype=np.float32)
    with torch.no_grad():
        expected = learner.algorithm.model.policy({"obs": torch.from_numpy(obs).cuda()})
        used = acting.algorithm.model.policy({"obs": torch.from_numpy(obs).cuda()})
    assert torch.allclose(expected, used)


def test_ragged_entity_inputs_give_the_same_policy_on_the_gpu_as_on_the_cpu():
    rng = np.random.default_rng(0)
    inputs = {
        "robot": Ragged.from_items([rng.random((n, 2)) for n in (1, 2, 3)], (2,), "float32"),
        "mine": Ragged.from_items([rng.random((n, 2)) for n in (2, 0, 4)], (2,), "float32"),
        "cannon": rng.random((3, 1)).astype(np.float32),
    }
    cpu = ComputationTask("RL", PPO(entity_model()), device="cpu")
    gpu = ComputationTask("RL", PPO(entity_model()), device="cuda")

    actions, _ = gpu.predict(inputs, {})

    assert isinstance(actions["move"], Ragged) and actions["move"].lengths.tolist() == [1, 2, 3]
    with torch.no_grad():
        on_cpu = cpu.algorithm.model.eval().policy(cpu._tensors(inputs))
        on_gpu = gpu.algorithm.model.eval().policy(gpu._tensors(inputs))
    assert torch.allclose(on_cpu.actor_logits["move"].values, on_gpu.actor_logits["move"].values.cpu(), atol=1e-5)
    assert torch.allclose(on_cpu.select_scores["fire"].values, on_gpu.select_scores["fire"].values.cpu(), atol=1e-5)
