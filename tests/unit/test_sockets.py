"""Requester over a real loopback socket: replies matched by seq, errors mapped, other protocol versions named."""

from __future__ import annotations

import logging

import msgpack
import numpy as np
import pytest
import zmq

from flare2.errors import ConfigError, ReplyTimeoutError, SpecError
from flare2.wire.protocol import (
    ERROR,
    HELLO,
    PREDICT,
    PROTOCOL_VERSION,
    Message,
    VersionMismatchError,
    error_payload,
    pack,
    unpack,
)
from flare2.wire.sockets import ConnectionWatch, Requester, bind_router


@pytest.fixture
def server():
    ctx = zmq.Context()
    sock, endpoint = bind_router(ctx, "127.0.0.1")
    yield ctx, sock, endpoint
    ctx.destroy(linger=0)


def answer(sock: zmq.Socket, frames_for) -> None:
    assert sock.poll(5000)
    identity, *frames = sock.recv_multipart()
    sock.send_multipart([identity, *frames_for(unpack(frames))])


def test_a_reply_in_another_protocol_version_raises_an_error_naming_both(server):
    ctx, sock, endpoint = server
    requester = Requester(ctx, endpoint, identity="a")
    seq = requester.send(HELLO, {})
    answer(
        sock, lambda request: [msgpack.packb([PROTOCOL_VERSION + 1, "welcome", "", request.seq, ""]), msgpack.packb({})]
    )
    with pytest.raises(
        VersionMismatchError,
        match=f"peer speaks flare2 protocol {PROTOCOL_VERSION + 1}, this side speaks {PROTOCOL_VERSION}",
    ):
        requester.wait_reply(seq, timeout_s=5, what="hello")


def test_an_error_reply_becomes_the_matching_exception_and_stale_replies_are_skipped(server):
    ctx, sock, endpoint = server
    requester = Requester(ctx, endpoint, identity="a")
    seq = requester.send(HELLO, {})

    assert sock.poll(5000)
    identity, *frames = sock.recv_multipart()
    # A late answer to an older request comes first; it must not be taken for this one.
    sock.send_multipart([identity, *pack(Message(ERROR, error_payload("old", code="spec"), seq=seq - 1))])
    sock.send_multipart(
        [identity, *pack(Message(ERROR, error_payload("inputs['obs'] is wrong", code="spec"), seq=seq))]
    )
    with pytest.raises(SpecError, match=r"inputs\['obs'\] is wrong"):
        requester.wait_reply(seq, timeout_s=5, what="predict")


def test_no_reply_in_time_raises_a_reply_timeout_naming_the_endpoint_and_the_limit(server):
    ctx, _, endpoint = server
    requester = Requester(ctx, endpoint, identity="a")
    seq = requester.send(HELLO, {})
    with pytest.raises(ReplyTimeoutError, match=f"no reply to hello from {endpoint} within 0.2s"):
        requester.wait_reply(seq, timeout_s=0.2, what="hello")


def test_without_a_limit_a_wait_outlasts_any_fixed_guess_while_on_idle_vouches_for_the_peer(server):
    ctx, sock, endpoint = server
    requester = Requester(ctx, endpoint, identity="a")
    seq = requester.send_request(HELLO, {})
    identity = sock.recv_multipart()[0]
    idle_calls = []

    def on_idle():
        # The slow peer answers only after many idle rounds: a wait with a limit of a few rounds would have given up.
        idle_calls.append(1)
        if len(idle_calls) == 20:
            sock.send_multipart([identity, *pack(Message(HELLO, {"late": True}, seq=seq))])

    reply = requester.wait_reply(seq, timeout_s=None, what="hello", idle_every_s=0.01, on_idle=on_idle)
    assert reply.payload == {"late": True} and len(idle_calls) >= 20


def test_a_message_over_the_size_limit_is_refused_before_it_goes_out_naming_the_limit_and_the_fix(server):
    ctx, sock, endpoint = server
    requester = Requester(ctx, endpoint, identity="a", max_bytes=2048)
    big = {"inputs": {"obs": np.zeros(1024, np.float32)}}
    with pytest.raises(
        ConfigError,
        match=r"a predict message to .* holds \d+ bytes, more than the 2048 a message to it may hold "
        r"\(max_message_bytes\).*raise --max-message-bytes",
    ):
        requester.send(PREDICT, big)
    # Nothing went out, and the next message keeps the sequence numbers in order.
    assert not sock.poll(100)
    seq = requester.send(PREDICT, {"inputs": {"obs": np.zeros(4, np.float32)}})
    answer(sock, lambda request: pack(Message(HELLO, {"seq_seen": request.seq}, seq=request.seq)))
    assert requester.wait_reply(seq, timeout_s=5, what="predict").payload == {"seq_seen": 1}


def test_a_message_over_the_limit_closes_its_connection_and_the_watch_counts_and_logs_it(caplog):
    ctx = zmq.Context()
    try:
        sock, endpoint = bind_router(ctx, "127.0.0.1", max_bytes=10_000)
        watch = ConnectionWatch(sock, max_bytes=10_000)
        peer = ctx.socket(zmq.DEALER)
        peer.setsockopt(zmq.LINGER, 0)
        peer.connect(endpoint)
        peer.send(b"small")
        assert sock.poll(5000) and sock.recv_multipart()[1] == b"small"
        with caplog.at_level(logging.INFO, logger="flare2.wire.sockets"):
            peer.send(b"x" * 50_000)
            watch.check(timeout_s=10)
        assert watch.closed == 1 and watch.handshake_failures == 0
        assert "sent a message over max_message_bytes (10000)" in caplog.text
        # The server goes on: the peer's next connection is served.
        peer.send(b"after")
        assert sock.poll(5000) and sock.recv_multipart()[1] == b"after"
        watch.close()
    finally:
        ctx.destroy(linger=0)
