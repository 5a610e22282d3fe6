"""Shared fixtures."""

from __future__ import annotations

import os
import signal

import pytest
from process_token import processes_started_here


@pytest.fixture
def no_leftover_processes():
    """Fails the test if any process it started is still running when it ends (and kills those)."""
    yield
    leftovers = processes_started_here()
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not leftovers, "processes left running after the test:\n" + "\n".join(
        f"{pid}: {command[:300]}" for pid, command in leftovers.items()
    )
