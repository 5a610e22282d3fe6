"""Process plumbing shared by the manager, the compute process and agent processes."""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import logging
import os
import signal
import sys
from collections.abc import Callable
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

from flare2.errors import ConfigError

_PR_SET_PDEATHSIG = 1
COMPUTE_IDENTITY = "compute"
"""The compute process's identity on the manager's control socket."""


def stop_resource_tracker() -> None:
    """Stop the resource tracker process and wait for it to end.

    multiprocessing starts it, as a child of this process, with the first
    process it spawns (the compute process), and it would end only once this
    process has gone: stopped here, once the processes that share it have
    ended, no process outlives the manager even by a moment.
    """
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    # Private, so looked up: a Python without it leaves the tracker to end by itself.
    stop = getattr(tracker, "_stop", None)
    if stop is not None:
        stop()


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


def ignore_interrupts() -> None:
    """Children ignore Ctrl+C (the terminal sends it to the whole group) and obey the manager's STOP instead."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


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
