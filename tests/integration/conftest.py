from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_leftover_processes(no_leftover_processes):
    """Every integration test checks that it left no process behind."""
    yield
