"""Start a real run as a child process and follow its log, without sleeping to synchronise."""

from __future__ import annotations

import csv
import math
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CARTPOLE = REPO / "examples" / "cartpole_a2c.py"
_WITH_SIGHUP_AT_DEFAULT = (
    "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"
)
"""Runs start as from a terminal, SIGHUP at its default, even in a test session that inherited it ignored (started
under nohup): a run keeps SIGHUP ignored where it found it so."""


class RunProcess:
    """A manager script running in a child process; its stderr is read line by line as it comes."""

    def __init__(self, script: Path, *args: str, log_dir: Path, cwd: Path = REPO, prefix: tuple[str, ...] = ()) -> None:
        """Run a manager script; ``prefix`` goes before the interpreter (``ip netns exec HOST``)."""
        self.log_dir = log_dir
        self._start([*prefix, sys.executable, str(script), "--log-dir", str(log_dir), *args], cwd)

    @classmethod
    def command(cls, argv: list[str], cwd: Path = REPO) -> RunProcess:
        """Any other command, followed the same way."""
        run = cls.__new__(cls)
        run.log_dir = None
        run._start(argv, cwd)
        return run

    def _start(self, argv: list[str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WITH_SIGHUP_AT_DEFAULT, *argv],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def wait_for_line(self, pattern: str, timeout_s: float) -> str:
        """The next stderr line matching ``pattern``; fails the test if none comes in time."""
        deadline = time.monotonic() + timeout_s
        regex = re.compile(pattern)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no log line matching {pattern!r} within {timeout_s}s:\n{self.text[-4000:]}")
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"the run ended before a line matching {pattern!r}:\n{self.text[-4000:]}")
            if regex.search(line):
                return line

    def wait(self, timeout_s: float) -> int:
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the run did not end within {timeout_s}s:\n{self.text[-4000:]}") from None
        self._reader.join(timeout=10)
        return code

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        """Kill the manager if a test failed half-way (its children die with it)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=10)


def read_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's CSV file, numbers as floats (the names, episodes.csv's team and cts.csv's ct, as they are)."""
    with open(path, newline="") as file:
        return [{key: _number_or_name(key, value) for key, value in row.items()} for row in csv.DictReader(file)]


def _number_or_name(key: str, value: str) -> Any:
    return value if key in ("team", "ct") else float(value)


def finite(values) -> list[float]:
    return [value for value in values if not math.isnan(value)]


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The command name (field 2) may hold spaces; the parent pid follows its closing parenthesis.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def agent_pids(manager_pid: int) -> list[int]:
    return _children_running(manager_pid, b"flare2.runtime.agents.agent_process")


def compute_pid(manager_pid: int) -> int:
    """The compute process of a run (the manager's child named flare2-compute; a spare is named flare2-spare)."""
    pids = [pid for pid in children_of(manager_pid) if process_name(pid) == "flare2-compute"]
    assert len(pids) == 1, f"expected one compute process among the manager's children, found {pids}"
    return pids[0]


def learner_pids(parent_pid: int) -> list[int]:
    """The learner processes of a compute process or of ``flare2 learn`` (named flare2-learner-RANK)."""
    return [pid for pid in children_of(parent_pid) if process_name(pid).startswith("flare2-learner")]


def process_name(pid: int) -> str:
    """The name a process gave itself (``/proc/PID/comm``); empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _children_running(manager_pid: int, marker: bytes) -> list[int]:
    pids = []
    for pid in children_of(manager_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            pids.append(pid)
    return pids


def wait_until_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait (on pidfds, no polling loop) until every process in ``pids`` has exited; returns those still alive."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    try:
        while fds:
            ready, _, _ = select.select(list(fds), [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for fd in ready:
                os.close(fd)
                del fds[fd]
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


def train(script: str, log_dir: Path, *args: str, timeout_s: float = 1800) -> list[dict[str, float]]:
    """Run examples/<script> with its default agents and envs on the CPU to its end; its progress.csv rows.

    Every example plays 8 envs by default (one agent process of 8 envs for A2C and PPO, 8 one-env agents for
    the others), so these are the figures of the README's commands. Fails the test if the run fails.
    """
    return _run_to_end([str(REPO / "examples" / script)], log_dir, args, timeout_s)


def flare2_train(algo: str, env: str, log_dir: Path, *args: str, timeout_s: float = 1800) -> list[dict[str, float]]:
    """Run ``flare2 train --algo ALGO --env ENV`` (the package's preset for the env) on the CPU to its end; its
    progress.csv rows. Fails the test if the run fails."""
    return _run_to_end(["-m", "flare2.cli", "train", "--algo", algo, "--env", env], log_dir, args, timeout_s)


def _run_to_end(command: list[str], log_dir: Path, args: tuple[str, ...], timeout_s: float) -> list[dict[str, float]]:
    result = subprocess.run(
        [sys.executable, *command, "--device", "cpu", "--log-dir", str(log_dir), *args],
        cwd=log_dir,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return read_csv(log_dir / "progress.csv")


def first_row_reaching(
    rows: list[dict[str, float]], column: str, threshold: float, budget_steps: int
) -> dict[str, float]:
    """The first row whose ``column`` reached ``threshold``; fails the test unless it came before ``budget_steps``."""
    reached = [row for row in rows if finite([row[column]]) and row[column] >= threshold]
    best = max(finite(row[column] for row in rows), default=float("nan"))
    assert reached, f"{column} never reached {threshold} (best {best} in {rows[-1]['env_steps']:.0f} env steps)"
    assert reached[0]["env_steps"] < budget_steps, (
        f"{column} reached {threshold} only at {reached[0]['env_steps']:.0f} steps"
    )
    return reached[0]
