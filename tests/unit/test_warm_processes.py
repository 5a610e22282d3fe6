"""Spare processes (``flare2.runtime.processes.WarmProcess``): they do the work they are given, under its name; one
that died as it waited is replaced; one let go leaves."""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import socket
from multiprocessing.connection import Connection
from pathlib import Path

from runs import process_name

from flare2.runtime.processes import OWN_PIPE, WarmProcess


def write_names(path: str) -> None:
    Path(path).write_text(
        f"{multiprocessing.current_process().name} {process_name(multiprocessing.current_process().pid or 0)}"
    )


def answer_on(pipe: Connection, word: str) -> None:
    pipe.send(word)


def test_a_warm_process_does_its_work_under_the_works_name(tmp_path):
    spare = WarmProcess("json")
    process = spare.run("flare2-test", write_names, str(tmp_path / "names"))
    process.join(60)
    assert process.exitcode == 0
    assert (tmp_path / "names").read_text() == "flare2-test flare2-test"


def test_the_work_may_keep_the_pipe_it_came_through(tmp_path):
    spare = WarmProcess("json")
    process = spare.run("flare2-test", answer_on, OWN_PIPE, "here")
    assert spare.pipe.poll(60) and spare.pipe.recv() == "here"
    process.join(60)
    assert process.exitcode == 0


def test_one_that_died_as_it_waited_is_replaced_by_a_new_one_that_does_the_work(tmp_path):
    spare = WarmProcess("json")
    dead = spare.process
    dead.kill()
    dead.join()
    process = spare.run("flare2-test", write_names, str(tmp_path / "names"))
    process.join(60)
    assert process is not dead and process.exitcode == 0
    assert (tmp_path / "names").read_text().startswith("flare2-test")


def test_one_let_go_leaves():
    spare = WarmProcess("json")
    spare.discard()
    assert spare.process.exitcode is not None


def test_a_sigterm_sent_to_a_spare_as_it_starts_goes_to_its_parent_and_does_not_kill_it():
    # `kill PID` of the compute process or a learner stops the run through the manager; one sent while Python still
    # starts up in the child (before any handler is set) waits for the handler instead of killing it.
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous_handler = signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
    previous_fd = signal.set_wakeup_fd(writer.fileno())  # written by whichever thread the signal lands in
    try:
        spare = WarmProcess("json")
        os.kill(spare.pid, signal.SIGTERM)
        ready, _, _ = select.select([reader], [], [], 60)
        assert ready and reader.recv(1) == bytes([signal.SIGTERM])
        assert spare.alive
        spare.discard()
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGTERM, previous_handler)
        reader.close()
        writer.close()
