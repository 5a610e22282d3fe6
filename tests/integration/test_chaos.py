"""The chaos soak (``tools/chaos.py``) with a short budget: a run whose agents, compute process and learners are
killed at random every couple of seconds reaches its budget and leaves no process behind (minutes: marked slow)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from tool_modules import TOOLS

pytestmark = pytest.mark.slow


def test_a_run_killed_at_random_everywhere_reaches_its_budget_and_leaves_nothing_running(tmp_path):
    soak = subprocess.run(
        [sys.executable, str(TOOLS / "chaos.py"), "--max-steps", "20000", "--fault-every", "2"]
        + ["--no-undisturbed", "--log-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = soak.stdout
    assert soak.returncode == 0, report + (tmp_path / "chaos.log").read_text()[-4000:]
    faults = {kind: int(count) for kind, count in re.findall(r"(agent|compute|learner) (\d+)", report)}
    assert sum(faults.values()) >= 15 and min(faults.values()) >= 3, report
    restarts = re.search(r"agents (\d+), compute process (\d+)", report)
    assert restarts is not None and int(restarts[2]) >= faults["compute"], report
    assert "| processes left behind | 0" in report
    assert int(re.search(r"\| env steps \| (\d+)", report)[1]) >= 20000
