"""ExpReplayHelper: bounded memory, warm-up and sample interval, sequences that keep the episode flags."""

from __future__ import annotations

import numpy as np
import pytest
from doubles import received

from flare2.core.helpers import ROW_IDS
from flare2.core.replay import ExpReplayHelper
from flare2.core.specs import CTSpecs, Spec
from flare2.errors import ConfigError

SPECS = CTSpecs(
    inputs={"obs": Spec((2,), "float32")},
    actions={"action": Spec((), "int64")},
    states={"h": Spec((3,), "float32")},
    rewards={"reward": Spec((), "float32")},
)


class RecordingPort:
    def __init__(self) -> None:
        self.learned: list[dict] = []

    def predict(self, payload):
        raise AssertionError("not used")

    def learn(self, payload):
        self.learned.append(received(SPECS, payload))


def step(t: int, terminated: bool = False, truncated: bool = False) -> dict:
    """Step number t of one env (a row of 1), recognisable in every array."""
    return {
        "inputs": {"obs": np.array([[t, t]], np.float32)},
        "next_inputs": {"obs": np.array([[t + 1, t + 1]], np.float32)},
        "actions": {"action": np.array([t], np.int64)},
        "rewards": {"reward": np.array([t], np.float32)},
        "states": {"h": np.full((1, 3), t, np.float32)},
        "terminated": np.array([terminated]),
        "truncated": np.array([truncated]),
        "policy_version": np.array([t], np.int64),
    }


def helper(**options) -> tuple[ExpReplayHelper, RecordingPort]:
    port = RecordingPort()
    replay = ExpReplayHelper(
        **{"capacity": 10, "warmup": 4, "sample_interval": 100, "batch_size": 64, "seed": 0, **options}
    )
    replay.attach("RL", SPECS, port)
    return replay, port


def test_sequences_are_consecutive_steps_and_keep_where_and_how_episodes_ended():
    replay, _ = helper(sequence_length=4)
    for t in range(10):
        replay.store(step(t, terminated=t == 3, truncated=t == 7))
    sample = received(SPECS, replay.sample(200))
    actions = sample["actions"]["action"]
    assert actions.shape == (200, 4)
    assert (np.diff(actions, axis=1) == 1).all()  # consecutive in time
    np.testing.assert_array_equal(sample["terminated"], actions == 3)
    np.testing.assert_array_equal(sample["truncated"], actions == 7)
    np.testing.assert_array_equal(sample["states"]["h"][..., 0], actions)
    # Some sequences run across an episode end, with the flag in the middle.
    assert sample["terminated"][:, :-1].any()


def test_a_full_buffer_keeps_the_newest_steps_and_never_wraps_a_sequence_from_newest_to_oldest():
    replay, _ = helper(sequence_length=3)
    for t in range(25):
        replay.store(step(t))
    actions = received(SPECS, replay.sample(500))["actions"]["action"]
    assert actions.min() == 15 and actions.max() == 24
    assert (np.diff(actions, axis=1) == 1).all()


def test_learning_starts_after_warmup_and_then_comes_every_sample_interval_steps():
    replay, port = helper(warmup=5, sample_interval=2, batch_size=8, sequence_length=2)
    calls_after = []
    for t in range(12):
        before = len(port.learned)
        replay.store(step(t))
        if len(port.learned) > before:
            calls_after.append(t + 1)
    assert calls_after == [6, 8, 10, 12]
    assert port.learned[0]["inputs"]["obs"].shape == (8, 2, 2)


def test_memory_is_preallocated_and_stated():
    replay, _ = helper(capacity=1000, warmup=10)
    # obs once, action, reward, state, two flags, policy version, whether the next obs is kept apart
    per_step = 4 * 2 + 8 + 4 + 4 * 3 + 2 + 8 + 1
    # and, per env, its newest next obs, its next row and its step count
    per_env = 4 * 2 + 8 + 8
    assert replay.nbytes == 1000 * per_step + per_env


@pytest.mark.parametrize(
    "options", [{"capacity": 0}, {"warmup": 20, "capacity": 10}, {"sequence_length": 8, "warmup": 4}]
)
def test_impossible_settings_are_refused(options):
    with pytest.raises(ConfigError):
        ExpReplayHelper(**{"capacity": 10, "warmup": 4, **options})


def test_sequences_of_several_envs_are_consecutive_steps_of_one_env():
    port = RecordingPort()
    replay = ExpReplayHelper(capacity=30, warmup=6, sample_interval=3, batch_size=4, sequence_length=3, seed=0)
    replay.attach("RL", SPECS, port, num_envs=3)
    for t in range(12):
        # Env e at time t carries the value 100 * e + t in every array.
        rows = [step(100 * env + t) for env in range(3)]
        replay.store(
            {
                group: {key: np.concatenate([row[group][key] for row in rows]) for key in rows[0][group]}
                if isinstance(rows[0][group], dict)
                else np.concatenate([row[group] for row in rows])
                for group in rows[0]
            }
        )
    # 3 env steps per store and one request per 3 steps, once 6 are stored and each env holds a sequence.
    assert len(port.learned) == 10 and port.learned[0]["actions"]["action"].shape == (4, 3)
    actions = received(SPECS, replay.sample(300))["actions"]["action"]
    assert (np.diff(actions, axis=1) == 1).all()
    assert set(np.unique(actions[:, 0] // 100)) == {0, 1, 2}
    # Each step's next observation is the following one's: only the newest step's is kept beside them.
    assert replay.nbytes == 10 * 3 * (4 * 2 + 8 + 4 + 4 * 3 + 2 + 8 + 1) + 3 * (4 * 2 + 8 + 8)


def rows_of(steps: list[dict], row_ids: list[int]) -> dict:
    """One stored step of the rows ``steps`` (each a row of 1), with their ids."""
    joined = {
        group: {key: np.concatenate([row[group][key] for row in steps]) for key in steps[0][group]}
        if isinstance(steps[0][group], dict)
        else np.concatenate([row[group] for row in steps])
        for group in steps[0]
    }
    return {**joined, ROW_IDS: np.array(row_ids, np.int64)}


def test_rows_that_come_and_go_each_fill_their_own_column():
    # Turns of a two-seat game: the seat of id 7 acts at even times, the seat of id 3 at odd ones, then both at once;
    # id 9 acts at every third time alone. Each row carries 100 * its id + the count of its own steps, and its
    # episodes end every 5 of its steps, the final observation (-value) kept apart.
    replay, _ = helper(capacity=120, warmup=4, sequence_length=3)
    replay.attach("RL", SPECS, RecordingPort(), num_envs=3)
    counts = {7: 0, 3: 0, 9: 0}
    for t in range(60):
        ids = [7] if t % 2 == 0 else [3]
        ids = [*ids, 9] if t % 3 == 0 else ids
        rows = []
        for row_id in ids:
            value = 100 * row_id + counts[row_id]
            row = step(value, terminated=counts[row_id] % 5 == 4)
            if counts[row_id] % 5 == 4:
                row["next_inputs"]["obs"] = np.array([[-value, -value]], np.float32)
            rows.append(row)
            counts[row_id] += 1
        replay.store(rows_of(rows, ids))
    assert replay.sizes.tolist() == [30, 20, 30]  # columns in the order the ids came: 7, 9, 3
    sample = received(SPECS, replay.sample(600))
    obs, following = sample["inputs"]["obs"][..., 0], sample["next_inputs"]["obs"][..., 0]
    assert (np.diff(obs, axis=1) == 1).all()
    assert set(np.unique(obs[:, 0] // 100)) == {3, 7, 9}
    np.testing.assert_array_equal(following, np.where(obs % 5 == 4, -obs, obs + 1))
    np.testing.assert_array_equal(sample["terminated"], obs % 5 == 4)
    # Drawn uniformly among the sequences: 28, 28 and 18 of them.
    share = np.mean(obs[:, 0] // 100 == 9)
    assert abs(share - 18 / 74) < 0.06


def test_more_row_ids_than_columns_or_a_step_without_every_env_is_refused():
    replay, _ = helper(warmup=4)
    replay.attach("RL", SPECS, RecordingPort(), num_envs=2)
    replay.store(rows_of([step(0), step(1)], [5, 6]))
    with pytest.raises(ConfigError, match="CT 'RL' keeps 2 columns, one per row id, and row id 8 is one more"):
        replay.store(rows_of([step(2)], [8]))
    with pytest.raises(ConfigError, match="a step of 1 rows without 'row_ids' reached the replay buffer of CT 'RL'"):
        replay.store(step(3))
    with pytest.raises(ConfigError, match="ExpReplayHelper needs each step's 'row_ids' as an int array of one id per"):
        replay.store({**step(4), ROW_IDS: [5]})


@pytest.mark.parametrize("capacity", [40, 9])
def test_the_final_observation_of_an_episode_is_kept_apart_and_sampled_as_its_steps_next(capacity):
    # Episodes of 4 steps: observation (t, t) and, after the last step, the final observation (-t, -t) where
    # a reset made the next step's (t + 1, t + 1). capacity 9 goes round the buffer several times.
    replay, _ = helper(capacity=capacity, warmup=4, sequence_length=2)
    for t in range(30):
        ends = t % 4 == 3
        row = step(t, terminated=ends)
        if ends:
            row["next_inputs"]["obs"] = np.array([[-t, -t]], np.float32)
        replay.store(row)
    sample = received(SPECS, replay.sample(300))
    obs, following = sample["inputs"]["obs"][..., 0], sample["next_inputs"]["obs"][..., 0]
    expected = np.where(obs % 4 == 3, -obs, obs + 1)
    np.testing.assert_array_equal(following, expected)
    assert (obs % 4 == 3).any() and (obs == 29).any()
    # Only the finals of the steps still in the buffer are kept, one per episode end (the newest step, 29, ends none).
    stored = replay._buffers["inputs"]["obs"][: replay.sizes[0], 0, 0]
    assert len(replay._finals) == np.count_nonzero(stored % 4 == 3)


def test_a_hundred_thousand_atari_steps_take_the_frames_once():
    specs = CTSpecs(
        inputs={"obs": Spec((84, 84), "uint8")},
        actions={"action": Spec((), "int64")},
        states={},
        rewards={"reward": Spec((), "float32")},
    )
    replay = ExpReplayHelper(capacity=100_000, warmup=1_000, sample_interval=4, batch_size=32)
    replay.attach("RL", specs, RecordingPort(), num_envs=8)
    # 7,056 bytes of frame, 8 of action, 4 of reward, 10 of flags, 1 to say whether the next frame is kept apart;
    # and each env's newest next frame, its next row and its step count.
    assert replay.nbytes == 100_000 * (84 * 84 + 8 + 4 + 10 + 1) + 8 * (84 * 84 + 8 + 8)
