"""Spare processes (``flare2.runtime.processes.WarmProcess``): they do the work they are given, under its name; one
that died as it waited is replaced; one let go leaves."""

from __future__ import annotations

import contextlib
import multiprocessing
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
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


@contextlib.contextmanager
def sigterms_received() -> Iterator[socket.socket]:
    """While it lasts, SIGTERM to this process only writes a byte to the socket it gives (whichever thread the signal
    lands in)."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous_handler = signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
    previous_fd = signal.set_wakeup_fd(writer.fileno())
    try:
        yield reader
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGTERM, previous_handler)
        reader.close()
        writer.close()


SIGTERM_AS_THE_FIRST_SPARE_STARTS = """
import os, select, signal, socket
from flare2.runtime.processes import WarmProcess
received, writer = socket.socketpair()
writer.setblocking(False)
signal.signal(signal.SIGTERM, lambda signum, frame: None)
signal.set_wakeup_fd(writer.fileno())
spare = WarmProcess("json")  # the first process it spawns: multiprocessing starts its resource tracker too
os.kill(spare.pid, signal.SIGTERM)
handed_on = select.select([received], [], [], 60)[0] != []
print("handed on" if handed_on else "not handed on", "alive" if spare.alive else "dead")
spare.discard()
"""


def test_a_sigterm_sent_to_a_spare_as_it_starts_goes_to_its_parent_and_does_not_kill_it():
    # `kill PID` of the compute process or a learner stops the run through the manager; one sent while Python still
    # starts up in the child (before any handler is set) waits for the handler instead of killing it. In a process
    # of its own: the first spawn of a process is the one that starts the resource tracker.
    result = subprocess.run(
        [sys.executable, "-c", SIGTERM_AS_THE_FIRST_SPARE_STARTS], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.split() == ["handed", "on", "alive"], result.stderr


def start_a_spare_it_never_takes() -> None:
    global kept_spare
    kept_spare = WarmProcess("json", daemon=True)


def test_work_that_ends_kills_the_children_it_left_instead_of_leaving_them_to_multiprocessings_exit():
    # multiprocessing's exit sends daemonic children SIGTERM and waits for them: a spare would hand the SIGTERM on
    # to its parent, which would hand it on to its own, the manager, which would stop the run.
    with sigterms_received() as received:
        spare = WarmProcess("json")
        process = spare.run("flare2-test", start_a_spare_it_never_takes)
        process.join(60)
        assert process.exitcode == 0
        assert select.select([received], [], [], 0)[0] == []
