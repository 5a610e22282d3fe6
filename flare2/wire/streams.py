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
import re
import select
import shutil
import socket
import stat
import struct
import tempfile
import time
from collections import deque
from collections.abc import Callable

from flare2.errors import ConfigError, DecodeError, TransportError
from flare2.wire.shared_arrays import MOST_FDS, SharedArraysReader, SharedArraysWriter
from flare2.wire.stream_bytes import OversizeError, StreamDecoder, read_buffer, stream_chunks

logger = logging.getLogger(__name__)

SCHEME = "unix://"
STREAM_MAX_BYTES = 1 << 30
"""The least limit of a message on a stream, whatever the run's ``max_message_bytes`` (which bounds what comes from
other machines): a stream's peers are processes of the run's own user, and an agent that plays many envs sends learn
requests past a limit meant for the network (PPO's Atari preset at 32 envs a process: 30 MB)."""


def stream_max_bytes(max_bytes: int) -> int:
    """The largest message a stream of a run whose ``max_message_bytes`` is ``max_bytes`` takes."""
    return max(max_bytes, STREAM_MAX_BYTES)


# A run's socket folder is named after the manager's pid, so that a later run can tell a dead run's folder.
_SOCKET_DIR = re.compile(r"flare2-(\d+)-[A-Za-z0-9_]+")


def make_socket_dir() -> str:
    """A new private folder (mode 0700) for a run's Unix sockets, which the run removes as it ends. First removes the
    folders of this user's runs whose manager was killed before it could remove its own (SIGKILL, the OOM killer)."""
    remove_stale_socket_dirs(tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"flare2-{os.getpid()}-")


def remove_stale_socket_dirs(root: str) -> None:
    """Removes each socket folder in ``root`` of this user whose manager is not running and none of whose sockets
    answers (the second check keeps the folder of a run whose pid another pid namespace hides from this one)."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        match = _SOCKET_DIR.fullmatch(entry.name)
        try:
            if not match or not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not _is_running(int(match[1])) and not _any_socket_answers(entry.path):
            shutil.rmtree(entry.path, ignore_errors=True)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _any_socket_answers(folder: str) -> bool:
    for parent, _dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            try:
                if not stat.S_ISSOCK(os.lstat(path).st_mode):
                    continue
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.settimeout(1.0)
                    probe.connect(path)
            except (ConnectionRefusedError, FileNotFoundError):
                continue
            except OSError:
                return True  # a listener with a full backlog, or a socket this process may not reach: leave it
            return True
    return False


_PEER_CREDENTIALS = struct.Struct("3i")
# Drops logged one by one before they are only counted.
_LOGGED_DROPS = 20


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
        data, fds = read_buffer().read_with_fds(connection.sock)
        if fds:
            try:
                if len(fds) > MOST_FDS:
                    for fd in fds:
                        os.close(fd)
                    raise DecodeError(f"{len(fds)} fds came in one read, where a message brings at most {MOST_FDS}")
                for index, fd in enumerate(fds):
                    try:
                        connection.shared_arrays.attach(fd)
                    except DecodeError:
                        for rest in fds[index + 1 :]:
                            os.close(rest)
                        raise
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
        fds = self.shared_arrays.take_fds() if self.shared_arrays is not None else []
        try:
            if not self._ended:
                self._send(stream_chunks(frames), fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _send(self, chunks: list[bytes], fds: list[int]) -> None:
        # The fds of new blocks and view buffers go with the message's first byte, so they arrive before the message
        # is read.
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
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
        data = read_buffer().read(self._sock)
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
