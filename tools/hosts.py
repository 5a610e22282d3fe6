"""Hosts made of network namespaces: host A holds a bridge at 10.231.N.1, hosts B and C a veth link to it each
(10.231.N.2 and .3). Making them needs root and iproute2 (``HostsUnavailable`` otherwise). Used by the two-host
tests and by ``tools/chaos.py --hosts``.

    from hosts import three_hosts
    with three_hosts(subnet=7) as hosts:
        subprocess.run(hosts.run_in(hosts.b, "ping", "-c1", hosts.address[hosts.a]))
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from collections.abc import Iterator


class HostsUnavailable(RuntimeError):
    """This machine cannot make network namespaces (not root, no iproute2, a container that forbids them)."""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Hosts:
    """Namespace names and addresses, and the veth end each remote host's link can be cut at."""

    def __init__(self, tag: str, subnet: int) -> None:
        self.a, self.b, self.c = f"fl2a{tag}", f"fl2b{tag}", f"fl2c{tag}"
        self.address = {host: f"10.231.{subnet}.{last}" for host, last in ((self.a, 1), (self.b, 2), (self.c, 3))}
        self.bridge = f"fl2br{tag}"
        # veth pairs: (end in A, end in the remote host)
        self.links = {self.b: (f"fl2ab{tag}", f"fl2b{tag}v"), self.c: (f"fl2ac{tag}", f"fl2c{tag}v")}

    def cut(self, up: bool) -> None:
        """Both links: B's at B's end (B has no route to A meanwhile), C's at A's end (C's packets are lost)."""
        self.cut_link(self.b, up)
        self.cut_link(self.c, up)

    def cut_link(self, host: str, up: bool) -> None:
        """The link of B (at B's end) or of C (at A's end) down (``up`` False) or up again."""
        state = "up" if up else "down"
        if host == self.b:
            ip("-n", self.b, "link", "set", self.links[self.b][1], state)
        else:
            ip("-n", self.a, "link", "set", self.links[self.c][0], state)

    def run_in(self, host: str, *command: str) -> list[str]:
        """A command line that runs ``command`` on ``host``."""
        return ["ip", "netns", "exec", host, *command]


@contextlib.contextmanager
def three_hosts(subnet: int) -> Iterator[Hosts]:
    """Hosts A, B and C; every process left in them is killed and the namespaces deleted at the end."""
    made = Hosts(secrets.token_hex(3), subnet)
    try:
        subprocess.run(["ip", "netns", "add", made.a], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.CalledProcessError) as exc:
        reason = exc.stderr.decode().strip() if isinstance(exc, subprocess.CalledProcessError) else str(exc)
        raise HostsUnavailable(f"cannot make network namespaces here: {reason}") from None
    try:
        ip("-n", made.a, "link", "add", made.bridge, "type", "bridge")
        ip("-n", made.a, "addr", "add", f"{made.address[made.a]}/24", "dev", made.bridge)
        ip("-n", made.a, "link", "set", made.bridge, "up")
        ip("-n", made.a, "link", "set", "lo", "up")
        for host in (made.b, made.c):
            end_a, end_host = made.links[host]
            ip("netns", "add", host)
            ip("link", "add", end_a, "type", "veth", "peer", "name", end_host)
            ip("link", "set", end_a, "netns", made.a)
            ip("link", "set", end_host, "netns", host)
            ip("-n", made.a, "link", "set", end_a, "master", made.bridge)
            ip("-n", made.a, "link", "set", end_a, "up")
            ip("-n", host, "addr", "add", f"{made.address[host]}/24", "dev", end_host)
            ip("-n", host, "link", "set", "lo", "up")
            ip("-n", host, "link", "set", end_host, "up")
        yield made
    finally:
        for host in (made.a, made.b, made.c):
            pids = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True, timeout=10).stdout
            for pid in pids.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            subprocess.run(["ip", "netns", "del", host], capture_output=True, timeout=10)
