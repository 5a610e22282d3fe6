"""The learners' group of each compute process (``--learners N --remote-learners K``): how many it holds, where they
meet, and the ranks ``flare2 learn`` is given.

The group of learners is fixed for the life of one compute process (torch.distributed's groups are). It changes
with the compute process:

- the first one waits for all K learners from other machines, as the run was started, up to ``startup_timeout_s``;
- one started because a learner on another machine left (killed, its machine gone, its link down past the group's
  timeout) takes only the N - K learners beside it, so the run goes on;
- one started after another death (the compute process, a learner here) keeps the learners elsewhere, but waits
  for them only ``heartbeat_timeout_s``, as long as the run waits for any silent peer: one whose link went down
  with the restart would otherwise keep the new group from learning for the whole startup timeout. One that misses
  it is a lost learner: the run goes on without it, and it joins again as below when it asks;
- a ``flare2 learn`` that asks for ranks while the group has room for it only in a new one is told to ask again
  (``starting``), and the schedule stops the compute process with a checkpoint and starts one with a group that
  holds it (``wants_to_grow``): it joins at the next update.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from flare2.errors import ConfigError
from flare2.runtime.config import RunConfig
from flare2.wire.sockets import free_port

logger = logging.getLogger(__name__)

_LEARN_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class LearnerSeats:
    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.local = config.learners - config.remote_learners
        self.remote = config.remote_learners
        """How many ranks of the group now forming or learning are for learners on other machines."""
        self.rendezvous = self._new_rendezvous()
        """Where the group meets (empty for one learner)."""
        self.rendezvous_timeout_s = config.startup_timeout_s
        """How long the group's learners wait for each other to join (module docstring)."""
        self._next_rank = self.local
        self._device = ""
        self._waiting: dict[str, int] = {}
        """Ranks asked for (by each ``flare2 learn``'s id) that only a new group can give."""

    @property
    def learners(self) -> int:
        return self.local + self.remote

    @property
    def wants_to_grow(self) -> bool:
        """A ``flare2 learn`` waits for ranks that only a new group has."""
        return bool(self._waiting)

    def compute_is_up(self, device: str) -> None:
        self._device = device

    def new_group(self, *, lost_elsewhere: bool) -> None:
        """The compute process is about to be started again: its group takes the learners here, those on other
        machines that asked to join, and, unless one of them was lost (``lost_elsewhere``), those it had."""
        config = self.config
        kept = 0 if lost_elsewhere else self.remote
        self.remote = min(config.remote_learners, kept + sum(self._waiting.values()))
        self.rendezvous_timeout_s = config.startup_timeout_s
        if kept:
            self.rendezvous_timeout_s = min(config.heartbeat_timeout_s, config.startup_timeout_s)
        self._waiting.clear()
        self._next_rank, self._device = self.local, ""
        # Where the last group met may not be free yet: the next one meets elsewhere.
        self.rendezvous = self._new_rendezvous()

    def give(self, wanted: Any, gpus: Any, learn_id: Any, *, rejoin: bool = False) -> dict[str, Any]:
        """Ranks for ``wanted`` learners of ``flare2 learn`` (``learn_id``; ``rejoin``: its learners were in a group
        that broke) on a machine of ``gpus`` GPUs and what they need to join: the learners' recipe, or ``{"starting":
        True}`` until a compute process with room for them is up; a ConfigError says why none are given."""
        config = self.config
        if type(wanted) is not int or wanted < 1:
            raise ConfigError(f"a learner probe must ask for 1 or more learners, got {wanted!r}")
        if not config.remote_learners:
            raise ConfigError(
                "this run takes no learners from other machines: start it with --learners N --remote-learners K"
            )
        left = self.learners - self._next_rank
        room = config.remote_learners - self.remote
        if wanted > max(left, room):
            if rejoin:
                return {"starting": True}  # the group it left has not been taken down here yet
            free = max(left, room)
            raise ConfigError(
                f"the run has {free} of its {config.remote_learners} remote learner rank(s) left (--remote-learners "
                f"{config.remote_learners}): "
                + (f"start this with --learners {free}" if free else "every one is taken")
            )
        if not self._device:
            return {"starting": True}
        if self._device.startswith("cuda") and not (type(gpus) is int and gpus >= wanted):
            raise ConfigError(
                f"the run learns on cuda, one GPU per learner, and the machine of this flare2 learn has {gpus} GPU(s) "
                f"for --learners {wanted}: use --learners {gpus} or fewer, or another machine"
            )
        if wanted > left:
            if not (isinstance(learn_id, str) and _LEARN_ID.fullmatch(learn_id)):
                raise ConfigError("a learner probe must carry the id of its flare2 learn: run the same flare2 version")
            others = sum(count for waiting, count in self._waiting.items() if waiting != learn_id)
            if others + wanted <= room:  # the rest wait for a later group: what is kept stays bounded
                if learn_id not in self._waiting:
                    logger.info(
                        "a flare2 learn asks for %d learner rank(s): the learners' group grows to take it", wanted
                    )
                self._waiting[learn_id] = wanted
            return {"starting": True}
        first = self._next_rank
        self._next_rank += wanted
        logger.info("learner ranks %d..%d go to a flare2 learn on another machine", first, first + wanted - 1)
        return {
            "first_rank": first,
            "count": wanted,
            "learners": self.learners,
            "rendezvous": self.rendezvous,
            "timeout_s": config.startup_timeout_s,
            "rendezvous_timeout_s": self.rendezvous_timeout_s,
            "device": self._device,
            "seed": config.seed,
            "torch_threads": config.torch_threads,
            "cts": [{"name": ct.name, "build": ct.build.recipe()} for ct in config.cts],  # type: ignore[attr-defined]
        }

    def _new_rendezvous(self) -> str:
        """Loopback when all learners run here, else the address other machines reach the run at (on a port free
        now); empty for one learner."""
        config = self.config
        if self.learners == 1:
            return ""
        if not self.remote:
            return f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
        listen = "0.0.0.0" if config.bind in ("0.0.0.0", "::", "*") else config.bind
        return f"tcp://{config.advertise or config.bind}:{free_port(listen)}"
