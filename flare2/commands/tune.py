"""``flare2 tune --env ENV_ID --algo ALGO``: search an algorithm's settings for an env with Optuna.

Each trial is a ``flare2 train`` run of its own (a child process, with its own
log dir under the tune dir) with settings Optuna's TPE sampler picks from the
algorithm's search space (its record's ``search_space``). While a trial runs, each new row
of its progress.csv reports the mean return to Optuna, and the median pruner
stops (Ctrl+C, so it ends cleanly) a trial that does worse than the trials
before it did at the same step. A trial scores the mean return of the last
100 episodes of its last row. The first trial plays the package's own settings
where they lie in the search space (a setting outside it is sampled).

The best trial's settings go to ``best.json``, a preset that ``flare2 train
--preset best.json`` takes; ``trials.csv`` lists every trial.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flare2.commands.train import resolve
from flare2.errors import ConfigError
from flare2.runtime import exit_codes
from flare2.runtime.options import number_option
from flare2.runtime.processes import interrupt_at_parent_death
from flare2.runtime.run_files import TRAIN_FILE, make_log_dir, unused_log_dir
from flare2.zoo.registry import lookup, names

BEST_FILE = "best.json"
TRIALS_FILE = "trials.csv"
# Run settings that are the trial's, not the found configuration's: a run from best.json sets its own.
_TRIAL_ONLY = {"max_steps", "max_episodes", "stop_return", "stop_eval_return", "seed", "progress_interval_s"}
# Rows often enough for the pruner to stop a bad trial early; a trial's own --progress-interval comes after it.
_TRIAL_PROGRESS_S = 2.0


class _TrialFailed(Exception):
    """A trial's run ended with an error; the study goes on without it."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="flare2 tune",
        description="Search an algorithm's settings for an env with Optuna: each trial is a flare2 train run with a "
        "budget of its own; bad trials are stopped early; the best settings are written as a preset for "
        "flare2 train --preset. Options not listed here (--num-agents, --normalize-observations, ...) "
        "go to every trial's flare2 train.",
    )
    parser.add_argument(
        "--algo", required=True, help=f"the algorithm: {', '.join(names())}, or one of your own (flare2.zoo.register)"
    )
    parser.add_argument("--env", required=True, help="Gymnasium env id")
    parser.add_argument("--trials", type=number_option(int, least=1), default=20, help="trials to run")
    parser.add_argument(
        "--trial-steps",
        type=number_option(int, least=1),
        default=None,
        metavar="STEPS",
        help="env steps of each trial (default: the algorithm's budget in flare2 train)",
    )
    parser.add_argument(
        "--log-dir",
        default=None,
        help="where the trials' runs, trials.csv and best.json go (default: runs/tune_ALGO_ENV, numbered _2, _3... "
        "where that folder holds files)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the sampler and every trial's run")
    args, train_argv = parser.parse_known_args(argv)
    try:
        search_space(args.algo)
    except ConfigError as exc:
        parser.error(f"argument --algo: {exc}")
    if importlib.util.find_spec("optuna") is None:
        parser.error(
            'flare2 tune searches with Optuna, which is not installed: python -m pip install -e ".[tune]" '
            "(or pip install optuna)"
        )
    log_dir = Path(
        args.log_dir or unused_log_dir(f"runs/tune_{args.algo}_{args.env.rsplit(':', 1)[-1].replace('/', '_')}")
    )
    base_argv = [
        "--algo",
        args.algo,
        "--env",
        args.env,
        "--seed",
        str(args.seed),
        "--progress-interval",
        str(_TRIAL_PROGRESS_S),
        *train_argv,
    ]
    # A command line flare2 train refuses ends here, before any trial, with its own message.
    plan = resolve([*base_argv, "--log-dir", str(log_dir / "trial_0")])
    try:
        make_log_dir(log_dir)
    except ConfigError as exc:
        parser.error(str(exc))
    trial_steps = args.trial_steps or plan.run.max_steps
    if trial_steps is None:
        parser.error("give --trial-steps: the trials have no step budget")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # No trial is stopped before it has played a third of its budget, nor before 3 trials have finished.
    pruner = optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=trial_steps // 3)
    study = Study(args.algo, base_argv, trial_steps, log_dir, plan.run.progress_interval_s)
    return study.run(args.trials, args.seed, _defaults(plan), pruner)


def search_space(algo: str) -> Mapping[str, tuple[str, Any]]:
    """What ``flare2 tune`` searches for ``algo``: its record's search space; a ConfigError when it has none."""
    space = lookup(algo).search_space
    if not space:
        raise ConfigError(
            f"{algo} has no search space: give its AlgorithmRecord a search_space of the settings to search"
        )
    return space


def _defaults(plan: Any) -> dict[str, Any]:
    """The resolved settings of ``plan`` that lie in its algorithm's search space: the first trial's."""
    resolved = {**dataclasses.asdict(plan.settings), **dataclasses.asdict(plan.config)}
    first = {}
    for name, (kind, bounds) in search_space(plan.algo).items():
        value = resolved[name]
        # A setting left unset (None: the algorithm chooses, as SARSA's step size) is no point of a range.
        inside = value in bounds if kind == "choice" else value is not None and bounds[0] <= value <= bounds[1]
        if inside:
            first[name] = value
    return first


def _sample(trial: Any, space: Mapping[str, tuple[str, Any]]) -> dict[str, Any]:
    params = {}
    for name, (kind, bounds) in space.items():
        if kind == "choice":
            params[name] = trial.suggest_categorical(name, list(bounds))
        elif kind == "int":
            params[name] = trial.suggest_int(name, *bounds)
        else:
            params[name] = trial.suggest_float(name, *bounds, log=kind == "log")
    return params


class Study:
    """The trials of one ``flare2 tune``: each a ``flare2 train`` child process that Optuna follows and may stop."""

    def __init__(self, algo: str, train_argv: list[str], trial_steps: int, log_dir: Path, progress_interval_s: float):
        self.algo = algo
        self.space = search_space(algo)
        self.train_argv = train_argv
        self.trial_steps = trial_steps
        self.log_dir = log_dir
        self.progress_interval_s = progress_interval_s

    def run(self, trials: int, seed: int, first: dict[str, Any], pruner: Any) -> int:
        """Run ``trials`` trials, the first with the settings ``first``; ``pruner`` (Optuna's) stops bad ones."""
        import optuna

        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed), pruner=pruner)
        if first:
            study.enqueue_trial(first)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            study.optimize(self.objective, n_trials=trials, catch=(_TrialFailed,))
        except KeyboardInterrupt:
            print("flare2 tune: stopped by Ctrl+C; the trials so far are kept", file=sys.stderr)
        finally:
            self._write_trials(study)
        complete = [trial for trial in study.trials if trial.state == optuna.trial.TrialState.COMPLETE]
        if not complete:
            print(f"flare2 tune: no trial completed; their logs are in {self.log_dir}", file=sys.stderr)
            return exit_codes.FAILED
        best = study.best_trial  # the complete trial of the highest value
        out = self.log_dir / BEST_FILE
        preset = best_preset(self._trial_dir(best.number), self.algo)
        out.write_text(json.dumps(preset, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        pruned = sum(trial.state == optuna.trial.TrialState.PRUNED for trial in study.trials)
        print(
            f"flare2 tune: {len(complete)} trials complete, {pruned} pruned; best: trial {best.number} with mean "
            f"return {best.value:.1f} ({json.dumps(best.params)})\n"
            f"  its settings: {out}\n  train with them: flare2 train --preset {out}"
        )
        return exit_codes.OK

    def objective(self, trial: Any) -> float:
        import optuna

        params = _sample(trial, self.space)
        trial_dir = self._trial_dir(trial.number)
        trial_dir.mkdir(parents=True, exist_ok=True)
        flags = [part for name, value in params.items() for part in ("--" + name.replace("_", "-"), str(value))]
        command = [
            sys.executable,
            "-m",
            "flare2.cli",
            "train",
            *self.train_argv,
            *flags,
            "--max-steps",
            str(self.trial_steps),
            "--log-dir",
            str(trial_dir),
        ]
        print(f"flare2 tune: trial {trial.number}: {' '.join(flags)}", file=sys.stderr)
        with open(trial_dir / "console.log", "wb") as console:
            # preexec_fn runs between fork and exec; Optuna runs the trials one at a time in this thread (n_jobs=1),
            # so no other thread holds a lock the child could need there.
            process = subprocess.Popen(
                command, stdout=console, stderr=subprocess.STDOUT, preexec_fn=interrupt_at_parent_death(os.getpid())
            )  # noqa: PLW1509
            try:
                pruned, score = self._follow(process, trial, trial_dir / "progress.csv")
            finally:
                if process.poll() is None:  # pruned, Ctrl+C or an error here: the run must not outlive its trial
                    process.send_signal(signal.SIGINT)
                    try:
                        process.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
        if pruned:
            raise optuna.TrialPruned()
        if process.returncode == exit_codes.CONFIG_ERROR:
            raise ConfigError(f"trial {trial.number} was refused by flare2 train: {_tail(trial_dir / 'console.log')}")
        if process.returncode != exit_codes.OK:
            raise _TrialFailed(
                f"trial {trial.number} {exit_codes.describe(process.returncode)}: see {trial_dir / 'console.log'}"
            )
        return score

    def _follow(self, process: subprocess.Popen, trial: Any, progress: Path) -> tuple[bool, float]:
        """Report each new progress row of a running trial; stop it when Optuna prunes it.

        Returns whether it was pruned, and the mean return of its last row.
        """
        reported_step = -1
        score = math.nan
        while True:
            try:
                process.wait(timeout=self.progress_interval_s)
                running = False
            except subprocess.TimeoutExpired:
                running = True
            for step, mean_return in _returns(progress):
                score = mean_return
                if step > reported_step and math.isfinite(mean_return):
                    trial.report(mean_return, step)
                    reported_step = step
            if not running:
                return False, score
            if trial.should_prune():
                return True, score  # the caller stops the run

    def _trial_dir(self, number: int) -> Path:
        return self.log_dir / f"trial_{number}"

    def _write_trials(self, study: Any) -> None:
        searched = list(self.space)
        with open(self.log_dir / TRIALS_FILE, "w", newline="", encoding="utf-8") as file:
            writer = csv.writer(file)
            writer.writerow(["trial", "state", "mean_return", "last_step", *searched])
            for trial in study.trials:
                last_step = max(trial.intermediate_values, default="")
                writer.writerow(
                    [
                        trial.number,
                        trial.state.name.lower(),
                        "" if trial.value is None else trial.value,
                        last_step,
                        *(trial.params.get(name, "") for name in searched),
                    ]
                )


def _returns(progress: Path) -> list[tuple[int, float]]:
    """(env_steps, return_mean) of each row of a progress.csv written so far (none before it exists)."""
    try:
        with open(progress, newline="", encoding="utf-8") as file:
            rows = list(csv.DictReader(file))
    except FileNotFoundError:
        return []
    pairs = []
    for row in rows:
        try:
            pairs.append((int(row["env_steps"]), float(row["return_mean"])))
        except (KeyError, TypeError, ValueError):
            continue  # a row half written as we read it
    return pairs


def best_preset(trial_dir: Path, algo: str) -> dict[str, Any]:
    """The train.json of a trial as a preset for a run of its own: without the trial's budget, seed and the
    settings derived from its budget (they follow the new run's)."""
    preset = json.loads((trial_dir / TRAIN_FILE).read_text(encoding="utf-8"))
    preset["run"] = {name: value for name, value in preset["run"].items() if name not in _TRIAL_ONLY}
    preset["algorithm"] = {
        name: value for name, value in preset["algorithm"].items() if name not in lookup(algo).derived
    }
    return preset


def _tail(path: Path, lines: int = 3) -> str:
    return " / ".join(path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-lines:])
