"""Hosts made of network namespaces (``tools/hosts.py``); the tests that use them skip where they cannot be made."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

import pytest
from tool_modules import load_tool

_hosts = load_tool("hosts")
Hosts = _hosts.Hosts
ip = _hosts.ip

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="making network namespaces needs root and iproute2"
)


@contextlib.contextmanager
def three_hosts(subnet: int) -> Iterator[Hosts]:
    """Hosts A, B and C (see tools/hosts.py); skips the test where they cannot be made."""
    try:
        with _hosts.three_hosts(subnet) as hosts:
            yield hosts
    except _hosts.HostsUnavailable as exc:
        pytest.skip(str(exc))
