"""The log readers under tools/: on small hand-written logs, the figures the README quotes come out right."""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from doubles import ATARI_SPECS
from tool_modules import TOOLS, load_tool

from flare2.core.learn_requests import check_learn, unpack


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def progress(run: Path, rows: list[tuple[float, int, str, str]]) -> Path:
    """A progress.csv with the columns the tools read: wall_time, env_steps, return_mean, eval_return_mean."""
    return write_csv(run / "progress.csv", ["wall_time", "env_steps", "return_mean", "eval_return_mean"], rows)


def test_steps_to_threshold_finds_the_first_row_at_or_past_the_threshold_and_skips_nan(tmp_path):
    tool = load_tool("steps_to_threshold")
    path = progress(
        tmp_path / "run",
        [(5.0, 0, "nan", "nan"), (10.0, 1000, "300", "474.9"), (15.0, 2000, "475", "480"), (20.0, 3000, "500", "nan")],
    )
    assert tool.first_crossing(path, 475) == {"wall_time": 15.0, "env_steps": 2000.0, "return_mean": 475.0}
    assert tool.first_crossing(path, 476, "eval_return_mean")["env_steps"] == 2000
    assert tool.first_crossing(path, 501) is None


def test_steps_to_threshold_exits_1_when_a_run_missed_or_has_no_log(tmp_path, capsys):
    tool = load_tool("steps_to_threshold")
    progress(tmp_path / "hit", [(5.0, 100, "480", "nan")])
    progress(tmp_path / "miss", [(5.0, 100, "20", "nan")])
    assert tool.main([str(tmp_path / "hit"), "--threshold", "475"]) == 0
    assert tool.main([str(tmp_path / "hit"), str(tmp_path / "miss"), "--threshold", "475"]) == 1
    assert tool.main([str(tmp_path / "nowhere")]) == 1
    out, err = capsys.readouterr()
    assert "480.0 at 100 env steps, 5.0 s" in out and "never reached return_mean 475.0" in out
    assert "no progress.csv" in err


def test_compare_curves_shows_the_last_value_at_or_before_each_mark(tmp_path):
    tool = load_tool("compare_curves")
    curve = tool.read_curve(
        progress(tmp_path / "a", [(1.0, 500, "nan", "nan"), (2.0, 1500, "10", "nan"), (3.0, 2500, "30", "nan")]),
        "return_mean",
    )
    assert math.isnan(tool.value_at(curve, 1000))
    assert tool.value_at(curve, 2000) == 10.0
    assert tool.value_at(curve, 3000) is None  # the run ended before the mark
    short = [(1000.0, 5.0)]
    lines = tool.table({"a": curve, "b": short}, every=1000).splitlines()
    assert lines[1].split() == ["1000", "-", "5.0"]
    assert lines[2].split() == ["2000", "10.0"]
    assert lines[-2].split() == ["final", "30.0", "5.0"]


def test_compare_curves_names_a_missing_column(tmp_path):
    tool = load_tool("compare_curves")
    path = progress(tmp_path / "a", [(1.0, 500, "1", "nan")])
    with pytest.raises(SystemExit, match="no column 'loss'"):
        tool.read_curve(path, "loss")


def test_compare_curves_reads_the_share_of_the_last_evaluation_games_won_against_a_player(tmp_path):
    tool = load_tool("compare_curves")
    header = ["wall_time", "env_steps", "return", "length", "eval", "team"]
    games = [[1, 100, 1.0, 9, 1, "lookahead"], [1, 100, -1.0, 9, 1, "random"], [1, 100, 0.5, 30, 0, "player"]]
    games += [[2, 200, -1.0, 9, 1, "lookahead"], [3, 300, 0.0, 42, 1, "lookahead"], [4, 400, 1.0, 9, 1, "lookahead"]]
    write_csv(tmp_path / "episodes.csv", header, games)
    # Won, lost, drawn, won: the shares of the games so far, then of the last 3 alone.
    assert tool.read_eval_wins(tmp_path / "episodes.csv", "lookahead", 3) == [
        (100.0, 1.0),
        (200.0, 0.5),
        (300.0, 1 / 3),
        (400.0, 1 / 3),
    ]
    with pytest.raises(SystemExit, match="no evaluation games against 'careful'"):
        tool.read_eval_wins(tmp_path / "episodes.csv", "careful", 3)


def test_ct_report_weights_batch_means_by_count_and_compares_first_and_last_fifth_of_costs(tmp_path):
    tool = load_tool("ct_report")
    header = ["wall_time", "ct", "predict_batches", "predict_batch_mean", "learn_calls", "learn_batch_mean"]
    write_csv(
        tmp_path / "cts.csv",
        header,
        [[1, "RL", 10, 2.0, 0, "nan"], [2, "RL", 30, 6.0, 4, 8.0], [2, "aux", 0, "nan", 2, 3.0]],
    )
    costs = [[i, "RL", i, "loss", value] for i, value in enumerate([10, 9, 8, 7, 6, 5, 4, 3, 2, 1])]
    write_csv(tmp_path / "learn.csv", ["wall_time", "ct", "learn_steps", "cost", "value"], costs)
    lines = tool.report(tmp_path)
    assert lines[1] == "  RL: predict batch mean 5.00 over 40 batches, learn batch mean 8.00 over 4 calls"
    assert lines[2] == "    loss: 9.5 -> 1.5"
    assert lines[3] == "  aux: predict batch mean nan over 0 batches, learn batch mean 3.00 over 2 calls"


def test_the_ragged_bench_feeds_both_layouts_the_same_entities_and_the_same_network():
    bench = load_tool("bench_ragged")
    arrays = bench.observations(8, seed=3)
    padded = bench.padded(arrays)
    for key in bench.ENTITY_TYPES:
        # The padded layout holds exactly the ragged items, in order, behind its mask.
        assert padded[key][padded[f"{key}_mask"]].tolist() == arrays[key].values.tolist()
    network = bench.EntityActorCritic(
        bench.Minefield().observation_space,
        bench.Minefield().action_space,
        actors={"move": "robot"},
        selects={"fire": "mine"},
        width=16,
        layers=1,
    )
    unpadded = bench.PaddedEntities(network).ragged_inputs(
        {key: torch.from_numpy(value) for key, value in padded.items()}
    )
    for key in bench.ENTITY_TYPES:
        assert unpadded[key].lengths.tolist() == arrays[key].lengths.tolist()
    assert bench.main(["--rows", "8", "--requests", "2", "--seconds", "0"]) == 0


def test_bench_takes_its_grid_and_device_from_the_command_line_and_refuses_bad_counts(capsys):
    bench = load_tool("bench")
    args = bench.parse_args(["--device", "cuda", "--procs", "1,4,16", "--envs-per-proc", "8"])
    assert (args.device, args.procs, args.envs_per_proc) == ("cuda", (1, 4, 16), (8,))
    for bad in ("0,2", "four", ""):
        with pytest.raises(SystemExit):
            bench.parse_args(["--procs", bad])
        assert "comma-separated list of counts >= 1" in capsys.readouterr().err


def test_bench_rollout_figures_hold_forward_passes_and_say_why_there_is_no_gpu_load():
    bench = load_tool("bench")
    rows = [
        {
            "wall_time": t,
            "env_steps": 1000.0 * t,
            "batch_size_mean": 50.0,
            "predict_rtt_p50_ms": 0.2,
            "predict_rtt_p99_ms": 0.5,
            "return_mean": 20.0,
        }
        for t in range(5)
    ]
    figures = bench.steady_state(rows, 1, 4)
    assert figures["steps_per_s"] == pytest.approx(1000.0)
    assert figures["forwards_per_s"] == pytest.approx(20.0)
    assert bench.GpuLoad("cpu").figures() == {"gpu_util_percent": None, "gpu_util_unavailable": "not on a GPU"}


def test_bench_refuses_a_device_this_machine_lacks_with_flare2s_message(monkeypatch):
    bench = load_tool("bench")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.checked_device("auto") == "cpu"
    with pytest.raises(SystemExit, match="torch sees no CUDA device: use --device cpu"):
        bench.checked_device("cuda")


@pytest.mark.parametrize("engine", ["python", "gymnasium"])
def test_bench_atari_plays_an_engine_alone_and_counts_whole_steps_of_its_envs_past_the_warm_up(capsys, engine):
    bench = load_tool("bench_atari")
    assert bench.layout(256, 8) == (32, 8) and bench.layout(8, 64) == (1, 8)
    bench.play_alone(engine, "CartPole-v1", 3, 0.2, 1)
    played = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert played["seconds"] == 0.2 and played["steps"] > 0 and played["steps"] % 3 == 0


def test_bench_frames_times_every_way_a_local_agent_can_send_its_frames():
    # A process of its own: its compute side is spawned, and imports the tool by its path.
    result = subprocess.run(
        [sys.executable, str(TOOLS / "bench_frames.py"), "--envs", "2", "--requests", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    header, _, row = result.stdout.strip().splitlines()
    assert "shared memory, stacks in place − tiny µs" in header
    assert row.startswith("| 2 | 0.06 MB |") and len(row.split("|")) == len(header.split("|"))


def test_bench_learner_packs_requests_as_agents_do_and_times_learn_calls_on_them(capsys):
    bench = load_tool("bench_learner")
    request = bench.learn_request(ATARI_SPECS, np.random.default_rng(0), 3, 5, 2, 4)
    assert check_learn(ATARI_SPECS, request) == (3, 5)
    spelled_out = unpack(ATARI_SPECS, request)
    assert spelled_out["inputs"]["obs_frames"].shape == (3, 5, 4, 84, 84)
    assert (spelled_out["policy_version"] == 4).all()
    args = argparse.Namespace(
        env="CartPole-v1",
        device="cpu",
        torch_threads=1,
        requests=2,
        lag=1,
        episode_steps=20,
        warmup=0,
        calls=1,
        profile=True,
        profile_calls=1,
        profile_rows=3,
        extra=["--envs-per-agent", "4", "--sample-interval", "16"],
    )
    result = bench.measure(args, "ppo")
    assert result["batch_steps"] == 2 * 4 * 16 and result["update_only_steps_per_s"] > 0
    assert "where 1 learn calls spent their time" in capsys.readouterr().out


def test_bench_checkpoint_writes_loadable_checkpoints_of_both_models_and_measures_each(tmp_path):
    bench = load_tool("bench_checkpoint")
    for name in bench.MODELS:
        size, seconds = bench.save_seconds(name, 2, tmp_path)
        assert size == (tmp_path / "RL.pt").stat().st_size and seconds > 0
        assert torch.load(tmp_path / "RL.pt", weights_only=False)["counters"]["env_steps"] == 1


def test_bench_threads_times_a_serial_run_and_stops_its_busy_processes(tmp_path):
    bench = load_tool("bench_threads")
    with bench.busy_cores(2) as spinners:
        assert [spinner.poll() for spinner in spinners] == [None, None]
    assert all(spinner.poll() is not None for spinner in spinners)
    assert bench.timed_run({"GOMP_SPINCOUNT": "1000"}, ["--torch-threads", "1"], 16, str(tmp_path), 120) > 0
    assert [path.name for path in tmp_path.glob("*/progress.csv")] == ["progress.csv"]
