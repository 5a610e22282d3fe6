"""The agent an agent process plays: made from its import path and checked (how many envs it can host, whether its
learn requests fit the message limit), its envs made and wrapped to count, played until the run stops it. Imports no
torch; ``flare2.runtime.agents.agent_process`` and serial mode (``flare2.runtime.manager.serial``) use it alike."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from flare2.core.agent import Agent, AgentBase, EvaluationSchedule, VectorAgent
from flare2.core.helpers import AgentHelper
from flare2.core.learn_requests import least_bytes
from flare2.core.specs import CTSpecs
from flare2.errors import ConfigError
from flare2.runtime.agents.episodes import EpisodeStats, VectorEpisodeRecorder, recorder
from flare2.runtime.processes import import_object
from flare2.wire.streams import STREAM_MAX_BYTES


class StopRequested(Exception):
    """The manager (or SIGTERM) asked this agent to stop; unwinds the episode in progress.

    ``learn_replies`` is False when the manager says the compute process is gone: then no reply to a learn request
    on its way will come, and the agent does not wait for one. ``rejoin``: the manager restarts the compute process,
    and a new agent takes this one's place once it serves (``exit_codes.COMPUTE_RESTARTS``).
    """

    def __init__(self, *, learn_replies: bool = True, rejoin: bool = False) -> None:
        super().__init__()
        self.learn_replies = learn_replies
        self.rejoin = rejoin


def make_agent(path: str, kwargs: dict[str, Any], envs_per_agent: int | None) -> AgentBase:
    """The Agent or VectorAgent named by ``path`` with ``kwargs``, checked to host ``envs_per_agent`` envs (None: its
    class's ``default_envs``), which its ``num_envs`` says."""
    agent_class = import_object(path)
    if not (isinstance(agent_class, type) and issubclass(agent_class, (Agent, VectorAgent))):
        raise ConfigError(f"{path!r} is not a subclass of flare2's Agent (one env) or VectorAgent (several)")
    try:
        agent = agent_class(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"cannot create {path} with kwargs {kwargs}: {exc}") from None
    envs = type(agent).default_envs if envs_per_agent is None else envs_per_agent
    if envs_per_agent is None and (type(envs) is not int or envs < 1):
        raise ConfigError(
            f"{type(agent).__name__}.default_envs must be an int >= 1 (the envs a process of it plays when the run "
            f"gives no --envs-per-agent), got {envs!r}"
        )
    check_envs_per_agent(agent, envs)
    agent.num_envs = envs
    return agent


def check_envs_per_agent(agent: AgentBase, envs_per_agent: int) -> None:
    """Refuse an env count the agent cannot host, naming the option and the fix."""
    if envs_per_agent < 1:
        raise ConfigError(f"--envs-per-agent must be >= 1, got {envs_per_agent}")
    if envs_per_agent > 1 and isinstance(agent, Agent):
        name = type(agent).__name__
        raise ConfigError(
            f"--envs-per-agent {envs_per_agent}: {name} plays one env per process (an Agent with run_episode()); "
            f"run it with --envs-per-agent 1 (and more --num-agents), or make {name} a flare2 VectorAgent"
        )


def check_request_sizes(
    helpers: Mapping[str, AgentHelper], specs: Mapping[str, CTSpecs], max_bytes: Mapping[str, int]
) -> None:
    """A ConfigError, before the first step, for a helper whose learn requests cannot fit the message limit of its
    link to its CT (``max_bytes``, by CT)."""
    for ct, helper in helpers.items():
        shape = helper.largest_request()
        if shape is None:
            continue
        least = least_bytes(specs[ct], *shape)
        if least > max_bytes[ct]:
            sequences, steps = shape
            raise ConfigError(
                f"learn requests to CT {ct!r} hold {sequences} sequences of {steps} steps, at least {least:,} bytes, "
                f"more than the {max_bytes[ct]:,} a message to it may hold (--max-message-bytes, and at least "
                f"{STREAM_MAX_BYTES >> 30} GiB on the compute process's own machine): send fewer steps per request or "
                "fewer envs per agent (--sample-interval, --batch-size, --envs-per-agent) or raise --max-message-bytes"
            )


def make_envs(agent: AgentBase, eval_every: int) -> EpisodeStats:
    """Create the agent's envs inside this process, each wrapped to count into the returned stats."""
    stats = EpisodeStats()
    agent.eval_every = eval_every
    if isinstance(agent, VectorAgent):
        vector_envs = agent.make_vector_envs()
        agent.vector_envs = [VectorEpisodeRecorder(vector_env, stats) for vector_env in vector_envs]
        agent.envs = [] if vector_envs else [recorder(agent.make_env(), stats) for _ in range(agent.num_envs)]
        agent.eval_env = recorder(agent.make_env(), stats, evaluating=True) if eval_every else None
    elif isinstance(agent, Agent):
        agent.env = recorder(agent.make_env(), stats)
    return stats


def play(agent: AgentBase, between_episodes: Callable[[], None]) -> NoReturn:
    """Play until the run stops it (StopRequested, raised from inside a request or ``between_episodes``).

    A ``VectorAgent`` plays in its own ``run()``; an ``Agent`` plays episode after
    episode, one evaluation episode after every ``eval_every`` training episodes.
    """
    if isinstance(agent, VectorAgent):
        agent.run()
        raise ConfigError(f"{type(agent).__name__}.run() returned: a VectorAgent plays until the run stops it")
    if not isinstance(agent, Agent):
        raise ConfigError(f"{type(agent).__name__} is neither a flare2 Agent nor a VectorAgent")
    schedule = EvaluationSchedule(agent.eval_every)
    while True:
        agent.evaluating = agent.env.evaluating = schedule.start_if_due()
        agent.run_episode()
        if not agent.evaluating:
            schedule.training_episodes_ended()
        between_episodes()
