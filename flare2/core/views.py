"""Trajectory views for the envs of one agent: each view's frames, per env, kept in step with the episode.

``ViewRows`` holds, for each ``View`` of a CT and each of ``count`` envs, the
last ``frames`` values of its source. The agent asks it for the views of the
current step (``current``) beside the observations it sends, and moves it on
after the envs stepped (``advance``); an env that starts an episode is reset
(``start``), so its missing frames are zeros. What it returns is a copy the
agent sends and stores: the stored step holds exactly the views its action
was chosen from, for acting and for learning, online or replayed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flare2.core.specs import CTSpecs


class ViewRows:
    """The trajectory views of ``count`` envs for one CT (see the module docstring)."""

    def __init__(self, specs: CTSpecs, count: int) -> None:
        self.views = specs.views
        self._frames = {name: specs.inputs[name].zeros(count) for name in self.views}

    def __bool__(self) -> bool:
        return bool(self.views)

    def start(self, index: int, inputs: dict[str, Any]) -> None:
        """Env ``index`` starts an episode with ``inputs`` (its observation, by key): zeros, then that observation."""
        for name, view in self.views.items():
            frames = self._frames[name]
            frames[index] = 0
            if view.group == "inputs":
                frames[index, -1] = inputs[view.key]

    def start_all(self, inputs: dict[str, np.ndarray]) -> None:
        """Every env starts an episode; ``inputs`` holds their observations as rows."""
        for index in range(len(next(iter(self._frames.values()), ()))):
            self.start(index, {key: value[index] for key, value in inputs.items()})

    def current(self) -> dict[str, np.ndarray]:
        """The views of the current step, ``[count, frames, ...]`` each (copies: the caller may keep them)."""
        return {name: frames.copy() for name, frames in self._frames.items()}

    def advance(self, next_inputs: dict[str, np.ndarray], actions: dict[str, Any], rewards: dict[str, np.ndarray]) -> None:
        """The envs made a step: each view takes its next frame (the next observation, or this step's action or reward)."""
        sources = {"inputs": next_inputs, "actions": actions, "rewards": rewards}
        for name, view in self.views.items():
            frames = self._frames[name]
            frames[:, :-1] = frames[:, 1:]
            frames[:, -1] = sources[view.group][view.key][: len(frames)]
