"""The bytes of a local stream (``flare2.wire.streams``): each message's two frames with their lengths in front, cut
back into messages on the other side, and the buffer each thread reads a stream into."""

from __future__ import annotations

import array
import socket
import struct
import threading

from flare2.errors import DecodeError
from flare2.wire.shared_arrays import MOST_FDS

# The lengths of the header frame and of the payload frame.
_LENGTHS = struct.Struct("<II")
# A header is a few names and numbers; anything longer is not a flare2 peer.
_MAX_HEADER_BYTES = 4096
# Bytes taken from one connection per wake-up, so one flooding peer cannot starve the others.
_READ_BYTES = 1 << 20
# Room for the fds one read may bring: a message's (a new block's, view buffers'); more close the connection.
_FD_BYTES = array.array("i").itemsize
_FDS_SPACE = socket.CMSG_SPACE(MOST_FDS * _FD_BYTES)


class OversizeError(DecodeError):
    """A stream announced a message above the limit; the stream cannot be read past it."""


def stream_chunks(frames: list[bytes]) -> list[bytes]:
    """What goes on the stream for one message's two frames (header, payload)."""
    header, payload = frames
    return [_LENGTHS.pack(len(header), len(payload)), header, payload]


class _ReadBuffer:
    """Where a thread's stream reads land, made once per thread; a read gives a view of it, valid until the thread
    reads again, which the ``StreamDecoder`` copies what it keeps out of.

    ``recv(n)`` allocates n bytes on every call, that one answers or not: with a 1 MB n that is an mmap and an
    munmap per read in a process whose allocator hands such sizes to the kernel (the compute process), and a
    busy-waiting agent reads thousands of times between replies."""

    def __init__(self) -> None:
        self._view = memoryview(bytearray(_READ_BYTES))
        self._views = [self._view]

    def read(self, sock: socket.socket) -> memoryview | bytes | None:
        """What a non-blocking ``sock`` holds now (b"" once its peer is gone), or None while it holds nothing."""
        try:
            count = sock.recv_into(self._view)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""
        return self._view[:count]

    def read_with_fds(self, sock: socket.socket) -> tuple[memoryview | bytes | None, list[int]]:
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
        return self._view[:count], fds


_read_buffers = threading.local()


def read_buffer() -> _ReadBuffer:
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

    def feed(self, data: bytes | memoryview) -> list[list[bytes]]:
        """The messages that ``data`` completes (copied out: ``data`` is not kept); raises OversizeError at a message
        above ``max_bytes``."""
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
