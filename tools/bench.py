"""Throughput and latency of flare2, each held against a baseline measured in the same run.

    python tools/bench.py [--quick] [--json FILE] [--train-args "--num-agents 8"] [--log-root DIR]
                          [--device cuda] [--procs 1,4,16] [--envs-per-proc 8,128]

One run measures four sections and prints a markdown table for each, then a
summary of three ratios (and writes everything with ``--json FILE``):

(a) Raw ZeroMQ baselines, no flare2 code on the hot path: a ROUTER echo server
    in a process of its own answers a DEALER client that packs a small msgpack
    message (``{"inputs": {"obs": <16 bytes>}}``), sends it, waits for the echo
    and unpacks it. Measured: the median round trip of one client, and the
    round trips/s of 8 client processes in lock-step against one server that
    drains everything waiting before it answers each.
(b) The in-process baseline: ``gymnasium.vector.SyncVectorEnv`` of N CartPole
    envs stepped with flare2's A2C model (``ActorCritic``, hidden 64-64, one
    torch thread) in one process: env steps/s for each N that a configuration
    of (c) plays, and the act path alone (``model.sample(model.policy({"obs": x}))`` at
    batch 1) in µs.
(c) flare2 rollout without learning: a real run (manager, compute process and
    P agent processes of ``tools/bench_agents.py:RolloutAgent``, which sends
    predict requests of E rows and no learn request) for P x E configurations,
    and a few of them again with double buffering (two halves of E/2 rows),
    stopped with SIGINT after a fixed time. From progress.csv, start-up left
    out: env steps/s, prediction round trip p50/p99 as the agents time it, mean
    batch (env rows per forward pass); from /proc: peak RSS of the process tree,
    and "others' cores", the CPU the rest of the machine used meanwhile (high:
    the figure is depressed by other work).
(d) flare2 training as a user runs it: ``examples/cartpole_a2c.py`` (60k steps)
    and ``examples/cartpole_ppo.py`` (40k steps) with their default agents and
    envs, and the same commands with ``--serial`` (everything in one process)
    as their in-process baseline. Each command also gets ``--progress-interval 1``
    so that progress.csv has the rows the steady-state rate is taken between;
    ``--train-args`` appends more options to all four.

Why ratios: the machine is shared and noisy, so a raw rate says little from one
run to the next; a ratio against a baseline measured minutes earlier on the same
machine says how much flare2 costs. The summary holds:

- ``rtt_ratio``: flare2's prediction round trip (1 process x 1 env, p50) over
  the raw echo round trip plus the in-process act path at batch 1 (1.0 would be
  a runtime that costs nothing beyond a socket round trip and the forward pass;
  flare2's figure is the middle of a histogram bucket about 4.4 % wide);
- ``rollout_vs_echo_8``: flare2 rollout steps/s at 8 processes x 1 env over the
  raw 8-client echo rate (the most round trips/s the sockets allow);
- ``rollout_vs_syncvec_best``: the best flare2 rollout rate of (c) over the
  SyncVectorEnv rate at that configuration's env count.

``--quick`` runs fewer and shorter measurements (about two minutes on two cores).
``--procs`` and ``--envs-per-proc`` replace the P x E grid of (c) (and leave out
its double-buffered runs). ``--device cuda`` puts the model of (b), (c) and (d)
on the GPU; (c) then also reports the GPU's utilisation, the share of time a
kernel ran as NVML counts it (from the ``nvidia-ml-py`` package, sampled every
0.1 s over the steady window), and forward passes/s for every configuration.

Internal: ``--run-rollout PROCS ENVS LOGDIR SECONDS`` is the manager script of
one configuration of (c); the bench starts it in a subprocess.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import multiprocessing
import os
import platform
import shlex
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack
import zmq

# This module is also imported as __mp_main__ by the processes it spawns (echo server and clients, flare2's
# compute process): keep its top level light (no torch, no gymnasium, no flare2).
TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from proctree import Measured, MeasureTimeout, run_measured  # noqa: E402

ENV_ID = "CartPole-v1"
ECHO_MESSAGE = {"inputs": {"obs": bytes(range(16))}}
ECHO_STOP = b"bench-stop"
ECHO_CLIENTS = 8
REPLY_TIMEOUT_MS = 10_000
STARTUP_LIMIT_S = 120.0
"""How long a flare2 run may take to have every agent playing before the bench gives up on it."""
TRAIN_TIMEOUT_S = 900.0
TRAIN_COMMANDS = {
    "a2c": ("examples/cartpole_a2c.py", 60_000),
    "ppo": ("examples/cartpole_ppo.py", 40_000),
}
WINDOW_FILE = "bench_window.json"
"""Written by --run-rollout into its log dir: the progress.csv rows (data-row indices) of the steady state."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one bench run measures, and for how long."""

    procs: tuple[int, ...]
    envs_per_proc: tuple[int, ...]
    rollout_s: float
    echo_round_trips: int
    echo_aggregate_s: float
    syncvec_s: float
    act_calls: int
    double_buffered: tuple[tuple[int, int], ...] = ()
    """(procs, envs per proc) also measured with GymAgent's double buffering (two halves of the envs alternate)."""

    @property
    def total_envs(self) -> list[int]:
        counts = {p * e for p in self.procs for e in self.envs_per_proc} | {p * e for p, e in self.double_buffered}
        return sorted(counts)


FULL = Plan(
    procs=(1, 2, 4, 8),
    envs_per_proc=(1, 8, 32, 128),
    rollout_s=6.0,
    echo_round_trips=5000,
    echo_aggregate_s=3.0,
    syncvec_s=2.0,
    act_calls=5000,
    double_buffered=((1, 32), (2, 32), (1, 128), (2, 128)),
)
QUICK = Plan(
    procs=(1, 2, 8),
    envs_per_proc=(1, 32),
    rollout_s=3.0,
    echo_round_trips=2000,
    echo_aggregate_s=1.0,
    syncvec_s=1.0,
    act_calls=2000,
    double_buffered=((1, 32),),
)


class BenchError(RuntimeError):
    """One measurement failed; the bench records it and goes on with the others."""


# ---- (a) raw ZeroMQ echo ------------------------------------------------------------------------------------


def echo_server(endpoints: Any, parent_pid: int) -> None:
    """ROUTER echo server (a spawned process): drain every waiting message, then send each back unchanged."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    endpoints.put(f"tcp://127.0.0.1:{port}")
    try:
        while os.getppid() == parent_pid:
            if not sock.poll(1000):
                continue
            waiting = []
            while True:
                try:
                    waiting.append(sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
            for frames in waiting:
                if frames[-1] == ECHO_STOP:
                    return
                sock.send_multipart(frames)
    finally:
        sock.close()
        ctx.term()


def _dealer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, REPLY_TIMEOUT_MS)
    sock.connect(endpoint)
    return sock


def _echo_once(sock: zmq.Socket) -> None:
    sock.send(msgpack.packb(ECHO_MESSAGE))
    msgpack.unpackb(sock.recv())  # zmq.Again after REPLY_TIMEOUT_MS


class EchoServer:
    """The echo server process, started on enter and stopped (and waited for) on exit."""

    def __init__(self) -> None:
        self.endpoint = ""
        self._mp = multiprocessing.get_context("spawn")
        self._process: Any = None

    def __enter__(self) -> EchoServer:
        endpoints = self._mp.Queue()
        self._process = self._mp.Process(
            target=echo_server, args=(endpoints, os.getpid()), name="bench-echo", daemon=True
        )
        self._process.start()
        try:
            self.endpoint = endpoints.get(timeout=60)
        except Exception:
            self.__exit__(None, None, None)
            raise BenchError("the echo server did not come up within 60 s") from None
        return self

    def __exit__(self, *_exc: Any) -> None:
        if self.endpoint:
            ctx = zmq.Context()
            try:
                sock = _dealer(ctx, self.endpoint)
                sock.send(ECHO_STOP)
                sock.close(linger=2000)  # linger, or the stop message is dropped unsent
            finally:
                ctx.term()
        _join_or_kill([self._process])


def _join_or_kill(processes: Sequence[Any], timeout_s: float = 5.0) -> None:
    """Wait for multiprocessing children; terminate, then kill, those still running after timeout_s."""
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(2.0)
        if process.is_alive():
            process.kill()
            process.join()


def echo_round_trips(endpoint: str, count: int, warmup: int = 500) -> list[float]:
    """Round trip times (s) of one client in this process, after ``warmup`` untimed ones."""
    ctx = zmq.Context()
    try:
        sock = _dealer(ctx, endpoint)
        try:
            for _ in range(warmup):
                _echo_once(sock)
            times = []
            for _ in range(count):
                started = time.perf_counter()
                _echo_once(sock)
                times.append(time.perf_counter() - started)
            return times
        finally:
            sock.close()
    finally:
        ctx.term()


def echo_client(endpoint: str, ready: Any, start: Any, duration_s: float, results: Any) -> None:
    """One lock-step client (a spawned process): warm up, say ready, wait for the start, count round trips."""
    ctx = zmq.Context()
    sock = _dealer(ctx, endpoint)
    try:
        for _ in range(200):
            _echo_once(sock)
        ready.put(os.getpid())
        if not start.wait(60):
            return
        count, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < duration_s:
            _echo_once(sock)
            count += 1
        results.put((count, elapsed))
    finally:
        sock.close()
        ctx.term()


def echo_aggregate_rate(endpoint: str, clients: int, duration_s: float) -> float:
    """Round trips/s summed over ``clients`` client processes running at once for ``duration_s``."""
    mp = multiprocessing.get_context("spawn")
    ready, results, start = mp.Queue(), mp.Queue(), mp.Event()
    processes = [
        mp.Process(
            target=echo_client,
            args=(endpoint, ready, start, duration_s, results),
            name=f"bench-echo-client-{i}",
            daemon=True,
        )
        for i in range(clients)
    ]
    try:
        for process in processes:
            process.start()
        for _ in processes:
            ready.get(timeout=60)
        start.set()
        measured = [results.get(timeout=duration_s + 60) for _ in processes]
    except Exception as exc:
        raise BenchError(f"the {clients}-client echo test failed: {type(exc).__name__} {exc}") from None
    finally:
        start.set()
        _join_or_kill(processes, timeout_s=duration_s + 10)
    return sum(count / elapsed for count, elapsed in measured)


def measure_echo(plan: Plan) -> dict[str, Any]:
    with EchoServer() as server:
        times = echo_round_trips(server.endpoint, plan.echo_round_trips)
        aggregate = echo_aggregate_rate(server.endpoint, ECHO_CLIENTS, plan.echo_aggregate_s)
    return {
        "rtt_p50_us": statistics.median(times) * 1e6,
        "rtt_p99_us": _quantile(times, 0.99) * 1e6,
        "round_trips": len(times),
        "clients": ECHO_CLIENTS,
        "aggregate_round_trips_per_s": aggregate,
        "aggregate_duration_s": plan.echo_aggregate_s,
    }


# ---- (b) in-process baseline --------------------------------------------------------------------------------


def syncvec_steps_per_s(num_envs: int, duration_s: float, device: str, seed: int = 0) -> float:
    """Env steps/s of SyncVectorEnv(num_envs x CartPole) acting with flare2's A2C MLP in this process."""
    import gymnasium as gym
    import torch

    from flare2.zoo.models import ActorCritic

    torch.set_num_threads(1)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID) for _ in range(num_envs)])
    try:
        model = ActorCritic(envs.single_observation_space, envs.single_action_space).to(device)
        obs, _ = envs.reset(seed=seed)

        def act(obs: Any) -> Any:
            with torch.inference_mode():
                return model.sample(model.policy({"obs": torch.as_tensor(obs, device=device)})).cpu().numpy()

        for _ in range(20):
            obs = envs.step(act(obs))[0]
        iterations, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < duration_s:
            obs = envs.step(act(obs))[0]
            iterations += 1
        return iterations * num_envs / elapsed
    finally:
        envs.close()


def act_batch1_us(calls: int, device: str) -> float:
    """Median µs of ``model.sample(model.policy({"obs": x}))`` with x of shape (1, 4), one torch thread; on a GPU
    from a host array to the action back on the host, as an agent needs it."""
    import gymnasium as gym
    import numpy as np
    import torch

    from flare2.zoo.models import ActorCritic

    torch.set_num_threads(1)
    env = gym.make(ENV_ID)
    model = ActorCritic(env.observation_space, env.action_space).to(device)
    obs = np.zeros((1, 4), np.float32)

    def act() -> Any:
        return model.sample(model.policy({"obs": torch.as_tensor(obs, device=device)})).cpu()

    times = []
    with torch.inference_mode():
        for _ in range(200):
            act()
        for _ in range(calls):
            started = time.perf_counter()
            act()
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def measure_syncvec(plan: Plan, device: str) -> dict[str, Any]:
    return {
        "act_batch1_us": act_batch1_us(plan.act_calls, device),
        "rates": [{"envs": n, "steps_per_s": syncvec_steps_per_s(n, plan.syncvec_s, device)} for n in plan.total_envs],
        "duration_s": plan.syncvec_s,
    }


# ---- progress.csv -------------------------------------------------------------------------------------------


def read_progress(path: Path) -> list[dict[str, float]]:
    """The complete rows of a progress.csv as floats (NaN for 'nan'); [] while it does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    text = text[: text.rfind("\n") + 1]  # a row being written is left for the next read
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        try:
            rows.append({key: float(value) for key, value in row.items()})
        except (TypeError, ValueError):
            continue
    return rows


def first_steady_row(rows: list[dict[str, float]], agents: int | None = None) -> int | None:
    """Index of the first row with env steps and every agent playing (``agents``, or the most any row saw)."""
    if not rows:
        return None
    wanted = agents if agents is not None else max(row["agents"] for row in rows)
    return next((i for i, row in enumerate(rows) if row["env_steps"] > 0 and row["agents"] >= wanted), None)


def steady_state(rows: list[dict[str, float]], first: int, last: int) -> dict[str, Any]:
    """Rate between rows first and last; batch and round trips: means/medians of the rows after first."""
    if last <= first:
        raise BenchError(f"too few progress rows for a steady state (rows {first}..{last} of {len(rows)})")
    span = rows[last]["wall_time"] - rows[first]["wall_time"]
    window = rows[first + 1 : last + 1]

    def finite(column: str) -> list[float]:
        return [row[column] for row in window if math.isfinite(row[column])]

    batches, p50s, p99s = finite("batch_size_mean"), finite("predict_rtt_p50_ms"), finite("predict_rtt_p99_ms")
    steps_per_s = (rows[last]["env_steps"] - rows[first]["env_steps"]) / span
    batch_mean = statistics.fmean(batches) if batches else math.nan
    return {
        "steps_per_s": steps_per_s,
        "batch_mean": batch_mean,
        "forwards_per_s": steps_per_s / batch_mean if batch_mean > 0 else math.nan,
        "rtt_p50_ms": statistics.median(p50s) if p50s else math.nan,
        "rtt_p99_ms": statistics.median(p99s) if p99s else math.nan,
        "steady_s": span,
        "steady_rows": len(window),
        "return_mean": rows[last]["return_mean"],
    }


# ---- (c) flare2 rollout -------------------------------------------------------------------------------------


def build_rollout_a2c() -> Any:
    """The CT of the rollout runs: flare2's A2C with its default MLP (runs in the compute process)."""
    from flare2.core.env_making import make_gym_env
    from flare2.zoo.a2c import A2C
    from flare2.zoo.models import ActorCritic

    env = make_gym_env(ENV_ID)
    return A2C(ActorCritic(env.observation_space, env.action_space))


class GpuLoad:
    """The utilisation NVML reports for the GPU of ``device`` (the share of the last sample period in which a
    kernel ran), sampled by the caller; nothing for the CPU or without the ``nvidia-ml-py`` package."""

    def __init__(self, device: str) -> None:
        self._handle: Any = None
        self._samples: list[int] = []
        self.unavailable = "" if device.startswith("cuda") else "not on a GPU"
        if self.unavailable:
            return
        try:
            import pynvml
        except ImportError:
            self.unavailable = "nvidia-ml-py is not installed"
            return
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(int(device.partition(":")[2] or 0))
        except pynvml.NVMLError as exc:
            self.unavailable = f"NVML: {exc}"
        self._nvml = pynvml

    def sample(self) -> None:
        if self._handle is not None:
            self._samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def figures(self) -> dict[str, Any]:
        if not self._samples:
            return {"gpu_util_percent": None, "gpu_util_unavailable": self.unavailable or "no sample"}
        return {"gpu_util_percent": statistics.fmean(self._samples), "gpu_util_samples": len(self._samples)}


class _StopAfter(threading.Thread):
    """Watches progress.csv of a run in this process; once every agent has played ``seconds`` past start-up,
    notes the steady rows (and the GPU's load meanwhile) in WINDOW_FILE and sends this process SIGINT (the
    manager then stops the run)."""

    def __init__(self, log_dir: Path, agents: int, seconds: float, device: str) -> None:
        super().__init__(name="bench-stop-after", daemon=True)
        self.log_dir, self.agents, self.seconds = log_dir, agents, seconds
        self.gpu = GpuLoad(device)
        self.done = threading.Event()

    def _stop_run(self, window: dict[str, Any]) -> None:
        if self.done.is_set():
            return
        window.update(self.gpu.figures())
        (self.log_dir / WINDOW_FILE).write_text(json.dumps(window), encoding="utf-8")
        os.kill(os.getpid(), signal.SIGINT)

    def run(self) -> None:
        started = time.monotonic()
        first: int | None = None
        first_seen = 0.0
        while not self.done.wait(0.1):
            rows = read_progress(self.log_dir / "progress.csv")
            if first is None:
                first = first_steady_row(rows, self.agents)
                first_seen = time.monotonic()
                if first is None and time.monotonic() - started > STARTUP_LIMIT_S:
                    self._stop_run({"error": f"not every agent was playing after {STARTUP_LIMIT_S:.0f} s"})
                    return
                if first is None:
                    continue
            self.gpu.sample()
            until = rows[first]["wall_time"] + self.seconds - 0.05
            last = next((i for i in range(first + 1, len(rows)) if rows[i]["wall_time"] >= until), None)
            if last is not None:
                self._stop_run({"first_row": first, "last_row": last})
                return
            if time.monotonic() - first_seen > self.seconds + 30:
                self._stop_run({"error": f"progress rows stopped coming (last at {rows[-1]['wall_time']} s)"})
                return


def run_rollout(procs: int, envs: int, log_dir: str, seconds: float, device: str, double_buffer: bool = False) -> int:
    """The manager script of one rollout configuration (--run-rollout); returns the manager's exit code."""
    from flare2.runtime.config import AgentConfig, CTConfig, RunConfig
    from flare2.runtime.manager.manager import Manager

    config = RunConfig(
        cts=(CTConfig(name="RL", build=build_rollout_a2c),),
        agents=AgentConfig(
            path="tools/bench_agents.py:RolloutAgent",
            kwargs={"env_id": ENV_ID, "double_buffer": double_buffer},
            num_agents=procs,
            envs_per_agent=envs,
        ),
        # Nothing is learned: a learner process would only add its memory to the figures.
        log_dir=log_dir,
        max_steps=10**12,
        device=device,
        progress_interval_s=1.0,
        learner="inline",
    )
    watcher = _StopAfter(Path(log_dir), procs, seconds, device)
    watcher.start()
    try:
        return Manager(config).run()
    finally:
        watcher.done.set()
        watcher.join()


def _mb(measured: Measured) -> float:
    return measured.peak_rss_bytes / 2**20


def _measured_figures(measured: Measured) -> dict[str, Any]:
    """Exit code, wall time, peak RSS, and (where proctree gives them) the CPU seconds of the tree and of the
    rest of the machine meanwhile: much of the latter means others competed for the cores."""
    figures = {
        "exit_code": measured.returncode,
        "wall_s": measured.wall_s,
        "peak_rss_mb": _mb(measured),
        "leftover_processes": len(measured.leftover_pids),
    }
    for name in ("cpu_s", "others_cpu_s"):
        if hasattr(measured, name):
            figures[name] = float(getattr(measured, name))
    return figures


def _failure(what: str, measured: Measured) -> BenchError:
    tail = (measured.stderr or measured.stdout)[-1500:]
    return BenchError(f"{what} exited with code {measured.returncode}; its output ended with:\n{tail}")


def measure_rollout(
    procs: int, envs: int, seconds: float, log_root: Path, device: str, *, double_buffer: bool = False
) -> dict[str, Any]:
    """One configuration of (c), run as a subprocess measured by proctree."""
    log_dir = log_root / f"rollout_p{procs}_e{envs}{'_db' if double_buffer else ''}"
    command = [
        sys.executable,
        str(TOOLS / "bench.py"),
        "--run-rollout",
        str(procs),
        str(envs),
        str(log_dir),
        str(seconds),
        "--device",
        device,
        *(["--double-buffer"] if double_buffer else []),
    ]
    result: dict[str, Any] = {
        "procs": procs,
        "envs_per_proc": envs,
        "envs": procs * envs,
        "log_dir": str(log_dir),
        "double_buffer": double_buffer,
    }
    try:
        measured = run_measured(command, cwd=REPO, timeout_s=STARTUP_LIMIT_S + seconds + 60)
    except MeasureTimeout as exc:
        raise BenchError(str(exc)) from None
    result.update(_measured_figures(measured))
    # 130: stopped by the SIGINT of --run-rollout, as planned.
    if measured.returncode not in (0, 130):
        raise _failure(f"the rollout run {procs}x{envs}", measured)
    try:
        window = json.loads((log_dir / WINDOW_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise _failure(f"the rollout run {procs}x{envs} (no {WINDOW_FILE})", measured) from None
    if "error" in window:
        raise BenchError(f"the rollout run {procs}x{envs}: {window['error']}")
    result.update({key: value for key, value in window.items() if key.startswith("gpu_")})
    result.update(steady_state(read_progress(log_dir / "progress.csv"), window["first_row"], window["last_row"]))
    return result


# ---- (d) flare2 training ------------------------------------------------------------------------------------


def train_command(algo: str, log_dir: Path, extra: Sequence[str], serial: bool, device: str) -> list[str]:
    script, steps = TRAIN_COMMANDS[algo]
    return [
        sys.executable,
        script,
        "--max-steps",
        str(steps),
        "--log-dir",
        str(log_dir),
        "--device",
        device,
        "--seed",
        "0",
        "--progress-interval",
        "1",
        *extra,
        *(["--serial"] if serial else []),
    ]


def measure_train(algo: str, serial: bool, extra: Sequence[str], log_root: Path, device: str) -> dict[str, Any]:
    """One training command of (d), run to its budget as a subprocess measured by proctree."""
    mode = "serial" if serial else "flare2"
    log_dir = log_root / f"train_{algo}_{mode}"
    command = train_command(algo, log_dir, extra, serial, device)
    result: dict[str, Any] = {
        "algo": algo,
        "mode": mode,
        "command": shlex.join(["python", *command[1:]]),
        "log_dir": str(log_dir),
    }
    try:
        measured = run_measured(command, cwd=REPO, timeout_s=TRAIN_TIMEOUT_S)
    except MeasureTimeout as exc:
        raise BenchError(str(exc)) from None
    result.update(_measured_figures(measured))
    if measured.returncode != 0:
        raise _failure(f"{algo} {mode} training", measured)
    rows = read_progress(log_dir / "progress.csv")
    first = first_steady_row(rows)
    if first is None:
        raise BenchError(f"{algo} {mode} training: no progress row with env steps in {log_dir / 'progress.csv'}")
    result.update(steady_state(rows, first, len(rows) - 1))
    return result


# ---- tables and ratios --------------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or not math.isfinite(numerator) or not denominator:
        return None
    return numerator / denominator


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def syncvec_rate(syncvec: dict[str, Any] | None, envs: int) -> float | None:
    if syncvec is None:
        return None
    return next((r["steps_per_s"] for r in syncvec["rates"] if r["envs"] == envs), None)


def summary_ratios(echo: dict | None, syncvec: dict | None, rollout: list[dict]) -> dict[str, Any]:
    ok = [r for r in rollout if "error" not in r]
    one = next((r for r in ok if r["procs"] == 1 and r["envs_per_proc"] == 1), None)
    eight = next((r for r in ok if r["procs"] == 8 and r["envs_per_proc"] == 1), None)
    best = max(ok, key=lambda r: r["steps_per_s"], default=None)
    raw_rtt_us = echo["rtt_p50_us"] + syncvec["act_batch1_us"] if echo and syncvec else None
    return {
        "rtt_ratio": _ratio(one["rtt_p50_ms"] * 1000, raw_rtt_us) if one else None,
        "rollout_vs_echo_8": _ratio(eight["steps_per_s"], echo["aggregate_round_trips_per_s"])
        if eight and echo
        else None,
        "rollout_vs_syncvec_best": _ratio(best["steps_per_s"], syncvec_rate(syncvec, best["envs"])) if best else None,
        "rollout_best": {
            "procs": best["procs"],
            "envs_per_proc": best["envs_per_proc"],
            "double_buffer": best.get("double_buffer", False),
        }
        if best
        else None,
    }


def echo_table(echo: dict[str, Any]) -> str:
    return markdown_table(
        ["measurement", "value"],
        [
            ["round trip, 1 client, p50 (µs)", _fmt(echo["rtt_p50_us"], 1)],
            ["round trip, 1 client, p99 (µs)", _fmt(echo["rtt_p99_us"], 1)],
            [f"{echo['clients']} client processes, round trips/s (sum)", _fmt(echo["aggregate_round_trips_per_s"])],
        ],
    )


def syncvec_table(syncvec: dict[str, Any]) -> str:
    rows = [["act path, batch 1 (µs per sample(policy(x)))", _fmt(syncvec["act_batch1_us"], 1)]]
    rows += [[f"SyncVectorEnv, {r['envs']} envs (env steps/s)", _fmt(r["steps_per_s"])] for r in syncvec["rates"]]
    return markdown_table(["measurement", "value"], rows)


def _others_cores(result: dict[str, Any]) -> str:
    """Cores the rest of the machine kept busy during a run (from proctree, where it says)."""
    others = result.get("others_cpu_s")
    return _fmt(others / result["wall_s"], 2) if others is not None and result.get("wall_s") else "-"


def rollout_table(rollout: list[dict[str, Any]], syncvec: dict[str, Any] | None) -> str:
    rows = []
    for r in rollout:
        if "error" in r:
            rows.append([r["procs"], r["envs_per_proc"], r["envs"], "failed", *["-"] * 10])
            continue
        rows.append(
            [
                r["procs"],
                f"{r['envs_per_proc']}{' (2 halves)' if r.get('double_buffer') else ''}",
                r["envs"],
                _fmt(r["steps_per_s"]),
                _fmt(_ratio(r["steps_per_s"], syncvec_rate(syncvec, r["envs"])), 2),
                _fmt(r["rtt_p50_ms"], 3),
                _fmt(r["rtt_p99_ms"], 3),
                _fmt(r["batch_mean"], 2),
                _fmt(r["forwards_per_s"]),
                _fmt(r.get("gpu_util_percent")),
                _fmt(r["peak_rss_mb"]),
                _fmt(r["steady_s"], 1),
                _others_cores(r),
            ]
        )
    return markdown_table(
        [
            "procs",
            "envs/proc",
            "envs",
            "env steps/s",
            "vs SyncVectorEnv",
            "rtt p50 ms",
            "rtt p99 ms",
            "mean batch",
            "forward passes/s",
            "GPU util %",
            "peak RSS MB",
            "steady s",
            "others' cores",
        ],
        rows,
    )


def train_table(train: list[dict[str, Any]], ratios: dict[str, float | None]) -> str:
    rows = []
    for r in train:
        if "error" in r:
            rows.append([r["algo"], r["mode"], "failed", "-", "-", "-", "-", "-", "-", "-"])
            continue
        rows.append(
            [
                r["algo"],
                r["mode"],
                _fmt(r["steps_per_s"]),
                _fmt(ratios.get(r["algo"]), 2) if r["mode"] == "flare2" else "1.00",
                _fmt(r["wall_s"], 1),
                _fmt(r["peak_rss_mb"]),
                _fmt(r["batch_mean"], 2),
                _fmt(r["rtt_p50_ms"], 3),
                _fmt(r["return_mean"], 1),
                _others_cores(r),
            ]
        )
    return markdown_table(
        [
            "algo",
            "mode",
            "env steps/s",
            "flare2/serial",
            "wall s",
            "peak RSS MB",
            "mean batch",
            "rtt p50 ms",
            "return (last row)",
            "others' cores",
        ],
        rows,
    )


def summary_table(summary: dict[str, Any]) -> str:
    best = summary.get("rollout_best")
    best_text = (
        f"{best['procs']} x {best['envs_per_proc']}{', 2 halves' if best.get('double_buffer') else ''}" if best else "-"
    )
    return markdown_table(
        ["ratio", "value", "what"],
        [
            [
                "rtt_ratio",
                _fmt(summary["rtt_ratio"], 2),
                "flare2 1x1 predict rtt p50 / (raw echo p50 + act at batch 1)",
            ],
            [
                "rollout_vs_echo_8",
                _fmt(summary["rollout_vs_echo_8"], 2),
                "flare2 rollout 8x1 steps/s / raw 8-client echo round trips/s",
            ],
            [
                "rollout_vs_syncvec_best",
                _fmt(summary["rollout_vs_syncvec_best"], 2),
                f"best flare2 rollout ({best_text}) / SyncVectorEnv at its env count",
            ],
        ],
    )


def _json_ready(value: Any) -> Any:
    """NaN and inf become null, so that the file is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    return value


# ---- main ---------------------------------------------------------------------------------------------------


def checked_device(name: str) -> str:
    """``--device`` as flare2 resolves it for the bench's small MLP (``auto``: the CPU); exits with flare2's message
    for a device this machine lacks, before any measurement."""
    from flare2.core.devices import resolve_device
    from flare2.errors import ConfigError

    try:
        return str(resolve_device(name, parameters=0))
    except ConfigError as exc:
        sys.exit(f"bench.py: {exc}")


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is no comma-separated list of counts >= 1 (e.g. 1,4,16)")
    return counts


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\nInternal:")[0].splitlines()[2:]),
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer rollout configurations ({1,2,8} x {1,32}) and shorter measurements"
    )
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    parser.add_argument(
        "--train-args",
        default="",
        metavar="ARGS",
        help='more options for the four training commands of (d), e.g. "--num-agents 8"',
    )
    parser.add_argument(
        "--log-root",
        metavar="DIR",
        help="keep the log dirs of the flare2 runs under DIR (default: a temporary dir, removed)",
    )
    parser.add_argument(
        "--device", default="cpu", help="where the model of (b), (c) and (d) runs: cpu (default), cuda or cuda:N"
    )
    parser.add_argument(
        "--procs",
        type=_counts,
        metavar="LIST",
        help="agent processes of (c), comma-separated, instead of the plan's (e.g. 1,4,16)",
    )
    parser.add_argument(
        "--envs-per-proc",
        type=_counts,
        metavar="LIST",
        help="envs per agent process of (c), comma-separated, instead of the plan's (e.g. 8,128)",
    )
    parser.add_argument(
        "--run-rollout", nargs=4, metavar=("PROCS", "ENVS", "LOGDIR", "SECONDS"), help=argparse.SUPPRESS
    )
    parser.add_argument("--double-buffer", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_rollout:
        procs, envs, log_dir, seconds = args.run_rollout
        return run_rollout(int(procs), int(envs), log_dir, float(seconds), args.device, args.double_buffer)

    plan = QUICK if args.quick else FULL
    if args.procs or args.envs_per_proc:
        plan = dataclasses.replace(
            plan,
            procs=args.procs or plan.procs,
            envs_per_proc=args.envs_per_proc or plan.envs_per_proc,
            double_buffered=(),
        )
    device = checked_device(args.device)
    extra = shlex.split(args.train_args)
    bench_started = time.monotonic()
    failures: list[str] = []

    def note(message: str) -> None:
        print(f"[bench {time.monotonic() - bench_started:6.1f} s] {message}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="flare2-bench-") as tmp:
        log_root = Path(args.log_root).resolve() if args.log_root else Path(tmp)
        log_root.mkdir(parents=True, exist_ok=True)

        note("(a) raw ZeroMQ echo")
        echo: dict[str, Any] | None = None
        try:
            echo = measure_echo(plan)
        except (BenchError, zmq.ZMQError) as exc:
            failures.append(f"(a) echo: {exc}")

        note("(b) in-process SyncVectorEnv")
        syncvec = measure_syncvec(plan, device)

        rollout: list[dict[str, Any]] = []
        for procs in plan.procs:
            for envs in plan.envs_per_proc:
                note(f"(c) flare2 rollout {procs} procs x {envs} envs")
                try:
                    rollout.append(measure_rollout(procs, envs, plan.rollout_s, log_root, device))
                except BenchError as exc:
                    failures.append(f"(c) rollout {procs}x{envs}: {exc}")
                    rollout.append({"procs": procs, "envs_per_proc": envs, "envs": procs * envs, "error": str(exc)})
        for procs, envs in plan.double_buffered:
            note(f"(c) flare2 rollout {procs} procs x {envs} envs, double-buffered")
            try:
                rollout.append(measure_rollout(procs, envs, plan.rollout_s, log_root, device, double_buffer=True))
            except BenchError as exc:
                failures.append(f"(c) rollout {procs}x{envs} double-buffered: {exc}")

        train: list[dict[str, Any]] = []
        for algo in TRAIN_COMMANDS:
            for serial in (False, True):
                note(f"(d) {algo} training{' --serial' if serial else ''}")
                try:
                    train.append(measure_train(algo, serial, extra, log_root, device))
                except BenchError as exc:
                    failures.append(f"(d) {algo}{' serial' if serial else ''}: {exc}")
                    train.append({"algo": algo, "mode": "serial" if serial else "flare2", "error": str(exc)})

    if not args.log_root:  # the temporary log dirs are gone
        for result in (*rollout, *train):
            result.pop("log_dir", None)
    rates = {(r["algo"], r["mode"]): r.get("steps_per_s") for r in train}
    train_ratios = {algo: _ratio(rates.get((algo, "flare2")), rates.get((algo, "serial"))) for algo in TRAIN_COMMANDS}
    summary = summary_ratios(echo, syncvec, rollout)
    bench_wall_s = time.monotonic() - bench_started

    import torch  # already loaded by (b); only for the record

    where = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "CPU"
    print(
        f"\nflare2 bench{' --quick' if args.quick else ''}: {ENV_ID}, A2C MLP 64-64, {where}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}\n"
    )
    print("## (a) raw ZeroMQ + msgpack echo\n")
    print(echo_table(echo) if echo else "failed")
    print("\n## (b) in-process baseline (one process, one torch thread)\n")
    print(syncvec_table(syncvec))
    print(f"\n## (c) flare2 rollout without learning ({plan.rollout_s:g} s per configuration after start-up)\n")
    print(rollout_table(rollout, syncvec))
    print("\n## (d) flare2 training to its budget (A2C 60k, PPO 40k env steps) against --serial\n")
    print(train_table(train, train_ratios))
    print("\n## summary\n")
    print(summary_table(summary))
    print(f"\nbench wall time {bench_wall_s:.0f} s")
    for failure in failures:
        print(f"\nFAILED {failure}", file=sys.stderr)

    if args.json:
        record = {
            **summary,
            "quick": args.quick,
            "bench_wall_s": bench_wall_s,
            "device": device,
            "machine": {
                "cpus": os.cpu_count(),
                "device": where,
                "python": platform.python_version(),
                "torch": torch.__version__,
                "platform": platform.platform(),
            },
            "echo": echo,
            "syncvec": syncvec,
            "rollout": rollout,
            "train": train,
            "train_vs_serial": train_ratios,
            "failures": failures,
        }
        Path(args.json).write_text(json.dumps(_json_ready(record), indent=2) + "\n", encoding="utf-8")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
