"""Serial mode (``--serial``): the whole run in one process, one thread, one call stack.

The same Agent, helpers, CDP batching and ComputationTask code as a parallel
run, joined by in-process ports instead of sockets: ``Agent.predict`` calls
the port, which hands the request to the CDP, which serves it at once (the
one agent is the only live one, so the batching rule flushes it) and calls
``Algorithm.predict``; learn requests go the same way to ``Algorithm.learn``.
Nothing is encoded and nothing waits, so a breakpoint anywhere (in a Model,
an Algorithm, a helper or an Agent) stops the whole run, and the stack shows
how it got there.

Use it to debug; run in parallel to go fast. It is also the in-process
baseline that ``tools/bench.py`` holds the parallel runtime against. It plays
one agent: a VectorAgent gets every env of the run (``num_agents`` times
``envs_per_agent``), a one-env Agent plays alone.
"""

from __future__ import annotations

import logging
import signal
import time
import traceback
from pathlib import Path
from typing import Any

from flare2.core.agent import AgentBase, VectorAgent
from flare2.core.specs import CTSpecs
from flare2.errors import ConfigError, FlareError, UserCodeError
from flare2.runtime.agents.agent_process import StopRequested, make_agent, make_envs, play
from flare2.runtime.compute.cdp import ComputationDataProcessor
from flare2.runtime.checkpoints import CheckpointSchedule, checkpoint_path, resume_checkpoint_path, resuming_in_place
from flare2.runtime.config import RunConfig
from flare2.runtime import exit_codes
from flare2.runtime.compute.learners import InlineLearner
from flare2.runtime.latency import LatencyHistogram
from flare2.runtime.manager.progress import ProgressLog, RunTotals, summary_line, wandb_logging
from flare2.runtime.run_files import record_run, run_logs_and_signals
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
    """What the manager does for a parallel run, called from the agent's own loop: stats, progress, budget, stop."""

    def __init__(self, run: SerialRun, interval_s: float = 0.25) -> None:
        self.run = run
        self.interval_s = interval_s
        self.round_trips = LatencyHistogram()
        self.stats: Any = None
        self._next_at = time.monotonic() + interval_s

    def maybe_service(self) -> None:
        if time.monotonic() >= self._next_at:
            self.service()

    def service(self) -> None:
        self._next_at = time.monotonic() + self.interval_s
        self.run.collect(self.stats.take(), self.round_trips.take())
        if self.run.stop_signal is not None or self.run.totals.budget_reached(self.run.config):
            raise StopRequested()
        self.run.on_tick()


class SerialRun:
    """Runs one RunConfig with ``serial=True`` to its end; ``run()`` returns the exit code."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.log_dir = Path(config.log_dir)
        self.totals = RunTotals()
        self.stop_signal: int | None = None
        self.cdps: list[ComputationDataProcessor] = []
        self._progress: ProgressLog | None = None
        self._envs = 0
        self._next_progress = 0.0
        self._checkpoints = CheckpointSchedule(config)

    def run(self) -> int:
        with run_logs_and_signals(self.log_dir, self._on_signal), wandb_logging(self.config):
            try:
                code = self._run()
            except UserCodeError as exc:
                logger.error("the run failed: %s", exc)
                code = exit_codes.FAILED
            except FlareError as exc:
                logger.error("%s", exc)
                code = exit_codes.CONFIG_ERROR
            finally:
                if self._progress is not None:
                    self._progress.close()
            logger.info("%s", summary_line(exit_codes.outcome(code), self.totals, self.log_dir))
            return code

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stop_signal = signum

    def _run(self) -> int:
        config = self.config
        logger.info("serial run: the compute side and one agent in this process, log dir %s", self.log_dir)
        agent = self._make_agent()
        self._build_cts()
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
        seed = config.seed * 100_003
        agent.connect(agent_id=SERIAL_AGENT_ID, seed=seed, specs=specs, ports={n: ports[n] for n in helpers}, helpers=helpers)
        self._envs = agent.num_envs
        self._start_clocks()
        try:
            play(agent, control.maybe_service)
        except StopRequested:
            pass
        except FlareError:
            raise
        except Exception:
            logger.error("the agent raised in its episode code:\n%s", traceback.format_exc())
            self._finish()
            return exit_codes.FAILED
        self._finish()
        if self.stop_signal is not None:
            logger.warning("stopped on %s", signal.Signals(self.stop_signal).name)
            return exit_codes.SIGINT if self.stop_signal == signal.SIGINT else exit_codes.SIGTERM
        logger.info(
            "budget reached: %d env steps, %d episodes, return_mean %.1f",
            self.totals.env_steps, self.totals.episodes, self.totals.return_mean,
        )
        return exit_codes.OK

    def _make_agent(self) -> AgentBase:
        config = self.config.agents
        agent = make_agent(config.path, config.kwargs, config.envs_per_agent)
        if isinstance(agent, VectorAgent):
            agent.num_envs = config.num_agents * config.envs_per_agent or 1
            agent.requests_overlap = False
        elif config.num_agents > 1:
            logger.warning(
                "serial mode plays one %s (it plays one env, so the other %d agent(s) of --num-agents are left out)",
                type(agent).__name__, config.num_agents - 1,
            )
        return agent

    def _build_cts(self) -> None:
        import torch

        from flare2.core.computation_task import ComputationTask, choose_device

        config = self.config
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        algorithms = [ct_config.build() for ct_config in config.cts]
        device = choose_device(config.device, algorithms)
        counters: dict[str, Any] = {}
        for ct_config, algorithm in zip(config.cts, algorithms):
            ct = ComputationTask(ct_config.name, algorithm, device=device)
            if config.resume_dir:
                counters = ct.load(resume_checkpoint_path(config.resume_dir, ct.name))
            self.cdps.append(ComputationDataProcessor(ct, config=ct_config.batching, reply=lambda *_: None))
        record_run(config, {cdp.ct.name: cdp.ct.identity() for cdp in self.cdps})
        if counters:
            self.totals.resume_from(counters)
        self._progress = ProgressLog(
            self.log_dir, start_steps=self.totals.env_steps, append=bool(counters) and resuming_in_place(config),
            max_steps=config.max_steps, tensorboard=config.board,
        )

    def _start_clocks(self) -> None:
        now = time.monotonic()
        self._next_progress = now + self.config.progress_interval_s
        self._checkpoints.start(now, self.totals.env_steps)

    def collect(self, stats: dict[str, Any], round_trips: list[int]) -> None:
        """Add what the agent played since the last call to the run's totals."""
        totals = self.totals
        totals.add_agent_stats(stats["steps"], [(ret, length) for ret, length in stats["episodes"]])
        totals.add_eval_stats(stats.get("eval_steps", 0), [(ret, length) for ret, length in stats.get("eval_episodes", [])])
        totals.round_trips.merge(round_trips)

    def on_tick(self) -> None:
        """Progress rows and checkpoints when they are due."""
        now = time.monotonic()
        if now >= self._next_progress:
            self._next_progress = now + self.config.progress_interval_s
            self._report_progress()
        if self._checkpoints.take_due(now, self.totals.env_steps):
            self._save_checkpoints()

    def _report_progress(self) -> None:
        self.totals.add_compute_stats({cdp.ct.name: cdp.stats.take_report() for cdp in self.cdps})
        if self._progress is not None:
            self._progress.report(self.totals, agents=1, envs=self._envs)

    def _save_checkpoints(self) -> None:
        for cdp in self.cdps:
            cdp.ct.save(checkpoint_path(self.log_dir / "checkpoints", cdp.ct.name), self.totals.counters())
        logger.info("checkpoint written to %s", self.log_dir / "checkpoints")

    def _finish(self) -> None:
        """Learn what is waiting, write the final checkpoint and progress row."""
        if self._progress is not None:
            self._progress.run_ends()
        now = time.monotonic()
        for cdp in self.cdps:
            while (batch := cdp.take_learn_batch(now, flush=True)) is not None:
                InlineLearner().submit(batch)
        self._report_progress()
        self._save_checkpoints()
