"""RaggedTensor: what a Model gets for a ragged input, a batch of rows with a varying number of items, no padding.

The CDP concatenates the requests of many agents and envs: the items of every
observation lie one after another in ``values`` ``[total, *item_shape]``, and
``lengths`` (``[B]`` when acting, ``[N, T]`` when learning) says how many
belong to each. A model works on the flat items (an embedding is one matmul
over all of them), pools them per row (``segment_sum``/``segment_mean``/
``segment_max``), or pads them for attention (``padded``, ``attention_mask``);
no item ever attends to another observation's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, overload

import numpy as np
import torch

from flare2.wire.ragged import Ragged


class RaggedTensor:
    """Rows of a varying number of items on one device: ``values`` ``[total, *item_shape]``, ``lengths`` ``[*leading]``."""

    __slots__ = ("values", "lengths", "_row_ids", "_offsets")

    def __init__(self, values: torch.Tensor, lengths: torch.Tensor) -> None:
        self.values = values
        self.lengths = lengths
        self._row_ids: torch.Tensor | None = None
        self._offsets: torch.Tensor | None = None

    @classmethod
    def from_ragged(cls, ragged: Ragged, device: torch.device | str = "cpu") -> RaggedTensor:
        return cls(torch.from_numpy(ragged.values).to(device), torch.from_numpy(ragged.lengths).to(device))

    def to_ragged(self) -> Ragged:
        return Ragged(
            self.values.detach().cpu().numpy(), self.lengths.detach().cpu().numpy().astype(np.int64, copy=False)
        )

    def to(self, device: torch.device | str) -> RaggedTensor:
        return RaggedTensor(self.values.to(device), self.lengths.to(device))

    def with_values(self, values: torch.Tensor) -> RaggedTensor:
        """The same rows with other per-item values (``[total, ...]``): an embedding, a score per item."""
        if values.shape[0] != self.values.shape[0]:
            raise ValueError(f"with_values needs one row per item ({self.values.shape[0]}), got {values.shape[0]}")
        result = RaggedTensor(values, self.lengths)
        result._row_ids, result._offsets = self._row_ids, self._offsets
        return result

    @property
    def shape(self) -> tuple[int, ...]:
        """The leading dims."""
        return tuple(self.lengths.shape)

    @property
    def rows(self) -> int:
        """The rows over all leading dims (``B``, or ``N * T``)."""
        return self.lengths.numel()

    @property
    def device(self) -> torch.device:
        return self.values.device

    def __repr__(self) -> str:
        return f"RaggedTensor(lengths={self.lengths.tolist()}, values={tuple(self.values.shape)}, device={self.device})"

    def offsets(self) -> torch.Tensor:
        """``[rows + 1]``: where each row's items start in ``values``, and the total at the end."""
        if self._offsets is None:
            flat = self.lengths.reshape(-1)
            self._offsets = torch.cat([flat.new_zeros(1), torch.cumsum(flat, 0)])
        return self._offsets

    def row_ids(self) -> torch.Tensor:
        """``[total]``: the row (flat over the leading dims) each item belongs to."""
        if self._row_ids is None:
            flat = self.lengths.reshape(-1)
            self._row_ids = torch.repeat_interleave(torch.arange(flat.numel(), device=flat.device), flat)
        return self._row_ids

    def _per_row(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled.reshape(*self.shape, *pooled.shape[1:])

    def segment_sum(self, values: torch.Tensor | None = None) -> torch.Tensor:
        """``[*leading, ...]``: the sum of each row's items (0 for a row of none)."""
        values = self.values if values is None else values
        pooled = values.new_zeros((self.rows, *values.shape[1:])).index_add_(0, self.row_ids(), values)
        return self._per_row(pooled)

    def segment_mean(self, values: torch.Tensor | None = None) -> torch.Tensor:
        """``[*leading, ...]``: the mean of each row's items (0 for a row of none)."""
        values = self.values if values is None else values
        total = self.segment_sum(values)
        counts = self.lengths.clamp(min=1).to(total.dtype)
        return total / counts.reshape(*counts.shape, *[1] * (total.dim() - counts.dim()))

    def segment_max(self, values: torch.Tensor | None = None, empty: float = 0.0) -> torch.Tensor:
        """``[*leading, ...]``: the elementwise max of each row's items (``empty`` for a row of none)."""
        values = self.values if values is None else values
        index = self.row_ids().reshape(-1, *[1] * (values.dim() - 1)).expand_as(values)
        pooled = values.new_full((self.rows, *values.shape[1:]), float("-inf"))
        pooled = pooled.scatter_reduce(0, index, values, reduce="amax", include_self=True)
        pooled = torch.where(torch.isinf(pooled) & (pooled < 0), torch.full_like(pooled, empty), pooled)
        return self._per_row(pooled)

    def segment_log_softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """``[total]``: log-softmax of one score per item within its row (a choice among the row's items)."""
        ids = self.row_ids()
        top = scores.new_full((self.rows,), float("-inf")).scatter_reduce(0, ids, scores, reduce="amax")
        shifted = scores - top[ids]
        sums = scores.new_zeros(self.rows).index_add_(0, ids, shifted.exp())
        return shifted - sums.log()[ids]

    def padded(self, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """``[rows, longest, *item_shape]`` with ``fill`` past each row's items, and the ``[rows, longest]`` mask of
        real items (rows flat over the leading dims), for layers that want a dense batch."""
        flat = self.lengths.reshape(-1)
        longest = int(flat.max()) if flat.numel() else 0
        mask = torch.arange(longest, device=flat.device)[None, :] < flat[:, None]
        out = self.values.new_full((flat.numel(), longest, *self.values.shape[1:]), fill)
        out[mask] = self.values
        return out, mask

    def unpadded(self, padded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[total, ...]``: the real items of a ``padded`` batch, back in the flat order of ``values``."""
        return padded[mask]

    def attention_mask(self) -> torch.Tensor:
        """``[total, total]`` bool, True where item i may attend to item j: only within one row (observation)."""
        ids = self.row_ids()
        return ids[:, None] == ids[None, :]

    def flat(self) -> RaggedTensor:
        """The same items with the leading dims merged into one (``[N, T]`` lengths become ``[N * T]``)."""
        return self if self.lengths.dim() == 1 else RaggedTensor(self.values, self.lengths.reshape(-1))

    def take(self, index: torch.Tensor) -> RaggedTensor:
        """The rows ``index`` (a 1-d int tensor over the first leading dim of 1-d lengths), with their items."""
        counts = self.lengths[index]
        starts = self.offsets()[index]
        ends = torch.cumsum(counts, 0)
        positions = torch.repeat_interleave(starts - (ends - counts), counts) + torch.arange(
            int(ends[-1]) if ends.numel() else 0, device=counts.device
        )
        return RaggedTensor(self.values[positions], counts)


# Overloaded so that tensors with no ragged entry stay typed as plain tensors.
@overload
def flat_rows(tensors: Mapping[str, torch.Tensor], leading_ndim: int = 2) -> dict[str, torch.Tensor]: ...


@overload
def flat_rows(
    tensors: Mapping[str, torch.Tensor | RaggedTensor], leading_ndim: int = 2
) -> dict[str, torch.Tensor | RaggedTensor]: ...


def flat_rows(tensors: Mapping[str, torch.Tensor | RaggedTensor], leading_ndim: int = 2) -> dict[str, Any]:
    """Merge the ``leading_ndim`` leading dims of every tensor (``[N, T, ...]`` to ``[N * T, ...]``), ragged or not."""
    return {
        key: value.flat() if isinstance(value, RaggedTensor) else value.reshape(-1, *value.shape[leading_ndim:])
        for key, value in tensors.items()
    }


@overload
def take_rows(tensors: Mapping[str, torch.Tensor], index: torch.Tensor) -> dict[str, torch.Tensor]: ...


@overload
def take_rows(
    tensors: Mapping[str, torch.Tensor | RaggedTensor], index: torch.Tensor
) -> dict[str, torch.Tensor | RaggedTensor]: ...


def take_rows(tensors: Mapping[str, torch.Tensor | RaggedTensor], index: torch.Tensor) -> dict[str, Any]:
    """The rows ``index`` of every tensor (flat leading dim), ragged or not."""
    return {
        key: value.take(index) if isinstance(value, RaggedTensor) else value[index] for key, value in tensors.items()
    }


def pad_rows(
    parts: list[RaggedTensor], first: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The items of several ragged tensors of the same rows (entity types embedded to one width) as one padded
    sequence per row, for attention that must stay within each observation.

    Row r holds ``first[r]`` (an optional token per row, such as the embedded fixed features), then its items of
    ``parts[0]``, of ``parts[1]``, ... Returns ``[rows, longest, width]`` (zeros past the end), the
    ``[rows, longest]`` mask of real tokens (``~mask`` is a transformer's ``src_key_padding_mask``) and, per part,
    the (row, position) of each of its items: ``padded[row, position]`` reads their outputs back, in ``values`` order.
    """
    if parts:
        rows, device = parts[0].rows, parts[0].device
    elif first is not None:
        rows, device = first.shape[0], first.device
    else:
        raise ValueError("pad_rows needs ragged parts or a first token per row to know the rows")
    used = torch.full((rows,), int(first is not None), dtype=torch.int64, device=device)
    where = []
    for part in parts:
        row = part.row_ids()
        # An item's place is the row's tokens so far plus its own index among the row's items of this part.
        position = used[row] + torch.arange(row.numel(), device=device) - part.offsets()[row]
        where.append((row, position))
        used = used + part.lengths.reshape(-1)
    longest = int(used.max()) if rows else 0
    width = first.shape[-1] if first is not None else parts[0].values.shape[-1]
    dtype = first.dtype if first is not None else parts[0].values.dtype
    padded = torch.zeros((rows, longest, width), dtype=dtype, device=device)
    if first is not None:
        padded[:, 0] = first
    for part, (row, position) in zip(parts, where):
        padded[row, position] = part.values
    mask = torch.arange(longest, device=device)[None, :] < used[:, None]
    return padded, mask, where
