"""tools/bench_peers.py and tools/proctree.py without SB3: progress.csv reading, table and ratios, measuring."""

from __future__ import annotations

import csv
import importlib.util
import os
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return load_tool("bench_peers")


@pytest.fixture(scope="module")
def proctree():
    return load_tool("proctree")


def test_flare2_figures_come_from_the_first_crossing_row_and_the_first_to_last_rows(bench, tmp_path):
    path = tmp_path / "progress.csv"
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["wall_time", "env_steps", "episodes", "return_mean", "steps_per_s"])
        writer.writerows(
            [
                [5.0, 4000, 10, "nan", 800],
                [10.0, 9000, 90, "474.9", 1000],
                [15.0, 14000, 120, "475.0", 1000],
                [16.0, 15000, 125, "480", 1000],
            ]
        )
    figures = bench.progress_figures(path, 475)
    assert figures == {
        "steps_to_threshold": 14000,
        "steps_trained": 15000,
        "steps_per_s": pytest.approx((15000 - 4000) / (16.0 - 5.0)),
        "train_s": 16.0,
    }
    assert bench.progress_figures(path, 500)["steps_to_threshold"] is None


def test_summary_takes_medians_over_seeds_and_ratios_of_flare2_to_each_sb3_variant(bench):
    Run = bench.Run
    runs = [
        Run("a2c", "sb3-dummy", 0, 0, 100.0, 300.0, steps_to_threshold=60000, steps_per_s=1000.0),
        Run("a2c", "sb3-dummy", 1, 0, 300.0, 320.0, steps_to_threshold=None, steps_per_s=1200.0),
        Run("a2c", "sb3-dummy", 2, 0, 200.0, 310.0, steps_to_threshold=80000, steps_per_s=1100.0, others_load=0.9),
        Run("a2c", "flare2", 0, 0, 50.0, 155.0, steps_to_threshold=50000, steps_per_s=2200.0),
        Run("a2c", "flare2", 1, None, None, None, error="timed out"),
        Run("a2c", "sb3-subproc", 0, 0, 400.0, 2000.0, steps_to_threshold=70000, steps_per_s=500.0),
    ]
    summary = bench.summarize(runs)
    rows = {row["system"]: row for row in summary["rows"]}
    assert [row["system"] for row in summary["rows"]] == ["sb3-dummy", "sb3-subproc", "flare2"]
    assert rows["sb3-dummy"]["steps_per_s_median"] == 1100.0
    assert rows["sb3-dummy"]["steps_to_threshold"] == [60000, None, 80000]
    assert rows["sb3-dummy"]["wall_s_median"] == 200.0
    assert rows["flare2"]["failed"] == [False, True]
    assert rows["flare2"]["wall_s_median"] == 50.0  # the failed run has no figures to count
    ratios = {ratio["against"]: ratio for ratio in summary["ratios"]}
    assert ratios["sb3-dummy"]["steps_per_s"] == pytest.approx(2.0)
    assert ratios["sb3-dummy"]["wall_s"] == pytest.approx(0.25)
    assert ratios["sb3-dummy"]["peak_rss"] == pytest.approx(0.5)
    assert ratios["sb3-subproc"]["steps_per_s"] == pytest.approx(4.4)

    table = bench.markdown_table(summary, 475)
    assert "| A2C | sb3-dummy | 1,100 | 60,000 / never / 80,000 | 100.0 / 300.0 / 200.0 | 200.0 | 310 |" in table
    assert "| A2C | flare2 | 2,200 | 50,000 / failed | 50.0 / - | 50.0 | 155 |" in table
    assert "| A2C | sb3-dummy | 2.00 | 0.25 | 0.50 |" in table
    assert "during: A2C sb3-dummy seed 2 (0.90);" in table  # a run that shared the machine is named


def test_no_ratios_without_flare2_runs(bench):
    summary = bench.summarize([bench.Run("ppo", "sb3-dummy", 0, 0, 10.0, 300.0, steps_per_s=900.0)])
    assert summary["ratios"] == []
    assert "ratio" not in bench.markdown_table(summary)


CHILD = "b = bytearray(64 * 2**20); import time; t = time.monotonic()\nwhile time.monotonic() - t < 0.3: pass"
PARENT = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {CHILD!r}]); print('out'); sys.exit(3)"


@pytest.mark.usefixtures("no_leftover_processes")
def test_run_measured_sums_the_rss_of_the_children_and_leaves_nothing(proctree):
    measured = proctree.run_measured([sys.executable, "-c", PARENT], timeout_s=30)
    assert measured.returncode == 3
    assert measured.stdout == "out\n"
    assert 0.3 < measured.wall_s < 10
    assert measured.peak_rss_bytes > 64 * 2**20  # the child's buffer alone
    assert 0.05 < measured.cpu_s < 5  # mostly the child's busy loop
    assert measured.others_cpu_s >= 0
    assert measured.leftover_pids == ()


@pytest.mark.usefixtures("no_leftover_processes")
def test_run_measured_kills_the_whole_tree_past_its_timeout(proctree, tmp_path):
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"
    with pytest.raises(proctree.MeasureTimeout, match="limit"):
        proctree.run_measured([sys.executable, "-c", parent], timeout_s=0.4)
    if pid_file.exists():  # the child got that far on a slow machine (no_leftover_processes checks it anyway)
        state = Path(f"/proc/{int(pid_file.read_text())}/stat")
        # Killed: gone, or a zombie waiting for whichever process reaps orphans here.
        assert not state.exists() or state.read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.usefixtures("no_leftover_processes")
def test_run_measured_kills_a_child_left_behind_by_the_command(proctree, tmp_path):
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(0.2)"
    measured = proctree.run_measured([sys.executable, "-c", parent], timeout_s=30, exit_grace_s=0.1)
    child_pid = int(pid_file.read_text())
    assert measured.leftover_pids == (child_pid,)
    state = Path(f"/proc/{child_pid}/stat")
    assert not state.exists() or state.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert os.getpid() not in measured.leftover_pids
