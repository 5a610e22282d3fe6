"""``flare2 slurm``: a run's remote agents (or learners) on the nodes of a Slurm cluster, one ``flare2 attach`` (or,
with ``--learn``, one ``flare2 learn``) per node.

It writes a batch script that asks for ``--nodes`` nodes with one task each
and runs ``flare2 attach ENDPOINT ...`` there through ``srun``, and submits it
with ``sbatch`` (``--print-script`` shows it instead). Slurm only places the
processes: each attach reaches the manager over flare2's own ZeroMQ + CURVE,
takes the run's recipe, rejoins after a network outage and ends when the run
ends, and the job with them; each ``flare2 learn`` takes learner ranks of a run
started with ``--remote-learners`` the same way. The nodes must see the same Python environment
and the keys folder where the submitting machine does (a shared filesystem,
as clusters have; ``--python`` names another interpreter).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

from flare2.errors import ConfigError

NODE_COMMANDS = ("attach", "learn")
"""What a job may run on each node: ``flare2 attach`` (agents) or ``flare2 learn`` (learners)."""


@dataclass(frozen=True)
class SlurmJob:
    endpoint: str
    node_options: tuple[str, ...]
    """Options of the node command (``--keys DIR --num-agents 2`` ...), given to each node's as they are."""
    nodes: int
    command: str = "attach"
    """The node command, one of NODE_COMMANDS."""
    partition: str | None = None
    time: str | None = None
    """Slurm's time limit (``4:00:00``); None: the partition's."""
    cpus_per_node: int | None = None
    output: str | None = None
    """Where each node's log goes (Slurm's ``%j`` is the job id, ``%N`` the node); None: flare2-COMMAND-%j.out."""
    python: str = sys.executable
    sbatch_options: tuple[str, ...] = ()
    """More ``#SBATCH`` lines, as sbatch takes them (``--account=lab``, ``--qos=long``)."""

    def __post_init__(self) -> None:
        if self.command not in NODE_COMMANDS:
            raise ConfigError(
                f"a Slurm job runs flare2 {' or '.join(NODE_COMMANDS)} on its nodes, not {self.command!r}"
            )
        if self.nodes < 1:
            raise ConfigError(f"--nodes must be >= 1, got {self.nodes}")
        if self.cpus_per_node is not None and self.cpus_per_node < 1:
            raise ConfigError(f"--cpus-per-node must be >= 1, got {self.cpus_per_node}")
        for option in self.sbatch_options:
            if not option.startswith("--") or "\n" in option:
                raise ConfigError(f"--sbatch takes one sbatch option such as --account=lab, got {option!r}")

    def script(self) -> str:
        """The batch script: the allocation, then one node command per node."""
        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name=flare2-{self.command}",
            f"#SBATCH --nodes={self.nodes}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --output={self.output or f'flare2-{self.command}-%j.out'}",
        ]
        if self.cpus_per_node is not None:
            lines.append(f"#SBATCH --cpus-per-task={self.cpus_per_node}")
        if self.partition:
            lines.append(f"#SBATCH --partition={self.partition}")
        if self.time:
            lines.append(f"#SBATCH --time={self.time}")
        lines += [f"#SBATCH {option}" for option in self.sbatch_options]
        command = [self.python, "-m", "flare2.cli", self.command, self.endpoint, *self.node_options]
        lines += [
            "",
            f"# One flare2 {self.command} per node; each ends when the run does (or on scancel), and the job with them.",
            # A node whose attach fails must not take the other nodes' agents down with it.
            f"srun --kill-on-bad-exit=0 {shlex.join(command)}",
            "",
        ]
        return "\n".join(lines)


def submit(job: SlurmJob) -> str:
    """Submit the job with ``sbatch``; returns its id. ConfigError when there is no sbatch or it refuses the job."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise ConfigError(
            "sbatch is not on PATH: run flare2 slurm on a machine of the Slurm cluster (a login node), or write the "
            "script out with --print-script and submit it there"
        )
    result = subprocess.run([sbatch, "--parsable"], input=job.script(), capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise ConfigError(f"sbatch refused the job: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout.strip().split(";")[0]
