"""The flare2 message: a msgpack header frame followed by a payload frame.

Header: ``[protocol_version, kind, agent_id, seq, ct]``. ``agent_id`` names one
incarnation of an agent process ("" for the manager and the compute process),
``seq`` lets a requester match a reply to its request, ``ct`` names the
ComputationTask a predict/learn message is for ("" otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from flare2.errors import DecodeError
from flare2.wire.codec import DEFAULT_MAX_BYTES, decode, encode
from flare2.wire.shared_arrays import SharedArraysReader, SharedArraysWriter

# 2: predictions carry the version of the weights, learn requests the policy version of every step,
# and a predict request marks its greedy rows with an array.
# 3: an agent says when it plays an evaluation episode (EVALUATING on a CT's learn socket).
# 4: ragged arrays (a map of values and lengths where a spec's first dim is None) and the CT's trajectory views.
# 5: agents trade running statistics of their observations with a CT (STATISTICS on its learn socket).
# 6: EVALUATING is gone; a predict request marks the rows of evaluation episodes with an 'evaluation' array (was
# 'greedy'), which says what it means: greedy actions, and no learn requests from an agent whose rows are all marked.
# 7: learn requests carry each observation once (flare2.core.learn_requests) and predict requests each new frame of
# an observation view once (flare2.core.predict_requests).
# 8: the manager's answer to a probe carries the run's id and its agents' recipe; a remote agent's hello says whether
# it rejoins in place of one that lost the manager.
# 9: a probe may ask for learner ranks (``flare2 learn``), answered with the learners' recipe.
# 10: a local stream's messages may hold shared arrays (flare2.wire.shared_arrays); an agent's round-trip histogram
# has 16 buckets an octave (was 4).
PROTOCOL_VERSION = 10
MAX_NAME_CHARS = 128
MAX_HEADER_BYTES = 1024
_MAX_SEQ = 2**63 - 1

HELLO = "hello"  # a peer registers: role, versions, what it needs
WELCOME = "welcome"  # the manager answers a hello: specs, endpoints, settings
PREDICT = "predict"
PREDICTION = "prediction"
LEARN = "learn"
LEARNED = "learned"
STATS = "stats"  # counters and episode results, to the manager
HEARTBEAT = "heartbeat"  # manager -> agents: still here (agents' stats are their heartbeats)
CHECKPOINT = "checkpoint"  # manager -> compute process: save now; the reply says it is done
LIVE = "live"  # manager -> compute process: the live agents of each CT
STOP = "stop"  # manager -> anyone: finish and exit
STATISTICS = "statistics"  # agent <-> CDP: an agent's new observation counts; the reply: the run's merged ones
ERROR = "error"  # a request failed; the payload says why
BYE = "bye"  # a peer leaves on purpose

KINDS = frozenset(
    {
        HELLO,
        WELCOME,
        PREDICT,
        PREDICTION,
        LEARN,
        LEARNED,
        STATISTICS,
        STATS,
        HEARTBEAT,
        CHECKPOINT,
        LIVE,
        STOP,
        ERROR,
        BYE,
    }
)


class VersionMismatchError(DecodeError):
    """The peer speaks another version of the flare2 protocol (the message names both)."""


@dataclass(frozen=True, slots=True)
class Message:
    kind: str
    payload: Any = field(default_factory=dict)
    agent_id: str = ""
    seq: int = 0
    ct: str = ""


def pack(message: Message, *, shared: SharedArraysWriter | None = None) -> list[bytes]:
    """The frames of ``message`` (a ROUTER prepends the peer identity itself); ``shared``: a local stream's block
    for its large arrays."""
    header = msgpack.packb(
        [PROTOCOL_VERSION, message.kind, message.agent_id, message.seq, message.ct], use_bin_type=True
    )
    return [header, encode(message.payload, shared=shared)]


def _decode_header(frame: bytes) -> tuple[str, str, int, str]:
    if len(frame) > MAX_HEADER_BYTES:
        raise DecodeError(f"header of {len(frame)} bytes exceeds {MAX_HEADER_BYTES} bytes")
    try:
        header = msgpack.unpackb(frame, raw=False, use_list=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types for bad input
        raise DecodeError(f"header is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(header, list) or len(header) != 5:
        raise DecodeError("header must be a list [version, kind, agent_id, seq, ct]")
    version, kind, agent_id, seq, ct = header
    if type(version) is not int:
        raise DecodeError("header version is not an int")
    if version != PROTOCOL_VERSION:
        raise VersionMismatchError(
            f"peer speaks flare2 protocol {version}, this side speaks {PROTOCOL_VERSION}: "
            "install the same flare2 version on both sides"
        )
    if not isinstance(kind, str) or kind not in KINDS:
        raise DecodeError(f"unknown message kind {kind!r}")
    if not isinstance(agent_id, str) or len(agent_id) > MAX_NAME_CHARS:
        raise DecodeError("header agent_id must be a str of at most 128 characters")
    if type(seq) is not int or not 0 <= seq <= _MAX_SEQ:
        raise DecodeError("header seq must be a non-negative 64-bit int")
    if not isinstance(ct, str) or len(ct) > MAX_NAME_CHARS:
        raise DecodeError("header ct must be a str of at most 128 characters")
    return kind, agent_id, seq, ct


def unpack(
    frames: list[bytes], *, max_bytes: int = DEFAULT_MAX_BYTES, shared: SharedArraysReader | None = None
) -> Message:
    """Strictly decode the frames of one message (without a ROUTER identity frame); ``shared``: the reader of the
    local stream it came on, whose arrays in the message stay views of its block until ``shared.release(seq)``."""
    if len(frames) != 2:
        raise DecodeError(f"a message has 2 frames (header, payload), got {len(frames)}")
    kind, agent_id, seq, ct = _decode_header(frames[0])
    try:
        payload = decode(frames[1], max_bytes=max_bytes, shared=shared)
        if not isinstance(payload, dict):
            raise DecodeError("payload must be a map")
    except DecodeError:
        if shared is not None:
            shared.finish(None)
        raise
    if shared is not None:
        shared.finish(seq)  # its shared arrays are views of the agent's block until the reply to seq
    return Message(kind=kind, payload=payload, agent_id=agent_id, seq=seq, ct=ct)


LEARNER_LOST = "learner_lost"
"""The code of the compute process's ERROR when it lost a learner: the manager restarts it with a new group."""
REMOTE_LEARNER_LOST = "remote_learner_lost"
"""The same for a learner on another machine (or one that did not join): the new group takes the learners here, and
those of ``flare2 learn`` that come back join a later one."""


def error_payload(reason: str, *, traceback: str = "", code: str = "bad_request") -> dict[str, str]:
    """The payload of an ERROR reply. ``code`` lets the receiver choose an exception type."""
    return {"code": code, "reason": reason, "traceback": traceback}


def error_text(message: Message) -> str:
    """The reason of an ERROR message, with the traceback it carries (for a log line)."""
    text = str(message.payload.get("reason", "no reason given"))
    if message.payload.get("traceback"):
        text += "\n" + str(message.payload["traceback"]).rstrip()
    return text
