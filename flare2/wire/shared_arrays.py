"""Large arrays of a local agent's predict requests through shared memory instead of the stream.

A predict request of 64 Atari envs carries 0.45 MB of new frames a step (more
when games restart); written to a Unix stream it is copied five times on its
way (into the message, into the kernel, out of it, out of the message, into
the batch) and cost 1.4 ms a step more than a request of one int per env
(``tools/bench_frames.py``). Through shared memory the agent copies it into a
block both processes map, and the CT reads it there.

How it goes:

- The agent's ``SharedArraysWriter`` owns a block: an anonymous memory file
  (``memfd``; nothing in ``/dev/shm`` to leak) sealed against shrinking, so
  the compute process can never touch a page that went away. The block's fd
  crosses the stream once, with the first message that uses it (``SCM_RIGHTS``);
  a grown block is a new fd with a new block number.
- An array of at least ``MIN_SHARED_BYTES`` goes into the block's ring and
  crosses as a msgpack ext value of code ``SHARED_ARRAY_EXT_CODE``: dtype code,
  ndim, dims (as an inline array's head), then the block number, the offset
  and the message number. The region starts with the message number (its
  version stamp), written with the array.
- The compute process's ``SharedArraysReader`` (one per connection) checks the
  reference against the block's bounds and the stamp and gives the array as a
  read-only view of the block, read in place (or copied into a batch) before
  the request is answered; with the reply (``release``) the reader writes to
  the block's ``consumed`` word the last message before the oldest one still
  unanswered (a refused message is done with at once).
- The writer reuses a region only once ``consumed`` has reached the message
  that used it, so nothing is read after its region is reused. When the ring
  has no free region the array crosses inline, as over any other stream: a
  slow compute process never makes an agent wait for room.
- A connection's blocks are unmapped when it closes; the kernel frees them
  once the agent is gone too, whatever way it went.

Arrays an agent keeps from step to step can live in shared memory from the
start (``shared_zeros``: the frame rings of its trajectory views,
``flare2.core.views.FrameRing``). A request that holds a view of one names it
(ext code ``SHARED_VIEW_EXT_CODE``: the head, the buffer's number, the view's
offset and strides); the buffer's fd crosses once per connection. The CT
reads the view in place; the agent changes it only after the reply. At 64
Atari envs a step's frame stacks cross with no copy at all.

Only what the stream carries changes: decoding is as strict as ever (a
reference that does not fit its block is a ``DecodeError``), and a message's
arrays count towards the same ``max_bytes`` limit as when they crossed inline.
Agents of other machines keep the wire; the reader exists only on streams.
"""

from __future__ import annotations

import fcntl
import itertools
import mmap
import os
import stat
import struct
import weakref
from collections import OrderedDict, deque
from typing import Any

import msgpack
import numpy as np

from flare2.errors import DecodeError

SHARED_ARRAY_EXT_CODE = 2
SHARED_VIEW_EXT_CODE = 3
MIN_SHARED_BYTES = 16 * 1024
"""Smaller arrays cross inline: below this, the bookkeeping costs more than the copies it saves."""
FIRST_BLOCK_BYTES = 1 << 20
MOST_BLOCK_BYTES = 256 << 20
"""A block never grows past this; what does not fit crosses inline."""
_CONSUMED = struct.Struct("<Q")  # at offset 0: the last message number the reader is done with
_BLOCK_NUMBER = struct.Struct("<Q")  # at offset 8
_STAMP = struct.Struct("<Q")  # at the start of each region: the number of the message that wrote it
_DATA_START = 64
_ALIGN = 64
_REFERENCE = struct.Struct("<QQQ")  # block number, region offset, message number
_VIEW_REFERENCE = struct.Struct("<QQ")  # view buffer number, offset; the strides follow, an int64 per dim
_VIEW_BUFFER_MARK = struct.Struct("<Q")  # at offset 16 of a view buffer (a block has zeros there)
_VIEW_BUFFER = 0x7765_6976_3265_7261
MOST_VIEW_BUFFERS = 16  # a reader keeps the last sent mapped; the writer sends an older one's fd again
MOST_FDS = 4  # that one message brings: a new block's and view buffers'
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _aligned(size: int) -> int:
    return (size + _ALIGN - 1) // _ALIGN * _ALIGN


class _Block:
    """One mapped block: its fd, size, number and mapping."""

    def __init__(self, fd: int, size: int, number: int) -> None:
        self.fd, self.size, self.number = fd, size, number
        self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:
            pass  # arrays still view it (a request not yet answered): it is unmapped when the last of them goes
        os.close(self.fd)


_view_numbers = itertools.count(1)
_view_buffers: dict[int, tuple[int, int, int]] = {}
"""This process's live view buffers by number: the fd, and the addresses where their data starts and ends."""


def shared_zeros(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An array of zeros in a view buffer of its own (module docstring): where a request holds a view of it, a local
    compute process reads the view in place. It goes, with its fd, when the last view of it does."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = (_DATA_START + max(nbytes, 1) + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
    if size > MOST_BLOCK_BYTES:
        return np.zeros(shape, dtype)  # no reader maps it: its views cross as any array does
    number = next(_view_numbers)
    fd = os.memfd_create(f"flare2-views-{number}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        buffer = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    _BLOCK_NUMBER.pack_into(buffer, 8, number)
    _VIEW_BUFFER_MARK.pack_into(buffer, 16, _VIEW_BUFFER)
    array = np.ndarray(shape, dtype, buffer=buffer, offset=_DATA_START)
    start = array.__array_interface__["data"][0]
    _view_buffers[number] = (fd, start, start + nbytes)
    weakref.finalize(buffer, _forget_view_buffer, number)
    return array


def _forget_view_buffer(number: int) -> None:
    os.close(_view_buffers.pop(number)[0])


def _in_view_buffer(array: np.ndarray) -> tuple[int, int, int] | None:
    """The view buffer ``array`` lies in (number, fd, offset of its first element from the buffer's start), or None."""
    if not _view_buffers or any(stride < 0 for stride in array.strides):
        return None
    first = array.__array_interface__["data"][0]
    last = first + _extent(array.shape, array.strides, array.itemsize)
    for number, (fd, start, end) in list(_view_buffers.items()):  # a collection may drop one meanwhile
        if start <= first and last <= end:
            return number, fd, first - start + _DATA_START
    return None


def _extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int:
    """The bytes from an array's first element to the end of its last (0 for an empty one)."""
    return 0 if 0 in shape else sum((dim - 1) * stride for dim, stride in zip(shape, strides)) + itemsize


def in_shared_memory(array: Any) -> bool:
    """Whether ``array`` is a view a reader gave of shared memory: valid while the request it came with is served,
    and read-only (the CDP hands it to the CT as it is, where it would copy an array of a message's bytes)."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)


class SharedArraysWriter:
    """The agent's side of one stream: places large arrays in its block (module docstring)."""

    def __init__(self) -> None:
        self._block: _Block | None = None
        self._unsent_fd: int | None = None
        self._unsent_views: list[tuple[int, int, int]] = []
        """The view buffers whose fd goes with the next message sent: (the message that named it, number, fd)."""
        self._views_sent: OrderedDict[int, None] = OrderedDict()
        """The view buffers the reader holds, as it holds them: the most recent ``MOST_VIEW_BUFFERS`` fds sent."""
        self._message = 0
        self._head = _DATA_START
        # (message number, start, end) of the regions not yet known to be read, oldest first.
        self._in_flight: deque[tuple[int, int, int]] = deque()
        self.placed_bytes = 0
        """Bytes of arrays the message being encoded holds in the block."""
        self.inline_arrays = 0
        """Arrays that crossed inline for want of a free region (a block too small for the traffic, or a compute
        process slow to decode)."""

    def begin(self) -> None:
        """A new message is encoded: its arrays get the next message number."""
        self._message += 1
        self.placed_bytes = 0

    def cancel(self) -> None:
        """The message begun last will not be sent: its regions are free again, its view buffers still unsent."""
        while self._in_flight and self._in_flight[-1][0] == self._message:
            self._head = self._in_flight.pop()[1]
        while self._unsent_views and self._unsent_views[-1][0] == self._message:
            os.close(self._unsent_views.pop()[2])
        self.placed_bytes = 0

    def take_fds(self) -> list[int]:
        """The fds the reader has not been sent yet (a new block's, view buffers'): to go with the message just
        encoded; the caller closes them once sent."""
        fds = [] if self._unsent_fd is None else [self._unsent_fd]
        for _, number, fd in self._unsent_views:
            # The reader keeps the view buffers it was sent last, as many as this: so does the writer, in the same
            # order, and sends the fd of one it let go again where a message names it.
            self._views_sent[number] = None
            if len(self._views_sent) > MOST_VIEW_BUFFERS:
                self._views_sent.popitem(last=False)
            fds.append(fd)
        self._unsent_fd, self._unsent_views = None, []
        return fds

    def place(self, array: np.ndarray, head: bytes) -> msgpack.ExtType | None:
        """The reference to ``array`` (already of its wire dtype) written into the block, or None: it crosses
        inline. ``head`` is the array's wire head (dtype code, ndim, dims)."""
        if array.nbytes < MIN_SHARED_BYTES:
            return None
        in_view_buffer = _in_view_buffer(array)
        if in_view_buffer is not None and (named := self._name(array, head, *in_view_buffer)) is not None:
            return named
        need = _aligned(_STAMP.size + array.nbytes)
        start = self._allocate(need)
        if start is None:
            self.inline_arrays += 1
            return None
        block = self._block
        assert block is not None  # _allocate made it
        target = np.ndarray(array.shape, array.dtype, buffer=block.map, offset=start + _STAMP.size)
        target[...] = array
        _STAMP.pack_into(block.map, start, self._message)
        self._in_flight.append((self._message, start, start + need))
        self.placed_bytes += array.nbytes
        return msgpack.ExtType(SHARED_ARRAY_EXT_CODE, head + _REFERENCE.pack(block.number, start, self._message))

    def _name(self, array: np.ndarray, head: bytes, number: int, fd: int, offset: int) -> msgpack.ExtType | None:
        """The reference to ``array``, a view of view buffer ``number``: its bytes stay where they are."""
        if number not in self._views_sent and all(number != unsent for _, unsent, _ in self._unsent_views):
            if len(self._unsent_views) + 1 >= MOST_FDS:
                return None  # no room for its fd beside the others': this once it is copied
            self._unsent_views.append((self._message, number, os.dup(fd)))
        self.placed_bytes += array.nbytes
        strides = struct.pack(f"<{array.ndim}q", *array.strides)
        return msgpack.ExtType(SHARED_VIEW_EXT_CODE, head + _VIEW_REFERENCE.pack(number, offset) + strides)

    def _allocate(self, need: int) -> int | None:
        block = self._block
        if block is not None:
            consumed = _CONSUMED.unpack_from(block.map, 0)[0]
            while self._in_flight and self._in_flight[0][0] <= consumed:
                self._in_flight.popleft()
        if not self._in_flight:
            self._head = _DATA_START
            if block is None or _DATA_START + need > block.size:
                if not self._grow(need):
                    return None
                block = self._block
        assert block is not None
        head = self._head
        if self._in_flight:
            tail = self._in_flight[0][1]
            if head <= tail:  # wrapped: the free space lies between the head and the oldest region in use
                return self._take(head, need) if head + need <= tail else None
            if head + need > block.size:
                # No room before the block's end: start again at its beginning, before the oldest region.
                return self._take(_DATA_START, need) if _DATA_START + need <= tail else None
        return self._take(head, need) if head + need <= block.size else None

    def _take(self, start: int, need: int) -> int:
        self._head = start + need
        return start

    def _grow(self, need: int) -> bool:
        """A new block for regions of ``need`` bytes (a few of them at once); False where it would be too big."""
        size = max(FIRST_BLOCK_BYTES, 2 * (self._block.size if self._block else 0), 8 * need + _DATA_START)
        size = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        if size > MOST_BLOCK_BYTES:
            return False
        number = self._block.number + 1 if self._block else 1
        fd = os.memfd_create(f"flare2-arrays-{number}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            block = _Block(fd, size, number)
        except BaseException:
            os.close(fd)
            raise
        _BLOCK_NUMBER.pack_into(block.map, 8, number)
        self._close_block()
        self._block, self._unsent_fd = block, os.dup(fd)
        return True

    def close(self) -> None:
        self._close_block()
        for _, _, fd in self._unsent_views:
            os.close(fd)
        self._unsent_views = []
        self._views_sent.clear()

    def _close_block(self) -> None:
        if self._unsent_fd is not None:
            os.close(self._unsent_fd)
            self._unsent_fd = None
        if self._block is not None:
            self._block.close()
            self._block = None


class SharedArraysReader:
    """The compute process's side of one stream: the blocks its agent sent, and the arrays read out of them."""

    # The block in use and the one before it: an fd comes with the first message of its block, which may be read
    # in one go with messages of the block before.
    _KEPT_BLOCKS = 2

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._blocks: dict[int, _Block] = {}
        self._view_buffers: OrderedDict[int, _Block] = OrderedDict()
        """The last ``MOST_VIEW_BUFFERS`` view buffers the agent sent, in order (its writer counts them the same)."""
        self._read_bytes = 0
        self._decoding: int | None = None
        """The message number of the shared arrays of the message being decoded (None while it has none)."""
        self._in_use: dict[int, int] = {}
        """By the seq of a decoded request: the message number of its shared arrays, which are views of the block
        until the request is answered (``release``)."""
        self._last_message = 0

    def attach(self, fd: int) -> None:
        """Map a block whose fd arrived (this reader owns the fd from here); raise DecodeError where it is not one."""
        refusal = (
            f"the fd sent with a message is not a memory file sealed against shrinking of at most {MOST_BLOCK_BYTES} "
            "bytes, as flare2's agents send"
        )
        try:
            info = os.fstat(fd)
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as exc:
            os.close(fd)
            raise DecodeError(f"{refusal} ({exc})") from None
        size = info.st_size
        if (
            not stat.S_ISREG(info.st_mode)
            or not seals & fcntl.F_SEAL_SHRINK
            or not _DATA_START < size <= MOST_BLOCK_BYTES
        ):
            os.close(fd)
            raise DecodeError(refusal)
        try:
            block = _Block(fd, size, 0)
        except OSError as exc:
            os.close(fd)
            raise DecodeError(f"cannot map the memory file sent with a message ({exc})") from None
        block.number = _BLOCK_NUMBER.unpack_from(block.map, 8)[0]
        if _VIEW_BUFFER_MARK.unpack_from(block.map, 16)[0] == _VIEW_BUFFER:
            self._keep_view_buffer(block)
            return
        previous = self._blocks.pop(block.number, None)
        if previous is not None:
            previous.close()
        self._blocks[block.number] = block
        for number in sorted(self._blocks)[: -self._KEPT_BLOCKS]:
            self._blocks.pop(number).close()

    def _keep_view_buffer(self, buffer: _Block) -> None:
        previous = self._view_buffers.pop(buffer.number, None)
        if previous is not None:
            previous.close()
        self._view_buffers[buffer.number] = buffer
        while len(self._view_buffers) > MOST_VIEW_BUFFERS:
            self._view_buffers.popitem(last=False)[1].close()

    def begin(self) -> None:
        """A message is about to be decoded (``codec.decode``; ``protocol.unpack`` then calls ``finish``)."""
        self._read_bytes = 0
        self._decoding = None

    def array(self, reference: bytes, dtype: np.dtype, shape: tuple[int, ...], nbytes: int) -> np.ndarray:
        """The array of ``dtype``, ``shape`` and ``nbytes`` that ``reference`` names: a read-only view of the block,
        valid until ``release`` of its message's seq (the CDP copies every request into a batch of its own before it
        answers it)."""
        if len(reference) != _REFERENCE.size:
            raise DecodeError(f"a shared array's reference has {len(reference)} bytes, not {_REFERENCE.size}")
        block_number, start, message = _REFERENCE.unpack(reference)
        block = self._blocks.get(block_number)
        if block is None:
            raise DecodeError(f"a shared array names block {block_number}, which this connection was not sent")
        if start < _DATA_START or start % _ALIGN or start + _STAMP.size + nbytes > block.size:
            raise DecodeError(f"a shared array of {nbytes} bytes at offset {start} does not fit its block")
        self._count(nbytes)
        if _STAMP.unpack_from(block.map, start)[0] != message:
            raise DecodeError(f"a shared array's region does not hold message {message}'s array")
        view = np.frombuffer(block.map, dtype, nbytes // dtype.itemsize, start + _STAMP.size).reshape(shape)
        view.flags.writeable = False
        self._decoding = message
        self._last_message = max(self._last_message, message)
        return view

    def view(self, reference: bytes, dtype: np.dtype, shape: tuple[int, ...], nbytes: int) -> np.ndarray:
        """The view of ``dtype`` and ``shape`` that ``reference`` names in one of the agent's view buffers: read-only,
        valid while its request is served (the agent changes it only after the reply)."""
        if len(reference) != _VIEW_REFERENCE.size + 8 * len(shape):
            raise DecodeError(
                f"a shared view's reference has {len(reference)} bytes, not {_VIEW_REFERENCE.size + 8 * len(shape)}"
            )
        number, offset = _VIEW_REFERENCE.unpack_from(reference)
        strides = struct.unpack_from(f"<{len(shape)}q", reference, _VIEW_REFERENCE.size)
        buffer = self._view_buffers.get(number)
        if buffer is None:
            raise DecodeError(f"a shared view names view buffer {number}, which this connection was not sent")
        if (
            any(stride < 0 for stride in strides)
            or offset < _DATA_START
            or offset + _extent(shape, strides, dtype.itemsize) > buffer.size
        ):
            raise DecodeError(f"a shared view of shape {shape} at offset {offset} does not fit its view buffer")
        self._count(nbytes)
        view = np.ndarray(shape, dtype, buffer=buffer.map, offset=offset, strides=strides)
        view.flags.writeable = False
        return view

    def _count(self, nbytes: int) -> None:
        self._read_bytes += nbytes
        if self._read_bytes > self.max_bytes:
            raise DecodeError(f"a message's shared arrays hold more than the limit of {self.max_bytes} bytes")

    def finish(self, seq: int | None) -> None:
        """The message is decoded, ``seq`` its sequence number: its shared arrays stay in use until ``release(seq)``;
        or refused (None): its regions may be reused now."""
        message, self._decoding = self._decoding, None
        if message is not None and seq is not None:
            self._in_use[seq] = message
        self._write_consumed()

    def release(self, seq: int) -> None:
        """The request ``seq`` was answered: its shared arrays are no longer read, and their regions may be reused."""
        if self._in_use.pop(seq, None) is not None:
            self._write_consumed()

    def _write_consumed(self) -> None:
        # Every message before the oldest one still in use is done with (a stream's messages are numbered in order).
        consumed = min(self._in_use.values()) - 1 if self._in_use else self._last_message
        for block in self._blocks.values():
            _CONSUMED.pack_into(block.map, 0, consumed)

    def close(self) -> None:
        for block in [*self._blocks.values(), *self._view_buffers.values()]:
            block.close()
        self._blocks.clear()
        self._view_buffers.clear()
