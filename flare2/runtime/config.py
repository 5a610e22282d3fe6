"""What a run is made of: frozen, validated configs with documented fields."""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flare2.errors import ConfigError
from flare2.wire.codec import DEFAULT_MAX_BYTES

LEARNERS = ("auto", "process", "thread", "inline")
# What RunConfig.busy_wait_us None means while every busy process has a core of its own: longer than a prediction on
# a CPU (for an agent waiting for its reply) and an env step (for the compute process waiting for the next request),
# so that the message is there before the waiting process would have slept. At 200 µs an agent of one CartPole env
# slept before most replies, and its round trip took 0.33 ms instead of 0.24 (tools/bench.py --quick, 2 cores).
AUTO_BUSY_WAIT_US = 1000
# A wait that checks for longer than this is a core spent, not a wake-up saved.
MOST_BUSY_WAIT_US = 1_000_000
REJOIN_FOR_S = 3600.0
"""How long ``flare2 attach`` waits, by default, for a manager its agents lost to answer again."""


def busy_wait_us(setting: int | None, busy_processes: int) -> int:
    """RunConfig.busy_wait_us resolved for a run of ``busy_processes`` on the cores this process may use."""
    if setting is not None:
        return setting
    return AUTO_BUSY_WAIT_US if busy_processes <= len(os.sched_getaffinity(0)) else 0


def predict_threads(setting: int | None, torch_threads: int, local_agents: int) -> int:
    """RunConfig.predict_threads resolved for ``local_agents`` agent processes on the cores this process may use."""
    if setting is not None:
        return setting
    return max(1, min(torch_threads, len(os.sched_getaffinity(0)) - local_agents))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


CHECKPOINT_EVERY_S = 120.0
"""The default interval of periodic checkpoints: a restarted compute process loses at most this much learning, and a
checkpoint of the zoo's Atari PPO (21 MB) costs about 0.05 % of it (``tools/bench_checkpoint.py``)."""


@dataclass(frozen=True)
class BatchingConfig:
    """How one CT batches requests (docs/architecture.md: Batching)."""

    max_batch: int = 64
    """Flush a prediction batch once it holds this many requests."""
    max_wait_ms: float = 0.0
    """Flush a prediction batch once its oldest request has waited this long.

    0 serves whatever is waiting each time the compute loop comes round: the
    requests that arrive while one batch is served make the next one, so
    batches fill by themselves when the compute process is the bottleneck and
    nobody waits when it is not. Waiting for every agent instead puts them in
    lock-step, each waiting for the slowest (2 cores, rollout without learning:
    4 agents x 32 envs 49k -> 74k env steps/s, 8 x 1 2.9k -> 4.7k with 0 instead
    of 2 ms). Raise it when one forward pass costs far more than a request.
    """
    learn_max_batch: int = 64
    """Flush a learn batch once it holds this many requests (one per agent)."""
    learn_max_wait_ms: float = 20.0
    """Flush a learn batch once its oldest request has waited this long."""

    def __post_init__(self) -> None:
        for name in ("max_batch", "learn_max_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"BatchingConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_wait_ms", "learn_max_wait_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"BatchingConfig.{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class CTConfig:
    """One ComputationTask of a run."""

    name: str
    """Name agents use to ask this CT (``Agent.predict(name, ...)``)."""
    build: Callable[[], Any]
    """Returns the Algorithm; called in the compute process. Must be picklable:
    a module-level function or a functools.partial of one."""
    batching: BatchingConfig = BatchingConfig()
    """When prediction and learn batches are flushed."""
    follows: str | None = None
    """A frozen copy of this other CT (self-play's opponent): it learns nothing of its own and takes that CT's weights
    as the run starts and after every ``refresh_every`` of its updates."""
    refresh_every: int = 0
    """With ``follows``: the updates of the followed CT between two copies of its weights."""
    snapshots: int = 1
    """With ``follows``: how many of the followed CT's past weights it keeps, a uniform sample of all the copies
    taken so far; at each refresh it plays one drawn from them (1: the newest copy alone)."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier():
            raise ConfigError(f"CT name must be a non-empty identifier, got {self.name!r}")
        if not callable(self.build):
            raise ConfigError(f"CTConfig.build of CT {self.name!r} must be callable, got {type(self.build).__name__}")
        if (self.follows is None) != (self.refresh_every == 0) or self.refresh_every < 0:
            raise ConfigError(
                f"CT {self.name!r}: a frozen copy names the CT it follows and refreshes every N >= 1 of its updates "
                f"(follows and refresh_every together), got follows={self.follows!r}, refresh_every={self.refresh_every}"
            )
        if self.snapshots < 1:
            raise ConfigError(
                f"CT {self.name!r}: snapshots is how many past weights a frozen copy keeps, >= 1, got {self.snapshots}"
            )


@dataclass(frozen=True)
class AgentConfig:
    """Which agent class the run starts, and how many."""

    path: str
    """Import path of the Agent class: ``package.module:Class`` or ``path/to/file.py:Class``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the class; plain JSON data so the same recipe works on any machine."""
    num_agents: int = 1
    """How many agent processes this machine runs."""
    envs_per_agent: int | None = None
    """Environments each agent process plays: a VectorAgent such as GymAgent plays several, sending one request
    for all of them per step; a one-env Agent plays 1 (and more ``num_agents`` instead). None: what the agent class
    says (``default_envs``: 8 for a VectorAgent, one process of which keeps both cores of a 2-core machine busy
    beside the compute process; 1 for an Agent)."""

    def __post_init__(self) -> None:
        if ":" not in self.path:
            raise ConfigError(f"agent path must look like package.module:Class, got {self.path!r}")
        if self.num_agents < 0:
            raise ConfigError(f"num_agents must be >= 0, got {self.num_agents}")
        if self.envs_per_agent is not None and self.envs_per_agent < 1:
            raise ConfigError(
                f"envs_per_agent must be >= 1, got {self.envs_per_agent}: each agent process plays at least one env "
                "(--envs-per-agent 1 or more)"
            )
        try:
            json.dumps(self.kwargs)
        except TypeError as exc:
            raise ConfigError(f"agent kwargs must be plain JSON data ({exc})") from None


@dataclass(frozen=True)
class RunConfig:
    """A whole run: its CTs, its agents, when it stops and where it writes."""

    cts: tuple[CTConfig, ...]
    """The ComputationTasks, all hosted by one compute process."""
    agents: AgentConfig
    """The local agent processes."""
    log_dir: str = "runs/latest"
    """Where progress.csv, manager.log and checkpoints go."""
    max_steps: int | None = None
    """Stop after this many env steps in total."""
    max_episodes: int | None = None
    """Stop after this many episodes in total."""
    stop_return: float | None = None
    """Also stop once the mean return of the last 100 episodes reaches this."""
    eval_every: int = 0
    """Each agent plays one evaluation episode (greedy actions, not learned from, reported as
    ``eval_return_mean``) after every this many training episodes; 0 for none."""
    stop_eval_return: float | None = None
    """Also stop once the mean return of the last 20 evaluation episodes reaches this (needs ``eval_every``)."""
    device: str = "auto"
    """Device of the compute process: cpu, cuda, cuda:N or auto (cuda when there is one and the CTs' networks are
    large enough for it to pay: ``flare2.core.devices.AUTO_CUDA_MIN_PARAMETERS``)."""
    seed: int = 0
    """Seeds torch in the compute process and each agent's first env reset."""
    bind: str = "127.0.0.1"
    """Address the manager and the CDPs bind to. Beyond loopback, CURVE keys (or ``insecure``) are required."""
    port: int = 0
    """Port of the manager's control endpoint (0: a free one)."""
    advertise: str | None = None
    """Address agents are told to connect to (default: ``bind``); for a host with several addresses or behind NAT."""
    keys_dir: str | None = None
    """Directory made by ``flare2 keys``: serve CURVE with its server pair, accept only the keys in its allowed/ folder."""
    insecure: bool = False
    """Allow a non-loopback bind without CURVE: anyone who reaches the port can join the run."""
    progress_interval_s: float = 5.0
    """Seconds between progress lines (and progress.csv rows)."""
    tensorboard: bool = False
    """Also write every scalar of progress.csv and learn.csv as TensorBoard events in the log dir, against env
    steps (needs the ``tensorboard`` extra)."""
    wandb_project: str | None = None
    """Also log those scalars to this Weights & Biases project, through W&B's TensorBoard sync (turns
    ``tensorboard`` on; needs the ``wandb`` extra)."""
    torch_threads: int = 1
    """Threads torch uses in the compute process for learn() and in a learner process: with small models a second
    thread costs more in handing work over than it saves (a 64-64 MLP at batch 64 is 25 % slower with 2), and the
    cores are better spent on the agent processes."""
    predict_threads: int | None = None
    """Threads torch uses for the forward passes that answer the agents. The local agents step their envs while
    one runs, and a pass with a thread on a core an agent holds waits for that thread: None gives it the cores this
    process may use less one per local agent process, at least 1 and at most ``torch_threads``."""
    busy_wait_us: int | None = None
    """Microseconds a process waiting for a message keeps checking for it before it sleeps (the compute process, and
    agents on the manager's machine). Waking a sleeping core costs tens of µs, and a prediction round trip wakes two;
    checking pays while every busy process of the run has a core of its own, and takes cores from the others when
    they do not. None: ``AUTO_BUSY_WAIT_US`` when the local agents, the compute process and its learner process fit
    the machine's cores, else 0."""
    learner: str = "auto"
    """Where learn() runs. ``process``: a learner process of its own, beside the compute process that keeps serving
    predictions (the algorithm must allow it: ``Algorithm.may_learn_in_own_process``); ``thread``: a thread of the
    compute process, which pays only where learn() spends its time outside Python (large models, a GPU), since with
    small models the two threads take turns at the GIL; ``inline``: between predictions, in the compute loop.
    ``auto``: a process where every CT's algorithm allows one and the machine has a second core, else inline."""
    learners: int = 1
    """Learner processes that train the model data-parallel (``flare2.core.data_parallel``): each takes an equal share
    of every learn batch, and their gradients are averaged in ``Algorithm.optimize()``. More than 1 needs the
    learner process (``learner`` auto or process); with ``device`` cuda, one GPU each."""
    remote_learners: int = 0
    """How many of the ``learners`` run on other machines, each started there by ``flare2 learn`` (which takes the
    run's recipe from the manager); they meet the others through torch.distributed's rendezvous at the run's
    address. Only CTs built from plain data (those of ``flare2 train``) can be sent."""
    serial: bool = False
    """Run the compute side and one agent in this process, over in-process ports (for debuggers; see
    flare2.runtime.manager.serial)."""
    max_message_bytes: int = DEFAULT_MAX_BYTES
    """Largest message a socket accepts from another machine; the Unix streams of local agents take at least
    ``STREAM_MAX_BYTES`` (``flare2.wire.streams``)."""
    max_restarts: int = 10
    """Agent restarts allowed over the whole run (an agent that crashes or goes silent is restarted); past it the run fails."""
    restart_backoff_s: float = 0.5
    """Wait before restarting an agent; it doubles for each failure in a row of that agent (up to 30 s)."""
    heartbeat_timeout_s: float = 10.0
    """An agent silent for this long is taken for dead; an agent that hears nothing from the manager for this long
    exits; a group of learners re-formed after a death waits this long for the learners it had on other machines."""
    reply_timeout_s: float | None = None
    """Longest an agent waits for one reply of the compute process (None: as long as it takes). Slow is not dead:
    while the manager's heartbeats say the run goes on, a long learn() or checkpoint is waited out, and a compute
    process that died is replaced through the manager (its agents leave and rejoin). A limit that does fire ends the
    agent with its own error."""
    checkpoint_every_s: float | None = CHECKPOINT_EVERY_S
    """Write a checkpoint every this many seconds (one is always written at the end; None: only then). A compute
    process that dies restarts from the last one."""
    checkpoint_every_steps: int | None = None
    """Write a checkpoint every this many env steps (one is always written at the end)."""
    resume_dir: str | None = None
    """Log directory of an earlier run (or its checkpoints/ folder): continue its learning and counters."""
    startup_timeout_s: float = 120.0
    """How long the compute process and the agents may take to come up, the first group of learners waits for its
    learners on other machines, and a learner waits for another in a collective before the group breaks."""
    stop_timeout_s: float = 5.0
    """How long children get to exit after being asked before they are killed."""

    @property
    def board(self) -> bool:
        """Whether the run writes TensorBoard events (``--wandb`` reads them)."""
        return self.tensorboard or self.wandb_project is not None

    def __post_init__(self) -> None:
        self._check_cts_and_budget()
        self._check_logging()
        self._check_supervision()
        self._check_network()
        self._check_learners()

    def _check_cts_and_budget(self) -> None:
        """The CTs, the budget and the stopping rules."""
        if not self.cts:
            raise ConfigError("a run needs at least one CTConfig")
        names = [ct.name for ct in self.cts]
        if len(set(names)) != len(names):
            raise ConfigError(f"CT names must be unique, got {names}")
        learning = {ct.name for ct in self.cts if ct.follows is None}
        for ct in self.cts:
            if ct.follows is not None and ct.follows not in learning:
                raise ConfigError(
                    f"CT {ct.name!r} follows {ct.follows!r}, which is not a CT of the run that learns: it may follow "
                    f"one of {sorted(learning)}"
                )
        for name in ("max_steps", "max_episodes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.max_steps is None and self.max_episodes is None:
            raise ConfigError(
                "a run needs a budget: set max_steps or max_episodes (stop_return alone may never be met)"
            )
        if self.eval_every < 0:
            raise ConfigError(f"eval_every must be >= 0 (0: no evaluation episodes), got {self.eval_every}")
        if self.stop_eval_return is not None and not self.eval_every:
            raise ConfigError("stop_eval_return needs evaluation episodes: set eval_every (--eval-every N) as well")
        if self.progress_interval_s <= 0:
            raise ConfigError(f"progress_interval_s must be > 0, got {self.progress_interval_s}")

    def _check_logging(self) -> None:
        """TensorBoard and W&B, whose packages must be installed when asked for."""
        if self.wandb_project is not None and not self.wandb_project.strip():
            raise ConfigError("--wandb needs a W&B project name, got an empty one")
        if self.wandb_project is not None and importlib.util.find_spec("wandb") is None:
            raise ConfigError(
                "--wandb logs with the wandb package, which is not installed: "
                'python -m pip install -e ".[wandb]" (or pip install wandb tensorboard)'
            )
        if (self.tensorboard or self.wandb_project is not None) and importlib.util.find_spec("tensorboard") is None:
            raise ConfigError(
                f"{'--tensorboard' if self.tensorboard else '--wandb'} writes with the tensorboard package, which is not "
                'installed: python -m pip install -e ".[tensorboard]" (or pip install tensorboard)'
            )

    def _check_supervision(self) -> None:
        """Restarts, threads, busy waits, timeouts and checkpoints."""
        if self.max_restarts < 0:
            raise ConfigError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.predict_threads is not None and self.predict_threads < 1:
            raise ConfigError(f"predict_threads must be >= 1 (or None: from the cores), got {self.predict_threads}")
        if self.busy_wait_us is not None and not 0 <= self.busy_wait_us <= MOST_BUSY_WAIT_US:
            raise ConfigError(
                f"busy_wait_us must be between 0 (sleep at once) and {MOST_BUSY_WAIT_US}, got {self.busy_wait_us}"
            )
        for name in (
            "restart_backoff_s",
            "heartbeat_timeout_s",
            "reply_timeout_s",
            "checkpoint_every_s",
            "checkpoint_every_steps",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be > 0, got {value}")

    def _check_network(self) -> None:
        """Where the run listens and who may reach it."""
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if not is_loopback(self.bind) and self.keys_dir is None and not self.insecure:
            raise ConfigError(
                f"binding {self.bind} lets other machines reach the run: make keys with `flare2 keys DIR` and pass "
                "--keys DIR (agents attach with the same keys), or pass --insecure to run without authentication"
            )
        if self.serial and not is_loopback(self.bind):
            raise ConfigError(
                f"--serial runs the whole run in this process, so nothing listens on --bind {self.bind}: "
                "drop --bind, or give --no-serial (the env's preset may run serially) to let agents on other machines "
                "attach"
            )
        if self.bind in ("0.0.0.0", "::", "*") and not self.advertise:
            raise ConfigError(
                f"--bind {self.bind} listens on every address: pass --advertise ADDRESS that agents can reach"
            )

    def _check_learners(self) -> None:
        """Where learn() runs and how many learners there are."""
        if self.learner not in LEARNERS:
            raise ConfigError(f"learner must be one of {', '.join(LEARNERS)}, got {self.learner!r}")
        if self.learners < 1:
            raise ConfigError(f"--learners must be >= 1, got {self.learners}")
        if not 0 <= self.remote_learners < self.learners:
            raise ConfigError(
                f"--remote-learners must be in 0..{self.learners - 1} (--learners counts them, and the first learner "
                f"runs beside the compute process), got {self.remote_learners}"
            )
        sent = [ct.name for ct in self.cts if not callable(getattr(ct.build, "recipe", None))]
        if self.remote_learners and sent:
            raise ConfigError(
                f"--remote-learners sends the CTs' builds to other machines as data, and CT {sent[0]!r} is built by a "
                "Python function (a script's CTConfig.build): train it with `flare2 train`, or keep --remote-learners 0"
            )
        if self.learners > 1 and (self.serial or self.learner in ("thread", "inline")):
            where = "--serial" if self.serial else f"--learner {self.learner}"
            raise ConfigError(
                f"--learners {self.learners} runs learner processes, which {where} does not: drop {where}"
                + (", or give --no-serial (the env's preset may run serially)" if self.serial else "")
            )
        if self.serial and self.learner in ("process", "thread"):
            raise ConfigError(
                f"--serial runs learn() in this process, between predictions: drop --learner {self.learner}, or "
                "give --no-serial (the env's preset may run serially)"
            )
