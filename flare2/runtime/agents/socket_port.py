"""An agent process's CTPort over the sockets of one CT's CDP (the serial runner's port is in-process)."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Protocol

import zmq

from flare2.core.predict_requests import ViewsSender
from flare2.core.specs import CTSpecs
from flare2.errors import ConfigError, FlareError
from flare2.runtime.config import MOST_BUSY_WAIT_US
from flare2.runtime.latency import LatencyHistogram
from flare2.wire.protocol import LEARN, PREDICT, STATISTICS
from flare2.wire.security import CurveClient
from flare2.wire.sockets import Requester

logger = logging.getLogger(__name__)


class ControlLink(Protocol):
    """What a port needs of the agent's link to the manager: its pace, its service (stats, STOP, liveness), and
    where round trips are counted."""

    interval_s: float
    round_trips: LatencyHistogram

    def service(self) -> None: ...

    def maybe_service(self) -> None: ...


class SocketPort:
    """One CT as the agent sees it: a predict and a learn requester.

    Predict requests carry each new frame of the CT's observation views once (``flare2.core.predict_requests``).

    Learn requests go out without waiting for their reply while fewer than
    the CT's ``learn_ahead`` are on their way, so the agent plays on while
    ``learn()`` runs; each wait services the manager link, so a STOP or a dead
    manager is noticed even while a CDP is busy.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        ct: str,
        info: dict[str, Any],
        specs: CTSpecs,
        agent_id: str,
        control: ControlLink,
        reply_timeout_s: float | None,
        max_bytes: int,
        curve: CurveClient | None,
    ) -> None:
        self.ct = ct
        self.control = control
        self.reply_timeout_s = reply_timeout_s
        learn_ahead = info.get("learn_ahead", 0)
        self.learn_ahead = learn_ahead if type(learn_ahead) is int and learn_ahead >= 0 else 0
        # Streams to the compute process of this machine come with how long to check for a reply before sleeping.
        busy_wait_us = info.get("busy_wait_us", 0)
        if type(busy_wait_us) is not int or not 0 <= busy_wait_us <= MOST_BUSY_WAIT_US:
            raise ConfigError(
                f"the manager's welcome gives CT {ct!r} a busy_wait_us of {busy_wait_us!r}: a manager of another flare2 "
                "version? Install the same flare2 on both sides"
            )
        # A send that waits for room in a stream services the manager link meanwhile, like a wait for a reply.
        # Observations cross a local predict stream through shared memory. A learn request (7 MB for PPO's Atari
        # preset) comes once per many steps: a block several times its size would cost more memory than it saves time.
        self.predictor, self.learner = (
            Requester(
                ctx,
                info[key],
                identity=agent_id,
                max_bytes=max_bytes,
                curve=curve,
                on_blocked=control.service,
                blocked_every_s=control.interval_s,
                busy_wait_s=busy_wait_us / 1e6,
                shared_arrays=key == "predict_endpoint",
            )
            for key in ("predict_endpoint", "learn_endpoint")
        )
        self._views = ViewsSender(specs, whole=self.predictor.shares_arrays)
        self._learns_in_flight: deque[int] = deque()
        self._sent_at: dict[int, float] = {}

    def _wait(self, requester: Requester, seq: int, what: str) -> dict[str, Any]:
        reply = requester.wait_reply(
            seq,
            timeout_s=self.reply_timeout_s,
            what=what,
            idle_every_s=self.control.interval_s,
            on_idle=self.control.service,
        )
        return reply.payload

    def send_predict(self, payload: dict[str, Any]) -> int:
        seq = self.predictor.send_request(PREDICT, self._views.pack(payload), ct=self.ct)
        self._sent_at[seq] = time.perf_counter()
        return seq

    def wait_predict(self, seq: int) -> dict[str, Any]:
        reply = self._wait(self.predictor, seq, f"predict on CT {self.ct!r}")
        self.control.round_trips.add(time.perf_counter() - self._sent_at.pop(seq))
        self.control.maybe_service()
        return reply

    def learn(self, payload: dict[str, Any]) -> None:
        self._learns_in_flight.append(self.learner.send_request(LEARN, payload, ct=self.ct))
        while len(self._learns_in_flight) > self.learn_ahead:
            self._wait(self.learner, self._learns_in_flight.popleft(), f"learn on CT {self.ct!r}")
        self.control.maybe_service()

    def send_statistics(self, payload: dict[str, Any]) -> int:
        return self.learner.send_request(STATISTICS, payload, ct=self.ct)

    def wait_statistics(self, ticket: int) -> dict[str, Any]:
        return self._wait(self.learner, ticket, f"statistics of CT {self.ct!r}")

    def finish_learning(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until the learn requests on their way are learned, so none is lost at a stop."""
        deadline = time.monotonic() + timeout_s
        while self._learns_in_flight:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                self.learner.wait_reply(
                    self._learns_in_flight.popleft(), timeout_s=remaining, what=f"learn on CT {self.ct!r}"
                )
            except FlareError as exc:
                # The agent is stopping anyway: a learn that failed or came too late must not turn the stop into a crash.
                logger.info("agent stops without the reply to a learn request: %s", str(exc).splitlines()[0])
                return

    def close(self) -> None:
        self.predictor.close()
        self.learner.close()
