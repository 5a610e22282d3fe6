"""The exit codes of flare2's processes: one number for each meaning, whichever process exits with it.

The manager (and ``--serial``) ends with OK, FAILED, CONFIG_ERROR, SIGINT,
SIGTERM or SIGHUP; an agent process tells its supervisor (the manager or ``flare2
attach``) why it ended with one of the others; ``flare2 attach`` ends with
UNREACHABLE when no manager answers, MANAGER_LOST when the run went away.
"""

import signal

OK = 0
"""The run reached its budget; an agent stopped because it was asked to; attach detached on Ctrl+C."""
FAILED = 1
"""A process failed; the log above says why (with the traceback of user code)."""
CONFIG_ERROR = 2
"""A setting, spec or import path is wrong; the message names it and the fix."""
MANAGER_LOST = 3
"""The manager went away: an agent heard nothing past the heartbeat timeout; ``flare2 attach`` no answer for
``--rejoin-for`` seconds."""
COMPUTE_FAILED = 4
"""The compute process failed in user code; its own report, with the traceback, ends the run."""
REPLY_TIMEOUT = 5
"""An agent waited past ``--reply-timeout`` for a reply of the compute process."""
UNREACHABLE = 6
"""``flare2 attach`` found no manager at the address it was given."""
COMPUTE_RESTARTS = 7
"""The compute process died and the manager starts a new one: the agent's requests in flight died with it, so it left,
and its supervisor starts a new one that joins once the new compute process serves. A learner of ``flare2 learn``
ends with it when the compute process stops for a new group of learners, which its ``flare2 learn`` asks to join."""
LEARNERS_PARTED = 8
"""A learner's group broke (another learner, or the link to it, is gone): its ``flare2 learn`` asks to join the
group the run forms next."""
SIGINT = 130
"""Stopped by Ctrl+C."""
SIGTERM = 143
"""Stopped by SIGTERM."""
SIGHUP = 129
"""Stopped by SIGHUP: the terminal or ssh session it ran in closed."""
STOPPED_BY_SIGNAL = (SIGINT, SIGTERM, SIGHUP)


def stopped_by(signum: int) -> int:
    """The exit code of a process that stopped because it received ``signum`` (SIGINT, SIGTERM or SIGHUP): 128 plus
    the signal's number, as a shell reports a process the signal killed."""
    return 128 + signum


def outcome(code: int) -> str:
    """How a run ended, as its summary line starts."""
    return {
        OK: "run complete",
        SIGINT: "stopped by Ctrl+C",
        SIGTERM: "stopped by SIGTERM",
        SIGHUP: "stopped by SIGHUP (its terminal closed)",
        CONFIG_ERROR: "run stopped: a setting is wrong",
    }.get(code, "run failed")


def describe(code: int) -> str:
    """How a child process ended, for a log line: 'exited with code 2', 'was killed by SIGKILL'."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
