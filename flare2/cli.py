"""The ``flare2`` command: ``flare2 train`` trains a Gymnasium env with a zoo algorithm, ``flare2 eval`` plays the
result, ``flare2 plot`` draws curves, ``flare2 tune`` searches settings, ``flare2 attach`` joins a run from another
machine, ``flare2 learn`` adds learners from another machine, ``flare2 slurm`` runs attach on the nodes of a Slurm cluster, ``flare2 keys`` makes CURVE keys."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from flare2 import __version__
from flare2.errors import ConfigError
from flare2.runtime.config import REJOIN_FOR_S, RunConfig


def _attach(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from flare2.commands.attach import AttachConfig, attach
    from flare2.wire.security import load_client

    kwargs = None
    if args.agent_kwargs is not None:
        try:
            kwargs = json.loads(args.agent_kwargs)
            if not isinstance(kwargs, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            parser.error(f"--agent-kwargs must be a JSON object ({exc})")
    try:
        curve = load_client(args.keys, args.key_name) if args.keys else None
        config = AttachConfig(
            endpoint=args.endpoint,
            agent_path=args.agent,
            agent_kwargs=kwargs,
            num_agents=args.num_agents,
            envs_per_agent=args.envs_per_agent,
            seed=args.seed,
            curve=curve,
            max_restarts=args.max_restarts,
            rejoin_for_s=args.rejoin_for,
        )
    except ConfigError as exc:
        parser.error(str(exc))
    return attach(config)


def _slurm(args: argparse.Namespace, parser: argparse.ArgumentParser, nodes: dict[str, argparse.ArgumentParser]) -> int:
    from flare2.commands.slurm import SlurmJob, submit

    command = "learn" if args.learn else "attach"
    # The nodes' options are checked here, so that a typo fails now rather than on every node of the job.
    nodes[command].parse_args([args.endpoint, *args.node_options])
    try:
        job = SlurmJob(
            endpoint=args.endpoint,
            node_options=tuple(args.node_options),
            nodes=args.nodes,
            command=command,
            partition=args.partition,
            time=args.time,
            cpus_per_node=args.cpus_per_node,
            output=args.output,
            python=args.python,
            sbatch_options=tuple(args.sbatch),
        )
        if args.print_script:
            print(job.script(), end="")
            return 0
        job_id = submit(job)
    except ConfigError as exc:
        parser.error(str(exc))
    print(
        f"submitted Slurm job {job_id}: one flare2 {command} on each of {args.nodes} node(s); scancel {job_id} ends them"
    )
    return 0


def _learn(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from flare2.commands.learn import LearnConfig, learn
    from flare2.wire.security import load_client

    try:
        curve = load_client(args.keys, args.key_name) if args.keys else None
        config = LearnConfig(
            endpoint=args.endpoint, learners=args.learners, curve=curve, wait_s=args.wait, rejoin_for_s=args.rejoin_for
        )
    except ConfigError as exc:
        parser.error(str(exc))
    return learn(config)


def _keys(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from flare2.wire.security import make_keys

    try:
        written = make_keys(args.directory, args.name)
    except ConfigError as exc:
        parser.error(str(exc))
    for path in written:
        print(path)
    print(
        f"\nOn the manager's machine: --keys {args.directory} (it needs server.key_secret and allowed/).\n"
        f"On each attaching machine: copy server.key and {args.name}.key_secret into a folder and pass it as --keys."
    )
    return 0


def _add_attach(commands: Any) -> argparse.ArgumentParser:
    """``flare2 attach``: agents here that join a run on another machine."""
    attach = commands.add_parser("attach", help="start agents here that join a run on another machine")
    attach.add_argument("endpoint", help="the manager's control endpoint, tcp://HOST:PORT (its log prints it)")
    attach.add_argument(
        "--agent",
        default=None,
        help="Agent class, package.module:Class or file.py:Class (default: the run's; another one is refused)",
    )
    attach.add_argument(
        "--agent-kwargs",
        default=None,
        help="JSON object of the agent's keyword arguments (default: the run's; settings that differ are refused)",
    )
    attach.add_argument("--num-agents", type=int, default=1, help="agent processes to start here")
    attach.add_argument(
        "--envs-per-agent", type=int, default=None, help="environments each of them plays (default: as the run's)"
    )
    attach.add_argument("--seed", type=int, default=None, help="seeds the agents' envs (default: the run's seed)")
    attach.add_argument(
        "--rejoin-for",
        type=float,
        default=REJOIN_FOR_S,
        metavar="SECONDS",
        help="how long agents that lost the manager (a link down) wait for it to answer again before this command "
        "gives up",
    )
    attach.add_argument(
        "--max-restarts",
        type=int,
        default=RunConfig.max_restarts,
        help="agent failures restarted (after a backoff) before this command gives up",
    )
    attach.add_argument(
        "--keys", default=None, metavar="DIR", help="folder with server.key and the client's key_secret"
    )
    attach.add_argument("--key-name", default="client", help="which client pair in --keys to use (NAME.key_secret)")
    attach.set_defaults(run=_attach, parser=attach)

    return attach


def _add_learn(commands: Any) -> argparse.ArgumentParser:
    """``flare2 learn``: learners here that join a run's learners."""
    learn = commands.add_parser(
        "learn",
        help="start learners here that join the learners of a run on another machine (its --remote-learners)",
        description="Take --learners of the ranks a run started with --learners N --remote-learners K waits for, "
        "and run a learner process for each: the run sends the recipe (algorithm, settings, env, device kind) and "
        "the learners meet through torch.distributed's rendezvous at the run's address. torch.distributed's traffic "
        "is neither encrypted nor authenticated: use it on a network the run trusts.",
    )
    learn.add_argument("endpoint", help="the manager's control endpoint, tcp://HOST:PORT (its log prints it)")
    learn.add_argument(
        "--learners", type=int, default=1, help="learner processes here (one GPU each when the run learns on cuda)"
    )
    learn.add_argument(
        "--wait",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for the run to take these learners (its compute process starting, its learners' group "
        "re-forming)",
    )
    learn.add_argument(
        "--rejoin-for",
        type=float,
        default=REJOIN_FOR_S,
        metavar="SECONDS",
        help="after the learners' group broke, how long to wait for a manager that does not answer (a link down)",
    )
    learn.add_argument("--keys", default=None, metavar="DIR", help="folder with server.key and the client's key_secret")
    learn.add_argument("--key-name", default="client", help="which client pair in --keys to use (NAME.key_secret)")
    learn.set_defaults(run=_learn, parser=learn)

    return learn


def _add_slurm(commands: Any, attach: argparse.ArgumentParser, learn: argparse.ArgumentParser) -> None:
    """``flare2 slurm``: attach or learn on the nodes of a Slurm cluster."""
    slurm = commands.add_parser(
        "slurm",
        help="run flare2 attach (or learn) on the nodes of a Slurm cluster: flare2 slurm --nodes K tcp://HOST:PORT "
        "--keys DIR",
        description="Submit a Slurm job that runs one `flare2 attach ENDPOINT OPTIONS` (with --learn, one `flare2 "
        "learn ENDPOINT OPTIONS`) on each of --nodes nodes (sbatch, then srun). The nodes need the same Python "
        "environment and keys folder (a shared filesystem).",
    )
    slurm.add_argument("--nodes", type=int, required=True, help="nodes to start one flare2 attach (or learn) on each")
    slurm.add_argument(
        "--learn", action="store_true", help="run flare2 learn (learners of a run's --remote-learners), not attach"
    )
    slurm.add_argument("--partition", default=None, help="Slurm partition (default: the cluster's)")
    slurm.add_argument("--time", default=None, help="the job's time limit, as sbatch takes it (4:00:00)")
    slurm.add_argument("--cpus-per-node", type=int, default=None, help="CPUs to ask for on each node")
    slurm.add_argument(
        "--output",
        default=None,
        help="the job's log file (%%j: the job id; default flare2-attach-%%j.out or flare2-learn-%%j.out)",
    )
    slurm.add_argument("--python", default=sys.executable, help="the Python the nodes run flare2 with")
    slurm.add_argument(
        "--sbatch", action="append", default=[], metavar="OPTION", help="one more sbatch option (--account=lab)"
    )
    slurm.add_argument("--print-script", action="store_true", help="print the batch script instead of submitting it")
    slurm.add_argument("endpoint", help="the manager's control endpoint, tcp://HOST:PORT")
    slurm.add_argument(
        "node_options",
        nargs=argparse.REMAINDER,
        help="options of flare2 attach (or learn) for every node (--keys DIR ...)",
    )
    slurm.set_defaults(run=lambda args, parser: _slurm(args, parser, {"attach": attach, "learn": learn}), parser=slurm)


def _add_keys(commands: Any) -> None:
    """``flare2 keys``: CurveZMQ key pairs."""
    keys = commands.add_parser("keys", help="make CurveZMQ key pairs for a run that other machines join")
    keys.add_argument("directory", help="where the keys go")
    keys.add_argument("--name", default="client", help="name of the client pair to add (and allow)")
    keys.set_defaults(run=_keys, parser=keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flare2", description="flare2: a reinforcement-learning runtime.")
    parser.add_argument("--version", action="version", version=f"flare2 {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    # Its options depend on --algo, so it parses its own command line (below).
    commands.add_parser(
        "train", help="train a Gymnasium env with a zoo algorithm: flare2 train --env ID --algo NAME", add_help=False
    )
    commands.add_parser("eval", help="play episodes with a run of flare2 train: flare2 eval RUN_DIR", add_help=False)
    commands.add_parser(
        "plot", help="return against env steps of runs: flare2 plot RUN_DIR ... -o curve.png", add_help=False
    )
    commands.add_parser(
        "tune",
        help="search an algorithm's settings for an env with Optuna: flare2 tune --env ID --algo NAME",
        add_help=False,
    )

    attach, learn = _add_attach(commands), _add_learn(commands)
    _add_slurm(commands, attach, learn)
    _add_keys(commands)

    if argv is None:
        # As `python -m` does: modules of the working directory (an env's --env mygames.tag_v0 or mymodule:MyEnv-v0, an
        # agent's mymodule:MyAgent) import here as they do in the processes the run starts, and in a spawned compute
        # process, which takes this sys.path.
        sys.path.insert(0, os.getcwd())
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        from flare2.commands.train import main as train

        return train(argv[1:])
    if argv[:1] == ["eval"]:
        from flare2.commands.evaluate import main as evaluate

        return evaluate(argv[1:])
    if argv[:1] == ["plot"]:
        from flare2.commands.plot import main as plot

        return plot(argv[1:])
    if argv[:1] == ["tune"]:
        from flare2.commands.tune import main as tune

        return tune(argv[1:])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    return args.run(args, args.parser)


if __name__ == "__main__":
    sys.exit(main())
