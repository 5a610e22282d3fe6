"""ROUTER/DEALER helpers: every socket has linger 0 and a size limit, every wait a timeout."""

from __future__ import annotations

import logging
import math
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import zmq
from zmq.utils.monitor import recv_monitor_message

from flare2.errors import ConfigError, DecodeError, RemoteError, ReplyTimeoutError, SpecError, TransportError
from flare2.wire.codec import DEFAULT_MAX_BYTES
from flare2.wire.protocol import ERROR, Message, VersionMismatchError, pack, unpack
from flare2.wire.security import CurveClient, CurveServer, make_client_socket, make_server_socket, worth_logging
from flare2.wire.streams import SCHEME as STREAM_SCHEME
from flare2.wire.streams import StreamClient, stream_max_bytes

logger = logging.getLogger(__name__)

# A poll without a deadline still wakes now and then (an infinite timeout is not a number ZeroMQ takes).
_LONGEST_POLL_S = 3600.0
# Frames above this are cut by ZeroMQ itself before Python sees them; the
# codec checks the exact payload limit again.
_FRAME_SLACK_BYTES = 4096


def _configure(sock: zmq.Socket, max_bytes: int) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes + _FRAME_SLACK_BYTES)


def bind_router(
    ctx: zmq.Context, host: str, *, port: int = 0, max_bytes: int = DEFAULT_MAX_BYTES, curve: CurveServer | None = None
) -> tuple[zmq.Socket, str]:
    """A ROUTER bound on ``host`` (a random free port when ``port`` is 0) and its endpoint; CURVE with ``curve``."""
    sock = ctx.socket(zmq.ROUTER)
    _configure(sock, max_bytes)
    if curve is not None:
        make_server_socket(sock, curve)
    # Sending to a peer that is gone fails loudly instead of vanishing.
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    try:
        if port:
            sock.bind(f"tcp://{host}:{port}")
        else:
            port = sock.bind_to_random_port(f"tcp://{host}")
    except zmq.ZMQError as exc:
        sock.close()
        raise ConfigError(
            f"cannot bind tcp://{host}:{port or '*'} ({exc}): pick a free port or an address of this machine"
        ) from None
    return sock, f"tcp://{host}:{port}"


class ConnectionWatch:
    """Counts and logs (the first 20, then every 100th) what ZeroMQ does to the peers of a server socket unseen:
    a CURVE handshake failed before the allow-list (a wrong server key, or a peer without CURVE), and a connection
    closed. ZeroMQ closes the connection of a peer whose message is over the size limit, and reports that exactly
    as it reports a peer that left, so ``closed`` counts both."""

    _EVENTS = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_DISCONNECTED

    def __init__(self, sock: zmq.Socket, max_bytes: int) -> None:
        self._sock = sock
        self._max_bytes = max_bytes
        self._monitor = sock.get_monitor_socket(self._EVENTS)
        self.handshake_failures = 0
        self.closed = 0

    def check(self, timeout_s: float = 0.0) -> None:
        """Take the events reported since the last call, waiting up to ``timeout_s`` for the first."""
        timeout_ms = poll_timeout_ms(timeout_s)
        while self._monitor.poll(timeout_ms):
            timeout_ms = 0
            event = recv_monitor_message(self._monitor)
            endpoint = event.get("endpoint", b"?").decode(errors="replace")
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.closed += 1
                if worth_logging(self.closed):
                    logger.info(
                        "a connection on %s closed (closure %d): its peer left, or sent a message over "
                        "max_message_bytes (%d), which ZeroMQ drops with the connection",
                        endpoint,
                        self.closed,
                        self._max_bytes,
                    )
                continue
            self.handshake_failures += 1
            if worth_logging(self.handshake_failures):
                logger.warning(
                    "a peer failed the CURVE handshake on %s (failure %d): it has a wrong server key or no CURVE; "
                    "give that machine this run's server.key and a client pair from `flare2 keys`",
                    endpoint,
                    self.handshake_failures,
                )

    def close(self) -> None:
        self._sock.disable_monitor()
        self._monitor.close(linger=0)


def connect_dealer(
    ctx: zmq.Context,
    endpoint: str,
    *,
    identity: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
    curve: CurveClient | None = None,
) -> zmq.Socket:
    """A DEALER with routing id ``identity`` connected to ``endpoint``; CURVE with ``curve``."""
    sock = ctx.socket(zmq.DEALER)
    _configure(sock, max_bytes)
    if curve is not None:
        make_client_socket(sock, curve)
    sock.setsockopt(zmq.IDENTITY, identity.encode())
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close()
        raise ConfigError(f"cannot connect to {endpoint!r} ({exc}): expected tcp://HOST:PORT") from None
    return sock


def router_send(sock: zmq.Socket, identity: bytes, message: Message) -> bool:
    """Send to one ROUTER peer without blocking; False when the peer is gone or its queue is full."""
    try:
        sock.send_multipart([identity, *pack(message)], flags=zmq.NOBLOCK)
        return True
    except zmq.ZMQError as exc:
        if exc.errno in (zmq.EHOSTUNREACH, zmq.EAGAIN):
            return False
        raise


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now, for a listener that is not a ZeroMQ socket (the learners' rendezvous)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def poll_timeout_ms(seconds: float) -> int:
    """A ZeroMQ poll timeout in whole milliseconds, rounded up.

    ZeroMQ polls in whole milliseconds and pyzmq truncates a float, so a wait
    of 0.4 ms would become a busy loop of zero-timeout polls that takes a core
    from the processes it waits for.
    """
    return max(0, math.ceil(seconds * 1000))


def recv_frames(sock: zmq.Socket, timeout_s: float) -> list[bytes] | None:
    """The next multipart message, or None when nothing arrived within ``timeout_s``."""
    if not sock.poll(poll_timeout_ms(timeout_s)):
        return None
    return sock.recv_multipart(copy=True)


def raise_for_error(message: Message, what: str) -> None:
    """Turn an ERROR reply into the matching exception."""
    if message.kind != ERROR:
        return
    payload = message.payload
    reason = str(payload.get("reason", "no reason given"))
    code = payload.get("code")
    if code == "user_code":
        raise RemoteError(f"{what} failed in user code: {reason}", str(payload.get("traceback", "")))
    if code == "spec":
        raise SpecError(f"{what} was rejected: {reason}")
    if code == "config":
        raise ConfigError(f"{what} was rejected: {reason}")
    raise TransportError(f"{what} was rejected: {reason}")


class Requester:
    """Sends requests and waits for the reply with the same ``seq``, over a ZeroMQ DEALER (``tcp://``) or, for an
    agent of the compute process's own machine, a Unix stream (``unix://``, see ``flare2.wire.streams``).

    Several requests may be on their way at once; a reply that arrives while
    another is waited for is kept until its own turn. Replies to requests that
    timed out are dropped, so a late answer is never taken for the answer to a
    newer question. On a stream, ``on_blocked`` runs every ``blocked_every_s``
    while a send waits for room, and a wait for a reply checks for it for
    ``busy_wait_s`` before it sleeps (RunConfig.busy_wait_us).
    """

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        *,
        identity: str,
        max_bytes: int = DEFAULT_MAX_BYTES,
        curve: CurveClient | None = None,
        on_blocked: Callable[[], None] | None = None,
        blocked_every_s: float = 0.25,
        busy_wait_s: float = 0.0,
        shared_arrays: bool = False,
    ) -> None:
        """``shared_arrays``: on a stream, large arrays cross through shared memory (``flare2.wire.shared_arrays``)."""
        self.endpoint = endpoint
        self.identity = identity
        is_stream = endpoint.startswith(STREAM_SCHEME)
        self.max_bytes = stream_max_bytes(max_bytes) if is_stream else max_bytes
        """The largest message this link takes (a stream of this machine takes more than the run's limit)."""
        self._sock: zmq.Socket | None = None
        self._stream: StreamClient | None = None
        if is_stream:
            self._stream = StreamClient(
                endpoint,
                max_bytes=self.max_bytes,
                on_blocked=on_blocked,
                blocked_every_s=blocked_every_s,
                busy_wait_s=busy_wait_s,
                shared_arrays=shared_arrays,
            )
        else:
            self._sock = connect_dealer(ctx, endpoint, identity=identity, max_bytes=max_bytes, curve=curve)
        self._seq = 0
        self._awaited: set[int] = set()
        self._early: dict[int, Message] = {}

    @property
    def shares_arrays(self) -> bool:
        """Whether large arrays cross through shared memory (a local stream asked to)."""
        return self._stream is not None and self._stream.shared_arrays is not None

    @property
    def socket(self) -> zmq.Socket:
        if self._sock is None:
            raise TypeError(f"{self.endpoint} is a stream, not a ZeroMQ socket")
        return self._sock

    def send(self, kind: str, payload: dict, *, ct: str = "") -> int:
        """Send a message that expects no reply; returns its seq."""
        shared = self._stream.shared_arrays if self._stream is not None else None
        frames = pack(Message(kind, payload, self.identity, self._seq + 1, ct), shared=shared)
        size = len(frames[-1]) + (shared.placed_bytes if shared is not None else 0)
        if size > self.max_bytes:
            if shared is not None:
                shared.cancel()
            # The receiver would close the connection without a word, and the reply would never come.
            raise ConfigError(
                f"a {kind} message to {self.endpoint} holds {size} bytes, more than the {self.max_bytes} a message "
                f"to it may hold (max_message_bytes): send fewer or smaller arrays per message (fewer steps per "
                "learn request or envs per agent: --sample-interval, --batch-size, --envs-per-agent) or raise "
                "--max-message-bytes"
            )
        self._seq += 1
        if self._stream is not None:
            self._stream.send(frames)
        else:
            self.socket.send_multipart(frames)
        return self._seq

    def _receive(self, timeout_s: float) -> list[bytes] | None:
        if self._stream is not None:
            return self._stream.receive(timeout_s)
        return recv_frames(self.socket, timeout_s)

    def send_request(self, kind: str, payload: dict, *, ct: str = "") -> int:
        """Send a request whose reply ``wait_reply`` will be asked for; returns its seq."""
        seq = self.send(kind, payload, ct=ct)
        self._awaited.add(seq)
        return seq

    def request(self, kind: str, payload: dict, *, ct: str = "", timeout_s: float | None, what: str) -> Message:
        seq = self.send_request(kind, payload, ct=ct)
        return self.wait_reply(seq, timeout_s=timeout_s, what=what)

    def wait_reply(
        self,
        seq: int,
        *,
        timeout_s: float | None,
        what: str,
        idle_every_s: float | None = None,
        on_idle: Callable[[], None] | None = None,
    ) -> Message:
        """The reply to request ``seq``; ``on_idle`` runs every ``idle_every_s`` while waiting.

        ``timeout_s`` None waits as long as it takes (``on_idle`` is then what notices a peer that is gone).
        """
        early = self._early.pop(seq, None)
        if early is not None:
            self._awaited.discard(seq)
            raise_for_error(early, what)
            return early
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._awaited.discard(seq)
                raise ReplyTimeoutError(f"no reply to {what} from {self.endpoint} within {timeout_s:.1f}s")
            wait = remaining if idle_every_s is None else min(remaining, idle_every_s)
            frames = self._receive(min(wait, _LONGEST_POLL_S))
            if frames is None:
                if on_idle is not None:
                    on_idle()
                continue
            try:
                reply = unpack(frames, max_bytes=self.max_bytes)
            except VersionMismatchError:
                raise
            except DecodeError as exc:
                logger.warning("dropped a malformed reply from %s: %s", self.endpoint, exc)
                continue
            if reply.seq != seq:
                if reply.seq in self._awaited:
                    self._early[reply.seq] = reply
                continue
            self._awaited.discard(seq)
            raise_for_error(reply, what)
            return reply

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        else:
            # Keeps the socket's own LINGER: 0 unless a final message must still go out.
            self.socket.close()


@contextmanager
def context() -> Iterator[zmq.Context]:
    """A ZeroMQ context that is terminated (not left to the garbage collector) on exit."""
    ctx = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)
