"""Frozen copies of a CT (``CTConfig.follows``: self-play's opponent), refreshed from the CT they follow as it
learns, in the compute process or a serial run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flare2.runtime.config import CTConfig

if TYPE_CHECKING:
    from flare2.core.computation_task import ComputationTask
    from flare2.runtime.compute.cdp import ComputationDataProcessor


class FrozenCopy:
    """A CT that plays a past copy of another's weights (``CTConfig.follows``: self-play's opponent). Every
    ``refresh_every`` updates of its leader it copies the leader's weights into a pool of at most ``snapshots``, a
    uniform sample of every copy taken so far (reservoir sampling: the early, weaker policies stay in it as the run
    goes on), and takes one drawn from the pool. Its draws are seeded by the run's seed."""

    def __init__(self, ct: ComputationTask, config: CTConfig, seed: int) -> None:
        self.ct, self.every, self.capacity = ct, config.refresh_every, config.snapshots
        self.pool: list[list[Any]] = []
        self.copies = 0
        self.rng = np.random.default_rng([seed, 0x5E1F])

    def leader_learned(self, leader: ComputationTask) -> None:
        if leader.version % self.every == 0:
            self.refresh(leader)

    def refresh(self, leader: ComputationTask) -> None:
        copy = [tensor.detach().clone() for tensor in leader.weight_tensors()] if self.capacity > 1 else None
        self.copies += 1
        if copy is None:  # the newest copy alone: no pool to keep
            self.ct.adopt_weights(leader.weight_tensors(), learn_calls=self.copies - 1)
            return
        if len(self.pool) < self.capacity:
            self.pool.append(copy)
        else:
            kept = int(self.rng.integers(self.copies))
            if kept < self.capacity:
                self.pool[kept] = copy
        self.ct.adopt_weights(self.pool[int(self.rng.integers(len(self.pool)))], learn_calls=self.copies - 1)


def follow(cdps: list[ComputationDataProcessor], configs: Sequence[CTConfig], seed: int) -> None:
    """Each frozen copy (``CTConfig.follows``) takes its CT's weights now, and after every ``refresh_every`` of its
    updates (``ComputationDataProcessor.learned``)."""
    by_name = {cdp.ct.name: cdp for cdp in cdps}
    for config in configs:
        if config.follows is not None:
            leader, follower = by_name[config.follows], FrozenCopy(by_name[config.name].ct, config, seed)
            follower.refresh(leader.ct)
            leader.followers.append(follower)
