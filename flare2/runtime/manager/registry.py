"""The manager's agents: local agent processes (one slot each, restarted in place) and remote agents, one kind of
record in one registry, so that who is listened to, who is live and who is remote are answered in one place.

A local agent's process is its slot's in the supervisor (:class:`~flare2.runtime.supervisor.AgentSlot`); the record
here is what the manager hears from it on the control socket.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

_REMEMBERED_DROPS = 4096


@dataclass
class AgentRecord:
    """One agent the manager knows: the current incarnation of a local slot, or a remote agent."""

    agent_id: str
    last_seen: float
    slot: int = -1
    """The local slot it fills (-1 for a remote agent, started by ``flare2 attach`` on another machine)."""
    registered: bool = False
    said_bye: bool = False
    failed: bool = False
    """It died or went silent; its slot waits for the successor."""
    error: str = ""
    """What the agent reported before it died (a traceback of its episode code)."""
    played: bool = False
    """Its stats counted env steps: one that dies after that is no crash loop (``failure_streak``)."""
    cts: frozenset[str] = frozenset()
    """The CTs the agent asks (from its hello)."""
    envs: int = 0
    """The environments it plays (from its hello)."""
    welcomed_by: int = -1
    """The compute process (the run's ``compute_restarts`` when it started) whose endpoints its welcome gave; -1: none
    yet."""

    @property
    def live(self) -> bool:
        return self.registered and not self.said_bye and not self.failed

    @property
    def remote(self) -> bool:
        return self.slot < 0


class AgentRegistry:
    """Local slots and remote agents; ``by_id`` finds whichever the manager currently listens to."""

    def __init__(self) -> None:
        self.slots: list[AgentRecord] = []
        self.remotes: dict[str, AgentRecord] = {}
        self._by_id: dict[str, AgentRecord] = {}
        self._dropped: OrderedDict[str, AgentRecord] = OrderedDict()

    def __iter__(self) -> Iterator[AgentRecord]:
        """Every current record: each slot's incarnation (also one waiting for its restart), then the remotes."""
        yield from self.slots
        yield from self.remotes.values()

    def by_id(self, agent_id: str) -> AgentRecord | None:
        """The agent the manager listens to under this id (not a slot's dead incarnation, not a dropped remote)."""
        return self._by_id.get(agent_id)

    def live(self) -> list[AgentRecord]:
        return [agent for agent in self if agent.live]

    def put_local(self, agent: AgentRecord) -> None:
        """The first incarnation of a new slot, or the successor of the slot's previous one."""
        if agent.slot == len(self.slots):
            self.slots.append(agent)
        else:
            self.slots[agent.slot] = agent
        self._by_id[agent.agent_id] = agent

    def add_remote(self, agent: AgentRecord) -> None:
        self.remotes[agent.agent_id] = agent
        self._by_id[agent.agent_id] = agent

    def stop_listening(self, agent: AgentRecord) -> None:
        """A local agent that died (its slot waits for the successor), or a remote one that left or was dropped."""
        self._by_id.pop(agent.agent_id, None)
        if agent.remote:
            self.remotes.pop(agent.agent_id, None)

    def drop_remote(self, agent: AgentRecord) -> None:
        """A remote agent gone silent: no longer listened to, but remembered (the latest few thousand), because what
        it sent before its link broke may still arrive once the link is back."""
        self.stop_listening(agent)
        self._dropped[agent.agent_id] = agent
        while len(self._dropped) > _REMEMBERED_DROPS:
            self._dropped.popitem(last=False)

    def dropped_remote(self, agent_id: str) -> AgentRecord | None:
        """The remote agent dropped under this id, if it is remembered."""
        return self._dropped.get(agent_id)
