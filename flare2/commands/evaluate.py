"""Play a trained run: ``flare2 eval RUN_DIR``.

``flare2 eval`` plays the run's own agent (a GymAgent, or for a PettingZoo
env a PettingZooAgent) over ``PolicyPort``s (``flare2.commands.policies``):
the loaded ComputationTasks in this process instead of a compute process,
answering with greedy actions, and nothing stored. The policies act through
the acting pipeline the run's agents played with.
"""

from __future__ import annotations

import argparse
import logging
import statistics
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.commands.policies import PolicyPort, TrainedPolicy, load_policies
from flare2.core.board_players import (
    PLAYERS,
    Tactics,
    baselines,
    check_fixed_players_can_play,
    plays_connect_four,
)
from flare2.core.env_making import is_pettingzoo_env, is_turn_based
from flare2.core.envs import GymAgent
from flare2.core.pettingzoo_agent import PettingZooAgent, team_of
from flare2.errors import ConfigError
from flare2.runtime.run_files import check_output_file

logger = logging.getLogger(__name__)


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


class _Against:
    """A turn-based game in which a fixed player (``flare2.core.board_players``) moves for one seat, the next seat in
    each game, so that the policy plays every seat in turn; the policy sees only its own seats' turns."""

    def __init__(self, env: Any, player: str, seed: int, tactics: Tactics | None) -> None:
        self.env, self.player = env, PLAYERS[player]
        self.rng = np.random.default_rng(seed)
        self.fixed_seats: list[str] = []
        """The seat the fixed player took in each game so far."""
        self.tactics = tactics
        """Where given (connect four), counts the policy's moves as ``Tactics`` reads them."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.env.reset(seed=seed, options=options)
        seats = self.env.possible_agents
        self.fixed_seats.append(seats[(len(self.fixed_seats) + 1) % len(seats)])
        self._fixed_moves()

    def step(self, action: Any) -> None:
        if self.tactics is not None and action is not None:
            self.tactics.count(self.env.last()[0], int(action))
        self.env.step(action)
        self._fixed_moves()

    def _fixed_moves(self) -> None:
        while self.env.agents and self.env.agent_selection == self.fixed_seats[-1]:
            observation, _, terminated, truncated, _ = self.env.last()
            self.env.step(None if terminated or truncated else self.player(observation, self.rng))


def play_games(
    policies: dict[str, TrainedPolicy],
    games: int,
    *,
    seed: int,
    greedy: bool,
    video: Path | None,
    against: str | None = None,
    tactics: Tactics | None = None,
) -> tuple[list[dict[str, tuple[float, int]]], list[str]]:
    """Each agent's return and length in each of ``games`` games of a PettingZoo run, every agent played by its CT's
    policy (the run's own agent, a PettingZooAgent playing one game, ``evaluating``), and the seats a fixed player
    took instead (``against``: a player of ``flare2.core.board_players``, one seat a game, a turn-based env only,
    ``tactics`` counting the policy's moves there); with ``video``, the first game is saved there."""
    policy = next(iter(policies.values()))
    env = _Games(
        policy.make_env(**({"render_mode": "rgb_array"} if video else {})),
        games,
        seed=seed,
        frames=video is not None,
        env_id=policy.env_id,
    )
    played: Any = env
    if against is not None:
        if not is_turn_based(env.env):
            raise ConfigError(
                f"--against {against}: a fixed player takes a seat of a turn-based game, and {policy.env_id} is none"
            )
        check_fixed_players_can_play(env.observation_space(env.possible_agents[0]), policy.env_id, "--against")
        players = baselines(policy.env_id)
        if against not in players:
            raise ConfigError(
                f"--against {against}: {policy.env_id} has no {against} player, its fixed players are "
                f"{list(players)}: use --against {players[0]}"
            )
        played = _Against(env, against, seed, tactics)
    agent = PettingZooAgent(
        policy.env_id, env_kwargs=policy.env_kwargs, policy_map=policy.policy_map, transforms=policy.transforms
    )
    agent.envs, agent.evaluating = [played], True
    _play_until_done(agent, policies, seed, greedy)
    env.close()
    if video is not None and env.frames:
        _write_video(video, env.frames, env.env.metadata.get("render_fps", 30))
    return env.results, played.fixed_seats[: len(env.results)] if against is not None else []


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


def _against_line(results: list[dict[str, tuple[float, int]]], fixed_seats: list[str], player: str) -> str:
    """How the policy fared against the fixed player: its wins, draws and losses (its return above, at or below 0
    in the seats it played)."""
    outcomes = [
        sum(earned for agent, (earned, _) in game.items() if agent != fixed)
        for game, fixed in zip(results, fixed_seats)
    ]
    wins, losses = sum(o > 0 for o in outcomes), sum(o < 0 for o in outcomes)
    return (
        f"against {player}: won {wins}, drew {len(outcomes) - wins - losses}, lost {losses} of {len(outcomes)} "
        f"(win rate {wins / len(outcomes):.0%})"
    )


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
    parser.add_argument(
        "--against",
        choices=sorted(PLAYERS),
        default=None,
        help="a turn-based game: a fixed player takes one seat of each game (the next seat each game), and the "
        "policy's wins, draws and losses are counted; lookahead and careful play connect four "
        "(flare2/core/board_players.py)",
    )
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    if args.video is not None:
        if args.video.suffix not in (".mp4", ".gif"):
            parser.error(f"--video {args.video}: give a file name ending in .mp4 or .gif")
        try:
            check_output_file(args.video, "--video")
        except ConfigError as exc:
            parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    kind = "greedy" if args.greedy else "stochastic"
    try:
        policies = load_policies(args.run, device=args.device)
        policy = next(iter(policies.values()))
        if is_pettingzoo_env(policy.env_id):
            tactics = Tactics() if args.against is not None and plays_connect_four(policy.env_id) else None
            games, fixed = play_games(
                policies,
                args.episodes,
                seed=args.seed,
                greedy=args.greedy,
                video=args.video,
                against=args.against,
                tactics=tactics,
            )
            print(f"{policy.algo} on {policy.env_id}, {len(games)} {kind} game{'s' * (len(games) > 1)}:")
            print("\n".join(_team_lines(games)))
            if args.against is not None:
                print(_against_line(games, fixed, args.against))
            if tactics is not None:
                print(f"the policy {tactics.describe()}")
            return 0
        if args.against is not None:
            parser.error(
                f"--against {args.against}: a fixed player takes a seat of a PettingZoo game, {policy.env_id} is none"
            )
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
