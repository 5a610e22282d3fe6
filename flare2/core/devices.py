"""Which device a run's ComputationTasks use: ``--device cpu``, ``cuda``, ``cuda:N`` or ``auto``, which weighs the
networks' size."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from flare2.core.algorithm import Algorithm
from flare2.errors import ConfigError

logger = logging.getLogger(__name__)

AUTO_CUDA_MIN_PARAMETERS = 1_000_000
"""``--device auto`` puts the CTs on the GPU only when their networks hold at least this many parameters. Below it a
batch's copies and kernel launches cost more than the arithmetic the GPU saves. Measured on an H200 with 16 cores
(``flare2 train --env CartPole-v1``, seed 0, wall time on the CPU against cuda): to a return of 475, PPO 64-64 33 s
against 42 s and A2C 64-64 26 s against 42 s; 30k steps of A2C, 20 s against 19 s at 256-256 (about 135k
parameters), 21 s against 21 s at 512-512 (530k) and 34 s against 16 s at 1024-1024 (2.1M)."""


def count_parameters(algorithm: Algorithm) -> int:
    """Parameters of the algorithm's networks, each shared one counted once."""
    unique = {id(p): p for module in module_attributes(vars(algorithm)) for p in module.parameters()}
    return sum(p.numel() for p in unique.values())


def choose_device(name: str, algorithms: list[Algorithm]) -> torch.device:
    """The device of a run's CTs for ``--device NAME``; ``auto`` weighs the networks of all of them together."""
    parameters = sum(count_parameters(algorithm) for algorithm in algorithms)
    device = resolve_device(name, parameters)
    if name == "auto" and torch.cuda.is_available():
        if device.type == "cpu":
            logger.info(
                "--device auto chose the CPU although there is a GPU: the networks hold %d parameters, and the GPU "
                "pays from about %d on (--device cuda puts them there anyway)",
                parameters,
                AUTO_CUDA_MIN_PARAMETERS,
            )
        else:
            logger.info(
                "--device auto chose the GPU (%s): the networks hold %d parameters",
                torch.cuda.get_device_name(device),
                parameters,
            )
    return device


def resolve_device(name: str, parameters: int) -> torch.device:
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto``: cuda when there is one and the networks hold ``parameters`` >=
    AUTO_CUDA_MIN_PARAMETERS."""
    if name == "auto":
        large = parameters >= AUTO_CUDA_MIN_PARAMETERS
        return torch.device("cuda" if torch.cuda.is_available() and large else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}: use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} was asked for but torch sees no CUDA device: use --device cpu or auto")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported device {name!r}: use cpu, cuda, cuda:N or auto")
    return device


def module_attributes(attributes: dict[str, Any]) -> list[nn.Module]:
    return [value for value in attributes.values() if isinstance(value, nn.Module)]
