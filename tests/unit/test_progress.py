"""RunTotals (what the manager adds up), LatencyHistogram, and the files ProgressLog makes of them."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import pytest

from flare2.runtime.progress import (
    EVAL_RETURN_WINDOW,
    PROGRESS_COLUMNS,
    RETURN_WINDOW,
    LatencyHistogram,
    ProgressLog,
    RunTotals,
)


def budget(max_steps=None, max_episodes=None, stop_return=None, stop_eval_return=None):
    return SimpleNamespace(max_steps=max_steps, max_episodes=max_episodes, stop_return=stop_return,
                           stop_eval_return=stop_eval_return)


def read(path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def test_the_return_mean_is_over_the_last_hundred_training_episodes_and_evaluations_stay_apart():
    totals = RunTotals()
    totals.add_agent_stats(300, [(float(i), 10) for i in range(RETURN_WINDOW + 20)])
    totals.add_eval_stats(50, [(1000.0, 50)])
    totals.add_agent_stats(20, [(0.0, 5)], remote=True)

    assert totals.env_steps == 320 and totals.episodes == RETURN_WINDOW + 21
    assert totals.remote_env_steps == 20 and totals.remote_episodes == 1
    assert totals.eval_env_steps == 50 and totals.eval_episodes == 1 and totals.eval_return_mean == 1000.0
    last_hundred = [float(i) for i in range(21, RETURN_WINDOW + 20)] + [0.0]
    assert totals.return_mean == pytest.approx(sum(last_hundred) / RETURN_WINDOW)
    assert [evaluation for *_, evaluation in totals.take_finished()].count(True) == 1
    assert totals.take_finished() == []


def test_each_budget_ends_the_run_and_a_target_return_waits_for_a_full_window():
    totals = RunTotals()
    assert not totals.budget_reached(budget(max_steps=100))
    totals.add_agent_stats(100, [(500.0, 100)])
    assert totals.budget_reached(budget(max_steps=100))
    assert not totals.budget_reached(budget(max_steps=101))
    assert totals.budget_reached(budget(max_episodes=1))
    # One great episode is not a mean over the window.
    assert not totals.budget_reached(budget(max_steps=10**9, stop_return=475))
    totals.add_agent_stats(0, [(500.0, 100)] * (RETURN_WINDOW - 1))
    assert totals.budget_reached(budget(max_steps=10**9, stop_return=475))

    totals.add_eval_stats(10, [(600.0, 10)] * (EVAL_RETURN_WINDOW - 1))
    assert not totals.budget_reached(budget(max_steps=10**9, stop_eval_return=500))
    totals.add_eval_stats(10, [(600.0, 10)])
    assert totals.budget_reached(budget(max_steps=10**9, stop_eval_return=500))


def test_counters_survive_a_resume():
    totals = RunTotals()
    totals.add_agent_stats(1234, [(10.0, 5), (20.0, 7)])
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
    totals.add_agent_stats(400, [(20.0, 20), (30.0, 30)])
    totals.add_eval_stats(15, [(15.0, 15)])
    totals.add_compute_stats({"RL": {
        "predict_rows": 400, "predict_batches": 100, "learn_requests": 10, "learn_calls": 5, "rejected": 1,
        "max_predict_wait_ms": 2.5, "policy_lag_sum": 30, "policy_lag_steps": 100, "costs": {"loss": 0.5},
    }})
    totals.round_trips.add(0.0004)
    row = log.report(totals, agents=2, remote_agents=1, envs=16)
    log.close()

    [progress] = read(tmp_path / "progress.csv")
    assert list(progress) == list(PROGRESS_COLUMNS)
    assert {key: progress[key] for key in ("env_steps", "episodes", "return_mean", "batch_size_mean", "learn_steps",
                                           "agents", "remote_agents", "envs", "rejected_requests", "eval_episodes",
                                           "eval_return_mean", "policy_lag_mean", "max_predict_wait_ms")} == {
        "env_steps": "400", "episodes": "2", "return_mean": "25.0", "batch_size_mean": "4.0", "learn_steps": "5",
        "agents": "2", "remote_agents": "1", "envs": "16", "rejected_requests": "1", "eval_episodes": "1",
        "eval_return_mean": "15.0", "policy_lag_mean": "0.3", "max_predict_wait_ms": "2.5",
    }
    assert float(progress["predict_rtt_p50_ms"]) == pytest.approx(0.4, rel=0.2)
    assert row["env_steps"] == 400
    assert [(r["ct"], r["cost"], r["value"]) for r in read(tmp_path / "learn.csv")] == [("RL", "loss", "0.5")]
    assert [(r["return"], r["length"], r["eval"]) for r in read(tmp_path / "episodes.csv")] == [
        ("20.0", "20", "0"), ("30.0", "30", "0"), ("15.0", "15", "1")]
    [ct_row] = read(tmp_path / "cts.csv")
    assert (ct_row["predict_batches"], ct_row["predict_batch_mean"], ct_row["learn_calls"], ct_row["learn_batch_mean"]) == (
        "100", "4.0", "5", "2.0")
    # The per-row figures are reset for the next row.
    assert totals.max_predict_wait_ms == 0.0 and math.isnan(totals.round_trips.quantile(0.5))


def test_a_second_report_counts_only_what_happened_since_the_first(tmp_path):
    log = ProgressLog(tmp_path)
    totals = RunTotals()
    report = {"predict_rows": 400, "predict_batches": 100, "learn_requests": 10, "learn_calls": 5,
              "policy_lag_sum": 30, "policy_lag_steps": 100}
    totals.add_compute_stats({"RL": report})
    log.report(totals, agents=1)
    totals.add_compute_stats({"RL": {**report, "predict_rows": 1000, "predict_batches": 200, "policy_lag_sum": 130,
                                     "policy_lag_steps": 200}})
    second = log.report(totals, agents=1)
    log.close()
    assert second["batch_size_mean"] == 6.0 and second["policy_lag_mean"] == 1.0
    rows = read(tmp_path / "cts.csv")
    assert [(r["predict_batches"], r["predict_batch_mean"]) for r in rows] == [("100", "4.0"), ("100", "6.0")]


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
