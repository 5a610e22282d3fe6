"""Short-term memory: unroll a recurrent cell over ``[B, T]`` sequences that cross episode ends, and a GRU actor-critic.

The agent starts every episode from the zero state and stores, with each step,
the state it had *before* that step (``Experience.states``). A learner
replays a sequence from its stored state at ``t = 0`` and must restart from
the initial state wherever an episode ended inside the sequence, as the agent
did; ``unroll`` does that, for sequences from the online helper (one agent's
last T steps) or from a replay buffer (sampled windows) alike, one step at a
time. ``unroll_segments`` gives the same results with one call per stretch
between episode ends, for a module such as ``nn.GRU`` that runs many steps
at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import gymnasium as gym
import torch
from torch import nn
from torch.nn import functional as F

from flare2.core.model import Model
from flare2.core.specs import Spec
from flare2.errors import ConfigError
from flare2.zoo.models import mlp, observation_encoder, observation_spec, sample_categorical

State = torch.Tensor | dict[str, torch.Tensor]
"""One recurrent state ``[B, ...]``, or several named ones (as in a model's ``state_specs``)."""

S = TypeVar("S", torch.Tensor, dict[str, torch.Tensor])
"""A ``State`` of one kind: a cell gives back the kind it was given, and unrolling returns it."""

Cell = Callable[[torch.Tensor, S], tuple[torch.Tensor, S]]
"""``cell(x_t, state) -> (features_t, next_state)`` for one step of a batch (``x_t`` is ``[B, ...]``)."""


def _map(fn: Callable[..., torch.Tensor], *states: S) -> S:
    first = states[0]
    if isinstance(first, dict):
        return {name: fn(*(state[name] for state in states)) for name in first}
    return fn(*states)


def _reset(ended: torch.Tensor, state: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    mask = ended.reshape(ended.shape[0], *([1] * (state.dim() - 1)))
    return torch.where(mask, initial.expand_as(state), state)


def unroll(
    cell: Cell[S],
    inputs: torch.Tensor,
    first_state: S,
    episode_ends: torch.Tensor,
    initial_state: S | None = None,
) -> tuple[torch.Tensor, S]:
    """Run ``cell`` over ``inputs[:, t]`` for t = 0..T-1, starting from ``first_state``, resetting at episode ends.

    ``inputs`` is ``[B, T, ...]`` (already encoded step by step if the model
    encodes observations first), ``first_state`` the stored state before step
    0 (``experience.states[name][:, 0]``), ``episode_ends`` the ``[B, T]``
    bool flags ``terminated | truncated``. After every step whose episode
    ended, the next step starts from ``initial_state`` (zeros, the agent's
    ``initial_states``, when None) instead of the cell's output.

    Returns the per-step features ``[B, T, ...]`` and the per-step state
    *after* the step, before any reset, ``[B, T, ...]``: the state the agent
    would carry into the step that follows, so the value of
    ``next_inputs[:, t]`` (to bootstrap at a truncation or at the end of the
    sequence) is computed from it.
    """
    steps = inputs.shape[1]
    if episode_ends.shape != inputs.shape[:2]:
        raise ValueError(f"episode_ends must be [B, T] = {tuple(inputs.shape[:2])}, got {tuple(episode_ends.shape)}")
    if initial_state is None:
        initial_state = _map(torch.zeros_like, first_state)
    state = first_state
    features, after = [], []
    for t in range(steps):
        feature, state = cell(inputs[:, t], state)
        features.append(feature)
        after.append(state)
        if t < steps - 1:
            state = _map(partial(_reset, episode_ends[:, t]), state, initial_state)
    stacked_after = _map(lambda *per_step: torch.stack(per_step, dim=1), *after)
    return torch.stack(features, dim=1), stacked_after


SequenceCell = Callable[[torch.Tensor, S], tuple[torch.Tensor, S]]
"""``rnn(x, state) -> (features, states_after)`` over ``x [B, L, ...]`` from ``state [B, ...]``, no resets inside."""


def unroll_segments(
    rnn: SequenceCell[S],
    inputs: torch.Tensor,
    first_state: S,
    episode_ends: torch.Tensor,
    initial_state: S | None = None,
) -> tuple[torch.Tensor, S]:
    """Same results as ``unroll``, for an ``rnn`` that runs a whole stretch of steps in one call (``nn.GRU``).

    The sequence is cut after every step where any row's episode ended; each
    stretch runs in one call, and rows whose episode ended restart from
    ``initial_state``: far fewer calls than one per step once episodes are
    longer than the sequence (on CPU, for 32-step sequences, about as fast as
    stepping).
    """
    steps = inputs.shape[1]
    if episode_ends.shape != inputs.shape[:2]:
        raise ValueError(f"episode_ends must be [B, T] = {tuple(inputs.shape[:2])}, got {tuple(episode_ends.shape)}")
    if initial_state is None:
        initial_state = _map(torch.zeros_like, first_state)
    cuts: list[int] = (episode_ends[:, :-1].any(dim=0).nonzero().flatten() + 1).tolist()
    state = first_state
    features, after = [], []
    for start, stop in zip([0, *cuts], [*cuts, steps]):
        feature, stretch_after = rnn(inputs[:, start:stop], state)
        features.append(feature)
        after.append(stretch_after)
        if stop < steps:
            last = _map(lambda s: s[:, -1], stretch_after)
            state = _map(partial(_reset, episode_ends[:, stop - 1]), last, initial_state)
    return torch.cat(features, dim=1), _map(lambda *parts: torch.cat(parts, dim=1), *after)


class RunningNorm(nn.Module):
    """Normalises inputs by a running mean and variance (buffers, so checkpoints keep them), clipped to +-``clip``.

    The learner calls ``update`` with each learn() batch; acting and learning
    both read the current statistics.
    """

    # Buffers (registered in __init__), declared so that they read as tensors rather than as any module attribute.
    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...], *, clip: float = 5.0, epsilon: float = 1e-4) -> None:
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(epsilon))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge the statistics of ``x [..., *shape]`` (every leading dim is a sample) into the running ones."""
        x = x.reshape(-1, *self.mean.shape).to(self.mean.dtype)
        batch_mean, batch_var, batch_count = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        total = self.count + batch_count
        delta = batch_mean - self.mean
        self.mean += delta * batch_count / total
        merged = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.var.copy_(merged / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / (self.var + 1e-8).sqrt()).clamp(-self.clip, self.clip)


class GRUActorCritic(Model):
    """Separate actor and critic memories: obs -> running normalisation -> GRUCell -> MLP head, once per role.

    An image observation goes through a CNN (``encoder``, ``flare2.zoo.encoders``) that both memories share, in
    place of the normalisation.

    The state ``hidden`` (``2 * hidden_size``) holds the actor's GRU output
    after the previous step, then the critic's (zeros at an episode start).
    A separate critic keeps the value loss, much larger than the policy loss
    at first, from steering the actor's memory (a shared GRU learnt far more
    slowly on CartPole without velocities). Actions carry the acting policy's
    ``log_prob``, as for ``flare2.zoo.ppo.PPOActorCritic``.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        hidden_size: int = 64,
        head: tuple[int, ...] = (64,),
        encoder: str = "auto",
    ) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"GRUActorCritic supports Discrete action spaces, got {action_space}")
        if not isinstance(observation_space, gym.spaces.Box):
            raise ConfigError(f"GRUActorCritic supports Box observation spaces, got {observation_space}")
        self._obs_spec = observation_spec(observation_space)
        self.hidden_size = hidden_size
        self.encoder = observation_encoder(observation_space, encoder)
        obs_size = self.encoder.features if self.encoder is not None else math.prod(self._obs_spec.fixed_shape)
        self.obs_norm = RunningNorm((obs_size,)) if self.encoder is None else None
        # nn.GRU rather than nn.GRUCell: it runs a stretch of steps in one fused call (see ``unroll_segments``).
        self.actor_gru = nn.GRU(obs_size, hidden_size, batch_first=True)
        self.critic_gru = nn.GRU(obs_size, hidden_size, batch_first=True)
        for name, parameter in [*self.actor_gru.named_parameters(), *self.critic_gru.named_parameters()]:
            if "weight" in name:
                nn.init.orthogonal_(parameter)
            else:
                nn.init.zeros_(parameter)
        self.policy_head = mlp([hidden_size, *head, int(action_space.n)], out_gain=0.01)
        self.value_head = mlp([hidden_size, *head, 1], out_gain=1.0)

    def input_specs(self) -> dict[str, Spec]:
        return {"obs": self._obs_spec}

    def action_specs(self) -> dict[str, Spec]:
        return {"action": Spec((), "int64"), "log_prob": Spec((), "float32")}

    def state_specs(self) -> dict[str, Spec]:
        return {"hidden": Spec((2 * self.hidden_size,), "float32")}

    def encode(self, obs: torch.Tensor, batch_dims: int) -> torch.Tensor:
        """``obs`` with ``batch_dims`` leading dims (1: ``[B, ...]``, 2: ``[B, T, ...]``) as the GRUs' inputs:
        normalised and flattened, or an image's CNN features."""
        if self.encoder is not None:
            return self.encoder(obs)
        assert self.obs_norm is not None, "a model without an encoder normalises its inputs"
        return self.obs_norm(obs.flatten(start_dim=batch_dims).float())

    def update_normalizer(self, obs: torch.Tensor, batch_dims: int) -> None:
        """Fold observations with ``batch_dims`` leading dims into the running input statistics (none for images,
        which the CNN scales)."""
        if self.obs_norm is not None:
            self.obs_norm.update(obs.flatten(start_dim=batch_dims).float())

    def stretch(self, x: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both GRUs over encoded ``x [N, L, F]`` from ``hidden [N, 2H]``: the hidden after each step ``[N, L, 2H]``,
        twice (a GRU's features are its state)."""
        actor, critic = hidden.split(self.hidden_size, dim=-1)
        actor_out, _ = self.actor_gru(x, actor.unsqueeze(0).contiguous())
        critic_out, _ = self.critic_gru(x, critic.unsqueeze(0).contiguous())
        out = torch.cat([actor_out, critic_out], dim=-1)
        return out, out

    def cell(self, x: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of both GRUs on encoded ``x [N, F]``: the next ``hidden [N, 2H]``, twice (for ``unroll``)."""
        out, _ = self.stretch(x.unsqueeze(1), hidden)
        return out[:, 0], out[:, 0]

    def heads(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and values from the GRU outputs ``[..., 2H]``."""
        actor, critic = features.split(self.hidden_size, dim=-1)
        return self.policy_head(actor), self.value_head(critic).squeeze(-1)

    def step(self, obs: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step: ``obs [B, ...]``, ``hidden [B, 2H]`` -> logits ``[B, A]``, value ``[B]``, next hidden."""
        _, next_hidden = self.cell(self.encode(obs, 1), hidden)
        logits, value = self.heads(next_hidden)
        return logits, value, next_hidden

    def sequence(
        self, obs: torch.Tensor, first_hidden: torch.Tensor, episode_ends: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[B, T]`` sequences from their stored state at t = 0, reset at episode ends.

        Returns logits ``[B, T, A]``, values ``[B, T]`` and the hidden state after each step ``[B, T, 2H]``.
        """
        features, after = unroll_segments(self.stretch, self.encode(obs, 2), first_hidden, episode_ends)
        logits, values = self.heads(features)
        return logits, values, after

    def next_values(self, next_obs: torch.Tensor, hidden_after: torch.Tensor) -> torch.Tensor:
        """Values ``[B, T]`` of ``next_obs [B, T, ...]`` seen from the hidden state after each step (one call)."""
        batch, steps = next_obs.shape[:2]
        flat_obs = next_obs.reshape(batch * steps, *next_obs.shape[2:])
        critic = hidden_after.reshape(batch * steps, -1)[:, self.hidden_size :]
        next_critic, _ = self.critic_gru(self.encode(flat_obs, 1).unsqueeze(1), critic.unsqueeze(0).contiguous())
        return self.value_head(next_critic[:, 0]).squeeze(-1).reshape(batch, steps)

    @staticmethod
    def sample(logits: torch.Tensor) -> torch.Tensor:
        return sample_categorical(logits)

    @staticmethod
    def best_action(logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(-1)

    @staticmethod
    def log_prob_and_entropy(logits: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = F.log_softmax(logits, dim=-1)
        log_prob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        return log_prob, -(log_probs.exp() * log_probs).sum(-1)
