"""`flare2 slurm` on a real Slurm cluster of two nodes, made of network namespaces: slurmctld on host A (beside the
run's manager), a slurmd on each of hosts B and C, munge for their authentication. Needs root, iproute2 and
Debian's slurm-wlm and munge packages; skipped otherwise."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from netns import Hosts, needs_root, three_hosts
from runs import CARTPOLE, RunProcess, wait_until_gone
from test_remote_learners import run_on_host_a_with_keys

from flare2.runtime import exit_codes

PORT = 47350
SLURM_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue")

pytestmark = [
    needs_root,
    pytest.mark.skipif(
        any(shutil.which(program) is None for program in SLURM_PROGRAMS),
        reason="needs Slurm and munge (Debian: apt install slurm-wlm munge)",
    ),
]

# slurmd's cgroup plugin wants the cgroup hierarchies under /sys/fs/cgroup, which `ip netns exec` mounts afresh.
SLURMD = (
    "mount -t tmpfs none /sys/fs/cgroup && for c in freezer cpuset memory devices cpu cpuacct pids; do "
    "mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c none /sys/fs/cgroup/$c; done; exec slurmd -f {conf} -N {node}"
)


def slurm_conf(directory: Path, hosts: Hosts, munge_socket: Path) -> str:
    nodes = {"nodeb": hosts.address[hosts.b], "nodec": hosts.address[hosts.c]}
    lines = [
        "ClusterName=flare2test",
        f"SlurmctldHost={socket.gethostname()}({hosts.address[hosts.a]})",
        "SlurmctldPort=16817",
        "SlurmdPort=16818",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={directory}/state",
        f"SlurmdSpoolDir={directory}/spool/%n",
        f"SlurmctldPidFile={directory}/slurmctld.pid",
        f"SlurmdPidFile={directory}/slurmd-%n.pid",
        f"SlurmctldLogFile={directory}/slurmctld.log",
        f"SlurmdLogFile={directory}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/linear",
        "MpiDefault=none",
        "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        *(f"NodeName={node} NodeAddr={address} State=UNKNOWN" for node, address in nodes.items()),
        f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def cluster(monkeypatch):
    """Hosts A, B and C with Slurm: the controller on A, nodes nodeb and nodec on B and C."""
    # slurmstepd and munged make Unix sockets in these folders, whose paths may not pass 108 bytes: pytest's tmp_path
    # (/tmp/pytest-of-USER/pytest-N/popen-gwK/test_.../) grows past that as N grows.
    directory = Path(tempfile.mkdtemp(prefix="fl2slurm-", dir="/tmp"))
    for sub in ("state", "spool/nodeb", "spool/nodec", "munge"):
        (directory / sub).mkdir(parents=True)
    key = directory / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    munge_socket = directory / "munge" / "munge.socket"
    munged_pid = directory / "munge" / "munged.pid"
    subprocess.run(
        ["munged", "--force", f"--key-file={key}", f"--socket={munge_socket}", f"--pid-file={munged_pid}"]
        + [f"--seed-file={directory}/munge/seed", f"--log-file={directory}/munge/munged.log"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    try:
        with three_hosts(subnet=8) as hosts:
            conf = directory / "slurm.conf"
            conf.write_text(slurm_conf(directory, hosts, munge_socket))
            (directory / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")
            monkeypatch.setenv("SLURM_CONF", str(conf))
            subprocess.run(hosts.run_in(hosts.a, "slurmctld", "-f", str(conf)), check=True, timeout=30)
            for host, node in ((hosts.b, "nodeb"), (hosts.c, "nodec")):
                command = SLURMD.format(conf=conf, node=node)
                subprocess.run(hosts.run_in(host, "sh", "-c", command), check=True, timeout=30)
            yield hosts, directory
    finally:
        pid = int(munged_pid.read_text())
        os.kill(pid, signal.SIGKILL)
        assert wait_until_gone([pid], timeout_s=10) == []
        shutil.rmtree(directory, ignore_errors=True)


def test_flare2_slurm_starts_an_attach_on_each_node_and_the_run_counts_their_agents(tmp_path, cluster):
    hosts, directory = cluster
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "flare2.cli", "keys", str(keys)], check=True, capture_output=True, timeout=60)
    address = hosts.address[hosts.a]
    manager = RunProcess(
        CARTPOLE,
        "--num-agents",
        "1",
        "--envs-per-agent",
        "2",
        "--max-steps",
        "100000000",
        "--progress-interval",
        "0.5",
        "--device",
        "cpu",
        "--bind",
        address,
        "--port",
        str(PORT),
        "--keys",
        str(keys),
        log_dir=tmp_path / "run",
        prefix=tuple(hosts.run_in(hosts.a)),
    )
    job = None
    try:
        manager.wait_for_line(r"compute process is up", timeout_s=120)
        output = str(tmp_path / "attach-%j.out")
        submitted = subprocess.run(
            hosts.run_in(hosts.a, sys.executable, "-m", "flare2.cli", "slurm", "--nodes", "2", "--output", output)
            + [f"tcp://{address}:{PORT}", "--keys", str(keys), "--num-agents", "1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.split()[3].rstrip(":")
        # One attach on each node, each with the run's recipe (its agent with 2 envs).
        manager.wait_for_line(r"agents 1 local, 2 remote, 6 envs", timeout_s=120)
        manager.process.send_signal(signal.SIGINT)
        assert manager.wait(timeout_s=30) == exit_codes.SIGINT
        # The run's stop ends each node's attach, and the job with them.
        wait_for_the_job_to_end(hosts, job)
        # The job's log: both nodes' attach, each with the run's recipe, each ended by the run's stop.
        log = (tmp_path / f"attach-{job}.out").read_text()
        assert log.count("starting 1 agent(s) of flare2.core.envs:GymAgent with 2 env(s) each") == 2, log
        assert log.count("all agents have left (exit codes [0])") == 2, log
    finally:
        manager.stop()


def test_flare2_slurm_learn_starts_a_learner_on_a_node_that_joins_the_runs_learners(tmp_path, cluster):
    hosts, _ = cluster
    manager, keys = run_on_host_a_with_keys(hosts, tmp_path, PORT)
    try:
        output = str(tmp_path / "learn-%j.out")
        submitted = subprocess.run(
            hosts.run_in(hosts.a, sys.executable, "-m", "flare2.cli", "slurm", "--learn", "--nodes", "1")
            + ["--output", output, f"tcp://{hosts.address[hosts.a]}:{PORT}", "--keys", str(keys)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.split()[3].rstrip(":")
        manager.wait_for_line(r"learner ranks 1..1 go to a flare2 learn on another machine", timeout_s=120)
        # The run learns with the node's learner to its budget, and its stop ends the learner and the job.
        assert manager.wait(timeout_s=180) == exit_codes.OK
        wait_for_the_job_to_end(hosts, job)
        log = (tmp_path / f"learn-{job}.out").read_text()
        assert "learner 1 joined the run's learners" in log and "the run stopped its learners" in log, log
    finally:
        manager.stop()


def wait_for_the_job_to_end(hosts: Hosts, job: str) -> None:
    """The run's stop ends each node's command, and the job with them, within a minute."""
    deadline = time.monotonic() + 60
    while job_is_queued(hosts, job):
        assert time.monotonic() < deadline, f"job {job} still running 60 s after the run ended"
        time.sleep(0.5)


def job_is_queued(hosts: Hosts, job: str) -> bool:
    listed = subprocess.run(
        hosts.run_in(hosts.a, "squeue", "-h", "-j", job), capture_output=True, text=True, timeout=30
    ).stdout
    return bool(listed.strip())
