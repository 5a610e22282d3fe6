"""A CDP's two ROUTER sockets in the compute process: messages in, decoded and checked against the sender, replies out.

Local agents reach them through Unix sockets as well as TCP (``local_prefix``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import zmq

from flare2.errors import DecodeError
from flare2.runtime.cdp import ComputationDataProcessor
from flare2.runtime.config import BatchingConfig
from flare2.wire.codec import DEFAULT_MAX_BYTES
from flare2.wire.protocol import Message, unpack
from flare2.wire.security import CurveServer
from flare2.wire.sockets import bind_local, bind_router, router_send

if TYPE_CHECKING:
    from flare2.core.computation_task import ComputationTask

logger = logging.getLogger(__name__)

# Messages taken from one socket per wake-up, so that one flooding peer cannot
# keep the loop away from the other socket and from flushing.
_MAX_DRAIN = 256


class SocketFront:
    """A CDP's predict and learn ROUTER sockets in the compute process: decode, check the sender, hand over."""

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
        """``local_prefix``: also bind Unix sockets at ``<local_prefix>-predict`` and ``-learn`` for local agents."""
        self.max_bytes = max_bytes
        self.cdp = ComputationDataProcessor(ct, config=config, reply=self._send)
        self.predict_socket, self.predict_endpoint = bind_router(ctx, host, max_bytes=max_bytes, curve=curve)
        self.local_predict_endpoint = self.local_learn_endpoint = None
        try:
            self.learn_socket, self.learn_endpoint = bind_router(ctx, host, max_bytes=max_bytes, curve=curve)
        except BaseException:
            self.predict_socket.close(linger=0)
            raise
        if local_prefix is not None:
            try:
                self.local_predict_endpoint = bind_local(self.predict_socket, f"{local_prefix}-predict")
                self.local_learn_endpoint = bind_local(self.learn_socket, f"{local_prefix}-learn")
            except BaseException:
                self.close()
                raise

    def _send(self, identity: bytes, learn: bool, message: Message) -> None:
        router_send(self.learn_socket if learn else self.predict_socket, identity, message)

    def close(self) -> None:
        self.predict_socket.close(linger=0)
        self.learn_socket.close(linger=0)

    def drain(self, sock: zmq.Socket, now: float) -> None:
        """Take the waiting messages of ``sock`` (at most a bounded number) into the CDP's queues."""
        learn = sock is self.learn_socket
        for _ in range(_MAX_DRAIN):
            # Asking first is cheaper than the exception of a recv that finds nothing.
            if not sock.get(zmq.EVENTS) & zmq.POLLIN:
                return
            frames = sock.recv_multipart(zmq.NOBLOCK)
            try:
                self._accept(frames, now, learn=learn)
            except Exception:  # a message nobody foresaw must not take the compute process down
                self.cdp.stats.rejected += 1
                logger.exception("CT %r dropped a request it could not handle", self.cdp.ct.name)

    def _accept(self, frames: list[bytes], now: float, *, learn: bool) -> None:
        identity, frames = frames[0], frames[1:]
        try:
            message = unpack(frames, max_bytes=self.max_bytes)
        except DecodeError as exc:
            self.cdp.reject(identity, learn, 0, str(exc), "bad_request")
            return
        if message.agent_id.encode() != identity:
            self.cdp.reject(identity, learn, message.seq, "header agent_id does not match the connection's identity", "bad_request")
            return
        self.cdp.accept(message, identity, now, learn=learn)
