"""Play a trained run: ``flare2 eval RUN_DIR`` and, in Python, ``flare2.load_policy(RUN_DIR)``.

A run of ``flare2 train`` keeps what it takes to rebuild its policy:
``train.json`` (the algorithm, the env and every setting) and
``checkpoints/RL.pt`` (the weights, and the observation statistics of
``--normalize-observations``). The policy here acts as the run's agents did:
the same observation transforms, the same trajectory views, the same model
states carried from step to step, Box actions clipped to the bounds.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.envs import make_gym_env
from flare2.core.spaces import ACTION_KEY, ObservationRows, env_actions
from flare2.core.transforms import RunningMoments, Transforms
from flare2.core.views import ViewRows
from flare2.errors import ConfigError
from flare2.runtime.checkpoints import resume_checkpoint_path
from flare2.runtime.options import transform_options
from flare2.runtime.run_files import TRAIN_FILE
from flare2.zoo.registry import lookup

logger = logging.getLogger(__name__)


class TrainedPolicy:
    """The CT of a ``flare2 train`` run, asked one observation at a time (Stable-Baselines3's ``model.predict``)::

        policy = flare2.load_policy("runs/ppo_CartPole-v1")
        env = policy.make_env()
        obs, _ = env.reset(seed=0)
        action = policy.predict(obs, episode_start=True)
        while True:
            obs, reward, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
            action = policy.predict(obs, reward=reward)

    ``reward`` is the env's reward of the step that led to ``obs``; only a model that sees previous rewards uses it.
    """

    def __init__(self, run: dict[str, Any], ct: Any) -> None:
        self.algo, self.env_id, self.ct = run["algo"], run["env"], ct
        self.env_kwargs = _env_kwargs(run)
        env = self.make_env()
        self.observation_space, self.action_space = env.observation_space, env.action_space
        env.close()
        specs = ct.specs
        self._specs = specs
        self._rows = ObservationRows(specs.acting_inputs, 1, keyed=isinstance(self.observation_space, gym.spaces.Dict))
        self._views = ViewRows(specs, 1)
        self._transforms = Transforms.from_options(transform_options(run["run"]))
        self._transforms.bind("RL", specs, _SavedStatistics(ct.statistics, specs))
        self._action_keys = list(self.action_space.spaces) if isinstance(self.action_space, gym.spaces.Dict) else None
        box = isinstance(self.action_space, gym.spaces.Box)
        self._clip = (self.action_space.low, self.action_space.high) if box else None
        self._states: dict[str, np.ndarray] = {}
        self._actions: dict[str, Any] = {}
        self._started = False

    def make_env(self, **kwargs: Any) -> gym.Env:
        """The run's env (with its time limit); ``kwargs`` go to ``gymnasium.make`` (``render_mode="rgb_array"``)."""
        return make_gym_env(self.env_id, {**self.env_kwargs, **kwargs})

    def predict(self, observation: Any, *, reward: float = 0.0, episode_start: bool = False, greedy: bool = True) -> Any:
        """The action for ``observation``, as the env takes it; ``greedy`` False samples as training did."""
        self._rows.set(0, observation)
        inputs = self._rows.arrays()
        if self._transforms.observing:
            self._transforms.observations(inputs, count=False)
        if episode_start:
            self._states = {name: spec.zeros(1) for name, spec in self._specs.states.items()}
            if self._views:
                self._views.start(0, self._rows.row(0))
            self._started = True
        elif not self._started:
            raise ConfigError("the first predict() of a policy needs episode_start=True: it starts the model's states "
                              "and views")
        elif self._views:
            rewards = {"reward": np.array([reward], self._specs.rewards["reward"].dtype)}
            self._transforms.rewards(rewards["reward"])
            self._views.advance(inputs, self._actions, rewards)
        actions, self._states = self.ct.predict({**inputs, **self._views.current()} if self._views else inputs,
                                                self._states, greedy=greedy)
        self._actions = actions
        if self._clip is not None:
            actions = {ACTION_KEY: np.clip(actions[ACTION_KEY], *self._clip)}
        return env_actions(actions, self._action_keys, 1)[0]


class _SavedStatistics:
    """The port a NormalizeObservations binds to when it plays a checkpoint: it answers with the saved statistics."""

    def __init__(self, saved: dict[str, RunningMoments], specs: Any) -> None:
        self.saved, self.specs = saved, specs
        self._asked: list[str] = []

    def send_statistics(self, payload: dict[str, Any]) -> int:
        self._asked = list(payload["moments"])
        return 0

    def wait_statistics(self, ticket: int) -> dict[str, Any]:
        return {"moments": {key: self.saved.get(key, RunningMoments(self.specs.inputs[key].shape)).to_wire()
                            for key in self._asked}}


def load_policy(path: str | Path, *, device: str = "cpu") -> TrainedPolicy:
    """The policy of a ``flare2 train`` run: its log dir, or the checkpoint file in it."""
    path = Path(path)
    run_dir = path.parent.parent if path.suffix == ".pt" else path
    train_file = run_dir / TRAIN_FILE
    if not train_file.is_file():
        raise ConfigError(
            f"{path} is no run of flare2 train: {train_file} is missing (give the log dir of a flare2 train run, or "
            "its checkpoints/RL.pt)"
        )
    try:
        run = json.loads(train_file.read_text(encoding="utf-8"))
        missing = {"algo", "env", "algorithm", "agent", "run"} - set(run)
        if missing:
            raise KeyError(f"no {sorted(missing)}")
    except (ValueError, KeyError, TypeError) as exc:
        raise _not_as_written(train_file, exc) from None
    try:
        record = lookup(run["algo"])
    except ConfigError as exc:  # an algorithm of a package this Python lacks: the message names how one is added
        raise ConfigError(f"{train_file} is a run of algo {run['algo']!r}: {exc}") from None
    try:
        config = record.config_class(**_tuples(run["algorithm"]))
        settings = record.settings_class(**_tuples(run["agent"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise _not_as_written(train_file, exc) from None

    from flare2.core.computation_task import ComputationTask

    ct = ComputationTask("RL", record.builder(run["env"], _env_kwargs(run), config, settings)(), device=device)
    ct.load(path if path.suffix == ".pt" else resume_checkpoint_path(run_dir, "RL"))
    return TrainedPolicy(run, ct)


def _not_as_written(train_file: Path, exc: Exception) -> ConfigError:
    return ConfigError(f"{train_file} is not as flare2 train writes it ({exc!r}): was it edited by hand?")


def _env_kwargs(run: dict[str, Any]) -> dict[str, Any]:
    steps = run["run"].get("max_episode_steps")
    return {"max_episode_steps": steps} if steps else {}


def _tuples(values: dict[str, Any]) -> dict[str, Any]:
    """JSON gives lists where the settings hold tuples."""
    return {key: tuple(value) if isinstance(value, list) else value for key, value in values.items()}


def play(policy: TrainedPolicy, episodes: int, *, seed: int, greedy: bool, video: Path | None) -> list[tuple[float, int]]:
    """Return and length of ``episodes`` episodes; with ``video``, the first one is saved there."""
    env = policy.make_env(**({"render_mode": "rgb_array"} if video else {}))
    results = []
    for episode in range(episodes):
        observation, _ = env.reset(seed=seed + episode)
        action = policy.predict(observation, episode_start=True, greedy=greedy)
        frames = [_frame(env, policy.env_id)] if video and episode == 0 else None
        total, length = 0.0, 0
        while True:
            observation, reward, terminated, truncated, _ = env.step(action)
            total, length = total + float(reward), length + 1
            if frames is not None:
                frames.append(_frame(env, policy.env_id))
            if terminated or truncated:
                break
            action = policy.predict(observation, reward=float(reward), greedy=greedy)
        if frames is not None:
            _write_video(video, frames, env.metadata.get("render_fps", 30))
        results.append((total, length))
    env.close()
    return results


def _frame(env: gym.Env, env_id: str) -> np.ndarray:
    try:
        frame = env.render()
    except gym.error.DependencyNotInstalled as exc:
        raise ConfigError(f"--video: {env_id} cannot render here: {exc}") from None
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        raise ConfigError(f"--video: {env_id} gives no rgb_array frames (render_mode='rgb_array' gave {type(frame).__name__})")
    return frame


def _write_video(path: Path, frames: list[np.ndarray], fps: int) -> None:
    try:
        import imageio.v3 as imageio
    except ImportError:
        raise ConfigError("--video needs the video extra: python -m pip install -e '.[video]'") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.suffix == ".mp4":
            # Blocks of 8 keep classic control's 600x400 frames as they are (16 would resize them, with a warning);
            # H.264 players need only even sides.
            imageio.imwrite(path, np.stack(frames), fps=fps, macro_block_size=8)
        else:
            imageio.imwrite(path, np.stack(frames), duration=1000 / fps, loop=0)
    except (ImportError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"cannot write {path} ({exc}): a .gif needs Pillow, a .mp4 imageio-ffmpeg (the video extra)") from None
    logger.info("wrote %s (%d frames)", path, len(frames))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="flare2 eval", description="Play episodes with a run of flare2 train and "
                                     "print the mean and spread of their returns and lengths.")
    parser.add_argument("run", help="the run's log dir, or its checkpoints/RL.pt")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to play (default: %(default)s)")
    actions = parser.add_mutually_exclusive_group()
    actions.add_argument("--greedy", dest="greedy", action="store_true", default=True,
                         help="the best action of the policy (the default)")
    actions.add_argument("--stochastic", dest="greedy", action="store_false", help="sample actions as training did")
    parser.add_argument("--seed", type=int, default=10_000, help="seed of the first episode, +1 for each next one")
    parser.add_argument("--video", type=Path, default=None, metavar="FILE",
                        help="save the first episode as FILE (.mp4 or .gif; needs the video extra)")
    parser.add_argument("--device", default="cpu", help="where the network runs (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    if args.video is not None and args.video.suffix not in (".mp4", ".gif"):
        parser.error(f"--video {args.video}: give a file name ending in .mp4 or .gif")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        policy = load_policy(args.run, device=args.device)
        results = play(policy, args.episodes, seed=args.seed, greedy=args.greedy, video=args.video)
    except ConfigError as exc:
        parser.error(str(exc))
    returns, lengths = [r for r, _ in results], [n for _, n in results]
    kind = "greedy" if args.greedy else "stochastic"
    print(f"{policy.algo} on {policy.env_id}, {len(results)} {kind} episode{'s' * (len(results) > 1)}: "
          f"return {statistics.mean(returns):.1f} ± {statistics.pstdev(returns):.1f}, "
          f"length {statistics.mean(lengths):.1f} ± {statistics.pstdev(lengths):.1f}")
    return 0

