"""CurveZMQ for runs that listen beyond loopback: key files, allow-list, ZAP.

``flare2 keys DIR`` writes a server key pair, a client key pair and an
allow-list folder::

    DIR/server.key, DIR/server.key_secret      the manager's pair (the secret stays on its machine)
    DIR/client.key, DIR/client.key_secret      a pair for the machines that attach
    DIR/allowed/client.key                     public keys the manager accepts

A manager given ``--keys DIR`` serves CURVE with the server pair and accepts
only the keys in ``DIR/allowed``; ``flare2 attach --keys DIR`` connects with
the client pair and checks the server's public key. A refused peer is logged
and never gets a message through: ZeroMQ drops it during the handshake.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from flare2.errors import ConfigError

logger = logging.getLogger(__name__)

AGENT_CURVE_ENV = "FLARE2_AGENT_CURVE"
"""How a process that starts agents hands them their client keys (public, secret and server public key, z85)."""


@dataclass(frozen=True)
class CurveServer:
    public_key: str
    secret_key: str
    allowed: frozenset[str] = field(default_factory=frozenset)
    """z85 public keys of the clients that may connect."""


@dataclass(frozen=True)
class CurveClient:
    public_key: str
    secret_key: str
    server_public_key: str

    def to_env(self) -> str:
        # z85 keys are 40 characters each and use every separator one might pick, so they are just joined.
        return self.public_key + self.secret_key + self.server_public_key

    @classmethod
    def from_env(cls, value: str) -> CurveClient:
        if len(value) != 120:
            raise ConfigError(f"{AGENT_CURVE_ENV} must hold three z85 keys of 40 characters each, joined")
        return cls(value[:40], value[40:80], value[80:])


def make_keys(directory: str | os.PathLike, client_name: str = "client") -> list[Path]:
    """Write the server pair (unless it exists), a client pair named ``client_name`` and allow it; returns the files."""
    if not client_name.isidentifier():
        raise ConfigError(f"a client key name must be an identifier, got {client_name!r}")
    directory = Path(directory)
    allowed = directory / "allowed"
    allowed.mkdir(parents=True, exist_ok=True)
    written = []
    if not (directory / "server.key_secret").exists():
        written += [Path(p) for p in zmq.auth.create_certificates(directory, "server")]
    if (directory / f"{client_name}.key_secret").exists():
        raise ConfigError(f"{directory / (client_name + '.key_secret')} exists already: pick another --name")
    public, secret = zmq.auth.create_certificates(directory, client_name)
    written += [Path(public), Path(secret)]
    allowed_copy = allowed / f"{client_name}.key"
    allowed_copy.write_bytes(Path(public).read_bytes())
    written.append(allowed_copy)
    for path in written:
        if path.name.endswith("_secret"):
            path.chmod(0o600)
    return written


def _load_pair(path: Path) -> tuple[str, str | None]:
    if not path.is_file():
        raise ConfigError(f"no key file {path}: make keys with `flare2 keys DIR` and copy them as the README says")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"cannot read key file {path} ({exc}): it should come from `flare2 keys DIR`") from None
    return public.decode(), secret.decode() if secret else None


def load_server(directory: str | os.PathLike, extra_allowed: Iterable[str] = ()) -> CurveServer:
    """The manager's pair from ``DIR/server.key_secret`` and the allow-list from ``DIR/allowed/*.key``."""
    directory = Path(directory)
    public, secret = _load_pair(directory / "server.key_secret")
    allowed = {_load_pair(path)[0] for path in sorted((directory / "allowed").glob("*.key"))}
    return CurveServer(public, secret, frozenset(allowed | set(extra_allowed)))


def load_client(directory: str | os.PathLike, client_name: str = "client") -> CurveClient:
    """A client pair ``DIR/<name>.key_secret`` and the server's public key ``DIR/server.key``."""
    directory = Path(directory)
    public, secret = _load_pair(directory / f"{client_name}.key_secret")
    server_public, _ = _load_pair(directory / "server.key")
    return CurveClient(public, secret, server_public)


def ephemeral_client(server: CurveServer) -> tuple[CurveClient, CurveServer]:
    """A fresh client pair for the run's own agents, and the server config that allows it."""
    public, secret = (key.decode() for key in zmq.curve_keypair())
    return CurveClient(public, secret, server.public_key), CurveServer(
        server.public_key, server.secret_key, server.allowed | {public}
    )


class _AllowList:
    def __init__(self, allowed: frozenset[str]) -> None:
        self.allowed = {key.encode() for key in allowed}

    def callback(self, domain: str, client_key: bytes) -> bool:
        if client_key in self.allowed:
            return True
        logger.warning("refused a peer whose CURVE key %s is not in the allow-list", client_key.decode(errors="replace"))
        return False


def start_authenticator(ctx: zmq.Context, server: CurveServer) -> ThreadAuthenticator:
    """ZAP for every CURVE server socket of ``ctx``: only keys in ``server.allowed`` get through."""
    authenticator = ThreadAuthenticator(ctx, log=logging.getLogger("flare2.wire.zap"))
    authenticator.start()
    authenticator.configure_curve_callback(domain="*", credentials_provider=_AllowList(server.allowed))
    return authenticator


def make_server_socket(sock: zmq.Socket, server: CurveServer) -> None:
    sock.curve_secretkey = server.secret_key.encode()
    sock.curve_publickey = server.public_key.encode()
    sock.curve_server = True


def make_client_socket(sock: zmq.Socket, client: CurveClient) -> None:
    sock.curve_secretkey = client.secret_key.encode()
    sock.curve_publickey = client.public_key.encode()
    sock.curve_serverkey = client.server_public_key.encode()
