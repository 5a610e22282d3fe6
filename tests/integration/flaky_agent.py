"""Agents whose episode code raises: a bug in user code on the agent side."""

from __future__ import annotations

import numpy as np

from flare2.core.envs import GymAgent


class FlakyAgent(GymAgent):
    """The first incarnation of each agent raises once two of its episodes have ended; the restarted ones do not."""

    episodes_ended = 0

    def store(self, ct, **step) -> None:
        first_incarnation = self.agent_id.split(".")[1] == "0"
        if first_incarnation and self.episodes_ended >= 2:
            raise KeyError("the user's agent broke on purpose")
        self.episodes_ended += int(np.count_nonzero(step["terminated"] | step["truncated"]))
        super().store(ct, **step)
