"""An actor-critic over entities: an embedding per entity type, a transformer over each observation's entities, a
categorical action per actor entity and select-entity actions (RogueNet's design, on flare2's ragged batches).

The observation space is a Dict: ``Sequence(Box)`` keys are entity types
(any number of each per observation, zero included), ``Box`` keys are fixed
features, embedded together as one more token per observation that also
carries the value. The action space is a Dict of:

- per-entity actions ``Sequence(Discrete(n))``: one choice per entity of the
  type ``actors`` names for the key; an observation key ``KEY_mask``,
  ``Sequence(MultiBinary(n))``, gives each of those entities its legal choices
  (entity-gym's per-actor ``CategoricalActionMask``): the others get no
  probability, so they are never sampled, and the log-probabilities and
  entropy count the legal ones only;
- select-entity actions ``Discrete``: the index of one entity, among those of
  the type ``selects`` names for the key present in this observation.

An env says which entity type each action acts on in its ``metadata``
(``ENTITY_ACTIONS``: ``{"move": "robot", "fire": "mine"}``), so that ``flare2
train`` builds this model for it (``entity_model``).

Every observation of a batch attends only to its own entities (``pad_rows``).
The log-probability of a joint action is the sum over its parts, and so is the
entropy; a select-entity action over an observation with no such entity is
ignored (probability 1, entropy 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

import gymnasium as gym
import torch
from torch import nn
from torch.nn import functional as F

from flare2.core.algorithm import Algorithm, Experience, Tensors
from flare2.core.model import Model
from flare2.core.ragged_tensor import RaggedTensor, pad_rows
from flare2.core.spaces import action_specs, input_specs
from flare2.core.specs import Spec
from flare2.errors import ConfigError, SpecError
from flare2.zoo.models import ILLEGAL_LOGIT, sample_categorical

ENTITY_ACTIONS = "entity_actions"
"""The key of an entity env's ``metadata`` that names the entity type each action acts on (module docstring)."""


def mask_key(action: str) -> str:
    """The observation key of the per-entity masks of actor action ``action``."""
    return f"{action}_mask"


def entity_model(env: gym.Env, *, width: int = 64, layers: int = 2) -> EntityActorCritic:
    """The entity actor-critic of an env whose ``metadata`` names the entity type of each action (``ENTITY_ACTIONS``):
    a ``Sequence`` action acts per entity of that type, a ``Discrete`` one selects one of them."""
    named = env.metadata.get(ENTITY_ACTIONS) if isinstance(env.metadata, dict) else None
    action_space = env.action_space
    if not isinstance(named, dict) or not isinstance(action_space, gym.spaces.Dict):
        raise ConfigError(
            f"an env of entities ({env.observation_space}) says which entity type each of its actions acts on: "
            f"metadata[{ENTITY_ACTIONS!r}] = {{action: entity type}} over a Dict action space, such as "
            "{'move': 'robot', 'fire': 'mine'}"
        )
    actors = {
        key: str(entity) for key, entity in named.items() if isinstance(action_space.get(key), gym.spaces.Sequence)
    }
    selects = {key: str(entity) for key, entity in named.items() if key not in actors}
    return EntityActorCritic(
        cast(gym.spaces.Dict, env.observation_space),
        action_space,
        actors=actors,
        selects=selects,
        width=width,
        layers=layers,
    )


@dataclass
class EntityPolicy:
    """What ``EntityActorCritic.policy`` computes for a batch: logits per actor entity, scores per selectable one."""

    actor_logits: dict[str, RaggedTensor]
    """Per-entity action key: ``[entities, n]`` logits, one row per actor entity."""
    select_scores: dict[str, RaggedTensor]
    """Select-entity action key: one score per candidate entity."""


def _entities(tensors: Mapping[str, torch.Tensor | RaggedTensor], key: str) -> RaggedTensor:
    """The entities of type ``key`` (or an action per entity): a ragged spec's entry, which comes as a RaggedTensor."""
    value: object = tensors[key]
    if not isinstance(value, RaggedTensor):
        raise SpecError(
            f"{key!r} must be a RaggedTensor (a Sequence space, one row of items per observation), "
            f"got {type(value).__name__}"
        )
    return value


class EntityActorCritic(Model):
    """See the module docstring. ``actors`` and ``selects`` map each action key to the entity type it acts on."""

    def __init__(
        self,
        observation_space: gym.spaces.Dict,
        action_space: gym.spaces.Dict,
        *,
        actors: dict[str, str],
        selects: dict[str, str],
        width: int = 64,
        heads: int = 4,
        layers: int = 2,
    ) -> None:
        super().__init__()
        if not isinstance(observation_space, gym.spaces.Dict) or not isinstance(action_space, gym.spaces.Dict):
            raise ConfigError(f"EntityActorCritic takes Dict spaces, got {observation_space} and {action_space}")
        self._inputs = input_specs(observation_space)
        self._actions = action_specs(action_space)
        self.masks = {key: mask_key(key) for key in actors if mask_key(key) in self._inputs}
        """Each actor action with a mask per entity: the observation key that holds it."""
        masks = set(self.masks.values())
        self.entity_types = [key for key, spec in self._inputs.items() if spec.ragged and key not in masks]
        self.context_keys = [key for key, spec in self._inputs.items() if not spec.ragged]
        if not self.entity_types:
            raise ConfigError(
                f"EntityActorCritic needs at least one entity type (a Sequence(Box) observation key), got {observation_space}"
            )
        for key, entity in {**actors, **selects}.items():
            if key not in self._actions or entity not in self.entity_types:
                raise ConfigError(
                    f"EntityActorCritic action {key!r} on entity type {entity!r}: the actions are {sorted(self._actions)} "
                    f"and the entity types (Sequence observation keys) {self.entity_types}"
                )
        unmapped = set(self._actions) - set(actors) - set(selects)
        if unmapped:
            raise ConfigError(f"EntityActorCritic: say which entity type the actions {sorted(unmapped)} act on")
        choices = {}
        for key in actors:
            space = action_space[key]
            if not isinstance(space, gym.spaces.Sequence) or not isinstance(space.feature_space, gym.spaces.Discrete):
                raise ConfigError(
                    f"EntityActorCritic actor action {key!r} must be Sequence(Discrete(n)), one choice per "
                    f"entity, got {space}"
                )
            choices[key] = int(space.feature_space.n)
            mask = self._inputs.get(mask_key(key))
            if mask is not None and (not mask.ragged or mask.item_shape != (choices[key],) or mask.dtype != "bool"):
                raise ConfigError(
                    f"EntityActorCritic: {mask_key(key)!r} masks the {choices[key]} choices of each {actors[key]!r} "
                    f"entity: it must be Sequence(MultiBinary({choices[key]})), got {observation_space[mask_key(key)]}"
                )
        for key in selects:
            if not isinstance(action_space[key], gym.spaces.Discrete):
                raise ConfigError(
                    f"EntityActorCritic select action {key!r} must be Discrete (the index of an entity), "
                    f"got {action_space[key]}"
                )
        self.actors, self.selects = dict(actors), dict(selects)
        self.actor_choices = choices
        """The choices of each actor action (the outputs of its head)."""
        self.embed = nn.ModuleDict(
            {key: nn.Linear(math.prod(self._inputs[key].item_shape), width) for key in self.entity_types}
        )
        context_size = sum(math.prod(self._inputs[key].fixed_shape) for key in self.context_keys)
        self.context = nn.Linear(max(context_size, 1), width)
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.trunk = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        actor_heads = {key: nn.Linear(width, choices[key]) for key in self.actors}
        select_heads = {key: nn.Linear(width, 1) for key in self.selects}
        self.actor_heads = nn.ModuleDict(actor_heads)
        self.select_heads = nn.ModuleDict(select_heads)
        self.value_head = nn.Linear(width, 1)
        for head in [*actor_heads.values(), *select_heads.values()]:
            nn.init.orthogonal_(head.weight, 0.01)
            nn.init.zeros_(head.bias)

    def input_specs(self) -> dict[str, Spec]:
        return dict(self._inputs)

    def action_specs(self) -> dict[str, Spec]:
        return {**self._actions, "log_prob": Spec((), "float32")}

    def _encode(self, inputs: Tensors) -> tuple[torch.Tensor, dict[str, RaggedTensor]]:
        """Each observation's context token and each entity's output of the transformer."""
        entities = [_entities(inputs, key) for key in self.entity_types]
        rows = entities[0].rows
        if self.context_keys:
            context = torch.cat([inputs[key].reshape(rows, -1).float() for key in self.context_keys], dim=-1)
        else:
            context = entities[0].values.new_zeros((rows, 1))
        # The item size is spelled out rather than -1, which cannot be inferred when a batch has no such entity.
        tokens = [
            entity.with_values(
                self.embed[key](
                    entity.values.reshape(len(entity.values), math.prod(self._inputs[key].item_shape)).float()
                )
            )
            for key, entity in zip(self.entity_types, entities)
        ]
        padded, mask, where = pad_rows([token.flat() for token in tokens], first=self.context(context))
        out = self.norm(self.trunk(padded, src_key_padding_mask=~mask))
        per_type = {
            key: entity.flat().with_values(out[row, position])
            for key, entity, (row, position) in zip(self.entity_types, entities, where)
        }
        return out[:, 0], per_type

    def policy(self, inputs: Tensors) -> EntityPolicy:
        return self._policy_of(self._encode(inputs)[1], inputs)

    def value(self, inputs: Tensors) -> torch.Tensor:
        """One value per observation, in the leading shape of the inputs (``[B]`` or ``[N, T]``)."""
        return self._value_of(self._encode(inputs)[0], inputs)

    def policy_and_value(self, inputs: Tensors) -> tuple[EntityPolicy, torch.Tensor]:
        """``policy(inputs)`` and ``value(inputs)`` from one pass of the transformer."""
        context, per_type = self._encode(inputs)
        return self._policy_of(per_type, inputs), self._value_of(context, inputs)

    def _value_of(self, context: torch.Tensor, inputs: Tensors) -> torch.Tensor:
        return self.value_head(context).squeeze(-1).reshape(inputs[self.entity_types[0]].shape)

    def _policy_of(self, per_type: dict[str, RaggedTensor], inputs: Tensors) -> EntityPolicy:
        return EntityPolicy(
            actor_logits={
                key: per_type[entity].with_values(
                    self._masked(key, self.actor_heads[key](per_type[entity].values), inputs)
                )
                for key, entity in self.actors.items()
            },
            select_scores={
                key: per_type[entity].with_values(self.select_heads[key](per_type[entity].values).squeeze(-1))
                for key, entity in self.selects.items()
            },
        )

    def _masked(self, key: str, logits: torch.Tensor, inputs: Tensors) -> torch.Tensor:
        """Actor ``key``'s logits, ``[entities, n]``, with the choices its entities' masks forbid taken away."""
        if key not in self.masks:
            return logits
        mask = _entities(inputs, self.masks[key])
        if mask.values.shape[0] != logits.shape[0]:
            raise SpecError(
                f"{self.masks[key]!r} must hold one mask per {self.actors[key]!r} entity: {mask.values.shape[0]} "
                f"masks for {logits.shape[0]} entities"
            )
        return logits.masked_fill(~mask.values.bool(), ILLEGAL_LOGIT)

    def sample(self, policy: EntityPolicy) -> dict[str, torch.Tensor | RaggedTensor]:
        return self._choose(policy, sample_categorical)

    def best_action(self, policy: EntityPolicy) -> dict[str, torch.Tensor | RaggedTensor]:
        return self._choose(policy, lambda logits: logits.argmax(-1))

    @staticmethod
    def _choose(
        policy: EntityPolicy, pick: Callable[[torch.Tensor], torch.Tensor]
    ) -> dict[str, torch.Tensor | RaggedTensor]:
        """Each actor entity's choice and each select-entity choice, by ``pick`` over the last dim of logits."""
        actions: dict[str, torch.Tensor | RaggedTensor] = {
            key: logits.with_values(pick(logits.values)) for key, logits in policy.actor_logits.items()
        }
        for key, scores in policy.select_scores.items():
            # Padded past each row's candidates with logits that no pick chooses while a candidate exists.
            padded, _ = scores.padded(fill=ILLEGAL_LOGIT)
            actions[key] = pick(padded) if padded.shape[1] else scores.lengths.new_zeros(scores.rows)
        return actions

    def log_prob_and_entropy(
        self, policy: EntityPolicy, actions: dict[str, torch.Tensor | RaggedTensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[rows]`` each: the joint log-probability of ``actions`` and the joint entropy."""
        # Zeros per row to add to: a model whose only actions select among entities, none of which are there, has
        # log-probability and entropy 0 in every row.
        first = next(iter([*policy.actor_logits.values(), *policy.select_scores.values()]))
        log_prob = entropy = first.values.new_zeros(first.rows)
        for key, logits in policy.actor_logits.items():
            log_probs = F.log_softmax(logits.values, dim=-1)
            chosen = log_probs.gather(-1, _entities(actions, key).values.long().unsqueeze(-1)).squeeze(-1)
            log_prob = log_prob + logits.segment_sum(chosen)
            entropy = entropy + logits.segment_sum(-(log_probs.exp() * log_probs).sum(-1))
        for key, scores in policy.select_scores.items():
            padded, mask = scores.padded(fill=ILLEGAL_LOGIT)
            if not padded.shape[1]:
                continue
            log_probs = F.log_softmax(padded, dim=-1)
            has_choice = mask.any(-1)
            selected = actions[key]
            if isinstance(selected, RaggedTensor):
                raise SpecError(f"select action {key!r} is one entity index per row, got a RaggedTensor")
            chosen = log_probs.gather(-1, selected.long().clamp(0, padded.shape[1] - 1).unsqueeze(-1)).squeeze(-1)
            log_prob = log_prob + torch.where(has_choice, chosen, torch.zeros_like(chosen))
            row_entropy = -(log_probs.exp() * log_probs * mask).sum(-1)
            entropy = entropy + torch.where(has_choice, row_entropy, torch.zeros_like(row_entropy))
        return log_prob, entropy


class UniformEntityPolicy(Algorithm):
    """Uniformly random actions over the same entities (every legal choice of every part equally likely), learning
    nothing: the baseline an entity policy's curve is read against."""

    model: EntityActorCritic

    def __init__(self, model: EntityActorCritic) -> None:
        super().__init__(model)

    def _uniform(self, inputs: Tensors) -> EntityPolicy:
        model = self.model
        entities = {key: _entities(inputs, key) for key in model.entity_types}
        return EntityPolicy(
            actor_logits={
                key: entities[entity].with_values(
                    model._masked(
                        key,
                        entities[entity].values.new_zeros((len(entities[entity].values), model.actor_choices[key])),
                        inputs,
                    )
                )
                for key, entity in model.actors.items()
            },
            select_scores={
                key: entities[entity].with_values(entities[entity].values.new_zeros(len(entities[entity].values)))
                for key, entity in model.selects.items()
            },
        )

    def predict(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        policy = self._uniform(inputs)
        actions = self.model.sample(policy)
        log_prob, _ = self.model.log_prob_and_entropy(policy, actions)
        # A per-entity action is a RaggedTensor, which Tensors (a ragged spec's entry) holds too.
        return cast(Tensors, {**actions, "log_prob": log_prob}), {}

    predict_greedy = predict

    def learn(self, experience: Experience) -> dict[str, float]:
        return {}
