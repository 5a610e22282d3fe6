"""learn() alone: the env steps/s a CT's updates allow, on learn batches shaped as a run sends them.

    python tools/bench_learner.py --env ALE/Breakout-v5 --algos ppo appo --device cpu
    python tools/bench_learner.py --env ALE/Breakout-v5 --algos ppo appo --device cuda --requests 4 --profile

Each algorithm's CT is built as ``flare2 train --env ENV --algo ALGO`` builds it (the env's preset; more train
options after ``--``). Its learn batches are ``--requests`` learn requests of the preset's shape (``envs_per_agent``
sequences of ``sample_interval`` steps each), packed as an agent packs them (``flare2.core.learn_requests``) from
random observations and actions, with an episode end every ``--episode-steps`` steps on average and every step
played by the weights one update before (``--lag``, APPO's usual lag; 0 makes every step on-policy). Each call
goes through ``learn_with_lag`` as a learner runs it: the batch spelled out (views rebuilt), to the device, learn().

It prints, per algorithm, the env steps/s of the updates alone (the batch's steps over the seconds of a call, the
median of ``--calls`` after ``--warmup`` calls) and the seconds of a call split into spelling the batch out and the
rest; with ``--profile``, torch.profiler's table of where ``--profile-calls`` calls spent their time (CPU and, on a
GPU, kernel time) beside it. ``--json FILE`` keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flare2.commands.train import resolve  # noqa: E402
from flare2.core.learn_requests import concatenate, pack, unpack  # noqa: E402
from flare2.core.specs import STEP_FLAG_SPECS, CTSpecs, Spec  # noqa: E402
from flare2.core.views import EpisodeAges, view_context  # noqa: E402
from flare2.runtime.compute.cts import build_cts  # noqa: E402
from flare2.runtime.compute.learn_calls import learn_with_lag  # noqa: E402


def random_array(rng: np.random.Generator, spec: Spec, leading: tuple[int, ...]) -> np.ndarray:
    shape = (*leading, *spec.fixed_shape)
    if spec.dtype == "uint8":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if spec.dtype in ("int64", "int32"):
        return rng.integers(0, 2, shape).astype(spec.dtype)
    if spec.dtype == "bool":
        return np.zeros(shape, bool)
    return rng.standard_normal(shape).astype(spec.dtype)


def learn_request(
    specs: CTSpecs, rng: np.random.Generator, envs: int, steps: int, episode_steps: int, version: int
) -> dict[str, Any]:
    """One packed learn request of ``envs`` sequences of ``steps`` random steps, as an agent's helper sends it."""
    context = view_context(specs)
    width = context + steps
    stored: dict[str, Any] = {}
    for group, group_specs in specs.stored_specs().items():
        stored[group] = {key: random_array(rng, spec, (envs, width)) for key, spec in group_specs.items()}
    ended = rng.random((envs, width)) < 1 / episode_steps
    stored["terminated"], stored["truncated"] = ended, np.zeros((envs, width), bool)
    stored["policy_version"] = np.full((envs, width), version, np.int64)
    # Within an episode each step's next inputs are the following step's inputs, as in a run.
    for key in specs.acting_inputs:
        following = stored["next_inputs"][key]
        following[:, :-1] = np.where(
            ended[:, :-1].reshape(envs, width - 1, *[1] * (following.ndim - 2)),
            following[:, :-1],
            stored["inputs"][key][:, 1:],
        )
    ages = EpisodeAges(envs)
    step_ages = np.stack([ages.of({flag: stored[flag][:, t] for flag in STEP_FLAG_SPECS}) for t in range(width)], 1)
    return pack(specs, stored, context, step_ages if specs.views else None)


def measure(args: argparse.Namespace, algo: str) -> dict[str, Any]:
    import torch

    plan = resolve(["--env", args.env, "--algo", algo, "--device", args.device, *args.extra])
    (ct,) = build_cts(plan.run.cts, device=args.device, seed=0, torch_threads=args.torch_threads)
    envs, steps = plan.run.agents.envs_per_agent, plan.settings.sample_interval
    rng = np.random.default_rng(0)

    def batch() -> dict[str, Any]:
        version = ct.version - args.lag
        requests = [
            learn_request(ct.specs, rng, envs, steps, args.episode_steps, version) for _ in range(args.requests)
        ]
        return concatenate(ct.specs, requests)

    def synchronize() -> None:
        if ct.device.type == "cuda":
            torch.cuda.synchronize(ct.device)

    samples = envs * steps * args.requests
    batches = [batch() for _ in range(2)]
    call_s, unpack_s = [], []
    for call in range(args.warmup + args.calls):
        payload = batches[call % 2]
        payload["policy_version"][...] = ct.version - args.lag
        synchronize()
        started = time.perf_counter()
        learn_with_lag(ct, payload)
        synchronize()
        if call >= args.warmup:
            call_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            unpack(ct.specs, payload)
            unpack_s.append(time.perf_counter() - started)
    median = statistics.median(call_s)
    result: dict[str, Any] = {
        "algo": algo,
        "device": str(ct.device),
        "batch_steps": samples,
        "update_only_steps_per_s": samples / median,
        "call_s": median,
        "spelling_out_s": statistics.median(unpack_s),
    }
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ct.device.type == "cuda" else [])
        with profile(activities=activities) as profiler:
            for call in range(args.profile_calls):
                learn_with_lag(ct, batches[call % 2])
            synchronize()
        sort = "self_cuda_time_total" if ct.device.type == "cuda" else "self_cpu_time_total"
        print(f"## {algo}: where {args.profile_calls} learn calls spent their time (by {sort})")
        print(profiler.key_averages().table(sort_by=sort, row_limit=args.profile_rows, max_name_column_width=60))
        if ct.device.type == "cuda":
            print(f"## {algo}: by self CPU time")
            print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile_rows))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="ALE/Breakout-v5")
    parser.add_argument("--algos", nargs="+", default=["ppo", "appo"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=1, help="learn requests (agents' batches) in each learn call")
    parser.add_argument("--lag", type=int, default=1, help="updates between the weights that played and learn()'s")
    parser.add_argument("--episode-steps", type=int, default=200, help="mean steps between episode ends")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-calls", type=int, default=3)
    parser.add_argument("--profile-rows", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("extra", nargs="*", help="more flare2 train options (after --)")
    args = parser.parse_args(argv)
    results = []
    for algo in args.algos:
        results.append(measure(args, algo))
        print(json.dumps(results[-1]), flush=True)
    print(f"{args.env}, {args.device}, {args.torch_threads} torch threads, {args.requests} request(s) a call")
    print("| algo | steps a call | env steps/s of the updates alone | s a call | of which spelling out |")
    print("|---|---:|---:|---:|---:|")
    for result in results:
        print(
            f"| {result['algo']} | {result['batch_steps']} | {result['update_only_steps_per_s']:.0f} | "
            f"{result['call_s']:.3f} | {result['spelling_out_s']:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
