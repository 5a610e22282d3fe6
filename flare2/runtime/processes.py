"""Process plumbing shared by the manager, the compute process and agent processes."""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import logging
import multiprocessing
import os
import select
import signal
import sys
from collections.abc import Callable
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, cast

from flare2.errors import ConfigError
from flare2.runtime import exit_codes

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
COMPUTE_IDENTITY = "compute"
"""The compute process's identity on the manager's control socket."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What stops a run: Ctrl+C, SIGTERM, and SIGHUP (the terminal or ssh session it ran in closed)."""


def refuse_start_in_a_spawned_child(what: str) -> None:
    """End this process, with one line that says why, if it is a child that is still importing its parent's main
    module: the spawn start method imports that module again in each child (multiprocessing marks the process while it
    does), so a script that starts a run (``what``) outside ``if __name__ == "__main__":`` would start one more run
    in each process of its own run. The exit code, CONFIG_ERROR, tells the run not to restart the process."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        sys.stderr.write(
            f"flare2: {what} was called again in a process of the run as it started: in a script, call it under "
            '`if __name__ == "__main__":`\n'
        )
        raise SystemExit(exit_codes.CONFIG_ERROR)


def stop_resource_tracker(timeout_s: float) -> None:
    """Stop the resource tracker process and wait up to ``timeout_s`` for it to end.

    multiprocessing starts it, as a child of this process, with the first
    process it spawns (the compute process), and it would end only once this
    process has gone: stopped here, once the processes that share it have
    ended, no process outlives the manager even by a moment. It ends when the
    last spawned process holding its pipe has gone; one that does not go (stuck
    in the kernel, say) must not keep the manager from exiting. Done as the
    tracker's own ``_stop`` does, but with the wait bounded and outside its lock,
    which a later spawn in this process (a second ``flare2.train()``) takes.
    """
    tracker: Any = getattr(resource_tracker, "_resource_tracker", None)
    # Private, so looked up: a Python without them leaves the tracker to end by itself.
    lock = getattr(tracker, "_lock", None)
    if lock is None or not hasattr(tracker, "_fd") or not hasattr(tracker, "_pid"):
        return
    with lock:
        fd, pid = tracker._fd, tracker._pid
        if fd is None:
            return
        os.close(fd)  # the tracker ends once no process holds the other end of its pipe
        tracker._fd = tracker._pid = None
    if pid is not None and not _reaped_within(pid, timeout_s):
        logger.warning(
            "multiprocessing's resource tracker (pid %s) has not ended %.0f s after the run's processes were stopped: "
            "a process the run spawned still holds it; it ends when that process does",
            pid,
            timeout_s,
        )


def _reaped_within(pid: int, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for child ``pid`` to end, and reap it; whether it did."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ended, _, _ = select.select([pidfd], [], [], timeout_s)
        if ended:
            os.waitpid(pid, 0)
        return bool(ended)
    except ChildProcessError:  # reaped elsewhere
        return True
    finally:
        os.close(pidfd)


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux), and check the parent is still there.

    A child must not outlive its manager even when the manager is killed with
    SIGKILL and gets no chance to clean up.
    """
    _signal_at_parent_death(signal.SIGKILL, parent_pid)


def interrupt_at_parent_death(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` for a child that runs a whole flare2 run (a trial of ``flare2 tune``): the kernel sends it
    SIGINT when ``parent_pid`` dies, even by SIGKILL, and it stops as after Ctrl+C, taking its own children along."""
    return functools.partial(_signal_at_parent_death, signal.SIGINT, parent_pid)


def _signal_at_parent_death(signum: int, parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if os.getppid() != parent_pid:  # it died before prctl: no signal will come
        os._exit(1)


def name_process(name: str) -> None:
    """Name this process for ``ps -o comm`` and ``/proc/PID/comm`` (Linux; 15 characters at most) and for its log
    lines: a compute process, a learner and a spare are told apart from outside without reading command lines."""
    multiprocessing.current_process().name = name
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


OWN_PIPE = "flare2.warm_process.own_pipe"
"""In the arguments of a ``WarmProcess``'s work: the child's end of the pipe its work came through, which the work
keeps for talking to its parent (a learner's pipe)."""


class WarmProcess:
    """A spawned process that has done its imports and waits for its work: the compute process a restart needs, and
    its learners, start in milliseconds where a fresh spawn spends a second or more importing torch, all of which a
    compute restart would wait for. ``warm_up`` is the module to import (``package.module``), or a function of it to
    call with ``warm_up_args`` once it is imported (``package.module:function``).

    It dies with its parent, as every child does, leaves the stop signals to its parent (``pass_sigterm_to_parent``),
    and leaves without a word when its parent lets it go (``discard``, or the parent's end of the pipe closing).
    ``daemon``: as ``multiprocessing.Process``'s (a process that starts children of its own cannot be one).
    """

    def __init__(self, warm_up: str, *warm_up_args: Any, daemon: bool = False) -> None:
        self._recipe = (warm_up, warm_up_args, daemon)
        self.pipe, self.process = self._start()

    def _start(self) -> tuple[Connection, BaseProcess]:
        warm_up, warm_up_args, daemon = self._recipe
        spawn = multiprocessing.get_context("spawn")
        pipe, child_end = spawn.Pipe()
        process = spawn.Process(
            target=_wait_for_work,
            args=(child_end, os.getpid(), warm_up, warm_up_args),
            name="flare2-spare",
            daemon=daemon,
        )
        # Started with the stop signals blocked, as the child inherits them: one sent to it while Python starts up
        # waits for its handlers (``_wait_for_work``) instead of killing it. Here they wait the few milliseconds. The
        # resource tracker first: the first spawn starts it, and unblocks SIGINT and SIGTERM as it does.
        resource_tracker.ensure_running()
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        child_end.close()
        return pipe, process

    @property
    def alive(self) -> bool:
        return self.process.exitcode is None

    @property
    def pid(self) -> int:
        return cast(int, self.process.pid)

    def run(self, name: str, target: Callable[..., Any], *args: Any) -> BaseProcess:
        """Give it its work: ``target(*args)`` as process ``name`` (``OWN_PIPE`` among ``args`` becomes its end of
        ``pipe``, which the caller then keeps for the work's talk). One that died as it waited (the out-of-memory
        killer, say) is replaced by a new one, which does the work once its imports are done."""
        work = (name, target, args)
        if self.alive:
            try:
                self.pipe.send(work)
                return self.process
            except OSError:  # it died between the look and the send: its end of the pipe is closed
                pass
        self.discard()
        self.pipe, self.process = self._start()
        self.pipe.send(work)
        return self.process

    def discard(self) -> None:
        """Let it go unused."""
        self.pipe.close()
        self.process.kill()
        self.process.join()


def _wait_for_work(pipe: Connection, parent_pid: int, warm_up: str, warm_up_args: tuple[Any, ...]) -> None:
    die_with_parent(parent_pid)
    pass_sigterm_to_parent()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked since it started (``WarmProcess._start``)
    name_process("flare2-spare")
    module, _, function = warm_up.partition(":")
    loaded = importlib.import_module(module)
    if function:
        getattr(loaded, function)(*warm_up_args)
    try:
        name, target, args = pipe.recv()
    except EOFError:  # let go
        os._exit(0)
    name_process(name)
    args = tuple(pipe if isinstance(arg, str) and arg == OWN_PIPE else arg for arg in args)
    if not any(arg is pipe for arg in args):
        pipe.close()
    try:
        target(*args)
    finally:
        _kill_children_left()


def _kill_children_left() -> None:
    """A process that ends kills what is left of its children (a spare it never took, the learners of a start that
    failed) rather than leave them to multiprocessing's exit, which sends its daemonic children SIGTERM, which they
    hand on to it (``pass_sigterm_to_parent``), and waits for the others."""
    for child in multiprocessing.active_children():
        child.kill()
        child.join()


def ignore_stop_signals() -> None:
    """Ignore the stop signals: a child obeys its owner's STOP instead. The terminal sends Ctrl+C, and SIGHUP as it
    closes, to the whole process group, and `timeout`, Slurm's scancel and systemd send SIGTERM to every process of
    the run; the manager stops its children in order (agents first, then the compute process, which writes the
    checkpoints). An agent process takes SIGTERM back (its owner may be ``flare2 attach``, which stops its agents with
    it); the compute process, its learners and the spares hand it on (``pass_sigterm_to_parent``)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def pass_sigterm_to_parent() -> None:
    """What the compute process, its learners and the spares do with the stop signals: Ctrl+C and SIGHUP are ignored
    (``ignore_stop_signals``), and SIGTERM is handed on to the parent, so that ``kill PID`` of any of them stops the
    run as SIGTERM to the manager does, in order and with its checkpoints. A compute process that died of the signal
    would be restarted and the run's last steps lost."""
    parent = os.getppid()

    def hand_on(signum: int, _frame: Any) -> None:
        if os.getppid() == parent:  # not a pid the parent's death freed for another process
            os.kill(parent, signum)

    # SIGTERM is never set to SIG_IGN on the way: that would drop one already pending (``WarmProcess._start``).
    for signum in STOP_SIGNALS:
        signal.signal(signum, hand_on if signum == signal.SIGTERM else signal.SIG_IGN)


def handle_stop_signals(handler: Any) -> dict[int, Any]:
    """Hand the stop signals to ``handler``, in the main thread (elsewhere the caller handles them); returns the
    handlers before, for ``restore_signal_handlers``. SIGHUP ignored from the start stays ignored: that is how
    ``nohup`` keeps a run alive after its terminal closes."""
    previous: dict[int, Any] = {}
    for signum in STOP_SIGNALS:
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue
        try:
            previous[signum] = signal.signal(signum, handler)
        except ValueError:  # not the main thread
            break
    return previous


def restore_signal_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def import_object(path: str) -> Any:
    """Resolve ``package.module:Name`` or ``path/to/file.py:Name``."""
    module_name, sep, attr = path.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"import path must look like package.module:Name or file.py:Name, got {path!r}")
    try:
        if module_name.endswith(".py"):
            file = Path(module_name)
            if not file.is_file():
                raise ConfigError(f"cannot import {path!r}: no file {file}")
            spec = importlib.util.spec_from_file_location(f"flare2_user_{file.stem}", file)
            if spec is None or spec.loader is None:
                raise ConfigError(f"cannot import {path!r}: {file} is not a Python module (name it NAME.py)")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {path!r}: {exc}. Check the module path and that it is installed") from None
    try:
        value = module
        for part in attr.split("."):
            value = getattr(value, part)
        return value
    except AttributeError:
        raise ConfigError(f"cannot import {path!r}: module {module_name!r} has no attribute {attr!r}") from None


def configure_child_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(processName)s %(name)s %(levelname)s: %(message)s")
