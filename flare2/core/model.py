"""Model: a torch.nn.Module that declares the named specs of what it takes and gives."""

from __future__ import annotations

from torch import nn

from flare2.core.specs import Spec, View


class Model(nn.Module):
    """A network plus its specs.

    Override ``input_specs`` and ``action_specs``; override ``state_specs`` for
    a model with short-term memory (the agent starts each episode from zeros of
    these specs and carries the states across steps), ``reward_specs`` when
    the environment gives more than one scalar reward, ``view_specs`` for
    inputs made of the trajectory (``flare2.View``), and ``extra_specs`` for
    per-step values that only learning needs (entries of the env's ``info``,
    returns an agent-side postprocessing computes).
    """

    def input_specs(self) -> dict[str, Spec]:
        raise NotImplementedError(f"{type(self).__name__} must define input_specs()")

    def action_specs(self) -> dict[str, Spec]:
        raise NotImplementedError(f"{type(self).__name__} must define action_specs()")

    def state_specs(self) -> dict[str, Spec]:
        return {}

    def reward_specs(self) -> dict[str, Spec]:
        return {"reward": Spec((), "float32")}

    def view_specs(self) -> dict[str, View]:
        """Inputs that the agent side assembles from the trajectory (a frame stack, the previous action...): each
        arrives in ``forward``'s inputs as ``[B, frames, ...]``, built the same way for acting and for learning."""
        return {}

    def extra_specs(self) -> dict[str, Spec]:
        """Per-step arrays of experiences only (``Experience.extras``): the agent side fills them, from the env's
        ``info`` (GymAgent's ``infos`` option) or per episode (``OnlineHelper.postprocess``); never predicted from."""
        return {}
