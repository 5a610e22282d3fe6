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

It also adds up the CPU time of the tree and what the rest of the machine
used meanwhile (all busy CPU time in /proc/stat less the tree's and this
process's own): a benchmark run on a shared machine can then tell whether
others competed with it for the cores. ``cpus`` pins the tree to some cores
(its processes inherit the affinity); "the rest of the machine" is then what
else ran on those cores, so several pinned runs can share a machine.

Linux only (/proc); standard library only.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

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
    # CPU seconds (user + system) of the tree's processes, as last sampled (up to ~0.1 s each left out).
    cpu_s: float = 0.0
    # CPU seconds the rest of the machine used while the command ran (neither the tree nor this process).
    others_cpu_s: float = 0.0


class MeasureTimeout(TimeoutError):
    """The command ran past its time limit; its whole process tree was killed."""


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, int, str, int]]:
    """pid -> (ppid, session id, state, CPU ticks used) of every process, read from /proc/*/stat."""
    table: dict[int, tuple[int, int, str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as file:
                stat = file.read()
        except OSError:  # gone meanwhile
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 13:
            ppid, sid, utime, stime = int(fields[1]), int(fields[3]), int(fields[11]), int(fields[12])
            table[int(entry.name)] = (ppid, sid, fields[0].decode(), utime + stime)
    return table


def _tree(root: int) -> dict[int, tuple[str, int]]:
    """pid -> (state, CPU ticks) of root, its descendants, and the rest of its session (zombies included)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    found = {root} | {pid for pid, (_, sid, *_) in table.items() if sid == root}
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return {pid: (table[pid][2], table[pid][3]) for pid in found if pid in table}


def tree_pids(root: int) -> set[int]:
    """The live, non-zombie processes of root's tree: root, its descendants, and the rest of its session.

    The session catches descendants whose parent died before them (re-parented to init); start the
    command with start_new_session=True so that its session is its own.
    """
    return {pid for pid, (state, _) in _tree(root).items() if state != "Z"}


def machine_busy_s(cpus: Collection[int] | None = None) -> float:
    """CPU seconds the cores (all, or those numbered in ``cpus``) have spent busy since boot (/proc/stat: all but
    idle and iowait)."""
    wanted = None if cpus is None else {f"cpu{cpu}" for cpu in cpus}
    busy = 0
    with open("/proc/stat") as file:
        for line in file:
            name, *fields = line.split()
            if (name == "cpu") if wanted is None else (name in wanted):
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
                busy += user + nice + system + irq + softirq + steal
    return busy * _TICK_S


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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


def _pinned(command: list[str], cpus: Collection[int]) -> list[str]:
    """``command`` started by a python that first pins itself to ``cpus`` (inherited by all it starts), then
    becomes the command: no preexec_fn, which is unsafe in a process with threads."""
    cores = ", ".join(str(int(cpu)) for cpu in cpus)
    pin = f"import os, sys; os.sched_setaffinity(0, {{{cores}}}); os.execvp(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", pin, *command]


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
    cpus: Collection[int] | None = None,
    stop: threading.Event | None = None,
) -> Measured:
    """Run command to exit in its own session; return its exit code, wall time and the peak RSS of its tree.

    stdout and stderr go to temporary files, not pipes, so a chatty child never blocks on a full
    pipe. Past timeout_s the whole tree is killed and MeasureTimeout is raised. Processes of the tree
    still alive exit_grace_s after the command exited are killed and named in leftover_pids. Whatever
    happens, nothing of the tree is left running when this returns or raises. With ``cpus`` the tree runs on
    those cores alone, and others_cpu_s counts what else ran on them. Setting ``stop`` (from another thread) kills
    the tree as a timeout does, and MeasureTimeout says it was stopped.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        busy_before, own_before = machine_busy_s(cpus), _own_cpu_s()
        start = time.monotonic()
        proc = subprocess.Popen(
            command if cpus is None else _pinned(command, cpus),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        peak = 0
        cpu_ticks: dict[int, int] = {}  # the most each process of the tree was seen to have used
        timed_out = threading.Event()
        exited = threading.Event()

        def sample() -> None:
            # A thread, so that the main thread can block in wait() and note the exit time exactly.
            nonlocal peak
            while not exited.is_set():
                tree = _tree(proc.pid)
                for pid, (_, ticks) in tree.items():
                    cpu_ticks[pid] = max(ticks, cpu_ticks.get(pid, 0))
                peak = max(peak, sum(rss_bytes(pid) for pid, (state, _) in tree.items() if state != "Z"))
                if time.monotonic() - start > timeout_s or (stop is not None and stop.is_set()):
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
            busy_s = machine_busy_s(cpus) - busy_before
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
            why = "was stopped" if stop is not None and stop.is_set() else f"ran past its {timeout_s:g} s limit"
            raise MeasureTimeout(f"{' '.join(command)} {why} and was killed; its stderr ended with:\n{tail}")
        cpu_s = sum(cpu_ticks.values()) * _TICK_S
        # This process's own CPU counts as others' on pinned cores it may have run on: it cannot be told apart there.
        own_s = _own_cpu_s() - own_before if cpus is None else 0.0
        others_cpu_s = max(0.0, busy_s - cpu_s - own_s)
        return Measured(
            returncode, wall_s, peak, _read_text(out), _read_text(err), tuple(sorted(leftovers)), cpu_s, others_cpu_s
        )


if __name__ == "__main__":
    import json

    result = run_measured(sys.argv[1:], timeout_s=float(os.environ.get("PROCTREE_TIMEOUT_S", "3600")))
    print(
        json.dumps(
            {
                "returncode": result.returncode,
                "wall_s": round(result.wall_s, 3),
                "peak_rss_mb": round(result.peak_rss_bytes / 2**20, 1),
                "cpu_s": round(result.cpu_s, 2),
                "others_cpu_s": round(result.others_cpu_s, 2),
                "leftover_pids": list(result.leftover_pids),
            }
        )
    )
    sys.exit(result.returncode)
