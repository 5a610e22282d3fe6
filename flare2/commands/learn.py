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
but could not use (a CT it cannot build here) stay unfilled: the run's first
learner waits for them up to its startup timeout, then the run goes on with
the learners beside its compute process.

The learners' group lives as long as the run's compute process. When it
breaks (a learner elsewhere gone, the link to the run down past the group's
timeout) or the run forms a new one (to take in another ``flare2 learn``),
the learners here end and this command asks the manager for ranks again, for
up to ``--rejoin-for`` seconds of silence (the run goes on meanwhile with the
learners beside its compute process), then joins the next group at its next
update.

It ends with the run: 0 when the run stopped its learners, 1 when one of them
failed in the run's code (its traceback is printed here), MANAGER_LOST when
the run stayed silent past ``--rejoin-for``. Ctrl+C ends the learners here;
the run goes on without them.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

from flare2.commands.attach import probe_manager
from flare2.errors import ConfigError, FlareError, TransportError
from flare2.runtime import exit_codes
from flare2.runtime.config import REJOIN_FOR_S, CTConfig
from flare2.runtime.processes import WarmProcess
from flare2.wire.security import CurveClient

logger = logging.getLogger(__name__)

_STARTING_RETRY_S = 0.25
"""How often to ask again while the run's compute process is still coming up: a restarted one is up within a fraction
of a second (its spare), and its new group waits for these learners (a probe is one small message)."""


@dataclass(frozen=True)
class LearnConfig:
    endpoint: str
    """The manager's control endpoint, tcp://HOST:PORT."""
    learners: int = 1
    """Learner ranks to take (one process each; one GPU each with a cuda device)."""
    curve: CurveClient | None = None
    probe_timeout_s: float = 5.0
    wait_s: float = 120.0
    """How long to wait for a compute process with room for these learners (one starting, a group re-forming)."""
    rejoin_for_s: float = REJOIN_FOR_S
    """After the learners' group broke, how long to wait for a manager that does not answer (a link down)."""

    def __post_init__(self) -> None:
        if not self.endpoint.startswith("tcp://") or ":" not in self.endpoint[len("tcp://") :]:
            raise ConfigError(f"the manager's address must look like tcp://HOST:PORT, got {self.endpoint!r}")
        if self.learners < 1:
            raise ConfigError(f"--learners must be >= 1, got {self.learners}")
        if self.rejoin_for_s < 0:
            raise ConfigError(f"--rejoin-for must be >= 0 seconds, got {self.rejoin_for_s}")


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
        timeout_s, rendezvous_timeout_s = float(plan["timeout_s"]), float(plan["rendezvous_timeout_s"])
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
            rendezvous_timeout_s=rendezvous_timeout_s,
            group_timeout_s=timeout_s,
        )
        for index in range(count)
    ]


def ask_for_ranks(config: LearnConfig, learn_id: str, *, run_id: str | None = None) -> dict[str, Any]:
    """The manager's answer with this machine's learner ranks, once a compute process with room for them is up.

    ``run_id``: the learners were in that run's group, which broke; the manager is given ``rejoin_for_s`` to answer
    again (a link that is down), and another run answering at the address is refused."""
    import torch  # the GPUs here, which the manager must know of before it gives ranks for cuda learners

    asks = {"learners": config.learners, "gpus": torch.cuda.device_count(), "learn_id": learn_id}
    if run_id is not None:
        asks["rejoin"] = True
    started = time.monotonic()
    answered = 0.0  # when the manager first answered: wait_s counts from then
    while True:
        try:
            reply = probe_manager(config.endpoint, curve=config.curve, timeout_s=config.probe_timeout_s, asks=asks)
        except TransportError as exc:
            if run_id is None:
                raise
            silent_s = time.monotonic() - started
            if silent_s >= config.rejoin_for_s:
                raise TransportError(
                    f"the manager has not answered for {silent_s:.0f}s (--rejoin-for {config.rejoin_for_s:.0f}): the "
                    f"run is over or out of reach ({exc})"
                ) from None
            time.sleep(_STARTING_RETRY_S)
            continue
        if run_id is not None and reply.get("run_id") != run_id:
            raise ConfigError(f"{config.endpoint} now serves another run than the one these learners joined")
        if not (isinstance(reply.get("learners"), dict) and reply["learners"].get("starting")):
            return reply
        answered = answered or time.monotonic()
        if time.monotonic() - answered > config.wait_s:
            raise TransportError(
                f"the run at {config.endpoint} did not take these learners within {config.wait_s:.0f}s (--wait): its "
                "compute process is still starting, or its learners' group does not re-form"
            )
        time.sleep(_STARTING_RETRY_S)


def learn(config: LearnConfig) -> int:
    """Take learner ranks of the run and run a learner process for each, again each time the run forms a new group
    of learners; returns the exit code."""
    learn_id = secrets.token_hex(8)
    run_id: str | None = None
    spares: list[WarmProcess] = []
    """Learner processes waiting, their imports done, for the next group: kept once a group has broken."""
    try:
        while True:
            try:
                reply = ask_for_ranks(config, learn_id, run_id=run_id)
                plan = learner_plan(reply, config.endpoint)
            except TransportError as exc:
                logger.error("%s", exc)
                return exit_codes.UNREACHABLE if run_id is None else exit_codes.MANAGER_LOST
            except FlareError as exc:
                logger.error("%s", exc)
                return exit_codes.CONFIG_ERROR
            except KeyboardInterrupt:
                # Between groups (a rejoin may wait long for a link): no learner runs here to stop.
                logger.info("interrupted while asking the run for learner ranks")
                return exit_codes.SIGINT
            code = _run_learners(plan, config.endpoint, spares, keep_spares=run_id is not None)
            if code not in (exit_codes.COMPUTE_RESTARTS, exit_codes.LEARNERS_PARTED):
                return code
            run_id = str(reply.get("run_id"))
            logger.info(
                "the run's learners %s: asking for ranks in its next group",
                "regroup" if code == exit_codes.COMPUTE_RESTARTS else "lost one another",
            )
            spares += [_spare_learner() for _ in range(config.learners - len(spares))]
    finally:
        for spare in spares:
            spare.discard()


def _spare_learner() -> WarmProcess:
    from flare2.runtime.compute.learner_main import learner_main

    return WarmProcess(learner_main.__module__)


def _run_learners(plan: list[Any], endpoint: str, spares: list[WarmProcess], *, keep_spares: bool) -> int:
    """One learner process per rank of ``plan`` (a spare of ``spares`` where one waits), waited for; the exit code of
    ``flare2 learn``, or the learners' COMPUTE_RESTARTS / LEARNERS_PARTED when they left a group the run forms again.
    ``keep_spares``: the group is a re-formed one, and ``spares`` is filled again for the next as this one learns."""
    from flare2.runtime.compute.learner_main import learner_main

    logger.info(
        "learners %s of %d join the run at %s (its learners meet at %s)",
        ", ".join(str(settings.rank) for settings in plan),
        plan[0].learners,
        endpoint,
        plan[0].rendezvous,
    )
    processes = []
    for settings in plan:
        warm = spares.pop() if spares else _spare_learner()
        processes.append(warm.run(f"flare2-learner-{settings.rank}", learner_main, settings, None, None))
    if keep_spares:
        spares += [_spare_learner() for _ in plan]
    try:
        for process in processes:
            process.join()
    except KeyboardInterrupt:
        logger.info("interrupted: the learners here stop, and the run's group with them")
        for process in processes:
            process.kill()
            process.join()
        return exit_codes.SIGINT
    codes = {process.exitcode for process in processes}
    if exit_codes.FAILED in codes:
        logger.error("learner(s) here failed in the run's code (the traceback above): the run stops")
        return exit_codes.FAILED
    if codes == {exit_codes.OK}:
        logger.info("the run stopped its learners")
        return exit_codes.OK
    killed = sorted(exit_codes.describe(code) for code in codes if code is not None and code < 0)
    if killed:
        # Killed from outside (the out-of-memory killer, say): the run goes on without it, and it may come back.
        logger.error("a learner here %s", ", ".join(killed))
    return exit_codes.COMPUTE_RESTARTS if codes == {exit_codes.COMPUTE_RESTARTS} else exit_codes.LEARNERS_PARTED
