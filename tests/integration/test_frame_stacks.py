"""Frame stacks through a real run: the model gets, at every prediction, exactly the frames each env showed
(``frame_stack_run.py`` checks them), with each new frame crossing once through shared memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from runs import RunProcess, read_csv

HERE = Path(__file__).parent


@pytest.mark.parametrize(
    "options",
    [
        pytest.param((), id="one-request-a-step"),
        # Two halves of each agent's envs take turns (two streams of stacks), and evaluation episodes add a row to
        # some requests (stacks the agent's port cannot vouch for: they cross whole).
        pytest.param(("--double-buffer", "--eval-every", "3"), id="two-halves-and-evaluation-rows"),
    ],
)
def test_every_frame_stack_the_model_gets_is_the_frames_its_env_showed(tmp_path, options):
    run = RunProcess(
        HERE / "frame_stack_run.py",
        *("--num-agents", "2", "--envs-per-agent", "8", "--max-steps", "6000", "--device", "cpu", *options),
        log_dir=tmp_path,
    )
    try:
        assert run.wait(timeout_s=180) == 0, run.text[-3000:]
    finally:
        run.stop()
    assert "frame stacks that are not" not in run.text
    rows = read_csv(tmp_path / "progress.csv")
    assert rows[-1]["env_steps"] >= 6000 and rows[-1]["episodes"] > 100
    if options:
        assert rows[-1]["eval_episodes"] > 0
