"""The weights the first learner process writes and the compute process adopts
(``flare2.runtime.compute.shared_weights``): one memory file both processes map."""

from __future__ import annotations

import multiprocessing
from multiprocessing import resource_sharer
from multiprocessing.connection import Connection
from types import SimpleNamespace

import torch

from flare2.runtime.compute.shared_weights import SharedWeights, WeightsLayout


def add_one_to_each(pipe: Connection, layout: WeightsLayout) -> None:
    for ct in SharedWeights.receive(pipe, layout).tensors:
        for tensor in ct:
            tensor.add_(1)
    pipe.send("done")


def refuse(_fd):
    raise AssertionError("a tensor's fd went through multiprocessing's resource sharer")


def test_weights_written_by_another_process_are_read_in_place_and_no_resource_sharer_is_used(monkeypatch):
    # The resource sharer (torch's way to hand a shared tensor to a running process) keeps a socket in a pymp-*
    # folder of /tmp, which a killed compute process leaves behind.
    monkeypatch.setattr(resource_sharer, "DupFd", refuse)
    weights = [
        [torch.arange(12, dtype=torch.float32).view(3, 4), torch.tensor([7, -2], dtype=torch.int64)],
        [torch.zeros(0), torch.full((5,), 0.5, dtype=torch.bfloat16), torch.ones(1, 3, dtype=torch.float64)],
    ]
    cts = [SimpleNamespace(weight_tensors=lambda tensors=tensors: tensors) for tensors in weights]
    shared = SharedWeights.of(cts)
    spawn = multiprocessing.get_context("spawn")
    pipe, child_end = spawn.Pipe()
    process = spawn.Process(target=add_one_to_each, args=(child_end, shared.layout))
    process.start()
    child_end.close()
    shared.send(pipe, process.pid or 0)
    assert pipe.poll(60) and pipe.recv() == "done"
    process.join(60)
    assert process.exitcode == 0
    for read, written in zip(shared.tensors, weights):
        for tensor, original in zip(read, written):
            assert tensor.dtype == original.dtype and tensor.shape == original.shape
            assert torch.equal(tensor, original + 1)
