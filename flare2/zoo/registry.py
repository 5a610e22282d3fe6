"""The algorithms ``flare2 train --algo``, ``flare2 tune --algo`` and ``flare2 eval`` know, by name.

Where each one comes from, looked up in this order:

1. the zoo's own: every module of ``flare2/zoo/records/`` holds one :class:`~flare2.zoo.record.AlgorithmRecord`
   named ``RECORD``; the folder is the list, so adding an algorithm to the zoo is writing its implementation
   (``flare2/zoo/NAME.py``, with torch) and its record (``flare2/zoo/records/NAME.py``, without), and no table
   anywhere else;
2. records given to :func:`register` in this process (a script that trains from Python);
3. the ``flare2.algorithms`` entry points of the installed packages, loaded when a name is none of the above: the
   standard plugin mechanism (Gymnasium's environments and pytest's plugins use the same), so
   ``flare2 train --algo NAME`` finds an algorithm of your own once its package is installed. In its
   ``pyproject.toml``::

       [project.entry-points."flare2.algorithms"]
       my-ppo = "my_package.records:RECORD"

Why a record and its implementation are two modules: the manager and the agent processes read the record (settings,
presets, the spaces it takes) and must not import torch, which costs a process about 1.2 s and 180 MB; the compute
process imports the implementation. So the record names its build function by import path, the implementation
imports its config from the record, and nothing imports the other way.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import pkgutil
from typing import Any

import gymnasium as gym

from flare2.errors import ConfigError
from flare2.zoo.record import AlgorithmRecord

ENTRY_POINT_GROUP = "flare2.algorithms"
_ZOO_RECORDS = "flare2.zoo.records"
_records: dict[str, AlgorithmRecord] = {}
_zoo_loaded = False


def register(record: AlgorithmRecord) -> AlgorithmRecord:
    """Make ``record`` known by its name (to ``flare2 train``'s ``resolve`` and ``flare2 eval`` in this process).

    Registering the same record twice is harmless; another record under a taken name is refused. Returns the record,
    so a module may write ``RECORD = register(AlgorithmRecord(...))``.
    """
    if not isinstance(record, AlgorithmRecord):
        raise ConfigError(f"register takes an AlgorithmRecord (flare2.zoo.AlgorithmRecord), got {record!r}")
    _load_zoo()
    known = _records.get(record.name)
    if known is not None and known != record:
        raise ConfigError(
            f"an algorithm named {record.name!r} is registered already (built by {known.build}): "
            "give yours another name"
        )
    _records[record.name] = record
    return record


def lookup(name: str) -> AlgorithmRecord:
    """The record of the algorithm ``name``; a ConfigError names the known ones and the closest when none is."""
    if not isinstance(name, str):
        raise ConfigError(f"an algorithm name is a string such as 'ppo', got {name!r}")
    _load_zoo()
    record = _records.get(name)
    if record is not None:
        return record
    entry_point = _entry_points().get(name)
    if entry_point is None:
        known = names()
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(
            f"invalid choice: {name!r} (choose from {', '.join(known)}{hint}) - an algorithm of your own joins them "
            f"through flare2.zoo.register(record) or a {ENTRY_POINT_GROUP!r} entry point"
        )
    return register(_load_entry_point(entry_point))


def rebuild(recipe: Any) -> Any:
    """A CT's build function again from its ``recipe()`` (the build of a ``flare2 train`` run, as ``train.json`` or
    a learner on another machine has it); a ConfigError says what in it is wrong."""
    try:
        algo = recipe["algo"]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"not a build recipe of flare2 train ({exc!r})") from None
    record = lookup(algo)  # its ConfigError names the algorithms this Python knows, and how one joins them
    try:
        config = record.config_class(**_tuples(recipe["algorithm"]))
        settings = record.settings_class(**_tuples(recipe["agent"]))
        env_id, env_kwargs, preprocessing = recipe["env"], recipe["env_kwargs"], recipe["preprocessing"]
        agents = recipe.get("agents", [])
        if not isinstance(env_id, str) or not isinstance(env_kwargs, dict) or not isinstance(preprocessing, bool):
            raise TypeError("env, env_kwargs or preprocessing of the wrong type")
        if not isinstance(agents, list) or not all(isinstance(agent, str) for agent in agents):
            raise TypeError("agents must be a list of agent names")
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"not a build recipe of flare2 train ({exc!r})") from None
    return record.builder(env_id, env_kwargs, config, settings, preprocessing=preprocessing, agents=tuple(agents))


def _tuples(values: dict[str, Any]) -> dict[str, Any]:
    """JSON and msgpack give lists where the settings hold tuples."""
    return {key: tuple(value) if isinstance(value, list) else value for key, value in values.items()}


def names() -> list[str]:
    """Every algorithm name, sorted: the zoo's, the registered ones and the entry points' (not loaded for this)."""
    _load_zoo()
    return sorted(set(_records) | set(_entry_points()))


def fitting(observation_space: gym.Space, action_space: gym.Space) -> list[str]:
    """The names of the algorithms that take these spaces (an entry point that fails to load is left out)."""
    found = []
    for name in names():
        try:
            record = lookup(name)
        except ConfigError:
            continue  # asked for by name, it tells what is wrong with it
        if record.fits(observation_space, action_space):
            found.append(name)
    return found


def check_spaces(record: AlgorithmRecord, env_id: str, observation_space: gym.Space, action_space: gym.Space) -> None:
    """A ConfigError naming the spaces of an env that ``record`` does not take, and the algorithms that do."""
    if record.fits(observation_space, action_space):
        return
    others = fitting(observation_space, action_space)
    fix = (
        f"try --algo {' or '.join(others)}"
        if others
        else "no zoo algorithm takes them: write your own Model and Algorithm (README: your own Model)"
    )
    raise ConfigError(
        f"--algo {record.name} takes {record.takes}, but {env_id} has observation space {observation_space} and "
        f"action space {action_space}: {fix}"
    )


def _load_zoo() -> None:
    global _zoo_loaded
    if _zoo_loaded:
        return
    package = importlib.import_module(_ZOO_RECORDS)
    for module_info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{_ZOO_RECORDS}.{module_info.name}")
        record = getattr(module, "RECORD", None)
        if not isinstance(record, AlgorithmRecord):
            raise TypeError(
                f"{module.__name__} must define RECORD, an AlgorithmRecord: every module of "
                f"{_ZOO_RECORDS} is one algorithm"
            )
        _records.setdefault(record.name, record)
    _zoo_loaded = True


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry_point.name, entry_point)  # the first on sys.path wins, as for imports
    return found


def _load_entry_point(entry_point: importlib.metadata.EntryPoint) -> AlgorithmRecord:
    where = f"the {ENTRY_POINT_GROUP} entry point {entry_point.name} = {entry_point.value}"
    try:
        record = entry_point.load()
    except Exception as exc:  # any error of the plugin's import: name it, not flare2
        raise ConfigError(
            f"{where} does not load ({type(exc).__name__}: {exc}): fix or uninstall the package that declares it"
        ) from exc
    if not isinstance(record, AlgorithmRecord):
        raise ConfigError(f"{where} is a {type(record).__name__}, not an AlgorithmRecord: point it at the record")
    if record.name != entry_point.name:
        raise ConfigError(f"{where} is the record of {record.name!r}: name the entry point as its record")
    return record
