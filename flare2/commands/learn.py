"""``flare2 learn``: learners on this machine that join the learners of a run managed elsewhere.

A run started with ``--learners N --remote-learners K`` starts N - K learner
processes beside its compute process and waits for K more. This command asks
the manager (a probe, over the run's CURVE keys) for ``--learners`` of those
ranks and for the learners' recipe: each CT's build as data (the algorithm,
its settings and the env, as ``train.json`` holds them), the seed, the device
kind and where the learners' process group meets. It starts one learner
process per rank (when the run learns on cuda, one per GPU of this machine
from cuda:0 on: the probe says how many it has, and the manager refuses more);
each builds the CTs, joins the group through torch.distributed's rendezvous,
takes the first learner's weights (and the checkpoints of a resumed run) and
then learns its share of every learn batch, as the learners beside the compute
process do (:mod:`flare2.runtime.compute.learner_process`). Ranks it was given
but could not use (a CT it cannot build here) stay unfilled: the run then stops
when its learners do not all join within its startup timeout.

It ends with the run: 0 when the run stopped its learners, 1 when one of them
failed (its traceback is printed here; the run stops too, since the others
cannot go on without it). Ctrl+C ends the learners here, and with them the run.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Any

from flare2.commands.attach import probe_manager
from flare2.errors import ConfigError, FlareError, TransportError
from flare2.runtime import exit_codes
from flare2.runtime.config import CTConfig
from flare2.wire.security import CurveClient

logger = logging.getLogger(__name__)

_STARTING_RETRY_S = 1.0
"""How often to ask again while the run's compute process is still coming up."""


@dataclass(frozen=True)
class LearnConfig:
    endpoint: str
    """The manager's control endpoint, tcp://HOST:PORT."""
    learners: int = 1
    """Learner ranks to take (one process each; one GPU each with a cuda device)."""
    curve: CurveClient | None = None
    probe_timeout_s: float = 5.0
    wait_s: float = 120.0
    """How long to wait for a run whose compute process is still starting."""

    def __post_init__(self) -> None:
        if not self.endpoint.startswith("tcp://") or ":" not in self.endpoint[len("tcp://") :]:
            raise ConfigError(f"the manager's address must look like tcp://HOST:PORT, got {self.endpoint!r}")
        if self.learners < 1:
            raise ConfigError(f"--learners must be >= 1, got {self.learners}")


def learner_plan(reply: dict[str, Any], endpoint: str) -> list[Any]:
    """The LearnerSettings of each rank the manager gave (from its probe answer); a ConfigError for an answer that
    is not a valid recipe."""
    # Imported here: building the settings needs torch, the probe does not.
    from flare2.runtime.compute.learner_main import LearnerSettings, learner_device
    from flare2.zoo.registry import rebuild

    plan: Any = reply.get("learners")
    try:
        first, count, learners = plan["first_rank"], plan["count"], plan["learners"]
        rendezvous, device, seed, threads = plan["rendezvous"], plan["device"], plan["seed"], plan["torch_threads"]
        timeout_s = float(plan["timeout_s"])
        builds = {ct["name"]: ct["build"] for ct in plan["cts"]}
        if not all(type(value) is int for value in (first, count, learners, seed, threads)):
            raise TypeError("ranks, seed or threads not integers")
        if not (isinstance(rendezvous, str) and isinstance(device, str) and 0 < first and first + count <= learners):
            raise ValueError("rendezvous, device or ranks out of place")
    except (TypeError, KeyError, ValueError) as exc:
        raise ConfigError(
            f"the manager at {endpoint} answered with no valid learner recipe ({exc!r}): run the same flare2 version "
            "on both machines"
        ) from None
    cts = []
    for name, build in builds.items():
        try:
            cts.append(CTConfig(name, rebuild(build)))
        except ConfigError as exc:
            raise ConfigError(f"the run's CT {name!r} cannot be built here: {exc}") from None
    kind = "cuda" if device.startswith("cuda") else device
    return [
        LearnerSettings(
            cts=tuple(cts),
            device=learner_device(kind, index),
            seed=seed,
            torch_threads=threads,
            resume_dir=None,  # the first learner sends the checkpoints of a resumed run
            parent_pid=os.getpid(),
            learners=learners,
            rank=first + index,
            rendezvous=rendezvous,
            rendezvous_timeout_s=timeout_s,
        )
        for index in range(count)
    ]


def ask_for_ranks(config: LearnConfig) -> dict[str, Any]:
    """The manager's answer with this machine's learner ranks, once its compute process is up."""
    import torch  # the GPUs here, which the manager must know of before it gives ranks for cuda learners

    asks = {"learners": config.learners, "gpus": torch.cuda.device_count()}
    deadline = time.monotonic() + config.wait_s
    while True:
        reply = probe_manager(config.endpoint, curve=config.curve, timeout_s=config.probe_timeout_s, asks=asks)
        if not (isinstance(reply.get("learners"), dict) and reply["learners"].get("starting")):
            return reply
        if time.monotonic() > deadline:
            raise TransportError(
                f"the run at {config.endpoint} was still starting its compute process after {config.wait_s:.0f}s"
            )
        time.sleep(_STARTING_RETRY_S)


def learn(config: LearnConfig) -> int:
    """Take learner ranks of the run, run a learner process for each and wait for them; returns the exit code."""
    try:
        plan = learner_plan(ask_for_ranks(config), config.endpoint)
    except TransportError as exc:
        logger.error("%s", exc)
        return exit_codes.UNREACHABLE
    except FlareError as exc:
        logger.error("%s", exc)
        return exit_codes.CONFIG_ERROR
    from flare2.runtime.compute.learner_main import learner_main

    spawn = multiprocessing.get_context("spawn")
    processes = [
        spawn.Process(target=learner_main, args=(settings, None, None), name=f"flare2-learner-{settings.rank}")
        for settings in plan
    ]
    logger.info(
        "learners %s of %d join the run at %s (its learners meet at %s)",
        ", ".join(str(settings.rank) for settings in plan),
        plan[0].learners,
        config.endpoint,
        plan[0].rendezvous,
    )
    for process in processes:
        process.start()
    try:
        for process in processes:
            process.join()
    except KeyboardInterrupt:
        logger.info("interrupted: the learners here stop, and the run with them")
        for process in processes:
            process.kill()
            process.join()
        return exit_codes.SIGINT
    failed = [process for process in processes if process.exitcode != 0]
    if failed:
        logger.error("%d learner(s) here failed: the run's learners cannot go on without them", len(failed))
        return exit_codes.FAILED
    logger.info("the run stopped its learners")
    return exit_codes.OK
