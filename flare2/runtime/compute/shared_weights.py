"""The weights the first learner process writes and the compute process adopts, in one memory file both map.

torch's own way to hand a shared tensor to a running process sends its fd
through multiprocessing's resource sharer, which listens on a socket in a
``pymp-*`` folder of /tmp for as long as the sender lives: a compute process
that is killed (the out-of-memory killer, kill -9) leaves that folder behind.
Here the CTs' weights live in one anonymous memory file (``memfd``: nothing in
/tmp or /dev/shm), whose fd crosses the learner's pipe once (``SCM_RIGHTS``);
the kernel frees it when both processes are gone, whichever way they went.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle

import torch

from flare2.core.computation_task import ComputationTask, copy_tensors

_ALIGN = 64


@dataclass(frozen=True)
class WeightsLayout:
    """Where each CT's weight tensors lie in the memory file: per CT, (dtype name, shape, byte offset) of each
    tensor in ``weight_tensors`` order. Plain data: it goes to the learner with its settings."""

    tensors: tuple[tuple[tuple[str, tuple[int, ...], int], ...], ...]
    size: int


class SharedWeights:
    """``tensors[i]``: CT ``i``'s weights (host memory, whatever the device), in ``weight_tensors`` order."""

    def __init__(self, layout: WeightsLayout, fd: int) -> None:
        self.layout = layout
        self._fd = fd
        # An empty file cannot be mapped: a run whose CTs have no weights maps one page.
        self._memory = mmap.mmap(fd, max(layout.size, 1))
        self.tensors = [[self._tensor(*place) for place in ct] for ct in layout.tensors]

    @classmethod
    def of(cls, cts: list[ComputationTask]) -> SharedWeights:
        """A memory file holding a copy of the CTs' weights."""
        tensors, size = [], 0
        for ct in cts:
            places = []
            for tensor in ct.weight_tensors():
                places.append((str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), size))
                size += -(-tensor.numel() * tensor.element_size() // _ALIGN) * _ALIGN
            tensors.append(tuple(places))
        fd = os.memfd_create("flare2-weights", os.MFD_CLOEXEC)
        os.ftruncate(fd, max(size, 1))
        shared = cls(WeightsLayout(tuple(tensors), size), fd)
        for target, ct in zip(shared.tensors, cts):
            copy_tensors(target, [tensor.detach() for tensor in ct.weight_tensors()])
        return shared

    def send(self, pipe: Connection, pid: int) -> None:
        """Hand the memory file to the learner process ``pid`` at the other end of ``pipe``; it takes it with
        ``receive`` before it reads anything else there."""
        send_handle(pipe, self._fd, pid)

    @classmethod
    def receive(cls, pipe: Connection, layout: WeightsLayout) -> SharedWeights:
        return cls(layout, recv_handle(pipe))

    def _tensor(self, dtype_name: str, shape: tuple[int, ...], offset: int) -> torch.Tensor:
        dtype = getattr(torch, dtype_name)
        count = math.prod(shape)
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self._memory, dtype=dtype, count=count, offset=offset).view(shape)
