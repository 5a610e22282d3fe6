"""Stock models: an actor-critic and a Q-network over vectors (MLPs) or images (a CNN encoder, ``flare2.zoo.encoders``),
and the actor and critics of TD3 and SAC."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import gymnasium as gym
import torch
from torch import nn
from torch.nn import functional as F

from flare2.core.algorithm import Tensors
from flare2.core.model import Model
from flare2.core.parallel_games import GLOBAL_STATE
from flare2.core.spaces import space_spec
from flare2.core.specs import Spec, View
from flare2.errors import ConfigError
from flare2.zoo.encoders import ENCODERS, ImageEncoder, image_layout

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}
"""The hidden-layer activations an actor-critic's MLPs may take (``--activation``)."""


def activation_named(name: str) -> type[nn.Module]:
    """The activation ``--activation name`` asks for."""
    if name not in ACTIVATIONS:
        raise ConfigError(f"--activation {name!r} is no activation here: use one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def mlp(
    sizes: Sequence[int], *, out_gain: float = 1.0, activation: type[nn.Module] = nn.Tanh, bias: bool = True
) -> nn.Sequential:
    """MLP with orthogonal init; tanh hidden layers by default (the usual choice for on-policy control)."""
    if any(size < 1 for size in sizes):
        raise ConfigError(f"layer sizes must be >= 1, got {list(sizes)}: check the hidden sizes (--hidden)")
    layers: list[nn.Module] = []
    for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        last = index == len(sizes) - 2
        linear = nn.Linear(fan_in, fan_out, bias=bias)
        nn.init.orthogonal_(linear.weight, out_gain if last else math.sqrt(2))
        if bias:
            nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(activation())
    return nn.Sequential(*layers)


def sample_categorical(logits: torch.Tensor) -> torch.Tensor:
    """One action per row, drawn with the probabilities of ``softmax(logits)``.

    Gumbel-max: the arg-max of the logits plus Gumbel noise (-log of an
    exponential draw) is an exact sample, and about four times cheaper than
    softmax + multinomial for small batches (6 against 24 µs).
    """
    return (logits - torch.empty_like(logits).exponential_().log()).argmax(-1)


def observation_spec(space: gym.Space) -> Spec:
    """The spec of an observation the zoo's MLP models take: Box or Discrete."""
    if not isinstance(space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise ConfigError(f"observation space {space} is not supported: use a Box or Discrete space")
    return space_spec(space, "observation space")


def action_spec(space: gym.Space) -> Spec:
    """The spec of an action the zoo's MLP models give: Discrete or a 1-d Box."""
    if not isinstance(space, gym.spaces.Discrete) and not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
        raise ConfigError(f"action space {space} is not supported: use Discrete or a 1-d Box")
    return space_spec(space, "action space")


# Low enough that softmax gives it exactly 0 in float32 and float16, finite so that 0 * logit is 0, not NaN.
ILLEGAL_LOGIT = -1e4


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logits`` with every action whose ``mask`` entry is False pushed to probability 0: never sampled, never the
    arg-max while a legal action exists, and no part of the entropy."""
    return logits.masked_fill(~mask.bool(), ILLEGAL_LOGIT)


def observation_parts(
    observation_space: gym.Space, action_space: gym.Space
) -> tuple[dict[str, gym.Space], Spec | None]:
    """The observations a model sees by name, and the spec of the action mask: a Dict space gives each of its keys
    but ``action_mask`` (a bool ``(n,)`` spec over Discrete(n) actions); any other space is the one ``obs``."""
    if not isinstance(observation_space, gym.spaces.Dict):
        return {"obs": observation_space}, None
    parts = {key: space for key, space in observation_space.spaces.items() if key != "action_mask"}
    if not parts:
        raise ConfigError(f"a Dict observation space needs an observation besides action_mask, got {observation_space}")
    if "action_mask" not in observation_space.spaces:
        return parts, None
    mask = observation_space["action_mask"]
    if not isinstance(action_space, gym.spaces.Discrete) or tuple(mask.shape or ()) != (int(action_space.n),):
        raise ConfigError(
            f"an action_mask {mask} needs Discrete actions with one entry per action, got actions {action_space}"
        )
    return parts, Spec((int(action_space.n),), "bool")


def one_hot_size(space: gym.Space) -> int:
    """How many classes a Discrete observation is one-hot encoded into (0 for a Box)."""
    return int(space.n) if isinstance(space, gym.spaces.Discrete) else 0


def features(obs: torch.Tensor, obs_spec: Spec, one_hot: int) -> torch.Tensor:
    """A float feature vector per observation: one-hot for a Discrete space, flattened for a Box."""
    if one_hot:
        return F.one_hot(obs.long(), one_hot).float()
    return obs.flatten(start_dim=obs.dim() - len(obs_spec.shape)).float()


def observation_encoder(space: gym.Space, kind: str, frames: int = 1) -> ImageEncoder | None:
    """The CNN of an image observation space (``flare2.zoo.encoders``); None for a vector one, or an image whose
    ``kind`` is ``flat``: those are flattened."""
    layout = image_layout(space)
    if layout is None or kind == "flat":
        if kind not in ENCODERS:
            raise ConfigError(f"--encoder {kind!r} is no image encoder: use one of {', '.join(ENCODERS)}")
        return None
    return ImageEncoder(layout, kind, frames=frames)


class ObservationFeatures(nn.Module):
    """Every observation a model sees, by name, as one float vector: an image through a CNN of its own
    (``flare2.zoo.encoders``), a Box of floats flattened, a Discrete state one-hot; concatenated in name order.

    ``frames`` above 1 makes each the view of its last ``frames`` values (``NAME_frames``, assembled by the agent):
    an image's frames become its CNN's channels, a vector's are laid side by side.
    """

    def __init__(self, parts: dict[str, gym.Space], encoder: str = "auto", frames: int = 1) -> None:
        super().__init__()
        if type(frames) is not int or frames < 1:
            raise ConfigError(f"frames must be an int >= 1, got {frames!r}")
        self.frames = frames
        self.specs = {name: observation_spec(space) for name, space in parts.items()}
        self.one_hot = {name: one_hot_size(space) for name, space in parts.items()}
        self.images = nn.ModuleDict()
        for name, space in parts.items():
            image = observation_encoder(space, encoder, frames)
            if image is not None:
                self.images[name] = image
        if not self.images and encoder not in ENCODERS:
            raise ConfigError(f"--encoder {encoder!r} is no image encoder: use one of {', '.join(ENCODERS)}")
        self.size = sum(self._size(name) for name in self.specs)
        """The length of the feature vector."""

    def _size(self, name: str) -> int:
        if name in self.images:
            return cast(ImageEncoder, self.images[name]).features
        return (self.one_hot[name] or math.prod(self.specs[name].fixed_shape)) * self.frames

    def input_name(self, name: str) -> str:
        """The input that holds observation ``name`` as the model sees it: itself, or its view of ``frames``."""
        return name if self.frames == 1 else f"{name}_frames"

    def views(self) -> dict[str, View]:
        if self.frames == 1:
            return {}
        return {self.input_name(name): View.last_observations(self.frames, name) for name in self.specs}

    def forward(self, inputs: Tensors) -> torch.Tensor:
        parts = []
        for name, spec in self.specs.items():
            value = inputs[self.input_name(name)]
            if name in self.images:
                parts.append(self.images[name](value))
                continue
            flat = features(value, spec, self.one_hot[name])
            parts.append(flat if self.frames == 1 else flat.flatten(start_dim=flat.dim() - 2))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


class ActorCritic(Model):
    """Policy and value heads over one observation ``obs`` (or the observations of a Dict space, side by side:
    ``ObservationFeatures``), through an encoder chosen from each one's space.

    A vector observation (a Box of floats, or Discrete one-hot encoded) feeds
    separate policy and value MLPs of sizes ``hidden`` (``activation``: tanh,
    or relu as gymnax's MinAtar baselines take). An image (a Box of
    ``uint8`` or ``bool``, ``flare2.zoo.encoders``) goes through one CNN
    (``encoder``: the Nature network for Atari-sized frames) whose features
    feed both heads, each an MLP of sizes ``hidden`` (none: linear), as in
    CleanRL's ``ppo_atari``.

    Discrete actions get logits; Box actions get a Gaussian mean with a learned,
    state-independent log standard deviation.

    An observation space ``Dict(obs=..., action_mask=MultiBinary(n))`` over
    Discrete(n) actions adds the input ``action_mask``: the actions it marks
    False get no probability (``masked_logits``), so they are never sampled
    and the entropy counts the legal ones only.

    ``frames`` above 1 makes it see the last ``frames`` observations (a
    trajectory view the agent assembles, ``obs_frames``) instead of the
    current one alone: enough to tell velocities from positions; an image
    encoder takes the frames as channels (Atari's stack of 4).

    ``critic_space`` makes the critic centralised (MAPPO, Yu et al. 2022): the
    value MLP sees the input ``global_state`` (a multi-agent env's ``state()``
    of the game, which the agent sends beside each of its agents' observations)
    in place of the observation, while the policy still sees the observation
    alone, as it will when it acts without a critic.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        hidden: Sequence[int] = (64, 64),
        initial_log_std: float = 0.0,
        frames: int = 1,
        encoder: str = "auto",
        activation: str = "tanh",
        critic_space: gym.Space | None = None,
    ) -> None:
        super().__init__()
        hidden_activation = activation_named(activation)
        parts, self._mask_spec = observation_parts(observation_space, action_space)
        self.observation = ObservationFeatures(parts, encoder, frames)
        self._action_spec = action_spec(action_space)
        obs_size = self.observation.size
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        # action_spec took only Discrete or a 1-d Box: logits per action, or the Gaussian mean per dim.
        if isinstance(action_space, gym.spaces.Discrete):
            policy_out = int(action_space.n)
        else:
            policy_out = self._action_spec.fixed_shape[0]
        self.policy_net = mlp([obs_size, *hidden, policy_out], out_gain=0.01, activation=hidden_activation)
        self.critic_state = None if critic_space is None else ObservationFeatures({GLOBAL_STATE: critic_space}, "flat")
        value_in = obs_size if self.critic_state is None else self.critic_state.size
        self.value_net = mlp([value_in, *hidden, 1], out_gain=1.0, activation=hidden_activation)
        self.log_std = None if self.discrete else nn.Parameter(torch.full((policy_out,), float(initial_log_std)))

    def input_specs(self) -> dict[str, Spec]:
        specs = {**self.observation.specs, **({"action_mask": self._mask_spec} if self._mask_spec else {})}
        return specs if self.critic_state is None else {**specs, **self.critic_state.specs}

    def action_specs(self) -> dict[str, Spec]:
        return {"action": self._action_spec}

    def view_specs(self) -> dict[str, View]:
        return self.observation.views()

    def _features(self, inputs: Tensors) -> torch.Tensor:
        return self.observation(inputs)

    def policy(self, inputs: Tensors) -> torch.Tensor:
        """Logits (Discrete, the illegal actions masked when the inputs hold ``action_mask``) or the Gaussian mean (Box)."""
        return self._policy_of(self._features(inputs), inputs)

    def value(self, inputs: Tensors) -> torch.Tensor:
        seen = self._features(inputs) if self.critic_state is None else self.critic_state(inputs)
        return self.value_net(seen).squeeze(-1)

    def policy_and_value(self, inputs: Tensors) -> tuple[torch.Tensor, torch.Tensor]:
        """``policy(inputs)`` and ``value(inputs)`` from one pass of the encoder, which both heads share: for images
        the CNN is nearly all the work. A subclass with a ``policy`` or ``value`` of its own has both called."""
        if (
            type(self).policy is not ActorCritic.policy
            or type(self).value is not ActorCritic.value
            or self.critic_state is not None
        ):
            return self.policy(inputs), self.value(inputs)
        features = self._features(inputs)
        return self._policy_of(features, inputs), self.value_net(features).squeeze(-1)

    def _policy_of(self, features: torch.Tensor, inputs: Tensors) -> torch.Tensor:
        out = self.policy_net(features)
        mask = inputs.get("action_mask")
        return out if mask is None else masked_logits(out, mask)

    def sample(self, policy_out: torch.Tensor) -> torch.Tensor:
        if self.log_std is None:  # Discrete actions
            return sample_categorical(policy_out)
        return policy_out + self.log_std.exp() * torch.randn_like(policy_out)

    def best_action(self, policy_out: torch.Tensor) -> torch.Tensor:
        """The most likely action: the arg-max logit (Discrete) or the Gaussian mean (Box)."""
        return policy_out.argmax(-1) if self.discrete else policy_out

    def log_prob_and_entropy(self, policy_out: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.log_std is None:  # Discrete actions
            log_probs = F.log_softmax(policy_out, dim=-1)
            log_prob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(log_probs.exp() * log_probs).sum(-1)
            return log_prob, entropy
        log_std = self.log_std.expand_as(policy_out)
        var = (2 * log_std).exp()
        log_prob = -((action - policy_out) ** 2) / (2 * var) - log_std - 0.5 * math.log(2 * math.pi)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1)
        return log_prob.sum(-1), entropy


class QNetwork(Model):
    """One Q-value per Discrete action from an observation ``obs`` (or the observations of a Dict space, side by
    side: ``ObservationFeatures``): a Box of floats, Discrete (one-hot encoded) or an image (a CNN encoder,
    ``flare2.zoo.encoders``, then the MLP: Mnih et al.'s DQN with ``hidden=()``).

    ``hidden=()`` makes it linear over the features. Over a one-hot observation that is a
    Q-table (``is_table``): one weight per state and action and no bias, so
    that learning a state's value moves no other state's.

    ``frames`` above 1 makes it see the last ``frames`` observations (the view ``obs_frames``).

    An observation space ``Dict(obs=..., action_mask=MultiBinary(n))`` adds the input ``action_mask``: the actions
    it marks False get the value ``ILLEGAL_LOGIT``, below any legal action's, so that they are never the greedy
    action nor the maximum a target bootstraps from.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden: Sequence[int] = (64, 64),
        *,
        frames: int = 1,
        encoder: str = "auto",
    ) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"QNetwork needs a Discrete action space, got {action_space}: use TD3 for Box actions")
        parts, self._mask_spec = observation_parts(observation_space, action_space)
        self.observation = ObservationFeatures(parts, encoder, frames)
        self.input_names = (
            *(self.observation.input_name(name) for name in parts),
            *(("action_mask",) if self._mask_spec else ()),
        )
        """The inputs ``forward`` reads: each observation (or its view of the last ``frames``), and the action mask."""
        self.is_table = not hidden and frames == 1 and len(parts) == 1 and all(self.observation.one_hot.values())
        # ReLU is the usual choice for value-based methods.
        self.q = mlp([self.observation.size, *hidden, int(action_space.n)], activation=nn.ReLU, bias=not self.is_table)

    def input_specs(self) -> dict[str, Spec]:
        return {**self.observation.specs, **({"action_mask": self._mask_spec} if self._mask_spec else {})}

    def action_specs(self) -> dict[str, Spec]:
        return {"action": Spec((), "int64")}

    def view_specs(self) -> dict[str, View]:
        return self.observation.views()

    def forward(self, inputs: Tensors) -> torch.Tensor:
        """Q-values ``[..., actions]`` of ``inputs`` (those of ``input_names``), the illegal actions' masked."""
        q = self.q(self.observation(inputs))
        mask = inputs.get("action_mask")
        return q if mask is None else masked_logits(q, mask)


class BoxActorCritic(Model):
    """An actor MLP and two Q critics over (``obs``, action) for a bounded 1-d Box action: TD3's and SAC's.

    The actor gives ``outputs_per_action`` numbers per action dimension and observation; a subclass turns them into
    an action in ``[-1, 1]`` per dimension and ``to_box`` scales that to the bounds. The critics take the action as the env does (inside
    the bounds). ``algorithm`` names the algorithm in the error raised for spaces it does not take.
    """

    # Buffers (registered in __init__), declared so that they read as tensors rather than as any module attribute.
    action_scale: torch.Tensor
    action_bias: torch.Tensor

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        hidden: Sequence[int],
        outputs_per_action: int,
        algorithm: str,
    ) -> None:
        super().__init__()
        if not isinstance(observation_space, gym.spaces.Box) or not isinstance(action_space, gym.spaces.Box):
            raise ConfigError(
                f"{algorithm} needs a Box observation and a Box action space, got {observation_space}, {action_space}"
            )
        if len(action_space.shape) != 1 or not action_space.is_bounded("both"):
            raise ConfigError(f"{algorithm} needs a bounded 1-d Box action space, got {action_space}")
        self._obs_spec = observation_spec(observation_space)
        obs_size, act_size = math.prod(self._obs_spec.fixed_shape), int(action_space.shape[0])
        low = torch.as_tensor(action_space.low, dtype=torch.float32)
        high = torch.as_tensor(action_space.high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)
        # A small last layer starts the actor near the middle of the box, away from tanh saturation.
        self.actor = mlp([obs_size, *hidden, outputs_per_action * act_size], out_gain=0.01, activation=nn.ReLU)
        self.q1 = mlp([obs_size + act_size, *hidden, 1], activation=nn.ReLU)
        self.q2 = mlp([obs_size + act_size, *hidden, 1], activation=nn.ReLU)

    def input_specs(self) -> dict[str, Spec]:
        return {"obs": self._obs_spec}

    def action_specs(self) -> dict[str, Spec]:
        return {"action": Spec((len(self.action_scale),), "float32")}

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """Each observation as a flat float vector."""
        return features(obs, self._obs_spec, 0)

    def to_box(self, squashed: torch.Tensor) -> torch.Tensor:
        """Actions in ``[-1, 1]`` per dimension, scaled to the bounds of the box."""
        return squashed * self.action_scale + self.action_bias

    def uniform_first_rows(self, action: torch.Tensor, done: int, rows: int) -> torch.Tensor:
        """``action`` with its rows numbered below ``rows``, counting from ``done`` (rows of earlier batches),
        drawn uniformly from the box instead: the random exploration that starts an off-policy run."""
        first = torch.arange(action.shape[0], device=action.device) + done < rows
        return torch.where(first.unsqueeze(-1), self.to_box(2 * torch.rand_like(action) - 1), action)

    def q_values(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([self.features(obs), action], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def first_q_value(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The first critic's value alone (TD3's actor follows it)."""
        return self.q1(torch.cat([self.features(obs), action], dim=-1)).squeeze(-1)

    def critic_parameters(self) -> list[nn.Parameter]:
        return [*self.q1.parameters(), *self.q2.parameters()]
