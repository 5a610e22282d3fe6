"""LOG_DIR itself, LOG_DIR/config.json and the changes a resumed run logs."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import pytest

from flare2.commands.plot import main as plot_main
from flare2.commands.train import main as train_main
from flare2.errors import ConfigError
from flare2.runtime import exit_codes
from flare2.runtime.config import AgentConfig, CTConfig, RunConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.run_files import (
    check_output_file,
    log_resumed_changes,
    make_log_dir,
    record_run,
    replaces_a_run,
    run_record,
    unused_log_dir,
)


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


def test_a_log_dir_that_cannot_be_a_folder_ends_in_a_message_naming_it_and_the_fix(tmp_path, caplog):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match=r"--log-dir: .*a_file is a file, not a folder: give --log-dir another path"):
        make_log_dir(a_file)
    with pytest.raises(ConfigError, match=r"--log-dir: cannot make the folder .*a_file/run \(Not a directory\)"):
        make_log_dir(a_file / "run")
    assert make_log_dir(tmp_path / "new" / "run").is_dir()
    # A manager script's run ends with that message and the exit code of a wrong setting.
    with caplog.at_level(logging.ERROR, logger="flare2"):
        assert Manager(config(log_dir=str(a_file))).run() == exit_codes.CONFIG_ERROR
    assert "is a file, not a folder: give --log-dir another path" in caplog.text


def test_flare2_train_given_a_log_dir_it_cannot_make_says_so_before_it_starts(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    argv = ["--env", "CartPole-v1", "--algo", "ppo", "--log-dir", str(a_file / "run")]
    assert train_main(argv) == exit_codes.CONFIG_ERROR
    assert "flare2 train: error: --log-dir: cannot make the folder" in capsys.readouterr().err


def test_an_output_file_is_checked_before_the_work_and_the_check_leaves_no_file(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match=r"--video: .*a_file is a file, not a folder: give --video another path"):
        check_output_file(a_file / "game.gif", "--video")
    a_folder = tmp_path / "curve.png"
    a_folder.mkdir()
    with pytest.raises(ConfigError, match=r"-o .*curve.png: cannot write it \(Is a directory\)"):
        check_output_file(a_folder, "-o")
    check_output_file(tmp_path / "new" / "curve.png", "-o")
    assert (tmp_path / "new").is_dir() and not (tmp_path / "new" / "curve.png").exists()


def test_flare2_plot_given_an_output_it_cannot_write_says_so(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(SystemExit) as stopped:
        plot_main([str(tmp_path), "-o", str(a_file / "curve.png")])
    assert stopped.value.code == 2
    assert "-o: " in capsys.readouterr().err


def test_a_default_log_dir_never_takes_the_place_of_an_earlier_runs(tmp_path):
    name = str(tmp_path / "ppo_CartPole-v1")
    assert unused_log_dir(name) == name
    Path(name).mkdir()
    assert unused_log_dir(name) == name  # an empty folder holds no run
    (Path(name) / "progress.csv").write_text("")
    assert unused_log_dir(name) == name + "_2"
    Path(name + "_2").mkdir()
    (Path(name + "_2") / "manager.log").write_text("")
    assert unused_log_dir(name) == name + "_3"


def test_a_run_into_a_log_dir_with_another_runs_files_says_it_replaces_them_and_a_resume_into_it_does_not(tmp_path):
    (tmp_path / "progress.csv").write_text("")
    assert replaces_a_run(config(log_dir=str(tmp_path)))
    assert not replaces_a_run(config(log_dir=str(tmp_path), resume_dir=str(tmp_path)))
    assert not replaces_a_run(config(log_dir=str(tmp_path / "new")))
