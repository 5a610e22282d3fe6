"""Agents whose episode code raises: a bug in user code on the agent side."""

from __future__ import annotations

from flare2.core.envs import GymAgent


class FlakyAgent(GymAgent):
    """The first incarnation of each agent raises in its third episode; the restarted ones do not."""

    def run_episode(self) -> None:
        first_incarnation = self.agent_id.split(".")[1] == "0"
        if first_incarnation and self._episodes == 2:
            raise KeyError("the user's agent broke on purpose")
        super().run_episode()
