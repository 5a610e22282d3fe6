"""Building a run's ComputationTasks: the one recipe the compute process, the learner process and ``--serial`` use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flare2.runtime.config import CTConfig

if TYPE_CHECKING:
    from flare2.core.computation_task import ComputationTask


def build_cts(configs: tuple[CTConfig, ...], *, device: str, seed: int, torch_threads: int) -> list[ComputationTask]:
    """The ComputationTasks of a run, built in order after seeding torch (the learner process builds the same)."""
    import torch

    from flare2.core.computation_task import ComputationTask, choose_device

    torch.set_num_threads(torch_threads)
    torch.manual_seed(seed)
    algorithms = [config.build() for config in configs]
    resolved = choose_device(device, algorithms)
    return [ComputationTask(config.name, algorithm, device=resolved) for config, algorithm in zip(configs, algorithms)]
