"""Pixels: env ids of packages that register on import, the published Atari preprocessing, image specs and CNNs."""

from __future__ import annotations

import dataclasses
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import torch
from doubles import ATARI_SPECS, KeepingHelper
from extras import skip_without

from flare2.core import env_making
from flare2.core.env_making import LEARNING_EPISODE_ENDS, check_env_id, is_atari, make_gym_env
from flare2.core.envs import GymAgent
from flare2.core.spaces import input_specs
from flare2.errors import ConfigError
from flare2.runtime.agents.playing import StopRequested, make_envs
from flare2.zoo.encoders import ImageEncoder, image_layout
from flare2.zoo.models import ActorCritic, QNetwork
from flare2.zoo.registry import lookup

skip_without("atari", "ale_py", "cv2")


def test_atari_and_minatar_ids_work_once_their_package_is_installed_and_a_wrong_one_names_the_close_ones():
    check_env_id("ALE/Breakout-v5")
    check_env_id("BreakoutNoFrameskip-v4")
    with pytest.raises(ConfigError, match="did you mean ALE/Breakout-v5"):
        check_env_id("ALE/Breakot-v5")
    assert is_atari("ALE/Pong-v5") and is_atari("PongNoFrameskip-v4") and not is_atari("CartPole-v1")
    skip_without("minatar", "minatar")
    check_env_id("MinAtar/Breakout-v1")


def test_an_id_of_a_namespace_whose_package_is_missing_names_the_package_and_the_extra(monkeypatch):
    monkeypatch.setitem(env_making.ENV_PACKAGES, "Nowhere", ("no_such_package_here", None))
    monkeypatch.setitem(env_making.ENV_EXTRAS, "Nowhere", (("no_such_package_here",), "nowhere"))
    with pytest.raises(
        ConfigError,
        match=r"'Nowhere/Game-v0' needs no_such_package_here, which flare2's nowhere extra installs: "
        r'pip install "flare2\[nowhere\]"',
    ):
        make_gym_env("Nowhere/Game-v0")


def test_the_module_of_a_module_id_that_does_not_import_is_named_without_a_traceback():
    with pytest.raises(ConfigError, match=r"'no_such_module_xyz:MyEnv-v0': it imports 'no_such_module_xyz', which is"):
        make_gym_env("no_such_module_xyz:MyEnv-v0")


def test_atari_games_come_preprocessed_as_bytes_and_raw_on_request():
    env = make_gym_env("ALE/Breakout-v5")
    assert env.observation_space == gym.spaces.Box(0, 255, (84, 84), np.uint8)
    observation, _ = env.reset(seed=0)
    assert observation.dtype == np.uint8 and observation.shape == (84, 84)
    assert input_specs(env.observation_space)["obs"].dtype == "uint8"
    raw = make_gym_env("ALE/Breakout-v5", preprocessing=False)
    assert raw.observation_space.shape == (210, 160, 3)


def test_a_lost_life_ends_the_episode_for_learning_while_the_return_reported_is_the_whole_games():
    agent = GymAgent("ALE/Breakout-v5")
    agent.num_envs = 2
    stats = make_envs(agent, 0)
    helper = KeepingHelper()
    rng = np.random.default_rng(0)

    class RandomPort:
        learn_ahead = 0

        def __init__(self) -> None:
            self.asked = 0

        def send_predict(self, payload):
            self.asked += 1
            return self.asked

        def wait_predict(self, ticket):
            if ticket > 700:
                raise StopRequested()
            return {"actions": {"action": rng.integers(0, 4, 2)}, "states": {}, "version": 0}

    spec = lookup("ppo").preset("ALE/Breakout-v5")
    assert spec["agent"]["frames"] == 4 and spec["run"]["clip_rewards"] == 1.0
    agent.connect(agent_id="a0", seed=0, specs={"RL": ATARI_SPECS}, ports={"RL": RandomPort()}, helpers={"RL": helper})
    with pytest.raises(StopRequested):
        agent.run()
    terminated = np.stack([step["terminated"] for step in helper.steps])
    games = stats.take()["episodes"]
    # Five lives a game: learning saw an episode end at each lost life, the report one return per whole game.
    assert games and terminated.sum() >= 4 * len(games)
    assert all(length > 50 for _, length in games)


@pytest.mark.parametrize(
    "shape, dtype, frames, kind",
    [
        ((84, 84), np.uint8, 4, "nature"),
        ((64, 64, 3), np.uint8, 1, "nature"),
        ((3, 64, 64), np.uint8, 2, "nature"),
        ((10, 10, 4), np.bool_, 1, "minatar"),
    ],
)
def test_image_observations_get_a_cnn_chosen_from_their_size_and_layout(shape, dtype, frames, kind):
    space = gym.spaces.Box(0, 1 if dtype == np.bool_ else 255, shape, dtype)
    encoder = ImageEncoder(image_layout(space), frames=frames)
    assert encoder.kind == kind
    batch = torch.zeros(
        (5, 3, *((frames,) if frames > 1 else ()), *shape), dtype=torch.from_numpy(np.zeros(1, dtype)).dtype
    )
    assert encoder(batch).shape == (5, 3, encoder.features)


def as_floats_in_0_1(encoder: ImageEncoder) -> ImageEncoder:
    """The same network (its weights) over pixels that are floats in [0, 1] already."""
    layout = dataclasses.replace(encoder.layout, pixel_scale=1.0)
    same = ImageEncoder(layout, encoder.kind, frames=encoder.frames)
    same.load_state_dict(encoder.state_dict())
    return same


@pytest.mark.parametrize("kind", ["nature", "impala", "minatar"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pixels_reach_the_network_scaled_to_one_whatever_the_layout(kind, seed):
    torch.manual_seed(seed)
    # Equal up to float rounding: the scale meets the weights, not the pixels, before the sums.
    close = partial(torch.testing.assert_close, rtol=1e-4, atol=1e-4)
    gray = ImageEncoder(image_layout(gym.spaces.Box(0, 255, (40, 40), np.uint8)), kind)
    white = torch.full((2, 40, 40), 255, dtype=torch.uint8)
    close(gray(white), as_floats_in_0_1(gray)(torch.ones(2, 40, 40)))
    last = ImageEncoder(image_layout(gym.spaces.Box(0, 255, (40, 40, 3), np.uint8)), kind)
    image = torch.randint(0, 256, (2, 40, 40, 3), dtype=torch.uint8)
    close(last(image), as_floats_in_0_1(last)(image.float() / 255))
    # Their gradients too: the weights learn as over the scaled pixels. In float64, where rounding all but never tips a
    # max-pool or a ReLU between two nearly equal values and so sends a gradient down another path.
    last, scaled = last.double(), as_floats_in_0_1(last).double()
    last(image).sum().backward()
    scaled(image.double() / 255).sum().backward()
    for mine, reference in zip(last.parameters(), scaled.parameters()):
        torch.testing.assert_close(mine.grad, reference.grad)


def test_an_image_too_small_for_the_nature_network_or_an_unknown_encoder_is_refused_naming_the_choices():
    small = gym.spaces.Box(0, 1, (10, 10, 4), np.bool_)
    with pytest.raises(ConfigError, match="at least 36 pixels a side.*use --encoder minatar or impala"):
        ImageEncoder(image_layout(small), "nature")
    with pytest.raises(ConfigError, match="--encoder 'resnet' is no image encoder: use one of auto, nature"):
        ActorCritic(small, gym.spaces.Discrete(3), encoder="resnet")


def test_every_zoo_model_of_discrete_actions_takes_atari_frames():
    env = make_gym_env("ALE/Breakout-v5")
    frames = torch.zeros((6, 4, 84, 84), dtype=torch.uint8)
    actor_critic = ActorCritic(env.observation_space, env.action_space, hidden=(), frames=4)
    assert actor_critic.policy({"obs_frames": frames}).shape == (6, 4)
    q = QNetwork(env.observation_space, env.action_space, hidden=(), frames=4)
    assert q({"obs_frames": frames}).shape == (6, 4) and q.input_names == ("obs_frames",)
    # Mnih et al.'s DQN: 1.69M parameters over 4 actions.
    assert sum(p.numel() for p in q.parameters()) == 1_686_180
    impala = ActorCritic(env.observation_space, env.action_space, hidden=(), frames=4, encoder="impala")
    assert impala.value({"obs_frames": frames}).shape == (6,)


def test_policy_and_value_pass_the_frames_through_the_cnn_once_unless_a_subclass_has_a_head_of_its_own():
    env = make_gym_env("ALE/Breakout-v5")
    inputs = {"obs_frames": torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)}
    model = ActorCritic(env.observation_space, env.action_space, hidden=(), frames=4)
    passes = []
    model.observation.register_forward_hook(lambda *_: passes.append(1))
    policy, value = model.policy_and_value(inputs)
    assert len(passes) == 1
    torch.testing.assert_close(policy, model.policy(inputs))
    torch.testing.assert_close(value, model.value(inputs))

    class OwnPolicy(ActorCritic):
        def policy(self, inputs):
            return torch.zeros(len(inputs["obs_frames"]), 4)

    own = OwnPolicy(env.observation_space, env.action_space, hidden=(), frames=4)
    assert torch.equal(own.policy_and_value(inputs)[0], torch.zeros(5, 4))


def test_atari_games_take_their_algorithms_atari_preset_whatever_the_id():
    for env_id in ("ALE/Pong-v5", "PongNoFrameskip-v4"):
        ppo = lookup("ppo").preset(env_id)
        assert ppo["algorithm"]["clip"] == 0.1 and ppo["agent"]["sample_interval"] == 128
        assert lookup("dqn").preset(env_id)["agent"]["frames"] == 4
        # PPO's preset waits for learn(); APPO's learns beside the acting, in a thread on the compute process's cores.
        assert ppo["run"]["learner"] == "inline" and lookup("appo").preset(env_id)["run"]["learner"] == "thread"
    assert "frames" not in lookup("ppo").preset("Acrobot-v1")["agent"]
    skip_without("minatar", "minatar")
    assert lookup("ppo").preset("MinAtar/Breakout-v1")["algorithm"]["epochs"] == 3
    assert lookup("dqn").preset("MinAtar/Asterix-v1")["agent"]["warmup"] == 5_000


def test_a_lost_life_flag_is_what_atari_lives_sets_and_the_game_plays_on():
    env = make_gym_env("ALE/Breakout-v5")
    env.reset(seed=3)
    rng = np.random.default_rng(3)
    for _ in range(2000):
        _, _, terminated, truncated, info = env.step(int(rng.integers(4)))
        if info.get(LEARNING_EPISODE_ENDS):
            assert not terminated and not truncated and info["lives"] == 4
            return
    pytest.fail("no life was lost in 2000 random steps")


def test_recurrent_ppo_puts_a_cnn_under_its_memories_for_images():
    from flare2.zoo.recurrent import GRUActorCritic

    space = gym.spaces.Box(0, 1, (10, 10, 4), np.bool_)
    model = GRUActorCritic(space, gym.spaces.Discrete(3), hidden_size=16)
    assert model.encoder is not None and model.encoder.kind == "minatar" and model.obs_norm is None
    obs = torch.zeros((5, 7, 10, 10, 4), dtype=torch.bool)
    logits, values, after = model.sequence(obs, torch.zeros(5, 32), torch.zeros(5, 7, dtype=torch.bool))
    assert logits.shape == (5, 7, 3) and values.shape == (5, 7) and after.shape == (5, 7, 32)
    assert model.next_values(obs, after).shape == (5, 7)
    model.update_normalizer(obs, 2)  # nothing to count for images


def test_an_observation_of_an_image_and_vectors_goes_through_a_cnn_and_an_mlp_side_by_side():
    space = gym.spaces.Dict(
        {
            "pixels": gym.spaces.Box(0, 255, (40, 40, 3), np.uint8),
            "speed": gym.spaces.Box(-1, 1, (2,), np.float32),
            "action_mask": gym.spaces.MultiBinary(3),
        }
    )
    model = ActorCritic(space, gym.spaces.Discrete(3), hidden=(16,), frames=2)
    assert set(model.input_specs()) == {"pixels", "speed", "action_mask"}
    assert model.input_specs()["pixels"].dtype == "uint8"
    assert set(model.view_specs()) == {"pixels_frames", "speed_frames"}
    # The Nature CNN's 512 features of the two stacked images, then both speeds.
    assert model.observation.size == 512 + 2 * 2
    inputs = {
        "pixels_frames": torch.zeros((5, 2, 40, 40, 3), dtype=torch.uint8),
        "speed_frames": torch.zeros((5, 2, 2)),
        "action_mask": torch.tensor([[True, False, True]] * 5),
    }
    logits = model.policy(inputs)
    assert logits.shape == (5, 3) and (logits[:, 1] < -1e3).all()
    assert lookup("ppo").fits(space, gym.spaces.Discrete(3)) and not lookup("sarsa").fits(space, gym.spaces.Discrete(3))
