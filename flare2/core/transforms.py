"""Data transforms: what the agent side does to observations and rewards before acting on them and storing them.

A ``Transforms`` pipeline sits between the envs and everything else: an
agent passes each step's raw observations and rewards through it, then sends
and stores only what comes out, so acting and learning see the same data
(ALF's data transformers; learning silently breaks when the two differ).

- ``NormalizeObservations``: ``(x - mean) / std`` per input key, clipped, from
  running statistics that every agent of the run shares. Each agent counts
  what its training envs see and trades its new counts for the run's merged
  ones with the CT every ``sync_every`` rows (without waiting: the answer is
  picked up at the next trade). The CT keeps the merged statistics and saves
  them in its checkpoint, so a resumed run and its evaluation episodes
  normalise as the saved run did.
- ``NormalizeRewards``: each reward divided by the running standard deviation
  of the discounted return (SB3's ``VecNormalize(norm_reward=True)``), from
  statistics shared and saved in the same way.
- ``ScaleRewards`` and ``ClipRewards``: fixed reward scaling and clipping.

Frame stacks are not a transform here: a model that wants the last n
observations declares ``View.last_observations(n)``, and the agent assembles it
from the transformed observations.

The pipeline is plain data in a recipe (``Transforms.from_options``), so an
agent started on another machine builds the same one. Imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, cast

import numpy as np

from flare2.core.specs import CTSpecs
from flare2.errors import ConfigError, SpecError
from flare2.wire.ragged import Ragged

MOMENTS_KEYS = ("count", "mean", "m2")
_MAX_COUNT = 2**53  # counts stay exact as floats below this


class RunningMoments:
    """Count, mean and sum of squared deviations (``m2``) of samples of one shape, merged exactly (Chan et al.)."""

    def __init__(
        self, shape: tuple[int, ...], count: int = 0, mean: np.ndarray | None = None, m2: np.ndarray | None = None
    ) -> None:
        self.shape = tuple(shape)
        self.count = count
        self.mean = np.zeros(self.shape) if mean is None else np.array(mean, np.float64)
        self.m2 = np.zeros(self.shape) if m2 is None else np.array(m2, np.float64)

    def copy(self) -> RunningMoments:
        return RunningMoments(self.shape, self.count, self.mean, self.m2)

    @property
    def variance(self) -> np.ndarray:
        """The population variance; ones before any sample, so that nothing is scaled then."""
        return self.m2 / self.count if self.count else np.ones(self.shape)

    def update(self, samples: np.ndarray) -> None:
        """Count ``samples``, ``[n, *shape]``."""
        self.merge(RunningMoments.of(samples))

    @classmethod
    def of(cls, samples: np.ndarray) -> RunningMoments:
        """The moments of ``samples``, ``[n, *shape]``."""
        samples = samples.astype(np.float64, copy=False)
        moments = cls(samples.shape[1:])
        if len(samples):
            moments.count = len(samples)
            moments.mean = samples.mean(axis=0)
            deviations = samples - moments.mean
            moments.m2 = np.einsum("i...,i...->...", deviations, deviations)
        return moments

    def merge(self, other: RunningMoments) -> None:
        """Count every sample that ``other`` counted, as if they had come here."""
        if other.count:
            self._merge(other.count, other.mean, other.m2)

    def _merge(self, count: int, mean: np.ndarray, m2: np.ndarray) -> None:
        if not self.count:
            self.count, self.mean, self.m2 = count, np.array(mean, np.float64), np.array(m2, np.float64)
            return
        total = self.count + count
        delta = mean - self.mean
        self.mean = self.mean + delta * (count / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.count * count / total)
        self.count = total

    def to_wire(self) -> dict[str, Any]:
        # Arithmetic on moments of one number makes numpy scalars: they go out as arrays of shape ().
        return {"count": self.count, "mean": np.asarray(self.mean), "m2": np.asarray(self.m2)}

    @classmethod
    def from_wire(cls, value: Any, shape: tuple[int, ...], what: str) -> RunningMoments:
        """Moments that came over the wire, checked against ``shape``; the SpecError names ``what``."""
        if not isinstance(value, dict) or value.keys() != set(MOMENTS_KEYS):
            raise SpecError(f"{what} must be a map of {', '.join(MOMENTS_KEYS)}, got {_describe(value)}")
        count, mean, m2 = (value[key] for key in MOMENTS_KEYS)
        if type(count) is not int or not 0 <= count < _MAX_COUNT:
            raise SpecError(f"{what}: count must be an int from 0 to 2**53, got {count!r}")
        for name, array in (("mean", mean), ("m2", m2)):
            if not isinstance(array, np.ndarray) or array.dtype != np.float64 or array.shape != tuple(shape):
                raise SpecError(
                    f"{what}: {name} must be a float64 array of shape {tuple(shape)}, got {_describe(array)}"
                )
            if not np.isfinite(array).all():
                raise SpecError(f"{what}: {name} holds NaN or infinity")
        if (m2 < 0).any() or (count == 0 and (mean.any() or m2.any())):
            raise SpecError(f"{what}: m2 must be >= 0, and mean and m2 zero when count is 0")
        return cls(shape, count, mean, m2)


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype.name} array of shape {value.shape}"
    if isinstance(value, dict):
        return f"a map of {sorted(map(str, value))}"
    return type(value).__name__


RETURNS_PREFIX = "return:"
"""The run's statistics of the discounted return of reward ``r`` are kept as ``return:r``; all others by input name."""


def statistics_shape(specs: CTSpecs, key: Any) -> tuple[int, ...]:
    """The shape of one sample of the run's statistics ``key``; a SpecError when the CT keeps none of that name."""
    name = key if isinstance(key, str) else ""
    spec = (
        specs.rewards.get(name[len(RETURNS_PREFIX) :])
        if name.startswith(RETURNS_PREFIX)
        else specs.acting_inputs.get(name)
    )
    if spec is None or spec.ragged:
        raise SpecError(
            f"statistics of {key!r}: the CT has no fixed-shape input of that name, nor a reward after {RETURNS_PREFIX!r}"
        )
    return spec.fixed_shape


def check_statistics_request(specs: CTSpecs, payload: Any) -> dict[str, RunningMoments]:
    """The moments of a statistics request ``{"moments": {key: moments}}``, checked against the CT's specs."""
    moments = payload.get("moments") if isinstance(payload, dict) else None
    if not isinstance(moments, dict) or not moments:
        raise SpecError("a statistics request carries 'moments': a map of input name to count, mean and m2")
    return {
        key: RunningMoments.from_wire(value, statistics_shape(specs, key), f"statistics of {key!r}")
        for key, value in moments.items()
    }


class Transform:
    """One step of a ``Transforms`` pipeline; each method works on the rows of ``count`` envs, in place."""

    def bind(self, ct: str, specs: CTSpecs, port: Any) -> None:
        """The CT whose inputs the transform makes, and the port to it (once, before the first step)."""

    def observations(self, inputs: Mapping[str, np.ndarray | Ragged], rows: np.ndarray | None, *, count: bool) -> None:
        """Transform ``inputs`` (arrays by key, rows first; a ragged input's rows are a ``Ragged``) in place, only
        ``rows`` of them when given; ``count``: these are observations of training envs, which running statistics
        may learn from."""

    def reward_state(self, envs: int) -> Any:
        """What the transform keeps of each of ``envs`` envs between their steps, for one acting pipeline (each
        pipeline of an agent has its own; the transform is shared)."""
        return None

    def rewards(self, rewards: np.ndarray, state: Any, *, count: bool) -> None:
        """Transform a step's rewards (one per env) in place; ``state``: the pipeline's, from ``reward_state``;
        ``count``: rewards of training envs, which running statistics may learn from."""

    def episodes_ended(self, state: Any, rows: np.ndarray) -> None:
        """The episodes of envs ``rows`` of the pipeline whose ``state`` this is ended."""


class _SharedStatistics(Transform):
    """A transform that works from running statistics every agent of the run shares: it counts samples here and
    trades its new counts for the run's merged ones with the CT every ``sync_every`` samples (see the module
    docstring); ``_rescale`` derives what it applies from ``moments`` whenever they change."""

    def __init__(self, *, epsilon: float, sync_every: int) -> None:
        self.epsilon, self.sync_every = epsilon, sync_every
        self.moments: dict[str, RunningMoments] = {}
        """What this agent works from: the run's statistics it last heard of, plus its own counts since."""
        self._unsent: dict[str, RunningMoments] = {}
        self._port: Any = None
        self._ticket: int | None = None
        self._rows_since_sync = 0

    def _bind_statistics(self, port: Any, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Keep the statistics of ``shapes`` (by statistics key), starting from what the run already knows (a
        resumed run: the checkpoint's)."""
        self._port = port
        self._unsent = {key: RunningMoments(shape) for key, shape in shapes.items()}
        self._adopt(port.wait_statistics(self._send()), since={})

    def _rescale(self) -> None:
        raise NotImplementedError

    def _count(self, samples: Mapping[str, np.ndarray]) -> None:
        """Count ``samples`` (``[n, *shape]`` by statistics key, the same n for each) here and towards the run."""
        for key, values in samples.items():
            counted = RunningMoments.of(values)
            self.moments[key].merge(counted)
            self._unsent[key].merge(counted)
        self._rows_since_sync += counted.count
        if self._rows_since_sync >= self.sync_every:
            self._sync()
        else:
            self._rescale()

    def _send(self) -> int:
        """Send the counts not sent yet; returns the ticket of the reply."""
        ticket = self._port.send_statistics({"moments": {key: m.to_wire() for key, m in self._unsent.items()}})
        self._unsent = {key: RunningMoments(m.shape) for key, m in self._unsent.items()}
        self._rows_since_sync = 0
        return ticket

    def _adopt(self, reply: dict[str, Any], since: dict[str, RunningMoments]) -> None:
        """Work from the run's merged statistics of a reply, plus the counts sent ``since`` its request."""
        shapes = {key: m.shape for key, m in self._unsent.items()}
        moments = reply.get("moments") if isinstance(reply, dict) else None
        if not isinstance(moments, dict) or moments.keys() != set(shapes):
            raise SpecError(f"a statistics reply must give the moments of {sorted(shapes)}, got {_describe(moments)}")
        self.moments = {
            key: RunningMoments.from_wire(moments[key], shape, f"statistics of {key!r}")
            for key, shape in shapes.items()
        }
        for key, counted in since.items():
            self.moments[key].merge(counted)
        self._rescale()

    def _sync(self) -> None:
        """Trade this agent's new counts for the run's merged statistics. The reply read is the previous trade's,
        long since answered, so the agent does not wait for the one it sends now."""
        sending = self._unsent
        previous, self._ticket = self._ticket, self._send()
        if previous is None:
            self._rescale()
        else:
            self._adopt(self._port.wait_statistics(previous), since=sending)


class NormalizeObservations(_SharedStatistics):
    """``clip((x - mean) / sqrt(var + epsilon))`` for each of ``keys``, from the run's shared running statistics."""

    def __init__(
        self, keys: Iterable[str] = ("obs",), *, clip: float = 10.0, epsilon: float = 1e-8, sync_every: int = 1000
    ) -> None:
        self.keys = list(keys)
        if not self.keys or clip <= 0 or epsilon <= 0 or sync_every < 1:
            raise ConfigError(
                f"NormalizeObservations needs input keys, clip > 0, epsilon > 0 and sync_every >= 1, got {self.keys}, "
                f"{clip}, {epsilon}, {sync_every}"
            )
        super().__init__(epsilon=epsilon, sync_every=sync_every)
        self.clip = clip
        self._scale: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def bind(self, ct: str, specs: CTSpecs, port: Any) -> None:
        for key in self.keys:
            spec = specs.acting_inputs.get(key)
            if spec is None or spec.ragged or not np.issubdtype(np.dtype(spec.dtype), np.floating):
                raise ConfigError(
                    f"NormalizeObservations({key!r}): CT {ct!r} has no fixed-shape float input {key!r} (its inputs: "
                    f"{ {name: (s.shape, s.dtype) for name, s in specs.acting_inputs.items()} }): name one of those"
                )
        self._bind_statistics(port, {key: specs.acting_inputs[key].fixed_shape for key in self.keys})

    def _rescale(self) -> None:
        self._scale = {key: (m.mean, 1 / np.sqrt(m.variance + self.epsilon)) for key, m in self.moments.items()}

    def observations(self, inputs: Mapping[str, np.ndarray | Ragged], rows: np.ndarray | None, *, count: bool) -> None:
        # bind took only fixed-shape inputs, so each of ``keys`` is an array.
        arrays = {key: cast(np.ndarray, inputs[key]) for key in self.keys}
        if count:
            self._count({key: arrays[key] if rows is None else arrays[key][rows] for key in self.keys})
        for key in self.keys:
            mean, inverse_std = self._scale[key]
            array = arrays[key]
            if rows is None:
                np.clip((array - mean) * inverse_std, -self.clip, self.clip, out=array, casting="unsafe")
            else:
                array[rows] = np.clip((array[rows] - mean) * inverse_std, -self.clip, self.clip)


class NormalizeRewards(_SharedStatistics):
    """Each reward divided by ``sqrt(var + epsilon)`` of the discounted return ``R = gamma * R + reward`` (zero
    before each episode's first reward), then clipped to ``[-clip, clip]``: SB3's ``VecNormalize(norm_reward=True)``,
    with the variance counted by every agent of the run together. Rewards are scaled, never shifted, so their signs
    and the ends of episodes mean what they meant; value targets keep a steady size whatever the env's reward scale."""

    def __init__(
        self, gamma: float = 0.99, *, clip: float = 10.0, epsilon: float = 1e-8, sync_every: int = 1000
    ) -> None:
        if not 0 <= gamma <= 1 or clip <= 0 or epsilon <= 0 or sync_every < 1:
            raise ConfigError(
                f"NormalizeRewards needs 0 <= gamma <= 1 (the algorithm's discount), clip > 0, epsilon > 0 and "
                f"sync_every >= 1, got {gamma}, {clip}, {epsilon}, {sync_every}"
            )
        super().__init__(epsilon=epsilon, sync_every=sync_every)
        self.gamma, self.clip = gamma, clip
        self.key = RETURNS_PREFIX + "reward"
        self._inverse_std = 1.0

    def bind(self, ct: str, specs: CTSpecs, port: Any) -> None:
        spec = specs.rewards.get("reward")
        if spec is None or spec.shape != ():
            raise ConfigError(
                f"NormalizeRewards: CT {ct!r} has no scalar reward 'reward' (its rewards: "
                f"{ {name: s.shape for name, s in specs.rewards.items()} }); it normalises one reward per env step"
            )
        if self.key in specs.acting_inputs:
            raise ConfigError(
                f"NormalizeRewards keeps its statistics as {self.key!r}, and CT {ct!r} has an input of that name: "
                "rename the input"
            )
        self._bind_statistics(port, {self.key: ()})

    def _rescale(self) -> None:
        self._inverse_std = float(1 / np.sqrt(self.moments[self.key].variance + self.epsilon))

    def reward_state(self, envs: int) -> np.ndarray:
        return np.zeros(envs)  # each env's discounted return so far

    def rewards(self, rewards: np.ndarray, state: Any, *, count: bool) -> None:
        if count:
            returns = cast(np.ndarray, state)
            returns *= self.gamma
            returns += rewards
            self._count({self.key: returns})
        np.clip(rewards * self._inverse_std, -self.clip, self.clip, out=rewards, casting="unsafe")

    def episodes_ended(self, state: Any, rows: np.ndarray) -> None:
        cast(np.ndarray, state)[rows] = 0


class ScaleRewards(Transform):
    """Multiply every reward by ``factor``."""

    def __init__(self, factor: float) -> None:
        if not math.isfinite(factor) or factor == 0:
            raise ConfigError(f"ScaleRewards needs a finite, non-zero factor, got {factor}")
        self.factor = factor

    def rewards(self, rewards: np.ndarray, state: Any, *, count: bool) -> None:
        rewards *= self.factor


class ClipRewards(Transform):
    """Clip every reward to ``[low, high]``."""

    def __init__(self, low: float = -1.0, high: float = 1.0) -> None:
        if not low < high:
            raise ConfigError(f"ClipRewards needs low < high, got {low}, {high}")
        self.low, self.high = low, high

    def rewards(self, rewards: np.ndarray, state: Any, *, count: bool) -> None:
        np.clip(rewards, self.low, self.high, out=rewards)


TRANSFORMS: dict[str, type[Transform]] = {
    "normalize_observations": NormalizeObservations,
    "normalize_rewards": NormalizeRewards,
    "scale_rewards": ScaleRewards,
    "clip_rewards": ClipRewards,
}
"""The transforms a recipe names, by the name it uses."""


class Transforms:
    """A pipeline of ``Transform`` s, applied in order to observations and rewards (see the module docstring)."""

    def __init__(self, transforms: Iterable[Transform] = ()) -> None:
        self.transforms = list(transforms)
        self.observing = [t for t in self.transforms if type(t).observations is not Transform.observations]
        self.rewarding = [t for t in self.transforms if type(t).rewards is not Transform.rewards]

    @classmethod
    def from_options(cls, options: Iterable[Any]) -> Transforms:
        """A pipeline from plain data: ``[["normalize_observations", {"clip": 5}], ["scale_rewards", {"factor": 0.1}]]``."""
        transforms = []
        for option in options:
            if isinstance(option, str):
                name, kwargs = option, {}
            elif isinstance(option, (list, tuple)) and len(option) == 2:
                name, kwargs = option
            else:
                name, kwargs = None, None
            kind = TRANSFORMS.get(name) if isinstance(name, str) else None
            if kind is None or not isinstance(kwargs, dict):
                raise ConfigError(
                    f"a transform is a name or [name, keyword arguments] with a name from {sorted(TRANSFORMS)}, got {option!r}"
                )
            try:
                transforms.append(kind(**kwargs))
            except TypeError as exc:
                raise ConfigError(f"transform {name!r} does not take {kwargs}: {exc}") from None
        return cls(transforms)

    def __bool__(self) -> bool:
        return bool(self.transforms)

    def bind(self, ct: str, specs: CTSpecs, port: Any) -> None:
        for transform in self.transforms:
            transform.bind(ct, specs, port)

    def observations(
        self, inputs: Mapping[str, np.ndarray | Ragged], rows: np.ndarray | None = None, *, count: bool = True
    ) -> None:
        for transform in self.observing:
            transform.observations(inputs, rows, count=count)

    def reward_states(self, envs: int) -> list[Any]:
        """What the reward transforms keep of each of ``envs`` envs of one acting pipeline (``Transform.reward_state``)."""
        return [transform.reward_state(envs) for transform in self.rewarding]

    def rewards(self, rewards: np.ndarray, states: list[Any], *, count: bool = True) -> None:
        """Transform a step's rewards in place; ``states``: the pipeline's, from ``reward_states``."""
        for transform, state in zip(self.rewarding, states):
            transform.rewards(rewards, state, count=count)

    def episodes_ended(self, states: list[Any], rows: np.ndarray) -> None:
        """The episodes of envs ``rows`` of the pipeline whose reward ``states`` these are ended."""
        for transform, state in zip(self.rewarding, states):
            transform.episodes_ended(state, rows)
