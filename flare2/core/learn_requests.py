"""Learn requests as they cross from the agents to learn(): each observation once.

Spelled out (``Experience``), each of the N x T steps of a learn request has its
``inputs``, its ``next_inputs`` (the inputs one step later) and, for a CT with
trajectory views, every view of both. For Atari's PPO preset (8 envs x 128
steps of 84x84 frames, a view of the last 4) that is 72 MB, nine times the
frames it holds. On the way (``pack``), each observation crosses once:

- ``inputs``: the acting inputs (no views) of ``C + T + 1`` steps per sequence,
  ``[N, C + T + 1, ...]``: the ``C`` steps before the first, as far back as the
  views reach (``view_context``; zeros where the agent has none), the T steps,
  and the next inputs of the last one;
- ``next_inputs``: only the next inputs that are not the following step's
  inputs, ``[E, ...]`` (those of steps whose episode ended there: the final
  observation, which a reset replaced), and ``next_at``, int64 ``[E]``: their
  steps as ``n * T + t``, ascending (t < T - 1);
- ``ages``: for a CT with views, each of the ``C + T`` steps' age in its episode,
  ``[N, C + T]``, from which ``unpack`` rebuilds the views exactly as the agent
  acted on them (``flare2.core.views.with_views``);
- the other groups and the step flags of the same ``C + T`` steps,
  ``[N, C + T, ...]`` (views of actions and rewards reach back too).

Atari's request is then 7.4 MB. Ragged inputs (entities) vary in size and cross
whole, ``[N, C + T]`` in both ``inputs`` and ``next_inputs``. The CDP checks a
request (``check_learn``), batches requests (``concatenate``) and the learner
spells the batch out just before learn() (``unpack``), so requests stay small
on the pipe to a learner process too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flare2.core.specs import _OPTIONAL_GROUPS, STEP_FLAG_SPECS, CTSpecs, Spec, check_arrays
from flare2.core.views import view_context, with_views
from flare2.errors import SpecError
from flare2.wire.ragged import Ragged, concat_rows

NEXT_AT = "next_at"
AGES = "ages"
NEXT_INPUTS_FOLLOW = "next_inputs_follow"
"""The key of ``Experience.next_inputs_follow`` in a spelled-out request."""
_INDEX_SPECS = {"next_at": Spec((), "int64")}
_AGE_SPECS = {"ages": Spec((), "int64")}


def _fixed(specs: CTSpecs) -> list[str]:
    """The acting inputs that cross once each (the ragged ones cross whole)."""
    return [key for key, spec in specs.acting_inputs.items() if not spec.ragged]


def pack(specs: CTSpecs, steps: dict[str, Any], context: int, ages: np.ndarray | None = None) -> dict[str, Any]:
    """The request to send for stored steps: ``steps`` holds every group of ``specs.stored_specs()`` and the step
    flags as ``[N, context + T, ...]`` (the first ``context`` steps only there for the views, at most
    ``view_context``), ``ages`` their ages in their episodes ``[N, context + T]`` (for a CT with views)."""
    reach = view_context(specs)
    pad = reach - context
    padded = {
        key: {name: _padded(array, pad) for name, array in value.items()}
        if isinstance(value, dict)
        else _padded(value, pad)
        for key, value in steps.items()
    }
    sequences, width = steps["terminated"].shape[0], steps["terminated"].shape[1] + pad
    count = width - reach
    stored_next = padded["next_inputs"]
    changed = np.zeros((sequences, count), bool)
    inputs: dict[str, Any] = {}
    next_inputs: dict[str, Any] = {}
    for key in _fixed(specs):
        now, following = padded["inputs"][key], stored_next[key]
        inputs[key] = np.concatenate([now, following[:, -1:]], axis=1)
        # The next inputs of step t that are not step t + 1's inputs (an episode's end: the final observation).
        differs = following[:, reach:-1] != now[:, reach + 1 :]
        if differs.size:
            changed[:, :-1] |= differs.reshape(sequences, count - 1, -1).any(-1)
    at = np.flatnonzero(changed)
    rows, steps_at = np.divmod(at, count)
    for key in _fixed(specs):
        next_inputs[key] = stored_next[key][rows, reach + steps_at]
    for key, spec in specs.acting_inputs.items():
        if spec.ragged:
            inputs[key], next_inputs[key] = padded["inputs"][key], stored_next[key]
    payload = {**padded, "inputs": inputs, "next_inputs": next_inputs, NEXT_AT: at.astype(np.int64)}
    if specs.views:
        if ages is None:
            raise ValueError("pack of a CT with views needs the steps' ages in their episodes (EpisodeAges)")
        payload[AGES] = _padded(ages, pad)
    return payload


def _padded(value: Any, pad: int) -> Any:
    """``[N, S, ...]`` after ``pad`` steps of zeros (of rows without items, for Ragged): ``[N, pad + S, ...]``."""
    if not pad:
        return value
    if isinstance(value, Ragged):
        # Rows without items add no values: the items keep their order.
        return Ragged(value.values, np.concatenate([np.zeros((len(value.lengths), pad), np.int64), value.lengths], 1))
    return np.concatenate([np.zeros((value.shape[0], pad, *value.shape[2:]), value.dtype), value], axis=1)


def least_bytes(specs: CTSpecs, sequences: int, steps: int) -> int:
    """The fewest bytes a request of ``sequences`` x ``steps`` takes as ``pack`` makes it: every fixed-shape array
    and flag, no episode's end among its steps (each adds a next input), no ragged item, no encoding overhead."""
    width = view_context(specs) + steps
    per_step = sum(
        spec.nbytes for group in ("actions", "rewards", "states", "extras") for spec in _fixed_specs(specs, group)
    )
    per_step += sum(spec.nbytes for spec in STEP_FLAG_SPECS.values()) + (8 if specs.views else 0)
    observations = sum(specs.acting_inputs[key].nbytes for key in _fixed(specs))
    return sequences * (width * per_step + (width + 1) * observations)


def _fixed_specs(specs: CTSpecs, group: str) -> list[Spec]:
    return [spec for spec in getattr(specs, group).values() if not spec.ragged]


def check_learn(specs: CTSpecs, payload: dict[str, Any]) -> tuple[int, int]:
    """Validate a learn request as ``pack`` makes it: N sequences of T steps; returns (N, T)."""
    if not isinstance(payload, dict):
        raise SpecError(f"a learn request is a map of groups, got {type(payload).__name__}")
    reach = view_context(specs)
    flags = {name: payload.get(name) for name in STEP_FLAG_SPECS}
    # The step flags always count the sequences and steps, even of a CT whose groups hold no arrays.
    leading = check_arrays("step flags", STEP_FLAG_SPECS, flags, leading_ndim=2)
    assert leading is not None, "STEP_FLAG_SPECS is never empty"
    sequences, width = leading
    count = width - reach
    if count < 1:
        raise SpecError(
            f"a learn request of this CT holds {reach} steps for its views and at least one more, got {width}"
        )
    for group in ("actions", "rewards", "states", "extras"):
        default: dict[str, Any] | None = {} if group in _OPTIONAL_GROUPS else None
        check_arrays(group, getattr(specs, group), payload.get(group, default), leading_ndim=2, leading=leading)
    inputs, next_inputs = payload.get("inputs"), payload.get("next_inputs")
    for group, value in (("inputs", inputs), ("next_inputs", next_inputs)):
        if not isinstance(value, dict) or value.keys() != specs.acting_inputs.keys():
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise SpecError(f"{group} must map each input of {sorted(specs.acting_inputs)} to its array, got {got}")
    assert isinstance(inputs, dict) and isinstance(next_inputs, dict)
    fixed = {key: specs.acting_inputs[key] for key in _fixed(specs)}
    ragged = {key: spec for key, spec in specs.acting_inputs.items() if spec.ragged}
    check_arrays("inputs", fixed, {k: inputs[k] for k in fixed}, leading_ndim=2, leading=(sequences, width + 1))
    at_leading = check_arrays(NEXT_AT, _INDEX_SPECS, {NEXT_AT: payload.get(NEXT_AT)})
    assert at_leading is not None, "_INDEX_SPECS is not empty"
    (at_count,) = at_leading
    check_arrays("next_inputs", fixed, {k: next_inputs[k] for k in fixed}, leading=(at_count,))
    at = payload[NEXT_AT]
    if at_count and (
        at.min() < 0 or at.max() >= sequences * count or (at % count == count - 1).any() or (np.diff(at) <= 0).any()
    ):
        raise SpecError(f"next_at must be ascending steps n * T + t, t < T - 1, of the {sequences} x {count} steps")
    for group, value in (("inputs", inputs), ("next_inputs", next_inputs)):
        checked = {key: value[key] for key in ragged}
        check_arrays(group, ragged, checked, leading_ndim=2, leading=leading)
        value.update(checked)  # their wire maps, made Ragged
    if specs.views:
        check_arrays(AGES, _AGE_SPECS, {AGES: payload.get(AGES)}, leading_ndim=2, leading=leading)
        if (payload[AGES] < 0).any():
            raise SpecError("ages must be >= 0")
    elif AGES in payload:
        raise SpecError("ages come with the requests of a CT with views, and this one has none")
    return sequences, count


def concatenate(specs: CTSpecs, payloads: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Checked requests of one length as one (new arrays), their sequences one after another."""
    first = payloads[0]
    merged: dict[str, Any] = {
        key: {name: concat_rows([p[key][name] for p in payloads]) for name in value}
        if isinstance(value, dict)
        else concat_rows([p[key] for p in payloads])
        for key, value in first.items()
        if key != NEXT_AT
    }
    # next_at counts the steps of each request from its first: shift it by the steps of the requests before.
    count = first["terminated"].shape[1] - view_context(specs)
    steps_before = np.cumsum([0] + [len(p["terminated"]) * count for p in payloads[:-1]])
    merged[NEXT_AT] = np.concatenate([p[NEXT_AT] + offset for p, offset in zip(payloads, steps_before)])
    return merged


def unpack(specs: CTSpecs, payload: dict[str, Any]) -> dict[str, Any]:
    """The request spelled out as ``Experience`` takes it: every group ``[N, T, ...]``, views included, and
    ``next_inputs_follow`` unless the inputs are ragged."""
    reach = view_context(specs)
    sequences, width = payload["terminated"].shape
    count = width - reach
    steps = {key: value for key, value in payload.items() if key not in (NEXT_AT, AGES)}
    inputs: dict[str, Any] = {}
    next_inputs: dict[str, Any] = {}
    rows, steps_at = np.divmod(payload[NEXT_AT], count)
    for key in _fixed(specs):
        series = payload["inputs"][key]
        inputs[key] = series[:, :width]
        following = series[:, 1:].copy()
        following[rows, reach + steps_at] = payload["next_inputs"][key]
        next_inputs[key] = following
    for key, spec in specs.acting_inputs.items():
        if spec.ragged:
            inputs[key], next_inputs[key] = payload["inputs"][key], payload["next_inputs"][key]
    steps.update(inputs=inputs, next_inputs=next_inputs)
    spelled_out = with_views(specs, steps, payload[AGES], reach) if specs.views else steps
    if not any(spec.ragged for spec in specs.acting_inputs.values()):
        # Ragged next inputs cross whole (see the module docstring): only fixed ones are known to follow.
        follow = np.ones((sequences, count), bool)
        follow[:, -1] = False
        follow[rows, steps_at] = False
        spelled_out[NEXT_INPUTS_FOLLOW] = follow
    return spelled_out
