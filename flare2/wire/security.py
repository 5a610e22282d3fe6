"""CurveZMQ for runs that listen beyond loopback: key files, allow-list, ZAP.

``flare2 keys DIR`` writes a server key pair, a client key pair and an
allow-list folder::

    DIR/server.key, DIR/server.key_secret      the manager's pair (the secret stays on its machine)
    DIR/client.key, DIR/client.key_secret      a pair for the machines that attach
    DIR/allowed/client.key                     public keys the manager accepts

A manager given ``--keys DIR`` serves CURVE with the server pair and accepts
only the keys in ``DIR/allowed``, which it reads again whenever that folder
changes: copy a machine's public key into it (or remove one) while the run
goes on. ``flare2 attach --keys DIR`` connects with the client pair and checks
the server's public key. A refused peer is logged (the first 20 refusals, then
every 100th) and never gets a message through: ZeroMQ drops it during the
handshake.
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
    allowed_dir: str | None = None
    """The folder of public key files these keys came from; read again whenever it changes."""


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
    try:
        allowed.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot make {allowed} ({exc.strerror}): give flare2 keys a folder you can write to"
        ) from None
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


def _load_secret_pair(path: Path) -> tuple[str, str]:
    """A pair whose secret key this side needs (a ``.key_secret`` file): a file with only the public key is refused."""
    public, secret = _load_pair(path)
    if secret is None:
        raise ConfigError(f"key file {path} holds no secret key: use the .key_secret file `flare2 keys DIR` wrote")
    return public, secret


def load_server(directory: str | os.PathLike, extra_allowed: Iterable[str] = ()) -> CurveServer:
    """The manager's pair from ``DIR/server.key_secret`` and the allow-list from ``DIR/allowed/*.key``."""
    directory = Path(directory)
    public, secret = _load_secret_pair(directory / "server.key_secret")
    allowed = _keys_in(directory / "allowed")
    return CurveServer(public, secret, frozenset(allowed | set(extra_allowed)), str(directory / "allowed"))


def _keys_in(folder: Path) -> set[str]:
    return {_load_pair(path)[0] for path in sorted(folder.glob("*.key"))}


def load_client(directory: str | os.PathLike, client_name: str = "client") -> CurveClient:
    """A client pair ``DIR/<name>.key_secret`` and the server's public key ``DIR/server.key``."""
    directory = Path(directory)
    public, secret = _load_secret_pair(directory / f"{client_name}.key_secret")
    server_public, _ = _load_pair(directory / "server.key")
    return CurveClient(public, secret, server_public)


def ephemeral_client(server: CurveServer) -> tuple[CurveClient, CurveServer]:
    """A fresh client pair for the run's own agents, and the server config that allows it."""
    public, secret = (key.decode() for key in zmq.curve_keypair())
    return CurveClient(public, secret, server.public_key), CurveServer(
        server.public_key, server.secret_key, server.allowed | {public}, server.allowed_dir
    )


def worth_logging(count: int) -> bool:
    """Refusals are logged one by one at first, then only every 100th, so a flood cannot fill the log."""
    return count <= 20 or count % 100 == 0


class AllowList:
    """The ZAP callback: a client key gets in if the server config allows it; the allowed/ folder is read again
    at the next handshake after it changes, so keys added or removed there count without a restart."""

    def __init__(self, server: CurveServer) -> None:
        self._folder = Path(server.allowed_dir) if server.allowed_dir else None
        self._folder_stamp: tuple | None = None
        self._from_folder: set[str] = _keys_in(self._folder) if self._folder else set()
        # Keys not from the folder (the run's own agents) stay allowed whatever the folder holds.
        self._fixed = set(server.allowed) - self._from_folder
        self._folder_stamp = self._stamp()
        self.refused = 0

    def _stamp(self) -> tuple | None:
        """What the folder holds (names, sizes, times): a handshake is rare enough to list it each time, and a
        listing sees a change that the folder's own time, a few milliseconds coarse, may not."""
        if self._folder is None:
            return None
        try:
            entries = [(entry.name, entry.stat()) for entry in os.scandir(self._folder)]
        except OSError:
            return None
        return tuple(sorted((name, stat.st_size, stat.st_mtime_ns) for name, stat in entries))

    def _reload_if_changed(self) -> None:
        stamp = self._stamp()
        if self._folder is None or stamp is None or stamp == self._folder_stamp:
            return
        self._folder_stamp = stamp
        try:
            keys = _keys_in(self._folder)
        except ConfigError as exc:
            logger.warning("kept the allow-list as it was: %s", exc)
            return
        added, removed = len(keys - self._from_folder), len(self._from_folder - keys)
        self._from_folder = keys
        logger.info("allow-list %s re-read: %d key(s), %d added, %d removed", self._folder, len(keys), added, removed)

    def allows(self, client_key: str) -> bool:
        self._reload_if_changed()
        return client_key in self._fixed or client_key in self._from_folder

    def callback(self, domain: str, client_key: bytes) -> bool:
        if self.allows(client_key.decode(errors="replace")):
            return True
        self.refused += 1
        if worth_logging(self.refused):
            logger.warning(
                "refused a peer whose CURVE key %s is not in the allow-list (refusal %d)",
                client_key.decode(errors="replace"),
                self.refused,
            )
        return False


def start_authenticator(ctx: zmq.Context, server: CurveServer) -> ThreadAuthenticator:
    """ZAP for every CURVE server socket of ``ctx``: only keys in ``server.allowed`` get through."""
    authenticator = ThreadAuthenticator(ctx, log=logging.getLogger("flare2.wire.zap"))
    authenticator.start()
    authenticator.configure_curve_callback(domain="*", credentials_provider=AllowList(server))
    return authenticator


def make_server_socket(sock: zmq.Socket, server: CurveServer) -> None:
    sock.curve_secretkey = server.secret_key.encode()
    sock.curve_publickey = server.public_key.encode()
    sock.curve_server = True


def make_client_socket(sock: zmq.Socket, client: CurveClient) -> None:
    sock.curve_secretkey = client.secret_key.encode()
    sock.curve_publickey = client.public_key.encode()
    sock.curve_serverkey = client.server_public_key.encode()
