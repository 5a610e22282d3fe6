"""What the manager counts of a run: env steps, episodes and their returns, the compute side's reports, and the
budget they are held against. ``flare2.runtime.manager.progress`` writes them out."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from flare2.runtime.latency import LatencyHistogram

RETURN_WINDOW = 100
EVAL_RETURN_WINDOW = 20
PROCESS_COUNTS = (
    "predict_rows",
    "predict_batches",
    "learned_requests",
    "rejected",
    "closed_connections",
    "policy_lag_sum",
    "policy_lag_steps",
    "predict_seconds",
    "learn_seconds",
)
"""What a compute process counts from 0 however the run began: the run's totals carry them over a compute restart.
Its learn calls and learned rows go on from the checkpoint it resumed."""


def _process_activity(report: dict[str, Any]) -> dict[str, float]:
    """What the compute process of a CT's report did itself: its ``PROCESS_COUNTS`` and the learn calls it made."""
    activity = {key: float(report.get(key, 0)) for key in PROCESS_COUNTS}
    activity["learn_calls"] = float(report.get("learn_calls", 0)) - float(report.get("learn_calls_at_start", 0))
    return activity


@dataclass
class RunTotals:
    """What the manager knows of the run so far."""

    started: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)
    """The wall-clock time it started, for files' times (``started`` does not count a machine's sleep)."""
    env_steps: int = 0
    episodes: int = 0
    recent_returns: deque = field(default_factory=lambda: deque(maxlen=RETURN_WINDOW))
    ct_reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_predict_wait_ms: float = 0.0
    """Longest a prediction request waited in a CDP queue since the last progress row."""
    restarts: int = 0
    """Agent processes restarted after a crash, a kill or a heartbeat timeout."""
    compute_restarts: int = 0
    """Compute processes started in place of one that died unasked."""
    dropped_messages: int = 0
    """Malformed or unexpected control messages the manager dropped."""
    remote_env_steps: int = 0
    """Of ``env_steps``, those of agents attached from other machines."""
    remote_episodes: int = 0
    remote_dropped: int = 0
    """Remote agents dropped after their link went silent or they failed."""
    remote_rejoins: int = 0
    """Remote agents that ``flare2 attach`` started in place of ones that had lost the manager."""
    closed_connections: int = 0
    """ZeroMQ connections of the manager's socket that closed (see ``ConnectionWatch``); the CDPs count their own."""
    eval_env_steps: int = 0
    """Steps of evaluation episodes (not in ``env_steps``: they do not count towards the budget)."""
    eval_episodes: int = 0
    recent_eval_returns: deque = field(default_factory=lambda: deque(maxlen=EVAL_RETURN_WINDOW))
    recent_eval_by_team: dict[str, deque] = field(default_factory=dict)
    """The last evaluation returns of each team that has its own (self-play's games against each fixed player)."""
    round_trips: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Prediction round trips as the agents timed them, since the last progress row."""
    best_return_mean: float = float("nan")
    """The highest ``return_mean`` of any progress row so far."""
    _carried: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each CT's activity (``_process_activity``) in the compute processes that restarts replaced."""
    _finished: list = field(default_factory=list)
    """(return, length, evaluation, team) of the episodes finished since the last ``take_finished``."""

    def resume_from(self, counters: dict[str, Any]) -> None:
        """Continue the counters of the run a checkpoint came from."""
        self.env_steps = int(counters.get("env_steps", 0))
        self.episodes = int(counters.get("episodes", 0))
        self.restarts = int(counters.get("restarts", 0))
        self.compute_restarts = int(counters.get("compute_restarts", 0))
        self.recent_returns.extend(float(value) for value in counters.get("recent_returns", []))

    def budget_reached(self, config: Any) -> bool:
        """Whether the run (a RunConfig) is over: a budget spent or a target return reached."""
        return (
            (config.max_steps is not None and self.env_steps >= config.max_steps)
            or (config.max_episodes is not None and self.episodes >= config.max_episodes)
            or (config.stop_return is not None and self.window_full and self.return_mean >= config.stop_return)
            or (
                config.stop_eval_return is not None
                and self.eval_window_full
                and self.eval_return_mean >= config.stop_eval_return
            )
        )

    def counters(self) -> dict[str, Any]:
        """What a checkpoint keeps of the run, for ``resume_from``."""
        return {
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "restarts": self.restarts,
            "compute_restarts": self.compute_restarts,
            "recent_returns": list(self.recent_returns),
        }

    def add_compute_stats(self, reports: dict[str, dict[str, Any]]) -> None:
        for ct, report in reports.items():
            previous = self.ct_reports.get(ct, {})
            if previous and previous.get("compute_pid") != report.get("compute_pid"):
                carried = self._carried.setdefault(ct, {})
                for key, value in _process_activity(previous).items():
                    carried[key] = carried.get(key, 0.0) + value
            if not report.get("costs") and previous.get("costs"):
                # No learn() since the last report: the costs of the last one stand, as they do between rows.
                report = {**report, "costs": previous["costs"]}
            self.ct_reports[ct] = report
        for report in reports.values():
            self.max_predict_wait_ms = max(self.max_predict_wait_ms, float(report.get("max_predict_wait_ms", 0.0)))

    def add_agent_stats(self, steps: int, episodes: list[tuple[float, int, str]], *, remote: bool = False) -> None:
        """Steps played and episodes finished, each (return, length, team: "" but for a multi-agent env's agent)."""
        self.env_steps += steps
        self.episodes += len(episodes)
        if remote:
            self.remote_env_steps += steps
            self.remote_episodes += len(episodes)
        self.recent_returns.extend(episode_return for episode_return, _, _ in episodes)
        self._finished.extend((episode_return, length, False, team) for episode_return, length, team in episodes)

    def add_eval_stats(self, steps: int, episodes: list[tuple[float, int, str]]) -> None:
        self.eval_env_steps += steps
        self.eval_episodes += len(episodes)
        self.recent_eval_returns.extend(episode_return for episode_return, _, _ in episodes)
        for episode_return, _, team in episodes:
            if team:
                self.recent_eval_by_team.setdefault(team, deque(maxlen=EVAL_RETURN_WINDOW)).append(episode_return)
        self._finished.extend((episode_return, length, True, team) for episode_return, length, team in episodes)

    def eval_win_rates(self) -> dict[str, float]:
        """Of each evaluation team (self-play's fixed players), the share of its last evaluation games the learner
        won (a return above 0)."""
        return {
            team: sum(value > 0 for value in returns) / len(returns)
            for team, returns in sorted(self.recent_eval_by_team.items())
        }

    def take_finished(self) -> list[tuple[float, int, bool, str]]:
        """Episodes (return, length, evaluation, team) finished since the last call."""
        finished, self._finished = self._finished, []
        return finished

    @property
    def return_mean(self) -> float:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else float("nan")

    @property
    def eval_return_mean(self) -> float:
        """Mean return of the last ``EVAL_RETURN_WINDOW`` evaluation episodes."""
        returns = self.recent_eval_returns
        return sum(returns) / len(returns) if returns else float("nan")

    @property
    def window_full(self) -> bool:
        return len(self.recent_returns) == RETURN_WINDOW

    @property
    def eval_window_full(self) -> bool:
        return len(self.recent_eval_returns) == EVAL_RETURN_WINDOW

    def ct_total(self, key: str) -> float:
        """``key`` summed over the CTs' reports, and for ``PROCESS_COUNTS`` over the run's compute processes."""
        if key in PROCESS_COUNTS:
            return sum(self.ct_activity(ct)[key] for ct in self.ct_reports)
        return sum(report.get(key, 0) for report in self.ct_reports.values())

    def ct_activity(self, ct: str) -> dict[str, float]:
        """What the run's compute processes did for ``ct``, summed over them: its ``PROCESS_COUNTS`` and the learn
        calls they made (not those of a checkpoint they resumed)."""
        carried = self._carried.get(ct, {})
        return {key: value + carried.get(key, 0.0) for key, value in _process_activity(self.ct_reports[ct]).items()}


MAX_TEAM_CHARS = 64
"""The longest team name a stats message may give a finished episode (episodes.csv keeps it)."""


def episode_from_wire(item: Any) -> tuple[float, int, str]:
    """One finished episode of a stats message: [return, length] or [return, length, team]."""
    if not isinstance(item, list) or len(item) not in (2, 3):
        raise ValueError("an episode is [return, length] or [return, length, team]")
    team = item[2] if len(item) == 3 else ""
    if not isinstance(team, str) or len(team) > MAX_TEAM_CHARS:
        raise ValueError(f"an episode's team is a name of at most {MAX_TEAM_CHARS} characters")
    return float(item[0]), int(item[1]), team
