"""Large arrays of local predict requests through shared memory: round trips, reuse only after reading, refusals."""

from __future__ import annotations

import fcntl
import os
import select
import time

import numpy as np
import pytest

from flare2.core.specs import CTSpecs, Spec
from flare2.errors import DecodeError
from flare2.runtime.agents.socket_port import SocketPort
from flare2.runtime.latency import LatencyHistogram
from flare2.wire.codec import decode, encode
from flare2.wire.protocol import PREDICT, Message, pack, unpack
from flare2.wire.shared_arrays import (
    MIN_SHARED_BYTES,
    MOST_FDS,
    MOST_VIEW_BUFFERS,
    SharedArraysReader,
    SharedArraysWriter,
    in_shared_memory,
    shared_zeros,
)
from flare2.wire.streams import StreamClient, StreamServer

LIMIT = 1 << 24
FRAMES = (64, 84, 84)


def frames(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, FRAMES, dtype=np.uint8)


def handed_over(writer: SharedArraysWriter, reader: SharedArraysReader) -> None:
    """What the stream does with the fds of a new block and of view buffers: the reader gets its own."""
    for fd in writer.take_fds():
        reader.attach(os.dup(fd))
        os.close(fd)


def sent(payload: dict, seq: int, writer: SharedArraysWriter) -> list[bytes]:
    return pack(Message(PREDICT, payload, "a", seq, "RL"), shared=writer)


def received(message_frames: list[bytes], reader: SharedArraysReader) -> dict:
    return unpack(message_frames, max_bytes=LIMIT, shared=reader).payload


def answered(writer: SharedArraysWriter, reader: SharedArraysReader, *, first_seq: int, count: int) -> None:
    """``count`` requests sent, read, checked and answered one after another (seqs from ``first_seq``)."""
    for seed in range(count):
        seq = first_seq + seed
        np.testing.assert_array_equal(received(sent({"obs": frames(seed)}, seq, writer), reader)["obs"], frames(seed))
        reader.release(seq)


@pytest.fixture
def pair():
    writer, reader = SharedArraysWriter(), SharedArraysReader(LIMIT)
    yield writer, reader
    writer.close()
    reader.close()


def test_large_arrays_cross_as_references_and_small_ones_inline(pair):
    writer, reader = pair
    big, small = frames(0), np.arange(MIN_SHARED_BYTES // 8 - 1, dtype=np.int64)
    data = encode({"obs": big, "flags": small}, shared=writer)
    assert len(data) < small.nbytes + 200
    handed_over(writer, reader)
    decoded = decode(data, shared=reader)
    np.testing.assert_array_equal(decoded["obs"], big)
    np.testing.assert_array_equal(decoded["flags"], small)
    assert in_shared_memory(decoded["obs"]) and not decoded["obs"].flags.writeable, "a read-only view of the block"
    assert not in_shared_memory(decoded["flags"])


def test_a_region_is_reused_only_once_the_request_that_used_it_was_answered(pair):
    writer, reader = pair
    messages = [sent({"obs": frames(seed)}, seed + 1, writer) for seed in range(40)]
    handed_over(writer, reader)
    # Nothing read yet: once the block is full, arrays cross inline and no region is written twice.
    assert writer.inline_arrays > 0
    for seed, message_frames in enumerate(messages):
        np.testing.assert_array_equal(received(message_frames, reader)["obs"], frames(seed))
        reader.release(seed + 1)
    # Read but not answered: its region keeps its frames while the messages after it go elsewhere, or inline.
    kept = received(sent({"obs": frames(1000)}, 41, writer), reader)["obs"]
    inline_before = writer.inline_arrays
    answered(writer, reader, first_seq=42, count=60)
    np.testing.assert_array_equal(kept, frames(1000))
    assert writer.inline_arrays > inline_before, "the unanswered request's region was not given out"
    reader.release(41)
    inline_before = writer.inline_arrays
    answered(writer, reader, first_seq=200, count=100)
    assert writer.inline_arrays == inline_before, "answered requests free their regions"


def test_a_refused_message_frees_its_region_at_once(pair):
    writer, reader = pair
    message_frames = sent({"obs": frames(0)}, 1, writer)
    handed_over(writer, reader)
    with pytest.raises(DecodeError, match="payload must be a map"):
        unpack([message_frames[0], encode([frames(0)], shared=writer)], max_bytes=LIMIT, shared=reader)
    np.testing.assert_array_equal(received(message_frames, reader)["obs"], frames(0))
    reader.release(1)
    inline_before = writer.inline_arrays
    answered(writer, reader, first_seq=2, count=100)
    assert writer.inline_arrays == inline_before


def test_a_region_rewritten_or_named_wrongly_is_refused_not_read(pair):
    writer, reader = pair
    first = encode({"obs": frames(0)}, shared=writer)
    handed_over(writer, reader)
    # The writer's state rolled back as if the first message had been read: its region is written again.
    writer._in_flight.clear()
    encode({"obs": frames(1)}, shared=writer)
    with pytest.raises(DecodeError, match="does not hold message 1's array"):
        decode(first, shared=reader)
    with pytest.raises(DecodeError, match="unknown msgpack ext type 2"):
        decode(first)
    tampered = bytearray(first)
    tampered[-24] = 9  # the block number
    with pytest.raises(DecodeError, match="names block 9"):
        decode(bytes(tampered), shared=reader)
    tampered = bytearray(first)
    tampered[-16:-8] = (1 << 40).to_bytes(8, "little")  # the offset
    with pytest.raises(DecodeError, match="does not fit its block"):
        decode(bytes(tampered), shared=reader)


def test_a_messages_shared_arrays_count_towards_the_size_limit(pair):
    writer, _ = pair
    reader = SharedArraysReader(max_bytes=FRAMES[0] * 84 * 84 + 10)
    data = encode({"a": frames(0), "b": frames(1)}, shared=writer)
    handed_over(writer, reader)
    with pytest.raises(DecodeError, match="more than the limit"):
        decode(data, shared=reader)
    reader.close()


def test_an_fd_that_is_not_a_sealed_memory_file_is_refused(tmp_path):
    reader = SharedArraysReader(LIMIT)
    path = tmp_path / "file"
    path.write_bytes(b"\0" * 4096)
    with pytest.raises(DecodeError, match="sealed against shrinking"):
        reader.attach(os.open(path, os.O_RDWR))
    unsealed = os.memfd_create("x")
    os.ftruncate(unsealed, 4096)
    with pytest.raises(DecodeError, match="sealed against shrinking"):
        reader.attach(unsealed)
    with pytest.raises(OSError):
        fcntl.fcntl(unsealed, fcntl.F_GET_SEALS)  # the reader closed what it refused


def test_a_message_that_fails_to_encode_gives_its_regions_back(pair):
    writer, reader = pair
    with pytest.raises(Exception, match="cannot send a value of type object"):
        encode({"obs": frames(0), "z": object()}, shared=writer)
    data = encode({"obs": frames(1)}, shared=writer)
    handed_over(writer, reader)
    np.testing.assert_array_equal(decode(data, shared=reader)["obs"], frames(1))
    assert not writer.inline_arrays


def pump(server: StreamServer, until, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "nothing arrived in time"
        if select.select([server], [], [], 0.05)[0]:
            server.drain(time.monotonic())


def test_a_stream_client_sends_its_block_with_the_first_message_and_the_server_reads_through_it(tmp_path):
    arrived: list[Message] = []
    connections = []

    def receive(connection, message_frames, now):
        connections.append(connection)
        arrived.append(unpack(message_frames, max_bytes=LIMIT, shared=connection.shared_arrays))

    server = StreamServer(str(tmp_path / "s"), max_bytes=LIMIT, receive=receive)
    client = StreamClient(server.endpoint, max_bytes=LIMIT, shared_arrays=True)
    try:
        for seq in range(1, 31):
            assert client.shared_arrays is not None
            client.send(pack(Message(PREDICT, {"obs": frames(seq)}, "a", seq, "RL"), shared=client.shared_arrays))
            pump(server, lambda: len(arrived) == seq)
            np.testing.assert_array_equal(arrived[-1].payload["obs"], frames(seq))
            connections[-1].shared_arrays.release(seq)  # what the reply does
        assert client.shared_arrays.inline_arrays == 0
        # A bigger message grows the block: the new one's fd goes with it.
        big = np.ones((8, *FRAMES), np.uint8)
        client.send(pack(Message(PREDICT, {"obs": big}, "a", 31, "RL"), shared=client.shared_arrays))
        pump(server, lambda: len(arrived) == 31)
        np.testing.assert_array_equal(arrived[-1].payload["obs"], big)
        assert client.shared_arrays.inline_arrays == 0
    finally:
        client.close()
    # The agent gone, its connection closes and the compute side lets the block go (unmapped once the arrays that
    # still view it are gone too).
    pump(server, lambda: connections[0].closed)
    assert not connections[0].shared_arrays._blocks
    np.testing.assert_array_equal(arrived[-1].payload["obs"], big)
    server.close()


class _Control:
    interval_s = 0.1
    round_trips = LatencyHistogram()

    def service(self) -> None:
        pass

    def maybe_service(self) -> None:
        pass


def test_an_agents_port_sends_its_predict_requests_frames_through_shared_memory_and_its_learn_requests_inline(
    tmp_path,
):
    arrived: dict[str, tuple] = {}

    def server(name: str) -> StreamServer:
        def receive(connection, message_frames, now):
            arrived[name] = (connection, message_frames)

        return StreamServer(str(tmp_path / name), max_bytes=LIMIT, receive=receive)

    predict, learn = server("predict"), server("learn")
    specs = CTSpecs(
        inputs={"obs": Spec(FRAMES[1:], "uint8")}, actions={"action": Spec((), "int64")}, states={}, rewards={}
    )
    info = {"predict_endpoint": predict.endpoint, "learn_endpoint": learn.endpoint, "busy_wait_us": 0}
    port = SocketPort(None, "RL", info, specs, "a0", _Control(), None, LIMIT, None)
    try:
        assert port.predictor.shares_arrays and not port.learner.shares_arrays
        port.send_predict({"inputs": {"obs": frames(0)}, "states": {}})
        # Large enough to be shared on a predict stream, small enough to fit the learn stream's buffer unread.
        port.send_statistics({"obs": frames(1)[:4]})
        pump(predict, lambda: "predict" in arrived)
        pump(learn, lambda: "learn" in arrived)
        connection, message_frames = arrived["predict"]
        with pytest.raises(DecodeError, match="unknown msgpack ext type 2"):
            unpack(message_frames, max_bytes=LIMIT)
        shared = unpack(message_frames, max_bytes=LIMIT, shared=connection.shared_arrays)
        np.testing.assert_array_equal(shared.payload["inputs"]["obs"], frames(0))
        np.testing.assert_array_equal(unpack(arrived["learn"][1], max_bytes=LIMIT).payload["obs"], frames(1)[:4])
    finally:
        port.close()
        predict.close()
        learn.close()


def test_a_view_of_a_view_buffer_is_named_not_copied_and_read_where_the_agent_keeps_it(pair):
    writer, reader = pair
    ring = shared_zeros((8, 4 * 2, 84, 84), np.uint8)
    ring[:] = np.arange(8 * 8, dtype=np.uint8).reshape(8, 8, 1, 1)
    window = ring[:, 3:7]  # strided from row to row, as FrameRing hands its windows out
    data = encode({"obs_frames": window}, shared=writer)
    assert len(data) < 200, "a reference, not the frames"
    handed_over(writer, reader)
    decoded = decode(data, shared=reader)["obs_frames"]
    np.testing.assert_array_equal(decoded, window)
    assert in_shared_memory(decoded) and not decoded.flags.writeable
    ring[0, 3] = 255  # the same memory: what the agent writes (after the reply) is what the next request names
    assert decoded[0, 0, 0, 0] == 255
    # The buffer's fd went with the first message only; a message that fails to encode leaves it unsent.
    assert len(encode({"obs_frames": window}, shared=writer)) < 200 and writer.take_fds() == []
    other = shared_zeros((8, 4, 84, 84), np.uint8)
    with pytest.raises(Exception, match="cannot send a value of type object"):
        encode({"obs_frames": other, "z": object()}, shared=writer)
    assert writer.take_fds() == []
    encode({"obs_frames": other}, shared=writer)
    fds = writer.take_fds()
    assert len(fds) == 1
    for fd in fds:
        os.close(fd)


def test_a_view_named_wrongly_is_refused_not_read(pair):
    writer, reader = pair
    ring = shared_zeros((4, 8, 84, 84), np.uint8)
    data = encode({"obs_frames": ring[:, 1:5]}, shared=writer)
    handed_over(writer, reader)
    strides = len(ring.shape) * 8
    for where, value, message in [
        (slice(-strides - 16, -strides - 8), 9, "names view buffer 9"),  # the buffer's number
        (slice(-strides - 8, -strides), 1 << 40, "does not fit its view buffer"),  # the offset
        (slice(-strides, -strides + 8), -1, "does not fit its view buffer"),  # a negative stride
        (slice(-strides, -strides + 8), 1 << 30, "does not fit its view buffer"),  # rows past the end
    ]:
        tampered = bytearray(data)
        tampered[where] = value.to_bytes(8, "little", signed=True)
        with pytest.raises(DecodeError, match=message):
            decode(bytes(tampered), shared=reader)
    with pytest.raises(DecodeError, match="unknown msgpack ext type 3"):
        decode(data)
    np.testing.assert_array_equal(decode(data, shared=reader)["obs_frames"], ring[:, 1:5])


def test_a_reader_keeps_the_view_buffers_used_last_and_a_message_brings_a_bounded_number_of_fds(pair):
    writer, reader = pair
    rings = [shared_zeros((4, 8, 84, 84), np.uint8) for _ in range(MOST_VIEW_BUFFERS + 1)]
    for index, ring in enumerate(rings):
        data = encode({"obs_frames": ring[:, 1:5]}, shared=writer)
        handed_over(writer, reader)
        decode(data, shared=reader)
    assert len(reader._view_buffers) == MOST_VIEW_BUFFERS
    # The first was let go on both sides: naming it again sends its fd again.
    data = encode({"obs_frames": rings[0][:, 1:5]}, shared=writer)
    handed_over(writer, reader)
    np.testing.assert_array_equal(decode(data, shared=reader)["obs_frames"], rings[0][:, 1:5])
    # A reader that let go of one the writer thinks it holds (the oldest, now the third) refuses to read it.
    reader._view_buffers.popitem(last=False)
    data = encode({"obs_frames": rings[2][:, 1:5]}, shared=writer)
    assert writer.take_fds() == []
    with pytest.raises(DecodeError, match="names view buffer"):
        decode(data, shared=reader)
    many = {f"v{index}": shared_zeros((4, 4, 84, 84), np.uint8) for index in range(MOST_FDS + 2)}
    encode(many, shared=writer)
    fds = writer.take_fds()
    assert len(fds) <= MOST_FDS  # the views past that are copied into the block this once
    for fd in fds:
        os.close(fd)
