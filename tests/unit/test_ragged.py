"""Ragged inputs and outputs: packing across envs and requests, the wire, strict decoding, and what a model gets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from doubles import KeepingHelper

from flare2.core.agent import Agent
from flare2.core.algorithm import Algorithm
from flare2.core.computation_task import ComputationTask
from flare2.core.helpers import stack_steps
from flare2.core.learn_requests import pack, unpack
from flare2.core.model import Model
from flare2.core.ragged_tensor import RaggedTensor, pad_rows
from flare2.core.replay import ExpReplayHelper
from flare2.core.specs import CTSpecs, Spec, check_arrays
from flare2.errors import ConfigError, SpecError
from flare2.runtime.compute.cdp import ComputationDataProcessor
from flare2.runtime.config import BatchingConfig
from flare2.wire.codec import decode, encode
from flare2.wire.protocol import ERROR, LEARN, PREDICT, PREDICTION, Message
from flare2.wire.ragged import Ragged, concat_rows, rows_in_order, stack_time

MINE = (2,)


def mines(*counts: int, start: float = 0.0) -> Ragged:
    """Observations of ``counts`` mines each; mine j of all of them holds (start + j, start + j), numbered in order."""
    items, value = [], start
    for count in counts:
        items.append([[value + j, value + j] for j in range(count)])
        value += count
    return Ragged.from_items(items, MINE, "float32")


def as_lists(ragged: Ragged) -> list[list]:
    return [row.tolist() for row in ragged.items()]


def test_rows_select_concatenate_and_stack_by_hand_including_rows_of_no_items():
    r = mines(2, 0, 3)
    assert r.lengths.tolist() == [2, 0, 3] and r.values.shape == (5, 2) and len(r) == 3
    assert as_lists(r[1:]) == [[], [[2, 2], [3, 3], [4, 4]]]
    assert as_lists(r[np.array([2, 0])]) == [[[2, 2], [3, 3], [4, 4]], [[0, 0], [1, 1]]]
    assert as_lists(r[np.array([False, True, False])]) == [[]]
    both = concat_rows([r, mines(0, 1, start=10)])
    assert both.lengths.tolist() == [2, 0, 3, 0, 1] and as_lists(both)[-1] == [[10, 10]]
    # Two steps of 3 envs become 3 sequences of 2 steps: env 0's two steps first, then env 1's...
    step0, step1 = mines(2, 0, 1), mines(0, 3, 1, start=100)
    seqs = stack_time([step0, step1])
    assert seqs.shape == (3, 2) and seqs.lengths.tolist() == [[2, 0], [0, 3], [1, 1]]
    rows = as_lists(seqs)
    assert rows == [as_lists(step0)[0], [], [], as_lists(step1)[1], as_lists(step0)[2], as_lists(step1)[2]]
    # Along the first dim of [N, T] lengths, a row is a whole sequence.
    assert as_lists(seqs[1:2]) == [[], as_lists(step1)[1]]
    assert as_lists(seqs[np.array([2])]) == [as_lists(step0)[2], as_lists(step1)[2]]
    padded, mask = r.padded(fill=-1)
    assert padded.shape == (3, 3, 2) and mask.tolist() == [[True, True, False], [False] * 3, [True] * 3]
    assert padded[0, 2].tolist() == [-1, -1] and padded[2, 2].tolist() == [4, 4]


def test_rows_put_back_in_order_after_a_split_by_a_mask():
    r = mines(1, 2, 0, 3)
    greedy = np.array([True, False, True, False])
    parts = [(np.flatnonzero(~greedy), r[~greedy]), (np.flatnonzero(greedy), r[greedy])]
    assert as_lists(rows_in_order(parts, 4)) == as_lists(r)
    dense = np.arange(8).reshape(4, 2)
    assert (
        rows_in_order([(np.flatnonzero(~greedy), dense[~greedy]), (np.flatnonzero(greedy), dense[greedy])], 4).tolist()
        == dense.tolist()
    )


def test_a_ragged_input_crosses_the_wire_and_is_checked_back_into_a_ragged():
    specs = {"mines": Spec((None, 2), "float32"), "robot": Spec((3,), "float32")}
    sent = {"mines": mines(3, 0, 5), "robot": np.zeros((3, 3), np.float32)}
    arrived = decode(encode(sent))
    assert isinstance(arrived["mines"], dict)  # the codec knows no specs: a map of two arrays
    assert check_arrays("inputs", specs, arrived) == (3,)
    assert isinstance(arrived["mines"], Ragged) and as_lists(arrived["mines"]) == as_lists(sent["mines"])


def wire_mines(lengths, values) -> dict:
    return {"mines": {"values": values, "lengths": lengths}, "robot": np.zeros((len(lengths), 3), np.float32)}


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        (
            wire_mines(np.array([2, 2], np.int64), np.zeros((3, 2), np.float32)),
            "lengths add up to 4 items, but values holds 3",
        ),
        (
            wire_mines(np.array([-1, 4], np.int64), np.zeros((3, 2), np.float32)),
            "lengths must be between 0 and the 3 items",
        ),
        (
            wire_mines(np.array([1, 2], np.int32), np.zeros((3, 2), np.float32)),
            "lengths must be an int64 array of 1 dim",
        ),
        (
            wire_mines(np.array([[1, 2]], np.int64), np.zeros((3, 2), np.float32)),
            "lengths must be an int64 array of 1 dim",
        ),
        (
            wire_mines(np.array([1, 2], np.int64), np.zeros((3, 3), np.float32)),
            r"values must be a float32 array of shape \(items,\) \+ \(2,\)",
        ),
        (wire_mines(np.array([1, 2], np.int64), np.zeros((3, 2), np.float64)), "values must be a float32 array"),
        (wire_mines(np.array([1, 2], np.int64), [1, 2]), "values must be a float32 array"),
        ({"mines": np.zeros((2, 3, 2), np.float32), "robot": np.zeros((2, 3), np.float32)}, "must be a flare2.Ragged"),
        (
            {
                "mines": {"values": np.zeros((0, 2), np.float32), "lengths": np.zeros(2, np.int64), "x": 1},
                "robot": np.zeros((2, 3), np.float32),
            },
            "must be a flare2.Ragged",
        ),
        (
            {
                "mines": {"values": np.zeros((3, 2), np.float32), "lengths": np.array([1, 2, 0], np.int64)},
                "robot": np.zeros((2, 3), np.float32),
            },
            r"expected leading dims \(2,\) like the other arrays, got \(3,\)",
        ),
    ],
)
def test_malformed_ragged_arrays_are_refused_naming_the_key_and_what_is_wrong(arrays, message):
    specs = {"robot": Spec((3,), "float32"), "mines": Spec((None, 2), "float32")}
    with pytest.raises(SpecError, match=message) as caught:
        check_arrays("inputs", specs, decode(encode(arrays)))
    assert "inputs['mines']" in str(caught.value)


def test_only_inputs_and_actions_may_be_ragged_and_only_in_their_first_dim():
    with pytest.raises(SpecError, match=r"states \['h'\] are ragged"):
        CTSpecs(inputs={}, actions={}, states={"h": Spec((None, 4))}, rewards={})
    with pytest.raises(SpecError, match="None as its first dim"):
        Spec((4, None))
    zeros = Spec((None, 2), "int8").zeros(3)
    assert zeros.lengths.tolist() == [0, 0, 0] and zeros.values.shape == (0, 2) and zeros.dtype == np.int8


def test_ragged_tensor_pools_pads_and_masks_attention_within_each_row():
    r = RaggedTensor.from_ragged(mines(2, 0, 3))
    assert r.row_ids().tolist() == [0, 0, 2, 2, 2]
    assert r.segment_sum().tolist() == [[1, 1], [0, 0], [9, 9]]
    assert r.segment_mean().tolist() == [[0.5, 0.5], [0, 0], [3, 3]]
    assert r.segment_max(empty=-7).tolist() == [[1, 1], [-7, -7], [4, 4]]
    padded, mask = r.padded()
    assert padded.shape == (3, 3, 2) and torch.equal(r.unpadded(padded, mask), r.values)
    attend = r.attention_mask()
    assert attend.shape == (5, 5) and attend[0, 1] and attend[2, 4] and not attend[1, 2] and not attend[4, 0]
    log_p = r.segment_log_softmax(torch.tensor([0.0, 1.0, 2.0, 2.0, 5.0]))
    assert torch.allclose(r.segment_sum(log_p.exp()[:, None])[[0, 2], 0], torch.ones(2))


class EntityCounter(Model):
    """Input ``mines`` (any number of 2-vectors) and ``robot`` (3,); actions: a score per mine and the mine count."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))

    def input_specs(self):
        return {"mines": Spec((None, 2), "float32"), "robot": Spec((3,), "float32")}

    def action_specs(self):
        return {"score": Spec((None,), "float32"), "count": Spec((), "int64")}


class PerMine(Algorithm):
    def __init__(self, model: EntityCounter) -> None:
        super().__init__(model)
        self.seen: list[RaggedTensor] = []

    def predict(self, inputs, states):
        mines_in = inputs["mines"]
        self.seen.append(mines_in)
        score = mines_in.values[:, 0] * self.model.weight
        return {"score": mines_in.with_values(score), "count": mines_in.lengths.clone()}, {}

    def predict_greedy(self, inputs, states):
        actions, states = self.predict(inputs, states)
        return {"score": actions["score"].with_values(-actions["score"].values), "count": actions["count"]}, states

    def learn(self, experience):
        self.learned = experience
        return {"items": float(experience.inputs["mines"].values.shape[0])}


def served_cdp(**batching):
    ct = ComputationTask("RL", PerMine(EntityCounter()), device="cpu")
    replies: list[tuple[str, Message]] = []
    cdp = ComputationDataProcessor(
        ct, config=BatchingConfig(**batching), reply=lambda to, _, m: replies.append((to, m))
    )
    return ct, cdp, replies


def test_requests_of_different_lengths_batch_into_one_ragged_input_and_outputs_go_back_to_the_right_env():
    ct, cdp, replies = served_cdp(max_batch=8, max_wait_ms=60_000)
    cdp.live = frozenset({"a", "b"})
    # Agent a has two envs (2 and 0 mines), agent b three (1, 3 and 0 mines): numbered so each mine is told apart.
    requests = {"a": mines(2, 0), "b": mines(1, 3, 0, start=10)}
    for seq, (agent, obs) in enumerate(requests.items(), 1):
        payload = decode(encode({"inputs": {"mines": obs, "robot": np.zeros((len(obs), 3), np.float32)}, "states": {}}))
        cdp.accept(Message(PREDICT, payload, agent, seq, "RL"), agent, 0.0, learn=False)
    cdp.serve_predictions(0.0)
    [seen] = ct.algorithm.seen
    assert seen.lengths.tolist() == [2, 0, 1, 3, 0] and seen.values.shape == (6, 2)
    assert cdp.stats.predict_rows == 5  # observations, not mines
    for agent, reply in replies:
        assert reply.kind == PREDICTION
        actions = decode(encode(reply.payload))["actions"]
        check_arrays("actions", ct.specs.actions, actions)
        # The score of each mine is its own first feature, in its env's row.
        assert [row.tolist() for row in actions["score"].items()] == [
            row[:, 0].tolist() for row in requests[agent].items()
        ]
        assert actions["count"].tolist() == requests[agent].lengths.tolist()


def test_greedy_and_exploring_rows_of_one_batch_keep_their_ragged_outputs_in_row_order():
    ct, _, _ = served_cdp()
    obs = mines(1, 2, 0, 3)
    actions, _ = ct.predict(
        {"mines": obs, "robot": np.zeros((4, 3), np.float32)}, {}, greedy=np.array([False, True, True, False])
    )
    expected = [row[:, 0] * sign for row, sign in zip(obs.items(), (1, -1, -1, 1))]
    assert [row.tolist() for row in actions["score"].items()] == [row.tolist() for row in expected]


def test_a_ragged_output_that_is_not_a_ragged_tensor_is_an_error_naming_it():
    ct, _, _ = served_cdp()
    ct.algorithm.predict = lambda inputs, states: (
        {"score": inputs["mines"].values[:, 0], "count": inputs["mines"].lengths},
        {},
    )
    with pytest.raises(SpecError, match=r"returned actions\['score'\] as a Tensor; its spec \(None,\) is ragged"):
        ct.predict({"mines": mines(1, 2), "robot": np.zeros((2, 3), np.float32)}, {})


def test_stored_steps_of_several_envs_become_ragged_sequences_that_learn_receives():
    ct, cdp, replies = served_cdp(learn_max_batch=2, learn_max_wait_ms=60_000)
    cdp.live = frozenset({"a"})
    steps = []
    for t in range(3):
        obs, nxt = mines(t, 1, start=100 * t), mines(1, t, start=100 * t + 50)
        steps.append(
            {
                "inputs": {"mines": obs, "robot": np.zeros((2, 3), np.float32)},
                "next_inputs": {"mines": nxt, "robot": np.zeros((2, 3), np.float32)},
                "actions": {"score": Ragged(obs.values[:, 0], obs.lengths), "count": obs.lengths.copy()},
                "rewards": {"reward": np.zeros(2, np.float32)},
                "states": {},
                "terminated": np.zeros(2, bool),
                "truncated": np.zeros(2, bool),
                "policy_version": np.zeros(2, np.int64),
            }
        )
    payload = pack(ct.specs, stack_steps(steps, ct.specs), 0)
    assert payload["inputs"]["mines"].lengths.tolist() == [[0, 1, 2], [1, 1, 1]]
    cdp.accept(Message(LEARN, decode(encode(payload)), "a", 1, "RL"), "a", 0.0, learn=True)
    batch = cdp.take_learn_batch(0.0, flush=True)
    assert batch is not None and not [m for _, m in replies if m.kind == ERROR]
    costs = ct.learn(unpack(ct.specs, batch.experience))
    learned = ct.algorithm.learned.inputs["mines"]
    assert isinstance(learned, RaggedTensor) and learned.shape == (2, 3)
    # Env 0: no mine at t=0, one at t=1 (100), two at t=2 (200, 201); env 1 one mine per step.
    assert learned.values[:, 0].tolist() == [100, 200, 201, 0, 101, 202]
    assert costs == {"items": 6.0}


class EchoCountPort:
    """Answers a one-env agent: a score per mine (its first feature) and the mine count."""

    learn_ahead = 0

    def send_predict(self, payload):
        mines_in = payload["inputs"]["mines"]
        self.reply = {
            "actions": {
                "score": Ragged(mines_in.values[:, 0].copy(), mines_in.lengths.copy()),
                "count": mines_in.lengths.copy(),
            },
            "states": {},
            "version": 3,
        }
        return 0

    def wait_predict(self, ticket):
        return self.reply


def test_a_one_env_agent_sends_its_entities_as_one_ragged_row_and_stores_them_so():
    specs = ComputationTask("RL", PerMine(EntityCounter()), device="cpu").specs
    agent, helper = Agent(), KeepingHelper()
    agent.connect(agent_id="a0", seed=0, specs={"RL": specs}, ports={"RL": EchoCountPort()}, helpers={"RL": helper})
    three_mines = np.array([[4, 0], [5, 0], [6, 0]], np.float64)
    actions, _ = agent.predict("RL", {"mines": three_mines, "robot": np.zeros(3, np.float32)})
    assert actions["score"].tolist() == [4, 5, 6] and actions["count"] == 3
    no_mines = np.zeros((0, 2))
    actions, _ = agent.predict("RL", {"mines": no_mines, "robot": np.zeros(3, np.float32)})
    assert actions["score"].tolist() == [] and actions["count"] == 0
    agent.store(
        "RL",
        inputs={"mines": three_mines, "robot": np.zeros(3)},
        next_inputs={"mines": no_mines, "robot": np.zeros(3)},
        actions={"score": np.array([4.0, 5.0, 6.0]), "count": 3},
        rewards={"reward": 1.0},
        terminated=True,
        truncated=False,
    )
    [step] = helper.steps
    assert step["inputs"]["mines"].lengths.tolist() == [3] and step["inputs"]["mines"].dtype == np.float32
    assert step["next_inputs"]["mines"].lengths.tolist() == [0] and step["actions"]["score"].lengths.tolist() == [3]


def test_the_replay_helper_refuses_ragged_specs_with_the_helper_that_takes_them():
    specs = ComputationTask("RL", PerMine(EntityCounter()), device="cpu").specs
    with pytest.raises(
        ConfigError,
        match=r"ExpReplayHelper keeps fixed-size arrays, but CT 'RL' has ragged "
        r"inputs\['mines'\], next_inputs\['mines'\], actions\['score'\]: learn from them with OnlineHelper",
    ):
        ExpReplayHelper(capacity=100, warmup=10).attach("RL", specs, port=None, num_envs=2)


def test_pad_rows_with_neither_parts_nor_a_first_token_says_what_it_needs():
    with pytest.raises(ValueError, match="needs ragged parts or a first token per row"):
        pad_rows([])
