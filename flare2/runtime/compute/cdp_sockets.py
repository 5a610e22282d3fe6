"""A CDP's sockets in the compute process: messages in, decoded and checked against the sender, replies out.

Agents on other machines reach two ZeroMQ ROUTER sockets (predict, learn) over
TCP; agents of this machine reach two Unix stream servers (``local_prefix``),
which cost them half the round trip.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

import zmq

from flare2.errors import DecodeError
from flare2.runtime.compute.cdp import ComputationDataProcessor
from flare2.runtime.config import BatchingConfig
from flare2.wire.codec import DEFAULT_MAX_BYTES
from flare2.wire.protocol import Message, pack, unpack
from flare2.wire.security import CurveServer
from flare2.wire.sockets import ConnectionWatch, bind_router, router_send
from flare2.wire.streams import StreamConnection, StreamServer, stream_max_bytes

if TYPE_CHECKING:
    from flare2.core.computation_task import ComputationTask

logger = logging.getLogger(__name__)

# Messages taken from one socket per wake-up, so that one flooding peer cannot
# keep the loop away from the other socket and from flushing.
_MAX_DRAIN = 256


class SocketFront:
    """A CDP's predict and learn sockets in the compute process: decode, check the sender, hand over."""

    def __init__(
        self,
        ct: ComputationTask,
        ctx: zmq.Context,
        *,
        host: str = "127.0.0.1",
        config: BatchingConfig = BatchingConfig(),
        max_bytes: int = DEFAULT_MAX_BYTES,
        curve: CurveServer | None = None,
        local_prefix: str | None = None,
    ) -> None:
        """``local_prefix``: also serve Unix streams at ``<local_prefix>-predict`` and ``-learn`` for local agents."""
        self.max_bytes = max_bytes
        self.cdp = ComputationDataProcessor(ct, config=config, reply=self._send)
        self.local_predict: StreamServer | None = None
        self.local_learn: StreamServer | None = None
        self.predict_socket, self.predict_endpoint = bind_router(ctx, host, max_bytes=max_bytes, curve=curve)
        try:
            self.learn_socket, self.learn_endpoint = bind_router(ctx, host, max_bytes=max_bytes, curve=curve)
        except BaseException:
            self.predict_socket.close(linger=0)
            raise
        self._watches = [ConnectionWatch(sock, max_bytes) for sock in (self.predict_socket, self.learn_socket)]
        if local_prefix is not None:
            try:
                self.local_predict = StreamServer(
                    f"{local_prefix}-predict",
                    max_bytes=stream_max_bytes(max_bytes),
                    receive=self._receive_predict,
                    on_drop=self._count_drop,
                )
                self.local_learn = StreamServer(
                    f"{local_prefix}-learn",
                    max_bytes=stream_max_bytes(max_bytes),
                    receive=self._receive_learn,
                    on_drop=self._count_drop,
                )
            except BaseException:
                self.close()
                raise

    @property
    def local_predict_endpoint(self) -> str | None:
        return self.local_predict.endpoint if self.local_predict is not None else None

    @property
    def local_learn_endpoint(self) -> str | None:
        return self.local_learn.endpoint if self.local_learn is not None else None

    @property
    def sources(self) -> dict[zmq.Socket | int, zmq.Socket | StreamServer]:
        """What the compute loop polls for this CDP, by what ``zmq.Poller`` registers and reports for it (a stream
        server's epoll fd); ``drain`` takes in whatever one of them has ready."""
        sources: dict[zmq.Socket | int, zmq.Socket | StreamServer] = {
            self.predict_socket: self.predict_socket,
            self.learn_socket: self.learn_socket,
        }
        for server in (self.local_predict, self.local_learn):
            if server is not None:
                sources[server.fileno()] = server
        return sources

    def _count_drop(self) -> None:
        self.cdp.stats.rejected += 1

    def check_connections(self) -> None:
        """Count and log what ZeroMQ did unseen to the agents of other machines (see ``ConnectionWatch``)."""
        for watch in self._watches:
            watch.check()
        self.cdp.stats.closed_connections = sum(watch.closed for watch in self._watches)

    def _send(self, reply_to: bytes | StreamConnection, learn: bool, message: Message) -> None:
        if isinstance(reply_to, StreamConnection):
            # Answered: the request's shared arrays were copied into the batch, and the agent may reuse their regions
            # (told before the reply, so that its next request finds them free).
            reply_to.shared_arrays.release(message.seq)
            reply_to.send(pack(message))
        else:
            router_send(self.learn_socket if learn else self.predict_socket, reply_to, message)

    def close(self) -> None:
        for watch in self._watches:
            watch.close()
        self.predict_socket.close(linger=0)
        self.learn_socket.close(linger=0)
        for server in (self.local_predict, self.local_learn):
            if server is not None:
                server.close()

    def drain(self, source: zmq.Socket | StreamServer, now: float) -> None:
        """Take the waiting messages of ``source`` (at most a bounded number) into the CDP's queues."""
        if isinstance(source, StreamServer):
            source.drain(now)
            return
        learn = source is self.learn_socket
        for _ in range(_MAX_DRAIN):
            # Asking first is cheaper than the exception of a recv that finds nothing.
            if not cast(int, source.get(zmq.EVENTS)) & zmq.POLLIN:
                return
            frames = source.recv_multipart(zmq.NOBLOCK)
            self._take(frames[0], frames[1:], now, learn=learn)

    def _receive_predict(self, connection: StreamConnection, frames: list[bytes], now: float) -> None:
        self._take(connection, frames, now, learn=False)

    def _receive_learn(self, connection: StreamConnection, frames: list[bytes], now: float) -> None:
        self._take(connection, frames, now, learn=True)

    def _take(self, reply_to: bytes | StreamConnection, frames: list[bytes], now: float, *, learn: bool) -> None:
        try:
            self._accept(reply_to, frames, now, learn=learn)
        except Exception:  # a message nobody foresaw must not take the compute process down
            self.cdp.stats.rejected += 1
            logger.exception("CT %r dropped a request it could not handle", self.cdp.ct.name)

    def _accept(self, reply_to: bytes | StreamConnection, frames: list[bytes], now: float, *, learn: bool) -> None:
        stream = reply_to if isinstance(reply_to, StreamConnection) else None
        max_bytes = self.max_bytes if stream is None else stream.server.max_bytes
        try:
            message = unpack(frames, max_bytes=max_bytes, shared=None if stream is None else stream.shared_arrays)
        except DecodeError as exc:
            self.cdp.reject(reply_to, learn, 0, str(exc), "bad_request")
            return
        identity = reply_to
        if isinstance(reply_to, StreamConnection):
            # A stream has no routing id: its first message names the agent, and every later one must name the same.
            if reply_to.identity is None:
                reply_to.identity = message.agent_id.encode()
            identity = reply_to.identity
        if message.agent_id.encode() != identity:
            self.cdp.reject(
                reply_to, learn, message.seq, "header agent_id does not match the connection's identity", "bad_request"
            )
            return
        self.cdp.accept(message, reply_to, now, learn=learn)
