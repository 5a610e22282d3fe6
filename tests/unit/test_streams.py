"""Unix streams between the compute process and local agents: framing, limits, back-pressure, a peer that goes."""

from __future__ import annotations

import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from flare2.errors import ConfigError, ReplyTimeoutError
from flare2.runtime.config import AUTO_BUSY_WAIT_US, busy_wait_us
from flare2.wire.protocol import HELLO, PREDICT, Message, pack, unpack
from flare2.wire.sockets import Requester
from flare2.wire.stream_bytes import OversizeError, StreamDecoder, stream_chunks
from flare2.wire.streams import StreamClient, StreamServer, make_socket_dir, remove_stale_socket_dirs

LIMIT = 64 * 1024


def message(seq: int, payload: dict | None = None, agent: str = "a") -> list[bytes]:
    return pack(Message(PREDICT, payload if payload is not None else {"n": seq}, agent, seq, "RL"))


class Echo:
    """A StreamServer that answers each message with itself, drained in the test's thread as the compute loop would."""

    def __init__(self, path: str, max_bytes: int = LIMIT) -> None:
        self.received: list[list[bytes]] = []
        self.echo = True
        self.server = StreamServer(path, max_bytes=max_bytes, receive=self._receive)

    def _receive(self, connection, frames, now) -> None:
        self.received.append(frames)
        if self.echo:
            connection.send(frames)

    def pump(self, until, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while not until():
            if time.monotonic() > deadline:
                return False
            ready, _, _ = select.select([self.server], [], [], 0.05)
            if ready:
                self.server.drain(time.monotonic())
        return True


@pytest.fixture
def echo(tmp_path):
    server = Echo(str(tmp_path / "s"))
    yield server
    server.server.close()


def test_the_decoder_reassembles_messages_cut_anywhere_and_several_in_one_chunk():
    messages = [message(seq, {"x": "y" * seq}) for seq in range(1, 6)]
    stream = b"".join(b"".join(stream_chunks(frames)) for frames in messages)
    for cut in range(1, len(stream)):
        decoder = StreamDecoder(LIMIT)
        assert decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) == messages
    byte_by_byte = StreamDecoder(LIMIT)
    assert [m for i in range(len(stream)) for m in byte_by_byte.feed(stream[i : i + 1])] == messages


def test_the_decoder_refuses_a_message_announced_above_the_limit_before_buffering_it():
    with pytest.raises(OversizeError, match=f"a {LIMIT + 1}-byte payload, more than the limits of 4096 and {LIMIT}"):
        StreamDecoder(LIMIT).feed(struct.pack("<II", 10, LIMIT + 1))
    with pytest.raises(OversizeError):
        StreamDecoder(LIMIT).feed(struct.pack("<II", 1 << 20, 10))


def test_a_requester_on_a_unix_endpoint_gets_its_replies_over_the_stream(echo):
    requester = Requester(None, echo.server.endpoint, identity="a", max_bytes=LIMIT)
    try:
        seqs = [requester.send_request(PREDICT, {"n": n}) for n in range(3)]
        replies = {}

        def all_back() -> bool:
            for seq in seqs:
                if seq not in replies:
                    try:
                        replies[seq] = requester.wait_reply(seq, timeout_s=0.001, what="echo")
                    except ReplyTimeoutError:
                        pass
            return len(replies) == 3

        assert echo.pump(all_back)
        assert [replies[seq].payload for seq in seqs] == [{"n": 0}, {"n": 1}, {"n": 2}]
    finally:
        requester.close()


def test_a_message_above_the_limit_closes_only_its_connection_and_is_counted(echo):
    dropped = []
    echo.server._on_drop = lambda: dropped.append(1)
    hostile = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hostile.connect(echo.server.endpoint.removeprefix("unix://"))
    good = StreamClient(echo.server.endpoint, max_bytes=LIMIT)
    try:
        hostile.sendall(struct.pack("<II", 16, LIMIT + 1) + b"\0" * 64)
        assert echo.pump(lambda: echo.server.dropped == 1)
        assert dropped == [1]
        hostile.settimeout(5)
        assert hostile.recv(1) == b"", "the server closes the connection it cannot read on from"
        good.send(message(1))
        arrived = []
        assert echo.pump(lambda: arrived.append(good.receive(0)) or arrived[-1] is not None)
        assert unpack(arrived[-1]).seq == 1
    finally:
        hostile.close()
        good.close()


def test_replies_that_do_not_fit_wait_for_the_reader_and_arrive_whole_and_in_order(tmp_path):
    echo = Echo(str(tmp_path / "s"), max_bytes=1 << 20)
    client = StreamClient(echo.server.endpoint, max_bytes=1 << 20)
    try:
        count = 40  # 2.4 MB: far more than the socket buffers hold while the agent does not read
        for seq in range(1, count + 1):
            client.send(message(seq, {"blob": b"x" * 60_000}))
            assert echo.pump(lambda: len(echo.received) == seq)
        connection = next(iter(echo.server._connections.values()))
        assert connection.unsent, "the replies all fitted at once: the test sends too little"
        seqs = []

        def all_read() -> bool:
            frames = client.receive(0)
            if frames is not None:
                seqs.append(unpack(frames, max_bytes=1 << 20).seq)
            return len(seqs) == count

        assert echo.pump(all_read)
        assert seqs == list(range(1, count + 1))
        assert echo.server.dropped == 0
    finally:
        client.close()
        echo.server.close()


def test_a_peer_that_leaves_its_replies_unread_past_the_bound_loses_its_connection(echo):
    client = StreamClient(echo.server.endpoint, max_bytes=LIMIT)
    try:
        for seq in range(1, 200):
            client.send(message(seq, {"blob": b"x" * (LIMIT - 100)}))
            echo.pump(lambda: len(echo.received) == seq or echo.server.dropped, timeout_s=1)
            if echo.server.dropped:
                break
        assert echo.server.dropped == 1
        assert not echo.server._connections
    finally:
        client.close()


def test_a_send_that_finds_the_stream_full_services_the_manager_link_and_an_error_there_ends_the_stream(tmp_path):
    server = Echo(str(tmp_path / "s"))  # never drained: nothing is read
    serviced = []

    def service() -> None:
        serviced.append(1)
        if len(serviced) == 3:
            raise KeyboardInterrupt("stop requested")

    client = StreamClient(server.server.endpoint, max_bytes=LIMIT, on_blocked=service, blocked_every_s=0.01)
    try:
        with pytest.raises(KeyboardInterrupt):
            for seq in range(1, 1000):
                client.send(message(seq, {"blob": b"x" * (LIMIT - 100)}))
        assert len(serviced) == 3
        # Half a message went out: the stream ends, and later sends do nothing rather than corrupt it.
        client.send(message(1))
        assert client.receive(0) is None
    finally:
        client.close()
        server.server.close()


def test_after_the_compute_process_closes_the_stream_a_wait_times_out_instead_of_spinning(tmp_path):
    server = Echo(str(tmp_path / "s"))
    server.echo = False
    requester = Requester(None, server.server.endpoint, identity="a", max_bytes=LIMIT, busy_wait_s=0.001)
    try:
        seq = requester.send_request(HELLO, {})
        assert server.pump(lambda: server.received)
        server.server.close()
        started, cpu_started = time.monotonic(), time.process_time()
        with pytest.raises(ReplyTimeoutError, match="within 0.5s"):
            requester.wait_reply(seq, timeout_s=0.5, what="hello", idle_every_s=0.05, on_idle=lambda: None)
        assert time.monotonic() - started < 3
        assert time.process_time() - cpu_started < 0.25, "the wait on a closed stream kept a core busy"
    finally:
        requester.close()


def test_an_unreachable_stream_is_named_in_the_error(tmp_path):
    with pytest.raises(Exception, match=f"cannot reach the compute process at unix://{tmp_path}/nothing"):
        StreamClient(f"unix://{tmp_path}/nothing", max_bytes=LIMIT)
    with pytest.raises(ConfigError, match="is not a unix://PATH endpoint"):
        StreamClient("tcp://127.0.0.1:1", max_bytes=LIMIT)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_a_process_of_another_user_is_refused():
    directory = tempfile.mkdtemp()
    os.chmod(directory, 0o755)
    path = os.path.join(directory, "s")
    server = Echo(path)
    try:
        os.chmod(path, 0o777)
        code = (
            "import os, socket, sys\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(sys.argv[1]); s.settimeout(10)\n"
            "sys.exit(0 if s.recv(1) == b'' else 1)\n"
        )
        child = subprocess.Popen([sys.executable, "-c", code, path])
        assert server.pump(lambda: server.server.dropped == 1)
        assert child.wait(timeout=30) == 0, "the foreign peer's connection was not closed"
    finally:
        server.server.close()
        os.unlink(path)
        os.rmdir(directory)


def test_the_busy_wait_is_on_only_while_the_busy_processes_fit_the_cores():
    cores = len(os.sched_getaffinity(0))
    assert busy_wait_us(None, cores) == AUTO_BUSY_WAIT_US
    assert busy_wait_us(None, cores + 1) == 0
    assert busy_wait_us(0, 1) == 0
    assert busy_wait_us(50, cores + 8) == 50


def _bound_socket(path: str, listening: bool) -> socket.socket | None:
    """A Unix socket file at ``path``: with a listener that stays (returned), or left behind by a closed one."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    if listening:
        sock.listen(1)
        return sock
    sock.close()
    return None


def test_a_new_run_removes_the_socket_folders_of_killed_runs_and_leaves_every_live_one():
    # A short root: a socket's path must fit in 108 bytes, which pytest's tmp_path under xdist can pass.
    with tempfile.TemporaryDirectory(prefix="f2-") as root:
        _remove_the_stale_folders_in(Path(root))


def _remove_the_stale_folders_in(root: Path) -> None:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    killed = root / f"flare2-{dead_pid}-killed"
    restarted = killed / "restart1"
    restarted.mkdir(parents=True)
    _bound_socket(str(killed / "ct0-predict"), listening=False)
    _bound_socket(str(restarted / "ct0-predict"), listening=False)
    live = root / f"flare2-{os.getpid()}-live"
    live.mkdir()
    _bound_socket(str(live / "ct0-predict"), listening=False)
    # A manager this pid namespace cannot see: its pid looks dead here, but its compute process answers.
    hidden = root / f"flare2-{dead_pid}-hidden"
    (hidden / "restart1").mkdir(parents=True)
    listener = _bound_socket(str(hidden / "restart1" / "ct0-predict"), listening=True)
    not_a_run = root / f"flare2-{dead_pid}"
    not_a_run.mkdir()

    remove_stale_socket_dirs(str(root))

    assert listener is not None
    listener.close()
    assert sorted(path.name for path in root.iterdir()) == sorted([live.name, hidden.name, not_a_run.name])


def test_a_runs_socket_folder_is_private_and_named_after_its_manager():
    folder = make_socket_dir()
    try:
        assert os.path.basename(folder).startswith(f"flare2-{os.getpid()}-")
        assert os.stat(folder).st_mode & 0o777 == 0o700
    finally:
        os.rmdir(folder)
