"""Run a command and measure it as a whole: wall time to exit and peak RSS of its process tree.

    from proctree import run_measured
    measured = run_measured([sys.executable, "train.py"], timeout_s=600)

A training run of a multi-process system (agent processes, env workers, a
forkserver) spends its memory in many processes, so the peak RSS of the
command alone says little. Every ~0.1 s this sums VmRSS over the command and
every process below it (found through the parent links in /proc/*/stat, plus
any process of its session that was re-parented to init), and keeps the
largest sum. Pages shared between processes (the torch libraries, say) count
once per process, as `ps` and `top` count them; compare such sums between
systems that are built alike, not against a single process's footprint.

Linux only (/proc); standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SAMPLE_INTERVAL_S = 0.1
# After the command exits, how long its leftover descendants get to finish on their own before they are killed.
EXIT_GRACE_S = 0.5


@dataclass(frozen=True)
class Measured:
    """What one command did: how it ended, how long it took, the most memory its process tree held at once."""

    returncode: int
    wall_s: float
    peak_rss_bytes: int
    stdout: str
    stderr: str
    # Processes of its tree still alive after the command exited (and a short grace); they were killed.
    leftover_pids: tuple[int, ...] = ()


class MeasureTimeout(TimeoutError):
    """The command ran past its time limit; its whole process tree was killed."""


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, session id, state) of every live process, read from /proc/*/stat."""
    table: dict[int, tuple[int, int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as file:
                stat = file.read()
        except OSError:  # gone meanwhile
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 4:
            table[int(entry.name)] = (int(fields[1]), int(fields[3]), fields[0].decode())
    return table


def tree_pids(root: int) -> set[int]:
    """The live, non-zombie processes of root's tree: root, its descendants, and the rest of its session.

    The session catches descendants whose parent died before them (re-parented to init); start the
    command with start_new_session=True so that its session is its own.
    """
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found = {root} | {pid for pid, (_, sid, _) in table.items() if sid == root}
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return {pid for pid in found if pid in table and table[pid][2] != "Z"}


def rss_bytes(pid: int) -> int:
    """VmRSS of one process in bytes; 0 when it is gone or a zombie (no VmRSS line)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as file:
            for line in file:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _kill_tree(root: int, wait_s: float = 2.0) -> None:
    """SIGKILL root's process group, then any process of its tree that left the group; wait until they are gone.

    A killed process takes a moment to go (or to turn into a zombie), so this waits up to wait_s for
    that: on return nothing of the tree is still running.
    """
    try:
        os.killpg(root, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + wait_s
    while (alive := tree_pids(root)) and time.monotonic() < deadline:
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _read_text(file) -> str:
    file.seek(0)
    return file.read().decode("utf-8", errors="replace")


def run_measured(
    command: list[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float,
    exit_grace_s: float = EXIT_GRACE_S,
) -> Measured:
    """Run command to exit in its own session; return its exit code, wall time and the peak RSS of its tree.

    stdout and stderr go to temporary files, not pipes, so a chatty child never blocks on a full
    pipe. Past timeout_s the whole tree is killed and MeasureTimeout is raised. Processes of the tree
    still alive exit_grace_s after the command exited are killed and named in leftover_pids. Whatever
    happens, nothing of the tree is left running when this returns or raises.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(
            command, cwd=cwd, env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
        )
        peak = 0
        timed_out = threading.Event()
        exited = threading.Event()

        def sample() -> None:
            # A thread, so that the main thread can block in wait() and note the exit time exactly.
            nonlocal peak
            while not exited.is_set():
                peak = max(peak, sum(rss_bytes(pid) for pid in tree_pids(proc.pid)))
                if time.monotonic() - start > timeout_s:
                    timed_out.set()
                    _kill_tree(proc.pid)
                    return
                exited.wait(SAMPLE_INTERVAL_S)

        sampler = threading.Thread(target=sample, name="proctree-sampler", daemon=True)
        leftovers: set[int] = set()
        try:
            sampler.start()
            returncode = proc.wait()
            wall_s = time.monotonic() - start
            exited.set()
            sampler.join()
            deadline = time.monotonic() + exit_grace_s
            while (leftovers := tree_pids(proc.pid)) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            exited.set()
            if proc.poll() is None or tree_pids(proc.pid):
                _kill_tree(proc.pid)
                proc.wait()
            sampler.join()
        if timed_out.is_set():
            tail = _read_text(err)[-2000:]
            raise MeasureTimeout(
                f"{' '.join(command)} ran past its {timeout_s:g} s limit and was killed; its stderr ended with:\n{tail}"
            )
        return Measured(returncode, wall_s, peak, _read_text(out), _read_text(err), tuple(sorted(leftovers)))


if __name__ == "__main__":
    import json
    import sys

    result = run_measured(sys.argv[1:], timeout_s=float(os.environ.get("PROCTREE_TIMEOUT_S", "3600")))
    print(json.dumps({"returncode": result.returncode, "wall_s": round(result.wall_s, 3),
                      "peak_rss_mb": round(result.peak_rss_bytes / 2**20, 1), "leftover_pids": list(result.leftover_pids)}))
    sys.exit(result.returncode)
