"""Several learners training one model data-parallel (``--learners N``), as seen from an Algorithm.

Each learner process takes an equal share of the sequences of every learn
batch and runs the same ``learn()`` on it; :meth:`Algorithm.optimize` averages
the gradients of all of them (``torch.distributed``: NCCL between GPUs, gloo
on the CPU) before it clips and steps, so every learner takes the same step
and their weights stay identical, as if one learner had taken the gradient
of the whole batch. A user's Algorithm gets this without a change as long as
it steps through ``optimize()`` and takes the same number of steps on each
learner (which equal shares give). An algorithm that splits its batch into
minibatches of a set size divides that size by :func:`learners` so that the
minibatch over all learners keeps the size its settings name, as the zoo's
algorithms do.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from flare2.errors import LearnersPartedError


def learners() -> int:
    """How many learners share each learn batch (1 without ``--learners``)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def minibatch_share(minibatch_size: int) -> int:
    """This learner's part of a minibatch of ``minibatch_size`` rows over all learners."""
    return max(1, minibatch_size // learners())


def average_buffers(modules: list[torch.nn.Module]) -> None:
    """Replace each floating-point buffer of ``modules`` with its mean over the learners (in one collective call).
    Integer buffers (BatchNorm's count of batches) are the same on every learner, which takes as many steps."""
    count = learners()
    buffers = [buffer for module in modules for buffer in module.buffers() if buffer.is_floating_point()]
    if count == 1 or not buffers:
        return
    with torch.no_grad():
        flat = torch.cat([buffer.reshape(-1).to(torch.float64) for buffer in buffers])
        _all_reduce(flat, "buffer")
        flat /= count
        offset = 0
        for buffer in buffers:
            buffer.copy_(flat[offset : offset + buffer.numel()].view_as(buffer))
            offset += buffer.numel()


def average_gradients(parameters: list[torch.Tensor]) -> None:
    """Replace each parameter's gradient with its mean over the learners (in one collective call); a parameter
    without a gradient counts as a zero one, so every learner sends the same layout."""
    count = learners()
    if count == 1 or not parameters:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    _all_reduce(flat, "gradient")
    flat /= count
    offset = 0
    for parameter, grad in zip(parameters, grads):
        mean = flat[offset : offset + grad.numel()].view_as(grad)
        offset += grad.numel()
        if parameter.grad is None:
            parameter.grad = mean.clone()
        else:
            parameter.grad.copy_(mean)


def _all_reduce(flat: torch.Tensor, what: str) -> None:
    """Sum ``flat`` over the learners; a LearnersPartedError when one of them is gone (the collective call fails)."""
    try:
        dist.all_reduce(flat)
    except RuntimeError as exc:  # gloo and NCCL report a learner that left as a RuntimeError of their own
        raise LearnersPartedError(f"the learners' {what} average failed: another learner is gone ({exc})") from exc
