"""What a run keeps in LOG_DIR besides its tables: manager.log, run.json and config.json.

- manager.log: everything flare2 logs while the run lasts (``run_logs_and_signals``,
  which also hands the stop signals to the run);
- run.json: where the run listens, for tools and for agents attached by hand;
- train.json: what ``flare2 train`` was asked, as a preset (``flare2 eval`` rebuilds the run from it);
- config.json: the resolved configuration, with each CT's algorithm and specs.
  What cannot work on resume (another algorithm, other specs) is refused where
  the checkpoint is loaded (``ComputationTask.load``); the rest may change, and
  the run logs each change it accepts.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flare2.errors import ConfigError
from flare2.runtime.config import RunConfig
from flare2.runtime.processes import handle_stop_signals, restore_signal_handlers

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
TRAIN_FILE = "train.json"
"""What ``flare2 train`` writes in the log dir: the run's settings as a preset (``flare2 eval`` rebuilds from it)."""


def _plain(value: Any) -> Any:
    """``value`` as JSON data: settings field by field, functions by import name, partials with their arguments,
    anything else by its repr (nothing is copied or called, so any build function can be recorded)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {item.name: _plain(getattr(value, item.name)) for item in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, functools.partial):
        return {"function": _plain(value.func), "args": _plain(value.args), "keywords": _plain(value.keywords)}
    if callable(value):
        return f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}"
    return repr(value)


def run_record(config: RunConfig, cts: dict[str, Any]) -> dict[str, Any]:
    """The run's settings, and each CT's algorithm and specs as built (``cts``: name to a dict holding them)."""
    return {
        "run": _plain(config),
        "cts": {name: {"algorithm": ct.get("algorithm"), "specs": ct.get("specs")} for name, ct in cts.items()},
    }


def record_run(config: RunConfig, cts: dict[str, Any]) -> None:
    """Write LOG_DIR/config.json, after logging what a resumed run changes of the settings it resumes."""
    record = run_record(config, cts)
    if config.resume_dir:
        log_resumed_changes(config.resume_dir, record)
    _write_json(Path(config.log_dir) / CONFIG_FILE, record)


def _write_json(path: Path, data: Any) -> None:
    """Written whole or not at all: a reader never sees half a file."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def log_resumed_changes(resume_dir: str, record: dict[str, Any]) -> None:
    """Log each setting of the run being resumed (its config.json, when it has one) that this run changes."""
    candidates = [Path(resume_dir) / CONFIG_FILE, Path(resume_dir).parent / CONFIG_FILE]
    saved_path = next((path for path in candidates if path.is_file()), None)
    if saved_path is None:
        logger.info("resuming %s, which has no %s: its settings cannot be compared with these", resume_dir, CONFIG_FILE)
        return
    try:
        saved = json.loads(saved_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        logger.warning("cannot read %s (%s): the settings of the resumed run are not compared", saved_path, exc)
        return
    for field, before, now in _differences(saved.get("run", {}), record["run"]):
        if field not in ("log_dir", "resume_dir"):
            logger.info("resume changes %s: %s -> %s", field, json.dumps(before), json.dumps(now))


def _differences(before: Any, now: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(before, dict) and isinstance(now, dict):
        found = []
        for key in sorted(set(before) | set(now)):
            found += _differences(before.get(key), now.get(key), f"{prefix}{key}.")
        return found
    return [] if before == now else [(prefix.rstrip("."), before, now)]


def write_run_file(path: Path, control_endpoint: str, compute_hello: dict[str, Any]) -> None:
    """run.json: where this run listens (TCP, and the Unix sockets of local agents), for tools and for agents
    attached by hand."""
    keys = ("predict_endpoint", "learn_endpoint", "local_predict_endpoint", "local_learn_endpoint")
    _write_json(
        path,
        {
            "pid": os.getpid(),
            "control_endpoint": control_endpoint,
            "cts": {name: {key: ct.get(key) for key in keys} for name, ct in compute_hello.get("cts", {}).items()},
        },
    )


def make_log_dir(log_dir: str | Path) -> Path:
    """The run's log dir, made with its parents where missing; a ConfigError naming it where it cannot be written."""
    return make_folder(log_dir, "--log-dir")


def unused_log_dir(name: str) -> str:
    """``name``, else ``name_2``, ``name_3``...: the first that is no folder with files in it, so that a default log
    dir never takes the place of an earlier run's (as rl-baselines3-zoo numbers its runs)."""
    candidate, number = name, 1
    while Path(candidate).is_dir() and any(Path(candidate).iterdir()):
        number += 1
        candidate = f"{name}_{number}"
    return candidate


def replaces_a_run(config: RunConfig) -> bool:
    """Whether the run's log dir holds the progress.csv of another run, which this one is about to replace (a run
    resumed into its own log dir goes on with it instead)."""
    log_dir = Path(config.log_dir)
    resumed_here = config.resume_dir is not None and Path(config.resume_dir).resolve() == log_dir.resolve()
    return (log_dir / "progress.csv").exists() and not resumed_here


def make_folder(folder: str | Path, option: str) -> Path:
    """``folder`` made with its parents where missing, for what ``option`` writes there; a ConfigError naming both
    where it cannot be made or written."""
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{option}: {path} is a file, not a folder: give {option} another path") from None
    except OSError as exc:
        raise ConfigError(
            f"{option}: cannot make the folder {path} ({exc.strerror}): give {option} a path you can write to"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{option}: the folder {path} is not writable: give {option} a path you can write to")
    return path


def check_output_file(file: Path, option: str) -> None:
    """That ``file``, which ``option`` names, can be written (its folder made where missing), before the work that
    ends in writing it; a ConfigError naming both where it cannot. Leaves no file behind that was not there."""
    make_folder(file.parent, option)
    existed = file.exists()
    try:
        with open(file, "ab"):
            pass
    except OSError as exc:
        raise ConfigError(f"{option} {file}: cannot write it ({exc.strerror}): give a path you can write to") from None
    if not existed:
        file.unlink()


@contextmanager
def run_logs_and_signals(log_dir: Path, on_signal: Any) -> Iterator[None]:
    """While a run lasts: its log also in LOG_DIR/manager.log (the folder made already: ``make_log_dir``), and
    Ctrl+C, SIGTERM and SIGHUP handed to ``on_signal``."""
    log_handler = _attach_log_file(log_dir / "manager.log")
    previous_handlers = handle_stop_signals(on_signal)
    try:
        yield
    finally:
        restore_signal_handlers(previous_handlers)
        logging.getLogger("flare2").removeHandler(log_handler)
        log_handler.close()


def _attach_log_file(path: Path) -> logging.Handler:
    """Everything flare2 logs also goes to the run's manager.log; stderr gets it too unless the user set logging up."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    flare_logger = logging.getLogger("flare2")
    flare_logger.addHandler(handler)
    if flare_logger.getEffectiveLevel() > logging.INFO:
        flare_logger.setLevel(logging.INFO)
    return handler
