"""ComputationTask: numpy in, numpy out, torch and the device in between."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flare2.core.algorithm import Algorithm, Experience, Tensors
from flare2.core.specs import CTSpecs, Spec
from flare2.errors import ConfigError, SpecError

_EXPERIENCE_GROUPS = ("inputs", "next_inputs", "actions", "rewards", "states")


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (cuda when there is one)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}: use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} was asked for but torch sees no CUDA device: use --device cpu or auto")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported device {name!r}: use cpu, cuda, cuda:N or auto")
    return device


class ComputationTask:
    """One Algorithm served to agents: converts numpy batches to tensors per the model's specs and back."""

    def __init__(self, name: str, algorithm: Algorithm, *, device: str | torch.device = "cpu") -> None:
        if not isinstance(algorithm, Algorithm):
            raise ConfigError(f"ComputationTask {name!r} needs a flare2 Algorithm, got {type(algorithm).__name__}")
        self.name = name
        self.device = device if isinstance(device, torch.device) else resolve_device(device)
        self.algorithm = algorithm.to(self.device)
        model = algorithm.model
        self.specs = CTSpecs(
            inputs=dict(model.input_specs()),
            actions=dict(model.action_specs()),
            states=dict(model.state_specs()),
            rewards=dict(model.reward_specs()),
        )
        if not self.specs.inputs or not self.specs.actions:
            raise ConfigError(f"the model of CT {name!r} must declare at least one input spec and one action spec")
        self.predict_calls = 0
        self.learn_calls = 0

    def _tensors(self, arrays: dict[str, np.ndarray]) -> Tensors:
        return {key: torch.from_numpy(value).to(self.device, non_blocking=True) for key, value in arrays.items()}

    def _arrays(self, group: str, specs: dict[str, Spec], tensors: Any, rows: int) -> dict[str, np.ndarray]:
        owner = type(self.algorithm).__name__
        if not isinstance(tensors, dict) or tensors.keys() != specs.keys():
            got = sorted(tensors) if isinstance(tensors, dict) else type(tensors).__name__
            raise SpecError(f"{owner}.predict must return {group} with keys {sorted(specs)}, got {got}")
        arrays = {}
        for key, spec in specs.items():
            array = tensors[key].detach().cpu().numpy()
            if array.shape != (rows, *spec.shape) or array.dtype.name != spec.dtype:
                raise SpecError(
                    f"{owner}.predict returned {group}[{key!r}] with shape {array.shape} and dtype {array.dtype.name}; "
                    f"the spec says shape {(rows, *spec.shape)} and dtype {spec.dtype}"
                )
            arrays[key] = array
        return arrays

    def predict(
        self, inputs: dict[str, np.ndarray], states: dict[str, np.ndarray], *, greedy: bool = False
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Actions and next states for ``[B, ...]`` arrays that already match the specs.

        ``greedy`` asks the algorithm for its actions without exploration (``predict_greedy``).
        """
        rows = len(next(iter(inputs.values())))
        predict = self.algorithm.predict_greedy if greedy else self.algorithm.predict
        with torch.inference_mode():
            actions, next_states = predict(self._tensors(inputs), self._tensors(states))
        self.predict_calls += 1
        return (
            self._arrays("actions", self.specs.actions, actions, rows),
            self._arrays("states", self.specs.states, next_states if next_states is not None else {}, rows),
        )

    def learn(self, batch: dict[str, Any]) -> dict[str, float]:
        """One learn() call on ``[B, T, ...]`` arrays (groups as in ``Experience``); returns the costs as floats."""
        experience = Experience(
            **{group: self._tensors(batch.get(group, {})) for group in _EXPERIENCE_GROUPS},
            terminated=torch.from_numpy(batch["terminated"]).to(self.device),
            truncated=torch.from_numpy(batch["truncated"]).to(self.device),
        )
        self.algorithm.model.train()
        costs = self.algorithm.learn(experience)
        if not isinstance(costs, dict):
            raise SpecError(f"{type(self.algorithm).__name__}.learn must return a dict of costs, got {type(costs).__name__}")
        self.learn_calls += 1
        return {str(key): float(value) for key, value in costs.items()}

    def save(self, path: str | os.PathLike, counters: dict[str, int]) -> None:
        """Write model, optimizer and counters atomically: a crash mid-save never leaves a torn file at ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "ct": self.name,
            "algorithm": self.algorithm.state_dict(),
            "counters": {**counters, "predict_calls": self.predict_calls, "learn_calls": self.learn_calls},
        }
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as tmp:
                torch.save(state, tmp)
                tmp.flush()
                os.fsync(tmp.fileno())
            os.replace(tmp_name, path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise

    def load(self, path: str | os.PathLike) -> dict[str, int]:
        """Restore what ``save`` wrote; returns the counters."""
        try:
            state = torch.load(path, map_location=self.device, weights_only=True)
        except FileNotFoundError:
            raise ConfigError(f"no checkpoint at {path}: check the --resume directory") from None
        if state.get("ct") != self.name:
            raise ConfigError(f"checkpoint {path} belongs to CT {state.get('ct')!r}, not {self.name!r}")
        self.algorithm.load_state_dict(state["algorithm"])
        counters = dict(state["counters"])
        self.predict_calls = int(counters.get("predict_calls", 0))
        self.learn_calls = int(counters.get("learn_calls", 0))
        return counters
