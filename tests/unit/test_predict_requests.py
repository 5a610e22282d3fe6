"""Predict requests on the way to the CDP: each new frame crosses once, and the CT gets every view spelled out."""

from __future__ import annotations

import numpy as np
import pytest
from doubles import ATARI_SPECS

from flare2.core import predict_requests
from flare2.core.predict_requests import CONTINUED, VIEWS_OF, ViewsReceiver, ViewsSender
from flare2.core.specs import CTSpecs, Spec, View
from flare2.core.views import ViewRows
from flare2.errors import SpecError
from flare2.wire.codec import decode, encode

SMALL = (6, 5)  # frames of 6x5 instead of 84x84: the rules do not depend on the size
ENVS = 3


def specs() -> CTSpecs:
    return CTSpecs(
        inputs={"obs": Spec(SMALL, "uint8"), "obs_frames": Spec((4, *SMALL), "uint8")},
        actions={"action": Spec((), "int64")},
        states={},
        rewards={"reward": Spec((), "float32")},
        views={"obs_frames": View.last_observations(4)},
    )


def played(steps: int, starts: dict[int, set[int]]):
    """The predict payloads of ``ENVS`` envs playing ``steps`` steps as the stock agent builds them (``ViewRows``);
    at step t the envs of ``starts[t]`` start an episode."""
    rng = np.random.default_rng(0)
    rows = ViewRows(specs(), ENVS)
    obs = rng.integers(0, 256, (ENVS, *SMALL), dtype=np.uint8)
    rows.start_all({"obs": obs})
    payloads = []
    for t in range(steps):
        # Kept past the step (an agent sends them at once): copies, since the rows' views move on in place.
        views = {name: view.copy() for name, view in rows.current().items()}
        payloads.append({"inputs": {"obs": obs.copy(), **views}, "states": {}})
        obs = rng.integers(0, 256, (ENVS, *SMALL), dtype=np.uint8)
        rows.advance({"obs": obs}, {"action": np.zeros(ENVS, np.int64)}, {"reward": np.zeros(ENVS, np.float32)})
        for env in starts.get(t + 1, ()):
            rows.start(env, {"obs": obs[env]})
    return payloads


def crossed(payload):
    """The payload as it arrives on the other side of the wire."""
    return decode(encode(payload))


def test_rows_that_play_on_cross_as_a_flag_and_the_cdp_rebuilds_every_view_exactly():
    sender, receiver = ViewsSender(specs()), ViewsReceiver(specs())
    sizes = []
    for t, payload in enumerate(played(8, starts={3: {1}, 5: {0, 2}})):
        sent = sender.pack(payload)
        sizes.append(len(encode(sent)))
        if t == 0:
            assert not sent[CONTINUED].any()  # nothing to continue yet: every view crosses, for the CDP to keep
        else:
            restarted = {3: [1], 5: [0, 2]}.get(t, [])
            assert np.flatnonzero(~sent[CONTINUED]).tolist() == restarted
            assert len(sent["inputs"]["obs_frames"]) == len(restarted)
        spelled_out, _ = receiver.unpack("agent-1", crossed(sent))
        assert CONTINUED not in spelled_out
        for key, value in payload["inputs"].items():
            np.testing.assert_array_equal(spelled_out["inputs"][key], value)
    # From the second step on, where nothing restarted, each env's view crossed as a flag (its newest frame is the
    # observation, which crosses anyway): at least 3 frames an env fewer.
    assert sizes[1] < sizes[0] - ENVS * 3 * SMALL[0] * SMALL[1]


def test_views_a_custom_agent_made_otherwise_cross_whole_for_those_rows():
    sender, receiver = ViewsSender(specs()), ViewsReceiver(specs())
    first, second = played(2, starts={})
    second["inputs"]["obs_frames"][2, 0] = 99  # not the frame the row had before
    receiver.unpack("a", crossed(sender.pack(first)))
    sent = sender.pack(second)
    assert sent[CONTINUED].tolist() == [True, True, False]
    np.testing.assert_array_equal(
        receiver.unpack("a", crossed(sent))[0]["inputs"]["obs_frames"], second["inputs"]["obs_frames"]
    )


def acted(rows: ViewRows, sender: ViewsSender, receiver: ViewsReceiver, steps: int, starts: dict[int, set[int]]):
    """As an agent's port sends what ``rows`` hands out (and moves on only after the reply): for each step, what
    crossed, the views the agent had and what the CDP rebuilt (and which of them the CT takes as they are, and which of
    those it could write)."""
    rng = np.random.default_rng(1)
    obs = rng.integers(0, 256, (ENVS, *SMALL), dtype=np.uint8)
    rows.start_all({"obs": obs})
    steps_seen = []
    for t in range(steps):
        views = rows.current()
        sent = sender.pack({"inputs": {"obs": obs, **views}, "states": {}})
        spelled_out, own = receiver.unpack("a", crossed(sent))
        received = spelled_out["inputs"]["obs_frames"]
        own_and_writable = {name for name in own if spelled_out["inputs"][name].flags.writeable}
        # Copies: the views on both sides are valid until the next request.
        steps_seen.append((sent, views["obs_frames"].copy(), received.copy(), (own, own_and_writable)))
        obs = rng.integers(0, 256, (ENVS, *SMALL), dtype=np.uint8)
        rows.advance({"obs": obs}, {"action": np.zeros(ENVS, np.int64)}, {"reward": np.zeros(ENVS, np.float32)})
        for env in starts.get(t + 1, ()):
            rows.start(env, {"obs": obs[env]})
    return steps_seen


def test_views_the_agent_hands_out_say_which_rows_continue_so_nothing_is_compared(monkeypatch):
    # The rows that played on cross as a flag, found without comparing.
    monkeypatch.setattr(predict_requests, "_rows_equal", None)
    seen = acted(ViewRows(specs(), ENVS), ViewsSender(specs()), ViewsReceiver(specs()), 6, {3: {1}})
    for t, (sent, views, rebuilt, own) in enumerate(seen):
        np.testing.assert_array_equal(rebuilt, views)
        assert own == ({"obs_frames"}, set())  # views of the CDP's ring, read-only: the CT reads them as they are
        if t > 0:
            assert np.flatnonzero(~sent[CONTINUED]).tolist() == ([1] if t == 3 else [])
        else:
            assert not sent[CONTINUED].any()


def test_through_shared_memory_views_cross_as_they_are_and_the_cdp_keeps_nothing():
    rows, sender, receiver = ViewRows(specs(), ENVS), ViewsSender(specs(), whole=True), ViewsReceiver(specs())
    for sent, views, received, own in acted(rows, sender, receiver, 3, {2: {0}}):
        assert CONTINUED not in sent and own == (frozenset(), set())
        np.testing.assert_array_equal(received, views)
    assert not receiver._last


def test_views_that_skip_a_step_or_change_their_rows_cross_whole():
    rows, sender, receiver = ViewRows(specs(), ENVS), ViewsSender(specs()), ViewsReceiver(specs())
    acted(rows, sender, receiver, 2, {})
    obs = np.ones((ENVS, *SMALL), np.uint8)

    def sent(views):
        return sender.pack({"inputs": {"obs": obs, **views}, "states": {}})

    rows.current()  # handed out, never sent: the next views continue views the CDP does not hold
    rows.advance({"obs": obs}, {}, {})
    assert not sent(rows.current())[CONTINUED].any()
    rows.advance({"obs": obs}, {}, {})
    rows.regroup(np.array([2, 0, 1]), 0)
    assert not sent(rows.current())[CONTINUED].any()
    # A copy (or a concatenation, as evaluation rows make) says nothing: it is compared with the copies compared
    # before (none here, so every row crosses), on a stream of views of its own.
    rows.advance({"obs": obs}, {}, {})
    copied = sent({name: view.copy() for name, view in rows.current().items()})
    assert not copied[CONTINUED].any() and VIEWS_OF not in copied
    continuing = {"inputs": {"obs": obs, "obs_frames": np.zeros((0, 4, *SMALL), np.uint8)}, CONTINUED: np.ones(3, bool)}
    with pytest.raises(SpecError, match="holds none of this agent's"):
        receiver.unpack("b", continuing)


def test_two_halves_of_an_agents_envs_that_take_turns_each_continue_their_own_views():
    # Double-buffered envs: two ViewRows whose requests alternate through one port.
    sender, receiver = ViewsSender(specs()), ViewsReceiver(specs())
    rng = np.random.default_rng(2)
    halves, observations = [ViewRows(specs(), ENVS), ViewRows(specs(), ENVS)], []
    for rows in halves:
        observations.append(rng.integers(0, 256, (ENVS, *SMALL), dtype=np.uint8))
        rows.start_all({"obs": observations[-1]})
    for step in range(6):
        half = step % 2
        rows = halves[half]
        if step >= 2:  # the half played the step it asked for two requests ago
            observations[half] = rng.integers(0, 256, (ENVS, *SMALL), dtype=np.uint8)
            rows.advance({"obs": observations[half]}, {}, {})
        views = rows.current()
        sent = sender.pack({"inputs": {"obs": observations[half], **views}, "states": {}})
        assert sent[CONTINUED].all() == (step >= 2) and sent[VIEWS_OF] == 1 + half
        spelled_out, _ = receiver.unpack("a", crossed(sent))
        np.testing.assert_array_equal(spelled_out["inputs"]["obs_frames"], views["obs_frames"])


def test_atari_views_of_8_envs_cross_in_a_fifth_of_the_bytes():
    rows = ViewRows(ATARI_SPECS, 8)
    frames = [np.full((8, 84, 84), value, np.uint8) for value in range(3)]
    rows.start_all({"obs": frames[0]})
    sender = ViewsSender(ATARI_SPECS)
    sizes = []
    for obs in frames[1:]:
        rows.advance({"obs": obs}, {"action": np.zeros(8, np.int64)}, {"reward": np.zeros(8, np.float32)})
        sizes.append(len(encode(sender.pack({"inputs": {"obs": obs, **rows.current()}, "states": {}}))))
    whole, once = sizes
    assert whole > 5 * 8 * 84 * 84 and once < 8 * 84 * 84 + 1000


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda sent: sent.update({CONTINUED: sent[CONTINUED].astype(np.int64)}), "'continued' must be a 1-d bool"),
        (lambda sent: sent.update({CONTINUED: np.ones(5, bool)}), "continues the views of 5 rows, but the CT holds"),
        (lambda sent: sent["inputs"].update(obs=sent["inputs"]["obs"][:, :2]), "inputs['obs'] must be uint8 [3, ...]"),
        (lambda sent: sent["inputs"].update(obs_frames=np.zeros((2, 4, *SMALL), np.uint8)), "do not continue"),
        (lambda sent: sent.update({CONTINUED: np.zeros(3, bool)}), "must hold the views of every row when none"),
        (lambda sent: sent.update({VIEWS_OF: 65}), "'views_of' must be an int from 0 to 64, got 65"),
    ],
)
def test_a_request_that_continues_what_the_cdp_cannot_is_refused_naming_what_is_wrong(change, message):
    sender, receiver = ViewsSender(specs()), ViewsReceiver(specs())
    first, second = played(2, starts={})
    receiver.unpack("a", crossed(sender.pack(first)))
    sent = crossed(sender.pack(second))
    change(sent)
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("(", r"\(")):
        receiver.unpack("a", sent)


def test_an_agent_that_left_or_never_sent_its_views_cannot_continue_them():
    sender, receiver = ViewsSender(specs()), ViewsReceiver(specs())
    first, second = played(2, starts={})
    receiver.unpack("a", crossed(sender.pack(first)))
    receiver.forget({"a"})
    sent = crossed(sender.pack(second))
    with pytest.raises(SpecError, match="holds none of this agent's"):
        receiver.unpack("a", sent)
    with pytest.raises(SpecError, match="holds none of this agent's"):
        receiver.unpack("b", sent)
