"""LOG_DIR/config.json and the changes a resumed run logs."""

from __future__ import annotations

import functools
import json
import logging

from flare2.runtime.config import AgentConfig, CTConfig, RunConfig
from flare2.runtime.run_files import log_resumed_changes, record_run, run_record


def build(hidden: int):  # named in the record, never called
    raise AssertionError


def config(**overrides) -> RunConfig:
    settings = {
        "cts": (CTConfig("RL", functools.partial(build, 64)),),
        "agents": AgentConfig("flare2.core.envs:GymAgent"),
        "max_steps": 1000,
    }
    return RunConfig(**{**settings, **overrides})


SERVED = {
    "RL": {
        "algorithm": "flare2.zoo.a2c.A2C",
        "specs": {"inputs": {"obs": {"shape": [4], "dtype": "float32"}}},
        "predict_endpoint": "tcp://127.0.0.1:1",
    }
}


def test_the_record_holds_every_setting_the_build_function_and_each_cts_algorithm_and_specs(tmp_path):
    record_run(config(log_dir=str(tmp_path)), SERVED)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["run"]["max_steps"] == 1000 and saved["run"]["agents"]["num_agents"] == AgentConfig.num_agents
    assert saved["run"]["cts"][0]["build"] == {"function": f"{__name__}:build", "args": [64], "keywords": {}}
    assert saved["cts"] == {"RL": {"algorithm": "flare2.zoo.a2c.A2C", "specs": SERVED["RL"]["specs"]}}


def test_a_resumed_run_logs_each_setting_it_changes(tmp_path, caplog):
    first = tmp_path / "first"
    first.mkdir()
    record_run(config(log_dir=str(first)), SERVED)
    changed = run_record(
        config(log_dir=str(tmp_path / "second"), max_steps=5000, seed=3, resume_dir=str(first)), SERVED
    )
    with caplog.at_level(logging.INFO):
        log_resumed_changes(str(first / "checkpoints"), changed)
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["resume changes max_steps: 1000 -> 5000", "resume changes seed: 0 -> 3"]


class _Builder:
    """A build callable that holds what cannot be copied or written as JSON."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def __call__(self):
        raise AssertionError


def test_any_build_callable_is_recorded_by_name_without_being_copied(tmp_path):
    builder = _Builder()
    record_run(config(cts=(CTConfig("RL", functools.partial(builder.__call__)),), log_dir=str(tmp_path)), SERVED)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["run"]["cts"][0]["build"]["function"] == f"{__name__}:_Builder.__call__"
