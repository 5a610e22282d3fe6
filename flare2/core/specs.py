"""Named array specs: what a ComputationTask takes and returns.

Specs use numpy only, so agent processes can check and build arrays without
importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast, overload

import numpy as np

from flare2.errors import SpecError
from flare2.wire.codec import WIRE_DTYPE_NAMES
from flare2.wire.ragged import Ragged


@dataclass(frozen=True)
class Spec:
    """The shape and dtype of one named array, without the leading batch dimension.

    A first dim of ``None`` makes it ragged: each row holds its own number of items of shape ``shape[1:]``
    (``Spec((None, 2))``: any number of 2-vectors, zero included), sent and batched as a ``Ragged`` without padding.
    """

    shape: tuple[int | None, ...] = ()
    dtype: str = "float32"

    def __post_init__(self) -> None:
        shape = self.shape
        if not isinstance(shape, (tuple, list)) or not all(
            (isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) and dim >= 0) or (dim is None and i == 0)
            for i, dim in enumerate(shape)
        ):
            raise SpecError(
                f"Spec shape must be a tuple of non-negative ints such as (4,) or (), with None as its first dim for a "
                f"varying number of items such as (None, 2), got {self.shape!r}"
            )
        object.__setattr__(self, "shape", tuple(None if dim is None else int(dim) for dim in shape))
        try:
            # np.dtype(None) would silently mean float64.
            name = np.dtype(self.dtype).name if self.dtype is not None else None
        except TypeError:
            name = None
        if name not in WIRE_DTYPE_NAMES:
            raise SpecError(f"Spec dtype must be one of {', '.join(WIRE_DTYPE_NAMES)}, got {self.dtype!r}")
        object.__setattr__(self, "dtype", name)

    @property
    def ragged(self) -> bool:
        """Whether each row holds its own number of items (a first dim of None)."""
        return bool(self.shape) and self.shape[0] is None

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one item of a ragged spec."""
        # __post_init__ lets None stand only as the first dim.
        return cast("tuple[int, ...]", self.shape[1:])

    @property
    def fixed_shape(self) -> tuple[int, ...]:
        """The shape of a spec that is not ragged (all of it fixed), for arrays that must have one."""
        if self.ragged:
            raise SpecError(f"a ragged spec {self.shape} has no fixed shape: its rows are Ragged, not arrays")
        return cast("tuple[int, ...]", self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes of one array of this spec (of a fixed shape)."""
        return math.prod(self.fixed_shape) * np.dtype(self.dtype).itemsize

    def zeros(self, rows: int | None = None) -> np.ndarray | Ragged:
        """Zeros of this spec (``rows`` of them); for a ragged spec, rows of no items."""
        if self.ragged:
            if rows is None:
                raise SpecError(f"a ragged spec {self.shape} has zeros only as rows of no items: give the rows")
            return Ragged.empty((rows,), self.item_shape, self.dtype)
        shape = self.fixed_shape if rows is None else (rows, *self.fixed_shape)
        return np.zeros(shape, dtype=self.dtype)

    def to_wire(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_wire(cls, value: Any) -> Spec:
        if (
            not isinstance(value, dict)
            or not isinstance(value.get("shape"), list)
            or not isinstance(value.get("dtype"), str)
        ):
            raise SpecError(f"a spec is a map with 'shape' and 'dtype' (a list and a str), got {value!r}")
        return cls(shape=tuple(value["shape"]), dtype=value["dtype"])


Specs = Mapping[str, Spec]
# Comparing dtype objects is several times cheaper than reading dtype.name, and check_arrays runs per request.
NUMPY_DTYPES = {name: np.dtype(name) for name in WIRE_DTYPE_NAMES}


def specs_to_wire(specs: Specs) -> dict[str, dict[str, Any]]:
    return {name: spec.to_wire() for name, spec in specs.items()}


def specs_from_wire(value: Any) -> dict[str, Spec]:
    if not isinstance(value, dict):
        raise SpecError(f"specs are a map of name to spec, got {type(value).__name__}")
    return {str(name): Spec.from_wire(spec) for name, spec in value.items()}


@overload
def check_arrays(
    group: str, specs: Specs, arrays: Any, *, leading_ndim: int = 1, leading: tuple[int, ...]
) -> tuple[int, ...]: ...


@overload
def check_arrays(
    group: str, specs: Specs, arrays: Any, *, leading_ndim: int = 1, leading: None = None
) -> tuple[int, ...] | None: ...


def check_arrays(
    group: str, specs: Specs, arrays: Any, *, leading_ndim: int = 1, leading: tuple[int, ...] | None = None
) -> tuple[int, ...] | None:
    """Check that ``arrays`` holds exactly the arrays of ``specs``, each with the same leading dims.

    Each array has shape ``leading + spec.shape`` where ``leading`` has
    ``leading_ndim`` dims (rows, or batch and time). When ``leading`` is None it
    is taken from the first array. Returns it (None when ``specs`` is empty and
    nothing fixed it). The error names the group, the key, what was expected
    and what arrived. A ragged spec's entry must be a ``Ragged`` with those
    leading dims; one that came as its wire map is replaced by the ``Ragged``.
    """
    if not isinstance(arrays, dict):
        raise SpecError(f"{group} must be a map of name to array, got {type(arrays).__name__}")
    if arrays.keys() != specs.keys():
        missing = sorted(set(specs) - set(arrays))
        extra = sorted(set(arrays) - set(specs))
        raise SpecError(
            f"{group} keys do not match the specs: expected {sorted(specs)}, got {sorted(arrays)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unexpected {extra}" if extra else "")
        )
    for name, spec in specs.items():
        array = arrays[name]
        if spec.ragged:
            try:
                array = arrays[name] = Ragged.check(array, leading_ndim, spec.item_shape, NUMPY_DTYPES[spec.dtype])
            except ValueError as exc:
                raise SpecError(f"{group}[{name!r}] is ragged (spec shape {spec.shape}): {exc}") from None
            head = array.shape
        else:
            head = _check_array(group, name, spec, array, leading_ndim)
        if leading is None:
            leading = head
        elif head != leading:
            raise SpecError(f"{group}[{name!r}]: expected leading dims {leading} like the other arrays, got {head}")
    return leading


def _check_array(group: str, name: str, spec: Spec, array: Any, leading_ndim: int) -> tuple[int, ...]:
    """The leading dims of ``array``, or the SpecError that says how it differs from ``spec``."""
    if not isinstance(array, np.ndarray):
        raise SpecError(
            f"{group}[{name!r}] must be an array of dtype {spec.dtype} with the leading dims first, "
            f"got {type(array).__name__}"
        )
    if array.dtype != NUMPY_DTYPES[spec.dtype]:
        raise SpecError(f"{group}[{name!r}]: expected dtype {spec.dtype}, got {array.dtype.name}")
    head, tail = array.shape[:leading_ndim], array.shape[leading_ndim:]
    if len(head) != leading_ndim or tail != spec.shape:
        dims = ", ".join(("N", "T", *["?"] * leading_ndim)[:leading_ndim]) + ("," if leading_ndim == 1 else "")
        raise SpecError(
            f"{group}[{name!r}]: expected shape ({dims}) + {spec.shape} "
            f"({leading_ndim} leading dim(s), then the spec's shape), got {array.shape}"
        )
    return head


_VIEW_GROUPS = ("inputs", "actions", "rewards")


@dataclass(frozen=True)
class View:
    """An input that the agent side assembles from the trajectory, declared by the model (``Model.view_specs``).

    It is made of ``group[key]`` over ``frames`` consecutive steps, oldest first, as a ``[frames, *source shape]``
    array: for ``inputs``, the last ``frames`` observations up to the current one (a frame stack); for ``actions``
    and ``rewards``, the ``frames`` steps before the current one (the previous action, the previous reward). Frames
    from before the episode's first step are zeros. The agent builds it as it acts; its helper builds it again from
    the stored trajectory for learning (``flare2.core.views``), so learning sees exactly what acting saw.
    """

    group: str
    key: str
    frames: int = 1

    def __post_init__(self) -> None:
        if self.group not in _VIEW_GROUPS or not isinstance(self.key, str):
            raise SpecError(f"a View is made of one of {_VIEW_GROUPS} (and a key), got {self.group!r}, {self.key!r}")
        if type(self.frames) is not int or not 1 <= self.frames <= 1024:
            raise SpecError(f"View frames must be an int from 1 to 1024, got {self.frames!r}")

    @classmethod
    def last_observations(cls, frames: int, key: str = "obs") -> View:
        return cls("inputs", key, frames)

    @classmethod
    def previous_actions(cls, frames: int = 1, key: str = "action") -> View:
        return cls("actions", key, frames)

    @classmethod
    def previous_rewards(cls, frames: int = 1, key: str = "reward") -> View:
        return cls("rewards", key, frames)

    def spec(self, source: Spec) -> Spec:
        return Spec((self.frames, *source.shape), source.dtype)

    def to_wire(self) -> dict[str, Any]:
        return {"group": self.group, "key": self.key, "frames": self.frames}

    @classmethod
    def from_wire(cls, value: Any) -> View:
        if not isinstance(value, dict) or value.keys() != {"group", "key", "frames"}:
            raise SpecError(f"a view is a map of 'group', 'key' and 'frames', got {value!r}")
        return cls(value["group"], value["key"], value["frames"])


@dataclass(frozen=True)
class CTSpecs:
    """Everything an agent must know to talk to one ComputationTask."""

    inputs: dict[str, Spec]
    actions: dict[str, Spec]
    states: dict[str, Spec]
    rewards: dict[str, Spec]
    views: dict[str, View] = field(default_factory=dict)
    """The inputs the agent side assembles from the trajectory (each also in ``inputs``, with ``View.spec``)."""
    extras: dict[str, Spec] = field(default_factory=dict)
    """Per-step arrays that travel with experiences only, never to ``predict``: entries of the env's ``info`` that
    the agent names, or values an agent-side postprocessing of each episode computes (``Model.extra_specs``)."""

    def __post_init__(self) -> None:
        for group in ("states", "rewards", "extras"):
            ragged = sorted(name for name, spec in getattr(self, group).items() if spec.ragged)
            if ragged:
                raise SpecError(
                    f"{group} {ragged} are ragged (a first dim of None), which only inputs and actions may be: give "
                    f"them a fixed shape"
                )
        for name, view in self.views.items():
            source = getattr(self, view.group).get(view.key)
            if source is None or view.key in self.views:
                raise SpecError(f"view {name!r} is made of {view.group}[{view.key!r}], which the specs do not have")
            if source.ragged:
                raise SpecError(
                    f"view {name!r} is made of the ragged {view.group}[{view.key!r}]: views take fixed shapes"
                )
            if self.inputs.get(name) != view.spec(source):
                raise SpecError(f"view {name!r} must be the input {view.spec(source)}, got {self.inputs.get(name)}")

    @property
    def acting_inputs(self) -> dict[str, Spec]:
        """The inputs an agent gives as they are: every input but the views it assembles."""
        return {name: spec for name, spec in self.inputs.items() if name not in self.views}

    def to_wire(self) -> dict[str, Any]:
        return {
            "inputs": specs_to_wire(self.inputs),
            "actions": specs_to_wire(self.actions),
            "states": specs_to_wire(self.states),
            "rewards": specs_to_wire(self.rewards),
            "views": {name: view.to_wire() for name, view in self.views.items()},
            "extras": specs_to_wire(self.extras),
        }

    @classmethod
    def from_wire(cls, value: Any) -> CTSpecs:
        if not isinstance(value, dict):
            raise SpecError(f"CT specs are a map, got {type(value).__name__}")
        views = value.get("views", {})
        if not isinstance(views, dict):
            raise SpecError(f"CT views are a map of name to view, got {type(views).__name__}")
        return cls(
            **{group: specs_from_wire(value.get(group)) for group in ("inputs", "actions", "states", "rewards")},
            views={str(name): View.from_wire(view) for name, view in views.items()},
            extras=specs_from_wire(value.get("extras", {})),
        )

    def check_predict(self, payload: dict[str, Any]) -> int:
        """Validate a predict request ``{"inputs": ..., "states": ..., "evaluation": [rows] bool}``; returns its row count.

        ``evaluation`` (optional) marks the rows of evaluation episodes, which get the action without exploration.
        """
        leading = check_arrays("inputs", self.inputs, payload.get("inputs"))
        if leading is None:
            raise SpecError("a predict request counts its rows by its inputs, and this CT has none: give it an input")
        (rows,) = leading
        check_arrays("states", self.states, payload.get("states", {}), leading=(rows,))
        if "evaluation" in payload:
            check_arrays("evaluation rows", _EVALUATION_SPECS, {"evaluation": payload["evaluation"]}, leading=(rows,))
        return rows

    def experience_specs(self) -> dict[str, dict[str, Spec]]:
        """The specs of each array group of ``EXPERIENCE_GROUPS`` (``next_inputs`` are the inputs one step later)."""
        return {group: getattr(self, "inputs" if group == "next_inputs" else group) for group in EXPERIENCE_GROUPS}

    def stored_specs(self) -> dict[str, dict[str, Spec]]:
        """``experience_specs`` without the views: what a helper keeps of each step (it assembles the views from the
        trajectory when it sends a learn request, ``flare2.core.views.with_views``)."""
        groups = self.experience_specs()
        if self.views:
            for group in ("inputs", "next_inputs"):
                groups[group] = self.acting_inputs
        return groups


EXPERIENCE_GROUPS = ("inputs", "next_inputs", "actions", "rewards", "states", "extras")
"""The array groups of a step, a learn request and ``Experience``; ``CTSpecs.experience_specs`` gives their specs."""
_OPTIONAL_GROUPS = ("states", "extras")  # a learn request of a CT without them may leave them out
STEP_FLAG_SPECS = {
    "terminated": Spec((), "bool"),
    "truncated": Spec((), "bool"),
    "policy_version": Spec((), "int64"),
}
"""Per-step arrays of every learn request besides the spec groups: how the episode ended there (docs/architecture.md: Episode edges), and
the version of the weights that chose the action (the reply to its prediction said which)."""
_EVALUATION_SPECS = {"evaluation": Spec((), "bool")}
