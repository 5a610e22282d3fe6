"""Building a run's ComputationTasks: the one recipe the compute process, the learner process and ``--serial`` use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flare2.runtime.checkpoints import resume_checkpoint_path
from flare2.runtime.config import CTConfig

if TYPE_CHECKING:
    from flare2.core.computation_task import ComputationTask


def build_cts(configs: tuple[CTConfig, ...], *, device: str, seed: int, torch_threads: int) -> list[ComputationTask]:
    """The ComputationTasks of a run, built in order after seeding torch (the learner process builds the same)."""
    import torch

    from flare2.core.computation_task import ComputationTask
    from flare2.core.devices import choose_device

    torch.set_num_threads(torch_threads)
    torch.manual_seed(seed)
    algorithms = [config.build() for config in configs]
    resolved = choose_device(device, algorithms)
    return [ComputationTask(config.name, algorithm, device=resolved) for config, algorithm in zip(configs, algorithms)]


def resume(cts: list[ComputationTask], resume_dir: str | None) -> dict[str, Any]:
    """Load each CT's checkpoint from the run being resumed (``--resume``); returns the run's counters it kept.

    Nothing happens without ``resume_dir``. Every CT's checkpoint keeps the same counters (they are saved together).
    """
    counters: dict[str, Any] = {}
    if resume_dir:
        for ct in cts:
            counters = ct.load(resume_checkpoint_path(resume_dir, ct.name))
    return counters
