"""Every process a test session starts carries a token in its environment, so leftovers can be found."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

PROCESS_TOKEN_VAR = "FLARE2_TEST_PROCESS_TOKEN"
# Children inherit the environment, so every process started from this session carries the token. Each pytest
# process draws its own, even one started by another (a worker of ``pytest -n``), so that it never takes the
# processes of tests running beside it for its own leftovers.
os.environ[PROCESS_TOKEN_VAR] = uuid.uuid4().hex
_TOKEN = f"{PROCESS_TOKEN_VAR}={os.environ[PROCESS_TOKEN_VAR]}".encode()


def processes_started_here() -> dict[int, str]:
    """Live processes (other than this one) whose environment carries this session's token: PID -> command line.

    Leaves out the resource tracker multiprocessing starts for this process the first time a test spawns a child
    here: it lives as long as the test session by design, and ends with it."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if _TOKEN not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile, or a zombie
            continue
        if parent == os.getpid() and "multiprocessing.resource_tracker" in command:
            continue
        found[int(entry.name)] = command
    return found
