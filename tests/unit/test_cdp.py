"""The CDP without sockets: what it refuses, what it drops when an agent leaves, and how a failing predict() ends."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from doubles import Scale, learn_payload

from flare2.core.algorithm import Algorithm
from flare2.core.computation_task import ComputationTask
from flare2.core.learn_requests import unpack
from flare2.core.predict_requests import ViewsSender
from flare2.errors import ConfigError, UserCodeError
from flare2.runtime.compute.cdp import ComputationDataProcessor
from flare2.runtime.compute.learn_calls import Learned
from flare2.runtime.config import BatchingConfig
from flare2.wire.protocol import ERROR, LEARN, PREDICT, PREDICTION, Message
from flare2.zoo.ppo import PPO, PPOActorCritic


class Scaler(Algorithm):
    """Scales its input; a row of 13s makes predict() raise, a row of 7s makes it return the wrong shape."""

    def predict(self, inputs, states):
        x = inputs["x"]
        if (x == 13).any():
            raise ValueError("thirteen brings bad luck")
        if (x == 7).any():
            return {"y": x[:, :1]}, {}
        return {"y": x * self.model.scale}, {}

    def learn(self, experience):
        return {"sequences": experience.inputs["x"].shape[0]}


class Served:
    def __init__(self, **batching) -> None:
        self.ct = ComputationTask("RL", Scaler(Scale()), device="cpu")
        self.replies: list[tuple[str, bool, Message]] = []
        self.cdp = ComputationDataProcessor(
            self.ct,
            config=BatchingConfig(**batching),
            reply=lambda to, learn, message: self.replies.append((to, learn, message)),
        )
        self.seq = 0

    def predict(self, agent: str, x) -> None:
        self.seq += 1
        payload = {"inputs": {"x": np.asarray(x, np.float32)}, "states": {}}
        self.cdp.accept(Message(PREDICT, payload, agent, self.seq, "RL"), agent, 0.0, learn=False)

    def learn(self, agent: str, fill: float = 0.0) -> None:
        self.seq += 1
        payload = learn_payload(2, 3, fill=fill)
        self.cdp.accept(Message(LEARN, payload, agent, self.seq, "RL"), agent, 0.0, learn=True)

    def replies_to(self, agent: str) -> list[Message]:
        return [message for to, _, message in self.replies if to == agent]


def test_a_learn_request_holding_nan_or_infinity_is_refused_naming_the_array():
    served = Served()
    served.cdp.live = frozenset({"a"})
    served.learn("a", fill=np.nan)
    served.learn("a", fill=np.inf)
    [nan_reply, inf_reply] = served.replies_to("a")
    for reply in (nan_reply, inf_reply):
        assert reply.kind == ERROR and reply.payload["code"] == "spec"
        assert "inputs['x'] holds NaN or infinity" in reply.payload["reason"]
    assert served.cdp.stats.rejected == 2 and served.cdp.stats.learned_requests == 0
    assert served.cdp.take_learn_batch(1e9, flush=True) is None


def test_the_queued_requests_of_an_agent_that_left_are_discarded_never_served_or_learned():
    served = Served(max_batch=8, max_wait_ms=60_000, learn_max_wait_ms=60_000)
    served.cdp.live = frozenset({"a", "b", "c"})
    served.predict("a", [[1, 1]])
    served.predict("b", [[2, 2]])
    served.learn("b")
    served.learn("a")
    served.cdp.live = frozenset({"a", "c"})  # b died: the manager's next LIVE set leaves it out
    assert served.cdp.stats.discarded == 2

    served.cdp.serve_predictions(1e9)
    batch = served.cdp.take_learn_batch(1e9, flush=True)
    assert [request.agent_id for request in batch.requests] == ["a"]
    assert unpack(served.cdp.ct.specs, batch.experience)["inputs"]["x"].shape == (2, 3, 2)
    [reply] = served.replies_to("a")
    assert reply.kind == PREDICTION and reply.payload["actions"]["y"].tolist() == [[2.0, 2.0]]
    assert served.replies_to("b") == []


def test_a_predict_that_raises_answers_every_requester_of_the_batch_and_stops_the_run():
    served = Served(max_batch=8, max_wait_ms=0)
    served.cdp.live = frozenset({"a", "b"})
    served.predict("a", [[1, 1]])
    served.predict("b", [[13, 13]])
    with pytest.raises(UserCodeError, match="thirteen brings bad luck"):
        served.cdp.serve_predictions(0.0)
    for agent in ("a", "b"):
        [reply] = served.replies_to(agent)
        assert reply.kind == ERROR and reply.payload["code"] == "user_code"
        assert "predict of CT 'RL' raised in the compute process" in reply.payload["reason"]
        assert "ValueError: thirteen brings bad luck" in reply.payload["traceback"]


def test_a_predict_that_returns_the_wrong_shape_is_named_with_the_spec():
    served = Served(max_batch=8, max_wait_ms=0)
    served.cdp.live = frozenset({"a"})
    served.predict("a", [[7, 7]])
    with pytest.raises(
        UserCodeError, match=r"Scaler.predict returned actions\['y'\] with shape \(1, 1\).*shape \(1, 2\)"
    ):
        served.cdp.serve_predictions(0.0)


def test_a_learn_request_that_overtakes_the_managers_word_waits_for_it_and_is_then_learned():
    # Over a local stream an agent's first learn request can arrive before the LIVE update that names it.
    served = Served(learn_max_batch=1)
    served.cdp.live = frozenset({"b"})
    served.learn("a")
    assert served.replies_to("a") == [] and served.cdp.take_learn_batch(0.0) is None
    served.cdp.live = frozenset({"a", "b"})
    batch = served.cdp.take_learn_batch(0.0)
    assert batch is not None and [request.agent_id for request in batch.requests] == ["a"]
    assert served.replies_to("a") == []


def test_learn_requests_are_counted_with_the_call_that_learned_them_not_as_they_arrive():
    # With a learner process a call ends long after its requests came: cts.csv's requests per call reads both counts.
    served = Served()
    served.cdp.live = frozenset({"a", "b"})
    served.learn("a")
    served.learn("b")
    batch = served.cdp.take_learn_batch(1e9)
    assert batch is not None and served.cdp.stats.take_report()["learned_requests"] == 0
    served.ct.learn_calls += 1  # as the learner's call does
    served.cdp.learned(batch, Learned({}, 0, 0, 0.0))
    report = served.cdp.stats.take_report()
    assert (report["learned_requests"], report["learn_calls"]) == (2, 1)


def test_a_learn_request_of_an_agent_never_named_is_refused_after_the_grace_period_or_past_the_holding_limit():
    served = Served()
    for _ in range(16):
        served.learn("stranger")
    assert served.replies_to("stranger") == []
    served.learn("stranger")  # the seventeenth finds no room
    [refused] = served.replies_to("stranger")
    assert refused.kind == ERROR and refused.payload["code"] == "config"
    assert "agent 'stranger' is not registered with the manager" in refused.payload["reason"]
    served.cdp.refuse_overdue(9.9)
    assert len(served.replies_to("stranger")) == 1
    served.cdp.refuse_overdue(10.0)
    assert len(served.replies_to("stranger")) == 17
    assert served.cdp.stats.rejected == 17


def test_predict_requests_that_continue_their_views_are_served_and_one_that_cannot_is_refused_alone():
    space = gym.spaces.Box(0, 255, (10, 10), np.uint8)
    ct = ComputationTask("RL", PPO(PPOActorCritic(space, gym.spaces.Discrete(3), frames=2, hidden=())), device="cpu")
    replies: list[tuple[str, Message]] = []
    cdp = ComputationDataProcessor(ct, reply=lambda to, learn, message: replies.append((to, message)))
    sender = ViewsSender(ct.specs)
    frames = [np.full((2, 10, 10), value, np.uint8) for value in range(3)]
    views = np.zeros((2, 2, 10, 10), np.uint8)
    for seq, obs in enumerate(frames, start=1):
        views = np.concatenate([views[:, 1:], obs[:, None]], axis=1)
        sent = sender.pack({"inputs": {"obs": obs, "obs_frames": views.copy()}, "states": {}})
        for agent in ("a", "b") if seq == 3 else ("a",):
            # "b" never sent the views that the third request continues.
            cdp.accept(Message(PREDICT, sent, agent, seq, "RL"), agent, 0.0, learn=False)
            cdp.serve_predictions(0.0)
    kinds = [(to, message.kind) for to, message in replies]
    assert kinds == [("a", PREDICTION), ("a", PREDICTION), ("a", PREDICTION), ("b", ERROR)]
    assert "holds none of this agent's" in replies[-1][1].payload["reason"]


def test_a_frozen_copy_takes_its_cts_weights_at_the_start_and_after_every_n_of_its_updates():
    import torch

    from flare2.runtime.compute.cdp import LearnBatch
    from flare2.runtime.compute.frozen_copies import follow
    from flare2.runtime.config import CTConfig

    def scaler():
        return Scaler(Scale())

    leader, frozen = ComputationTask("RL", scaler(), device="cpu"), ComputationTask("opponent", scaler(), device="cpu")
    cdps = [ComputationDataProcessor(ct, reply=lambda *_: None) for ct in (leader, frozen)]
    configs = [CTConfig("RL", scaler), CTConfig("opponent", scaler, follows="RL", refresh_every=2)]
    with torch.no_grad():
        leader.algorithm.model.scale.fill_(3.0)
    follow(cdps, configs, seed=0)
    assert frozen.algorithm.model.scale.item() == 3.0
    seen = []
    for update in range(1, 6):
        # An update of the leader: new weights, the next version, then the batch's replies.
        leader.adopt_weights([torch.tensor(3.0 + update), torch.tensor(0)], learn_calls=update)
        cdps[0].learned(LearnBatch(cdps[0], [], {}), Learned({}, 0, 0, 0.0))
        seen.append(frozen.algorithm.model.scale.item())
    assert seen == [3.0, 5.0, 5.0, 7.0, 7.0]  # refreshed after the leader's 2nd and 4th updates


def test_a_frozen_copy_with_a_pool_plays_one_of_a_uniform_sample_of_all_the_copies_taken():
    import torch

    from flare2.runtime.compute.cdp import LearnBatch
    from flare2.runtime.compute.frozen_copies import follow
    from flare2.runtime.config import CTConfig

    def scaler():
        return Scaler(Scale())

    leader, frozen = ComputationTask("RL", scaler(), device="cpu"), ComputationTask("opponent", scaler(), device="cpu")
    cdps = [ComputationDataProcessor(ct, reply=lambda *_: None) for ct in (leader, frozen)]
    configs = [CTConfig("RL", scaler), CTConfig("opponent", scaler, follows="RL", refresh_every=1, snapshots=4)]
    with torch.no_grad():
        leader.algorithm.model.scale.fill_(0.0)
    follow(cdps, configs, seed=0)
    pool = cdps[0].followers[0].pool
    played = []
    for update in range(1, 400):
        leader.adopt_weights([torch.tensor(float(update)), torch.tensor(0)], learn_calls=update)
        cdps[0].learned(LearnBatch(cdps[0], [], {}), Learned({}, 0, 0, 0.0))
        kept = sorted(snapshot[0].item() for snapshot in pool)
        assert len(kept) == len(set(kept)) == min(4, update + 1)  # copies, not views of the changing weights
        assert frozen.algorithm.model.scale.item() in kept
        played.append(frozen.algorithm.model.scale.item())
    # Each copy stays in the pool with the same chance, 4 in the copies taken: the early ones as well as the late.
    assert min(kept) < 200 < max(kept)
    assert np.mean(np.array(played) < np.arange(1, 400)) > 0.5  # mostly a past copy, not the newest
    with pytest.raises(ConfigError, match="snapshots is how many past weights"):
        CTConfig("opponent", scaler, follows="RL", refresh_every=1, snapshots=0)


def test_a_ct_may_follow_only_a_ct_of_the_run_that_learns():
    import pytest

    from flare2.errors import ConfigError
    from flare2.runtime.config import CTConfig

    def scaler():
        return Scaler(Scale())

    with pytest.raises(ConfigError, match="follows and refresh_every together"):
        CTConfig("opponent", scaler, follows="RL")
    from flare2.runtime.config import AgentConfig, RunConfig

    with pytest.raises(ConfigError, match="follows 'nobody', which is not a CT of the run that learns"):
        RunConfig(
            cts=(CTConfig("RL", scaler), CTConfig("opponent", scaler, follows="nobody", refresh_every=1)),
            agents=AgentConfig("flare2.core.envs:GymAgent"),
            max_steps=10,
        )
