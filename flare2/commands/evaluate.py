"""Play a trained run: ``flare2 eval RUN_DIR`` and, in Python, ``flare2.load_policy(RUN_DIR)``.

A run of ``flare2 train`` keeps what it takes to rebuild its policy:
``train.json`` (the algorithm, the env and every setting) and
``checkpoints/RL.pt`` (the weights, and the observation statistics of
``--normalize-observations``). Both play through the acting pipeline the
run's agents played with (``flare2.core.acting``): the same observation
transforms, the same trajectory views, the same model states carried from
step to step, Box actions clipped to the bounds. ``flare2 eval`` goes further
and plays the run's own agent, a GymAgent, over a ``PolicyPort``: the loaded
ComputationTask in this process instead of a compute process, answering with
greedy actions, and nothing stored.
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

from flare2.core.acting import Acting
from flare2.core.env_making import env_spaces, is_pettingzoo_env, is_turn_based, make_gym_env, make_pettingzoo_env
from flare2.core.envs import DEFAULT_CT, GymAgent
from flare2.core.pettingzoo_agent import PettingZooAgent, policy_map, team_of
from flare2.core.transforms import RunningMoments, Transforms, statistics_shape
from flare2.errors import ConfigError, FlareError
from flare2.runtime.checkpoints import resume_checkpoint_path
from flare2.runtime.options import transform_options
from flare2.runtime.run_files import TRAIN_FILE
from flare2.zoo.registry import lookup, rebuild

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

    def __init__(self, run: dict[str, Any], ct: Any, agents: tuple[str, ...] = ()) -> None:
        self.algo, self.env_id, self.ct, self.agents = run["algo"], run["env"], ct, agents
        self.env_kwargs = _env_kwargs(run)
        self.preprocessing = _preprocessing(run)
        """Whether the env is played with its published preprocessing (Atari's), as the run played it."""
        self.transforms = transform_options(run["run"])
        """The run's data transforms, as GymAgent's ``transforms`` option."""
        self.policy_map = run["run"].get("policy_map") or "shared"
        """Which CT acts for each agent of a PettingZoo env (``flare2 train --policy-map``)."""
        env = env_spaces(self.env_id, self.env_kwargs, preprocessing=self.preprocessing, agents=agents or None)
        self.observation_space, self.action_space = env.observation_space, env.action_space
        env.close()
        transforms = Transforms.from_options(self.transforms)
        transforms.bind(DEFAULT_CT, ct.specs, PolicyPort(ct))
        self._acting = Acting(
            specs=ct.specs,
            observation_space=self.observation_space,
            action_space=self.action_space,
            transforms=transforms,
            count=1,
            training=False,
        )
        self._reply: tuple[dict[str, Any], dict[str, Any]] | None = None

    def make_env(self, **kwargs: Any) -> Any:
        """The run's env (with its time limit and preprocessing); ``kwargs`` go to ``gymnasium.make``
        (``render_mode="rgb_array"``). A PettingZoo env's game (its ``parallel_env``): the policy acts for each of
        its agents, one observation at a time."""
        if is_pettingzoo_env(self.env_id):
            return make_pettingzoo_env(self.env_id, {**self.env_kwargs, **kwargs})
        return make_gym_env(self.env_id, {**self.env_kwargs, **kwargs}, preprocessing=self.preprocessing)

    def predict(
        self, observation: Any, *, reward: float = 0.0, episode_start: bool = False, greedy: bool = True
    ) -> Any:
        """The action for ``observation``, as the env takes it; ``greedy`` False samples as training did."""
        acting = self._acting
        if episode_start:
            acting.start([observation])
        elif self._reply is None:
            raise ConfigError(
                "the first predict() of a policy needs episode_start=True: it starts the model's states and views"
            )
        else:
            rows = acting.next_rows()
            rows.set(0, observation)
            acting.stepped(rows, np.array([reward], acting.reward_dtype), *self._reply)
        _, inputs, states = acting.request()
        self._reply = self.ct.predict(inputs, states, greedy=greedy)
        return acting.env_actions(self._reply[0])[0]


class PolicyPort:
    """A CTPort over a ComputationTask loaded in this process: each request is answered as it is sent.

    Evaluation rows get the greedy action (with ``greedy`` False, every row is sampled as training did); the
    statistics of the data transforms are the checkpoint's. Nothing is learned: an agent that plays over it
    must be ``evaluating``, so that it stores nothing.
    """

    learn_ahead = 0

    def __init__(self, ct: Any, *, greedy: bool = True) -> None:
        self.ct, self.greedy = ct, greedy
        self._answered: dict[int, dict[str, Any]] = {}
        self._tickets = 0
        self._asked: list[str] = []

    def send_predict(self, payload: dict[str, Any]) -> int:
        evaluation = payload.get("evaluation")
        greedy = evaluation if self.greedy and evaluation is not None else False
        actions, states = self.ct.predict(payload["inputs"], payload["states"], greedy=greedy)
        self._tickets += 1
        self._answered[self._tickets] = {"actions": actions, "states": states, "version": self.ct.predicted_version}
        return self._tickets

    def wait_predict(self, ticket: int) -> dict[str, Any]:
        return self._answered.pop(ticket)

    def learn(self, payload: dict[str, Any]) -> None:
        raise FlareError(
            f"a loaded policy learns nothing: play it with an agent that is evaluating (CT {self.ct.name!r})"
        )

    def send_statistics(self, payload: dict[str, Any]) -> int:
        self._asked = list(payload["moments"])
        return 0

    def wait_statistics(self, ticket: int) -> dict[str, Any]:
        saved, specs = self.ct.statistics, self.ct.specs
        return {
            "moments": {
                key: saved.get(key, RunningMoments(statistics_shape(specs, key))).to_wire() for key in self._asked
            }
        }


def load_policy(path: str | Path, *, device: str = "cpu", ct: str = DEFAULT_CT) -> TrainedPolicy:
    """The policy of a ``flare2 train`` run: its log dir, or the checkpoint file in it; ``ct``: which of the run's
    CTs (a PettingZoo run with ``--policy-map`` has one per team or agent: ``load_policies`` gives them all)."""
    path = Path(path)
    run_dir, run = _read_run(path)
    agents = _agents_by_ct(run).get(ct, ())
    checkpoint = path if path.suffix == ".pt" else resume_checkpoint_path(run_dir, ct)
    return _load(run_dir / TRAIN_FILE, run, ct, tuple(agents), checkpoint, device)


def load_policies(path: str | Path, *, device: str = "cpu") -> dict[str, TrainedPolicy]:
    """Every CT's policy of a ``flare2 train`` run (its log dir), by CT name; given a checkpoint file, its CT's."""
    path = Path(path)
    if path.suffix == ".pt":
        return {path.stem: load_policy(path, device=device, ct=path.stem)}
    run_dir, run = _read_run(path)
    cts = _agents_by_ct(run) or {DEFAULT_CT: []}
    return {
        ct: _load(run_dir / TRAIN_FILE, run, ct, tuple(agents), resume_checkpoint_path(run_dir, ct), device)
        for ct, agents in cts.items()
    }


def _read_run(path: Path) -> tuple[Path, dict[str, Any]]:
    """The run dir of ``path`` (a log dir, or a checkpoint in it) and its ``train.json``, checked."""
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
    return run_dir, run


def _agents_by_ct(run: dict[str, Any]) -> dict[str, list[str]]:
    """Each CT's agents in a PettingZoo run, by its policy map; empty for a Gymnasium env's run."""
    if not is_pettingzoo_env(run["env"]):
        return {}
    env = make_pettingzoo_env(run["env"], _env_kwargs(run))
    agents = list(env.possible_agents)
    env.close()
    cts: dict[str, list[str]] = {}
    for agent, ct in policy_map(agents, run["run"].get("policy_map") or "shared").items():
        cts.setdefault(ct, []).append(agent)
    return cts


def _load(
    train_file: Path, run: dict[str, Any], name: str, agents: tuple[str, ...], checkpoint: Path, device: str
) -> TrainedPolicy:
    recipe = {
        "algo": run["algo"],
        "env": run["env"],
        "env_kwargs": _env_kwargs(run),
        "algorithm": run["algorithm"],
        "agent": run["agent"],
        "preprocessing": _preprocessing(run),
        "agents": list(agents),
    }
    try:
        lookup(run["algo"])
    except ConfigError as exc:  # an algorithm of a package this Python lacks: the message names how one is added
        raise ConfigError(f"{train_file} is a run of algo {run['algo']!r}: {exc}") from None
    try:
        build = rebuild(recipe)
    except ConfigError as exc:
        raise _not_as_written(train_file, exc) from None

    from flare2.core.computation_task import ComputationTask

    ct = ComputationTask(name, build(), device=device)
    ct.load(checkpoint)
    return TrainedPolicy(run, ct, agents)


def _not_as_written(train_file: Path, exc: Exception) -> ConfigError:
    return ConfigError(f"{train_file} is not as flare2 train writes it ({exc!r}): was it edited by hand?")


def _env_kwargs(run: dict[str, Any]) -> dict[str, Any]:
    steps = run["run"].get("max_episode_steps")
    return {"max_episode_steps": steps} if steps else {}


def _preprocessing(run: dict[str, Any]) -> bool:
    return bool(run["run"].get("env_preprocessing", True))


class _Played(Exception):
    """The episodes of ``flare2 eval`` are played: ends the agent's ``run()``."""


class _Episodes(gym.Wrapper):
    """The env of ``flare2 eval``: episode i starts from ``seed + i``, each episode's return and length are kept
    (with ``frames``, the first one's frames too), and the reset after the last episode ends the play."""

    def __init__(self, env: gym.Env, episodes: int, *, seed: int, frames: bool, env_id: str) -> None:
        super().__init__(env)
        self.episodes, self.seed, self.env_id = episodes, seed, env_id
        self.results: list[tuple[float, int]] = []
        self.frames: list[np.ndarray] | None = [] if frames else None
        self._return, self._length = 0.0, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if len(self.results) == self.episodes:
            raise _Played()
        self._return, self._length = 0.0, 0
        result = self.env.reset(seed=self.seed + len(self.results), options=options)
        self._keep_frame()
        return result

    def step(self, action: Any) -> Any:
        result = self.env.step(action)
        self._return, self._length = self._return + float(result[1]), self._length + 1
        self._keep_frame()
        if result[2] or result[3]:
            self.results.append((self._return, self._length))
        return result

    def _keep_frame(self) -> None:
        if self.frames is not None and not self.results:
            self.frames.append(_frame(self.env, self.env_id))


def play(
    policy: TrainedPolicy, episodes: int, *, seed: int, greedy: bool, video: Path | None
) -> list[tuple[float, int]]:
    """Return and length of ``episodes`` episodes; with ``video``, the first one is saved there.

    They are played by the run's own agent (a GymAgent playing one env, ``evaluating``) over a ``PolicyPort``.
    """
    env = _Episodes(
        policy.make_env(**({"render_mode": "rgb_array"} if video else {})),
        episodes,
        seed=seed,
        frames=video is not None,
        env_id=policy.env_id,
    )
    agent = GymAgent(
        policy.env_id, env_kwargs=policy.env_kwargs, transforms=policy.transforms, preprocessing=policy.preprocessing
    )
    agent.envs, agent.evaluating = [env], True
    try:
        _play_until_done(agent, {policy.ct.name: policy}, seed, greedy)
    finally:
        env.close()
    if video is not None and env.frames:
        _write_video(video, env.frames, env.metadata.get("render_fps", 30))
    return env.results


class _Games:
    """A PettingZoo game for ``flare2 eval``, as ``_Episodes`` is for one env: game i starts from ``seed + i``, each
    agent's return and length in each game are kept, and the reset after the last game ends the play. The rest of
    the env's API (its spaces, ``state()``, a turn-based env's ``last()``) is the env's own."""

    def __init__(self, env: Any, games: int, *, seed: int, frames: bool, env_id: str) -> None:
        self.env, self.games, self.seed, self.env_id = env, games, seed, env_id
        self.turn_based = is_turn_based(env)
        self.results: list[dict[str, tuple[float, int]]] = []
        self.frames: list[np.ndarray] | None = [] if frames else None
        self._game: dict[str, tuple[float, int]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if len(self.results) == self.games:
            raise _Played()
        self._game = {}
        result = self.env.reset(seed=self.seed + len(self.results), options=options)
        self._keep_frame()
        return result

    def step(self, actions: Any) -> Any:
        if self.turn_based:  # one agent's move (None for one that is done); each agent's reward of it
            mover = self.env.agent_selection
            result = self.env.step(actions)
            rewards, moved = self.env.rewards, [mover] if actions is not None else []
        else:
            result = self.env.step(actions)
            rewards, moved = result[1], list(actions)
        for agent, reward in rewards.items():
            earned, steps = self._game.get(agent, (0.0, 0))
            self._game[agent] = (earned + float(reward), steps + (agent in moved))
        self._keep_frame()
        if not self.env.agents:
            self.results.append(self._game)
        return result

    def close(self) -> None:
        self.env.close()

    def _keep_frame(self) -> None:
        if self.frames is not None and not self.results:
            self.frames.append(_frame(self.env, self.env_id))


def play_games(
    policies: dict[str, TrainedPolicy], games: int, *, seed: int, greedy: bool, video: Path | None
) -> list[dict[str, tuple[float, int]]]:
    """Each agent's return and length in each of ``games`` games of a PettingZoo run, every agent played by its CT's
    policy (the run's own agent, a PettingZooAgent playing one game, ``evaluating``); with ``video``, the first game
    is saved there."""
    policy = next(iter(policies.values()))
    env = _Games(
        policy.make_env(**({"render_mode": "rgb_array"} if video else {})),
        games,
        seed=seed,
        frames=video is not None,
        env_id=policy.env_id,
    )
    agent = PettingZooAgent(
        policy.env_id, env_kwargs=policy.env_kwargs, policy_map=policy.policy_map, transforms=policy.transforms
    )
    agent.envs, agent.evaluating = [env], True
    _play_until_done(agent, policies, seed, greedy)
    env.close()
    if video is not None and env.frames:
        _write_video(video, env.frames, env.env.metadata.get("render_fps", 30))
    return env.results


def _play_until_done(agent: Any, policies: dict[str, TrainedPolicy], seed: int, greedy: bool) -> None:
    """Play ``agent`` (evaluating) over the policies of its CTs until its env says the episodes are played."""
    try:
        agent.connect(
            agent_id="eval",
            seed=seed,
            specs={name: policy.ct.specs for name, policy in policies.items()},
            ports={name: PolicyPort(policy.ct, greedy=greedy) for name, policy in policies.items()},
            helpers=agent.helpers(),
        )
        agent.run()
    except _Played:
        pass


def _team_lines(results: list[dict[str, tuple[float, int]]]) -> list[str]:
    """Per team (agents named ``team_N``): the mean and spread over games of the team's return, the sum of its
    agents' returns in a game, and of its agents' mean return; then per agent, its return (in a game against
    oneself, both seats of one team: which seat won)."""
    agents = sorted({agent for game in results for agent in game})
    lines = []
    for team in sorted({team_of(agent) for agent in agents}):
        totals, means = [], []
        for game in results:
            returns = [earned for agent, (earned, _) in game.items() if team_of(agent) == team]
            totals.append(sum(returns))
            means.append(statistics.mean(returns))
        lines.append(
            f"team {team!r}: return {statistics.mean(totals):.2f} ± {statistics.pstdev(totals):.2f} (the sum over "
            f"its agents), {statistics.mean(means):.2f} ± {statistics.pstdev(means):.2f} an agent"
        )
    for agent in agents:
        returns = [game[agent][0] for game in results if agent in game]
        lines.append(f"agent {agent!r}: return {statistics.mean(returns):.2f} ± {statistics.pstdev(returns):.2f}")
    return lines


def _frame(env: gym.Env, env_id: str) -> np.ndarray:
    try:
        frame = env.render()
    except gym.error.DependencyNotInstalled as exc:
        raise ConfigError(f"--video: {env_id} cannot render here: {exc}") from None
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        raise ConfigError(
            f"--video: {env_id} gives no rgb_array frames (render_mode='rgb_array' gave {type(frame).__name__})"
        )
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
        raise ConfigError(
            f"cannot write {path} ({exc}): a .gif needs Pillow, a .mp4 imageio-ffmpeg (the video extra)"
        ) from None
    logger.info("wrote %s (%d frames)", path, len(frames))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="flare2 eval",
        description="Play episodes with a run of flare2 train and "
        "print the mean and spread of their returns and lengths.",
    )
    parser.add_argument("run", help="the run's log dir, or one of its checkpoints (checkpoints/RL.pt)")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to play (default: %(default)s)")
    actions = parser.add_mutually_exclusive_group()
    actions.add_argument(
        "--greedy", dest="greedy", action="store_true", default=True, help="the best action of the policy (the default)"
    )
    actions.add_argument("--stochastic", dest="greedy", action="store_false", help="sample actions as training did")
    parser.add_argument("--seed", type=int, default=10_000, help="seed of the first episode, +1 for each next one")
    parser.add_argument(
        "--video",
        type=Path,
        default=None,
        metavar="FILE",
        help="save the first episode as FILE (.mp4 or .gif; needs the video extra)",
    )
    parser.add_argument("--device", default="cpu", help="where the network runs (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    if args.video is not None and args.video.suffix not in (".mp4", ".gif"):
        parser.error(f"--video {args.video}: give a file name ending in .mp4 or .gif")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    kind = "greedy" if args.greedy else "stochastic"
    try:
        policies = load_policies(args.run, device=args.device)
        policy = next(iter(policies.values()))
        if is_pettingzoo_env(policy.env_id):
            games = play_games(policies, args.episodes, seed=args.seed, greedy=args.greedy, video=args.video)
            print(f"{policy.algo} on {policy.env_id}, {len(games)} {kind} game{'s' * (len(games) > 1)}:")
            print("\n".join(_team_lines(games)))
            return 0
        results = play(policy, args.episodes, seed=args.seed, greedy=args.greedy, video=args.video)
    except ConfigError as exc:
        parser.error(str(exc))
    returns, lengths = [r for r, _ in results], [n for _, n in results]
    print(
        f"{policy.algo} on {policy.env_id}, {len(results)} {kind} episode{'s' * (len(results) > 1)}: "
        f"return {statistics.mean(returns):.1f} ± {statistics.pstdev(returns):.1f}, "
        f"length {statistics.mean(lengths):.1f} ± {statistics.pstdev(lengths):.1f}"
    )
    return 0
