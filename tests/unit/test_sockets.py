"""Requester over a real loopback socket: replies matched by seq, errors mapped, other protocol versions named."""

from __future__ import annotations

import msgpack
import pytest
import zmq

from flare2.errors import PeerDiedError, SpecError
from flare2.wire.protocol import ERROR, HELLO, PROTOCOL_VERSION, Message, VersionMismatchError, error_payload, pack, unpack
from flare2.wire.sockets import Requester, bind_router


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
    answer(sock, lambda request: [msgpack.packb([7, "welcome", "", request.seq, ""]), msgpack.packb({})])
    with pytest.raises(VersionMismatchError, match=f"peer speaks flare2 protocol 7, this side speaks {PROTOCOL_VERSION}"):
        requester.wait_reply(seq, timeout_s=5, what="hello")


def test_an_error_reply_becomes_the_matching_exception_and_stale_replies_are_skipped(server):
    ctx, sock, endpoint = server
    requester = Requester(ctx, endpoint, identity="a")
    seq = requester.send(HELLO, {})

    assert sock.poll(5000)
    identity, *frames = sock.recv_multipart()
    # A late answer to an older request comes first; it must not be taken for this one.
    sock.send_multipart([identity, *pack(Message(ERROR, error_payload("old", code="spec"), seq=seq - 1))])
    sock.send_multipart([identity, *pack(Message(ERROR, error_payload("inputs['obs'] is wrong", code="spec"), seq=seq))])
    with pytest.raises(SpecError, match=r"inputs\['obs'\] is wrong"):
        requester.wait_reply(seq, timeout_s=5, what="predict")


def test_no_reply_in_time_raises_peer_died_naming_the_endpoint(server):
    ctx, _, endpoint = server
    requester = Requester(ctx, endpoint, identity="a")
    seq = requester.send(HELLO, {})
    with pytest.raises(PeerDiedError, match=f"no reply to hello from {endpoint}"):
        requester.wait_reply(seq, timeout_s=0.2, what="hello")
