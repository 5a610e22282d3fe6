"""Every process a test session starts carries a token in its environment, so leftovers can be found."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

PROCESS_TOKEN_VAR = "FLARE2_TEST_PROCESS_TOKEN"
# Children inherit the environment, so every process started from this session carries the token.
os.environ.setdefault(PROCESS_TOKEN_VAR, uuid.uuid4().hex)
_TOKEN = f"{PROCESS_TOKEN_VAR}={os.environ[PROCESS_TOKEN_VAR]}".encode()


def processes_started_here() -> list[int]:
    """PIDs of live processes (other than this one) whose environment carries this session's token."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or a zombie
            continue
        if _TOKEN in environ.split(b"\0"):
            found.append(int(entry.name))
    return found
