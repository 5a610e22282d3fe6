"""PPO as ``flare2 train --algo ppo`` runs it: its config and its record (the Algorithm: ``flare2.zoo.ppo``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flare2.errors import ConfigError
from flare2.zoo.record import (
    BOX,
    DICT,
    DISCRETE,
    ENTITIES,
    VECTOR_BOX,
    ActorCriticSettings,
    AlgorithmRecord,
)


@dataclass(frozen=True)
class ClippedObjectiveConfig:
    """The settings PPO and recurrent PPO share: the clipped objective, GAE and the learning-rate schedule."""

    lr: float = 1e-3
    """Adam learning rate at the start."""
    anneal_steps: int | None = 100_000
    """The learning rate falls linearly to 0 over this many env steps (None: constant)."""
    gamma: float = 0.98
    """Discount factor."""
    gae_lambda: float = 0.8
    """GAE trace decay."""
    clip: float = 0.2
    """Clip range of the probability ratio."""
    epochs: int = 20
    """Passes over each learn() batch."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Gradients are clipped to this global norm."""
    rho_bar: float = 1.0
    """ρ̄: the importance weights π/μ of steps played by older weights are truncated to at most this."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not self.rho_bar > 0:
            raise ConfigError(f"{name}.rho_bar must be > 0 (1.0 as in IMPALA), got {self.rho_bar}")
        if self.lr <= 0 or self.clip <= 0 or self.epochs < 1:
            raise ConfigError(f"{name} needs lr > 0, clip > 0 and epochs >= 1, got {self}")
        if not 0 <= self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ConfigError(f"{name}.gamma and gae_lambda must be in [0, 1], got {self.gamma}, {self.gae_lambda}")
        if self.anneal_steps is not None and self.anneal_steps < 1:
            raise ConfigError(f"{name}.anneal_steps must be >= 1 or None, got {self.anneal_steps}")
        if self.value_coef < 0 or self.entropy_coef < 0 or self.max_grad_norm <= 0:
            raise ConfigError(f"{name} needs value_coef >= 0, entropy_coef >= 0 and max_grad_norm > 0, got {self}")


@dataclass(frozen=True)
class PPOConfig(ClippedObjectiveConfig):
    minibatch_size: int = 256
    """Steps per gradient step (the batch is B*T steps)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.minibatch_size < 1:
            raise ConfigError(f"{type(self).__name__}.minibatch_size must be >= 1, got {self.minibatch_size}")


CLIPPED_OBJECTIVE_SEARCH: dict[str, tuple[str, Any]] = {
    "lr": ("log", (1e-4, 3e-3)),
    "gamma": ("choice", (0.95, 0.98, 0.99, 0.995, 0.999)),
    "gae_lambda": ("choice", (0.8, 0.9, 0.95, 0.98)),
    "clip": ("choice", (0.1, 0.2, 0.3)),
    "epochs": ("int", (3, 20)),
}
"""What ``flare2 tune`` searches of the settings PPO and recurrent PPO share (ClippedObjectiveConfig)."""

_ZOO_STEP: dict[str, Any] = {"lr": 3e-4, "anneal_steps": None, "minibatch_size": 64}
"""Stable-Baselines3's PPO defaults, which rl-baselines3-zoo keeps for Acrobot and MountainCar."""

_ON_POLICY: dict[str, Any] = {"serial": True}
"""The schedule of presets whose updates are too large to learn from rollouts played one update behind: the agents
wait for each learn(), so nothing runs beside the acting, and one process (--serial) saves the messages between
processes (Acrobot with unscaled rewards, 3 seeds, 2 cores each: 29 s median to -100 against 36 s with --learner
inline, the same steps)."""

_CLASSIC_GAMES: dict[str, dict[str, Any]] = {
    "algorithm": {
        "lr": 3e-4,
        "anneal_steps": None,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "epochs": 4,
        "minibatch_size": 64,
        "entropy_coef": 0.01,
    },
    "agent": {"sample_interval": 32, "hidden": (256, 256), "activation": "relu"},
    "run": {"envs_per_agent": 16, "self_play": 10, "self_play_pool": 16, "max_steps": 300_000},
}
"""PettingZoo's classic games played in turns, by self-play (docs/results.md): the learner against a pool of 16 of
its past copies refreshed every 10 updates, MLPs of 256 and 256 ReLU units, minibatches of 64 from fragments of 32 of
a seat's moves, found on connect four; 300k moves. Tic-tac-toe, seeds 0-2: 96/95/86 % of 200 greedy games won against
random play (96.7 % is the most a player can win), where PPO's defaults (both seats on one CT) won 76 % (seed 0)."""

ENTITY_PRESETS = ("flare2/Minefield-v1",)
"""The presets of envs of entities, which PPO learns with the entity actor-critic (``flare2.zoo.ppo.build``)."""


RECORD = AlgorithmRecord(
    name="ppo",
    config_class=PPOConfig,
    settings_class=ActorCriticSettings,
    build="flare2.zoo.ppo:build",
    observations=(BOX, DISCRETE, DICT, ENTITIES),
    actions=(DISCRETE, VECTOR_BOX),
    run={"max_steps": 100_000, "learn_max_wait_ms": 200.0},
    agent={"sample_interval": 32},
    derived={"anneal_steps": "max_steps"},
    presets={
        # The example's settings, measured in the README's results.
        "CartPole-v1": {},
        # rl-baselines3-zoo's settings for these (hyperparams/ppo.yml; its VecNormalize of observations and
        # rewards as --normalize-observations and --normalize-rewards, but for MountainCar a fixed reward scale:
        # at 1M steps its greedy returns were -110.7/-107.7/-110.2 (seeds 0-2, 100 episodes) against
        # -113.8/-116.2/-112.8 with the running one, and the zoo's -110.4). Its learning rate and minibatch
        # (3e-4 constant, 64) matter: with the package's (1e-3 annealed, 256) greedy returns ended 5 to 13 short of
        # its figures. Each update is hundreds of gradient steps over thousands of env steps; with unscaled
        # rewards, rollouts played one such update behind cost two to three times the env steps
        # (docs/learners-and-devices.md), so MountainCar's agents wait for learn(), in one process: --serial.
        # Acrobot's normalised rewards took that cost away: over seeds 0-9 the learner process (lag 0.8-0.9)
        # reached -100 in 77.2k env steps and 11.2 s (medians) against 71.7k and 12.8 s with --serial.
        "Acrobot-v1": {
            "algorithm": {**_ZOO_STEP, "gamma": 0.99, "gae_lambda": 0.94, "epochs": 4},
            "agent": {"sample_interval": 256},
            "run": {
                "envs_per_agent": 16,
                "normalize_observations": True,
                "normalize_rewards": 0.99,
                "max_steps": 1_000_000,
            },
        },
        "MountainCar-v0": {
            "algorithm": {**_ZOO_STEP, "gamma": 0.99, "gae_lambda": 0.98, "epochs": 4},
            "agent": {"sample_interval": 16},
            "run": {
                "envs_per_agent": 16,
                "normalize_observations": True,
                "scale_rewards": 0.1,
                "max_steps": 1_000_000,
                **_ON_POLICY,
            },
        },
        # MPE's cooperative navigation, the 3 agents sharing one policy: the settings of the MAPPO paper's MPE runs
        # (Yu et al. 2022; marlbenchmark/on-policy, scripts/train_mpe_scripts/train_mpe_spread.sh: lr 7e-4 constant,
        # 10 epochs of one minibatch, gamma 0.99, GAE 0.95, entropy 0.01) over 16 games of 128 steps. At 3M agent
        # steps, seed 0: a mean agent return (last 100) of -16.7 with these, -19.0 with JaxMARL's ippo_ff_mpe settings
        # (lr 2.5e-4 annealed, 4 epochs of 4 minibatches). 15M agent steps (5M env steps, 32-39 minutes on 2 cores)
        # take the greedy policy past the end of XuanCe's MAPPO benchmark curve (docs/results.md).
        "mpe2.simple_spread_v3": {
            "algorithm": {
                "lr": 7e-4,
                "anneal_steps": None,
                "gamma": 0.99,
                "gae_lambda": 0.95,
                "epochs": 10,
                "minibatch_size": 16 * 3 * 128,
                "entropy_coef": 0.01,
            },
            "agent": {"sample_interval": 128},
            "run": {"envs_per_agent": 16, "max_steps": 15_000_000},
        },
        # Connect four by self-play (docs/results.md): the settings of PettingZoo's classic games (_CLASSIC_GAMES)
        # and, in half of the games, the one-step lookahead as a sparring partner (the learner's past copies alone
        # seldom punish an untaken win or an open threat, and the policy never learned to read them: 14-28 % of games
        # won against the lookahead at 1M moves, seeds 0-2), for 2M moves.
        "pettingzoo.classic.connect_four_v3": {
            **_CLASSIC_GAMES,
            "run": {**_CLASSIC_GAMES["run"], "self_play_sparring": "lookahead=0.5", "max_steps": 2_000_000},
        },
        # Entities with a mask per robot: examples/minefield_entities.py's settings (docs/results.md: Minefield),
        # the entity actor-critic that flare2.zoo.ppo.build makes for an env of entities.
        "flare2/Minefield-v1": {
            "algorithm": {"lr": 3e-4, "gae_lambda": 0.95, "epochs": 4, "minibatch_size": 256, "entropy_coef": 0.01},
            "agent": {"sample_interval": 32},
            "run": {"num_agents": 2, "envs_per_agent": 16, "max_steps": 300_000},
        },
        "LunarLander-v3": {
            "algorithm": {**_ZOO_STEP, "gamma": 0.999, "gae_lambda": 0.98, "epochs": 4, "entropy_coef": 0.01},
            "agent": {"sample_interval": 1024},
            "run": {"envs_per_agent": 16, "max_steps": 1_000_000, **_ON_POLICY},
        },
    },
    family_presets={
        "PettingZoo classic": _CLASSIC_GAMES,
        # CleanRL's ppo_atari and rl-baselines3-zoo's hyperparams/ppo.yml (atari): 8 envs x 128 steps, 4 epochs of
        # minibatches of 256, the learning rate 2.5e-4 annealed to 0 over the run, clip 0.1 (CleanRL's constant
        # one; the zoo anneals it too), entropy 0.01, value 0.5, rewards clipped, 4 stacked frames, the Nature CNN
        # with a linear policy and value head on its 512 features. Each update is 16 gradient steps over 1024 env
        # steps, so the agents wait for learn(), which runs in the compute process (on the GPU where there is one)
        # with 2 torch threads: on the CPU the update is most of the time (2 cores: 1.8x faster than with 1). The
        # agent steps one half of its envs while the other half's frames go through the CNN (--double-buffer), and
        # those forward passes take the core the agent leaves (--predict-threads' default): Breakout on 2 cores in
        # rounds of 30k steps, 457/427/449/451 env steps/s with both, 378/383/390 without the halves.
        "Atari": {
            "algorithm": {
                "lr": 2.5e-4,
                "gamma": 0.99,
                "gae_lambda": 0.95,
                "clip": 0.1,
                "epochs": 4,
                "minibatch_size": 256,
                "entropy_coef": 0.01,
            },
            "agent": {"sample_interval": 128, "frames": 4, "hidden": (), "double_buffer": True},
            "run": {
                "envs_per_agent": 8,
                "clip_rewards": 1.0,
                "max_steps": 10_000_000,
                "learner": "inline",
                "torch_threads": 2,
            },
        },
        # PureJaxRL's MinAtar PPO as pgx's examples/minatar-ppo runs it (learning rate 3e-4, 3 epochs, clip 0.2,
        # entropy 0.01, 128 steps, 20M steps), with 8 envs and minibatches of 256 where it has 4096 of each; the
        # MinAtar CNN. Breakout: the paper's level of 10 first reached at 1.0M to 2.1M steps in seeds 0-2
        # (docs/pixels.md).
        "MinAtar": {
            "algorithm": {
                "lr": 3e-4,
                "anneal_steps": None,
                "gamma": 0.99,
                "gae_lambda": 0.95,
                "clip": 0.2,
                "epochs": 3,
                "minibatch_size": 256,
                "entropy_coef": 0.01,
            },
            "agent": {"sample_interval": 128},
            "run": {"envs_per_agent": 8, "max_steps": 20_000_000, "learner": "inline"},
        },
    },
    search_space={
        **CLIPPED_OBJECTIVE_SEARCH,
        "entropy_coef": ("log", (1e-8, 1e-2)),
        "sample_interval": ("choice", (8, 16, 32, 64)),
    },
)
