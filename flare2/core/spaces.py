"""Gymnasium spaces as flare2 specs, and the observations of several envs as the rows of one request.

A Box, Discrete, MultiBinary or MultiDiscrete space is one fixed-shape spec
(a Box of ``uint8`` or ``bool``, an image, keeps its dtype; any other Box is ``float32``);
``Sequence(Box)``, ``Sequence(Discrete)`` and ``Sequence(MultiBinary)`` (a
varying number of entities, one action per entity, or one action mask per
acting entity) are ragged specs. A ``Dict`` space gives one spec
per key; any other space is the single input ``obs`` or the single action
``action``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.specs import Spec
from flare2.errors import ConfigError
from flare2.wire.ragged import Ragged

OBS_KEY = "obs"
ACTION_KEY = "action"


def space_spec(space: gym.Space, where: str) -> Spec:
    """The spec of one (non-Dict) space; ``where`` names it in the error for a space flare2 cannot carry."""
    if isinstance(space, gym.spaces.Box):
        # Pixels stay bytes all the way to the device (a quarter of float32's size); any other Box is float32.
        return Spec(space.shape, space.dtype.name if space.dtype in (np.uint8, np.bool_) else "float32")
    if isinstance(space, gym.spaces.Discrete):
        return Spec((), "int64")
    if isinstance(space, gym.spaces.MultiBinary) and isinstance(space.n, (int, np.integer)):
        return Spec((int(space.n),), "bool")
    if isinstance(space, gym.spaces.MultiDiscrete):
        return Spec(space.shape, "int64")
    if isinstance(space, gym.spaces.Sequence) and isinstance(
        space.feature_space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary)
    ):
        item = space_spec(space.feature_space, where)
        return Spec((None, *item.shape), item.dtype)
    raise ConfigError(
        f"{where} {space} is not supported: use Box, Discrete, MultiBinary, MultiDiscrete, Sequence of Box, "
        "Discrete or MultiBinary (a varying number of entities), or a Dict of those"
    )


def _specs(space: gym.Space, single_key: str, what: str) -> dict[str, Spec]:
    if isinstance(space, gym.spaces.Dict):
        return {key: space_spec(sub, f"{what} {key!r}") for key, sub in space.spaces.items()}
    return {single_key: space_spec(space, what)}


def holds_entities(observation_space: gym.Space) -> bool:
    """Whether observations of this space hold entities: a Dict with a ``Sequence`` key (``flare2.zoo.entity``)."""
    return isinstance(observation_space, gym.spaces.Dict) and any(
        isinstance(space, gym.spaces.Sequence) for space in observation_space.spaces.values()
    )


def input_specs(observation_space: gym.Space) -> dict[str, Spec]:
    """One input per key of a Dict observation space; ``obs`` for any other."""
    return _specs(observation_space, OBS_KEY, "observation space")


def action_specs(action_space: gym.Space) -> dict[str, Spec]:
    """One action per key of a Dict action space; ``action`` for any other."""
    return _specs(action_space, ACTION_KEY, "action space")


class ObservationRows:
    """The observations of ``count`` envs in the dtypes of ``specs``: fixed-shape ones in preallocated arrays,
    ragged ones as each env's items, made into a ``Ragged`` when ``arrays()`` is asked for."""

    def __init__(self, specs: dict[str, Spec], count: int, *, keyed: bool) -> None:
        """``keyed``: the env gives a dict per observation (a Dict space); else one value, for the only spec."""
        self.specs = specs
        self._fixed = {
            key: np.zeros((count, *spec.fixed_shape), spec.dtype) for key, spec in specs.items() if not spec.ragged
        }
        self._ragged: dict[str, list[Any]] = {
            key: [np.zeros((0, *spec.item_shape), spec.dtype)] * count for key, spec in specs.items() if spec.ragged
        }
        self._only = next(iter(specs)) if not keyed else None

    def fresh(self) -> ObservationRows:
        """Rows of the same specs to fill (their fixed-shape arrays are new, uninitialised)."""
        # Once per step and env group: one attribute copy, then new arrays (and item lists, when there are any).
        rows = object.__new__(ObservationRows)
        rows.__dict__.update(self.__dict__)
        rows._fixed = {key: np.empty_like(array) for key, array in self._fixed.items()}
        if self._ragged:
            rows._ragged = {key: list(items) for key, items in self._ragged.items()}
        return rows

    def copy(self) -> ObservationRows:
        rows = self.fresh()
        for key, array in self._fixed.items():
            rows._fixed[key][...] = array
        return rows

    def regrouped(self, kept: np.ndarray, added: int) -> ObservationRows:
        """New rows: copies of rows ``kept`` (their indices, in their new order), then ``added`` rows of zeros."""
        rows = object.__new__(ObservationRows)
        rows.__dict__.update(self.__dict__)
        rows._fixed = {key: regrouped_rows(array, kept, added) for key, array in self._fixed.items()}
        rows._ragged = {
            key: [items[index] for index in kept]
            + [np.zeros((0, *self.specs[key].item_shape), self.specs[key].dtype)] * added
            for key, items in self._ragged.items()
        }
        return rows

    @property
    def only_array(self) -> np.ndarray | None:
        """The one array of an env that gives a single fixed-shape observation, for the hot path to fill; else None."""
        return self._fixed[self._only] if self._only is not None and self._fixed else None

    def set(self, index: int, observation: Any) -> None:
        """Env ``index``'s observation, as the env gave it."""
        if self._only is not None:
            if self._fixed:
                self._fixed[self._only][index] = observation
            else:
                self._ragged[self._only][index] = observation
            return
        for key, array in self._fixed.items():
            array[index] = observation[key]
        for key, items in self._ragged.items():
            items[index] = observation[key]

    def row(self, index: int) -> dict[str, np.ndarray]:
        """Env ``index``'s fixed-shape observation arrays, by key (views of the rows)."""
        return {key: array[index] for key, array in self._fixed.items()}

    def arrays(self) -> dict[str, np.ndarray | Ragged]:
        """The rows as a request's inputs (the fixed arrays themselves, not copies)."""
        arrays: dict[str, np.ndarray | Ragged] = dict(self._fixed)
        if not self._ragged:
            return arrays
        for key, items in self._ragged.items():
            spec = self.specs[key]
            arrays[key] = Ragged.from_items(items, spec.item_shape, spec.dtype)
        return arrays


def regrouped_rows(array: np.ndarray, kept: np.ndarray, added: int) -> np.ndarray:
    """Rows ``kept`` of ``array`` (copies, in that order), then ``added`` rows of zeros: a pipeline's rows after
    some envs' agents left and others joined (``Acting.regroup``)."""
    return np.concatenate([array[kept], np.zeros((added, *array.shape[1:]), array.dtype)])


def env_actions(
    actions: dict[str, np.ndarray | Ragged], keys: list[str] | None, count: int
) -> Sequence[Any] | np.ndarray:
    """Each env's action from a reply's rows: the row of ``action``, or (``keys`` of a Dict action space) a dict of
    each key's row, a ragged action giving that env's items (one per entity)."""
    if keys is None:
        return _per_env(actions[ACTION_KEY])
    rows = {key: _per_env(actions[key]) for key in keys}
    return [{key: rows[key][index] for key in keys} for index in range(count)]


def _per_env(rows: np.ndarray | Ragged) -> Sequence[Any] | np.ndarray:
    """Each env's value of one action key: its row, or for a ragged action its items."""
    return rows.items() if isinstance(rows, Ragged) else rows
