"""RunTotals (what the manager adds up), LatencyHistogram, and the files ProgressLog makes of them."""

from __future__ import annotations

import csv
import math
import os
import time
from types import SimpleNamespace

import pytest
from extras import skip_without

from flare2.runtime.latency import LatencyHistogram
from flare2.runtime.manager.progress import PROGRESS_COLUMNS, ProgressLog, duration_text, summary_line
from flare2.runtime.manager.totals import EVAL_RETURN_WINDOW, RETURN_WINDOW, RunTotals


def budget(max_steps=None, max_episodes=None, stop_return=None, stop_eval_return=None):
    return SimpleNamespace(
        max_steps=max_steps, max_episodes=max_episodes, stop_return=stop_return, stop_eval_return=stop_eval_return
    )


def read(path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def test_the_return_mean_is_over_the_last_hundred_training_episodes_and_evaluations_stay_apart():
    totals = RunTotals()
    totals.add_agent_stats(300, [(float(i), 10, "") for i in range(RETURN_WINDOW + 20)])
    totals.add_eval_stats(50, [(1000.0, 50, "")])
    totals.add_agent_stats(20, [(0.0, 5, "")], remote=True)

    assert totals.env_steps == 320 and totals.episodes == RETURN_WINDOW + 21
    assert totals.remote_env_steps == 20 and totals.remote_episodes == 1
    assert totals.eval_env_steps == 50 and totals.eval_episodes == 1 and totals.eval_return_mean == 1000.0
    last_hundred = [float(i) for i in range(21, RETURN_WINDOW + 20)] + [0.0]
    assert totals.return_mean == pytest.approx(sum(last_hundred) / RETURN_WINDOW)
    assert [evaluation for *_, evaluation, _ in totals.take_finished()].count(True) == 1
    assert totals.take_finished() == []


def test_each_budget_ends_the_run_and_a_target_return_waits_for_a_full_window():
    totals = RunTotals()
    assert not totals.budget_reached(budget(max_steps=100))
    totals.add_agent_stats(100, [(500.0, 100, "")])
    assert totals.budget_reached(budget(max_steps=100))
    assert not totals.budget_reached(budget(max_steps=101))
    assert totals.budget_reached(budget(max_episodes=1))
    # One great episode is not a mean over the window.
    assert not totals.budget_reached(budget(max_steps=10**9, stop_return=475))
    totals.add_agent_stats(0, [(500.0, 100, "")] * (RETURN_WINDOW - 1))
    assert totals.budget_reached(budget(max_steps=10**9, stop_return=475))

    totals.add_eval_stats(10, [(600.0, 10, "")] * (EVAL_RETURN_WINDOW - 1))
    assert not totals.budget_reached(budget(max_steps=10**9, stop_eval_return=500))
    totals.add_eval_stats(10, [(600.0, 10, "")])
    assert totals.budget_reached(budget(max_steps=10**9, stop_eval_return=500))


def test_counters_survive_a_resume():
    totals = RunTotals()
    totals.add_agent_stats(1234, [(10.0, 5, ""), (20.0, 7, "")])
    totals.restarts = 2
    resumed = RunTotals()
    resumed.resume_from(totals.counters())
    assert (resumed.env_steps, resumed.episodes, resumed.restarts) == (1234, 2, 2)
    assert resumed.return_mean == 15.0


def test_latency_quantiles_come_from_buckets_about_a_fifth_wide_and_bad_counts_are_ignored():
    histogram = LatencyHistogram()
    for _ in range(98):
        histogram.add(0.001)  # 1 ms
    histogram.add(0.050)
    histogram.add(0.050)
    assert histogram.quantile(0.5) == pytest.approx(1.0, rel=0.2)
    assert histogram.quantile(0.99) == pytest.approx(50.0, rel=0.2)

    other = LatencyHistogram()
    other.merge(histogram.take())
    assert other.quantile(0.5) == pytest.approx(1.0, rel=0.2) and math.isnan(histogram.quantile(0.5))
    for bad in ([1, 2, 3], "counts", [-1] * len(other.counts), [0.5] * len(other.counts)):
        before = list(other.counts)
        other.merge(bad)
        assert other.counts == before


def test_a_report_writes_a_progress_row_the_costs_the_episodes_and_the_batching_of_each_ct(tmp_path):
    log = ProgressLog(tmp_path)
    totals = RunTotals()
    totals.add_agent_stats(400, [(20.0, 20, "agent"), (30.0, 30, "agent")])
    totals.add_eval_stats(15, [(15.0, 15, "")])
    totals.add_compute_stats(
        {
            "RL": {
                "predict_rows": 400,
                "predict_batches": 100,
                "learned_requests": 10,
                "learn_calls": 5,
                "rejected": 1,
                "max_predict_wait_ms": 2.5,
                "policy_lag_sum": 30,
                "policy_lag_steps": 100,
                "costs": {"loss": 0.5},
            }
        }
    )
    totals.round_trips.add(0.0004)
    row = log.report(totals, agents=2, remote_agents=1, envs=16)
    log.close()

    [progress] = read(tmp_path / "progress.csv")
    assert list(progress) == list(PROGRESS_COLUMNS)
    assert {
        key: progress[key]
        for key in (
            "env_steps",
            "episodes",
            "return_mean",
            "batch_size_mean",
            "learn_steps",
            "agents",
            "remote_agents",
            "envs",
            "rejected_requests",
            "eval_episodes",
            "eval_return_mean",
            "policy_lag_mean",
            "max_predict_wait_ms",
        )
    } == {
        "env_steps": "400",
        "episodes": "2",
        "return_mean": "25.0",
        "batch_size_mean": "4.0",
        "learn_steps": "5",
        "agents": "2",
        "remote_agents": "1",
        "envs": "16",
        "rejected_requests": "1",
        "eval_episodes": "1",
        "eval_return_mean": "15.0",
        "policy_lag_mean": "0.3",
        "max_predict_wait_ms": "2.5",
    }
    assert float(progress["predict_rtt_p50_ms"]) == pytest.approx(0.4, rel=0.2)
    assert row["env_steps"] == 400
    assert [(r["ct"], r["cost"], r["value"]) for r in read(tmp_path / "learn.csv")] == [("RL", "loss", "0.5")]
    assert [(r["return"], r["length"], r["eval"], r["team"]) for r in read(tmp_path / "episodes.csv")] == [
        ("20.0", "20", "0", "agent"),
        ("30.0", "30", "0", "agent"),
        ("15.0", "15", "1", ""),
    ]
    [ct_row] = read(tmp_path / "cts.csv")
    assert (
        ct_row["predict_batches"],
        ct_row["predict_batch_mean"],
        ct_row["learn_calls"],
        ct_row["learn_batch_mean"],
    ) == ("100", "4.0", "5", "2.0")
    # The per-row figures are reset for the next row.
    assert totals.max_predict_wait_ms == 0.0 and math.isnan(totals.round_trips.quantile(0.5))


def test_a_second_report_counts_only_what_happened_since_the_first(tmp_path):
    log = ProgressLog(tmp_path)
    totals = RunTotals()
    report = {
        "predict_rows": 400,
        "predict_batches": 100,
        "learned_requests": 10,
        "learn_calls": 5,
        "policy_lag_sum": 30,
        "policy_lag_steps": 100,
    }
    totals.add_compute_stats({"RL": report})
    log.report(totals, agents=1)
    totals.add_compute_stats(
        {"RL": {**report, "predict_rows": 1000, "predict_batches": 200, "policy_lag_sum": 130, "policy_lag_steps": 200}}
    )
    second = log.report(totals, agents=1)
    log.close()
    assert second["batch_size_mean"] == 6.0 and second["policy_lag_mean"] == 1.0
    rows = read(tmp_path / "cts.csv")
    assert [(r["predict_batches"], r["predict_batch_mean"]) for r in rows] == [("100", "4.0"), ("100", "6.0")]


def test_a_restarted_compute_process_counts_from_its_own_start_in_cts_csv(tmp_path):
    # Its counters begin again at 0, but its learn calls go on from the checkpoint it resumed (here 40 of them).
    log = ProgressLog(tmp_path)
    totals = RunTotals()
    first = {"compute_pid": 11, "learn_calls_at_start": 0, "predict_batches": 100, "predict_rows": 400}
    totals.add_compute_stats({"RL": {**first, "learned_requests": 60, "learn_calls": 50, "learn_seconds": 5.0}})
    log.report(totals, agents=1)
    restarted = {"compute_pid": 12, "learn_calls_at_start": 40, "predict_batches": 10, "predict_rows": 30}
    totals.add_compute_stats({"RL": {**restarted, "learned_requests": 4, "learn_calls": 42, "learn_seconds": 0.5}})
    second = log.report(totals, agents=1)
    log.close()
    # The run's totals go on over the restart: the new process's counts add to those of the one it replaced.
    assert (totals.ct_total("predict_batches"), totals.ct_total("learn_calls")) == (110, 42)
    assert second["batch_size_mean"] == 3.0
    rows = read(tmp_path / "cts.csv")
    columns = ("predict_batches", "predict_batch_mean", "learn_calls", "learn_batch_mean", "learn_s")
    assert [tuple(row[column] for column in columns) for row in rows] == [
        ("100", "4.0", "50", "1.2", "5.0"),
        ("10", "3.0", "2", "2.0", "0.5"),
    ]


def test_a_resumed_run_appends_to_its_files_and_a_foreign_progress_file_is_replaced(tmp_path):
    log = ProgressLog(tmp_path)
    totals = RunTotals()
    totals.add_agent_stats(100, [])
    log.report(totals, agents=1)
    log.close()
    resumed = ProgressLog(tmp_path, start_steps=100, append=True)
    totals.add_agent_stats(50, [])
    resumed.report(totals, agents=1)
    resumed.close()
    assert [r["env_steps"] for r in read(tmp_path / "progress.csv")] == ["100", "150"]

    (tmp_path / "progress.csv").write_text("something,else\n1,2\n")
    ProgressLog(tmp_path, append=True).close()
    assert (tmp_path / "progress.csv").read_text().splitlines() == [",".join(PROGRESS_COLUMNS)]


def test_the_progress_line_tells_the_share_of_the_step_budget_and_the_time_left(tmp_path, caplog):
    log = ProgressLog(tmp_path, start_steps=1000, max_steps=5000)
    log._start_time -= 10.0  # 10 s ago this log started, at 1000 steps: 100 steps/s
    totals = RunTotals()
    totals.add_agent_stats(2000, [])
    with caplog.at_level("INFO", logger="flare2.progress"):
        log.report(totals, agents=1)
        # Stopped early (a target return): no time left to tell.
        log.run_ends()
        log.report(totals, agents=1)
    log.close()
    assert "steps 2000 of 5000 (40%) |" in caplog.text
    # 1000 steps in 10 s since the start; 3000 left take 30 s.
    assert "steps 2000 of 5000 (40%, ETA 30s) |" in caplog.text
    assert [duration_text(s) for s in (0.4, 59, 61, 3599, 3600 * 3 + 7 * 60 + 20)] == [
        "0s",
        "59s",
        "1m01s",
        "59m59s",
        "3h07m",
    ]


def test_the_progress_line_tells_the_learners_win_rate_against_each_fixed_player_of_its_evaluation_games(
    tmp_path, caplog
):
    log = ProgressLog(tmp_path)
    totals = RunTotals()
    totals.add_eval_stats(40, [(1.0, 4, "random")] * 30 + [(-1.0, 4, "random")] * 10)  # the last 20: 10 won
    totals.add_eval_stats(30, [(1.0, 9, "lookahead"), (0.0, 21, "lookahead"), (-1.0, 9, "lookahead")])
    assert totals.eval_win_rates() == {"lookahead": pytest.approx(1 / 3), "random": 0.5}
    with caplog.at_level("INFO", logger="flare2.progress"):
        log.report(totals, agents=1)
    log.close()
    assert f"eval won against lookahead 33%, random 50% (last {EVAL_RETURN_WINDOW} games each)" in caplog.text
    with open(tmp_path / "episodes.csv", encoding="utf-8") as file:
        teams = [row["team"] for row in csv.DictReader(file) if row["eval"] == "1"]
    assert teams == ["random"] * 40 + ["lookahead"] * 3


def test_the_summary_names_the_best_and_last_mean_return_and_where_the_files_are(tmp_path):
    log = ProgressLog(tmp_path)
    totals = RunTotals()
    totals.add_agent_stats(100, [(50.0, 50, "")])
    log.report(totals, agents=1)
    totals.add_agent_stats(100, [(10.0, 10, "")])
    log.report(totals, agents=1)
    log.close()
    assert totals.best_return_mean == 50.0
    line = summary_line("run complete", totals, tmp_path)
    assert line.startswith("run complete: 200 env steps, 2 episodes in 0s; mean return last 30.0, best 50.0; ")
    assert line.endswith(f"no checkpoint written; logs in {tmp_path}")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "RL.pt").write_bytes(b"")
    assert f"checkpoints in {tmp_path / 'checkpoints'}; logs in" in summary_line("run complete", totals, tmp_path)


def test_the_summary_does_not_take_an_earlier_runs_checkpoints_in_the_same_log_dir_for_this_runs(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    earlier = tmp_path / "checkpoints" / "RL.pt"
    earlier.write_bytes(b"")
    an_hour_ago = time.time() - 3600
    os.utime(earlier, (an_hour_ago, an_hour_ago))
    totals = RunTotals()
    totals.add_agent_stats(300, [])
    assert summary_line("run stopped: a setting is wrong", totals, tmp_path).endswith(
        f"no checkpoint written; logs in {tmp_path}"
    )


def test_a_run_in_which_no_episode_ended_says_so_instead_of_a_mean_return(tmp_path):
    totals = RunTotals()
    totals.add_agent_stats(300, [])
    line = summary_line("budget reached", totals, tmp_path)
    assert "300 env steps, 0 episodes in 0s; no episode ended; no checkpoint written" in line
    assert "nan" not in line


def _board_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """The scalars TensorBoard itself reads from the event files of ``log_dir``, by tag."""
    skip_without("tensorboard", "tensorboard")
    from tensorboard.backend.event_processing import event_accumulator

    events = event_accumulator.EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_gets_every_progress_and_learn_scalar_and_a_resume_continues_one_curve(tmp_path):
    skip_without("tensorboard", "tensorboard")
    totals = RunTotals()
    log = ProgressLog(tmp_path, tensorboard=True)
    for steps, episode_return, loss in ((100, 10.0, 0.9), (100, 20.0, 0.8), (100, 30.0, 0.7)):
        totals.add_agent_stats(steps, [(episode_return, 10, "")])
        totals.add_compute_stats({"RL": {"learn_calls": 1, "costs": {"loss": loss}}})
        log.report(totals, agents=1)
    log.close()
    # The run died after 300 steps; its checkpoint was at 200. The resumed run goes on from there in place.
    resumed = RunTotals()
    resumed.add_agent_stats(200, [])
    resumed.recent_returns.extend([10.0, 20.0])
    log = ProgressLog(tmp_path, start_steps=200, append=True, tensorboard=True)
    for steps, episode_return, loss in ((100, 40.0, 0.6), (100, 50.0, 0.5)):
        resumed.add_agent_stats(steps, [(episode_return, 10, "")])
        resumed.add_compute_stats({"RL": {"learn_calls": 1, "costs": {"loss": loss}}})
        log.report(resumed, agents=1)
    log.close()

    scalars = _board_scalars(tmp_path)
    # Steps 300 of the first run are hidden by the resumed run's: one curve, each step once.
    assert scalars["progress/return_mean"] == [(100, 10.0), (200, 15.0), (300, pytest.approx(23.333)), (400, 30.0)]
    assert scalars["learn/RL/loss"] == [
        (100, pytest.approx(0.9)),
        (200, pytest.approx(0.8)),
        (300, pytest.approx(0.6)),
        (400, pytest.approx(0.5)),
    ]
    numeric = {c for c in PROGRESS_COLUMNS if c not in ("wall_time", "env_steps")}
    assert {tag.removeprefix("progress/") for tag in scalars if tag.startswith("progress/")} <= numeric
    assert "progress/steps_per_s" in scalars and "progress/episodes" in scalars
    # NaN (no evaluation yet) is left out rather than drawn.
    assert "progress/eval_return_mean" not in scalars

    # A fresh run in the same directory replaces the old curve.
    log = ProgressLog(tmp_path, tensorboard=True)
    fresh = RunTotals()
    fresh.add_agent_stats(100, [(99.0, 10, "")])
    log.report(fresh, agents=1)
    log.close()
    assert _board_scalars(tmp_path)["progress/return_mean"] == [(100, 99.0)]


def test_a_compute_report_without_learning_keeps_the_costs_of_the_one_before_it():
    totals = RunTotals()
    totals.add_compute_stats({"RL": {"learn_calls": 3, "costs": {"loss": 1.5}}})
    totals.add_compute_stats({"RL": {"learn_calls": 3, "costs": {}}})
    assert totals.ct_reports["RL"] == {"learn_calls": 3, "costs": {"loss": 1.5}}
    totals.add_compute_stats({"RL": {"learn_calls": 4, "costs": {"loss": 0.5}}})
    assert totals.ct_reports["RL"]["costs"] == {"loss": 0.5}
