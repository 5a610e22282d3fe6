"""The compute process: hosts every ComputationTask and one CDP per CT.

A single loop polls the control socket and every CDP socket; its poll timeout
is the nearest batch deadline, so a batch waits at most ``max_wait`` plus one
wake-up. Ready learn batches go to the learner the run chose (``learner``):
a learner process (:mod:`flare2.runtime.compute.learner_process`) or a thread
(:mod:`flare2.runtime.compute.learners`) while the loop keeps serving predictions, or
the loop itself, between predictions.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import zmq

from flare2.errors import (
    CheckpointError,
    ConfigError,
    DecodeError,
    FlareError,
    LearnerDiedError,
    UserCodeError,
)
from flare2.runtime.compute.cdp import ComputationDataProcessor
from flare2.runtime.compute.cdp_sockets import SocketFront
from flare2.runtime.compute.cts import build_cts, resume
from flare2.runtime.compute.frozen_copies import follow
from flare2.runtime.compute.learners import (
    InlineLearner,
    Learner,
    LearnerThread,
    finish_learning,
    save_checkpoints,
)
from flare2.runtime.config import CTConfig, busy_wait_us, predict_threads
from flare2.runtime.processes import (
    COMPUTE_IDENTITY,
    WarmProcess,
    configure_child_logging,
    die_with_parent,
)
from flare2.wire.protocol import (
    BYE,
    CHECKPOINT,
    ERROR,
    HELLO,
    LEARNER_LOST,
    LIVE,
    REMOTE_LEARNER_LOST,
    STATS,
    STOP,
    Message,
    error_payload,
    pack,
    unpack,
)
from flare2.wire.security import CurveClient, CurveServer, start_authenticator
from flare2.wire.sockets import connect_dealer, context, poll_timeout_ms

if TYPE_CHECKING:
    from flare2.core.computation_task import ComputationTask

logger = logging.getLogger(__name__)

_IDLE_POLL_S = 0.1
_ERROR_LINGER_MS = 2000

_spare_learners: list[WarmProcess] = []
"""The spare learner processes this process started as it waited for its work (``warm_up``)."""


def warm_up(learners: int) -> None:
    """What a compute process started as a ``WarmProcess`` does before its settings come: the imports its work
    needs, torch's first, and ``learners`` spare learner processes of its own, which import theirs meanwhile (for
    ``_start_learner`` to take)."""
    # Imported here: the manager imports this module and must not load torch.
    from flare2.runtime.compute.learner_process import LEARNER_MODULE

    _spare_learners.extend(WarmProcess(LEARNER_MODULE, daemon=True) for _ in range(learners))


@dataclass(frozen=True)
class ComputeSettings:
    control_endpoint: str
    cts: tuple[CTConfig, ...]
    device: str
    seed: int
    bind: str
    curve_server: CurveServer | None
    """CURVE for the CDP sockets (None on loopback without keys)."""
    curve_client: CurveClient | None
    """CURVE for this process's own link to the manager."""
    checkpoint_dir: str
    resume_dir: str | None
    torch_threads: int
    predict_threads: int | None
    """RunConfig.predict_threads, resolved here from the cores and the local agents."""
    learner: str
    """Where learn() runs: auto, process, thread or inline (see RunConfig.learner)."""
    learners: int
    """Learner processes training data-parallel (RunConfig.learners)."""
    remote_learners: int
    """How many of them join from other machines (RunConfig.remote_learners)."""
    learner_rendezvous: str
    """Where the learners meet (tcp://HOST:PORT, chosen by the manager); empty for one learner."""
    startup_timeout_s: float
    """How long a collective of the learners waits for one that does not answer, and how long this process waits for
    the counters of a checkpoint after a failure (RunConfig.startup_timeout_s)."""
    learner_rendezvous_timeout_s: float
    """How long the learners wait for each other to join (``LearnerSeats.rendezvous_timeout_s``)."""
    busy_wait_us: int | None
    """RunConfig.busy_wait_us, resolved here once the learner is chosen."""
    local_agents: int
    max_message_bytes: int
    parent_pid: int
    socket_dir: str
    """Where the CDPs' Unix sockets for local agents go: a private directory the manager made and removes."""
    stats_interval_s: float = 1.0


def compute_main(settings: ComputeSettings) -> None:
    """Entry point of the compute process (a ``WarmProcess`` of the manager's, ``warm_up`` done)."""
    die_with_parent(settings.parent_pid)
    configure_child_logging()
    with context() as ctx:
        authenticator = start_authenticator(ctx, settings.curve_server) if settings.curve_server else None
        control = connect_dealer(
            ctx,
            settings.control_endpoint,
            identity=COMPUTE_IDENTITY,
            max_bytes=settings.max_message_bytes,
            curve=settings.curve_client,
        )
        try:
            _serve(ctx, control, settings)
        except Exception as exc:  # noqa: BLE001 - whatever ends the process is reported to the manager first
            if not isinstance(exc, _Reported):
                _report_failure(control, exc)
            # A lingering close lets ZeroMQ deliver the error before the context ends.
            control.close(linger=_ERROR_LINGER_MS)
            raise SystemExit(1) from None
        else:
            control.close(linger=0)
        finally:
            if authenticator is not None:
                authenticator.stop()


class _Reported(Exception):
    """A failure the manager has already been told of."""


def _report_failure(control: zmq.Socket, exc: Exception) -> None:
    """Tell the manager why this process fails (call it in the ``except`` block that caught ``exc``)."""
    payload: dict[str, Any]
    if isinstance(exc, UserCodeError):
        payload = error_payload(exc.args[0], traceback=exc.remote_traceback, code="user_code")
    elif isinstance(exc, LearnerDiedError):
        code = (REMOTE_LEARNER_LOST if exc.elsewhere else LEARNER_LOST) if exc.lost else "crash"
        payload = error_payload(exc.args[0], traceback=exc.remote_traceback, code=code)
        if exc.lost and exc.can_save:
            payload = {**payload, "saving": True}  # the manager's stop brings the counters for the checkpoints
    elif isinstance(exc, FlareError):
        payload = error_payload(str(exc), code="config")
    else:
        payload = error_payload(f"the compute process crashed: {exc!r}", traceback=traceback.format_exc(), code="crash")
    control.send_multipart(pack(Message(ERROR, payload)))


def choose_learner(name: str, cts: list[Any]) -> str:
    """``process``, ``thread`` or ``inline`` for ``--learner NAME``; ``auto`` picks a process where every CT's
    algorithm allows one and there is a core for it."""
    refusing = [ct for ct in cts if not ct.algorithm.may_learn_in_own_process]
    if name == "auto":
        return "process" if not refusing and (os.cpu_count() or 1) > 1 else "inline"
    if name == "process" and refusing:
        ct = refusing[0]
        kind = type(ct.algorithm).__name__
        raise ConfigError(
            f"--learner process: the algorithm of CT {ct.name!r} ({kind}) keeps state outside its networks that "
            f"predict() and learn() both use ({kind}.may_learn_in_own_process is False): use --learner thread or inline"
        )
    return name


def _start_learner(ctx: zmq.Context, cts: list[ComputationTask], settings: ComputeSettings) -> tuple[Learner, str]:
    """Where learn() runs (``choose_learner``), started: inline, a thread or learner processes; and its kind."""
    kind = choose_learner("process" if settings.learners > 1 else settings.learner, cts)
    spares = list(_spare_learners)
    _spare_learners.clear()
    if kind != "process":
        for spare in spares:
            spare.discard()
    learner: Learner = InlineLearner()
    if kind == "thread":
        for ct in cts:
            ct.act_beside_learning()
        learner = LearnerThread(ctx)
    elif kind == "process":
        # Imported here: the manager imports this module and must not load torch.
        from flare2.runtime.compute.learner_main import LearnerSettings
        from flare2.runtime.compute.learner_process import LearnerProcess, check_learners

        check_learners(settings.learners, str(cts[0].device), cts, remote=settings.remote_learners)
        learner = LearnerProcess(
            cts,
            LearnerSettings(
                # The device the compute process chose: the learner's CTs learn where they act.
                cts=settings.cts,
                device=str(cts[0].device),
                seed=settings.seed,
                torch_threads=settings.torch_threads,
                resume_dir=settings.resume_dir,
                parent_pid=os.getpid(),
                learners=settings.learners,
                remote_learners=settings.remote_learners,
                rendezvous=settings.learner_rendezvous,
                rendezvous_timeout_s=settings.learner_rendezvous_timeout_s,
                group_timeout_s=settings.startup_timeout_s,
            ),
            spares,
        )
    return learner, kind


def _serve(ctx: zmq.Context, control: zmq.Socket, settings: ComputeSettings) -> None:
    cts = build_cts(settings.cts, device=settings.device, seed=settings.seed, torch_threads=settings.torch_threads)
    predicting = predict_threads(settings.predict_threads, settings.torch_threads, settings.local_agents)
    for ct in cts:
        ct.use_threads(predict=predicting, learn=settings.torch_threads)
    counters = resume(cts, settings.resume_dir)
    fronts: list[SocketFront] = []
    learner: Learner = InlineLearner()
    stop: Message | None = None
    try:
        for index, (ct, config) in enumerate(zip(cts, settings.cts)):
            fronts.append(
                SocketFront(
                    ct,
                    ctx,
                    host=settings.bind,
                    config=config.batching,
                    max_bytes=settings.max_message_bytes,
                    curve=settings.curve_server,
                    local_prefix=os.path.join(settings.socket_dir, f"ct{index}"),
                )
            )
        follow([front.cdp for front in fronts], settings.cts, settings.seed)
        learner, kind = _start_learner(ctx, cts, settings)
        learner_processes = settings.learners if kind == "process" else 0
        busy_wait = busy_wait_us(settings.busy_wait_us, settings.local_agents + 1 + learner_processes)
        hello = {
            "role": "compute",
            "pid": os.getpid(),
            "device": str(cts[0].device),
            "learner": kind,
            "learners": learner_processes,
            "counters": counters,
            "cts": {
                front.cdp.ct.name: {
                    **front.cdp.ct.identity(),
                    "predict_endpoint": front.predict_endpoint,
                    "learn_endpoint": front.learn_endpoint,
                    "local_predict_endpoint": front.local_predict_endpoint,
                    "local_learn_endpoint": front.local_learn_endpoint,
                    "learn_ahead": front.cdp.ct.learn_ahead,
                    "busy_wait_us": busy_wait,
                }
                for front in fronts
            },
        }
        control.send_multipart(pack(Message(HELLO, hello)))
        # The counters a resumed run continues reach the manager before its first progress row.
        _send_stats(control, fronts)
        stop = _loop(control, fronts, learner, settings, busy_wait / 1e6)
    except Exception as exc:
        # The manager hears of it now, not after the learner process and the sockets are taken down.
        _report_failure(control, exc)
        learn_raised = isinstance(exc, UserCodeError) and exc.what == "learn"
        if learn_raised or (isinstance(exc, LearnerDiedError) and exc.lost and exc.can_save):
            _checkpoint_at_stop(control, [front.cdp for front in fronts], learner, settings)
        raise _Reported() from exc
    finally:
        # A stop for a new group of learners tells the learners on other machines to ask for their ranks again.
        learner.close(regroup=stop is not None and stop.payload.get("regroup") is True)
        for front in fronts:
            front.close()


def _checkpoint_at_stop(
    control: zmq.Socket, cdps: list[ComputationDataProcessor], learner: Learner, settings: ComputeSettings
) -> None:
    """After a learn() that raised (and left the state it found), or a lost learner whose group's first learner
    stayed: the checkpoints, with the run's counters the manager's stop brings, so that the run can be resumed (or
    the next compute process start) from the state the learners had reached."""
    deadline = time.monotonic() + settings.startup_timeout_s
    while time.monotonic() < deadline:
        if not control.poll(100):
            continue
        try:
            message = unpack(control.recv_multipart(), max_bytes=settings.max_message_bytes)
        except DecodeError:
            continue
        if message.kind == STOP:
            try:
                save_checkpoints(cdps, learner, settings.checkpoint_dir, _counters(message))
            except (CheckpointError, LearnerDiedError) as exc:
                logger.error("no checkpoint at this stop: %s", exc)
                return
            control.send_multipart(pack(Message(BYE, {"checkpoint_dir": settings.checkpoint_dir})))
            return


def serve_ready(cdps: list[ComputationDataProcessor], learner: Learner, now: float) -> None:
    """Serve the ready prediction batches, and hand ready learn batches to the learner while it is idle."""
    for cdp in cdps:
        cdp.refuse_overdue(now)
        cdp.serve_predictions(now)
    for cdp in cdps:
        while learner.idle and (batch := cdp.take_learn_batch(now)) is not None:
            learner.submit(batch)


def _loop(
    control: zmq.Socket, fronts: list[SocketFront], learner: Learner, settings: ComputeSettings, busy_wait_s: float
) -> Message | None:
    """Serve until the manager's STOP (returned) or the manager is gone (None)."""
    cdps = [front.cdp for front in fronts]
    poller = zmq.Poller()
    poller.register(control, zmq.POLLIN)
    wake = learner.wake_socket
    if wake is not None:
        poller.register(wake, zmq.POLLIN)
    sources: dict[Any, tuple[SocketFront, Any]] = {}
    for front in fronts:
        for key, source in front.sources.items():
            poller.register(key, zmq.POLLIN)
            sources[key] = (front, source)
    next_stats = time.monotonic() + settings.stats_interval_s
    while True:
        now = time.monotonic()
        # While the learner is busy, learn batches wait for it, not for their deadline.
        deadlines = [d for d in (cdp.next_deadline(learning=learner.idle) for cdp in cdps) if d is not None]
        wake_at = min([next_stats, *deadlines])
        events = poller.poll(0) if busy_wait_s else []
        if not events:
            # The next request is usually some dozens of µs away: checking beats waking up (RunConfig.busy_wait_us).
            check_until = now + min(busy_wait_s, wake_at - now)
            while not events and time.monotonic() < check_until:
                events = poller.poll(0)
        if not events:
            events = poller.poll(poll_timeout_ms(min(wake_at - time.monotonic(), _IDLE_POLL_S)))
        now = time.monotonic()
        ready = {sock for sock, _ in events}
        # Control first: a LIVE update must reach the CDPs before the requests of the agents it names.
        if control in ready:
            while cast(int, control.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                if (stop := _handle_control(control, fronts, learner, settings)) is not None:
                    return stop
        if wake in ready:
            learner.deliver()
        for key in ready - {control, wake}:
            front, source = sources[key]
            front.drain(source, now)
        serve_ready(cdps, learner, time.monotonic())
        if now >= next_stats:
            next_stats = now + settings.stats_interval_s
            if os.getppid() != settings.parent_pid:
                logger.error("the manager is gone; the compute process exits")
                return None
            _send_stats(control, fronts)


def _send_stats(control: zmq.Socket, fronts: list[SocketFront]) -> None:
    for front in fronts:
        front.check_connections()
    report = {"role": "compute", "cts": {front.cdp.ct.name: front.cdp.stats.take_report() for front in fronts}}
    control.send_multipart(pack(Message(STATS, report)))


def _counters(message: Message) -> dict[str, Any]:
    """The run's counters a CHECKPOINT or STOP message carries, for the checkpoints."""
    counters = message.payload.get("counters")
    return counters if isinstance(counters, dict) else {}


def _handle_control(
    control: zmq.Socket, fronts: list[SocketFront], learner: Learner, settings: ComputeSettings
) -> Message | None:
    """Apply one manager message; the STOP message when the process must stop."""
    cdps = [front.cdp for front in fronts]
    try:
        message = unpack(control.recv_multipart(), max_bytes=settings.max_message_bytes)
    except DecodeError as exc:
        logger.warning("dropped a malformed control message: %s", exc)
        return None
    if message.kind == LIVE:
        live = message.payload.get("cts", {})
        for cdp in cdps:
            agents = live.get(cdp.ct.name, [])
            cdp.live = frozenset(a for a in agents if isinstance(a, str))
        return None
    if message.kind == CHECKPOINT:
        written: dict[str, Any] = {"checkpoint_dir": settings.checkpoint_dir}
        try:
            save_checkpoints(cdps, learner, settings.checkpoint_dir, _counters(message))
        except CheckpointError as exc:
            # A periodic checkpoint that cannot be written (a full disk) leaves the one before; the run goes on.
            written["error"] = str(exc)
        control.send_multipart(pack(Message(CHECKPOINT, written, seq=message.seq)))
        return None
    if message.kind == STOP:
        finish_learning(cdps, learner)
        save_checkpoints(cdps, learner, settings.checkpoint_dir, _counters(message))
        _send_stats(control, fronts)
        control.send_multipart(pack(Message(BYE, {"checkpoint_dir": settings.checkpoint_dir})))
        return message
    logger.warning("ignored control message of kind %r", message.kind)
    return None
