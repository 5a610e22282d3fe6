"""flare2 against Stable-Baselines3 on every preset of every algorithm both have, with the same settings.

    python tools/bench_peers.py --install          # once: .venv-peers, a virtualenv with stable-baselines3
    python tools/bench_peers.py --json runs/race.json --markdown runs/race.md          # the whole race, 3 seeds
    python tools/bench_peers.py --only ppo/CartPole-v1 --seeds 0                      # one row, one seed
    python tools/bench_peers.py --dry-run                                             # the rows and SB3's settings
    python tools/bench_peers.py --only td3 --seeds 0 --max-steps 4000                 # a quick check of a row
    python tools/bench_peers.py --parallel 8                  # 8 runs at a time, each on 2 cores of its own

The rows come from the registry (flare2.zoo.registry): each preset of each
flare2 algorithm SB3 also has (PPO, A2C, DQN, TD3, SAC), and APPO's presets
raced against SB3's PPO with the same settings. A new preset is a new row; an
algorithm this tree lacks is skipped with a line that says so.

Both sides train with the same hyperparameters: SB3's are mapped from the
settings `flare2 train` resolves for the preset (tools/sb3_settings.py, one
mapping per algorithm). Each row prints SB3's call, the settings SB3 spells
another way and how they were matched, and what could not be matched
(DQN's double-Q targets, say). What neither side can set is each library's
own: weight initialisation beyond the layer sizes (both use orthogonal init
for PPO and A2C; TD3's and DQN's differ), and flare2's runtime (its agents in
processes of their own that act on while learn() runs, replay buffers shared
out among them).

For each seed (3 by default) and each row, flare2 runs and then SB3, so that
slow drift of a shared machine falls on both alike. On a machine of many cores,
--parallel N runs N at a time in that order, each pinned to cores of its own
(--cpus-per-run, 2 by default): every run then has the cores of a small
machine to itself, and the others' load is counted on its cores alone:

- flare2: `flare2 train --algo A --env E --seed S --stop-return T --device cpu --log-dir D`,
  its figures from D/progress.csv;
- SB3: tools/sb3_train.py in the virtualenv's python (made with
  --system-site-packages, so it shares this python's torch and gymnasium;
  stable-baselines3 is no dependency of flare2), DummyVecEnv
  (--sb3-vec-env subproc for SubprocVecEnv), with as many torch threads as
  flare2's compute process (--torch-threads, 1 by default).

Both stop at the same rule: the mean return of the last 100 finished training
episodes (as rl-baselines3-zoo reports it) reaches the row's threshold, or the
preset's step budget (max_steps; RACE_BUDGETS' for the rows it names, with why; --max-steps in their
place) runs out. The threshold is the env's
Gymnasium reward_threshold, or THRESHOLDS' for envs without one. Every run is
one command measured from start to exit (tools/proctree.py): process wall
time, peak RSS of its whole process tree, and how many cores other processes
kept busy meanwhile (runs that shared the machine are named under the table;
--max-others-load N repeats them).

Reported per row and side: the seeds that reached the threshold, the median
and the range (min-max) over the seeds of the env steps and of the process wall
time to it (a seed that never reached it counts as never: a median of
"never" means most seeds missed), the peak RSS, and the ratios flare2/SB3 of
the medians (< 1: flare2 needed less). Raw figures move between machines
and runs; the ratios of runs made side by side move much less. --json keeps
every run, --markdown writes the table and the settings of each row for
docs/results.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import importlib.metadata
import json
import math
import os
import queue
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import venv
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402
from proctree import Measured, MeasureTimeout, run_measured  # noqa: E402
from sb3_settings import SB3_CLASS, Sb3Spec, sb3_spec  # noqa: E402
from steps_to_threshold import first_crossing  # noqa: E402

from flare2.commands.train import resolve  # noqa: E402
from flare2.core.env_making import is_pettingzoo_env, make_gym_env, missing_extra  # noqa: E402
from flare2.core.spaces import holds_entities  # noqa: E402
from flare2.errors import ConfigError  # noqa: E402
from flare2.zoo.encoders import encoder_kind, image_layout  # noqa: E402
from flare2.zoo.record import PRESET_FAMILIES, AlgorithmRecord  # noqa: E402
from flare2.zoo.registry import lookup  # noqa: E402

DEFAULT_VENV = ROOT / ".venv-peers"
SB3_RUNNER = TOOLS / "sb3_train.py"
RETURN_WINDOW = 100  # episodes in the training mean: flare2's --stop-return window and SB3's ep_info_buffer
SIDES = ("flare2", "sb3")
# Runs during which the rest of the machine kept more than this many cores busy on average are named under the table.
SHARED_LOAD = 0.25
STOPPING = threading.Event()
"""Set when the race ends: the runs still under way are killed."""

THRESHOLDS: dict[str, float] = {
    # Envs whose Gymnasium spec has no reward_threshold (gymnasium.spec(env).reward_threshold is None).
    # The project's choice: about SB3-zoo's TD3 at 20k steps (-152 +- 90 in its benchmark), where the README's
    # Pendulum rows measure flare2's TD3 (docs/results.md).
    "Pendulum-v1": -200.0,
    # MinAtar's paper (Young and Tian 2019, the learning curves in kenjyoung/MinAtar's README, 30 runs, the mean of the
    # last 100 training episodes): DQN and AC(0.8) play Breakout at about 10 after 1M frames (read off the figure);
    # DQN stays there to 5M.
    "MinAtar/Breakout-v1": 10.0,
}
"""Mean training return a row must reach, for the envs Gymnasium gives none; each with its source."""


RACE_BUDGETS: dict[str, tuple[int, str]] = {
    "sac/Pendulum-v1": (
        50_000,
        "the preset's 20k steps are exactly the 100 episodes of the training mean, which a run could then read only "
        "at its last step; 50k as TD3's Pendulum preset",
    ),
    "ppo/MinAtar/Breakout-v1": (1_000_000, "MinAtar's published level is read at 1M frames; the preset runs 20M"),
}
"""Rows that race with a budget other than their preset's, and why. Only for presets whose settings do not follow
the budget (no annealing over it): _row refuses one that changes them."""


def threshold_of(env_id: str) -> tuple[float, str] | None:
    """The row's threshold and where it comes from: Gymnasium's reward_threshold, else THRESHOLDS; None if neither."""
    try:
        gymnasium_threshold = gym.spec(env_id).reward_threshold
    except gym.error.Error:
        gymnasium_threshold = None
    if gymnasium_threshold is not None:
        return float(gymnasium_threshold), "Gymnasium's reward_threshold"
    if env_id in THRESHOLDS:
        return THRESHOLDS[env_id], "tools/bench_peers.py THRESHOLDS"
    return None


# ---- the rows -----------------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One preset raced: a flare2 algorithm on an env against SB3 with the same settings."""

    algo: str
    env_id: str
    threshold: float
    threshold_source: str
    budget: int
    """Env steps each side may take: the preset's max_steps, RACE_BUDGETS' where it has the row, --max-steps in
    their place."""
    preset_budget: int
    spec: Sb3Spec
    budget_reason: str = ""
    """Why the budget is not the preset's, where RACE_BUDGETS sets it."""

    @property
    def name(self) -> str:
        return f"{self.algo}/{self.env_id}"

    def flare2_args(self, seed: int, log_dir: str) -> list[str]:
        """The arguments of `flare2 train` for this row."""
        args = ["--algo", self.algo, "--env", self.env_id, "--seed", str(seed), "--stop-return", f"{self.threshold:g}"]
        args += ["--device", "cpu", "--log-dir", log_dir]
        if self.budget != self.preset_budget:
            args += ["--max-steps", str(self.budget)]
        return args


class _RaisingParser(argparse.ArgumentParser):
    """resolve() refuses a setting through its parser: raise instead of exiting, so the row is skipped."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def parse_only(texts: list[str]) -> list[tuple[str, str | None]]:
    """``--only`` values: ``ALGO/ENV`` (the env id may hold a slash itself) or ``ALGO`` for all its presets."""
    selected = []
    for text in texts:
        algo, _, env_id = text.partition("/")
        if not algo or (text.endswith("/") and not env_id):
            raise ValueError(f"--only takes ALGO/ENV (ppo/CartPole-v1) or ALGO, got {text!r}")
        if algo not in SB3_CLASS:
            raise ValueError(f"--only {text}: {algo!r} is not raced (the raced algorithms are {', '.join(SB3_CLASS)})")
        selected.append((algo, env_id or None))
    return selected


def race_rows(
    only: list[tuple[str, str | None]] | None = None, *, max_steps: int | None = None
) -> tuple[list[Row], list[str]]:
    """The rows to race, in SB3_CLASS's order and each algorithm's preset order, and a line for each row skipped.

    ``only`` keeps the rows it names; ``max_steps`` replaces every budget (the settings flare2 derives from the budget,
    such as an annealing, follow it on both sides).
    """
    rows: list[Row] = []
    skipped: list[str] = []
    unknown: set[str] = set()
    for algo in SB3_CLASS:
        if only is not None and not any(chosen == algo for chosen, _ in only):
            continue
        try:
            record = lookup(algo)
        except ConfigError:
            unknown.add(algo)
            skipped.append(
                f"{algo}: skipped, this flare2 has no algorithm of that name (no flare2/zoo/records/{algo}.py)"
            )
            continue
        # A game of a family preset (MinAtar's) races only when --only names it: a family has no one env.
        family_games = [env for chosen, env in only or [] if chosen == algo and env and _in_family(record, env)]
        for env_id in [*record.presets, *family_games]:
            if only is not None and (algo, env_id) not in only and (algo, None) not in only:
                continue
            beyond = beyond_sb3(env_id)
            if beyond:
                skipped.append(f"{algo}/{env_id}: not raced, {beyond}")
                continue
            try:
                rows.append(_row(algo, env_id, max_steps))
            except Exception as exc:  # a missing env dependency (MuJoCo), a preset resolve() refuses: name it, go on
                skipped.append(f"{algo}/{env_id}: skipped, {type(exc).__name__}: {exc}")
    for algo, wanted_env in only or []:
        if algo in unknown or wanted_env is None:
            continue
        record = lookup(algo)
        if wanted_env not in record.presets and not _in_family(record, wanted_env):
            presets = ", ".join(record.presets)
            raise ValueError(
                f"--only {algo}/{wanted_env}: {algo} has no preset for {wanted_env} (its presets: {presets})"
            )
    return rows, skipped


def _in_family(record: AlgorithmRecord, env_id: str) -> bool:
    """Whether one of the record's family presets (``Atari``, ``MinAtar``) covers the env."""
    return any(PRESET_FAMILIES[family](env_id) for family in record.family_presets)


def _image_encoder(env_id: str, settings: Any) -> str | None:
    """The CNN flare2 gives the env's observations with these settings (None: a vector)."""
    if not hasattr(settings, "encoder"):
        return None  # an algorithm of vector observations alone (TD3, SAC)
    env = make_gym_env(env_id)
    try:
        layout = image_layout(env.observation_space)
    finally:
        env.close()
    return None if layout is None else encoder_kind(layout, settings.encoder)


def beyond_sb3(env_id: str) -> str:
    """Why SB3 cannot play a preset's env, or "" where it can: several agents in one env, or entities (Sequence
    spaces), which its policies do not take."""
    if is_pettingzoo_env(env_id):
        return "a multi-agent env, and SB3 plays one agent"
    if missing_extra(env_id) is None and holds_entities(make_gym_env(env_id).observation_space):
        return "an env of entities (Sequence spaces), which SB3's policies do not take"
    return ""


def _row(algo: str, env_id: str, max_steps: int | None) -> Row:
    found = threshold_of(env_id)
    if found is None:
        raise ValueError(f"{env_id} has no reward_threshold in Gymnasium: add one to THRESHOLDS with its source")
    threshold, source = found
    argv = ["--algo", algo, "--env", env_id, "--device", "cpu", "--stop-return", f"{threshold:g}"]
    preset_budget = int(resolve(argv, parser_class=_RaisingParser).options["max_steps"])
    race_budget, reason = RACE_BUDGETS.get(f"{algo}/{env_id}", (preset_budget, ""))
    budget = max_steps or race_budget
    # Resolved with the budget the run is given, so that settings derived from it (anneal_steps) are the run's.
    plan = resolve([*argv, "--max-steps", str(budget)], parser_class=_RaisingParser)
    if max_steps is None and budget != preset_budget:
        preset = resolve([*argv, "--max-steps", str(preset_budget)], parser_class=_RaisingParser)
        if (preset.config, preset.settings) != (plan.config, plan.settings):
            raise ValueError(
                f"RACE_BUDGETS gives {algo}/{env_id} {budget} env steps, but settings of its preset follow the budget "
                f"(an annealing): the row would race other settings than the preset's; remove it from RACE_BUDGETS"
            )
    image_encoder = _image_encoder(env_id, plan.settings)
    spec = sb3_spec(algo, plan.config, plan.settings, plan.options, budget=budget, image_encoder=image_encoder)
    return Row(algo, env_id, threshold, source, budget, preset_budget, spec, reason if budget == race_budget else "")


def describe_row(row: Row) -> list[str]:
    """What a row races, in lines: the threshold and budget, SB3's call, the matched and the unmatched settings."""
    budget = f"{row.budget}"
    if row.budget != row.preset_budget:
        budget += f" (the preset's: {row.preset_budget}" + (f"; {row.budget_reason})" if row.budget_reason else ")")
    lines = [
        f"{row.name}: threshold {row.threshold:g} ({row.threshold_source}), budget {budget} env steps",
        f"  SB3: {row.spec.describe()}",
    ]
    lines += [f"  matched: {text}" for text in row.spec.equivalents]
    lines += [f"  NOT matched: {text}" for text in row.spec.differences]
    return lines


# ---- running ------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One training run of one side of a row; the figures are None when the run failed or could not tell."""

    row: str
    side: str
    seed: int
    returncode: int | None
    wall_s: float | None  # process wall time, command to exit
    peak_rss_mb: float | None  # summed over the process tree
    steps_to_threshold: int | None = None
    steps_trained: int | None = None
    steps_per_s: float | None = None
    train_s: float | None = None  # SB3: time in learn(); flare2: wall_time of its last progress row
    leftover_pids: tuple[int, ...] = ()
    cpu_s: float | None = None  # CPU seconds of the whole process tree
    others_load: float | None = None  # cores the rest of the machine kept busy meanwhile, on average
    attempts: int = 1  # more than 1 when --max-others-load repeated the run
    error: str | None = None

    @property
    def reached(self) -> bool:
        return self.error is None and self.steps_to_threshold is not None


def venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def install_venv(venv_dir: Path) -> None:
    """Make the venv and pip-install SB3 into it, with the torch this python has (a race compares the frameworks,
    not two torch versions) and what SB3's Atari wrappers need (ale-py, OpenCV).

    ``--system-site-packages`` shares the base interpreter's packages, not those of a venv this runs in, so torch is
    named explicitly: left to SB3's requirements, pip fetched the newest torch with its CUDA libraries."""
    if not venv_python(venv_dir).exists():
        print(f"creating {venv_dir} (--system-site-packages)", file=sys.stderr)
        venv.EnvBuilder(system_site_packages=True, with_pip=True).create(venv_dir)
    torch_version = importlib.metadata.version("torch").split("+")[0]
    packages = ["stable-baselines3", f"torch=={torch_version}", "ale-py", "opencv-python-headless"]
    subprocess.run(
        [str(venv_python(venv_dir)), "-m", "pip", "install", "--disable-pip-version-check", *packages], check=True
    )


def sb3_version(venv_dir: Path) -> str | None:
    """The stable-baselines3 version importable in the venv, or None."""
    python = venv_python(venv_dir)
    if not python.exists():
        return None
    done = subprocess.run(
        [str(python), "-c", "import stable_baselines3; print(stable_baselines3.__version__)"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def progress_figures(progress_csv: Path, threshold: float) -> dict[str, float | int | None]:
    """flare2's figures from its progress.csv: steps at the threshold, steps trained, and steps/s.

    The threshold counts once the window of 100 episodes is full, as --stop-return does. The rate is taken
    between the first and the last row (the last is written as the run stops), so the start-up before the first
    row is left out, as SB3's time in learn() leaves out its own.
    """
    crossing = first_crossing(progress_csv, threshold, min_episodes=RETURN_WINDOW)
    with open(progress_csv, newline="") as file:
        rows = [(float(row["wall_time"]), float(row["env_steps"])) for row in csv.DictReader(file)]
    if not rows:
        return {"steps_to_threshold": None, "steps_trained": None, "steps_per_s": None, "train_s": None}
    (t0, s0), (t1, s1) = rows[0], rows[-1]
    return {
        "steps_to_threshold": None if crossing is None else int(crossing["env_steps"]),
        "steps_trained": int(s1),
        "steps_per_s": (s1 - s0) / (t1 - t0) if t1 > t0 else None,
        "train_s": t1,
    }


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _measured_run(row: Row, side: str, seed: int, measured: Measured) -> Run:
    return Run(
        row.name,
        side,
        seed,
        measured.returncode,
        measured.wall_s,
        measured.peak_rss_bytes / 2**20,
        leftover_pids=measured.leftover_pids,
        cpu_s=measured.cpu_s,
        others_load=measured.others_cpu_s / measured.wall_s if measured.wall_s > 0 else None,
    )


def _child_env() -> dict[str, str]:
    """This tree's flare2 first on the path of every child, whatever is installed."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) if not path else f"{ROOT}{os.pathsep}{path}"}


def curve_path(curves: Path, row: Row, side: str, seed: int) -> Path:
    """Where --curves keeps a run's returns: flare2's progress.csv, SB3's episodes."""
    return curves / f"{row.algo}_{row.env_id.replace('/', '_')}_{side}_s{seed}.csv"


def run_flare2(
    row: Row, seed: int, *, timeout_s: float, curves: Path | None = None, cpus: frozenset[int] | None = None
) -> Run:
    with tempfile.TemporaryDirectory(prefix=f"bench_peers_{row.algo}_s{seed}_") as log_dir:
        main = "import sys; from flare2.cli import main; sys.exit(main())"
        command = [sys.executable, "-c", main, "train", *row.flare2_args(seed, log_dir)]
        try:
            measured = run_measured(command, cwd=ROOT, env=_child_env(), timeout_s=timeout_s, cpus=cpus, stop=STOPPING)
        except MeasureTimeout as exc:
            return Run(row.name, "flare2", seed, None, None, None, error=str(exc))
        run = _measured_run(row, "flare2", seed, measured)
        progress_csv = Path(log_dir) / "progress.csv"
        if measured.returncode != 0 or not progress_csv.is_file():
            run.error = f"exit {measured.returncode}:\n{_tail(measured.stdout + measured.stderr)}"
            return run
        for key, value in progress_figures(progress_csv, row.threshold).items():
            setattr(run, key, value)
        if curves is not None:
            shutil.copyfile(progress_csv, curve_path(curves, row, "flare2", seed))
    return run


def run_sb3(
    row: Row,
    seed: int,
    *,
    venv_dir: Path,
    vec_env: str,
    timeout_s: float,
    curves: Path | None = None,
    cpus: frozenset[int] | None = None,
) -> Run:
    side = "sb3" if vec_env == "dummy" else f"sb3-{vec_env}"
    job = {
        "spec": row.spec.to_json(),
        "env_id": row.env_id,
        "seed": seed,
        "budget": row.budget,
        "threshold": row.threshold,
        "vec_env": vec_env,
        "curve": None if curves is None else str(curve_path(curves, row, side, seed).resolve()),
    }
    command = [str(venv_python(venv_dir)), str(SB3_RUNNER), json.dumps(job)]
    try:
        measured = run_measured(command, cwd=ROOT, env=_child_env(), timeout_s=timeout_s, cpus=cpus, stop=STOPPING)
    except MeasureTimeout as exc:
        return Run(row.name, side, seed, None, None, None, error=str(exc))
    run = _measured_run(row, side, seed, measured)
    lines = [line for line in measured.stdout.splitlines() if line.startswith("{")]
    if measured.returncode != 0 or not lines:
        run.error = f"exit {measured.returncode}:\n{_tail(measured.stderr)}"
        return run
    figures = json.loads(lines[-1])
    for key in ("steps_to_threshold", "steps_trained", "steps_per_s", "train_s"):
        setattr(run, key, figures[key])
    return run


# ---- the figures --------------------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b of two medians, when both are finite (None where either side never got there)."""
    if a is None or b is None or math.isinf(a) or math.isinf(b) or b == 0:
        return None
    return a / b


def side_figures(runs: list[Run]) -> dict[str, Any]:
    """One side of a row over its seeds: how many reached the threshold, and the median, min and max of the env
    steps and the process wall time to it. A seed that never reached it counts as infinitely far (inf), so a
    median of inf says most seeds missed; a failed run counts in ``failed`` only."""
    done = [run for run in runs if run.error is None]
    steps = sorted(math.inf if run.steps_to_threshold is None else float(run.steps_to_threshold) for run in done)
    walls = sorted(float(run.wall_s or 0.0) if run.reached else math.inf for run in done)
    return {
        "seeds": sorted(run.seed for run in runs),
        "reached": sum(run.reached for run in runs),
        "failed": sum(run.error is not None for run in runs),
        "steps_median": _median(steps),
        "steps_min": steps[0] if steps else None,
        "steps_max": steps[-1] if steps else None,
        "wall_s_median": _median(walls),
        "wall_s_min": walls[0] if walls else None,
        "wall_s_max": walls[-1] if walls else None,
        "peak_rss_mb_median": _median([run.peak_rss_mb for run in done if run.peak_rss_mb is not None]),
        "steps_per_s_median": _median([run.steps_per_s for run in done if run.steps_per_s is not None]),
    }


def summarize(rows: list[Row], runs: list[Run]) -> list[dict[str, Any]]:
    """Per row: each side's figures (side_figures) and flare2's ratios to SB3 (< 1: flare2 needed less)."""
    summary = []
    for row in rows:
        sides = {}
        for side in sorted({run.side for run in runs if run.row == row.name}, key=lambda side: side != "flare2"):
            sides[side] = side_figures([run for run in runs if run.row == row.name and run.side == side])
        flare2 = sides.get("flare2")
        peer = next((figures for side, figures in sides.items() if side != "flare2"), None)
        ratios = {
            key: _ratio(flare2[f"{key}_median"], peer[f"{key}_median"]) if flare2 and peer else None
            for key in ("steps", "wall_s", "peak_rss_mb")
        }
        summary.append(
            {
                "row": row.name,
                "algo": row.algo,
                "env_id": row.env_id,
                "sb3_algo": row.spec.algo,
                "threshold": row.threshold,
                "budget": row.budget,
                "sides": sides,
                "ratios": ratios,
            }
        )
    return summary


def _steps_text(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "never"
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.1f}k"


def _seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    return "never" if math.isinf(value) else f"{value:.1f}"


def _spread(figures: dict[str, Any] | None, key: str, text) -> str:
    """``median (min-max)``, or the one value of a single seed."""
    if not figures or figures[f"{key}_median"] is None:
        return "-"
    median, low, high = (text(figures[f"{key}_{part}"]) for part in ("median", "min", "max"))
    return median if low == high else f"{median} ({low}-{high})"


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _reached_text(figures: dict[str, Any] | None) -> str:
    if not figures:
        return "-"
    text = f"{figures['reached']}/{len(figures['seeds'])}"
    return text + (f" ({figures['failed']} failed)" if figures["failed"] else "")


def markdown_table(rows: list[Row], summary: list[dict[str, Any]], runs: list[Run]) -> str:
    """The race as markdown: one line per row, then what each row raced (SB3's call, the settings not matched)."""
    lines = [
        "| algorithm | env | threshold | budget | reached (flare2, SB3) | env steps to it: flare2 | SB3 | flare2/SB3 "
        "| process wall s to it: flare2 | SB3 | flare2/SB3 | peak RSS MB: flare2, SB3 |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row, entry in zip(rows, summary):
        flare2 = entry["sides"].get("flare2")
        peer = next((figures for side, figures in entry["sides"].items() if side != "flare2"), None)
        algo = row.algo.upper() + (f" (SB3 {row.spec.algo})" if row.spec.algo != row.algo.upper() else "")
        rss = " / ".join(
            "-" if not figures or figures["peak_rss_mb_median"] is None else f"{figures['peak_rss_mb_median']:.0f}"
            for figures in (flare2, peer)
        )
        lines.append(
            f"| {algo} | {row.env_id} | {row.threshold:g} | {_steps_text(row.budget)} "
            f"| {_reached_text(flare2)}, {_reached_text(peer)} "
            f"| {_spread(flare2, 'steps', _steps_text)} | {_spread(peer, 'steps', _steps_text)} "
            f"| {_ratio_text(entry['ratios']['steps'])} "
            f"| {_spread(flare2, 'wall_s', _seconds_text)} | {_spread(peer, 'wall_s', _seconds_text)} "
            f"| {_ratio_text(entry['ratios']['wall_s'])} | {rss} |"
        )
    lines += [
        "",
        "Medians over the seeds, their range in brackets; never: the seed (or most seeds, for a median) did not reach "
        "the threshold within the budget. Ratios < 1: flare2 needed fewer steps or less time.",
        "",
        "Each row's SB3 settings, mapped from the flare2 preset (`tools/sb3_settings.py`):",
        "",
    ]
    for row in rows:
        lines.append(f"- **{row.name}**: `{row.spec.describe()}`.")
        lines += [f"  Matched: {text}." for text in row.spec.equivalents]
        lines += [f"  **Not matched**: {text}." for text in row.spec.differences]
    shared = [
        f"{run.row} {run.side} seed {run.seed} ({run.others_load:.2f})"
        for run in runs
        if run.others_load is not None and run.others_load > SHARED_LOAD
    ]
    if shared:
        lines += [
            "",
            f"Other processes kept this many cores busy on average during: {', '.join(shared)}; "
            "those runs had less of the machine than the others.",
        ]
    return "\n".join(lines)


# ---- the command --------------------------------------------------------------------------------------------------


def _git_commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--install", action="store_true", help="create the venv, pip-install stable-baselines3 into it, and exit"
    )
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="virtualenv holding stable-baselines3")
    parser.add_argument(
        "--only",
        action="append",
        metavar="ALGO[/ENV]",
        help="race only this row (ppo/CartPole-v1) or this algorithm's rows (ppo); repeatable",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--curves",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep each run's returns here: flare2's progress.csv, and SB3's finished episodes (env_steps, return, "
        "return_mean of the last 100)",
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="STEPS",
        help="every row's budget in place of its preset's (both sides; settings derived from the budget follow it): "
        "a quick check, or room for 100 episodes where a preset's budget holds fewer (Pendulum-v1's 20k for SAC)",
    )
    parser.add_argument(
        "--sb3-vec-env", choices=("dummy", "subproc"), default="dummy", help="SB3's DummyVecEnv or SubprocVecEnv"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="per run, before it is killed (default: 120 s plus 20 ms per env step of the row's budget)",
    )
    parser.add_argument(
        "--max-others-load",
        type=float,
        default=None,
        help="repeat a run (up to --retries times) while other processes kept more than this many "
        "cores busy on average during it; the least disturbed attempt is kept",
    )
    parser.add_argument("--retries", type=int, default=2, help="repeats allowed per run by --max-others-load")
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        metavar="N",
        help="run N runs at a time, each pinned to --cpus-per-run cores of its own (default 1: one at a time, unpinned)",
    )
    parser.add_argument("--cpus-per-run", type=int, default=2, help="cores of each run with --parallel (default 2)")
    parser.add_argument("--dry-run", action="store_true", help="print the rows and SB3's settings, run nothing")
    parser.add_argument("--json", type=Path, help="also write every run, the settings and the figures here")
    parser.add_argument("--markdown", type=Path, help="also write the table and each row's settings here")
    args = parser.parse_args(argv)
    if args.curves is not None:
        args.curves.mkdir(parents=True, exist_ok=True)
    venv_dir = args.venv.resolve()
    if args.install:
        install_venv(venv_dir)
        print(f"stable-baselines3 {sb3_version(venv_dir)} in {venv_dir}; `python tools/bench_peers.py` races")
        return 0
    try:
        only = parse_only(args.only) if args.only else None
        rows, skipped = race_rows(only, max_steps=args.max_steps)
    except ValueError as exc:
        parser.error(str(exc))

    cpu_slots = _cpu_slots(args.parallel, args.cpus_per_run)
    if isinstance(cpu_slots, str):
        parser.error(cpu_slots)
    for line in skipped:
        print(line)
    for row in rows:
        print("\n".join(describe_row(row)))
    if args.dry_run:
        return 0
    if not rows:
        print("no row to race", file=sys.stderr)
        return 2
    version = sb3_version(venv_dir)
    if version is None:
        venv_option = "" if venv_dir == DEFAULT_VENV else f" --venv {args.venv}"
        print(
            f"stable-baselines3 is not importable with {venv_python(venv_dir)}: "
            f"run `python tools/bench_peers.py --install{venv_option}` once to make that venv",
            file=sys.stderr,
        )
        return 2

    free_cpus: queue.Queue[frozenset[int] | None] = queue.Queue()
    for slot in cpu_slots:
        free_cpus.put(slot)

    def run_once(row: Row, side: str, seed: int) -> Run:
        timeout_s = args.timeout if args.timeout is not None else 120.0 + 0.02 * row.budget
        cpus = free_cpus.get()
        try:
            if side == "flare2":
                run = run_flare2(row, seed, timeout_s=timeout_s, curves=args.curves, cpus=cpus)
            else:
                run = run_sb3(
                    row,
                    seed,
                    venv_dir=venv_dir,
                    vec_env=args.sb3_vec_env,
                    timeout_s=timeout_s,
                    curves=args.curves,
                    cpus=cpus,
                )
        finally:
            free_cpus.put(cpus)
        status = (
            f"FAILED: {run.error}"
            if run.error
            else (
                f"{run.steps_to_threshold or 'never'} steps to {row.threshold:g} "
                f"({run.steps_trained} trained), {run.wall_s:.1f} s, {run.peak_rss_mb:.0f} MB, "
                f"others used {run.others_load or 0:.2f} cores"
            )
        )
        if run.leftover_pids:
            status += f" (left processes running: {list(run.leftover_pids)}, killed)"
        print(f"{row.name} {run.side} seed {seed}: {status}", file=sys.stderr, flush=True)
        return run

    def disturbed(run: Run) -> bool:
        return args.max_others_load is not None and (run.others_load or 0.0) > args.max_others_load

    def kept_run(row: Row, side: str, seed: int) -> Run:
        attempts = [run_once(row, side, seed)]
        while disturbed(attempts[-1]) and not attempts[-1].error and len(attempts) <= args.retries:
            attempts.append(run_once(row, side, seed))
        kept = min(attempts, key=lambda run: (run.error is not None, run.others_load or 0.0))
        kept.attempts = len(attempts)
        return kept

    started = time.strftime("%Y-%m-%d %H:%M")
    # Seed by seed, each row's two sides one after the other: slow drift of the machine falls on both alike.
    order = [(row, side, seed) for seed in args.seeds for row in rows for side in SIDES]
    STOPPING.clear()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(cpu_slots))
    try:
        runs = list(pool.map(lambda job: kept_run(*job), order))
    finally:
        # On Ctrl+C: no run starts after it, and those under way are killed (their trees are in sessions of their
        # own, out of the terminal's reach).
        STOPPING.set()
        pool.shutdown(cancel_futures=True)

    summary = summarize(rows, runs)
    table = markdown_table(rows, summary, runs)
    command = shlex.join(["python", "tools/bench_peers.py", *(sys.argv[1:] if argv is None else argv)])
    layout = (
        f"{args.parallel} runs at a time, each pinned to {args.cpus_per_run} cores of its own"
        if args.parallel > 1
        else "one run at a time"
    )
    footer = (
        f"Measured with `{command}` on {started}: {os.cpu_count()} cores, {layout}, flare2 at {_git_commit()}, "
        f"stable-baselines3 {version} ({'DummyVecEnv' if args.sb3_vec_env == 'dummy' else 'SubprocVecEnv'}), "
        f"seeds {', '.join(map(str, args.seeds))}."
    )
    print(f"\n{table}\n\n{footer}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(f"{table}\n\n{footer}\n")
    if args.json:
        config = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
        config.update(
            sb3_version=version,
            python=sys.version.split()[0],
            cpus=os.cpu_count(),
            commit=_git_commit(),
            started=started,
        )
        document = {
            "config": config,
            "skipped": skipped,
            "rows": [{**asdict(row), "name": row.name} for row in rows],
            "runs": [asdict(run) for run in runs],
            "summary": _finite(summary),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2))
    return 1 if any(run.error for run in runs) else 0


def _cpu_slots(parallel: int, cpus_per_run: int) -> list[frozenset[int] | None] | str:
    """The cores of each of ``parallel`` runs at a time (None: unpinned, for one at a time), or why they cannot be
    had: the runs would share cores."""
    if parallel < 1 or cpus_per_run < 1:
        return f"--parallel and --cpus-per-run must be >= 1, got {parallel} and {cpus_per_run}"
    if parallel == 1:
        return [None]
    cpus = sorted(os.sched_getaffinity(0))
    if parallel * cpus_per_run > len(cpus):
        return (
            f"--parallel {parallel} x --cpus-per-run {cpus_per_run} needs {parallel * cpus_per_run} cores, and this "
            f"process may use {len(cpus)}: run fewer at a time"
        )
    return [frozenset(cpus[i * cpus_per_run : (i + 1) * cpus_per_run]) for i in range(parallel)]


def _finite(value: Any) -> Any:
    """inf (never reached) as the string "never", which JSON can hold."""
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    if isinstance(value, float) and math.isinf(value):
        return "never"
    return value


if __name__ == "__main__":
    sys.exit(main())
