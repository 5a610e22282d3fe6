"""Algorithm: owns the model, the optimizer and the device; turns batches into actions and costs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.optim import optimizer as torch_optimizer

from flare2.core.data_parallel import average_gradients
from flare2.core.model import Model
from flare2.core.ragged_tensor import flat_rows, take_rows
from flare2.errors import ConfigError

Tensors = dict[str, torch.Tensor]
"""Named tensors; a ragged spec's entry is a ``flare2.RaggedTensor``."""


@dataclass(frozen=True)
class Experience:
    """A batch of B sequences of T consecutive steps, as tensors on the algorithm's device.

    Every tensor is ``[B, T, ...]`` (a ragged input is a ``RaggedTensor`` with
    ``[B, T]`` lengths). ``next_inputs`` holds the observation
    after each step: the final observation when the episode ended there, so a
    time-limit truncation can still bootstrap from it. ``terminated`` marks
    steps after which the return is zero (no bootstrapping); ``truncated`` marks
    steps where the episode was cut by a time limit (bootstrap from
    ``next_inputs``). ``states`` are the model states before each step (empty
    for a model without memory); ``extras`` those of the model's ``extra_specs``
    (empty when it has none).
    """

    inputs: Tensors
    next_inputs: Tensors
    actions: Tensors
    rewards: Tensors
    states: Tensors
    terminated: torch.Tensor
    truncated: torch.Tensor
    extras: Tensors = field(default_factory=dict)
    policy_version: torch.Tensor | None = None
    """``[B, T]`` int64: the version of the weights that chose each action (see ``policy_lag``)."""
    version: int = 0
    """The version of the weights this learn() call updates (the ComputationTask counts them)."""
    next_inputs_follow: torch.Tensor | None = None
    """``[B, T]`` bool, where known: the steps whose ``next_inputs`` are the following step's ``inputs`` (every step
    but each sequence's last and those whose episode ended), which ``next_values`` need not evaluate again."""

    @property
    def policy_lag(self) -> torch.Tensor:
        """``[B, T]``: how many updates behind these weights the acting policy was at each step (0: on-policy)."""
        if self.policy_version is None:
            return torch.zeros_like(self.terminated, dtype=torch.int64)
        return self.version - self.policy_version

    @property
    def episode_ends(self) -> torch.Tensor:
        """Steps after which the next step belongs to another episode."""
        return self.terminated | self.truncated

    def next_values(self, value: Callable[[Tensors], torch.Tensor], values: torch.Tensor) -> torch.Tensor:
        """``value(next_inputs)``, ``[B, T]``, given ``values`` = ``value(inputs)``: each step whose next inputs are
        the following step's inputs (``next_inputs_follow``) takes that step's value, and ``value`` sees only the
        others (the episode ends and each sequence's last step), a few rows instead of all of them again. A bootstrap
        target: no gradient flows through it."""
        with torch.no_grad():
            if self.next_inputs_follow is None:
                return value(self.next_inputs)
            out = torch.empty_like(values)
            out[:, :-1] = values[:, 1:]
            rows = (~self.next_inputs_follow).flatten().nonzero().squeeze(-1)
            out.view(-1)[rows] = value(take_rows(flat_rows(self.next_inputs), rows)).to(out.dtype)
            return out


class Algorithm:
    """The math of one learning method.

    Subclasses implement ``predict`` (a batch of inputs and states to actions
    and next states, under no-grad) and ``learn`` (an Experience to a dict of
    costs), create ``self.optimizer`` and call ``self.optimize(loss)``.
    ``predict_greedy`` is optional: the action without exploration, which
    evaluation episodes ask for. The ComputationTask moves every nn.Module
    attribute to the device.

    ``predict`` runs with every nn.Module attribute in eval mode, ``learn``
    with ``model`` in train mode. Each ``learn`` makes the next version of the
    weights (``Experience.policy_lag`` says how far behind the acting policy
    was). ``learn`` may run elsewhere while ``predict`` keeps serving from a
    copy of every nn.Module attribute that each ``learn`` refreshes as it
    ends: in a learner process where ``may_learn_in_own_process`` allows it,
    else in a thread with ``--learner thread`` (where other attributes are
    shared by both, so a counter ``predict`` keeps is seen by ``learn``).
    ``learn_ahead`` says how many learn requests an agent may send before it
    waits for the reply to the oldest.
    """

    learn_ahead: int = 1
    """Learn requests an agent may have on their way before it waits for a reply: 0 makes every agent wait for
    each learn() before it plays on (strictly on-policy); 1 lets it play the next steps while learn() runs, so
    they come from weights about one update old (``Experience.policy_lag``)."""

    may_learn_in_own_process: bool = False
    """True when ``predict`` and ``learn`` share nothing but the parameters and buffers of the nn.Module attributes
    (no counter or schedule that one changes and the other reads): then ``learn`` may run in a learner process of its
    own, which holds the optimizer and writes the checkpoints, and ``predict`` sees only the weights it sends back."""

    def __init__(self, model: Model, *, max_grad_norm: float | None = None) -> None:
        if not isinstance(model, Model):
            raise ConfigError(
                f"{type(self).__name__} needs a flare2.Model subclass as its model, got {type(model).__name__}"
            )
        self.model = model
        self.max_grad_norm = max_grad_norm
        self.optimizer: torch.optim.Optimizer | None = None
        self.device = torch.device("cpu")

    def predict(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        """Actions and next states for a batch of ``[B, ...]`` inputs and states. The inputs may view memory the
        agents keep (their frame stacks, through shared memory): read them during the call, never write or keep them."""
        raise NotImplementedError(f"{type(self).__name__} must define predict()")

    def predict_greedy(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        """Like ``predict``, but the action the policy rates best, with no exploration (evaluation episodes)."""
        raise NotImplementedError(
            f"{type(self).__name__} has no predict_greedy(): define it (the action without exploration) to play "
            "evaluation episodes, or run without --eval-every"
        )

    def learn(self, experience: Experience) -> dict[str, float]:
        """One update from ``experience``; returns costs to report (loss terms, entropy...)."""
        raise NotImplementedError(f"{type(self).__name__} must define learn()")

    def to(self, device: torch.device) -> Algorithm:
        self.device = device
        for value in vars(self).values():
            if isinstance(value, nn.Module):
                value.to(device)
        return self

    def optimize(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer | None = None) -> float | None:
        """Backpropagate ``loss``, clip the gradients of ``optimizer``'s parameters to ``max_grad_norm`` and step it
        (``self.optimizer`` unless another is given, for algorithms with several); returns the gradient norm before
        clipping, or None without ``max_grad_norm`` (nothing is clipped or measured then). With several learners
        (``--learners``) the gradients are first averaged over them (:mod:`flare2.core.data_parallel`)."""
        grad_norm = self.optimize_on_device(loss, optimizer)
        return None if grad_norm is None else float(grad_norm)

    def optimize_on_device(
        self, loss: torch.Tensor, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.Tensor | None:
        """``optimize`` with the gradient norm left on the model's device as a tensor: nothing read back, so on a
        GPU the host queues the next step's kernels while this one's run (the loops of many small steps)."""
        optimizer = optimizer if optimizer is not None else self.optimizer
        if optimizer is None:
            raise ValueError(f"{type(self).__name__} must create self.optimizer before calling optimize()")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        average_gradients(params)
        grad_norm = None
        if self.max_grad_norm is not None:
            grad_norm = nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        step_optimizer(optimizer)
        return grad_norm

    def anneal_lr(self, start_lr: float, done: int, total: int | None) -> None:
        """Set the learning rate to ``start_lr`` falling linearly to 0 as ``done`` reaches ``total`` (None: constant)."""
        if total:
            if self.optimizer is None:
                raise ValueError(f"{type(self).__name__} must create self.optimizer before calling anneal_lr()")
            for group in self.optimizer.param_groups:
                group["lr"] = start_lr * max(0.0, 1.0 - done / total)

    def state_dict(self) -> dict:
        """What a checkpoint holds; extend it for extra networks such as target networks."""
        state = {"model": self.model.state_dict()}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])


def _skip_the_torch_compile_import_of_optimizer_setup() -> None:
    """Spare each process the import of ``torch._dynamo`` (1.3 s of CPU on torch 2.13) where it builds or loads an
    optimizer but never steps one: the compute process beside a learner process, ``flare2 eval``.

    torch wraps ``Optimizer.add_param_group`` (which every optimizer's constructor calls), ``state_dict`` and
    ``load_state_dict`` so that torch.compile never traces them, and the wrapper imports the compiler on its first call
    to build that guard; it keeps the guard on the wrapped function and reuses it. Giving it the plain function as
    its guard skips the import; it changes nothing outside torch.compile, which never meets these three setup methods
    inside a compiled step. Where torch lays this out otherwise, nothing is changed."""
    for method in (
        torch.optim.Optimizer.add_param_group,
        torch.optim.Optimizer.state_dict,
        torch.optim.Optimizer.load_state_dict,
    ):
        plain = getattr(method, "__wrapped__", None)
        if callable(plain) and not hasattr(plain, "__dynamo_disable"):
            setattr(plain, "__dynamo_disable", plain)


_skip_the_torch_compile_import_of_optimizer_setup()

# The code of torch's guard around each built-in optimizer's ``step`` (``_use_grad_for_differentiable``), which
# imports ``torch._dynamo`` on every call to mark graph breaks: 1.1 s of CPU in each process on its first step (torch
# 2.13), about 7 % of a CartPole run. None where torch lays this out otherwise.
_STEP_GUARD = getattr(torch_optimizer, "_use_grad_for_differentiable", None)
_STEP_GUARD_CODE = _STEP_GUARD(lambda self: None).__code__ if callable(_STEP_GUARD) else None


def _update_inside_the_guard(
    optimizer_class: type[torch.optim.Optimizer],
) -> Callable[[torch.optim.Optimizer], object] | None:
    """The update a built-in optimizer's ``step`` runs inside torch's two wrappers (the step hooks, then the guard),
    or None where the class's ``step`` is laid out otherwise (a user's own ``step``, another torch)."""
    hooked_step = optimizer_class.step
    guarded_step = getattr(hooked_step, "__wrapped__", None)
    update = getattr(guarded_step, "__wrapped__", None)
    is_torchs_layout = (
        _STEP_GUARD_CODE is not None
        and getattr(hooked_step, "hooked", False)
        and getattr(guarded_step, "__code__", None) is _STEP_GUARD_CODE
    )
    return update if is_torchs_layout and callable(update) else None


def step_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()`` without importing the compiler where that changes nothing: a built-in torch optimizer,
    not differentiable, with no step hooks and no learning-rate scheduler watching it. There the guard would only
    turn off autograd around the update and mark graph breaks for torch.compile, which never traces this call, so
    the update itself runs under ``no_grad``. Anything else (a user's own optimizer, a hook) gets ``optimizer.step()``."""
    update = _update_inside_the_guard(type(optimizer))
    watched = (
        "step" in vars(optimizer)  # an LR scheduler wraps the instance's step to see it called
        or optimizer.defaults.get("differentiable", False)
        or optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or torch_optimizer._global_optimizer_pre_hooks
        or torch_optimizer._global_optimizer_post_hooks
    )
    if update is None or watched:
        optimizer.step()
        return
    with torch.no_grad():
        update(optimizer)
    optimizer._optimizer_step_code()


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Move every parameter of ``target`` a fraction ``tau`` of the way to ``source``'s (a target network's soft update)."""
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def adam(parameters: Iterable[nn.Parameter], lr: float, *, eps: float = 1e-8) -> torch.optim.Adam:
    """Adam stepping every parameter in one fused kernel: the same update as ``torch.optim.Adam``'s default loop
    over parameters, several times faster for the small networks of control tasks (a step of TD3's two 64-64
    critics on one CPU thread: 78 against 356 µs, torch 2.13)."""
    return torch.optim.Adam(parameters, lr=lr, eps=eps, fused=True)
