"""flare2: agent processes, ZeroMQ, and batched ComputationTasks.

The public names are importable from here; each is loaded on first use, so
``import flare2`` in an agent process does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # errors
    "FlareError": "flare2.errors",
    "ConfigError": "flare2.errors",
    "SpecError": "flare2.errors",
    "TransportError": "flare2.errors",
    "DecodeError": "flare2.errors",
    "PeerDiedError": "flare2.errors",
    "ReplyTimeoutError": "flare2.errors",
    "RemoteError": "flare2.errors",
    "EncodeError": "flare2.errors",
    "UserCodeError": "flare2.errors",
    "LearnerDiedError": "flare2.errors",
    "RunFailed": "flare2.errors",
    # core (no torch)
    "Spec": "flare2.core.specs",
    "CTSpecs": "flare2.core.specs",
    "Ragged": "flare2.wire.ragged",
    "View": "flare2.core.specs",
    "Agent": "flare2.core.agent",
    "VectorAgent": "flare2.core.agent",
    "AgentHelper": "flare2.core.helpers",
    "OnlineHelper": "flare2.core.helpers",
    "ExpReplayHelper": "flare2.core.replay",
    "GymAgent": "flare2.core.envs",
    # core (torch)
    "Model": "flare2.core.model",
    "Algorithm": "flare2.core.algorithm",
    "Experience": "flare2.core.algorithm",
    "RaggedTensor": "flare2.core.ragged_tensor",
    "ComputationTask": "flare2.core.computation_task",
    # runtime
    "BatchingConfig": "flare2.runtime.config",
    "CTConfig": "flare2.runtime.config",
    "AgentConfig": "flare2.runtime.config",
    "RunConfig": "flare2.runtime.config",
    "Manager": "flare2.runtime.manager.manager",
    "train": "flare2.commands.train",
    "TrainedRun": "flare2.commands.train",
    "load_policy": "flare2.commands.policies",
    "load_policies": "flare2.commands.policies",
    "TrainedPolicy": "flare2.commands.policies",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flare2' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
