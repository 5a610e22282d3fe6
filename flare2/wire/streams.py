"""Unix stream sockets between the compute process and the agents of its own machine.

They carry the same messages as ZeroMQ (a msgpack header frame and a payload
frame, decoded by the same strict ``unpack``), each preceded by the two frame
lengths. A ZeroMQ round trip wakes four threads, the I/O thread and the caller
on each side; a stream wakes only the two callers (on a 2-core machine, 8
agent processes of one env each played 5.4k env steps/s over ZeroMQ and 6.7k
over streams). Agents on
other machines keep ZeroMQ and its CURVE security; a stream is reachable only
by processes of the same user (a private directory, and each connecting peer's
uid is checked). An agent's predict stream carries its large arrays through
shared memory (``flare2.wire.shared_arrays``): the block's fd comes with a
message, and the connection's reader decodes what refers to it.
"""

from __future__ import annotations

import array
import logging
import math
import os
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable

from flare2.errors import ConfigError, DecodeError, TransportError
from flare2.wire.shared_arrays import SharedArraysReader, SharedArraysWriter

logger = logging.getLogger(__name__)

SCHEME = "unix://"

# The lengths of the header frame and of the payload frame.
_LENGTHS = struct.Struct("<II")
# A header is a few names and numbers; anything longer is not a flare2 peer.
_MAX_HEADER_BYTES = 4096
# Bytes taken from one connection per wake-up, so one flooding peer cannot starve the others.
_READ_BYTES = 1 << 20
_PEER_CREDENTIALS = struct.Struct("3i")
# Drops logged one by one before they are only counted.
_LOGGED_DROPS = 20
# Room for the fds one read may bring: one block's with a message; more close the connection.
_FD_BYTES = array.array("i").itemsize
_FDS_SPACE = socket.CMSG_SPACE(4 * _FD_BYTES)


class OversizeError(DecodeError):
    """A stream announced a message above the limit; the stream cannot be read past it."""


def stream_chunks(frames: list[bytes]) -> list[bytes]:
    """What goes on the stream for one message's two frames (header, payload)."""
    header, payload = frames
    return [_LENGTHS.pack(len(header), len(payload)), header, payload]


class _ReadBuffer:
    """Where a thread's stream reads land before their bytes are copied out, made once per thread.

    ``recv(n)`` allocates n bytes on every call, that one answers or not: with a 1 MB n that is an mmap and an
    munmap per read in a process whose allocator hands such sizes to the kernel (the compute process), and a
    busy-waiting agent reads thousands of times between replies. Reading into one buffer and copying out what
    came costs a copy of the bytes that came, usually a few dozen."""

    def __init__(self) -> None:
        self._view = memoryview(bytearray(_READ_BYTES))
        self._views = [self._view]

    def read(self, sock: socket.socket) -> bytes | None:
        """What a non-blocking ``sock`` holds now (b"" once its peer is gone), or None while it holds nothing."""
        try:
            count = sock.recv_into(self._view)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""
        return bytes(self._view[:count])

    def read_with_fds(self, sock: socket.socket) -> tuple[bytes | None, list[int]]:
        """``read``, and the fds that came with the bytes (those of shared-array blocks)."""
        try:
            count, ancillary, _flags, _address = sock.recvmsg_into(self._views, _FDS_SPACE)
        except (BlockingIOError, InterruptedError):
            return None, []
        except OSError:
            return b"", []
        fds: list[int] = []
        for level, kind, values in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", values[: len(values) - len(values) % _FD_BYTES]))
        return bytes(self._view[:count]), fds


_read_buffers = threading.local()


def _read_buffer() -> _ReadBuffer:
    """This thread's read buffer (each read copies its bytes out before the thread reads again)."""
    buffer: _ReadBuffer | None = getattr(_read_buffers, "buffer", None)
    if buffer is None:
        buffer = _read_buffers.buffer = _ReadBuffer()
    return buffer


class StreamDecoder:
    """Cuts a byte stream into messages, each a list of its two frames (header, payload)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[list[bytes]]:
        """The messages that ``data`` completes; raises OversizeError at a message above ``max_bytes``."""
        buffer = self._buffer
        from_buffer = bool(buffer)
        if from_buffer:
            buffer += data
        view = memoryview(buffer if from_buffer else data)
        messages = []
        start = 0
        try:
            while len(view) - start >= _LENGTHS.size:
                header_bytes, payload_bytes = _LENGTHS.unpack_from(view, start)
                if header_bytes > _MAX_HEADER_BYTES or payload_bytes > self.max_bytes:
                    raise OversizeError(
                        f"a message announced a {header_bytes}-byte header and a {payload_bytes}-byte payload, more than "
                        f"the limits of {_MAX_HEADER_BYTES} and {self.max_bytes}"
                    )
                header_at = start + _LENGTHS.size
                payload_at = header_at + header_bytes
                end = payload_at + payload_bytes
                if len(view) < end:
                    break
                messages.append([bytes(view[header_at:payload_at]), bytes(view[payload_at:end])])
                start = end
            rest = b"" if from_buffer else bytes(view[start:])
        finally:
            view.release()
        if from_buffer:
            del buffer[:start]
        else:
            buffer += rest
        return messages


class StreamConnection:
    """One agent's connection to a StreamServer; its ``identity`` is the agent id its first message claims."""

    def __init__(self, server: StreamServer, sock: socket.socket, max_bytes: int) -> None:
        self.server = server
        self.sock = sock
        self.fd = sock.fileno()
        self.decoder = StreamDecoder(max_bytes)
        self.identity: bytes | None = None
        self.unsent = bytearray()
        self.closed = False
        self.shared_arrays = SharedArraysReader(max_bytes)
        """The blocks of shared arrays this agent sent: decode its messages with it."""

    def __repr__(self) -> str:
        return f"<local agent {self.identity!r}>"

    def send(self, frames: list[bytes]) -> bool:
        """Send one message without blocking (what does not fit waits here); False when the connection is gone."""
        return self.server.send(self, frames)


Receive = Callable[[StreamConnection, list[bytes], float], None]
"""``receive(connection, frames, now)``: one message that arrived on a connection."""


class StreamServer:
    """A listening Unix socket and its connections behind one epoll fd, which a ``zmq.Poller`` waits on with the
    ZeroMQ sockets (``fileno``); ``drain`` then accepts, reads and writes whatever is ready without blocking."""

    def __init__(
        self, path: str, *, max_bytes: int, receive: Receive, on_drop: Callable[[], None] = lambda: None
    ) -> None:
        """``on_drop`` counts each connection closed for a message above the limit, a peer of another user, or
        replies it never read."""
        self.endpoint = SCHEME + path
        self.max_bytes = max_bytes
        self.dropped = 0
        self._receive = receive
        self._on_drop = on_drop
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(path)
        except OSError as exc:
            self._listener.close()
            raise ConfigError(
                f"cannot bind {self.endpoint} ({exc}): the directory must exist and be writable"
            ) from None
        self._listener.listen(128)
        self._listener.setblocking(False)
        self._epoll = select.epoll()
        self._epoll.register(self._listener.fileno(), select.EPOLLIN)
        self._connections: dict[int, StreamConnection] = {}
        # Replies a peer leaves unread beyond this close its connection instead of growing without end.
        self._max_unsent = 4 * max_bytes

    def fileno(self) -> int:
        return self._epoll.fileno()

    def drain(self, now: float) -> None:
        for fd, events in self._epoll.poll(0):
            if fd == self._listener.fileno():
                self._accept()
                continue
            connection = self._connections.get(fd)
            if connection is None:
                continue
            if events & select.EPOLLOUT:
                self._write(connection)
            if events & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                self._read(connection, now)

    def send(self, connection: StreamConnection, frames: list[bytes]) -> bool:
        if connection.closed:
            return False
        chunks = stream_chunks(frames)
        if connection.unsent:
            connection.unsent.extend(b"".join(chunks))
            if len(connection.unsent) > self._max_unsent:
                self._drop(connection, f"it left {len(connection.unsent)} bytes of replies unread")
                return False
            return True
        try:
            sent = connection.sock.sendmsg(chunks)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close(connection)
            return False
        total = sum(len(chunk) for chunk in chunks)
        if sent < total:
            connection.unsent = bytearray(b"".join(chunks)[sent:])
            self._epoll.modify(connection.fd, select.EPOLLIN | select.EPOLLOUT)
        return True

    def close(self) -> None:
        for connection in list(self._connections.values()):
            self._close(connection)
        self._epoll.close()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the listener stays, the peer tries again
                logger.warning("could not accept a local agent on %s: %s", self.endpoint, exc)
                return
            sock.setblocking(False)
            connection = StreamConnection(self, sock, self.max_bytes)
            self._connections[connection.fd] = connection
            self._epoll.register(connection.fd, select.EPOLLIN)
            try:
                _, uid, _ = _PEER_CREDENTIALS.unpack(
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER_CREDENTIALS.size)
                )
            except OSError as exc:
                self._drop(connection, f"its credentials cannot be read ({exc})")
                continue
            if uid != os.geteuid():
                self._drop(connection, f"its process belongs to uid {uid}, not to this run's uid {os.geteuid()}")

    def _read(self, connection: StreamConnection, now: float) -> None:
        data, fds = _read_buffer().read_with_fds(connection.sock)
        if fds:
            try:
                if len(fds) > 1:
                    for fd in fds:
                        os.close(fd)
                    raise DecodeError(f"{len(fds)} fds came in one read, where one block's may")
                connection.shared_arrays.attach(fds[0])
            except DecodeError as exc:
                self._drop(connection, str(exc))
                return
        if data is None:
            return
        if not data:
            self._close(connection)
            return
        try:
            messages = connection.decoder.feed(data)
        except OversizeError as exc:
            self._drop(connection, str(exc))
            return
        for frames in messages:
            self._receive(connection, frames, now)
            if connection.closed:
                return

    def _write(self, connection: StreamConnection) -> None:
        try:
            sent = connection.sock.send(connection.unsent)
        except BlockingIOError:
            return
        except OSError:
            self._close(connection)
            return
        del connection.unsent[:sent]
        if not connection.unsent:
            self._epoll.modify(connection.fd, select.EPOLLIN)

    def _drop(self, connection: StreamConnection, why: str) -> None:
        self.dropped += 1
        self._on_drop()
        if self.dropped <= _LOGGED_DROPS:
            logger.warning("closed the connection of %r on %s: %s", connection, self.endpoint, why)
            if self.dropped == _LOGGED_DROPS:
                logger.warning("further closed connections on %s are only counted", self.endpoint)
        self._close(connection)

    def _close(self, connection: StreamConnection) -> None:
        if connection.closed:
            return
        connection.closed = True
        connection.shared_arrays.close()
        self._connections.pop(connection.fd, None)
        try:
            self._epoll.unregister(connection.fd)
        except (OSError, ValueError):
            pass
        connection.sock.close()


class StreamClient:
    """An agent's end of a stream: sends messages, hands back the frames of the next one to arrive.

    A send that finds the compute process's buffer full waits, calling
    ``on_blocked`` every ``blocked_every_s`` (the agent services its manager
    link meanwhile). A receive checks for its message for ``busy_wait_s``
    before it sleeps. Once the compute process has closed the stream, receiving
    finds nothing: the agent learns why from its manager, as over ZeroMQ.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        max_bytes: int,
        on_blocked: Callable[[], None] | None = None,
        blocked_every_s: float = 0.25,
        busy_wait_s: float = 0.0,
        shared_arrays: bool = False,
    ) -> None:
        """``shared_arrays``: send large arrays through shared memory (``flare2.wire.shared_arrays``); messages
        are then packed with ``self.shared_arrays``."""
        if not endpoint.startswith(SCHEME):
            raise ConfigError(f"{endpoint!r} is not a {SCHEME}PATH endpoint")
        self.endpoint = endpoint
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(endpoint.removeprefix(SCHEME))
        except OSError as exc:
            self._sock.close()
            raise TransportError(f"cannot reach the compute process at {endpoint} ({exc})") from None
        self._sock.setblocking(False)
        self._poll = select.poll()
        self._poll.register(self._sock.fileno(), select.POLLIN)
        self._decoder = StreamDecoder(max_bytes)
        self._arrived: deque[list[bytes]] = deque()
        self._ended = False
        self._on_blocked = on_blocked
        self._blocked_every_ms = max(1, int(blocked_every_s * 1000))
        self._busy_wait_s = busy_wait_s
        self.shared_arrays = SharedArraysWriter() if shared_arrays else None

    def send(self, frames: list[bytes]) -> None:
        """Send one message (packed with ``self.shared_arrays`` where there is one)."""
        fd = self.shared_arrays.take_fd() if self.shared_arrays is not None else None
        try:
            if not self._ended:
                self._send(stream_chunks(frames), fd)
        finally:
            if fd is not None:
                os.close(fd)

    def _send(self, chunks: list[bytes], fd: int | None) -> None:
        # A new block's fd goes with the message's first byte, so it arrives before the message is read.
        ancillary = [] if fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
        try:
            try:
                sent = self._sock.sendmsg(chunks, ancillary)
            except BlockingIOError:
                sent = 0
            if sent == sum(len(chunk) for chunk in chunks):
                return  # the usual case: the whole message fitted at once
            fd_sent = sent > 0
            rest = memoryview(b"".join(chunks))[sent:]
            while rest:
                try:
                    rest = rest[self._sock.sendmsg([rest], [] if fd_sent else ancillary) :]
                    fd_sent = True
                except BlockingIOError:
                    self._wait_writable()
        except (BrokenPipeError, ConnectionResetError):
            self._ended = True
        except BaseException:
            # Half a message is on the stream: nothing sent after it could be read, so the stream ends here.
            self.close()
            raise

    def receive(self, timeout_s: float) -> list[bytes] | None:
        """The frames of the next message, or None when none arrived within ``timeout_s``."""
        if not self._arrived and not self._ended:
            self._wait_for_message(timeout_s)
        if self._arrived:
            return self._arrived.popleft()
        if self._ended:
            time.sleep(timeout_s)  # nothing will come; the caller's service of the manager link learns why
        return None

    def _wait_for_message(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        check_until = time.monotonic() + min(self._busy_wait_s, timeout_s)
        while not self._arrived and not self._ended and time.monotonic() < check_until:
            self._read()
        while not self._arrived and not self._ended:
            if not self._poll.poll(max(0, math.ceil((deadline - time.monotonic()) * 1000))):
                return
            self._read()

    def close(self) -> None:
        self._ended = True
        self._sock.close()
        if self.shared_arrays is not None:
            self.shared_arrays.close()

    def _read(self) -> None:
        data = _read_buffer().read(self._sock)
        if data is None:
            return
        if not data:
            self._ended = True
            return
        try:
            self._arrived.extend(self._decoder.feed(data))
        except OversizeError as exc:
            logger.warning("closed the stream from %s: %s", self.endpoint, exc)
            self.close()

    def _wait_writable(self) -> None:
        writable = select.poll()
        writable.register(self._sock.fileno(), select.POLLOUT)
        if not writable.poll(self._blocked_every_ms) and self._on_blocked is not None:
            self._on_blocked()
