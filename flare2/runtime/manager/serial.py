"""The serial schedule (``--serial``): the whole run in one process, one thread, one call stack.

The Manager's own orchestration (budget, signals, progress rows, checkpoints,
resume, summary, exit code) on an in-process schedule: the same Agent,
helpers, CDP batching and ComputationTask code as a parallel run, joined by
in-process ports instead of sockets. ``Agent.predict`` calls the port, which
hands the request to the CDP, which serves it at once (the one agent is the
only live one, so the batching rule flushes it) and calls
``Algorithm.predict``; learn requests go the same way to ``Algorithm.learn``.
The Manager's ``tick`` is called from the agent's own loop, as often as an
agent process reports to a parallel manager. Nothing is encoded and nothing
waits, so a breakpoint anywhere (in a Model, an Algorithm, a helper or an
Agent) stops the whole run, and the stack shows how it got there.

Use it to debug; run in parallel to go fast. It is also the in-process
baseline that ``tools/bench.py`` holds the parallel runtime against. It plays
one agent: a VectorAgent gets every env of the run (``num_agents`` times
``envs_per_agent``), a one-env Agent plays alone.
"""

from __future__ import annotations

import logging
import time
import traceback
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from flare2.core.agent import AgentBase, VectorAgent
from flare2.core.specs import CTSpecs
from flare2.errors import ConfigError, FlareError, RunFailed, UserCodeError
from flare2.runtime import exit_codes
from flare2.runtime.agents.playing import StopRequested, make_agent, make_envs, play
from flare2.runtime.compute.cdp import ComputationDataProcessor
from flare2.runtime.compute.cts import build_cts, resume
from flare2.runtime.compute.frozen_copies import follow
from flare2.runtime.compute.learners import (
    InlineLearner,
    finish_learning,
    save_checkpoints,
)
from flare2.runtime.config import RunConfig
from flare2.runtime.latency import LatencyHistogram
from flare2.runtime.manager.agent_desk import AGENT_CONTROL_INTERVAL_S
from flare2.runtime.manager.progress import compute_report_interval_s
from flare2.runtime.manager.schedule import Conductor
from flare2.runtime.manager.totals import episode_from_wire
from flare2.runtime.supervisor import agent_seed
from flare2.wire.protocol import LEARN, PREDICT, STATISTICS, Message
from flare2.wire.sockets import raise_for_error

logger = logging.getLogger(__name__)

SERIAL_AGENT_ID = "serial"


class SerialPort:
    """A CT as the agent sees it, served in the calling thread: request in, reply out, no sockets."""

    learn_ahead = 0

    def __init__(self, cdp: ComputationDataProcessor, control: _SerialControl) -> None:
        self.cdp = cdp
        self.control = control
        self._seq = 0
        self._reply: Message | None = None
        self._learner = InlineLearner()
        self._answered: dict[int, dict[str, Any]] = {}

    def deliver(self, _reply_to: Any, _learn: bool, message: Message) -> None:
        """The CDP's reply callback."""
        self._reply = message

    def _ask(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        self._seq += 1
        self._reply = None
        message = Message(kind, payload, SERIAL_AGENT_ID, self._seq, self.cdp.ct.name)
        now = time.monotonic()
        self.cdp.accept(message, self, now, learn=kind != PREDICT)
        if kind == PREDICT:
            self.cdp.serve_predictions(now)
        else:
            while (batch := self.cdp.take_learn_batch(now)) is not None:
                self._learner.submit(batch)
        reply = self._reply
        if reply is None:
            raise FlareError(f"CT {self.cdp.ct.name!r} did not serve a {kind} request at once: this is a flare2 bug")
        raise_for_error(reply, f"{kind} on CT {self.cdp.ct.name!r}")
        return reply.payload

    def predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        reply = self._ask(PREDICT, payload)
        self.control.round_trips.add(time.perf_counter() - started)
        self.control.maybe_service()
        return reply

    def send_predict(self, payload: dict[str, Any]) -> int:
        """Served at once, like every request here; the reply waits for ``wait_predict``."""
        reply = self.predict(payload)
        self._answered[self._seq] = reply
        return self._seq

    def wait_predict(self, ticket: int) -> dict[str, Any]:
        return self._answered.pop(ticket)

    def learn(self, payload: dict[str, Any]) -> None:
        self._ask(LEARN, payload)
        self.control.maybe_service()

    def send_statistics(self, payload: dict[str, Any]) -> int:
        reply = self._ask(STATISTICS, payload)
        self._answered[self._seq] = reply
        return self._seq

    def wait_statistics(self, ticket: int) -> dict[str, Any]:
        return self._answered.pop(ticket)


class _SerialControl:
    """What an agent process's link to the manager does in a parallel run, called from the agent's own loop: its
    stats and round trips go to the run's totals, and the Manager's tick says whether to play on."""

    def __init__(self, schedule: SerialSchedule, interval_s: float = AGENT_CONTROL_INTERVAL_S) -> None:
        self.schedule = schedule
        self.interval_s = interval_s
        self.round_trips = LatencyHistogram()
        self.stats: Any = None
        self._next_at = time.monotonic() + interval_s

    def maybe_service(self) -> None:
        # A step budget is looked at every step too: in one process a few hundred steps take less than one interval.
        budget = self.schedule.config.max_steps
        played = self.schedule.manager.totals.env_steps + self.stats.steps
        if time.monotonic() >= self._next_at or (budget is not None and played >= budget):
            self.service()

    def service(self) -> None:
        """Report what the agent played; raises StopRequested once the run must stop."""
        self._next_at = time.monotonic() + self.interval_s
        self.schedule.collect(self.stats.take(), self.round_trips.take())
        self.schedule.tick()


class SerialSchedule:
    """One agent and every CDP of a run, served in the calling thread."""

    stops_gradually = False

    def __init__(self, config: RunConfig, manager: Conductor) -> None:
        self.config = config
        self.manager = manager
        self.cdps: list[ComputationDataProcessor] = []
        self._learner = InlineLearner()
        self._agent: AgentBase | None = None
        self._control: _SerialControl | None = None
        self._envs = 0
        self._exit_code: int | None = None
        self._learn_the_rest = False
        self._report_interval_s = compute_report_interval_s(config.progress_interval_s)
        self._next_report = 0.0

    def open(self) -> AbstractContextManager[None]:
        """Nothing to bind or make: everything lives in this process."""
        return nullcontext()

    def start(self) -> None:
        config = self.config
        logger.info("serial run: the compute side and one agent in this process, log dir %s", config.log_dir)
        agent = self._make_agent()
        cts = build_cts(config.cts, device=config.device, seed=config.seed, torch_threads=config.torch_threads)
        counters = resume(cts, config.resume_dir)
        self.cdps = [
            ComputationDataProcessor(ct, config=ct_config.batching, reply=lambda *_: None)
            for ct, ct_config in zip(cts, config.cts)
        ]
        follow(self.cdps, config.cts, config.seed)
        self.manager.compute_is_up({cdp.ct.name: cdp.ct.identity() for cdp in self.cdps}, counters)
        control = _SerialControl(self)
        ports = {}
        for cdp in self.cdps:
            port = SerialPort(cdp, control)
            cdp.reply = port.deliver
            cdp.live = frozenset({SERIAL_AGENT_ID})
            ports[cdp.ct.name] = port
        helpers = agent.helpers()
        unknown = sorted(set(helpers) - set(ports))
        if unknown:
            raise ConfigError(f"{type(agent).__name__} asks for CT(s) {unknown}, but the run serves {sorted(ports)}")
        control.stats = make_envs(agent, config.eval_every)
        specs: dict[str, CTSpecs] = {name: ports[name].cdp.ct.specs for name in helpers}
        agent.connect(
            agent_id=SERIAL_AGENT_ID,
            seed=agent_seed(config.seed, slot=0, incarnation=0),
            specs=specs,
            ports={n: ports[n] for n in helpers},
            helpers=helpers,
        )
        self._agent, self._control, self._envs = agent, control, agent.num_envs

    def _make_agent(self) -> AgentBase:
        config = self.config.agents
        agent = make_agent(config.path, config.kwargs, config.envs_per_agent)
        if isinstance(agent, VectorAgent):
            agent.num_envs = config.num_agents * agent.num_envs or 1
            agent.requests_overlap = False
        elif config.num_agents > 1:
            logger.warning(
                "serial mode plays one %s (it plays one env, so the other %d agent(s) of --num-agents are left out)",
                type(agent).__name__,
                config.num_agents - 1,
            )
        return agent

    def run(self) -> int:
        """Play until the Manager's tick says stop (the agent's loop calls it); returns the exit code it said."""
        agent, control = self._agent, self._control
        if agent is None or control is None:
            raise RuntimeError("SerialSchedule.run() before start()")
        try:
            play(agent, control.maybe_service)
        except StopRequested:
            self._learn_the_rest = True
            return self._exit_code if self._exit_code is not None else exit_codes.OK
        except UserCodeError as exc:
            # The compute side failed in user code: as in a parallel run, nothing more is learned or saved.
            raise RunFailed(f"the run failed: {exc}", exit_codes.FAILED) from None
        except FlareError:
            raise
        except Exception:  # noqa: BLE001 - user code
            # The agent's episode code failed; what reached the CDPs is still learned and saved.
            self._learn_the_rest = True
            failure = f"the agent raised in its episode code:\n{traceback.format_exc()}"
            raise RunFailed(failure, exit_codes.FAILED) from None
        raise RuntimeError("play() returned without a stop")  # it raises StopRequested or the agent's error

    def collect(self, stats: dict[str, Any], round_trips: list[int]) -> None:
        """Add what the agent played since the last call to the run's totals, and the CDPs' figures when due."""
        self._add_agent_stats(stats, round_trips)
        now = time.monotonic()
        if now >= self._next_report:
            self._next_report = now + self._report_interval_s
            self._collect_cdp_reports()

    def _add_agent_stats(self, stats: dict[str, Any], round_trips: list[int]) -> None:
        totals = self.manager.totals
        totals.add_agent_stats(stats["steps"], [episode_from_wire(episode) for episode in stats["episodes"]])
        evaluated = [episode_from_wire(episode) for episode in stats.get("eval_episodes", [])]
        totals.add_eval_stats(stats.get("eval_steps", 0), evaluated)
        totals.round_trips.merge(round_trips)

    def tick(self) -> None:
        """The Manager's tick, from inside the agent's loop; StopRequested unwinds the agent once the run must stop."""
        code = self.manager.tick()
        if code is not None:
            self._exit_code = code
            raise StopRequested()

    def _collect_cdp_reports(self) -> None:
        self.manager.totals.add_compute_stats({cdp.ct.name: cdp.stats.take_report() for cdp in self.cdps})

    @property
    def ready_to_checkpoint(self) -> bool:
        return bool(self.cdps)

    def checkpoint(self, counters: dict[str, Any]) -> None:
        directory = Path(self.config.log_dir) / "checkpoints"
        save_checkpoints(self.cdps, self._learner, directory, counters)
        logger.info("checkpoint written to %s", directory)

    def agent_counts(self) -> tuple[int, int, int]:
        return (1, 0, self._envs) if self._agent is not None else (0, 0, 0)

    def shutdown(self) -> None:
        """Learn what is waiting and write the final checkpoints, unless the compute side failed."""
        if not self._learn_the_rest:
            return
        if self._control is not None:
            # What the agent played since its last report still counts.
            self._add_agent_stats(self._control.stats.take(), self._control.round_trips.take())
        finish_learning(self.cdps, self._learner)
        # One report for the last row, from the last one taken: a second one, empty, would replace it.
        self._collect_cdp_reports()
        self.checkpoint(self.manager.totals.counters())
