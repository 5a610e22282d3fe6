"""When a failed agent process starts again: the one restart policy of the manager and of ``flare2 attach``."""

from __future__ import annotations

MAX_RESTART_BACKOFF_S = 30.0
HEALTHY_LIFE_S = 60.0
"""An agent that ran this long before it failed starts again at once; one that keeps failing waits longer."""


def failure_streak(previous_streak: int, lived_s: float) -> int:
    """How many times in a row this agent has failed, counting the failure that ends a life of ``lived_s``."""
    return 0 if lived_s > HEALTHY_LIFE_S else previous_streak + 1


def restart_backoff(base_s: float, streak: int) -> float:
    """The wait before the restart: ``base_s``, doubling for each failure in a row, at most 30 s."""
    return min(base_s * 2 ** max(streak - 1, 0), MAX_RESTART_BACKOFF_S)
