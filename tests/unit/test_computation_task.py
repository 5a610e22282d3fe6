"""ComputationTask around a tiny real A2C: numpy in and out, costs, checkpoints, misbehaving Algorithms."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch

from flare2.core.algorithm import Algorithm, step_optimizer
from flare2.core.computation_task import ComputationTask
from flare2.core.devices import AUTO_CUDA_MIN_PARAMETERS, choose_device, count_parameters, resolve_device
from flare2.core.learn_requests import check_learn, pack, unpack
from flare2.core.model import Model
from flare2.core.specs import Spec, check_arrays
from flare2.errors import ConfigError, SpecError
from flare2.runtime.config import predict_threads
from flare2.zoo.a2c import A2C
from flare2.zoo.models import ActorCritic

OBS_SPACE = gym.spaces.Box(-1, 1, (4,))
ACTION_SPACE = gym.spaces.Discrete(2)


def make_model(seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    return ActorCritic(OBS_SPACE, ACTION_SPACE, hidden=(8,))


def make_ct(seed: int = 0, name: str = "RL") -> ComputationTask:
    return ComputationTask(name, A2C(make_model(seed)), device="cpu")


def learn_batch(batch: int = 2, steps: int = 5, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    terminated = np.zeros((batch, steps), bool)
    terminated[0, 2] = True
    truncated = np.zeros((batch, steps), bool)
    truncated[-1, 1] = True
    return {
        "inputs": {"obs": rng.standard_normal((batch, steps, 4), dtype=np.float32)},
        "next_inputs": {"obs": rng.standard_normal((batch, steps, 4), dtype=np.float32)},
        "actions": {"action": rng.integers(0, 2, (batch, steps), dtype=np.int64)},
        "rewards": {"reward": rng.standard_normal((batch, steps), dtype=np.float32)},
        "states": {},
        "terminated": terminated,
        "truncated": truncated,
        "policy_version": np.zeros((batch, steps), np.int64),
    }


def parameters(ct: ComputationTask) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in ct.algorithm.model.named_parameters()}


def assert_same_state(a, b, where: str = "state") -> None:
    """Recursive equality for state dicts: tensors exactly equal, everything else ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{index}]")
    else:
        assert a == b, where


# --- predict ---------------------------------------------------------------------------------------


def test_the_ct_specs_come_from_the_model():
    ct = make_ct()
    assert ct.specs.inputs == {"obs": Spec((4,), "float32")}
    assert ct.specs.actions == {"action": Spec((), "int64")}
    assert ct.specs.states == {}
    assert ct.specs.rewards == {"reward": Spec((), "float32")}


def test_predict_returns_arrays_that_match_the_action_specs():
    ct = make_ct()
    actions, states = ct.predict({"obs": np.zeros((3, 4), np.float32)}, {})

    assert check_arrays("actions", ct.specs.actions, actions) == (3,)
    assert set(np.unique(actions["action"])) <= {0, 1}
    assert states == {}
    assert ct.predict_calls == 1


def test_a_wrong_input_shape_is_caught_by_the_ct_specs_before_it_reaches_the_model():
    # CT.predict trusts its caller (the CDP validates every request with check_predict first).
    ct = make_ct()
    request = {"inputs": {"obs": np.zeros((3, 5), np.float32)}, "states": {}}
    with pytest.raises(SpecError) as caught:
        ct.specs.check_predict(request)
    assert "inputs['obs']" in str(caught.value) and "(4,)" in str(caught.value) and "(3, 5)" in str(caught.value)

    # Called directly, a wrong shape still fails (in the model) rather than returning something.
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        ct.predict(request["inputs"], {})


def test_predict_and_learn_each_run_with_their_own_torch_threads_in_the_thread_that_calls_them():
    ct, before = make_ct(), torch.get_num_threads()
    ct.use_threads(predict=1, learn=2)
    try:
        ct.learn(learn_batch())
        assert torch.get_num_threads() == 2
        ct.predict({"obs": np.zeros((3, 4), np.float32)}, {})
        assert torch.get_num_threads() == 1
        # A learner thread sets its own count, and the count of the thread that predicts stays as it was.
        counts = []
        learner = threading.Thread(target=lambda: (ct.learn(learn_batch()), counts.append(torch.get_num_threads())))
        learner.start()
        learner.join(timeout=30)
        assert counts == [2] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_predicting_threads_leave_a_core_to_each_local_agent_and_exceed_neither_the_cores_nor_torch_threads():
    cores = len(os.sched_getaffinity(0))
    assert predict_threads(None, torch_threads=cores, local_agents=0) == cores
    assert predict_threads(None, torch_threads=cores, local_agents=1) == max(1, cores - 1)
    assert predict_threads(None, torch_threads=cores + 4, local_agents=cores) == 1
    assert predict_threads(None, torch_threads=1, local_agents=0) == 1
    assert predict_threads(3, torch_threads=1, local_agents=cores) == 3


# --- learn -----------------------------------------------------------------------------------------


def test_learn_returns_float_costs_and_counts_the_call():
    ct = make_ct()
    before = parameters(ct)

    costs = ct.learn(learn_batch())

    assert set(costs) == {"loss", "policy_loss", "value_loss", "entropy", "grad_norm"}
    assert all(type(value) is float and np.isfinite(value) for value in costs.values())
    assert ct.learn_calls == 1
    assert any(not torch.equal(before[name], after) for name, after in parameters(ct).items())

    ct.learn(learn_batch(seed=1))
    assert ct.learn_calls == 2


def test_learn_hands_the_algorithm_batch_by_time_tensors_with_the_episode_flags():
    seen = {}

    class Recorder(Algorithm):
        def predict(self, inputs, states):
            raise AssertionError("not called")

        def learn(self, experience):
            seen["experience"] = experience
            return {"n": torch.tensor(3)}

    ct = ComputationTask("RL", Recorder(make_model()))
    batch = learn_batch(batch=2, steps=5)
    assert ct.learn(batch) == {"n": 3.0}

    experience = seen["experience"]
    assert experience.inputs["obs"].shape == (2, 5, 4) and experience.actions["action"].dtype == torch.int64
    assert torch.equal(experience.terminated, torch.from_numpy(batch["terminated"]))
    assert torch.equal(experience.truncated, torch.from_numpy(batch["truncated"]))
    assert torch.equal(experience.episode_ends, torch.from_numpy(batch["terminated"] | batch["truncated"]))


def test_the_models_extras_reach_learn_as_tensors_and_a_request_without_them_is_refused():
    seen = {}

    class WithReturns(ActorCritic):
        def extra_specs(self):
            return {"returns": Spec((), "float32")}

    class Recorder(Algorithm):
        def predict(self, inputs, states):
            raise AssertionError("not called")

        def learn(self, experience):
            seen["experience"] = experience
            return {}

    torch.manual_seed(0)
    ct = ComputationTask("RL", Recorder(WithReturns(OBS_SPACE, ACTION_SPACE, hidden=(8,))))
    assert ct.specs.extras == {"returns": Spec((), "float32")}
    batch = learn_batch(batch=2, steps=5)
    with pytest.raises(SpecError, match="extras keys do not match the specs.*missing \\['returns'\\]"):
        check_learn(ct.specs, pack(ct.specs, batch, 0))
    batch["extras"] = {"returns": np.arange(10, dtype=np.float32).reshape(2, 5)}
    payload = pack(ct.specs, batch, 0)
    assert check_learn(ct.specs, payload) == (2, 5)
    ct.learn(unpack(ct.specs, payload))
    assert torch.equal(seen["experience"].extras["returns"], torch.arange(10.0).reshape(2, 5))
    # The specs say so on the wire too, so remote agents fill them.
    assert type(ct.specs).from_wire(ct.specs.to_wire()) == ct.specs


def test_learn_that_returns_no_dict_raises_spec_error_naming_the_algorithm():
    class NoCosts(Algorithm):
        def learn(self, experience):
            return 1.0

    ct = ComputationTask("RL", NoCosts(make_model()))
    with pytest.raises(SpecError, match="NoCosts.learn must return a dict of costs, got float"):
        ct.learn(learn_batch())


# --- checkpoints -----------------------------------------------------------------------------------


def test_annealing_the_learning_rate_without_an_optimizer_says_to_create_one_first():
    algorithm = Algorithm(make_model())
    with pytest.raises(ValueError, match=r"must create self.optimizer before calling anneal_lr\(\)"):
        algorithm.anneal_lr(1e-3, done=1, total=10)


def test_save_then_load_restores_parameters_optimizer_state_and_counters(tmp_path):
    ct = make_ct(seed=0)
    ct.predict({"obs": np.zeros((3, 4), np.float32)}, {})
    ct.learn(learn_batch(seed=0))
    ct.learn(learn_batch(seed=1))
    ct.learned_rows = 96  # the compute process's CDP counts them
    path = tmp_path / "checkpoints" / "RL.pt"
    ct.save(path, counters={"env_steps": 1234, "episodes": 7})

    fresh = make_ct(seed=1)
    assert any(not torch.equal(a, b) for a, b in zip(parameters(ct).values(), parameters(fresh).values()))
    counters = fresh.load(path)

    assert counters == {"env_steps": 1234, "episodes": 7, "predict_calls": 1, "learn_calls": 2, "learned_rows": 96}
    assert (fresh.predict_calls, fresh.learn_calls, fresh.learned_rows) == (1, 2, 96)
    assert_same_state(fresh.algorithm.model.state_dict(), ct.algorithm.model.state_dict(), "model")
    assert_same_state(fresh.algorithm.optimizer.state_dict(), ct.algorithm.optimizer.state_dict(), "optimizer")

    # The restored optimizer state matters: one more identical step keeps both CTs identical.
    ct.learn(learn_batch(seed=2))
    fresh.learn(learn_batch(seed=2))
    assert_same_state(fresh.algorithm.model.state_dict(), ct.algorithm.model.state_dict(), "model after a step")


def test_save_leaves_only_the_checkpoint_behind(tmp_path):
    ct = make_ct()
    ct.save(tmp_path / "RL.pt", counters={})
    ct.save(tmp_path / "RL.pt", counters={"again": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["RL.pt"]
    assert make_ct().load(tmp_path / "RL.pt")["again"] == 1


def test_loading_a_checkpoint_of_another_ct_raises_config_error(tmp_path):
    make_ct(name="RL").save(tmp_path / "RL.pt", counters={})
    with pytest.raises(ConfigError, match="belongs to CT 'RL', not 'other'"):
        make_ct(name="other").load(tmp_path / "RL.pt")


def test_loading_a_missing_checkpoint_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint at"):
        make_ct().load(tmp_path / "missing.pt")


@pytest.mark.parametrize("content", [b"junk\n", b""])
def test_loading_a_file_that_is_no_checkpoint_raises_config_error_naming_it(tmp_path, content):
    (tmp_path / "RL.pt").write_bytes(content)
    with pytest.raises(ConfigError, match=r"RL.pt cannot be read \(\w+\): it is no flare2 checkpoint"):
        make_ct().load(tmp_path / "RL.pt")


# --- misbehaving Algorithms ------------------------------------------------------------------------


class ShapeBreaker(Algorithm):
    """Returns actions of shape [B, 1] where the spec says [B]."""

    def predict(self, inputs, states):
        rows = inputs["obs"].shape[0]
        return {"action": torch.zeros(rows, 1, dtype=torch.int64)}, {}


class DtypeBreaker(Algorithm):
    def predict(self, inputs, states):
        return {"action": torch.zeros(inputs["obs"].shape[0], dtype=torch.float32)}, {}


class KeyBreaker(Algorithm):
    def predict(self, inputs, states):
        return {"act": torch.zeros(inputs["obs"].shape[0], dtype=torch.int64)}, {}


class StateBreaker(Algorithm):
    def predict(self, inputs, states):
        return {"action": torch.zeros(inputs["obs"].shape[0], dtype=torch.int64)}, {"h": torch.zeros(1)}


@pytest.mark.parametrize(
    "algorithm, expected",
    [
        (ShapeBreaker, r"ShapeBreaker\.predict returned actions\['action'\] with shape \(3, 1\) .*shape \(3,\)"),
        (DtypeBreaker, r"DtypeBreaker\.predict returned actions\['action'\] .*dtype float32.*dtype int64"),
        (KeyBreaker, r"KeyBreaker\.predict must return actions with keys \['action'\], got \['act'\]"),
        (StateBreaker, r"StateBreaker\.predict must return states with keys \[\], got \['h'\]"),
    ],
)
def test_an_algorithm_whose_predict_breaks_the_specs_gets_an_error_naming_it(algorithm, expected):
    ct = ComputationTask("RL", algorithm(make_model()))
    with pytest.raises(SpecError, match=expected):
        ct.predict({"obs": np.zeros((3, 4), np.float32)}, {})


def test_a_ct_needs_an_algorithm():
    with pytest.raises(ConfigError, match="needs a flare2 Algorithm, got ActorCritic"):
        ComputationTask("RL", make_model())


@pytest.mark.parametrize("device", ["tpu", "nonsense"])
def test_an_unknown_device_raises_config_error(device):
    with pytest.raises(ConfigError, match="device"):
        ComputationTask("RL", A2C(make_model()), device=device)


def test_parameters_are_counted_once_for_a_network_two_attributes_share():
    model = make_model()
    algorithm = A2C(model)
    algorithm.same_model = model
    assert count_parameters(algorithm) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "gpu, parameters, expected",
    [
        (True, AUTO_CUDA_MIN_PARAMETERS - 1, "cpu"),
        (True, AUTO_CUDA_MIN_PARAMETERS, "cuda"),
        (False, 10 * AUTO_CUDA_MIN_PARAMETERS, "cpu"),
    ],
)
def test_auto_takes_the_gpu_only_for_networks_large_enough_to_pay(monkeypatch, gpu, parameters, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert resolve_device("auto", parameters).type == expected
    assert resolve_device("cpu", parameters).type == "cpu"


def test_auto_says_why_it_left_a_gpu_unused(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    small = A2C(make_model())
    with caplog.at_level("INFO", logger="flare2.core.devices"):
        assert choose_device("auto", [small, A2C(make_model())]).type == "cpu"
    [record] = caplog.records
    assert f"networks hold {2 * count_parameters(small)} parameters" in record.getMessage()
    assert "--device cuda" in record.getMessage()


def test_a_save_that_dies_half_way_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    path = tmp_path / "RL.pt"
    ct = make_ct()
    ct.save(path, {"env_steps": 100})
    before = path.read_bytes()

    def torn_save(state, file):
        file.write(b"half a checkpoint")
        raise KeyboardInterrupt  # the process is interrupted in the middle of writing

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(KeyboardInterrupt):
        ct.save(path, {"env_steps": 200})

    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RL.pt"]
    assert make_ct(seed=1).load(path)["env_steps"] == 100


def test_greedy_rows_get_the_greedy_action_and_the_others_the_exploring_one():
    class Marked(A2C):
        def predict(self, inputs, states):
            return {"action": torch.zeros(len(inputs["obs"]), dtype=torch.int64)}, {}

        def predict_greedy(self, inputs, states):
            return {"action": torch.ones(len(inputs["obs"]), dtype=torch.int64)}, {}

    ct = ComputationTask("RL", Marked(make_model()), device="cpu")
    obs = np.zeros((4, 4), np.float32)
    actions, _ = ct.predict({"obs": obs}, {}, greedy=np.array([False, True, False, True]))
    assert actions["action"].tolist() == [0, 1, 0, 1]
    assert ct.predict({"obs": obs}, {}, greedy=np.ones(4, bool))[0]["action"].tolist() == [1, 1, 1, 1]


def test_with_acting_beside_learning_predictions_keep_the_weights_of_the_last_finished_learn():
    ct = make_ct()
    ct.act_beside_learning()
    obs = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    before = ct.algorithm.model.policy({"obs": torch.from_numpy(obs)}).detach()
    ct.algorithm.model.policy_net[0].weight.data.add_(1.0)  # learn() changing its weights half way
    acting = ct._acting.model.policy({"obs": torch.from_numpy(obs)}).detach()
    assert torch.equal(acting, before) and ct.version == 0
    ct.learn(learn_batch())
    assert ct.version == 1 and ct.predicted_version == 0
    ct.predict({"obs": obs}, {})
    assert ct.predicted_version == 1
    learned = ct.algorithm.model.policy({"obs": torch.from_numpy(obs)}).detach()
    assert torch.equal(ct._acting.model.policy({"obs": torch.from_numpy(obs)}).detach(), learned)


def test_experience_tells_how_far_behind_the_acting_policy_was():
    seen = {}

    class Recording(A2C):
        def learn(self, experience):
            seen["lag"] = experience.policy_lag.tolist()
            return {}

    ct = ComputationTask("RL", Recording(make_model()), device="cpu")
    batch = learn_batch(batch=1, steps=3)
    ct.learn(batch)
    ct.learn(batch)
    batch["policy_version"] = np.array([[0, 1, 2]], np.int64)
    ct.learn(batch)
    assert seen["lag"] == [[2, 1, 0]]


class NormalizedDropoutModel(Model):
    """A BatchNorm (which cannot normalize a batch of one in train mode) and a heavy dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.BatchNorm1d(16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 2)
        )

    def input_specs(self):
        return {"obs": Spec((4,), "float32")}

    def action_specs(self):
        return {"logits": Spec((2,), "float32")}


class ModeRecorder(Algorithm):
    def __init__(self, model) -> None:
        super().__init__(model)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        self.learned_in_train_mode: list[bool] = []

    def predict(self, inputs, states):
        return {"logits": self.model.net(inputs["obs"])}, {}

    def learn(self, experience):
        self.learned_in_train_mode.append(self.model.training)
        obs = experience.inputs["obs"].reshape(-1, 4)
        self.optimize(self.model.net(obs).pow(2).mean())
        return {}


@pytest.mark.parametrize("beside_learning", [False, True])
def test_predict_runs_in_eval_mode_and_learn_in_train_mode(beside_learning):
    ct = ComputationTask("RL", ModeRecorder(NormalizedDropoutModel()), device="cpu")
    if beside_learning:
        ct.act_beside_learning()
    obs = {"obs": np.ones((1, 4), np.float32)}
    batch = {
        "inputs": {"obs": np.random.default_rng(0).normal(size=(4, 2, 4)).astype(np.float32)},
        "next_inputs": {"obs": np.zeros((4, 2, 4), np.float32)},
        "actions": {"logits": np.zeros((4, 2, 2), np.float32)},
        "rewards": {},
        "states": {},
        "terminated": np.zeros((4, 2), bool),
        "truncated": np.zeros((4, 2), bool),
        "policy_version": np.zeros((4, 2), np.int64),
    }
    for _ in range(2):
        # A batch of one passes BatchNorm, and dropout is off: the same input gives the same action.
        first, _ = ct.predict(obs, {})
        second, _ = ct.predict(obs, {})
        np.testing.assert_array_equal(first["logits"], second["logits"])
        ct.learn(batch)
    assert ct.algorithm.learned_in_train_mode == [True, True]


class OtherA2C(A2C):
    pass


def test_resuming_from_a_checkpoint_of_another_algorithm_or_other_specs_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "RL.pt"
    make_ct().save(path, {"env_steps": 10})
    assert make_ct().load(path)["env_steps"] == 10
    with pytest.raises(ConfigError, match=r"written by algorithm flare2\.zoo\.a2c\.A2C, this run builds .*OtherA2C"):
        ComputationTask("RL", OtherA2C(make_model()), device="cpu").load(path)
    wider = ActorCritic(gym.spaces.Box(-1, 1, (6,)), gym.spaces.Discrete(2))
    with pytest.raises(ConfigError, match=r"inputs\['obs'\] = \{'shape': \[4\], 'dtype': 'float32'\}, .*\[6\]"):
        ComputationTask("RL", A2C(wider), device="cpu").load(path)
    # Same specs, other layers: torch's own complaint, inside flare2's message.
    other_layers = ActorCritic(OBS_SPACE, ACTION_SPACE, hidden=(8, 8))
    with pytest.raises(
        ConfigError,
        match=r"does not fit this run's A2C \(Error\(s\) in loading state_dict for "
        r"ActorCritic: .*\): it was written with other network settings",
    ):
        ComputationTask("RL", A2C(other_layers), device="cpu").load(path)


def _stepped_parameters(optimizer_class, step, **options) -> list[torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    optimizer = optimizer_class(net.parameters(), lr=0.1, **options)
    for _ in range(3):
        optimizer.zero_grad()
        net(torch.ones(4, 3)).pow(2).sum().backward()
        step(optimizer)
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize(
    ("optimizer_class", "options"),
    [(torch.optim.Adam, {"fused": True}), (torch.optim.Adam, {}), (torch.optim.SGD, {"momentum": 0.9})],
)
def test_stepping_an_optimizer_without_the_compiler_import_updates_the_weights_as_its_own_step(
    optimizer_class, options
):
    ours = _stepped_parameters(optimizer_class, step_optimizer, **options)
    torchs = _stepped_parameters(optimizer_class, lambda optimizer: optimizer.step(), **options)
    for mine, theirs in zip(ours, torchs, strict=True):
        assert torch.equal(mine, theirs)


def test_step_hooks_and_a_learning_rate_scheduler_still_see_every_step():
    net = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    seen = []
    handle = optimizer.register_step_post_hook(lambda *_: seen.append("hook"))
    net(torch.ones(1, 3)).sum().backward()
    step_optimizer(optimizer)
    handle.remove()
    assert seen == ["hook"]
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    step_optimizer(optimizer)
    assert optimizer._opt_called  # what the scheduler checks to warn of a step() before optimizer.step()
    scheduler.step()


STEP_IN_A_FRESH_PROCESS = """
import sys
import torch
from flare2.core.algorithm import adam, step_optimizer
net = torch.nn.Linear(3, 2)
optimizer = adam(net.parameters(), lr=0.1)
net(torch.ones(1, 3)).sum().backward()
step_optimizer(optimizer)
sys.exit(1 if "torch._dynamo" in sys.modules else 0)
"""


def test_a_process_that_steps_an_optimizer_does_not_import_the_compiler():
    result = subprocess.run(
        [sys.executable, "-c", STEP_IN_A_FRESH_PROCESS], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"torch._dynamo was imported\n{result.stderr}"
