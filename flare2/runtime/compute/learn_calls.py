"""One ``learn()`` call of a CT on a batch of learn requests, wherever it runs (inline, a learner thread, a learner
process, or one of ``--learners N`` on its share), and what it gives back."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple

from flare2.core.learn_requests import unpack

if TYPE_CHECKING:
    from flare2.core.computation_task import ComputationTask


class Learned(NamedTuple):
    """What one ``learn()`` call gave: its costs, the policy lag summed over its steps, the number of steps, and the
    seconds it took."""

    costs: dict[str, float]
    lag_sum: int
    lag_steps: int
    seconds: float


def learn_with_lag(ct: ComputationTask, batch: dict[str, Any], share: tuple[int, int] = (0, 1)) -> Learned:
    """``ct.learn()`` of a batch of requests as they crossed (``flare2.core.learn_requests``), with the policy lag of
    its steps and its time (spelling the batch out included). ``share``: (learner, learners) of ``--learners``, each
    learning from its equal share of the batch's sequences, their buffers averaged after it."""
    start = time.perf_counter()
    experience = unpack(ct.specs, batch)
    if share[1] > 1:
        experience = _share_of_sequences(experience, *share)
    versions = experience["policy_version"]
    lag_sum = ct.version * versions.size - int(versions.sum())
    costs = ct.learn(experience)
    if share[1] > 1:
        # Imported here: the manager imports this module (through the CDP) and must not import torch.
        from flare2.core.data_parallel import average_buffers
        from flare2.core.devices import module_attributes

        average_buffers(module_attributes(vars(ct.algorithm)))
    return Learned(costs, lag_sum, versions.size, time.perf_counter() - start)


def _share_of_sequences(experience: dict[str, Any], learner: int, learners: int) -> dict[str, Any]:
    """Learner ``learner``'s equal share of the sequences (the first dimension) of a spelled-out learn batch."""
    size = experience["terminated"].shape[0] // learners
    rows = slice(learner * size, (learner + 1) * size)

    def take(value: Any) -> Any:
        return {key: take(item) for key, item in value.items()} if isinstance(value, dict) else value[rows]

    return take(experience)
