"""The learners' process group (``--learners N``): how they meet, and how the first one shares with the others.

The learners meet through torch.distributed's TCP rendezvous at an address the
first learner's machine listens on (its store), as ``torchrun`` does: loopback
when they all run beside the compute process, the run's advertised address
when some join from other machines (``--remote-learners``, ``flare2 learn``).
The group's traffic (the rendezvous, gloo or NCCL) is torch.distributed's own:
neither encrypted nor authenticated, so learners on other machines belong on a
network the run trusts.

Only the first learner hears from the compute process. It hands each request
on to the others over the group (:func:`broadcast_bytes`) and gathers their
answers (:func:`gather_bytes`), as bytes of flare2's codec, never pickle; at
the start it shares its weights and the checkpoints of a resumed run, so a
learner on another machine needs nothing from that machine's disk. Bytes
always cross a gloo group (on GPUs, one made beside the NCCL group of the
gradients), since NCCL moves GPU tensors only.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from datetime import timedelta
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from flare2.errors import ConfigError, TransportError

IDLE_BROADCAST_S = 5.0
"""While no request comes, the first learner tells the others so this often: a collective that waits longer than
the group's timeout fails, and the others wait in one between requests."""
_SIOCGIFADDR = 0x8915


def rendezvous_host(rendezvous: str) -> tuple[str, int]:
    """HOST and PORT of a ``tcp://HOST:PORT`` rendezvous; a ConfigError otherwise."""
    parts = urlsplit(rendezvous)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or port is None:
        raise ConfigError(f"the learners' rendezvous must look like tcp://HOST:PORT, got {rendezvous!r}")
    return parts.hostname, port


def interface_towards(host: str, port: int) -> str | None:
    """The name of this machine's network interface that reaches ``host`` (None when it cannot be told).

    gloo and NCCL otherwise pick the interface of the machine's host name, which on a machine with several (or in
    a container) is often one the other learners cannot reach."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))  # a UDP connect sends nothing: it only picks the route
            local = probe.getsockname()[0]
    except OSError:
        return None
    if ipaddress.ip_address(local).is_loopback:
        return "lo"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as query:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(query.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue  # an interface without an IPv4 address
            if socket.inet_ntoa(answer[20:24]) == local:
                return name
    return None


def join(
    rendezvous: str, rank: int, learners: int, *, device: str, rendezvous_timeout_s: float, timeout_s: float
) -> dist.ProcessGroup:
    """Join the learners' process group as ``rank``; returns the gloo group requests and answers cross, whose
    collectives wait ``timeout_s`` for a learner that does not answer.

    A rendezvous that does not answer, or learners that do not all come, end in a TransportError naming what to do
    within ``rendezvous_timeout_s``."""
    host, port = rendezvous_host(rendezvous)
    interface = interface_towards(host, port)
    if interface is not None:
        # A user's own choice wins.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    on_gpu = device.startswith("cuda")
    if on_gpu:
        # NCCL's collectives run on the current device: each learner's own GPU, not cuda:0 for all.
        torch.cuda.set_device(device)
    try:
        # The store is where the learners meet: its wait for all of them is the rendezvous's, shorter than the
        # collectives' where a group re-forms without knowing whether its learners elsewhere are still there.
        store = dist.TCPStore(
            host,
            port,
            world_size=learners,
            is_master=rank == 0,
            timeout=timedelta(seconds=rendezvous_timeout_s),
            wait_for_workers=True,
        )
        dist.init_process_group(
            "nccl" if on_gpu else "gloo",
            store=store,
            rank=rank,
            world_size=learners,
            timeout=timedelta(seconds=timeout_s),
        )
    except (RuntimeError, TimeoutError) as exc:  # torch raises DistStoreError and friends, all RuntimeErrors
        waited = f"{rendezvous_timeout_s:.0f}s"
        if rank == 0:
            raise TransportError(
                f"not all {learners} learners joined the process group at {rendezvous} within {waited} "
                "(--startup-timeout; --heartbeat-timeout in a group re-formed with the learners it had): start the "
                "learners of --remote-learners on their machines with `flare2 learn MANAGER_ENDPOINT --keys DIR` "
                f"({type(exc).__name__}: {exc})"
            ) from None
        raise TransportError(
            f"the learners' process group at {rendezvous} did not take in learner {rank} within {waited}: "
            f"check that this machine reaches {host} on TCP port {port} (a firewall, the run's --advertise) and that "
            f"the run is still waiting for its learners ({type(exc).__name__}: {exc})"
        ) from None
    group = dist.new_group(backend="gloo") if on_gpu else dist.group.WORLD
    if group is None:
        raise RuntimeError("torch.distributed made no process group")
    return group


def broadcast_bytes(data: bytes | None, group: dist.ProcessGroup) -> bytes:
    """The first learner's ``data`` on every learner (the others pass None)."""
    size = torch.tensor([0 if data is None else len(data)], dtype=torch.int64)
    dist.broadcast(size, src=0, group=group)
    if data is None:
        buffer = torch.empty(int(size.item()), dtype=torch.uint8)
    else:
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.broadcast(buffer, src=0, group=group)
    return buffer.numpy().tobytes()


def gather_bytes(data: bytes, group: dist.ProcessGroup) -> list[bytes]:
    """Every learner's ``data``, in rank order, on every learner."""
    count = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(count)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=group)
    longest = max(int(size.item()) for size in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    if data:
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = [torch.empty(longest, dtype=torch.uint8) for _ in range(count)]
    dist.all_gather(gathered, padded, group=group)
    return [tensor[: int(size.item())].numpy().tobytes() for tensor, size in zip(gathered, sizes)]


def broadcast_tensors(tensors: list[torch.Tensor]) -> None:
    """The first learner's values of ``tensors`` (weights: on the learners' devices) on every learner."""
    for tensor in tensors:
        dist.broadcast(tensor.data, src=0)
