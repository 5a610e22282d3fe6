"""The two-frame flare2 message: header checks and payload limits."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from flare2.errors import DecodeError
from flare2.wire.codec import encode
from flare2.wire.protocol import (
    KINDS,
    MAX_HEADER_BYTES,
    MAX_NAME_CHARS,
    PREDICT,
    PROTOCOL_VERSION,
    Message,
    error_payload,
    pack,
    unpack,
)

EMPTY_PAYLOAD = encode({})


def header(*fields) -> bytes:
    return msgpack.packb(list(fields), use_bin_type=True)


def frames_with_header(*fields) -> list[bytes]:
    return [header(*fields), EMPTY_PAYLOAD]


def test_a_message_comes_back_with_every_field_and_its_arrays():
    message = Message(PREDICT, {"inputs": {"obs": np.arange(6, dtype=np.float32).reshape(2, 3)}}, "agent-7.1", 42, "RL")
    frames = pack(message)
    assert len(frames) == 2 and all(isinstance(frame, bytes) for frame in frames)

    back = unpack(frames)
    assert (back.kind, back.agent_id, back.seq, back.ct) == (PREDICT, "agent-7.1", 42, "RL")
    np.testing.assert_array_equal(back.payload["inputs"]["obs"], message.payload["inputs"]["obs"])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_round_trips(kind):
    assert unpack(pack(Message(kind))) == Message(kind)


def test_an_error_payload_round_trips():
    message = Message("error", error_payload("bad spec", traceback="Traceback...", code="spec"), seq=3)
    assert unpack(pack(message)).payload == {"code": "spec", "reason": "bad spec", "traceback": "Traceback..."}


def test_the_largest_seq_and_longest_names_are_accepted():
    name = "n" * MAX_NAME_CHARS
    message = Message(PREDICT, agent_id=name, seq=2**63 - 1, ct=name)
    assert unpack(pack(message)) == message


@pytest.mark.parametrize("version", [PROTOCOL_VERSION + 1, PROTOCOL_VERSION - 1, 99])
def test_a_wrong_protocol_version_is_rejected_naming_both_versions(version):
    with pytest.raises(DecodeError) as caught:
        unpack(frames_with_header(version, PREDICT, "", 0, ""))
    text = str(caught.value)
    assert f"protocol {version}" in text
    assert f"speaks {PROTOCOL_VERSION}" in text
    assert "same flare2 version" in text


@pytest.mark.parametrize("version", [True, 1.0, "1", None], ids=repr)
def test_a_version_that_is_not_an_int_is_rejected(version):
    with pytest.raises(DecodeError, match="version is not an int"):
        unpack(frames_with_header(version, PREDICT, "", 0, ""))


@pytest.mark.parametrize("kind", ["nope", "", "PREDICT", 3, None, b"predict"], ids=repr)
def test_an_unknown_kind_is_rejected_naming_it(kind):
    with pytest.raises(DecodeError, match="unknown message kind"):
        unpack(frames_with_header(PROTOCOL_VERSION, kind, "", 0, ""))


@pytest.mark.parametrize("kind", [["predict"], {"k": 1}], ids=["list", "map"])
def test_an_unhashable_kind_is_rejected_with_decode_error(kind):
    with pytest.raises(DecodeError, match="unknown message kind"):
        unpack(frames_with_header(PROTOCOL_VERSION, kind, "", 0, ""))


@pytest.mark.parametrize("count", [0, 1, 3])
def test_a_wrong_frame_count_is_rejected_naming_the_count(count):
    frames = (pack(Message(PREDICT)) + [b""])[:count]
    with pytest.raises(DecodeError, match=rf"2 frames \(header, payload\), got {count}"):
        unpack(frames)


@pytest.mark.parametrize(
    "frame",
    [
        header(PROTOCOL_VERSION, PREDICT, "", 0),
        header(PROTOCOL_VERSION, PREDICT, "", 0, "", "extra"),
        header(),
        msgpack.packb({"version": PROTOCOL_VERSION}),
        msgpack.packb("predict"),
        msgpack.packb(PROTOCOL_VERSION),
    ],
    ids=["four-fields", "six-fields", "empty-list", "map", "str", "int"],
)
def test_a_header_that_is_not_a_list_of_five_is_rejected(frame):
    with pytest.raises(DecodeError, match=r"header must be a list \[version, kind, agent_id, seq, ct\]"):
        unpack([frame, EMPTY_PAYLOAD])


@pytest.mark.parametrize(
    "frame", [b"\xc1", b"", header(PROTOCOL_VERSION)[:-1] + b"\x95"], ids=["reserved", "empty", "cut"]
)
def test_a_header_that_is_not_msgpack_is_rejected(frame):
    with pytest.raises(DecodeError, match="header is not valid msgpack"):
        unpack([frame, EMPTY_PAYLOAD])


def test_an_oversized_header_is_rejected_before_it_is_parsed():
    frame = header(PROTOCOL_VERSION, PREDICT, "a" * MAX_HEADER_BYTES, 0, "")
    with pytest.raises(DecodeError, match=f"exceeds {MAX_HEADER_BYTES} bytes"):
        unpack([frame, EMPTY_PAYLOAD])


@pytest.mark.parametrize("seq", [-1, 2**63, 2**64 - 1, 1.0, True, "1", None], ids=repr)
def test_a_bad_seq_is_rejected(seq):
    with pytest.raises(DecodeError, match="seq must be a non-negative 64-bit int"):
        unpack(frames_with_header(PROTOCOL_VERSION, PREDICT, "", seq, ""))


@pytest.mark.parametrize(
    "value", ["x" * (MAX_NAME_CHARS + 1), 5, None, b"agent"], ids=["too-long", "int", "none", "bytes"]
)
@pytest.mark.parametrize("field", ["agent_id", "ct"])
def test_a_bad_agent_id_or_ct_is_rejected_naming_the_field(field, value):
    fields = {"agent_id": "", "ct": ""} | {field: value}
    with pytest.raises(DecodeError, match=f"header {field} must be a str of at most {MAX_NAME_CHARS} characters"):
        unpack(frames_with_header(PROTOCOL_VERSION, PREDICT, fields["agent_id"], 0, fields["ct"]))


@pytest.mark.parametrize("payload", [[1, 2], "text", 3, None], ids=repr)
def test_a_payload_that_is_not_a_map_is_rejected(payload):
    with pytest.raises(DecodeError, match="payload must be a map"):
        unpack([header(PROTOCOL_VERSION, PREDICT, "", 0, ""), encode(payload)])


def test_a_payload_that_is_not_msgpack_is_rejected():
    with pytest.raises(DecodeError, match="not a valid msgpack message"):
        unpack([header(PROTOCOL_VERSION, PREDICT, "", 0, ""), b"\xc1"])


def test_an_oversized_payload_is_rejected_naming_the_limit():
    frames = pack(Message(PREDICT, {"obs": np.zeros(256, np.float32)}))
    size = len(frames[1])
    assert unpack(frames, max_bytes=size).kind == PREDICT
    with pytest.raises(DecodeError, match=f"message of {size} bytes exceeds the limit of {size - 1} bytes"):
        unpack(frames, max_bytes=size - 1)
