"""Every error flare2 raises on purpose derives from :class:`FlareError`.

The tree::

    FlareError
    ├── ConfigError        a setting or an import path is wrong (fix the call or the CLI option)
    ├── SpecError          an array does not match its Spec (fix the agent or the model's specs)
    ├── TransportError     a socket-level problem: timeout, unreachable endpoint
    │   ├── DecodeError    bytes from the network that are not a valid flare2 message
    │   ├── PeerDiedError  the other side is gone (distinct from a slow peer)
    │   └── ReplyTimeoutError  no reply within a set limit (the peer may be slow or gone)
    ├── RemoteError        user code raised in another process; carries its traceback
    │   ├── UserCodeError  an Algorithm or Model raised while the compute side served a batch (the run stops)
    │   └── LearnerDiedError  the learner process ended, or could not start, without being asked to
    ├── RunFailed          the run cannot go on; ``exit_code`` says why (the manager's and --serial's exit code)
    └── EncodeError        a value that cannot travel on the wire (fix what is sent)
"""

from __future__ import annotations


class FlareError(Exception):
    """Base of every error flare2 raises on purpose."""


class ConfigError(FlareError, ValueError):
    """A configuration value, option or import path is wrong."""


class SpecError(FlareError, ValueError):
    """An array does not match the Spec it was checked against."""


class TransportError(FlareError):
    """A message could not be sent or received in time."""


class DecodeError(TransportError):
    """Bytes received from a peer are not a valid flare2 message."""


class PeerDiedError(TransportError):
    """The peer process is gone, as opposed to merely slow."""


class ReplyTimeoutError(TransportError):
    """No reply came within a set limit: the message says what was waited for and for how long."""


class RemoteError(FlareError):
    """User code raised in another process.

    ``remote_traceback`` holds the traceback text as formatted over there, so
    the line of user code that failed is visible here.
    """

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        text = super().__str__()
        if self.remote_traceback:
            return f"{text}\n--- remote traceback ---\n{self.remote_traceback.rstrip()}"
        return text


class UserCodeError(RemoteError):
    """User code (Algorithm/Model) raised while serving a batch of CT ``ct``; the run must stop."""

    def __init__(self, ct: str, what: str, remote_traceback: str) -> None:
        super().__init__(f"{what} of CT {ct!r} raised", remote_traceback)
        self.ct = ct
        self.what = what


class LearnerDiedError(RemoteError):
    """The learner process ended, or could not start, without being asked to. ``lost``: it was there and is gone (a
    kill, its machine, its link), which a new compute process with a new group of learners may mend; otherwise it
    could not start, which a restart would not. ``elsewhere``: the one lost was on another machine (or never came).
    ``can_save``: the first learner, which holds the optimizers, is still there to write the checkpoints."""

    def __init__(
        self,
        message: str,
        remote_traceback: str = "",
        *,
        lost: bool = False,
        elsewhere: bool = False,
        can_save: bool = False,
    ) -> None:
        super().__init__(message, remote_traceback)
        self.lost = lost
        self.elsewhere = elsewhere
        self.can_save = can_save


class LearnersPartedError(FlareError):
    """A collective call of the learners of ``--learners`` failed: one of them is gone."""


class RunFailed(FlareError):
    """The run cannot go on; ``exit_code`` (one of ``flare2.runtime.exit_codes``) says why."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class EncodeError(FlareError, TypeError):
    """A value cannot travel on the wire (only plain data and numeric numpy arrays can)."""


class CheckpointError(FlareError):
    """A checkpoint could not be written (a full disk, a directory that cannot be written): the message names the path,
    and the checkpoint there before stays as it was."""
