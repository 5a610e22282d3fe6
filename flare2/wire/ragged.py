"""Ragged arrays: a varying number of items per row (the mines of an observation, the words of a sentence), no padding.

A ``Ragged`` keeps the items of every row one after another in ``values``
(``[total, *item_shape]``) and the item count of each row in ``lengths``, an
int64 array whose shape is the leading dims: ``[rows]`` in a prediction
request, ``[N, T]`` in a learn request (rows in C order, so a sequence's steps
are together). Observations with 3, 0 and 5 mines make 8 rows of ``values``.
On the wire it is the map ``{"values": ..., "lengths": ...}``; the CT's specs
turn that back into a ``Ragged`` after checking that the lengths add up.

The functions at the end work alike on numpy arrays and on ``Ragged``: the
CDP, the helpers and the ComputationTask batch both kinds with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class Ragged:
    """Rows of a varying number of items, kept flat: ``values`` ``[total, *item_shape]``, ``lengths`` ``[*leading]``.

    Indexing (``r[2:5]``, ``r[index_array]``) selects along the first leading dim, as for an array.
    """

    __slots__ = ("values", "lengths", "_offsets")

    def __init__(self, values: np.ndarray, lengths: np.ndarray) -> None:
        """No check here (``check`` is for data from elsewhere): ``lengths`` must be int64 and add up to ``len(values)``."""
        self.values = values
        self.lengths = lengths
        self._offsets: np.ndarray | None = None

    @classmethod
    def from_items(cls, items: Sequence[Any], item_shape: tuple[int, ...] = (), dtype: Any = "float32") -> Ragged:
        """One row per element of ``items``, each an array (or list) of shape ``[count, *item_shape]``."""
        dtype = np.dtype(dtype)
        arrays = [np.asarray(item, dtype).reshape(-1, *item_shape) for item in items]
        lengths = np.fromiter((len(array) for array in arrays), np.int64, len(arrays))
        values = np.concatenate(arrays) if arrays else np.zeros((0, *item_shape), dtype)
        return cls(values, lengths)

    @classmethod
    def empty(cls, leading: tuple[int, ...], item_shape: tuple[int, ...], dtype: Any) -> Ragged:
        """Rows of no items (an observation with no entities is a valid one)."""
        return cls(np.zeros((0, *item_shape), dtype), np.zeros(leading, np.int64))

    @property
    def shape(self) -> tuple[int, ...]:
        """The leading dims (``lengths.shape``)."""
        return self.lengths.shape

    @property
    def item_shape(self) -> tuple[int, ...]:
        return self.values.shape[1:]

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    def __len__(self) -> int:
        return self.lengths.shape[0]

    def __repr__(self) -> str:
        return f"Ragged(lengths={self.lengths.tolist()}, item_shape={self.item_shape}, dtype={self.dtype.name})"

    def offsets(self) -> np.ndarray:
        """``[len + 1]``: where each entry of the first leading dim starts in ``values``, and the total at the end."""
        if self._offsets is None:
            counts = self.lengths.reshape(len(self), -1).sum(axis=1) if self.lengths.ndim > 1 else self.lengths
            offsets = np.zeros(len(self) + 1, np.int64)
            np.cumsum(counts, out=offsets[1:])
            self._offsets = offsets
        return self._offsets

    def items(self) -> list[np.ndarray]:
        """The items of each row, rows in C order of the leading dims (views of ``values``)."""
        ends = np.cumsum(self.lengths.reshape(-1))
        return np.split(self.values, ends[:-1]) if ends.size else []

    def __getitem__(self, index: Any) -> Ragged:
        offsets = self.offsets()
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return Ragged(self.values[offsets[start] : offsets[max(start, stop)]], self.lengths[index])
            index = np.arange(start, stop, step)
        index = np.asarray(index)
        if index.dtype == bool:
            if index.shape != (len(self),):
                raise IndexError(
                    f"a bool index of a Ragged has one entry per row ({len(self)}), got shape {index.shape}"
                )
            index = np.flatnonzero(index)
        if index.ndim != 1 or index.dtype.kind not in "iu":
            raise IndexError(
                f"a Ragged is indexed along its first dim by a slice or a 1-d int or bool array, got {index!r}"
            )
        index = np.where(index < 0, index + len(self), index)
        return Ragged(self.values[_segments(offsets[index], offsets[index + 1] - offsets[index])], self.lengths[index])

    def astype(self, dtype: Any, copy: bool = True) -> Ragged:
        values = self.values.astype(dtype, copy=copy)
        return self if values is self.values else Ragged(values, self.lengths)

    def copy(self) -> Ragged:
        return Ragged(self.values.copy(), self.lengths.copy())

    def padded(self, fill: Any = 0) -> tuple[np.ndarray, np.ndarray]:
        """``[*leading, longest, *item_shape]`` with ``fill`` past each row's items, and the ``[*leading, longest]``
        mask of real items."""
        flat = self.lengths.reshape(-1)
        longest = int(flat.max()) if flat.size else 0
        mask = np.arange(longest)[None, :] < flat[:, None]
        out = np.full((flat.size, longest, *self.item_shape), fill, self.dtype)
        out[mask] = self.values
        return out.reshape(*self.shape, longest, *self.item_shape), mask.reshape(*self.shape, longest)

    def to_wire(self) -> dict[str, np.ndarray]:
        return {"values": self.values, "lengths": self.lengths}

    @classmethod
    def check(cls, value: Any, leading_ndim: int, item_shape: tuple[int, ...], dtype: np.dtype) -> Ragged:
        """A Ragged from data of unknown origin (its wire map, or a Ragged), or ValueError saying what is wrong."""
        if isinstance(value, Ragged):
            values, lengths = value.values, value.lengths
        elif isinstance(value, dict) and value.keys() == {"values", "lengths"}:
            values, lengths = value["values"], value["lengths"]
        else:
            raise ValueError(
                f"a ragged array must be a flare2.Ragged (on the wire, a map of 'values' and 'lengths'), "
                f"got {type(value).__name__}"
            )
        if not isinstance(lengths, np.ndarray) or lengths.dtype != np.int64 or lengths.ndim != leading_ndim:
            got = f"{lengths.dtype.name} {lengths.shape}" if isinstance(lengths, np.ndarray) else type(lengths).__name__
            raise ValueError(f"its lengths must be an int64 array of {leading_ndim} dim(s), got {got}")
        if (
            not isinstance(values, np.ndarray)
            or values.dtype != dtype
            or values.shape[1:] != item_shape
            or values.ndim < 1
        ):
            got = f"{values.dtype.name} {values.shape}" if isinstance(values, np.ndarray) else type(values).__name__
            raise ValueError(f"its values must be a {dtype.name} array of shape (items,) + {item_shape}, got {got}")
        if lengths.size and (lengths.min() < 0 or lengths.max() > len(values)):
            raise ValueError(f"its lengths must be between 0 and the {len(values)} items of values")
        # Each length is at most len(values) and there are fewer lengths than bytes: the sum cannot overflow.
        total = int(lengths.sum())
        if total != len(values):
            raise ValueError(f"its lengths add up to {total} items, but values holds {len(values)}")
        return value if isinstance(value, Ragged) else cls(values, lengths)


def _segments(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices ``starts[i] .. starts[i] + counts[i] - 1`` of every segment, one after another."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(counts)
    # Each index is its segment's start plus its position in the segment.
    return np.repeat(starts - (ends - counts), counts) + np.arange(total)


def concat_rows(parts: Sequence[Any]) -> Any:
    """``np.concatenate`` along the first dim, for arrays or for Ragged."""
    if isinstance(parts[0], Ragged):
        return Ragged(np.concatenate([part.values for part in parts]), np.concatenate([part.lengths for part in parts]))
    return np.concatenate(parts)


def concat_time(parts: Sequence[Any]) -> Any:
    """Sequences ``[1, T_i, ...]`` one after another in time, as ``[1, sum T_i, ...]``, for arrays or for Ragged."""
    if isinstance(parts[0], Ragged):
        return Ragged(
            np.concatenate([part.values for part in parts]), np.concatenate([part.lengths for part in parts], axis=1)
        )
    return np.concatenate(parts, axis=1)


def stack_time(parts: Sequence[Any]) -> Any:
    """T steps of K rows as ``[K, T, ...]`` (``np.stack(parts, axis=1)``), for arrays or for Ragged."""
    if not isinstance(parts[0], Ragged):
        return np.stack(parts, axis=1)
    lengths = np.stack([part.lengths for part in parts], axis=1)  # [K, T]
    # Where each step's items start in the steps' values laid one after another, then read row by row.
    bases = np.cumsum([0, *(len(part.values) for part in parts[:-1])])
    starts = np.stack([base + part.offsets()[:-1] for base, part in zip(bases, parts)], axis=1)
    values = np.concatenate([part.values for part in parts])
    return Ragged(values[_segments(starts.reshape(-1), lengths.reshape(-1))], lengths)


def rows_in_order(parts: Sequence[tuple[np.ndarray, Any]], rows: int) -> Any:
    """Put back the rows of several parts, each ``(row indices, rows)``, into one of ``rows`` rows in index order."""
    index = np.concatenate([part_index for part_index, _ in parts])
    merged = concat_rows([part for _, part in parts])
    order = np.empty(rows, np.int64)
    order[index] = np.arange(rows)
    return merged[order]
