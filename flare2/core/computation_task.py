"""ComputationTask: numpy in, numpy out, torch and the device in between."""

from __future__ import annotations

import copy
import inspect
import logging
import os
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from flare2.core.algorithm import Algorithm, Experience, Tensors
from flare2.core.checkpoint_files import cloned_state, write_checkpoint
from flare2.core.devices import count_parameters, module_attributes, resolve_device
from flare2.core.learn_requests import NEXT_INPUTS_FOLLOW
from flare2.core.ragged_tensor import RaggedTensor
from flare2.core.specs import EXPERIENCE_GROUPS, NUMPY_DTYPES, CTSpecs, Spec
from flare2.core.transforms import RunningMoments, statistics_shape
from flare2.errors import ConfigError, SpecError
from flare2.wire.ragged import Ragged, rows_in_order

logger = logging.getLogger(__name__)


def _state_tensors(modules: list[nn.Module]) -> list[torch.Tensor]:
    """Every parameter and buffer of ``modules``, in order."""
    return [tensor for module in modules for tensor in module.state_dict(keep_vars=True).values()]


@torch.no_grad()
def copy_tensors(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """Copy each source tensor into the target at its place (across devices where they differ)."""
    for target, source in zip(targets, sources):
        target.copy_(source)


class _ActingView:
    """The Algorithm as ``predict`` sees it while ``learn`` runs in another thread.

    Every attribute and method is the algorithm's own (so counters that ``predict`` keeps, such as an exploration
    schedule, stay one), except its nn.Module attributes, which are the acting copies: ``learn`` may change the
    learning weights at any moment, the acting ones change only between two predictions.
    """

    __slots__ = ("_algorithm", "_modules")

    def __init__(self, algorithm: Algorithm, modules: dict[str, nn.Module]) -> None:
        object.__setattr__(self, "_algorithm", algorithm)
        object.__setattr__(self, "_modules", modules)

    def __getattr__(self, name: str) -> Any:
        if name in self._modules:
            return self._modules[name]
        algorithm = self._algorithm
        attribute = inspect.getattr_static(type(algorithm), name, None)
        if hasattr(attribute, "__get__") and name not in vars(algorithm):
            # Methods and properties are bound to the view, so self.model inside them is the acting copy.
            return attribute.__get__(self, type(algorithm))
        return getattr(algorithm, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._algorithm, name, value)


class ComputationTask:
    """One Algorithm served to agents: converts numpy batches to tensors per the model's specs and back.

    ``version`` counts the learn() calls that changed the weights; every
    prediction says which version answered it (``predicted_version``), so an
    experience carries the version of the policy that acted. After
    ``act_beside_learning()`` predictions use a copy of the weights that
    ``learn`` refreshes as it ends, so ``learn`` may run in another thread
    while ``predict`` serves. ``use_threads`` gives each its own number of
    torch threads.
    """

    def __init__(self, name: str, algorithm: Algorithm, *, device: str | torch.device = "cpu") -> None:
        if not isinstance(algorithm, Algorithm):
            raise ConfigError(f"ComputationTask {name!r} needs a flare2 Algorithm, got {type(algorithm).__name__}")
        self.name = name
        self.device = (
            device if isinstance(device, torch.device) else resolve_device(device, count_parameters(algorithm))
        )
        self.algorithm = algorithm.to(self.device)
        model = algorithm.model
        inputs, actions, rewards = dict(model.input_specs()), dict(model.action_specs()), dict(model.reward_specs())
        views = dict(model.view_specs())
        sources = {"inputs": inputs, "actions": actions, "rewards": rewards}
        for view_name, view in views.items():
            source = sources[view.group].get(view.key)
            if source is None or view_name in inputs:
                raise ConfigError(
                    f"view {view_name!r} of CT {name!r}: it needs {view.group}[{view.key!r}] among the model's specs "
                    "and a name no input has"
                )
            inputs[view_name] = view.spec(source)
        self.specs = CTSpecs(
            inputs=inputs,
            actions=actions,
            states=dict(model.state_specs()),
            rewards=rewards,
            views=views,
            extras=dict(model.extra_specs()),
        )
        if not self.specs.inputs or not self.specs.actions:
            raise ConfigError(f"the model of CT {name!r} must declare at least one input spec and one action spec")
        learn_ahead = algorithm.learn_ahead
        if type(learn_ahead) is not int or learn_ahead < 0:
            raise ConfigError(f"{type(algorithm).__name__}.learn_ahead must be an int >= 0, got {learn_ahead!r}")
        self.learn_ahead = learn_ahead
        self.predict_calls = 0
        self.learn_calls = 0
        self.learned_rows = 0
        """Rows of experience learned from (env steps, for one agent per env), counted by the compute process."""
        self.version = 0
        self.predicted_version = 0
        """The version of the weights that answered the latest prediction."""
        self._acting: _ActingView | None = None
        self._acting_modules: dict[str, nn.Module] = {}
        self._acting_in_eval_mode = False
        """Whether the networks predict() uses are in eval mode (learn() puts the model in train mode)."""
        self._threads: dict[str, int] = {}
        """Torch threads by job, predict or learn (``use_threads``); none set: the process's count."""
        self.statistics: dict[str, RunningMoments] = {}
        """The running statistics of observations that the agents of the run counted and merged here, by input key
        (``flare2.core.transforms.NormalizeObservations``); saved in checkpoints."""
        self._statistics_lock = threading.Lock()
        self._weights_lock = threading.Lock()
        self._learn_lock = threading.Lock()
        # Host memory the GPU can read without a staging copy: batches go over without blocking the CPU.
        self._pinned = self.device.type == "cuda"

    def act_beside_learning(self) -> None:
        """Give ``predict`` its own copy of every nn.Module of the algorithm, refreshed at the end of each ``learn``."""
        with self._learn_lock:
            self._acting_modules = {
                name: copy.deepcopy(value)
                for name, value in vars(self.algorithm).items()
                if isinstance(value, nn.Module)
            }
            self._acting = _ActingView(self.algorithm, self._acting_modules)
            self._acting_in_eval_mode = False

    def _tensors(self, arrays: Mapping[str, np.ndarray | Ragged]) -> Tensors:
        # Tensors types its values as tensors; a ragged spec's entry is a RaggedTensor all the same (see Tensors).
        return {key: cast(torch.Tensor, self._tensor(value)) for key, value in arrays.items()}

    def _tensor(self, array: np.ndarray | Ragged) -> torch.Tensor | RaggedTensor:
        if isinstance(array, Ragged):
            return RaggedTensor(self._to_device(array.values), self._to_device(array.lengths))
        return self._to_device(array)

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        if array.flags.writeable:
            tensor = torch.from_numpy(array)
        else:  # handed over as it is (shared memory, the CDP's rings): read, never written, so torch's warning is moot
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                tensor = torch.from_numpy(array)
        if self._pinned:
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor if self.device.type == "cpu" else tensor.to(self.device)

    def _arrays(self, group: str, specs: dict[str, Spec], tensors: Any, rows: int) -> dict[str, np.ndarray | Ragged]:
        if not isinstance(tensors, dict) or tensors.keys() != specs.keys():
            got = sorted(tensors) if isinstance(tensors, dict) else type(tensors).__name__
            raise SpecError(
                f"{type(self.algorithm).__name__}.predict must return {group} with keys {sorted(specs)}, got {got}"
            )
        arrays: dict[str, np.ndarray | Ragged] = {}
        for key, spec in specs.items():
            tensor = tensors[key]
            if spec.ragged:
                arrays[key] = self._ragged_output(group, key, spec, tensor, rows)
                continue
            # Under inference_mode a CPU tensor converts as it is; detach() and cpu() are for the other cases.
            array = (
                tensor.numpy()
                if tensor.device.type == "cpu" and not tensor.requires_grad
                else tensor.detach().cpu().numpy()
            )
            if array.shape != (rows, *spec.shape) or array.dtype != NUMPY_DTYPES[spec.dtype]:
                raise SpecError(
                    f"{type(self.algorithm).__name__}.predict returned {group}[{key!r}] with shape {array.shape} and "
                    f"dtype {array.dtype.name}; the spec says shape {(rows, *spec.shape)} and dtype {spec.dtype}"
                )
            arrays[key] = array
        return arrays

    def _ragged_output(self, group: str, key: str, spec: Spec, tensor: Any, rows: int) -> Ragged:
        """A ragged output (one value per item, such as an action per entity) as a checked ``Ragged``."""
        where = f"{type(self.algorithm).__name__}.predict returned {group}[{key!r}]"
        if not isinstance(tensor, RaggedTensor):
            raise SpecError(
                f"{where} as a {type(tensor).__name__}; its spec {spec.shape} is ragged: return a RaggedTensor "
                "(input.with_values(per_item_values) keeps the input's rows)"
            )
        if tensor.shape != (rows,):
            raise SpecError(f"{where} with leading dims {tensor.shape}; the batch has ({rows},)")
        try:
            return Ragged.check(tensor.to_ragged(), 1, spec.item_shape, NUMPY_DTYPES[spec.dtype])
        except ValueError as exc:
            raise SpecError(f"{where}: {exc}") from None

    def use_threads(self, *, predict: int, learn: int) -> None:
        """Run ``predict`` with ``predict`` torch threads and ``learn`` with ``learn`` (RunConfig.predict_threads and
        torch_threads). Torch's thread count belongs to the thread that sets it, so each call sets its own where it
        differs: a learner thread keeps its count while predictions are answered beside it."""
        self._threads = {"predict": predict, "learn": learn}

    def _set_threads(self, job: str) -> None:
        threads = self._threads.get(job)
        if threads is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

    def predict(
        self, inputs: dict[str, np.ndarray], states: dict[str, np.ndarray], *, greedy: bool | np.ndarray = False
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Actions and next states for ``[B, ...]`` arrays that already match the specs.

        ``greedy`` asks the algorithm for its actions without exploration (``predict_greedy``): for
        every row, or for the rows a ``[B]`` bool array marks.
        """
        if isinstance(greedy, np.ndarray):
            if not greedy.any():
                greedy = False
            elif greedy.all():
                greedy = True
        self._set_threads("predict")
        with self._weights_lock:
            algorithm = self._acting if self._acting is not None else self.algorithm
            if not self._acting_in_eval_mode:
                # Dropout off and BatchNorm on its running statistics: acting is inference, even on a batch of one.
                for module in module_attributes(self._acting_modules or vars(self.algorithm)):
                    module.eval()
                self._acting_in_eval_mode = True
            self.predicted_version = self.version
            if isinstance(greedy, np.ndarray):
                result = self._predict_mixed(algorithm, inputs, states, greedy)
            else:
                result = self._predict_rows(algorithm.predict_greedy if greedy else algorithm.predict, inputs, states)
        self.predict_calls += 1
        return result

    def _predict_rows(
        self, predict: Any, inputs: dict[str, np.ndarray], states: dict[str, np.ndarray]
    ) -> tuple[dict, dict]:
        rows = len(next(iter(inputs.values())))
        with torch.inference_mode():
            actions, next_states = predict(self._tensors(inputs), self._tensors(states))
        return (
            self._arrays("actions", self.specs.actions, actions, rows),
            self._arrays("states", self.specs.states, next_states if next_states is not None else {}, rows),
        )

    def _predict_mixed(self, algorithm: Any, inputs: dict, states: dict, greedy: np.ndarray) -> tuple[dict, dict]:
        """Exploring rows through ``predict``, greedy rows through ``predict_greedy``, put back in their order."""
        rows = len(greedy)
        parts = []
        for predict, index in (
            (algorithm.predict, np.flatnonzero(~greedy)),
            (algorithm.predict_greedy, np.flatnonzero(greedy)),
        ):
            part_inputs = {key: value[index] for key, value in inputs.items()}
            part_states = {key: value[index] for key, value in states.items()}
            parts.append((index, self._predict_rows(predict, part_inputs, part_states)))
        merged: tuple[dict, dict] = ({}, {})
        for group, specs in enumerate((self.specs.actions, self.specs.states)):
            for key in specs:
                merged[group][key] = rows_in_order([(index, result[group][key]) for index, result in parts], rows)
        return merged

    def learn(self, batch: dict[str, Any]) -> dict[str, float]:
        """One learn() call on ``[B, T, ...]`` arrays (groups as in ``Experience``); returns the costs as floats. The
        weights it makes are the next ``version``; with ``act_beside_learning`` the acting copy takes them as it ends.
        One that raises leaves the state it found (the run's last checkpoint is then the state before it)."""
        follow = batch.get(NEXT_INPUTS_FOLLOW)
        self._set_threads("learn")
        with self._learn_lock:
            experience = Experience(
                **{group: self._tensors(batch.get(group, {})) for group in EXPERIENCE_GROUPS},
                terminated=torch.from_numpy(batch["terminated"]).to(self.device),
                truncated=torch.from_numpy(batch["truncated"]).to(self.device),
                policy_version=torch.from_numpy(batch["policy_version"]).to(self.device),
                version=self.version,
                next_inputs_follow=None if follow is None else torch.from_numpy(follow).to(self.device),
            )
            self.algorithm.model.train()
            if self._acting is None:
                # predict() shares these networks: it puts them back in eval mode.
                self._acting_in_eval_mode = False
            before = cloned_state(self.algorithm.state_dict())
            try:
                costs = self.algorithm.learn(experience)
                if not isinstance(costs, dict):
                    raise SpecError(
                        f"{type(self.algorithm).__name__}.learn must return a dict of costs, got {type(costs).__name__}"
                    )
            except Exception:
                self.algorithm.load_state_dict(before)
                raise
            self.learn_calls += 1
            self._publish(next_version=True)
        return {str(key): float(value) for key, value in costs.items()}

    def _publish(self, *, next_version: bool) -> None:
        """The learning weights become the acting ones (the next version after a learn()), for the predictions from now on."""
        with self._weights_lock:
            if self._acting_modules:
                # The acting copies were made from the same attributes in the same order.
                copy_tensors(_state_tensors(list(self._acting_modules.values())), self.weight_tensors())
            self.version += next_version

    def merge_statistics(self, counted: dict[str, RunningMoments]) -> dict[str, RunningMoments]:
        """Merge an agent's new counts into the run's statistics; returns the merged statistics of those keys."""
        with self._statistics_lock:
            merged = {}
            for key, moments in counted.items():
                statistics = self.statistics.get(key, RunningMoments(moments.shape)).copy()
                with np.errstate(over="ignore", invalid="ignore"):  # checked just below
                    statistics.merge(moments)
                if not (np.isfinite(statistics.mean).all() and np.isfinite(statistics.m2).all()):
                    raise SpecError(f"statistics of {key!r}: merged with the run's, they overflow to infinity")
                merged[key] = statistics
            self.statistics.update(merged)
            # Stored statistics are replaced, never changed in place: the caller may read these without the lock.
            return merged

    def statistics_copy(self) -> dict[str, RunningMoments]:
        with self._statistics_lock:
            return {key: moments.copy() for key, moments in self.statistics.items()}

    def weight_tensors(self) -> list[torch.Tensor]:
        """Every parameter and buffer of the algorithm's nn.Module attributes, in one fixed order."""
        return _state_tensors(module_attributes(vars(self.algorithm)))

    def adopt_weights(self, source: list[torch.Tensor], *, learn_calls: int) -> None:
        """Take the weights a learn() elsewhere made (a learner process), as the next version; ``source`` is in
        ``weight_tensors`` order."""
        with self._weights_lock:
            copy_tensors(self.weight_tensors(), source)
            self.version += 1
            self.learn_calls = learn_calls

    def own_counters(self) -> dict[str, int]:
        """The counters the compute process keeps of this CT (a learner process saves them with its own)."""
        return {"predict_calls": self.predict_calls, "learned_rows": self.learned_rows}

    def save(self, path: str | os.PathLike, counters: dict[str, int]) -> None:
        """Write model, optimizer and counters atomically: a crash mid-save never leaves a torn file at ``path``."""
        with self._learn_lock:
            self._save(Path(path), counters)

    def _save(self, path: Path, counters: dict[str, int]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "ct": self.name,
            "algorithm_class": self.algorithm_class,
            "specs": self.specs.to_wire(),
            "algorithm": self.algorithm.state_dict(),
            "statistics": {
                key: {"count": m.count, "mean": torch.from_numpy(m.mean), "m2": torch.from_numpy(m.m2)}
                for key, m in self.statistics_copy().items()
            },
            "counters": {**counters, **self.own_counters(), "learn_calls": self.learn_calls},
        }
        write_checkpoint(path, state)

    @property
    def algorithm_class(self) -> str:
        """The algorithm's class as module.QualifiedName (recorded in checkpoints and in config.json)."""
        kind = type(self.algorithm)
        return f"{kind.__module__}.{kind.__qualname__}"

    def identity(self) -> dict[str, Any]:
        """What a resumed run must match: the algorithm's class and the model's specs (as on the wire)."""
        return {"algorithm": self.algorithm_class, "specs": self.specs.to_wire()}

    def _check_same_task(self, path: str | os.PathLike, state: dict[str, Any]) -> None:
        """Refuse a checkpoint of another algorithm or other specs, naming the field (older checkpoints say neither)."""
        fix = "resume with the algorithm and model that wrote it, or start a new run without --resume"
        saved_class = state.get("algorithm_class", self.algorithm_class)
        if saved_class != self.algorithm_class:
            raise ConfigError(
                f"--resume: checkpoint {path} of CT {self.name!r} was written by algorithm {saved_class}, this run builds "
                f"{self.algorithm_class}: {fix}"
            )
        saved_specs = state.get("specs")
        if saved_specs is None:
            return
        current = self.specs.to_wire()
        for group in current:
            names = sorted(set(current[group]) | set(saved_specs.get(group, {})))
            for name in names:
                before, now = saved_specs.get(group, {}).get(name), current[group].get(name)
                if before != now:
                    raise ConfigError(
                        f"--resume: checkpoint {path} of CT {self.name!r} has {group}[{name!r}] = {before}, this run's "
                        f"model declares {now}: {fix}"
                    )

    def load(self, path: str | os.PathLike) -> dict[str, int]:
        """Restore what ``save`` wrote; returns the counters."""
        try:
            state = torch.load(path, map_location=self.device, weights_only=True)
        except FileNotFoundError:
            raise ConfigError(f"no checkpoint at {path}: check the --resume directory") from None
        except Exception as exc:  # torch.load fails in many ways on a file it cannot read (pickle, zip, EOF)
            raise ConfigError(
                f"checkpoint {path} cannot be read ({type(exc).__name__}): it is no flare2 checkpoint, "
                "or it was cut short"
            ) from None
        if not isinstance(state, dict):
            raise ConfigError(f"checkpoint {path} holds a {type(state).__name__}, not a flare2 checkpoint")
        if state.get("ct") != self.name:
            raise ConfigError(f"checkpoint {path} belongs to CT {state.get('ct')!r}, not {self.name!r}")
        self._check_same_task(path, state)
        with self._learn_lock:
            try:
                self.algorithm.load_state_dict(state["algorithm"])
            except (KeyError, RuntimeError, ValueError) as exc:  # torch names the missing, unexpected or resized keys
                detail = str(exc).strip().replace("\n\t", " ").replace("\n", " ")
                raise ConfigError(
                    f"checkpoint {path} of CT {self.name!r} does not fit this run's {type(self.algorithm).__name__} "
                    f"({detail}): it was written with other network settings (such as --hidden) or by another "
                    "version of flare2; load it with the settings that wrote it, or train again"
                ) from None
            with self._statistics_lock:
                self.statistics = {
                    key: RunningMoments(
                        statistics_shape(self.specs, key),
                        int(m["count"]),
                        m["mean"].cpu().numpy(),
                        m["m2"].cpu().numpy(),
                    )
                    for key, m in state.get("statistics", {}).items()
                }
            counters = dict(state["counters"])
            self.predict_calls = int(counters.get("predict_calls", 0))
            self.learn_calls = int(counters.get("learn_calls", 0))
            self.learned_rows = int(counters.get("learned_rows", 0))
            self._publish(next_version=False)
        return counters
